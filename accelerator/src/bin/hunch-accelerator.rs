//! `hunch-accelerator`: the sidecar that loads one checkpoint (a DiffusionGemma folder, or a chat
//! model as a GGUF file or Hugging Face folder) and serves System One reads to the Hunch host over
//! loopback HTTP (docs/accelerator-protocol.md).

use clap::{Parser, Subcommand};
use hunch_accelerator::blas::{select as select_blas, BlasChoice};
use hunch_accelerator::checkpoint::causal::AffineWeights;
use hunch_accelerator::engine::{load_engine, CausalEngineOptions, EngineOptions};
use hunch_accelerator::model::causal::CausalKernels;
use hunch_accelerator::model::ActivationDtype;
use hunch_accelerator::read::diffusion::{plan::CANVAS_STEP, MAX_CANVAS_CAP};
use hunch_accelerator::scheduler::{Batching, SchedulerConfig};
use hunch_accelerator::server::{router, spawn_engine, HealthCell, LoadFailure};
use hunch_accelerator::tools::demo::{demo_dir, ensure_demo_checkpoint};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "hunch-accelerator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load a checkpoint and serve reads.
    Serve(ServeArgs),
    /// Write (or find cached) the demo checkpoint and print its directory.
    Demo,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The checkpoint: a chat model (Llama, Qwen3 or Gemma 3) as a GGUF file or a Hugging Face
    /// folder (safetensors, or mlx-community's affine 4/8-bit), or a DiffusionGemma folder (HF,
    /// super-decider NVFP4 or mlx-community affine layout). Told apart by content.
    #[arg(long, conflicts_with = "demo")]
    model: Option<PathBuf>,
    /// Serve the generated demo checkpoint (random weights: answers carry no meaning).
    #[arg(long)]
    demo: bool,
    /// Address to listen on; port 0 picks a free one (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Model name reported to clients.
    #[arg(long)]
    name: Option<String>,
    /// Model dtype: `auto` (bfloat16 on a GPU, float32 on the CPU), float32 (float32 weights and
    /// activations; twice a bf16 checkpoint's memory) or bfloat16 (the checkpoint's bf16 bytes in
    /// memory; on a GPU bf16 activations, on the CPU float32 activations over the bf16 weights,
    /// so a bf16 checkpoint answers as in float32 up to the last bits, at about float32's time;
    /// docs/mlx-on-linux.md).
    #[arg(long, default_value = "auto", value_parser = parse_dtype)]
    dtype: DtypeArg,
    /// Widest read canvas in tokens (multiple of 16; at most 128 and the checkpoint's
    /// canvas_length).
    #[arg(long, default_value_t = 64, value_parser = parse_canvas_cap)]
    canvas_cap: usize,
    /// Longest prompt a read may prefill; longer requests are refused before any work.
    #[arg(long, default_value_t = 12_288)]
    max_prompt_tokens: usize,
    /// The automatic re-read rule (three more draws when the first is uncertain).
    #[arg(long, default_value = "on", value_parser = parse_switch, action = clap::ArgAction::Set)]
    rereads: bool,
    /// Requests waiting for the engine before new ones get 503.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Batching across requests: `auto` batches only where the start-up probe measured it
    /// exact (else one request at a time, so every answer equals the read alone); `on` batches
    /// anyway (throughput; the deviation is reported); `off` reads one request at a time.
    #[arg(long, env = "HUNCH_BATCHING", default_value = "auto")]
    batching: Batching,
    /// BLAS for MLX's CPU matmuls: `auto` (OpenBLAS when installed, else the MLX wheel's
    /// reference BLAS), `openblas`, or `reference` (slow; batching on it is bit-exact).
    #[arg(long, env = "HUNCH_BLAS", default_value = "auto")]
    blas: BlasChoice,
    /// Requests read at once, their work sharing forward passes.
    #[arg(long, default_value_t = 16)]
    batch_requests: usize,
    /// Most rows (prompt-chunk plus canvas tokens) in one forward pass.
    #[arg(long, default_value_t = 2048)]
    batch_rows: usize,
    /// Memory budget (MiB) for the prompt K/V of reads in flight; reads beyond it wait.
    #[arg(long, default_value_t = 2048)]
    kv_budget_mb: u64,
    /// Prefill chunk length in tokens (the prefix cache reuses whole chunks). Default: 64 for
    /// DiffusionGemma, 128 for chat models.
    #[arg(long)]
    prefill_chunk: Option<usize>,
    /// Prefix KV cache capacity (MiB); 0 turns it off.
    #[arg(long, default_value_t = 1024)]
    prefix_cache_mb: u64,
    /// Skip the start-up probe that measures whether batching changes answers.
    #[arg(long)]
    no_batch_probe: bool,
    /// Largest read request body in bytes (the host learns it from /health and refuses larger
    /// reads with 400 request_too_large before sending them).
    #[arg(long, default_value_t = hunch_accelerator::server::DEFAULT_MAX_REQUEST_BYTES)]
    max_request_bytes: usize,
    /// Memory the weights converted at load may take (bytes, or e.g. 48G, 512M). Float32
    /// activations widen bf16 weights; a load whose widened weights exceed this is refused
    /// before allocating. Default: the memory the machine has available.
    #[arg(long, env = "HUNCH_MEMORY_LIMIT", value_parser = parse_memory_limit)]
    memory_limit: Option<u64>,
    /// Chat models' affine-quantised weights (GGUF Q4_0/Q4_1/Q8_0, mlx-community 4/8-bit):
    /// `auto` keeps them quantised where the native kernels' integer products run them (a CPU
    /// with AVX2, AVX-VNNI, AVX-512 VNNI or NEON, `--causal-kernels` auto or native; the copy
    /// is detected at start, `HUNCH_CPU_ISA` picks another), else widens them to dense float32
    /// at load on the CPU when the model takes at most 6 GiB that way (MLX's CPU quantized
    /// products are scalar; float32 ones use the BLAS, 12x faster on SmolLM2) and keeps them
    /// quantised otherwise; `quantized` always keeps them; `dense` always widens.
    #[arg(long, env = "HUNCH_AFFINE_WEIGHTS", default_value = "auto", value_parser = parse_affine)]
    affine_weights: AffineWeights,
    /// What runs chat models' prompt chunks: `auto` runs them on the native CPU kernels
    /// (vectorised Rust; float32 products in the BLAS, bf16/f16 weights widened once, quantised
    /// ones as integer products where the CPU has AVX2 or NEON at least) when MLX's device is the CPU and
    /// every projection qualifies, else on MLX; `mlx` always MLX; `native` the native kernels, or a failed load
    /// that says why not.
    #[arg(long, env = "HUNCH_CAUSAL_KERNELS", default_value = "auto")]
    causal_kernels: CausalKernels,
    /// A chat model's config key (config.json, or GGUF metadata) known not to change the
    /// model, which the load would otherwise refuse as unknown (repeat for several; a
    /// `hunch-models.toml` entry's `ignore_config_keys`). Ignored keys are listed in the
    /// model's info (docs/models.md, "Configs").
    #[arg(long = "ignore-config-key", value_name = "KEY")]
    ignore_config_keys: Vec<String>,
    /// The chat template a chat model's prompts are rendered with, in place of the
    /// checkpoint's own (base models' GGUFs have none): a built-in (`chatml` for Qwen and
    /// SmolLM2, `llama3`, `gemma`) or a Jinja file's path (a `hunch-models.toml` entry's
    /// `chat_template`; `hunch serve --chat-template NAME=TEMPLATE` for a `--model`).
    #[arg(long, value_name = "NAME|PATH")]
    chat_template: Option<String>,
    /// Bits the native kernels' integer products keep of each input (chat models with
    /// quantised weights on a CPU with SIMD integer products): `16` (the default; label probabilities
    /// within ~1e-4 of a float32 read) or `8` (about twice as fast in the products, as
    /// llama.cpp rounds them; probabilities ~1e-2 off on SmolLM2).
    #[arg(long, env = "HUNCH_ACTIVATION_BITS", default_value = "16")]
    activation_bits: hunch_accelerator::model::causal::cpu::kernels::quant::Precision,
    /// The copy of the integer products for quantised chat weights: `auto` (the best this CPU
    /// runs, detected at start) or one of `portable`, `avx2`, `avxvnni`, `avx512vnni`, `neon`,
    /// `dotprod`, `i8mm` (all give the same bits); one this CPU cannot run stops the start,
    /// naming the CPU's features. `portable` keeps the float kernels portable too.
    #[arg(long, env = "HUNCH_CPU_ISA", default_value = "auto")]
    cpu_isa: String,
    /// Count the MLX operations each engine step builds and report them per read
    /// (`stats.operations`; walks every step's graph, for benchmarks).
    #[arg(long, env = "HUNCH_COUNT_OPS")]
    count_ops: bool,
}

