//! `/console/login` and `/console/logout`: a key in a form (never in a URL), exchanged for a
//! session cookie.

use super::html::Text;
use super::session::{self, Role, Viewer};
use super::{check_csrf, html_response, open, refusal, AppState};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use serde::Deserialize;
use std::time::Duration;

/// How long a wrong key waits for its answer: guessing keys over HTTP stays slow.
const WRONG_KEY_DELAY: Duration = Duration::from_millis(400);

fn login_html(state: &AppState, error: Option<&str>) -> String {
    let which = match (state.console.has_admin_key(), state.keys.enabled()) {
        (true, true) => "the admin key (everything) or an API key (read and ask)",
        (true, false) => "the admin key",
        (false, _) => "an API key (read and ask; start the server with --admin-key to promote and roll back here)",
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>Log in · Hunch console</title>\
<link rel=\"icon\" href=\"data:,\"><link rel=\"stylesheet\" href=\"/console/assets/console.css\"><script src=\"/console/assets/console.js\" defer></script></head>\
<body><main class=\"login\"><h1>Hunch console</h1>{}<form method=\"post\" action=\"/console/login\" id=\"login\">\
<label>Key <input type=\"password\" name=\"key\" autocomplete=\"current-password\" required autofocus></label>\
<button type=\"submit\" class=\"primary\">Log in</button></form><p class=\"muted\">Log in with {which}. \
The key is sent once, in this form; the session it opens lasts {} hours.</p></main></body></html>\n",
        error.map_or(String::new(), |e| format!("<p class=\"error\" role=\"alert\">{}</p>", Text(e))),
        session::LIFETIME.as_secs() / 3600,
    )
}

pub async fn page(State(state): State<AppState>) -> Response {
    if open(&state) {
        return Redirect::to("/console").into_response();
    }
    html_response(login_html(&state, None))
}

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    key: String,
}

/// Whether the request comes from a page of this very server, as far as the browser says (a
/// login form posted from another site is refused: login CSRF). `Sec-Fetch-Site` first (every
/// current browser sends it); else a non-null `Origin` must name this host. A client that sends
/// neither (not a browser) is not a CSRF risk.
fn same_origin(headers: &HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        return matches!(site, "same-origin" | "none");
    }
    match get("origin") {
        None | Some("null") => true,
        Some(origin) => {
            let host = get("host").unwrap_or("");
            origin
                .split_once("://")
                .is_some_and(|(_, rest)| rest.trim_end_matches('/') == host)
        }
    }
}

pub async fn submit(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if open(&state) {
        return Redirect::to("/console").into_response();
    }
    if !same_origin(&headers) {
        return refusal(
            StatusCode::FORBIDDEN,
            "A login must come from this console's own form.",
        );
    }
    let key = form.key.trim();
    let role = if state.console.is_admin_key(key) {
        Some(Role::Admin)
    } else if state.keys.accepts(key) {
        Some(Role::Viewer)
    } else {
        None
    };
    let Some(role) = role else {
        tokio::time::sleep(WRONG_KEY_DELAY).await;
        tracing::warn!("console login refused: wrong key");
        let mut response = html_response(login_html(&state, Some("That key is not valid here.")));
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        return response;
    };
    let (id, _) = match state.console.sessions.create(role) {
        Ok(made) => made,
        Err(e) => {
            return refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("no randomness for a session: {e}"),
            )
        }
    };
    tracing::info!(role = ?role, "console login");
    let mut response = Redirect::to("/console").into_response();
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&id)) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

#[derive(Debug, Deserialize)]
pub struct LogoutForm {
    csrf: Option<String>,
}

pub async fn logout(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    Form(form): Form<LogoutForm>,
) -> Response {
    if let Err(refused) = check_csrf(&viewer, form.csrf.as_deref()) {
        return refused;
    }
    state.console.sessions.remove(&viewer);
    let mut response = Redirect::to("/console/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_servers_origin_may_post_a_login() {
        let mut h = HeaderMap::new();
        assert!(same_origin(&h));
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(!same_origin(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(same_origin(&h), "the browser's own word wins");
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!same_origin(&h));
    }
}
