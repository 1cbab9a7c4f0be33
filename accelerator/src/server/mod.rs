//! The sidecar's HTTP face: `GET /health` and `POST /read` on loopback, JSON bodies of
//! `hunch-core` types (see docs/accelerator-protocol.md for why HTTP and not a custom socket
//! protocol).
//!
//! MLX is not thread-safe and a forward pass saturates the machine anyway, so one dedicated
//! engine thread owns the model; HTTP handlers hand it jobs through a bounded queue and await the
//! reply. A full queue is a 503 with `Retry-After`, never an unbounded wait.

pub mod info;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hunch_core::protocol::{Health, HealthState, ModelInfo, HEALTH_PATH, READ_PATH};
use hunch_core::{ReadError, ReadOutcome, ReadRequest};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot};

pub use crate::scheduler::{Reply, StepOutcome};

/// Something that answers reads, owned by the engine thread: requests go in with
/// [`ReadEngine::submit`], and each [`ReadEngine::step`] runs one batch of their work.
pub trait ReadEngine: Send + 'static {
    /// Takes a request; its answer goes to `reply` (at once, for a request that cannot be read).
    fn submit(&mut self, request: ReadRequest, reply: Reply);
    /// Whether another request can be taken now.
    fn has_room(&self) -> bool;
    /// Requests queued in front of the engine (for its gauges).
    fn set_queued(&mut self, queued: usize);
    /// Runs one batch of work.
    fn step(&mut self) -> StepOutcome;
    /// What the host learns in `/health` once the model is loaded: limits and fingerprint.
    fn info(&self) -> Option<ModelInfo> {
        None
    }
}

/// Where the sidecar is in its life (the protocol's health state).
pub type Phase = HealthState;

/// Shared, updatable health: the loader writes progress, handlers read it.
#[derive(Clone)]
pub struct HealthCell(Arc<Mutex<Health>>);

impl HealthCell {
    pub fn new(model: &str) -> Self {
        HealthCell(Arc::new(Mutex::new(Health {
            state: Phase::Loading,
            model: model.to_string(),
            progress: 0.0,
            message: "loading".into(),
            refused: false,
            info: None,
        })))
    }

