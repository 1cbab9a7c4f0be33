//! `GET /metrics`: Prometheus text.

use super::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        {
            let mut text = state.metrics.render();
            if let Some(cache) = &state.answering.cache {
                text.push_str(&crate::metrics::render_answer_cache(
                    &cache.stats(),
                    cache.max_bytes(),
                ));
            }
            let draining = state.draining.load(std::sync::atomic::Ordering::SeqCst);
            crate::metrics::family(
                &mut text,
                "hunch_draining",
                "gauge",
                "1 once a shutdown began (readiness is false), else 0.",
            );
            text.push_str(&format!("hunch_draining {}\n", u8::from(draining)));
            text
        },
    )
}
