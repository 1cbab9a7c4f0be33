//! `/console/models`: every served model as one row. [`rows`] is the one place that gathers
//! what the server knows of its models (the registry, the supervised sidecars, the readers'
//! limits, the memory budget); the overview's memory bars and this page both draw from it, so
//! when the server learns more of a model (load on demand: family, layout, estimate, TTL, last
//! use) only `rows` changes. Below the table, each model's quality report (`console/quality.rs`).

use super::html::{bytes, csrf_field, esc, layout, Text};
use super::policies::ActionForm;
use super::session::Viewer;
use super::{check_csrf, html_response, refusal, AppState};
use crate::reader::manager::ModelState as ManagedState;
use crate::reader::manager::Unloaded;
use crate::reader::models::budget::{default_budget, machine_total};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use std::fmt::Write;

/// What a model is doing.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelState {
    /// Known to the model manager, not loaded: its first read loads it.
    Available,
    /// Its reads in flight finish, then its process ends.
    Unloading,
    /// A supervised sidecar starting or loading its checkpoint (progress 0–1).
    Loading {
        progress: f64,
    },
    Loaded,
    /// A supervised sidecar that went down (restarting), with why.
    Failed {
        message: String,
    },
    /// A model this server does not run (an accelerator URL, an upstream): it is whatever the
    /// remote end says; the server only forwards reads.
    Remote,
}

impl ModelState {
    pub fn label(&self) -> String {
        match self {
            ModelState::Loading { progress } => format!("loading {:.0}%", 100.0 * progress),
            ModelState::Loaded => "loaded".into(),
            ModelState::Failed { .. } => "failed".into(),
            ModelState::Remote => "remote".into(),
            ModelState::Available => "available".into(),
            ModelState::Unloading => "unloading".into(),
        }
    }
}

/// One model as the console shows it. Fields the server does not know today are `None` and shown
/// as "–".
#[derive(Debug, Clone)]
pub struct ModelRow {
    pub name: String,
    /// Aliases that resolve to it (`jev-latest`, `--alias`).
    pub aliases: Vec<String>,
    pub description: String,
    pub release_date: String,
    pub fingerprint: Option<String>,
    pub state: ModelState,
    /// Measured resident bytes of its process, when it runs here.
    pub resident_bytes: Option<u64>,
    /// Bytes it is expected to take before it loads (not known until models load on demand).
    pub estimated_bytes: Option<u64>,
    /// Whether it stays loaded whatever the budget needs (every `--model` today).
    pub pinned: Option<bool>,
    /// The checkpoint family and layout (and how its matrices are stored), as the sidecar
    /// found them in the checkpoint once it loaded (`/health`'s `info.kind`).
    pub family: Option<String>,
    pub layout: Option<String>,
    /// Seconds until an idle model is unloaded, and since its last read (load on demand).
    pub ttl_left_seconds: Option<f64>,
    pub idle_seconds: Option<f64>,
    /// The most options a choice and levels a score may have for it, and its longest prompt.
    pub max_choice_options: usize,
    pub max_score_levels: usize,
    pub max_prompt_tokens: Option<u64>,
}

/// The memory the models share: the budget and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub bytes: u64,
    /// `--memory-limit` (per sidecar) or the machine's default budget.
    pub source: &'static str,
}

/// Every served model, in the registry's order.
pub fn rows(state: &AppState) -> Vec<ModelRow> {
    let aliases = state.aliases();
    let view = state.models.as_ref().map(|m| m.view());
    crate::api::models::served_entries(state, view.as_ref())
        .iter()
        .map(|m| {
            let info = m.reader.info();
            let managed = view.as_ref().and_then(|v| v.model(&m.name));
            let (model_state, resident, estimated, pinned, ttl) = match managed {
                Some(v) => {
                    let st = match v.state {
                        ManagedState::Available => ModelState::Available,
                        ManagedState::Loading => ModelState::Loading {
                            progress: v.progress.unwrap_or(0.0).clamp(0.0, 1.0),
                        },
                        ManagedState::Loaded => ModelState::Loaded,
                        ManagedState::Unloading => ModelState::Unloading,
                        ManagedState::Failed => ModelState::Failed {
                            message: v.error.clone().unwrap_or_default(),
                        },
                    };
                    (
                        st,
                        v.resident_bytes,
                        Some(v.estimated_bytes),
                        Some(v.pinned),
                        v.ttl_left_seconds,
                    )
                }
                None => (ModelState::Remote, None, None, None, None),
            };
            ModelRow {
                name: m.name.clone(),
                aliases: aliases
                    .iter()
                    .filter(|(_, target)| *target == m.name)
                    .map(|(a, _)| a.clone())
                    .collect(),
                description: m.description.clone(),
                release_date: m.release_date.clone(),
                fingerprint: info.fingerprint,
                state: model_state,
                resident_bytes: resident,
                estimated_bytes: estimated,
                pinned,
                family: info.kind.as_ref().map(|k| match &k.decision_type {
                    // A decision model says which: its type decides how it is read.
                    Some(t) => format!("{} {t} ({})", k.family, k.architecture),
                    None => format!("{} ({})", k.family, k.architecture),
                }),
                layout: info
                    .kind
                    .as_ref()
                    .map(|k| format!("{} {}", k.layout, k.quantization)),
                ttl_left_seconds: ttl,
                idle_seconds: None,
                max_choice_options: info.limits.questions.max_choice_options,
                max_score_levels: info.limits.questions.max_score_levels,
                max_prompt_tokens: info.limits.max_prompt_tokens,
            }
        })
        .collect()
}

