//! The sidecar supervisor: `hunch serve --model [NAME=]PATH` starts `hunch-accelerator serve`,
//! waits until its `/health` says ready (progress in the logs), restarts it with backoff when it
//! dies or fails, and stops it on shutdown. Reads go through its [`AcceleratorClient`]; while it
//! is starting, loading or restarting they are refused at once with `Unavailable` (503 +
//! `Retry-After`), and a read in flight when it dies fails the same way: nothing hangs.

use super::accelerator::{AcceleratorClient, HealthState};
use hunch_core::{ReadError, ReadOutcome, ReadRequest, Reader};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// The one stdout line a sidecar prints once its port is bound.
pub const LISTENING_PREFIX: &str = "HUNCH_ACCELERATOR_LISTENING ";
/// The sidecar binary's file name, looked for next to the `hunch` executable.
pub const SIDECAR_BIN: &str = "hunch-accelerator";

const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A sidecar that stayed up this long before dying restarts without accumulated backoff.
const STABLE_AFTER: Duration = Duration::from_secs(60);
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);
/// Consecutive failed health checks (2 s apart) after which a ready sidecar is restarted.
const MAX_HEALTH_FAILURES: u32 = 5;

#[derive(Debug, Clone)]
pub struct SidecarConfig {
    /// The model name the sidecar serves (`--name`).
    pub name: String,
    /// A checkpoint directory or a `.gguf` file, passed as it is (`--model`): the sidecar
    /// recognises which by its content.
    pub model_path: PathBuf,
    pub binary: PathBuf,
    /// Extra arguments after `serve … --name NAME` (e.g. `--dtype float32`).
    pub extra_args: Vec<String>,
    pub read_timeout: Duration,
}

/// What the supervisor knows about its sidecar now.
#[derive(Debug, Clone, PartialEq)]
pub enum SidecarStatus {
    Starting,
    Loading {
        progress: f64,
        message: String,
    },
    Ready,
    /// No process serves. `refused`: its last load failed for a reason no retry fixes (the
    /// sidecar's `/health` said so): reads are answered 4xx, not 503.
    Down {
        message: String,
        refused: bool,
    },
}

/// The status a read of a model whose checkpoint was refused at load is answered with. 409
/// Conflict: RFC 9110 gives it to a request that conflicts with the current state of its target
/// and that the user may resolve and resubmit, which is this case: the model's files or
/// settings must change, then the same request succeeds. Not 503 (a retry as things are can
/// never succeed), not 422 (the request itself is fine; another model answers it), not 424
/// (WebDAV's, for a method that depended on another method of the same request).
pub const REFUSED_STATUS: u16 = 409;

/// The read error for a model whose checkpoint was refused at load: a 4xx naming the model,
/// the sidecar's reason (the file, the key and its value) and where to look.
pub fn refused_read_error(model: &str, why: &str) -> ReadError {
    ReadError::Rejected {
        status: REFUSED_STATUS,
        message: format!(
            "model {model} cannot be loaded as its files and settings are, so no retry helps: \
             {why}. Its entry in GET /v1/models shows this (x_state: failed, x_refused: true); \
             a config key known not to change the model goes in its ignore_config_keys, a \
             missing chat template in its chat_template (hunch-models.toml or PUT \
             /v1/models/{model}/settings; for a --model, the sidecar's --ignore-config-key or \
             --chat-template); a changed file or setting is tried at its next load"
        ),
    }
}

struct Shared {
    status: RwLock<(SidecarStatus, Option<AcceleratorClient>)>,
    /// The running process's id, 0 while none runs: a sidecar that died holds no memory.
    pid: AtomicU32,
}

impl Shared {
    fn set(&self, status: SidecarStatus, client: Option<AcceleratorClient>) {
        if let Ok(mut s) = self.status.write() {
            *s = (status, client);
        }
    }

    fn set_status(&self, status: SidecarStatus) {
        if let Ok(mut s) = self.status.write() {
            s.0 = status;
        }
    }

    fn get(&self) -> (SidecarStatus, Option<AcceleratorClient>) {
        match self.status.read() {
            Ok(s) => s.clone(),
            Err(_) => (
                SidecarStatus::Down {
                    message: "supervisor state poisoned".into(),
                    refused: false,
                },
                None,
            ),
        }
    }
}