/// `--dtype`: `None` for `auto`, chosen from the device once MLX is up.
#[derive(Clone, Copy)]
struct DtypeArg(Option<ActivationDtype>);

fn parse_dtype(s: &str) -> Result<DtypeArg, String> {
    match s {
        "auto" => Ok(DtypeArg(None)),
        other => other.parse().map(|d| DtypeArg(Some(d))).map_err(
            |e: hunch_accelerator::model::diffusion_gemma::forward_io::UnknownDtype| e.to_string(),
        ),
    }
}

/// `--canvas-cap`: canvases grow in steps of 16 tokens, up to the widest the read plans for.
fn parse_canvas_cap(s: &str) -> Result<usize, String> {
    let cap: usize = s
        .parse()
        .map_err(|_| format!("not a number of tokens: {s:?}"))?;
    if cap == 0 || cap % CANVAS_STEP != 0 || cap > MAX_CANVAS_CAP {
        return Err(format!(
            "must be a multiple of {CANVAS_STEP} from {CANVAS_STEP} to {MAX_CANVAS_CAP}, got {cap}"
        ));
    }
    Ok(cap)
}

fn parse_affine(s: &str) -> Result<AffineWeights, String> {
    match s {
        "auto" => Ok(AffineWeights::Auto),
        "quantized" => Ok(AffineWeights::Quantized),
        "dense" => Ok(AffineWeights::Dense),
        other => Err(format!("{other:?}: use auto, quantized or dense")),
    }
}

