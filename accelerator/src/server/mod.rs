//! The sidecar's HTTP face: `GET /health` and `POST /read` on loopback, JSON bodies of
//! `hunch-core` types (see docs/accelerator-protocol.md for why HTTP and not a custom socket
//! protocol).
//!
//! MLX is not thread-safe and a forward pass saturates the machine anyway, so one dedicated
//! engine thread owns the model; HTTP handlers hand it jobs through a bounded queue and await the
//! reply. A full queue is a 503 with `Retry-After`, never an unbounded wait.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hunch_core::{ReadError, ReadOutcome, ReadRequest};
use serde::Serialize;
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
}

/// Where the sidecar is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Loading,
    Ready,
    Failed,
}

/// What `GET /health` says.
#[derive(Debug, Clone, Serialize)]
pub struct Health {
    pub state: Phase,
    pub model: String,
    /// Load progress in [0, 1].
    pub progress: f64,
    pub message: String,
}

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
}

/// Seconds a client should wait before retrying when the sidecar cannot take a read.
const RETRY_AFTER_SECONDS: u64 = 1;

/// Starts the engine thread: `load` runs on it (so the model is created on the thread that uses
/// it) and reports progress into `health`; then it serves jobs until the queue closes.
pub fn spawn_engine<E, L>(health: HealthCell, queue: usize, load: L) -> mpsc::Sender<Job>
where
    E: ReadEngine,
    L: FnOnce(&HealthCell) -> Result<E, String> + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Job>(queue.max(1));
    let spawned = std::thread::Builder::new()
        .name("hunch-engine".into())
        .spawn(move || {
            let mut engine = match load(&health) {
                Ok(engine) => {
                    health.update(|h| {
                        h.state = Phase::Ready;
                        h.progress = 1.0;
                        h.message = "ready".into();
                    });
                    tracing::info!("model ready");
                    engine
                }
                Err(message) => {
                    tracing::error!(%message, "model failed to load");
                    health.update(|h| {
                        h.state = Phase::Failed;
                        h.message = message.clone();
                    });
                    // Keep answering so clients get a clear error instead of a hang.
                    while let Some((_, reply)) = rx.blocking_recv() {
                        let _ = reply.send(Err(ReadError::Unavailable {
                            message: format!("model failed to load: {message}"),
                            retry_after_seconds: 60,
                        }));
                    }
                    return;
                }
            };
            serve_jobs(&mut engine, &mut rx);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the engine thread");
    }
    tx
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

/// The sidecar's router.
pub fn router(health: HealthCell, jobs: mpsc::Sender<Job>) -> Router {
    Router::new()
        .route("/health", get(health_handler))
        .route("/read", post(read_handler))
        .with_state(AppState { health, jobs })
}

async fn health_handler(State(state): State<AppState>) -> Json<Health> {
    Json(state.health.get())
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
        ErrorResponse(ReadError::Rejected {
            status: 422,
            message: format!("invalid read request: {}", e.body_text()),
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
    state.jobs.try_send((request, reply)).map_err(|_| {
        ErrorResponse(ReadError::Unavailable {
            message: "the accelerator's queue is full".into(),
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