/// The budget the models' memory is drawn against, when one is known.
pub fn budget(state: &AppState) -> Option<Budget> {
    if let Some(view) = state.models.as_ref().map(|m| m.view()) {
        return Some(Budget {
            bytes: view.budget_bytes,
            source: "--memory-budget",
        });
    }
    if let Some(limit) = state.memory_limit {
        return Some(Budget {
            bytes: limit,
            source: "--memory-limit",
        });
    }
    machine_total().map(|total| Budget {
        bytes: default_budget(total),
        source: "this machine's memory less a reserve",
    })
}

fn or_dash(value: Option<String>) -> String {
    value.map_or_else(|| "–".into(), |v| esc(&v))
}

pub async fn page(State(state): State<AppState>, Extension(viewer): Extension<Viewer>) -> Response {
    let rows = rows(&state);
    let mut body = String::new();
    if rows.is_empty() {
        body.push_str("<p>No model is configured: every read is a 404. Start the server with <code>--model NAME=PATH</code>.</p>");
    }
    body.push_str(
        "<div class=\"scroll\"><table class=\"grid\"><thead><tr><th>model</th><th>state</th>\
<th>resident</th><th>estimate</th><th>pinned</th><th>family</th><th>layout</th><th>TTL left</th>\
<th>idle</th><th>options / levels</th><th>max prompt</th><th>fingerprint</th></tr></thead><tbody>",
    );
    for r in &rows {
        let aliases = if r.aliases.is_empty() {
            String::new()
        } else {
            format!(
                "<br><small>aliases: {}</small>",
                Text(&r.aliases.join(", "))
            )
        };
        let failed = match &r.state {
            ModelState::Failed { message } => {
                format!("<br><small class=\"error\">{}</small>", Text(message))
            }
            _ => String::new(),
        };
        let _ = write!(
            body,
            "<tr data-model=\"{name}\"><td><b>{name}</b>{aliases}<br><small>{desc}</small></td>\
<td><span class=\"state {cls}\">{state}</span>{failed}{action}</td><td class=\"num\">{res}</td>\
<td class=\"num\">{est}</td><td>{pinned}</td><td>{family}</td><td>{layout}</td><td>{ttl}</td>\
<td>{idle}</td><td class=\"num\">{maxo} / {maxl}</td><td class=\"num\">{maxp}</td><td><code>{fp}</code></td></tr>",
            name = Text(&r.name),
            desc = Text(&r.description),
            action = action_form(r, &viewer),
            cls = match r.state {
                ModelState::Loaded => "ok",
                ModelState::Failed { .. } => "bad",
                _ => "",
            },
            state = Text(&r.state.label()),
            res = r.resident_bytes.map_or("–".into(), bytes),
            est = r.estimated_bytes.map_or("–".into(), bytes),
            pinned = match r.pinned {
                Some(true) => "yes",
                Some(false) => "no",
                None => "–",
            },
            family = or_dash(r.family.clone()),
            layout = or_dash(r.layout.clone()),
            ttl = r.ttl_left_seconds.map_or("–".into(), super::html::seconds),
            idle = r.idle_seconds.map_or("–".into(), super::html::seconds),
            maxo = r.max_choice_options,
            maxl = r.max_score_levels,
            maxp = r.max_prompt_tokens.map_or("–".into(), |t| format!("{t} tokens")),
            fp = or_dash(r.fingerprint.clone()),
        );
    }
    body.push_str("</tbody></table></div>");
    let fingerprints = rows.iter().filter_map(|r| r.fingerprint.clone()).collect();
    let reports = crate::api::quality::reports(state.quality.clone(), fingerprints).await;
    let models: Vec<(&str, Option<&str>)> = rows
        .iter()
        .map(|r| (r.name.as_str(), r.fingerprint.as_deref()))
        .collect();
    body.push_str(&super::quality::section(
        &models,
        &reports,
        state.quality.is_some(),
    ));
    let _ = write!(
        body,
        "<h2>Read settings</h2><table class=\"kv\"><tr><th>question mode</th><td>{}</td></tr>\
<tr><th>answer cache</th><td>{}</td></tr><tr><th>calibration</th><td>{}</td></tr>\
<tr><th>reads at once</th><td>{}</td></tr><tr><th>reads queued at most</th><td>{}</td></tr>\
<tr><th>request timeout</th><td>{}</td></tr></table>",
        state.answering.questions.as_str(),
        if state.answering.cache.is_some() {
            "on"
        } else {
            "off"
        },
        state
            .calibration
            .current()
            .map_or("none".into(), |c| format!("<code>{}</code>", Text(&c.id))),
        state.limits.max_concurrent_reads,
        state.limits.max_queued_reads,
        super::html::seconds(state.limits.request_timeout.as_secs_f64()),
    );
    body.push_str(
        "<p class=\"muted\">Pinned models (<code>--model</code>) load at start and stay loaded; the \
others (<code>--models-dir</code>) load on their first read and unload when idle past their TTL \
or when another model needs the memory (docs/models.md). With the admin key, load and unload \
one here or with <code>POST /v1/models/NAME/load</code> and <code>…/unload</code>.</p>",
    );
    let flash = state.console.sessions.take_flash(&viewer);
    html_response(layout(
        "Models",
        "/console/models",
        &viewer,
        flash.as_deref(),
        &body,
    ))
}

