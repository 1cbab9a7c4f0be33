//! The command line.

use std::path::PathBuf;

pub(crate) struct Args {
    pub(crate) preset: String,
    pub(crate) ckpt: Option<PathBuf>,
    pub(crate) clients: usize,
    pub(crate) seconds: f64,
    pub(crate) reps: usize,
    pub(crate) questions: usize,
    pub(crate) dtype: String,
    pub(crate) only: Option<String>,
}

pub(crate) const USAGE: &str = "batch-bench [--preset small-wide|tiny|small|mid] [--ckpt DIR] [--clients N] \
[--seconds S] [--reps N] [--questions N] [--dtype float32|bfloat16] [--only throughput|cache]

  --preset     random checkpoint to write and use (default small-wide: the small preset with a
               32k vocabulary and 96 experts, a few hundred MB); ignored with --ckpt
  --clients    concurrent clients of the throughput part (default 8)
  --seconds    how long the clients post, per run (default 30)
  --reps       cold and warm samples of the prefix-cache part (default 5)
  --questions  questions of the long prompt (default 12; all must fit one read's canvas)
  --dtype      activation dtype of the sidecars (default float32)
  --only       run one part only";

pub(crate) fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        preset: "small-wide".into(),
        ckpt: None,
        clients: 8,
        seconds: 30.0,
        reps: 5,
        questions: 12,
        dtype: "float32".into(),
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--preset" => a.preset = value()?,
            "--ckpt" => a.ckpt = Some(PathBuf::from(value()?)),
            "--clients" => a.clients = value()?.parse().map_err(|e| format!("--clients: {e}"))?,
            "--seconds" => a.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--reps" => a.reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--questions" => {
                a.questions = value()?.parse().map_err(|e| format!("--questions: {e}"))?
            }
            "--dtype" => a.dtype = value()?,
            "--only" => a.only = Some(value()?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if a.reps == 0 || a.clients == 0 || a.questions == 0 || a.seconds.is_nan() || a.seconds <= 0.0 {
        return Err("--reps, --clients, --questions and --seconds must be positive".into());
    }
    if !matches!(a.only.as_deref(), None | Some("throughput") | Some("cache")) {
        return Err("--only takes throughput or cache".into());
    }
    Ok(a)
}

// ---------------------------------------------------------------------------------------------
// Small helpers (the shared ones are in `hunch_e2e::bench`).
// ---------------------------------------------------------------------------------------------
