//! TEST DOUBLE of `hunch-accelerator serve`: speaks the sidecar protocol (the `LISTENING` line,
//! `GET /health`, `POST /read`) with deterministic answers derived from the request, so the
//! host's client, supervisor and fault handling can be tested without a model. Never a model.
//!
//! Behaviour hooks, all in the request's state text:
//! - `__sleep_ms=N` sleeps N ms before answering;
//! - `__die__` exits the process mid-request (the supervisor must restart it);
//! - `__too_large__` answers a `too_large` read error;
//! - a choice option named `__unreadable__` makes that question an `invalid_question`.
//!
//! Environment: `FIXTURE_LOAD_MS` (default 300) is how long it reports `loading` before `ready`;
//! `FIXTURE_FAIL_LOAD=1` reports `failed` instead; `FIXTURE_MAX_PROMPT_TOKENS=N` gives it a
//! context of N tokens (a token covers at most 4 bytes of text here): it reports that limit in
//! `/health` and refuses a longer read as `too_large`, as a real sidecar does.
//!
//! Once ready it reports a fingerprint (`fixture/NAME/` and the read algorithm's version), so a
//! host can cache its isolated answers: they depend only on the request.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hunch_core::protocol::ModelInfo;
use hunch_core::{
    LabelDistribution, QuestionKind, ReadError, ReadOutcome, ReadRequest, ReadStats, ReaderLimits,
    Usage, READ_ALGORITHM_VERSION,
};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Fixture {
    name: String,
    started: Instant,
    load: Duration,
    fail: bool,
    max_prompt_tokens: Option<u64>,
}

/// The most bytes of text one of the fixture's tokens covers.
const TOKEN_BYTES: u64 = 4;

/// The prompt tokens the fixture counts for a read: its state and question texts, 4 bytes each.
fn prompt_tokens(request: &ReadRequest) -> u64 {
    let text: usize = request.state.len()
        + request
            .questions
            .iter()
            .map(|q| q.instructions.len())
            .sum::<usize>();
    text as u64 / TOKEN_BYTES + 1
}

fn fnv(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0x1f)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// Deterministic weights per label: a function of the state, the question's text and the label
/// (and the seed when given), never of ids or of the other questions.
fn distribution(request: &ReadRequest, q: &hunch_core::Question) -> LabelDistribution {
    let seed = request
        .options
        .seed
        .map(|s| s.to_string())
        .unwrap_or_default();
    let labels: Vec<String> = match &q.kind {
        QuestionKind::Noul { yes, no } => vec![
            format!("yes {}", yes.clone().unwrap_or_default()),
            format!("no {}", no.clone().unwrap_or_default()),
        ],
        QuestionKind::Choice { options } => options
            .iter()
            .map(|o| format!("{} {}", o.name, o.description.clone().unwrap_or_default()))
            .collect(),
        QuestionKind::Score { levels } => levels.clone(),
    };
    let weights: Vec<f64> = labels
        .iter()
        .enumerate()
        .map(|(i, l)| {
            1.0 + (fnv(&[&request.state, &q.instructions, l, &i.to_string(), &seed]) % 1000) as f64
        })
        .collect();
    let total: f64 = weights.iter().sum();
    LabelDistribution(weights.iter().map(|w| w / total).collect())
}

async fn health(State(f): State<Arc<Fixture>>) -> Json<serde_json::Value> {
    let elapsed = f.started.elapsed();
    let (state, progress) = if f.fail {
        ("failed", 0.0)
    } else if elapsed >= f.load {
        ("ready", 1.0)
    } else {
        ("loading", elapsed.as_secs_f64() / f.load.as_secs_f64())
    };
    let info = (state == "ready").then(|| ModelInfo {
        fingerprint: format!("fixture/{}/{READ_ALGORITHM_VERSION}", f.name),
        limits: ReaderLimits {
            max_prompt_tokens: f.max_prompt_tokens,
            max_token_bytes: f.max_prompt_tokens.map(|_| TOKEN_BYTES),
            ..ReaderLimits::default()
        },
        // A test double: it maps no BLAS.
        blas_libraries: Vec::new(),
        // A test double: no checkpoint, so nothing to describe.
        kind: None,
    });
    Json(
        json!({"state": state, "model": f.name, "progress": progress, "message": "fixture",
                "info": info}),
    )
}

fn error(status: StatusCode, e: ReadError) -> Response {
    (status, Json(e)).into_response()
}

async fn read(State(f): State<Arc<Fixture>>, Json(request): Json<ReadRequest>) -> Response {
    if f.started.elapsed() < f.load || f.fail {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            ReadError::unavailable("fixture loading", Duration::from_secs(1)),
        );
    }
    if let Some(rest) = request.state.split("__sleep_ms=").nth(1) {
        let ms: u64 = rest
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if request.state.contains("__die__") {
        eprintln!("fixture-sidecar: dying mid-request as asked");
        std::process::exit(3);
    }
    if request.state.contains("__too_large__") {
        return error(
            StatusCode::BAD_REQUEST,
            ReadError::TooLarge {
                message: "the prompt is longer than the model's 12288 tokens".into(),
            },
        );
    }
    let tokens = prompt_tokens(&request);
    if let Some(max) = f.max_prompt_tokens.filter(|&max| tokens > max) {
        return error(
            StatusCode::BAD_REQUEST,
            ReadError::TooLarge {
                message: format!(
                    "the fixture sidecar refused a prompt of {tokens} tokens (at most {max})"
                ),
            },
        );
    }
    for (i, q) in request.questions.iter().enumerate() {
        if let QuestionKind::Choice { options } = &q.kind {
            if options.iter().any(|o| o.name == "__unreadable__") {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ReadError::InvalidQuestion {
                        question: i,
                        message: "an option name cannot be read".into(),
                    },
                );
            }
        }
    }
    let distributions = request
        .questions
        .iter()
        .map(|q| distribution(&request, q))
        .collect();
    let draws = request.options.draws.unwrap_or(1);
    Json(ReadOutcome {
        distributions,
        usage: Usage {
            input_tokens: tokens,
            output_tokens: request.questions.len() as u64,
        },
        stats: ReadStats {
            reads: 1,
            draws,
            prompt_tokens: tokens,
            ..ReadStats::default()
        },
    })
    .into_response()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if args.get(1).map(String::as_str) != Some("serve") {
        eprintln!("usage: fixture-sidecar serve --model DIR --listen ADDR --name NAME");
        std::process::exit(2);
    }
    let listen = value("--listen").unwrap_or_else(|| "127.0.0.1:0".into());
    let name = value("--name").unwrap_or_else(|| "fixture".into());
    let load_ms = std::env::var("FIXTURE_LOAD_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let fixture = Arc::new(Fixture {
        name,
        started: Instant::now(),
        load: Duration::from_millis(load_ms),
        fail: std::env::var("FIXTURE_FAIL_LOAD").is_ok_and(|v| v == "1"),
        max_prompt_tokens: std::env::var("FIXTURE_MAX_PROMPT_TOKENS")
            .ok()
            .and_then(|v| v.parse().ok()),
    });
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fixture-sidecar: cannot listen on {listen}: {e}");
            std::process::exit(1);
        }
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    println!("HUNCH_ACCELERATOR_LISTENING http://{addr}");
    let app = Router::new()
        .route("/health", get(health))
        .route("/read", post(read))
        .with_state(fixture);
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("fixture-sidecar: {e}");
    }
}
