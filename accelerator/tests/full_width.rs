//! Full-width checkpoints: every tensor at the released model's real shape (262,144 vocabulary
//! rows, 128 experts, 256/512 head dims), cut to two layers (one sliding, one full-attention),
//! in each of the three layouts. Each is generated, loaded with bfloat16 activations, read and
//! deleted before the next, so at most one (≤ ~5 GB) is on disk at a time.
//!
//! Memory is checked the way a user feels it: a thread samples the process's anonymous
//! resident memory every 10 ms, and what the load and the read hold above the loaded weights at
//! their peaks must stay within the checkpoint's largest tensor (plus the read's activations):
//! no widened, transposed or vocabulary-wide copy of the embedding or the experts.

use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use hunch_accelerator::checkpoint::{Checkpoint, Layout, MemoryPlan};
use hunch_accelerator::engine::{EngineOptions, MlxEngine};
use hunch_accelerator::tools::{write_random_checkpoint, Preset, RandomSpec};
use hunch_accelerator::ActivationDtype;
use hunch_core::ReadRequest;
use serde_json::json;

/// A scratch directory under the target directory (the system temp dir may be a small tmpfs),
/// removed when dropped, also when the test panics.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        let _ = std::fs::remove_dir_all(&base);
        Scratch(base)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Resident set size of this process in bytes (Linux only).
fn rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Anonymous resident memory of this process in bytes (`RssAnon`, Linux only): what MLX
/// allocates, without the file-backed pages of the checkpoint's mappings.
fn rss_anon() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The peak of [`rss_anon`], sampled every 10 ms on a thread of its own until dropped.
struct AnonPeak {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AnonPeak {
    fn start() -> Option<Self> {
        rss_anon()?;
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(now) = rss_anon() {
                    p.fetch_max(now, Ordering::Relaxed);
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        });
        Some(AnonPeak {
            peak,
            stop,
            thread: Some(thread),
        })
    }

    /// The peak since the last call (or the start), then starts a new window.
    fn take(&self) -> u64 {
        let now = rss_anon().unwrap_or(0);
        self.peak.swap(now, Ordering::Relaxed).max(now)
    }
}

impl Drop for AnonPeak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a read may hold beyond the largest tensor: its activations (a 128-token chunk's
/// states and expert rows, the slot rows of the head, a layer's K/V) and the float32 slices
/// products are widened in on the CPU (`model::widened`, 64 MiB each, about two at a time).
const READ_ACTIVATIONS: u64 = 256 << 20;

fn bytes_on_disk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum()
}

fn generate(dir: &Path, layout: Layout) {
    let mut spec = RandomSpec::new(Preset::Full, layout);
    spec.seed = 26;
    spec.set("num_hidden_layers=2").expect("override");
    write_random_checkpoint(dir, &spec).expect("full-width checkpoint");
}

