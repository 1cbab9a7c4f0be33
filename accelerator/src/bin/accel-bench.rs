//! Times one encoder prefill and one batched decoder pass, writing one JSON line per event (`env`,
//! `load`, `prefill`, `decode`, `check`, `memory`) in the same shape as the benchmark of the
//! mlx_vlm reference implementation, so the two can be read side by side (docs/benchmarks.md).
//!
//! ```text
//! accel-bench --ckpt DIR [--dtype float32|bfloat16] [--prompt-lens 256,1536] [--batches 1,4]
//!             [--widths 32,64] [--reps 5] [--warmup 1] [--seed 0] [--out FILE] [--tag TEXT]
//! ```
//!
//! What is timed matches the reference benchmark: `prefill` = encoder over P random ids with every layer's K/V
//! evaluated; `decode` = one first-step decoder pass over B random canvases of width W, logits
//! `[B, W, vocab]` f32 softcapped and evaluated.

use std::{
    fs::OpenOptions,
    io::Write,
    path::PathBuf,
    time::{Duration, Instant},
};

use hunch_accelerator::{ActivationDtype, DiffusionGemma, LoadOptions};
use serde_json::{json, Map, Value};

struct Args {
    ckpt: PathBuf,
    dtype: ActivationDtype,
    dtype_name: String,
    prompt_lens: Vec<usize>,
    batches: Vec<usize>,
    widths: Vec<usize>,
    reps: usize,
    warmup: usize,
    seed: u64,
    out: Option<PathBuf>,
    tag: String,
}

fn ints(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| x.trim().parse().map_err(|_| format!("not a number: {x}")))
        .collect()
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        ckpt: PathBuf::new(),
        dtype: ActivationDtype::Float32,
        dtype_name: "float32".into(),
        prompt_lens: vec![256, 1536],
        batches: vec![1, 4],
        widths: vec![32, 64],
        reps: 5,
        warmup: 1,
        seed: 0,
        out: None,
        tag: String::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--ckpt" => a.ckpt = PathBuf::from(value()?),
            "--dtype" => {
                a.dtype_name = value()?;
                a.dtype = a.dtype_name.parse().map_err(
                    |e: hunch_accelerator::model::diffusion_gemma::forward_io::UnknownDtype| {
                        e.to_string()
                    },
                )?;
            }
            "--prompt-lens" => a.prompt_lens = ints(&value()?)?,
            "--batches" => a.batches = ints(&value()?)?,
            "--widths" => a.widths = ints(&value()?)?,
            "--reps" => a.reps = value()?.parse().map_err(|_| "--reps: not a number")?,
            "--warmup" => a.warmup = value()?.parse().map_err(|_| "--warmup: not a number")?,
            "--seed" => a.seed = value()?.parse().map_err(|_| "--seed: not a number")?,
            "--out" => a.out = Some(PathBuf::from(value()?)),
            "--tag" => a.tag = value()?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.ckpt.as_os_str().is_empty() {
        return Err("--ckpt DIR is required".into());
    }
    if a.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    Ok(a)
}

/// splitmix64: reproducible ids without a rand dependency.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

/// Anonymous resident memory in MiB (`RssAnon`): what MLX allocates, without the file-backed
/// pages of the checkpoint's mappings.
fn anon_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|kb| (kb / 1024.0 * 10.0).round() / 10.0)
        .unwrap_or(0.0)
}

