//! The command line.

use hunch_e2e::bench::Flags;
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

pub(crate) const USAGE: &str =
    "batch-bench [--preset small-wide|tiny|small|mid] [--ckpt DIR] [--clients N] \
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
    let mut flags = Flags::from_env();
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--preset" => a.preset = flags.value(&flag)?,
            "--ckpt" => a.ckpt = Some(PathBuf::from(flags.value(&flag)?)),
            "--clients" => a.clients = flags.parsed(&flag)?,
            "--seconds" => a.seconds = flags.parsed(&flag)?,
            "--reps" => a.reps = flags.parsed(&flag)?,
            "--questions" => a.questions = flags.parsed(&flag)?,
            "--dtype" => a.dtype = flags.value(&flag)?,
            "--only" => a.only = Some(flags.value(&flag)?),
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
