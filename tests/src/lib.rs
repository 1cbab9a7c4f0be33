//! Helpers for end-to-end tests: start real `hunch serve` processes (and the fixture sidecar) and
//! talk to them over HTTP.
//!
//! The server under test is one function, [`start_hunch`]: it runs `$HUNCH_BIN` when set (point it
//! at a release `hunch` with the real accelerator), else `hunch-e2e-server`, this package's build
//! of the very same `hunch` command line (`hunch::cli::main`), which cargo keeps fresh for these
//! tests.

pub mod bench;
pub mod http;
pub mod webdriver;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
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

/// The one variable that lets a test whose prerequisite is missing skip on purpose: a
/// comma-separated list of prerequisite names (`python` for the `.venv` of
/// `scripts/python-env.sh`; `fuzz` for the `.venv-fuzz` of `scripts/fuzz-env.sh`; `reference` for
/// `.venv-reference`, read by the accelerator's `reference_read` test; `browser` for Chromium and
/// chromedriver, which the console's browser test drives). Unlisted, a missing prerequisite fails
/// its test.
pub const SKIP_VAR: &str = "HUNCH_TEST_SKIP";

/// Whether `HUNCH_TEST_SKIP` lists `name`.
pub fn skip_listed(name: &str) -> bool {
    std::env::var(SKIP_VAR)
        .unwrap_or_default()
        .split(',')
        .any(|n| n.trim() == name)
}

/// What a test does when its prerequisite `name` (`what`, made by `setup`) is missing: it fails
/// saying how to make it and how to skip on purpose, unless `HUNCH_TEST_SKIP` lists `name`; then
/// it says so and the caller returns.
pub fn missing_prerequisite(name: &str, what: &str, setup: &str) {
    if skip_listed(name) {
        eprintln!("SKIPPED on purpose ({SKIP_VAR} lists {name}): {what} is missing");
        return;
    }
    panic!(
        "{what} is missing: {setup}. To skip the tests that need it on purpose, set \
         {SKIP_VAR}={name}."
    );
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
/// `hunch serve` over the models directory `dir` with the real sidecar, ready (or failed with
/// its logs) within a minute.
pub async fn start_hunch_over_models_dir(dir: &Path) -> Hunch {
    let d = dir.to_string_lossy().into_owned();
    let bin = accelerator_bin().to_string_lossy().into_owned();
    let hunch = start_hunch_with(
        &["--models-dir", d.as_str()],
        &[("HUNCH_ACCELERATOR_BIN", bin)],
    );
    wait_ready_or_logs(&hunch, Duration::from_secs(60)).await;
    hunch
}

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

/// The server the client-facing tests (official SDK, jevbench) run against: by default hunch with
/// the REAL accelerator (`hunch-accelerator`, MLX) on the generated tiny checkpoint
/// ([`tiny_checkpoint`]). With `HUNCH_E2E_SERVE_ARGS` set (whitespace-separated, e.g.
/// `--model dg=/models/diffusiongemma --sidecar-arg=--dtype=float32`), hunch is started with those
/// arguments instead, so with `HUNCH_BIN` pointing at a release `hunch` the same tests run against
/// a real checkpoint; `HUNCH_E2E_READY_TIMEOUT` (seconds, default 600) bounds its loading.
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
            wait_ready_or_logs(&hunch, Duration::from_secs(secs)).await;
            hunch
        }
        _ => start_hunch_real(extra).await,
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