    pub fn get(&self) -> Health {
        match self.0.lock() {
            Ok(h) => h.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn update(&self, f: impl FnOnce(&mut Health)) {
        match self.0.lock() {
            Ok(mut h) => f(&mut h),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }
}

pub type Job = (ReadRequest, oneshot::Sender<Result<ReadOutcome, ReadError>>);

#[derive(Clone)]
struct AppState {
    health: HealthCell,
    jobs: mpsc::Sender<Job>,
    max_request_bytes: usize,
}

/// The largest `POST /read` body taken by default (the host learns it from `/health` and refuses
/// larger reads itself). Far beyond any prompt a model's context can hold.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// Seconds a client should wait before retrying when the sidecar cannot take a read.
const RETRY_AFTER_SECONDS: u64 = 1;

/// Why a load failed, as `/health` reports it: the message, and whether it is a refusal (the
/// checkpoint's files or the model's settings: no retry fixes it, so the host answers 4xx).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFailure {
    pub message: String,
    pub refused: bool,
}

/// A bare message says nothing of its cause, so it is not a refusal: the host retries it, as it
/// always has, rather than tell a client a retry cannot help when it might.
impl From<String> for LoadFailure {
    fn from(message: String) -> Self {
        LoadFailure {
            message,
            refused: false,
        }
    }
}

/// Starts the engine thread: `load` runs on it (so the model is created on the thread that uses
/// it) and reports progress into `health`; then it serves jobs until the queue closes. If the
/// thread cannot start or panics (while loading or serving), `health` says `failed` with why, so
/// the host's supervisor restarts the sidecar, and reads queued meanwhile get 503.
pub fn spawn_engine<E, L, Why>(health: HealthCell, queue: usize, load: L) -> mpsc::Sender<Job>
where
    E: ReadEngine,
    Why: Into<LoadFailure>,
    L: FnOnce(&HealthCell) -> Result<E, Why> + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Job>(queue.max(1));
    let thread_health = health.clone();
    let spawned = std::thread::Builder::new()
        .name("hunch-engine".into())
        .spawn(move || {
            let health = thread_health;
            let run = std::panic::AssertUnwindSafe(|| {
                let mut engine = match load(&health) {
                    Ok(engine) => {
                        let info = engine.info();
                        health.update(|h| {
                            h.info = info;
                            h.state = Phase::Ready;
                            h.progress = 1.0;
                            h.message = "ready".into();
                        });
                        tracing::info!("model ready");
                        engine
                    }
                    Err(why) => {
                        let LoadFailure { message, refused } = why.into();
                        tracing::error!(%message, refused, "model failed to load");
                        mark_failed(&health, &message, refused);
                        return Err(format!("model failed to load: {message}"));
                    }
                };
                serve_jobs(&mut engine, &mut rx);
                Ok(())
            });
            let refusal = match std::panic::catch_unwind(run) {
                Ok(Ok(())) => return,
                Ok(Err(refusal)) => refusal,
                Err(panic) => {
                    let message = format!("the engine thread stopped: {}", panic_text(&*panic));
                    tracing::error!(%message, "engine failed");
                    // A panic is a bug or a runtime fault, not the checkpoint's: worth a retry.
                    mark_failed(&health, &message, false);
                    message
                }
            };
            // Keep answering so clients get a clear error instead of a hang.
            while let Some((_, reply)) = rx.blocking_recv() {
                let _ = reply.send(Err(ReadError::Unavailable {
                    message: refusal.clone(),
                    retry_after_seconds: 60,
                }));
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the engine thread");
        mark_failed(
            &health,
            &format!("cannot start the engine thread: {e}"),
            false,
        );
    }
    tx
}

fn mark_failed(health: &HealthCell, message: &str, refused: bool) {
    health.update(|h| {
        h.state = Phase::Failed;
        h.message = message.to_string();
        h.refused = refused;
    });
}

/// What a panic said, when it said it with a string (as `panic!` and `expect` do).
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        text.to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic".to_string()
    }
}

/// The engine loop: admit requests while the engine has room (blocking only when nothing is in
/// flight), then run one batch; until the queue closes and the work in flight is done.
fn serve_jobs<E: ReadEngine>(engine: &mut E, rx: &mut mpsc::Receiver<Job>) {
    let mut closed = false;
    let mut idle = true;
    loop {
        while !closed && engine.has_room() {
            let next = if idle {
                rx.blocking_recv()
            } else {
                match rx.try_recv() {
                    Ok(job) => Some(job),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => None,
                }
            };
            match next {
                Some((request, reply)) => {
                    idle = false;
                    engine.submit(request, logged_reply(reply));
                }
                None => closed = true,
            }
        }
        engine.set_queued(rx.len());
        match engine.step() {
            StepOutcome::Worked => {}
            StepOutcome::Idle if closed => return,
            StepOutcome::Idle => idle = true,
        }
    }
}

/// Logs a request's figures and sends its answer; abandoned once the HTTP handler waiting for it
/// is gone (the host timed out or the client disconnected).
fn logged_reply(reply: oneshot::Sender<Result<ReadOutcome, ReadError>>) -> Reply {
    let sender = Arc::new(Mutex::new(Some(reply)));
    let watch = sender.clone();
    Reply::new(move |outcome| {
        if let Ok(o) = &outcome {
            let s = &o.stats;
            tracing::info!(
                reads = s.reads,
                prompt_tokens = s.prompt_tokens,
                reused_tokens = s.reused_tokens,
                cache_hits = s.cache_hits,
                draws = s.draws,
                forwards = s.forwards,
                batch_requests = s.max_batch_requests,
                batch_rows = s.max_batch_rows,
                tokenize_s = s.tokenize_seconds,
                prefill_s = s.prefill_seconds,
                denoise_s = s.denoise_seconds,
                "read"
            );
        }
        let taken = match sender.lock() {
            Ok(mut s) => s.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(sender) = taken {
            // The client may have gone away meanwhile; its answer is simply dropped.
            let _ = sender.send(outcome);
        }
    })
    .with_abandoned(move || match watch.lock() {
        Ok(s) => s.as_ref().is_some_and(|s| s.is_closed()),
        Err(_) => false,
    })
}

/// The sidecar's router, taking read bodies of up to `max_request_bytes`.
pub fn router(health: HealthCell, jobs: mpsc::Sender<Job>, max_request_bytes: usize) -> Router {
    Router::new()
        .route(HEALTH_PATH, get(health_handler))
        .route(READ_PATH, post(read_handler))
        .layer(DefaultBodyLimit::max(max_request_bytes))
        .with_state(AppState {
            health,
            jobs,
            max_request_bytes,
        })
}

async fn health_handler(State(state): State<AppState>) -> Json<Health> {
    let mut health = state.health.get();
    if let Some(info) = &mut health.info {
        info.limits.max_request_bytes = Some(state.max_request_bytes as u64);
    }
    Json(health)
}

/// A `ReadError` as an HTTP response: the status the host maps back, the error as the body.
pub struct ErrorResponse(pub ReadError);

pub fn status_of(error: &ReadError) -> StatusCode {
    match error {
        ReadError::InvalidQuestion { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        ReadError::TooLarge { .. } => StatusCode::BAD_REQUEST,
        ReadError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        ReadError::Timeout => StatusCode::GATEWAY_TIMEOUT,
        ReadError::Rejected { status, .. } => {
            StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_REQUEST)
        }
        ReadError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ErrorResponse {
    fn into_response(self) -> Response {
        let status = status_of(&self.0);
        let mut response = (status, Json(&self.0)).into_response();
        if let ReadError::Unavailable {
            retry_after_seconds,
            ..
        } = &self.0
        {
            if let Ok(v) = retry_after_seconds.to_string().parse() {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        response
    }
}

async fn read_handler(
    State(state): State<AppState>,
    body: Result<Json<ReadRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<ReadOutcome>, ErrorResponse> {
    let Json(request) = body.map_err(|e| {
        // Too large for the body limit: a request that can never succeed here, said plainly.
        ErrorResponse(if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ReadError::TooLarge {
                message: format!(
                    "the read is larger than this accelerator takes ({} bytes of state and \
                     questions at most)",
                    state.max_request_bytes
                ),
            }
        } else {
            ReadError::Rejected {
                status: 422,
                message: format!("invalid read request: {}", e.body_text()),
            }
        })
    })?;
    let health = state.health.get();
    if health.state != Phase::Ready {
        return Err(ErrorResponse(ReadError::Unavailable {
            message: format!("model {} is {}", health.model, health.message),
            retry_after_seconds: RETRY_AFTER_SECONDS,
        }));
    }
    let (reply, answer) = oneshot::channel();
    state.jobs.try_send((request, reply)).map_err(|e| {
        let message = match e {
            mpsc::error::TrySendError::Full(_) => "the accelerator's queue is full",
            // The engine thread is gone; health says failed and the host restarts the sidecar.
            mpsc::error::TrySendError::Closed(_) => "the engine stopped",
        };
        ErrorResponse(ReadError::Unavailable {
            message: message.into(),
            retry_after_seconds: RETRY_AFTER_SECONDS,
        })
    })?;
    match answer.await {
        Ok(Ok(outcome)) => Ok(Json(outcome)),
        Ok(Err(e)) => Err(ErrorResponse(e)),
        Err(_) => Err(ErrorResponse(ReadError::Unavailable {
            message: "the engine stopped".into(),
            retry_after_seconds: RETRY_AFTER_SECONDS,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Posts `body` to `/read` of a router with a body limit of `limit` bytes over a raw
    /// connection; returns the status line and the body.
    async fn post_read(limit: usize, body: &str) -> String {
        let (jobs, _rx) = mpsc::channel(1);
        let app = router(HealthCell::new("m"), jobs, limit);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST /read HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        // The server may answer (and close) before reading the whole body.
        let _ = stream.write_all(request.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_a_400_too_large_not_an_internal_detail() {
        let state = "x".repeat(4096);
        let body = format!(r#"{{"state": "{state}", "questions": []}}"#);
        let answer = post_read(1024, &body).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains(r#""kind":"too_large""#), "{answer}");
        assert!(answer.contains("1024 bytes"), "{answer}");
        // Malformed JSON under the limit stays a 422.
        let answer = post_read(1024, "{").await;
        assert!(answer.starts_with("HTTP/1.1 422"), "{answer}");
    }

    /// An engine whose first batch of work panics, as a bug in the model code would.
    #[derive(Default)]
    struct PanicsOnWork {
        pending: Vec<Reply>,
    }

    impl ReadEngine for PanicsOnWork {
        fn submit(&mut self, _request: ReadRequest, reply: Reply) {
            self.pending.push(reply);
        }
        fn has_room(&self) -> bool {
            true
        }
        fn set_queued(&mut self, _queued: usize) {}
        fn step(&mut self) -> StepOutcome {
            if self.pending.is_empty() {
                return StepOutcome::Idle;
            }
            panic!("injected engine fault");
        }
    }

    fn request() -> ReadRequest {
        ReadRequest {
            state: "s".into(),
            questions: Vec::new(),
            options: Default::default(),
            asked: None,
        }
    }

    async fn read(state: &AppState) -> Result<Json<ReadOutcome>, ErrorResponse> {
        read_handler(State(state.clone()), Ok(Json(request()))).await
    }

    async fn wait_for(health: &HealthCell, phase: Phase) {
        let start = Instant::now();
        while health.get().state != phase {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "never {phase:?}: {:?}",
                health.get()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn an_engine_thread_that_panics_marks_the_sidecar_failed_and_refuses_reads() {
        let health = HealthCell::new("m");
        let jobs = spawn_engine(health.clone(), 4, |_: &HealthCell| {
            Ok::<_, String>(PanicsOnWork::default())
        });
        let state = AppState {
            health: health.clone(),
            jobs,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        };
        wait_for(&health, Phase::Ready).await;
        let Err(ErrorResponse(first)) = read(&state).await else {
            panic!("the read whose work panicked was answered");
        };
        assert!(matches!(first, ReadError::Unavailable { .. }), "{first:?}");
        wait_for(&health, Phase::Failed).await;
        assert!(
            health.get().message.contains("injected engine fault"),
            "{:?}",
            health.get()
        );
        let Err(ErrorResponse(next)) = read(&state).await else {
            panic!("a read after the engine died was answered");
        };
        let ReadError::Unavailable { message, .. } = next else {
            panic!("not a 503: {next:?}");
        };
        assert!(!message.contains("queue is full"), "{message}");
        assert!(message.contains("engine thread stopped"), "{message}");
    }

    #[tokio::test]
    async fn a_panic_while_loading_marks_the_sidecar_failed() {
        let health = HealthCell::new("m");
        let _jobs = spawn_engine(
            health.clone(),
            4,
            |_: &HealthCell| -> Result<PanicsOnWork, String> { panic!("injected load fault") },
        );
        wait_for(&health, Phase::Failed).await;
        assert!(health.get().message.contains("injected load fault"));
        assert!(!health.get().refused, "a panic is no refusal");
    }

    #[tokio::test]
    async fn a_refused_load_says_so_in_health_and_a_bare_message_does_not() {
        let health = HealthCell::new("m");
        let _jobs = spawn_engine(
            health.clone(),
            4,
            |_: &HealthCell| -> Result<PanicsOnWork, LoadFailure> {
                Err(LoadFailure {
                    message: "m.gguf: qwen2.attention.zoom = 2 is not a key".into(),
                    refused: true,
                })
            },
        );
        wait_for(&health, Phase::Failed).await;
        let h = health.get();
        assert!(h.refused, "{h:?}");
        assert!(h.message.contains("qwen2.attention.zoom"), "{h:?}");

        let health = HealthCell::new("m");
        let _jobs = spawn_engine(
            health.clone(),
            4,
            |_: &HealthCell| -> Result<PanicsOnWork, String> { Err("out of memory".into()) },
        );
        wait_for(&health, Phase::Failed).await;
        assert!(!health.get().refused, "{:?}", health.get());
    }

    #[tokio::test]
    async fn a_closed_queue_is_not_a_full_queue() {
        let health = HealthCell::new("m");
        health.update(|h| h.state = Phase::Ready);
        let (jobs, receiver) = mpsc::channel::<Job>(1);
        drop(receiver);
        let state = AppState {
            health,
            jobs,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        };
        let Err(ErrorResponse(ReadError::Unavailable { message, .. })) = read(&state).await else {
            panic!("not a 503");
        };
        assert_eq!(message, "the engine stopped");
    }
}
