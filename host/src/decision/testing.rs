//! Test support for decision records: a collector that keeps every event it is sent. Compiled
//! only into this crate's unit tests and, through the `testing` feature, into the test builds
//! that ask for it; never into the server.

use serde_json::Value;
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A decision-log collector on an ephemeral port that keeps every event (gzip JSON arrays, as
/// the HTTP sink sends them): its URL and what it has received.
pub async fn recording_collector() -> (String, Arc<Mutex<Vec<Value>>>) {
    flaky_collector(0).await
}

/// A collector that answers its first `fail_first` POSTs 503 (keeping nothing of them), then
/// keeps every event like [`recording_collector`].
pub async fn flaky_collector(fail_first: usize) -> (String, Arc<Mutex<Vec<Value>>>) {
    let (app, seen) = recording_app(fail_first);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    (serve(listener, app), seen)
}

/// The collector's routes, and what it has kept.
fn recording_app(fail_first: usize) -> (axum::Router, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let kept = seen.clone();
    let failures = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            let failures = failures.clone();
            async move {
                if failures.fetch_add(1, Ordering::SeqCst) < fail_first {
                    return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                }
                let mut text = String::new();
                if flate2::read::GzDecoder::new(&body[..])
                    .read_to_string(&mut text)
                    .is_err()
                {
                    return axum::http::StatusCode::BAD_REQUEST;
                }
                match serde_json::from_str::<Vec<Value>>(&text) {
                    Ok(events) => {
                        kept.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .extend(events);
                        axum::http::StatusCode::OK
                    }
                    Err(_) => axum::http::StatusCode::BAD_REQUEST,
                }
            }
        }),
    );
    (app, seen)
}

/// A [`recording_collector`] on `listener` (a collector that comes back on the address it had).
pub fn recording_collector_on(
    listener: tokio::net::TcpListener,
) -> (String, Arc<Mutex<Vec<Value>>>) {
    let (app, seen) = recording_app(0);
    (serve(listener, app), seen)
}

/// Serves `app` on `listener` in the background; its URL.
fn serve(listener: tokio::net::TcpListener, app: axum::Router) -> String {
    let url = format!("http://{}/", listener.local_addr().expect("its address"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    url
}
