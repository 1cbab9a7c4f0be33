//! Test support for decision records: a collector that keeps every event it is sent. Compiled
//! only into this crate's unit tests and, through the `testing` feature, into the test builds
//! that ask for it; never into the server.

use serde_json::Value;
use std::io::Read;
use std::sync::{Arc, Mutex};

/// A decision-log collector on an ephemeral port that keeps every event (gzip JSON arrays, as
/// the HTTP sink sends them): its URL and what it has received.
pub async fn recording_collector() -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let url = format!("http://{}/", listener.local_addr().expect("its address"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, seen)
}