/// A supervised sidecar, usable as a [`Reader`].
pub struct Sidecar {
    name: String,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Sidecar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sidecar")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Sidecar {
    /// Starts the supervisor (it spawns the process in the background and returns at once).
    pub fn spawn(config: SidecarConfig) -> Arc<Sidecar> {
        let shared = Arc::new(Shared {
            status: RwLock::new((SidecarStatus::Starting, None)),
            pid: AtomicU32::new(0),
        });
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(supervise(config.clone(), shared.clone(), rx));
        Arc::new(Sidecar {
            name: config.name,
            shared,
            shutdown: tx,
            task: tokio::sync::Mutex::new(Some(task)),
        })
    }

    /// The model name it serves.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn status(&self) -> SidecarStatus {
        self.shared.get().0
    }

    /// What its process holds resident now (`VmRSS`), measured; `None` while no process runs
    /// (starting, restarting, stopped), which is when it holds nothing (docs/models.md).
    pub fn resident_bytes(&self) -> Option<u64> {
        match self.shared.pid.load(Ordering::Acquire) {
            0 => None,
            pid => super::models::resident::resident_bytes(pid),
        }
    }

    /// Stops the sidecar and its supervisor; returns once the process is gone.
    pub async fn stop(&self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.lock().await.take() {
            let _ = task.await;
        }
    }
}

#[async_trait::async_trait]
impl Reader for Sidecar {
    fn model_name(&self) -> &str {
        &self.name
    }

    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        match self.shared.get() {
            (SidecarStatus::Ready, Some(client)) => client.read_request(&request).await,
            (SidecarStatus::Loading { progress, .. }, _) => Err(ReadError::unavailable(
                format!(
                    "model {} is loading ({:.0}%)",
                    self.name,
                    (progress * 100.0).clamp(0.0, 100.0)
                ),
                Duration::from_secs(5),
            )),
            (SidecarStatus::Down { message, refused }, _) if refused => {
                Err(refused_read_error(&self.name, &message))
            }
            (SidecarStatus::Down { message, .. }, _) => Err(ReadError::unavailable(
                format!("model {} is restarting: {message}", self.name),
                Duration::from_secs(2),
            )),
            _ => Err(ReadError::unavailable(
                format!("model {} is starting", self.name),
                Duration::from_secs(2),
            )),
        }
    }

    async fn ready(&self) -> bool {
        matches!(self.shared.get().0, SidecarStatus::Ready)
    }

    fn info(&self) -> hunch_core::ReaderInfo {
        self.shared
            .get()
            .1
            .map(|client| client.reader_info())
            .unwrap_or_default()
    }
}

/// Why a sidecar process did not come up listening.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("cannot start {binary}: {source}")]
    Spawn {
        binary: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("the sidecar's stdout is not piped")]
    NoStdout,
    #[error("the sidecar exited before listening ({0})")]
    ExitedEarly(String),
    #[error("the sidecar did not print its address in time")]
    NoAddress,
}

/// Starts the process and waits for its one `LISTENING` line.
async fn start_process(config: &SidecarConfig) -> Result<(Child, String), StartError> {
    let mut command = Command::new(&config.binary);
    command
        .arg("serve")
        .arg("--model")
        .arg(&config.model_path)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--name")
        .arg(&config.name)
        .args(&config.extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        // If the supervisor is dropped, its sidecar goes with it.
        .kill_on_drop(true);
    #[cfg(target_os = "linux")]
    // SAFETY: the closure runs in the forked child before exec and only calls `prctl`, which is
    // async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            // If hunch dies without stopping its sidecars (SIGKILL, a crash), the kernel kills them
            // too: a sidecar must never outlive its supervisor holding the accelerator's memory.
            // (The signal follows the spawning thread, a runtime worker that lives as long as the
            // process.)
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|source| StartError::Spawn {
        binary: config.binary.clone(),
        source,
    })?;
    let stdout = child.stdout.take().ok_or(StartError::NoStdout)?;
    let mut lines = BufReader::new(stdout).lines();
    let wait_for_line = async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(url) = line.strip_prefix(LISTENING_PREFIX) {
                return Some(url.trim().to_string());
            }
            tracing::info!(model = %config.name, "sidecar: {line}");
        }
        None
    };
    let url = match tokio::time::timeout(LISTEN_TIMEOUT, wait_for_line).await {
        Ok(Some(url)) => url,
        Ok(None) => {
            let status = child
                .wait()
                .await
                .map(|s| s.to_string())
                .unwrap_or_default();
            return Err(StartError::ExitedEarly(status));
        }
        Err(_) => {
            let _ = child.start_kill();
            return Err(StartError::NoAddress);
        }
    };
    // Keep draining stdout so the pipe never fills and blocks the sidecar.
    let name = config.name.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::info!(model = %name, "sidecar: {line}");
        }
    });
    Ok((child, url))
}