/// The load or unload button of a model the manager may load and unload (not pinned, not remote),
/// for a viewer who may act; empty otherwise.
fn action_form(row: &ModelRow, viewer: &Viewer) -> String {
    if !viewer.role.can_act() || row.pinned != Some(false) {
        return String::new();
    }
    let (verb, label) = match row.state {
        ModelState::Available | ModelState::Failed { .. } => ("load", "Load"),
        ModelState::Loaded => ("unload", "Unload"),
        _ => return String::new(),
    };
    format!(
        "<form method=\"post\" action=\"/console/models/{}/{verb}\">{}\
<button type=\"submit\">{label}</button></form>",
        path_segment(&row.name),
        csrf_field(viewer)
    )
}

/// `name` as one URL path segment: every byte but unreserved ones percent-encoded, so an
/// `org/name` model stays one segment (axum's `Path` decodes it back).
fn path_segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[derive(Clone, Copy)]
enum Action {
    Load,
    Unload,
}

/// A load or unload from the console: the session's CSRF token, the admin key's role, then the
/// model manager's own operation (the same as `POST /v1/models/NAME/load|unload`); the outcome
/// is flashed on the models page.
async fn act(
    state: AppState,
    viewer: Viewer,
    name: String,
    form: ActionForm,
    action: Action,
) -> Response {
    if let Err(refused) = check_csrf(&viewer, form.csrf.as_deref()) {
        return refused;
    }
    if !viewer.role.can_act() {
        return refusal(
            StatusCode::FORBIDDEN,
            "Loading and unloading models need a login with the admin key (--admin-key).",
        );
    }
    let Some(manager) = state.models.clone() else {
        return refusal(
            StatusCode::NOT_FOUND,
            "This server runs no models of its own.",
        );
    };
    let message = match action {
        Action::Load => match manager.load_now(&name).await {
            Ok(()) => {
                tracing::info!(model = %name, "loaded from the console");
                format!("Loaded {name}.")
            }
            Err(e) => format!("{name}: {e}"),
        },
        Action::Unload => match manager.unload(&name) {
            Ok(Unloaded::NotLoaded) => format!("{name} was not loaded."),
            Ok(Unloaded::Stopped) => {
                tracing::info!(model = %name, "unloaded from the console");
                format!("Unloaded {name}.")
            }
            Ok(Unloaded::Draining) => {
                format!("{name} unloads once its reads in flight have finished.")
            }
            Err(e) => format!("{name}: {e}"),
        },
    };
    state.console.sessions.flash(&viewer, message);
    Redirect::to("/console/models").into_response()
}

pub async fn load(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    act(state, viewer, name, form, Action::Load).await
}

pub async fn unload(
    State(state): State<AppState>,
    Extension(viewer): Extension<Viewer>,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    act(state, viewer, name, form, Action::Unload).await
}

#[cfg(test)]
mod action_tests {
    use super::path_segment;

    #[test]
    fn an_org_name_model_stays_one_path_segment() {
        assert_eq!(path_segment("org/name"), "org%2Fname");
        assert_eq!(path_segment("tiny-llama.q8_0"), "tiny-llama.q8_0");
        assert_eq!(path_segment("a b\"<"), "a%20b%22%3C");
    }
}
