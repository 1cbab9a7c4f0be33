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
            state.decisions.render_metrics(&mut text);
            text
        },
    )
}
