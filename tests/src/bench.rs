//! Small pieces the benchmark binaries share (`read-bench`, `batch-bench`, `isolation-bench`).

use hunch_core::protocol::{Health, HealthState};
use hunch_core::{ChoiceOption, Question, QuestionKind, ReadOptions, ReadRequest};
use std::fmt::Display;
use std::path::Path;
use std::process::ExitCode;
use std::str::FromStr;

/// A benchmark's command-line flags, read one at a time.
pub struct Flags(std::iter::Skip<std::env::Args>);

impl Flags {
    /// The flags this process was started with.
    pub fn from_env() -> Self {
        Flags(std::env::args().skip(1))
    }

    /// The next flag, if any.
    pub fn next_flag(&mut self) -> Option<String> {
        self.0.next()
    }

    /// The value that follows `flag`.
    pub fn value(&mut self, flag: &str) -> Result<String, String> {
        self.0.next().ok_or_else(|| format!("{flag} needs a value"))
    }

    /// The value that follows `flag`, parsed.
    pub fn parsed<T: FromStr>(&mut self, flag: &str) -> Result<T, String>
    where
        T::Err: Display,
    {
        self.value(flag)?
            .parse()
            .map_err(|e| format!("{flag}: {e}"))
    }
}

/// The CPUs this process may use (0 when unknown), for a benchmark's heading.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// The machine's 1, 5 and 15 minute load averages (`/proc/loadavg`), for a benchmark's heading.
pub fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// "DEBUG" or "release": how this benchmark was built, for its heading.
pub fn build_kind() -> &'static str {
    if cfg!(debug_assertions) {
        "DEBUG"
    } else {
        "release"
    }
}

/// The exit status of a benchmark whose run ended with `result`; an error is printed as
/// `program: error`.
pub fn exit_code(program: &str, result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The bytes of the files in `dir` (a checkpoint's size on disk).
pub fn dir_bytes(dir: &Path) -> Result<u64, String> {
    Ok(std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum())
}

/// The everyday request: a noul, a 3-option choice and a 3-level score about a support ticket.
/// `n` makes the state unique from its first character, so no prefix is reused.
pub fn read_request(n: usize, draws: Option<u32>) -> ReadRequest {
    ReadRequest {
        state: format!(
            "Ticket #{n}: I was charged twice for my subscription this month and the second charge \
             is still pending on my card. Please refund one of them and confirm by email."
        ),
        questions: everyday_questions(),
        options: ReadOptions {
            seed: None,
            draws,
            ..ReadOptions::default()
        },
        asked: None,
    }
}

/// The everyday request's questions: a noul, a 3-option choice and a 3-level score.
pub fn everyday_questions() -> Vec<Question> {
    vec![
        Question {
            instructions: "Is this message about billing?".into(),
            kind: QuestionKind::Noul {
                yes: None,
                no: None,
            },
        },
        Question {
            instructions: "Which team should handle it?".into(),
            kind: QuestionKind::Choice {
                options: vec![
                    option("billing", Some("Payments and refunds")),
                    option("technical", None),
                    option("sales team", Some("New purchases")),
                ],
            },
        },
        Question {
            instructions: "How urgent is it?".into(),
            kind: QuestionKind::Score {
                levels: vec!["Can wait".into(), "This week".into(), "Today".into()],
            },
        },
    ]
}

pub fn option(name: &str, description: Option<&str>) -> ChoiceOption {
    ChoiceOption {
        name: name.into(),
        description: description.map(str::to_owned),
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

pub fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// A sidecar that said ready.
pub struct ReadySidecar {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    pub process: crate::Process,
    /// Every BLAS library its process has mapped, as its `/health` reported them.
    pub blas_libraries: Vec<String>,
}

/// Starts `hunch-accelerator` with `args` and waits until its `/health` says ready (or failed,
/// with its logs; or `timeout` passes): the sidecar every model benchmark measures against.
pub async fn start_ready_sidecar(
    accelerator: &Path,
    args: &[String],
    timeout: std::time::Duration,
) -> Result<ReadySidecar, String> {
    let (url, process) = crate::start_process(
        &accelerator.to_path_buf(),
        args,
        &[],
        "HUNCH_ACCELERATOR_LISTENING ",
    );
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    loop {
        let h: Health = client
            .get(format!("{url}/health"))
            .send()
            .await
            .map_err(|e| format!("GET {url}/health: {e}"))?
            .json()
            .await
            .map_err(|e| format!("GET {url}/health: {e}"))?;
        match (h.state, h.info) {
            (HealthState::Ready, Some(info)) => {
                return Ok(ReadySidecar {
                    url,
                    process,
                    blas_libraries: info.blas_libraries,
                })
            }
            (HealthState::Failed, _) => {
                return Err(format!(
                    "the sidecar failed to load: {}\n{}",
                    h.message,
                    process.logs()
                ))
            }
            _ if started.elapsed() > timeout => {
                return Err(format!(
                    "the sidecar did not load in {} s: {:?} {}",
                    timeout.as_secs(),
                    h.state,
                    h.message
                ))
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
}
