//! `hunch-ckpt`: write random DiffusionGemma checkpoints and convert HF checkpoints to the
//! quantised layouts.
//!
//! ```text
//! hunch-ckpt random --preset tiny --layout hf|nvfp4|affine --out DIR [--seed N] [--set k=v]...
//! hunch-ckpt convert --from DIR --to DIR --layout nvfp4|affine
//! hunch-ckpt inspect DIR
//! hunch-ckpt tokenize DIR TEXT [--chat]
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hunch_accelerator::checkpoint::{Checkpoint, Layout, Weight};
use hunch_accelerator::tokenizer::{render_chat, Tokenizer};
use hunch_accelerator::tools::random::{DenseDtype, Preset, RandomSpec};
use hunch_accelerator::tools::writer::{self, WriteSummary};

#[derive(Parser)]
#[command(
    name = "hunch-ckpt",
    about = "DiffusionGemma checkpoint layouts: random checkpoints and conversion"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write a random checkpoint (deterministic from the seed) with a tiny tokenizer.
    Random {
        /// tiny (~4 MB), small (~60 MB), mid (~815 MB), full (the real shapes, ~52 GB)
        #[arg(long, default_value = "tiny")]
        preset: String,
        /// hf, nvfp4 or affine
        #[arg(long, default_value = "hf")]
        layout: String,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Override a text_config field (JSON value), e.g. --set num_hidden_layers=12;
        /// `top.KEY=V` sets a top-level config field.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Store dense tensors as f32 instead of bf16 (hf and affine layouts).
        #[arg(long)]
        f32: bool,
        #[arg(long, default_value_t = 5000.0)]
        max_shard_mb: f64,
    },
    /// Convert an HF checkpoint into a quantised layout.
    Convert {
        #[arg(long)]
        from: PathBuf,
        #[arg(long)]
        to: PathBuf,
        /// nvfp4 or affine (hf copies the weights as bf16)
        #[arg(long)]
        layout: String,
        #[arg(long, default_value_t = 5000.0)]
        max_shard_mb: f64,
    },
    /// Detect, validate and list a checkpoint's modules.
    Inspect { dir: PathBuf },
    /// Print the token ids of TEXT (no special tokens added) under DIR/tokenizer.json, as JSON.
    Tokenize {
        dir: PathBuf,
        text: String,
        /// Wrap TEXT as the user turn of the chat format (empty system turn) first.
        #[arg(long)]
        chat: bool,
    },
}

fn print_summary(s: &WriteSummary, seconds: f64) {
    let v = serde_json::json!({
        "event": "hunch_ckpt", "layout": s.layout.to_string(), "out": s.dir.display().to_string(),
        "tensors": s.tensors, "bytes": s.bytes, "mb": (s.bytes as f64 / 1048576.0 * 10.0).round() / 10.0,
        "files": s.files, "seconds": (seconds * 100.0).round() / 100.0,
    });
    println!("{v}");
}

fn run(cli: Cli) -> Result<(), String> {
    let t0 = std::time::Instant::now();
    match cli.cmd {
        Cmd::Random {
            preset,
            layout,
            out,
            seed,
            set,
            f32,
            max_shard_mb,
        } => {
            let preset: Preset = preset.parse().map_err(|e| format!("{e}"))?;
            let layout: Layout = layout.parse().map_err(|e| format!("{e}"))?;
            let mut spec = RandomSpec::new(preset, layout);
            spec.seed = seed;
            spec.max_shard_bytes = (max_shard_mb * 1048576.0) as u64;
            if f32 {
                spec.dtype = DenseDtype::F32;
            }
            for kv in &set {
                spec.set(kv).map_err(|e| e.to_string())?;
            }
            let s = writer::write_random_checkpoint(&out, &spec).map_err(|e| e.to_string())?;
            print_summary(&s, t0.elapsed().as_secs_f64());
        }
        Cmd::Convert {
            from,
            to,
            layout,
            max_shard_mb,
        } => {
            let layout: Layout = layout.parse().map_err(|e| format!("{e}"))?;
            let s = writer::convert_with(
                &from,
                &to,
                layout,
                DenseDtype::Bf16,
                (max_shard_mb * 1048576.0) as u64,
            )
            .map_err(|e| e.to_string())?;
            print_summary(&s, t0.elapsed().as_secs_f64());
        }
        Cmd::Inspect { dir } => {
            let c = Checkpoint::open(&dir).map_err(|e| e.to_string())?;
            // A closed pipe (`| head`) ends the listing quietly instead of panicking in println!.
            let _ = inspect(&c, &dir);
        }
        Cmd::Tokenize { dir, text, chat } => {
            let t = Tokenizer::from_dir(&dir).map_err(|e| e.to_string())?;
            let text = if chat { render_chat("", &text) } else { text };
            let ids = t.encode(&text).map_err(|e| e.to_string())?;
            println!("{}", serde_json::json!(ids));
        }
    }
    Ok(())
}

fn inspect(c: &Checkpoint, dir: &std::path::Path) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}: layout {}, {} layers, {} tensors (files from {})",
        dir.display(),
        c.layout,
        c.dims.layers.len(),
        c.tensors().len(),
        c.map_source
    )?;
    for (name, w) in c.weights() {
        match w {
            Weight::Dense(t) => writeln!(out, "  {name}: {} {:?}", t.dtype, t.shape)?,
            Weight::Quantized(q) => writeln!(
                out,
                "  {name}: {:?} codes {:?} scales {} {:?}",
                q.mode, q.codes.shape, q.scales.dtype, q.scales.shape
            )?,
        }
    }
    if !c.ignored.is_empty() {
        writeln!(
            out,
            "  ({} tensors not part of the text model ignored)",
            c.ignored.len()
        )?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hunch-ckpt: {e}");
            ExitCode::FAILURE
        }
    }
}