/// The peak of [`anon_mb`] sampled every 10 ms on its own thread: what the process must have
/// free at the worst moment, which a difference of two steady states does not show.
struct AnonSampler {
    peak_kib: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl AnonSampler {
    fn start() -> Self {
        use std::sync::atomic::Ordering;
        let peak_kib = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p, s) = (peak_kib.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max((anon_mb() * 1024.0) as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        AnonSampler { peak_kib, stop }
    }

    /// The peak in MiB since the last call, then a new window from now.
    fn take(&self) -> f64 {
        let now = (anon_mb() * 1024.0) as u64;
        let kib = self
            .peak_kib
            .swap(now, std::sync::atomic::Ordering::Relaxed)
            .max(now);
        (kib as f64 / 1024.0 * 10.0).round() / 10.0
    }
}

impl Drop for AnonSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn rss_mb() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map(|kb| (kb / 1024.0 * 10.0).round() / 10.0)
            .unwrap_or(0.0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// MiB of `*.safetensors` files in `dir`.
fn safetensors_mb(dir: &std::path::Path) -> f64 {
    let bytes: u64 = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    bytes as f64 / 1048576.0
}

/// The CPU time the process has used, in ms (every thread: MLX evaluates on its own, the BLAS
/// on its own). Unlike the wall time, it does not grow while the process waits for a core, so
/// on a shared machine it says more about the work a pass takes.
fn cpu_ms() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) } != 0 {
        return f64::NAN;
    }
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

/// The median of `xs`, rounded to µs.
fn median_of(xs: &[f64]) -> f64 {
    let mut sorted = xs.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    let m = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    (m * 1e3).round() / 1e3
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn stats(ts: &[f64]) -> Map<String, Value> {
    let mut sorted = ts.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    let r = |x: f64| (x * 1e3).round() / 1e3;
    let mut m = Map::new();
    m.insert("median_ms".into(), json!(r(median)));
    m.insert("min_ms".into(), json!(r(sorted[0])));
    m.insert("max_ms".into(), json!(r(sorted[n - 1])));
    m.insert(
        "all_ms".into(),
        json!(ts.iter().map(|&t| r(t)).collect::<Vec<_>>()),
    );
    m
}

struct Emitter {
    base: Map<String, Value>,
    out: Option<std::fs::File>,
}

impl Emitter {
    fn emit(&mut self, event: &str, fields: Map<String, Value>) {
        let mut obj = Map::new();
        obj.insert("event".into(), json!(event));
        obj.extend(self.base.clone());
        obj.extend(fields);
        let line = Value::Object(obj).to_string();
        println!("{line}");
        if let Some(f) = self.out.as_mut() {
            // A failed write of the copy must not lose the measurement on stdout.
            let _ = writeln!(f, "{line}");
        }
    }
}

/// The memory figures of one measurement: MLX's peak (and the largest seen), the process's
/// resident set and peak, and the sampled anonymous-memory peak above `steady` since the last
/// take.
fn record_memory(
    f: &mut Map<String, Value>,
    mlx_peak_max: &mut f64,
    sampler: &AnonSampler,
    steady: f64,
) {
    f.insert("mlx_peak_mb".into(), json!(peak_mb(mlx_peak_max)));
    let (peak, cur) = rss_mb();
    f.insert("rss_peak_mb".into(), json!(peak));
    f.insert("rss_mb".into(), json!(cur));
    f.insert(
        "anon_peak_over_mb".into(),
        json!(((sampler.take() - steady) * 10.0).round() / 10.0),
    );
}

fn peak_mb(max_seen: &mut f64) -> f64 {
    let mb = mlx_rs::memory::peak_memory()
        .map(|b| (b as f64 / 1048576.0 * 10.0).round() / 10.0)
        .unwrap_or(0.0);
    *max_seen = max_seen.max(mb);
    mb
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut base = Map::new();
    base.insert("impl".into(), json!("hunch"));
    base.insert("dtype".into(), json!(args.dtype_name));
    base.insert(
        "experts".into(),
        json!(if args.dtype == ActivationDtype::Float32 {
            "native"
        } else {
            "f32"
        }),
    );
    if !args.tag.is_empty() {
        base.insert("tag".into(), json!(args.tag));
    }
    let out = match &args.out {
        Some(p) => Some(OpenOptions::new().create(true).append(true).open(p)?),
        None => None,
    };
    let mut em = Emitter { base, out };
    let cfg_text = std::fs::read_to_string(args.ckpt.join("config.json"))?;
    let cfg_json: Value = serde_json::from_str(&cfg_text)?;
    let tc = &cfg_json["text_config"];
    let mut env = Map::new();
    env.insert("mlx".into(), json!(mlx_sys::MLX_VERSION));
    env.insert("machine".into(), json!(std::env::consts::ARCH));
    env.insert("system".into(), json!(std::env::consts::OS));
    env.insert("device".into(), json!("cpu"));
    env.insert(
        "cpu_count".into(),
        json!(std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)),
    );
    // The BLAS serving MLX's matmuls in this process (HUNCH_BLAS; default OpenBLAS when
    // installed), and every BLAS library mapped for the record.
    let blas = hunch_accelerator::blas::select(hunch_accelerator::blas::choice_from_env()?)?;
    env.insert("blas".into(), json!(blas.name()));
    env.insert(
        "blas_libs".into(),
        json!(hunch_accelerator::blas::mapped_libraries()),
    );
    env.insert(
        "ld_preload".into(),
        json!(std::env::var("LD_PRELOAD").unwrap_or_default()),
    );
    env.insert("ckpt".into(), json!(args.ckpt.display().to_string()));
    let keys = [
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "num_global_key_value_heads",
        "global_head_dim",
        "intermediate_size",
        "moe_intermediate_size",
        "num_experts",
        "top_k_experts",
        "sliding_window",
    ];
    let config: Map<String, Value> = keys
        .iter()
        .map(|k| (k.to_string(), tc[*k].clone()))
        .collect();
    env.insert("config".into(), Value::Object(config));
    env.insert("reps".into(), json!(args.reps));
    env.insert("warmup".into(), json!(args.warmup));
    env.insert("seed".into(), json!(args.seed));
    em.emit("env", env);

    let largest_mb = hunch_accelerator::checkpoint::Checkpoint::open(&args.ckpt)
        .map(|c| {
            hunch_accelerator::checkpoint::MemoryPlan::of(&c, args.dtype.dtype()).largest as f64
                / 1048576.0
        })
        .unwrap_or(0.0);
    let sampler = AnonSampler::start();
    sampler.take();
    // The peak resident size while loading, not since the process started.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (_, rss_before) = rss_mb();
    let t0 = Instant::now();
    let model = DiffusionGemma::load(
        &args.ckpt,
        &LoadOptions {
            dtype: args.dtype,
            progress: true,
            ..LoadOptions::default()
        },
    )?;
    let (peak, cur) = rss_mb();
    let mut load = Map::new();
    load.insert("seconds".into(), json!(ms(t0.elapsed()) / 1e3));
    let active = mlx_rs::memory::active_memory().unwrap_or(0) as f64 / 1048576.0;
    load.insert("param_mb".into(), json!((active * 10.0).round() / 10.0));
    load.insert("rss_peak_mb".into(), json!(peak));
    load.insert("rss_mb".into(), json!(cur));
    load.insert(
        "mlx_active_mb".into(),
        json!((active * 10.0).round() / 10.0),
    );
    // What loading added against the weights' bytes on disk (1.0 = the weights as stored).
    let disk = safetensors_mb(&args.ckpt);
    let ratio = |mb: f64| json!(((mb - rss_before) / disk * 1000.0).round() / 1000.0);
    load.insert("disk_mb".into(), json!((disk * 10.0).round() / 10.0));
    load.insert("rss_added_vs_disk".into(), ratio(cur));
    load.insert("rss_peak_added_vs_disk".into(), ratio(peak));
    // Sampled anonymous memory: after the load (the steady state) and the load's peak above
    // it, against the largest tensor (docs/benchmarks.md, "Transient memory").
    let steady = anon_mb();
    load.insert("anon_mb".into(), json!(steady));
    load.insert(
        "anon_peak_over_mb".into(),
        json!(((sampler.take() - steady) * 10.0).round() / 10.0),
    );
    load.insert(
        "largest_tensor_mb".into(),
        json!((largest_mb * 10.0).round() / 10.0),
    );
    em.emit("load", load);

    let vocab = model.config().vocab_size as u64;
    let mut mlx_peak_max = 0.0f64;
    let mut rng = Rng(args.seed);
    for &p in &args.prompt_lens {
        let ids: Vec<u32> = (0..p).map(|_| 3 + rng.below(vocab - 3) as u32).collect();
        sampler.take();
        for _ in 0..args.warmup {
            model.prefill(&ids)?;
        }
        mlx_rs::memory::reset_peak_memory()?;
        let (mut ts, mut cpu) = (Vec::new(), Vec::new());
        let mut cache = None;
        for _ in 0..args.reps {
            let (t, c) = (Instant::now(), cpu_ms());
            cache = Some(model.prefill(&ids)?);
            ts.push(ms(t.elapsed()));
            cpu.push(cpu_ms() - c);
        }
        let cache = cache.ok_or("no prefill ran")?;
        let mut f = stats(&ts);
        f.insert("cpu_median_ms".into(), json!(median_of(&cpu)));
        let median = f["median_ms"].as_f64().unwrap_or(f64::NAN);
        f.insert("P".into(), json!(p));
        f.insert(
            "tok_per_s".into(),
            json!((p as f64 / (median / 1000.0) * 10.0).round() / 10.0),
        );
        record_memory(&mut f, &mut mlx_peak_max, &sampler, steady);
        let mut ordered = Map::new();
        ordered.insert("P".into(), json!(p));
        ordered.extend(f);
        em.emit("prefill", ordered);
        eprintln!("prefill P={p}: median {median:.1} ms");

        for &b in &args.batches {
            for &w in &args.widths {
                let canvases: Vec<Vec<u32>> = (0..b)
                    .map(|_| (0..w).map(|_| rng.below(vocab) as u32).collect())
                    .collect();
                sampler.take();
                for _ in 0..args.warmup {
                    model.denoise(&cache, &canvases, None)?;
                }
                mlx_rs::memory::reset_peak_memory()?;
                let (mut ts, mut cpu) = (Vec::new(), Vec::new());
                let mut logits = None;
                for _ in 0..args.reps {
                    let (t, c) = (Instant::now(), cpu_ms());
                    logits = Some(model.denoise(&cache, &canvases, None)?);
                    ts.push(ms(t.elapsed()));
                    cpu.push(cpu_ms() - c);
                }
                let mut st = stats(&ts);
                st.insert("cpu_median_ms".into(), json!(median_of(&cpu)));
                let median = st["median_ms"].as_f64().unwrap_or(f64::NAN);
                let mut f = Map::new();
                f.insert("P".into(), json!(p));
                f.insert("B".into(), json!(b));
                f.insert("W".into(), json!(w));
                f.extend(st);
                f.insert(
                    "canvas_tok_per_s".into(),
                    json!(((b * w) as f64 / (median / 1000.0) * 10.0).round() / 10.0),
                );
                record_memory(&mut f, &mut mlx_peak_max, &sampler, steady);
                em.emit("decode", f);
                eprintln!("decode P={p} B={b} W={w}: median {median:.1} ms");

                if b > 1 {
                    if let Some(logits) = logits {
                        let batched = logits.as_slice::<f32>();
                        let row = batched.len() / b;
                        let vocab = vocab as usize;
                        let argmax = |v: &[f32]| -> Vec<usize> {
                            v.chunks(vocab)
                                .map(|r| {
                                    (0..r.len())
                                        .max_by(|&a, &b| r[a].total_cmp(&r[b]))
                                        .unwrap_or(0)
                                })
                                .collect()
                        };
                        let mut worst = 0.0f32;
                        let (mut same, mut total) = (0usize, 0usize);
                        for (i, c) in canvases.iter().enumerate() {
                            let s = model.denoise(&cache, std::slice::from_ref(c), None)?;
                            let s = s.as_slice::<f32>();
                            let mine = &batched[i * row..(i + 1) * row];
                            for (x, y) in s.iter().zip(mine) {
                                worst = worst.max((x - y).abs());
                            }
                            for (a, b) in argmax(s).into_iter().zip(argmax(mine)) {
                                same += usize::from(a == b);
                                total += 1;
                            }
                        }
                        let mut f = Map::new();
                        f.insert("P".into(), json!(p));
                        f.insert("B".into(), json!(b));
                        f.insert("W".into(), json!(w));
                        f.insert("batched_vs_serial_maxdiff".into(), json!(worst));
                        f.insert(
                            "same_argmax_frac".into(),
                            json!(same as f64 / total.max(1) as f64),
                        );
                        em.emit("check", f);
                    }
                }
            }
        }
    }
    let (peak, cur) = rss_mb();
    let mut f = Map::new();
    f.insert("stage".into(), json!("end"));
    f.insert("mlx_peak_max_mb".into(), json!(mlx_peak_max));
    f.insert("rss_peak_mb".into(), json!(peak));
    f.insert("rss_mb".into(), json!(cur));
    em.emit("memory", f);
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("accel-bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args) {
        println!(
            "{}",
            json!({"event": "error", "type": "hunch", "message": e.to_string()})
        );
        eprintln!("accel-bench: {e}");
        std::process::exit(1);
    }
}
