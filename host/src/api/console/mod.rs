//! The operator console at `/console` (docs/console.md): server-rendered HTML pages of what the
//! server already keeps (models, policies, recent decisions, calibrations, rates), one small
//! script and one stylesheet served from `/console/assets/`, and a few actions (ask, replay,
//! promote, roll back, load and unload a model), each a POST with the session's CSRF token.
//!
//! - [`session`]: logins, sessions, roles, the CSRF token.
//! - [`html`]: escaping, the page shell, bars.
//! - one module per page: [`overview`], [`models`], [`policies`], [`decisions`] (the live tail),
//!   [`decision`] (one decision, and its replay), [`calibration`], [`ask`]; [`login`];
//!   [`quality`], the models page's quality reports and their plot.
//!
//! Who may see what: with no key configured at all the console is open and read-only; with any
//! key configured (`--admin-key`, `--api-key`) every page needs a login, an API key logs in to
//! read and ask, and only the admin key may promote, roll back, load or unload. Every response carries a strict
//! Content-Security-Policy (no inline script or style anywhere), `X-Frame-Options: DENY`,
//! `nosniff` and `Cache-Control: no-store`.

pub mod ask;
pub mod calibration;
pub mod decision;
pub mod decisions;
pub mod html;
pub mod login;
pub mod models;
pub mod overview;
pub mod policies;
pub mod quality;
pub mod session;

use super::AppState;
use crate::policy::bundle::BundleStatus;
use crate::policy::Registry;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use session::{Role, Sessions, Viewer};
use std::sync::{Arc, OnceLock};

/// What the pages may load: their own script, stylesheet and images, and the tail's polls.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; \
frame-ancestors 'none'; base-uri 'none'";

const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// The console's own state, beside the app's: the admin key, the sessions, and the policy
/// registry once the policy routes exist.
#[derive(Default)]
pub struct Console {
    admin_key: Option<String>,
    pub sessions: Sessions,
    policies: OnceLock<PolicySources>,
}

/// Where the policies page reads from.
#[derive(Clone)]
pub struct PolicySources {
    pub registry: Arc<Registry>,
    /// With `--bundle-url`: the bundle's revision and staleness.
    pub bundle: Option<Arc<BundleStatus>>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Console")
            .field("admin_key", &self.admin_key.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

impl Console {
    pub fn new(admin_key: Option<String>) -> Console {
        Console {
            admin_key: admin_key.filter(|k| !k.trim().is_empty()),
            ..Console::default()
        }
    }

    /// Called once, when the policy routes are built.
    pub fn serve_policies(&self, sources: PolicySources) {
        let _ = self.policies.set(sources);
    }

    pub fn policies(&self) -> Option<&PolicySources> {
        self.policies.get()
    }

    /// Whether `key` is the admin key (constant time).
    pub fn is_admin_key(&self, key: &str) -> bool {
        self.admin_key
            .as_deref()
            .is_some_and(|k| super::auth::matches_any([k.as_bytes()], key.trim()))
    }

    pub fn has_admin_key(&self) -> bool {
        self.admin_key.is_some()
    }
}

/// Whether the console is open (no key configured at all) in `state`.
pub fn open(state: &AppState) -> bool {
    !state.console.has_admin_key() && !state.keys.enabled()
}

/// The console's routes, with their own gate (sessions, not bearer keys) and headers.
pub fn router(state: AppState) -> Router<AppState> {
    let gated = Router::new()
        .route("/console", get(overview::page))
        .route("/console/models", get(models::page))
        .route("/console/models/{name}/load", post(models::load))
        .route("/console/models/{name}/unload", post(models::unload))
        .route("/console/policies", get(policies::page))
        .route("/console/policies/{name}/promote", post(policies::promote))
        .route(
            "/console/policies/{name}/rollback",
            post(policies::rollback),
        )
        .route("/console/decisions", get(decisions::page))
        .route("/console/decisions/tail", get(decisions::tail))
        .route("/console/decisions/{id}", get(decision::page))
        .route("/console/decisions/{id}/replay", post(decision::replay))
        .route("/console/calibration", get(calibration::page))
        .route("/console/ask", get(ask::page).post(ask::submit))
        .route("/console/logout", post(login::logout))
        .route_layer(from_fn_with_state(state, gate));
    Router::new()
        .merge(gated)
        .route("/console/", get(|| async { Redirect::to("/console") }))
        .route("/console/login", get(login::page).post(login::submit))
        .route("/console/assets/console.js", get(script))
        .route("/console/assets/console.css", get(style))
        .layer(from_fn(secure_headers))
}

async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The headers every console response carries.
async fn secure_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// Puts the request's [`Viewer`] in its extensions, or refuses it: a page asked for without a
/// session goes to the login form, anything else gets a 401. An open console gives each browser
/// an anonymous session on its first visit.
async fn gate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let found =
        session::cookie_id(request.headers()).and_then(|id| state.console.sessions.find(&id));
    if let Some(viewer) = found {
        request.extensions_mut().insert(viewer);
        return next.run(request).await;
    }
    if open(&state) {
        let (id, viewer) = match state.console.sessions.create(Role::Open) {
            Ok(made) => made,
            Err(e) => return unavailable(&format!("no randomness for a session: {e}")),
        };
        request.extensions_mut().insert(viewer);
        let mut response = next.run(request).await;
        if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&id)) {
            response.headers_mut().append(header::SET_COOKIE, v);
        }
        return response;
    }
    let wants_page = request.method() == Method::GET && !request.uri().path().ends_with("/tail");
    if wants_page {
        Redirect::to("/console/login").into_response()
    } else {
        refusal(
            StatusCode::UNAUTHORIZED,
            "Log in first: this console needs a key.",
        )
    }
}

/// A small page saying why a request was refused (no data, no navigation).
pub fn refusal(status: StatusCode, message: &str) -> Response {
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Refused · Hunch console</title>\
<link rel=\"icon\" href=\"data:,\"><link rel=\"stylesheet\" href=\"/console/assets/console.css\"></head><body><main>\
<h1>{}</h1><p class=\"error\">{}</p><p><a href=\"/console/login\">Log in</a></p></main></body></html>\n",
        status.as_u16(),
        html::Text(message)
    );
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

fn unavailable(message: &str) -> Response {
    refusal(StatusCode::SERVICE_UNAVAILABLE, message)
}

/// A page's HTML response.
pub fn html_response(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// A POST's form must carry this session's CSRF token; `Err` is the 403 to answer.
pub fn check_csrf(viewer: &Viewer, presented: Option<&str>) -> Result<(), Response> {
    match presented {
        Some(token) if session::csrf_ok(viewer, token) => Ok(()),
        _ => Err(refusal(
            StatusCode::FORBIDDEN,
            "This form is stale or not from this console (CSRF token missing or wrong): reload the page and try again.",
        )),
    }
}