/// Asks `probe` every 100 ms until it gives `Some`, and fails the test with what `never` says
/// (given the last `Err`) once `limit` has passed: how a test waits for something a server does
/// in the background (a reload, a log write, a shadow run) without a fixed sleep.
pub async fn eventually<T, E, F, Fut>(limit: Duration, mut probe: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(why) if start.elapsed() >= limit => panic!("after {limit:?}: {why}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
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

// ---------------------------------------------------------------------------------------------
// The real accelerator on a generated tiny checkpoint.
// ---------------------------------------------------------------------------------------------

/// Seed of the e2e checkpoint: fixed, so every run reads the very same random weights.
pub const TINY_SEED: u64 = 20_261_207;
/// Bump when the recipe below changes, so a cached checkpoint of the old recipe is not reused.
const TINY_VERSION: &str = "tiny-v1";
/// The model name the real-accelerator servers are started with.
pub const TINY_MODEL: &str = "dg-tiny";

/// A binary of the `hunch-accelerator` package (`hunch-accelerator`, `hunch-ckpt`): cargo builds
/// a package's binaries only for that package, so `cargo test -p hunch-e2e` alone may not have
/// them; `cargo build --workspace` (or `cargo test --workspace`) does.
fn accelerator_package_bin(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p hunch-accelerator` (or `cargo build --workspace`) first",
        path.display()
    );
    path
}

/// The real sidecar: `$HUNCH_ACCELERATOR_BIN`, else this build's `hunch-accelerator`.
pub fn accelerator_bin() -> PathBuf {
    match std::env::var_os("HUNCH_ACCELERATOR_BIN") {
        Some(path) => PathBuf::from(path),
        None => accelerator_package_bin("hunch-accelerator"),
    }
}

pub fn hunch_ckpt_bin() -> PathBuf {
    accelerator_package_bin("hunch-ckpt")
}

/// Writes a random checkpoint with `hunch-ckpt random` into `dir` (staged and renamed, so a
/// concurrent or crashed writer never leaves a half checkpoint that looks complete) unless a
/// complete one is there. `sets` are `--set` overrides.
pub fn ensure_random_checkpoint(dir: &std::path::Path, preset: &str, seed: u64, sets: &[&str]) {
    let done = dir.join(".complete");
    if done.exists() {
        return;
    }
    let parent = dir.parent().expect("a checkpoint dir has a parent");
    std::fs::create_dir_all(parent).expect("create the checkpoint parent dir");
    let staging = parent.join(format!(
        ".{}-staging-{}-{:?}",
        dir.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&staging);
    let mut command = Command::new(hunch_ckpt_bin());
    command
        .args(["random", "--preset", preset, "--layout", "hf", "--seed"])
        .arg(seed.to_string())
        .arg("--out")
        .arg(&staging);
    for kv in sets {
        command.args(["--set", kv]);
    }
    let out = command.output().expect("hunch-ckpt runs");
    assert!(
        out.status.success(),
        "hunch-ckpt random failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(staging.join(".complete"), seed.to_string()).expect("mark complete");
    // Another test binary may have won the race: its checkpoint is the same (same seed).
    if std::fs::rename(&staging, dir).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
        assert!(
            done.exists(),
            "could not place the checkpoint at {}",
            dir.display()
        );
    }
}

/// The e2e checkpoint: the tiny preset with a vocabulary of 4096 (every one of 255 choice labels
/// is a single token of its tokenizer) and a 64-token canvas, written once into
/// `target/e2e-checkpoints/` and reused by every test binary.
pub fn tiny_checkpoint() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = target_dir()
            .join("e2e-checkpoints")
            .join(format!("{TINY_VERSION}-seed{TINY_SEED}"));
        ensure_random_checkpoint(
            &dir,
            "tiny",
            TINY_SEED,
            &["vocab_size=4096", "top.canvas_length=64"],
        );
        dir
    })
    .clone()
}

/// Copies a checkpoint's files (not its `.complete` marker) into `to`, for tests that break one.
pub fn copy_checkpoint(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("create the copy dir");
    for entry in std::fs::read_dir(from).expect("read the checkpoint dir") {
        let entry = entry.expect("a dir entry");
        let name = entry.file_name();
        if name == ".complete" || !entry.path().is_file() {
            continue;
        }
        std::fs::copy(entry.path(), to.join(&name)).expect("copy a checkpoint file");
    }
}

/// How long a real sidecar may take to load the tiny checkpoint on a loaded machine.
pub const REAL_READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Starts `hunch serve --model dg-tiny=DIR EXTRA…` with the real `hunch-accelerator`, without
/// waiting for readiness (fault tests watch it fail to load).
pub fn start_hunch_real_unready(dir: &std::path::Path, extra: &[&str]) -> Hunch {
    let model = format!("{TINY_MODEL}={}", dir.display());
    let mut args = vec!["--model", model.as_str()];
    args.extend_from_slice(extra);
    let bin = accelerator_bin().to_string_lossy().into_owned();
    start_hunch_with(&args, &[("HUNCH_ACCELERATOR_BIN", bin)])
}

/// Starts hunch with the real accelerator on the e2e tiny checkpoint and waits until ready.
pub async fn start_hunch_real(extra: &[&str]) -> Hunch {
    let hunch = start_hunch_real_unready(&tiny_checkpoint(), extra);
    wait_ready_or_logs(&hunch, REAL_READY_TIMEOUT).await;
    hunch
}

/// [`wait_ready`], but a timeout panics with the server's logs.
pub async fn wait_ready_or_logs(hunch: &Hunch, timeout: Duration) {
    let client = reqwest::Client::new();
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Ok(r) = client.get(format!("{}/readyz", hunch.url)).send().await {
            if r.status().is_success() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{} did not become ready within {timeout:?}; logs:\n{}",
        hunch.url,
        hunch.process.logs()
    );
}

/// The ids of `pid`'s child processes (every thread's children, from `/proc`).
pub fn child_pids(pid: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                pids.extend(
                    children
                        .split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The pid of the `hunch-accelerator` child of a hunch process, if one runs.
pub fn sidecar_pid(hunch_pid: u32) -> Option<u32> {
    child_pids(hunch_pid).into_iter().find(|pid| {
        std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(|exe| exe.to_string_lossy().contains("hunch-accelerator"))
            .unwrap_or(false)
    })
}

/// The default model's file (`SmolLM2-135M-Instruct.Q4_1.gguf`) in the models cache
/// (`$HUNCH_MODELS_CACHE`, else `~/.cache/hunch/models`), where `scripts/fetch-default-model.sh`
/// puts it; `None` when it is not there.
pub fn default_model_file() -> Option<PathBuf> {
    let cache = std::env::var_os("HUNCH_MODELS_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hunch/models"))
        })?;
    let path = cache.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    path.is_file().then_some(path)
}

/// The default model's file, as a test that needs it asks: `None` (the test returns) only when
/// `HUNCH_TEST_SKIP` lists `smollm2`; missing otherwise fails the test, saying how to fetch it.
pub fn default_model_or_skip() -> Option<PathBuf> {
    let file = default_model_file();
    if file.is_none() {
        missing_prerequisite(
            "smollm2",
            "the default model",
            "run scripts/fetch-default-model.sh",
        );
    }
    file
}

/// `hunch serve` with no model configured (so the default model) on the real accelerator, with
/// `args` and `env`, once ready.
pub async fn start_hunch_default_model(args: &[&str], env: &[(&str, String)]) -> Hunch {
    let mut env = env.to_vec();
    env.push((
        "HUNCH_ACCELERATOR_BIN",
        accelerator_bin().to_string_lossy().into_owned(),
    ));
    let hunch = start_hunch_with(args, &env);
    wait_ready_or_logs(&hunch, Duration::from_secs(300)).await;
    hunch
}

/// The venv's interpreter with the official TypeSafe SDK and jevbench (`.venv`, made by
/// `scripts/python-env.sh`); `None` (the test returns) only when `HUNCH_TEST_SKIP` lists
/// `python`. A missing venv otherwise fails the test, saying how to make it.
pub fn venv_python() -> Option<PathBuf> {
    let python = workspace_root().join(".venv/bin/python");
    if python.exists() {
        return Some(python);
    }
    missing_prerequisite(
        "python",
        "the Python venv with the official SDK and jevbench (.venv)",
        "run scripts/python-env.sh",
    );
    None
}

/// Runs the official TypeSafe SDK's end-to-end script (`tests/python/sdk_e2e.py`) with `python`
/// against `hunch`, failing the test with its output and the server's logs unless it ends
/// with `SDK E2E OK`.
pub fn assert_sdk_script_passes(python: &std::path::Path, hunch: &Hunch) {
    let out = std::process::Command::new(python)
        .arg(workspace_root().join("tests/python/sdk_e2e.py"))
        .env("TYPESAFE_BASE_URL", &hunch.url)
        .env("TYPESAFE_API_KEY", "any-key-auth-is-off")
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("SDK E2E OK"),
        "stdout:\n{stdout}\nstderr:\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stderr),
        hunch.process.logs()
    );
}

/// `jevbench check` (the venv's, beside `python`) against `url`'s `/v1/systemone` as
/// `jev-latest`, failing the test unless it says `jevbench check: OK`.
pub fn assert_jevbench_check_passes(python: &std::path::Path, url: &str) {
    let out = std::process::Command::new(python.with_file_name("jevbench"))
        .args(["check", "--url", &format!("{url}/v1/systemone")])
        .args(["--model", "jev-latest"])
        .output()
        .expect("jevbench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("jevbench check: OK"),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The CSRF token a console page carries (`<body data-csrf="…">`).
pub fn console_csrf_token(page: &str) -> String {
    page.split("data-csrf=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page carries its CSRF token")
        .to_string()
}