fn parse_memory_limit(s: &str) -> Result<u64, String> {
    hunch_core::size::parse_size(s).map_err(|e| e.to_string())
}

fn parse_switch(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        other => Err(format!("{other:?}: use on or off")),
    }
}

fn main() -> std::process::ExitCode {
    // Before any thread starts: it sets an environment variable OpenBLAS reads when it loads.
    hunch_accelerator::blas::prefer_avx512_openblas();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // The host forwards sidecar logs into its own; colour codes only help a terminal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Demo => ensure_demo_checkpoint(&demo_dir())
            .map(|dir| println!("{}", dir.display()))
            .map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("hunch-accelerator: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    for (flag, value) in [
        ("--prefill-chunk", args.prefill_chunk.unwrap_or(1)),
        ("--batch-requests", args.batch_requests),
        ("--batch-rows", args.batch_rows),
        ("--queue", args.queue),
        ("--max-request-bytes", args.max_request_bytes),
    ] {
        if value == 0 {
            return Err(format!("{flag} must be at least 1"));
        }
    }
    // The integer products' copy, chosen once per process before any kernel runs: one this CPU
    // cannot run (or a name of none) stops the start here, naming the CPU's features, rather
    // than serving on another copy than the one asked for (docs/logit-read.md, "Kernels").
    let quant_isa =
        hunch_accelerator::model::causal::cpu::kernels::quant::configure(Some(&args.cpu_isa))
            .map_err(|e| e.to_string())?;
    tracing::info!(isa = %quant_isa, "instruction set of the integer products");
    // Before any MLX work: the BLAS is chosen once per process.
    let blas = select_blas(args.blas).map_err(|e| e.to_string())?;
    tracing::info!(%blas, "BLAS for MLX's CPU matmuls");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("listening on {}: {e}", args.listen))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("reading the bound address: {e}"))?;
        let name = args.name.clone().unwrap_or_else(|| match &args.model {
            // A GGUF file is named by its stem (`SmolLM2-135M-Instruct.Q4_1.gguf` →
            // `SmolLM2-135M-Instruct.Q4_1`), a folder by its name.
            Some(path) if path.is_file() => path
                .file_stem()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into()),
            Some(dir) => dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "diffusiongemma".into()),
            None => "hunch-demo".into(),
        });
        // The host waits for exactly this line before it polls /health.
        println!("HUNCH_ACCELERATOR_LISTENING http://{addr}");
        let _ = std::io::stdout().flush();

        let health = HealthCell::new(&name);
        let options = EngineOptions {
            dtype: args
                .dtype
                .0
                .unwrap_or_else(ActivationDtype::for_default_device),
            canvas_cap: args.canvas_cap,
            max_prompt_tokens: args.max_prompt_tokens,
            rereads: args.rereads,
            progress: false,
            scheduler: SchedulerConfig {
                max_requests: args.batch_requests,
                batching: args.batching,
                max_rows: args.batch_rows,
                kv_budget_bytes: args.kv_budget_mb << 20,
                prefill_chunk: args
                    .prefill_chunk
                    .unwrap_or(hunch_accelerator::model::DEFAULT_PREFILL_CHUNK),
                cache_bytes: args.prefix_cache_mb << 20,
            },
            probe_batching: !args.no_batch_probe,
            count_operations: args.count_ops,
            memory_limit: args.memory_limit,
        };
        let causal = CausalEngineOptions {
            max_prompt_tokens: args.max_prompt_tokens,
            prefill_chunk: args
                .prefill_chunk
                .unwrap_or(hunch_accelerator::model::causal::DEFAULT_CAUSAL_CHUNK),
            prefix_cache_bytes: args.prefix_cache_mb << 20,
            max_requests: args.batch_requests,
            affine: args.affine_weights,
            kernels: args.causal_kernels,
            activations: args.activation_bits,
            ignore_config_keys: args.ignore_config_keys.clone(),
            chat_template: args.chat_template.clone(),
        };
        let model_dir = args.model.clone();
        let demo = args.demo || model_dir.is_none();
        let jobs = spawn_engine(health.clone(), args.queue, move |health: &HealthCell| {
            let dir = match model_dir {
                Some(dir) => dir,
                None => {
                    tracing::warn!(
                        "no --model given: serving the DEMO checkpoint. Its weights are random and \
                         its answers carry NO meaning; pass --model DIR for a real checkpoint"
                    );
                    health.update(|h| h.message = "writing the demo checkpoint".into());
                    // Writing the generated demo is the disk's business, never a refusal.
                    ensure_demo_checkpoint(&demo_dir())
                        .map_err(|e| LoadFailure::from(e.to_string()))?
                }
            };
            health.update(|h| {
                h.progress = 0.1;
                h.message = format!("loading {}", dir.display());
            });
            tracing::info!(dir = %dir.display(), demo, "loading model");
            // The error's type says whether it is a refusal (`engine::refusal`), which the host
            // answers 4xx instead of retrying.
            load_engine(&dir, &options, &causal).map_err(LoadFailure::from)
        });
        let app = router(health, jobs, args.max_request_bytes);
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(|e| format!("serving: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canvas_cap_is_a_multiple_of_the_step_within_the_widest_canvas() {
        assert_eq!(parse_canvas_cap("64"), Ok(64));
        assert_eq!(parse_canvas_cap("128"), Ok(128));
        for bad in ["0", "15", "65", "144", "wide"] {
            let err = parse_canvas_cap(bad).unwrap_err();
            assert!(
                err.contains("multiple of 16") || err.contains("not a number"),
                "{bad}: {err}"
            );
        }
    }
}