fn check(layout: Layout) {
    let scratch = Scratch::new(&format!("full-width-{layout}"));
    let dir = scratch.0.clone();
    let started = std::time::Instant::now();
    generate(&dir, layout);
    let generated = started.elapsed();

    let checkpoint = Checkpoint::open(&dir).expect("open");
    assert_eq!(
        checkpoint.layout, layout,
        "layout detected from the tensors"
    );
    let dims = &checkpoint.dims;
    assert_eq!((dims.vocab, dims.layers.len()), (262_144, 2));
    assert!(dims.layers[0].sliding && !dims.layers[1].sliding);
    let largest = MemoryPlan::of(&checkpoint, mlx_rs::Dtype::Bfloat16).largest;
    drop(checkpoint);

    let disk = bytes_on_disk(&dir);
    let sampler = AnonPeak::start();
    if let Some(s) = &sampler {
        s.take();
    }
    let before = rss();
    let mut engine = MlxEngine::load(
        &dir,
        &EngineOptions {
            dtype: ActivationDtype::Bfloat16,
            probe_batching: false,
            ..EngineOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{layout}: {e}"));
    let after = rss();
    let loaded = started.elapsed();
    let load_peak = sampler.as_ref().map(AnonPeak::take);
    let steady = rss_anon();

    let request: ReadRequest = serde_json::from_value(json!({
        "state": "My card was charged twice and the app crashes on the invoices page!",
        "questions": [
            {"type": "choice", "instructions": "Which team should handle this",
             "options": [{"name": "billing", "description": "Payments"},
                         {"name": "technical", "description": null},
                         {"name": "sales", "description": null}]},
            {"type": "noul", "instructions": "The message conveys urgency", "yes": null, "no": null}],
        "options": {}}))
    .expect("request");
    let outcome = engine.read(&request).expect("read");
    let read_peak = sampler.as_ref().map(AnonPeak::take);
    let after_read = rss_anon();
    drop(sampler);
    assert_eq!(outcome.distributions.len(), request.questions.len());
    for (d, q) in outcome.distributions.iter().zip(&request.questions) {
        let p = &d.0;
        assert_eq!(
            p.len(),
            q.label_count(),
            "{layout}: one probability per label"
        );
        assert!(
            p.iter().all(|x| x.is_finite() && *x >= 0.0),
            "{layout}: {p:?}"
        );
        let sum: f64 = p.iter().sum();
        assert!((sum - 1.0).abs() < 1e-6, "{layout}: sums to {sum}");
    }
    // Weights stay as stored with bfloat16 activations: the load adds at most 1.15x the
    // checkpoint's bytes to the process (docs/checkpoint-layouts.md).
    if let (Some(b), Some(a)) = (before, after) {
        let grown = a.saturating_sub(b);
        eprintln!(
            "{layout}: {:.2} GB on disk, load added {:.2} GB resident ({:.2}x)",
            disk as f64 / 1e9,
            grown as f64 / 1e9,
            grown as f64 / disk as f64
        );
        assert!(
            grown as f64 <= 1.15 * disk as f64,
            "{layout}: load grew RSS by {grown} bytes for {disk} on disk"
        );
    }
    // Transients: at their peaks, the load and the read hold at most the largest tensor above
    // the loaded weights (plus the read's activations).
    if let (Some(load_peak), Some(read_peak), Some(steady), Some(after_read)) =
        (load_peak, read_peak, steady, after_read)
    {
        let mb = |b: u64| b as f64 / 1048576.0;
        let (load_over, read_over) = (
            load_peak.saturating_sub(steady),
            read_peak.saturating_sub(steady),
        );
        eprintln!(
            "{layout}: anonymous memory after the load {:.0} MiB, after the read {:.0} MiB; \
             peak above it during the load {:.0} MiB, during the read {:.0} MiB; largest \
             tensor {:.0} MiB",
            mb(steady),
            mb(after_read),
            mb(load_over),
            mb(read_over),
            mb(largest)
        );
        assert!(
            load_over <= largest,
            "{layout}: the load's peak held {load_over} bytes above the loaded model, more \
             than the largest tensor ({largest})"
        );
        assert!(
            read_over <= largest + READ_ACTIVATIONS,
            "{layout}: the read's peak held {read_over} bytes above the loaded model, more \
             than the largest tensor ({largest}) and the read's activations"
        );
    }
    eprintln!(
        "{layout}: generated in {:.0?}, loaded by {:.0?}, read by {:.0?}",
        generated,
        loaded,
        started.elapsed()
    );
}

/// Tests run on parallel threads; this keeps them one at a time, so each checkpoint is deleted
/// before the next is written.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time(layout: Layout) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    check(layout);
}

#[test]
fn full_width_nvfp4_loads_and_reads() {
    one_at_a_time(Layout::Nvfp4);
}

/// On the CPU the affine products run in float32 even with bfloat16 activations (MLX's CPU
/// kernels are ~8x slower in bfloat16; docs/checkpoint-layouts.md, "Affine products on the CPU").
#[test]
fn full_width_affine_loads_and_reads() {
    one_at_a_time(Layout::Affine);
}

#[test]
fn full_width_hf_loads_and_reads() {
    one_at_a_time(Layout::Hf);
}