/// Why a running sidecar stopped being usable.
enum Ended {
    Exited(String),
    Failed(String),
    /// The sidecar refused its checkpoint (`/health` said `refused`).
    Refused(String),
    Shutdown,
}

/// Polls `/health` until ready (logging progress), then keeps watching it.
async fn watch_health(client: &AcceleratorClient, shared: &Shared, name: &str) -> Ended {
    let mut last_logged = -1.0f64;
    let mut was_ready = false;
    let mut failures = 0u32;
    loop {
        let health = client.health().await;
        if health.is_ok() {
            failures = 0;
        }
        match health {
            Ok(h) => match h.state {
                HealthState::Ready => {
                    if !was_ready {
                        tracing::info!(model = name, url = client.base_url(), "sidecar ready");
                        shared.set_status(SidecarStatus::Ready);
                        was_ready = true;
                    }
                }
                HealthState::Loading | HealthState::Unknown => {
                    if h.progress - last_logged >= 0.1 || last_logged < 0.0 {
                        tracing::info!(
                            model = name,
                            progress = format!("{:.0}%", h.progress * 100.0),
                            message = %h.message,
                            "sidecar loading"
                        );
                        last_logged = h.progress;
                    }
                    shared.set_status(SidecarStatus::Loading {
                        progress: h.progress,
                        message: h.message,
                    });
                }
                HealthState::Failed if h.refused => return Ended::Refused(h.message),
                HealthState::Failed => return Ended::Failed(h.message),
            },
            Err(e) => {
                tracing::debug!(model = name, "sidecar health: {e}");
                // A ready sidecar that stops answering its health check (hung, stopped) is
                // restarted rather than left to time out every read.
                if was_ready {
                    failures += 1;
                    if failures >= MAX_HEALTH_FAILURES {
                        return Ended::Failed(format!(
                            "no answer to {failures} health checks in a row ({e})"
                        ));
                    }
                }
                let pause = if was_ready { 2000 } else { 250 };
                tokio::time::sleep(Duration::from_millis(pause)).await;
                continue;
            }
        }
        let pause = if was_ready { 2000 } else { 250 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

async fn supervise(
    config: SidecarConfig,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = BACKOFF_START;
    loop {
        if *shutdown.borrow() {
            break;
        }
        tracing::info!(model = %config.name, binary = %config.binary.display(), path = %config.model_path.display(), "starting sidecar");
        let started = Instant::now();
        let started_process = tokio::select! {
            started = start_process(&config) => started,
            // A sidecar that has not printed its address yet is killed on drop (kill_on_drop).
            _ = shutdown.changed() => break,
        };
        let ended = match started_process {
            Err(e) => Ended::Failed(e.to_string()),
            Ok((mut child, url)) => {
                match AcceleratorClient::new(&config.name, &url, config.read_timeout) {
                    Err(e) => {
                        let _ = child.start_kill();
                        Ended::Failed(e.to_string())
                    }
                    Ok(client) => {
                        shared.pid.store(child.id().unwrap_or(0), Ordering::Release);
                        shared.set(
                            SidecarStatus::Loading {
                                progress: 0.0,
                                message: String::new(),
                            },
                            Some(client.clone()),
                        );
                        let ended = tokio::select! {
                            status = child.wait() => Ended::Exited(status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())),
                            ended = watch_health(&client, &shared, &config.name) => ended,
                            _ = shutdown.changed() => Ended::Shutdown,
                        };
                        // Whatever ended it, the process must be gone before a new one starts.
                        let _ = child.start_kill();
                        let _ = child.wait().await;
                        shared.pid.store(0, Ordering::Release);
                        ended
                    }
                }
            }
        };
        let (message, refused) = match ended {
            Ended::Shutdown => {
                shared.set(
                    SidecarStatus::Down {
                        message: "shutting down".into(),
                        refused: false,
                    },
                    None,
                );
                tracing::info!(model = %config.name, "sidecar stopped");
                break;
            }
            Ended::Exited(status) => (format!("the sidecar exited ({status})"), false),
            Ended::Failed(message) => (format!("the sidecar failed: {message}"), false),
            // The sidecar's message names the file and the reason; it is shown as it is.
            Ended::Refused(message) => (message, true),
        };
        if started.elapsed() > STABLE_AFTER {
            backoff = BACKOFF_START;
        }
        tracing::warn!(model = %config.name, retry_in = ?backoff, "{message}");
        // A refused checkpoint is still restarted with backoff: its files may be fixed.
        shared.set(SidecarStatus::Down { message, refused }, None);
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => break,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}
