//! Helpers for end-to-end tests: start real `hunch serve` processes (and the fixture sidecar) and
//! talk to them over HTTP.
//!
//! The server under test is one function, [`start_hunch`]: it runs `$HUNCH_BIN` when set (point it
//! at a release `hunch` with the real accelerator), else `hunch-e2e-server`, this package's build
//! of the very same `hunch` command line (`hunch::cli::main`), which cargo keeps fresh for these
//! tests.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The directory holding this build's binaries (`target/debug`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    let mut dir = exe
        .parent()
        .expect("the test binary is in a directory")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// The workspace root (for `.venv/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

pub fn hunch_bin() -> PathBuf {
    std::env::var_os("HUNCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("hunch-e2e-server"))
}

/// The test double of `hunch-accelerator` (see `src/bin/fixture-sidecar.rs`).
pub fn fixture_sidecar_bin() -> PathBuf {
    target_dir().join("fixture-sidecar")
}

/// A running process with captured stderr; killed when dropped.
pub struct Process {
    pub child: Child,
    pub stderr: Arc<Mutex<String>>,
    /// What the process printed after the line it was waited for.
    pub stdout_rest: Arc<Mutex<String>>,
}

impl Process {
    pub fn logs(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (graceful shutdown).
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
    }

    /// Waits for the process to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Gracefully first, so a hunch stops its sidecars; then for sure.
        if let Ok(None) = self.child.try_wait() {
            self.terminate();
            self.wait_exit(Duration::from_secs(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `program args` with `env`, waits for a stdout line starting with `prefix` and returns
/// the rest of it (an URL) with the process.
pub fn start_process(
    program: &PathBuf,
    args: &[String],
    env: &[(&str, String)],
    prefix: &str,
) -> (String, Process) {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
    let stderr = Arc::new(Mutex::new(String::new()));
    if let Some(err) = child.stderr.take() {
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if std::env::var_os("HUNCH_E2E_VERBOSE").is_some() {
                    eprintln!("[server] {line}");
                }
                if let Ok(mut s) = sink.lock() {
                    s.push_str(&line);
                    s.push('\n');
                }
            }
        });
    }
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    let rest = Arc::new(Mutex::new(String::new()));
    let rest_sink = rest.clone();
    let wanted = prefix.to_string();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if !sent {
                if let Some(url) = line.strip_prefix(&wanted) {
                    let _ = tx.send(url.trim().to_string());
                    sent = true;
                    continue;
                }
            }
            if let Ok(mut s) = rest_sink.lock() {
                s.push_str(&line);
                s.push('\n');
            }
        }
    });
    let process = Process {
        child,
        stderr,
        stdout_rest: rest,
    };
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(url) => (url, process),
        Err(_) => panic!(
            "{} did not print {prefix:?} in time; stderr:\n{}",
            program.display(),
            process.logs()
        ),
    }
}

/// A running `hunch serve`.
pub struct Hunch {
    pub url: String,
    pub process: Process,
}

/// Starts `hunch serve --listen 127.0.0.1:0 ARGS…` with extra environment; returns once it
/// listens. THE one place that decides which server the e2e tests run.
pub fn start_hunch_with(args: &[&str], env: &[(&str, String)]) -> Hunch {
    let mut all = vec!["serve".to_string(), "--listen".into(), "127.0.0.1:0".into()];
    all.extend(args.iter().map(|a| a.to_string()));
    let (url, process) = start_process(&hunch_bin(), &all, env, "HUNCH_LISTENING ");
    Hunch { url, process }
}

pub fn start_hunch(args: &[&str]) -> Hunch {
    start_hunch_with(args, &[])
}

/// Starts hunch with the fixture sidecar as a supervised model named `name`, and waits until
/// `/readyz` says ready.
pub async fn start_hunch_with_fixture(name: &str, extra: &[&str]) -> Hunch {
    let model = format!("{name}={}", std::env::temp_dir().display());
    let mut args = vec!["--model", model.as_str()];
    args.extend_from_slice(extra);
    let bin = fixture_sidecar_bin().to_string_lossy().into_owned();
    let hunch = start_hunch_with(
        &args,
        &[
            ("HUNCH_ACCELERATOR_BIN", bin),
            ("FIXTURE_LOAD_MS", "200".into()),
        ],
    );
    wait_ready(&hunch.url, Duration::from_secs(30)).await;
    hunch
}

/// The server the client-facing tests (official SDK, jevbench) run against. By default hunch with
/// the fixture sidecar. With `HUNCH_E2E_SERVE_ARGS` set (whitespace-separated, e.g.
/// `--model dg=/models/diffusiongemma --sidecar-arg=--dtype=float32`), hunch is started with those
/// arguments instead, so with `HUNCH_BIN` pointing at a real `hunch` (its `hunch-accelerator`
/// beside it) the same tests run against the real model; `HUNCH_E2E_READY_TIMEOUT` (seconds,
/// default 600) bounds its loading.
pub async fn start_hunch_for_clients(extra: &[&str]) -> Hunch {
    match std::env::var("HUNCH_E2E_SERVE_ARGS") {
        Ok(args) if !args.trim().is_empty() => {
            let mut all: Vec<&str> = args.split_whitespace().collect();
            all.extend_from_slice(extra);
            let hunch = start_hunch(&all);
            let secs = std::env::var("HUNCH_E2E_READY_TIMEOUT")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(600);
            wait_ready(&hunch.url, Duration::from_secs(secs)).await;
            hunch
        }
        _ => start_hunch_with_fixture("dg-test", extra).await,
    }
}

/// Polls `/readyz` until 200.
pub async fn wait_ready(url: &str, timeout: Duration) {
    let client = reqwest::Client::new();
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Ok(r) = client.get(format!("{url}/readyz")).send().await {
            if r.status().is_success() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} did not become ready within {timeout:?}");
}

/// A small request with every answer type.
pub fn sample_request() -> serde_json::Value {
    serde_json::json!({
        "model": "jev-latest",
        "state": "I was charged twice for my subscription this month. Please refund one.",
        "questions": {
            "billing": {"type": "noul", "instructions": "Is this message about billing?"},
            "team": {"type": "choice", "instructions": "Which team should handle it?",
                     "criteria": {"billing": "Payments and refunds", "technical": null, "sales team": "New purchases"}},
            "urgency": {"type": "score", "instructions": "How urgent is it?",
                        "criteria": ["Can wait", "This week", "Today"]}
        }
    })
}
