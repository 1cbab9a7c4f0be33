//! `GET /v1/models` in TypeSafe's shape: aliases (`jev-latest` first) and the served models, each
//! with the extension `x_fingerprint`: what exactly the model is, as it reports itself (the same
//! fingerprint decision events record and the answer cache keys on; `null` while unknown).
//!
//! Every model whose sidecar this server runs (a pinned `--model`, or one of a `--models-dir`,
//! docs/models.md) also says how it stands, from the model manager's [`ModelsView`]: `x_state`
//! (`available`, `loading` with `x_progress` 0–1, `loaded`, `unloading`, `failed` with
//! `x_error`), `x_estimated_bytes`, `x_resident_bytes` (measured while its process runs),
//! `x_pinned`, `x_ttl_left_seconds`, `x_last_used`, `x_reads_in_flight`; the body's `x_memory`
//! says the budget and what is held of it. Once a model has loaded it also says what it is:
//! `x_family`, `x_architecture`, `x_layout`, `x_quantization`, `x_read`,
//! `x_checkpoint_name`, and `x_ignored_config_keys` when its load skipped config keys the user
//! named harmless; `x_max_choice_options` and `x_max_score_levels`, the question limits its
//! labels allow. Clients that know only TypeSafe's fields ignore them.
//!
//! `POST /v1/models/NAME/load` and `…/unload` (admin key) load and unload a model by hand; `PUT
//! /v1/models/NAME/settings` (admin key) changes a model's settings and writes them to its
//! models directory's `hunch-models.toml`. `GET /v1/models/NAME/quality` (`api/quality.rs`, the
//! bearer key as here) answers the newest quality report of the model's fingerprint. A model whose settings say `hidden` is left out of the
//! list (and its aliases with it), and served by name all the same.

use super::error::{ApiError, BadBody, Missing};
use super::AppState;
use crate::reader::manager::{
    LeaseError, ModelView, ModelsView, SettingsError, UnloadError, Unloaded,
};
use crate::reader::ModelEntry;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// One entry of the list, under `name` (the model's own, or an alias of it).
fn listed(name: &str, description: String, model: &ModelEntry, view: Option<&ModelsView>) -> Value {
    let info = model.reader.info();
    let mut entry = json!({
        "name": name,
        "description": description,
        "release_date": model.release_date,
        "x_fingerprint": info.fingerprint,
        // What questions it takes: its labels' limits (docs/api.md), within the contract's.
        "x_max_choice_options": info.limits.questions.max_choice_options,
        "x_max_score_levels": info.limits.questions.max_score_levels,
    });
    if let Some(kind) = info.kind {
        kind_fields(&mut entry, kind);
    }
    if let Some(m) = view.and_then(|v| v.model(&model.name)) {
        managed_fields(&mut entry, m);
    }
    entry
}

/// What kind of model it is, as the model reported it once loaded: `x_family` (`chat`,
/// `decision`, `diffusion-gemma`), `x_architecture`, `x_layout`, `x_quantization`, `x_read`,
/// a decision model's `x_decision_type` and, when the checkpoint names itself,
/// `x_checkpoint_name`.
fn kind_fields(entry: &mut Value, kind: hunch_core::protocol::ModelKind) {
    entry["x_family"] = json!(kind.family);
    entry["x_architecture"] = json!(kind.architecture);
    entry["x_layout"] = json!(kind.layout);
    entry["x_quantization"] = json!(kind.quantization);
    entry["x_read"] = json!(kind.read);
    if let Some(decision_type) = kind.decision_type {
        entry["x_decision_type"] = json!(decision_type);
    }
    if !kind.ignored_config_keys.is_empty() {
        entry["x_ignored_config_keys"] = json!(kind.ignored_config_keys);
    }
    if let Some(name) = kind.name {
        entry["x_checkpoint_name"] = json!(name);
    }
}

/// What the manager says of a model.
fn managed_fields(entry: &mut Value, m: &ModelView) {
    entry["x_state"] = json!(m.state.as_str());
    if let Some(progress) = m.progress {
        entry["x_progress"] = json!(progress);
    }
    if m.state == crate::reader::manager::ModelState::Loading {
        // null while it cannot be told (no progress yet, and no earlier load to pace it by).
        entry["x_load_seconds_left"] = json!(m.load_seconds_left);
    }
    if let Some(error) = &m.error {
        entry["x_error"] = json!(error);
    }
    if m.refused {
        entry["x_refused"] = json!(true);
    }
    entry["x_estimated_bytes"] = json!(m.estimated_bytes);
    entry["x_resident_bytes"] = json!(m.resident_bytes);
    entry["x_pinned"] = json!(m.pinned);
    entry["x_ttl_left_seconds"] = json!(m.ttl_left_seconds);
    entry["x_last_used"] = json!(m.last_used);
    entry["x_reads_in_flight"] = json!(m.reads_in_flight);
    entry["x_settings"] = m.settings.clone();
    if let Some(error) = &m.settings_error {
        entry["x_settings_error"] = json!(error);
    }
}

/// Every model this server serves: the registry's (pinned sidecars, accelerators, upstreams),
/// then the model manager's others (discovered under `--models-dir`, loaded or not), less the
/// hidden ones. The one list `GET /v1/models` and the console's models page show.
pub fn served_entries(state: &AppState, view: Option<&ModelsView>) -> Vec<ModelEntry> {
    let mut entries: Vec<ModelEntry> = state.registry.models().to_vec();
    if let Some(view) = view {
        for m in &view.models {
            if !m.hidden && !entries.iter().any(|e| e.name == m.name) {
                if let Ok(entry) = state.model(&m.name) {
                    entries.push(entry);
                }
            }
        }
    }
    entries
}

pub async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    // A listing looks at the models directories again (at most once a second), so a model just
    // copied in is listed, and one just removed is not.
    let view = state.models.as_ref().map(|m| {
        m.rescan(false);
        m.view()
    });
    let entries = served_entries(&state, view.as_ref());
    let mut models = Vec::new();
    for (alias, target) in state.aliases() {
        if let Some(m) = entries.iter().find(|e| e.name == target) {
            let description = format!("Alias of {}. {}", m.name, m.description)
                .trim_end()
                .to_string();
            models.push(listed(&alias, description, m, view.as_ref()));
        }
    }
    for m in &entries {
        models.push(listed(&m.name, m.description.clone(), m, view.as_ref()));
    }
    let mut body = json!({ "models": models });
    if let Some(view) = &view {
        body["x_memory"] = json!({
            "budget_bytes": view.budget_bytes,
            "used_bytes": view.used_bytes,
            "overhead_bytes": view.overhead_bytes,
        });
    }
    if let Some(c) = state.calibration.current() {
        body["x_calibration"] = json!({"id": c.id, "questions": c.len()});
    }
    Ok(Json(body))
}

/// `POST /v1/models/{NAME}/load` and `…/unload`, `PUT …/settings`, `GET …/quality`
/// (`api/quality.rs`); NAME may hold a `/`
/// (`org/name`), so the route takes the rest of the path, any method, and this splits the action
/// off its end. Another method on an action is a 405 whose `Allow` names the one it takes (what
/// the OpenAPI document lists for its path).
pub async fn admin(
    State(state): State<AppState>,
    method: Method,
    Path(rest): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((name, action)) = rest.rsplit_once('/').filter(|(name, action)| {
        !name.is_empty() && matches!(*action, "load" | "unload" | "settings" | "quality")
    }) else {
        return ApiError::not_found(
            Missing::Route,
            format!(
                "no route {method} /v1/models/{rest}: POST /v1/models/NAME/load or /unload, PUT \
                 /v1/models/NAME/settings, GET /v1/models/NAME/quality"
            ),
        )
        .into_response();
    };
    let (takes, allow) = match action {
        "settings" => (Method::PUT, "PUT"),
        "quality" => (Method::GET, "GET, HEAD"),
        _ => (Method::POST, "POST"),
    };
    // HEAD is a GET whose body is left out (as the router does for every GET route).
    if method != takes && !(takes == Method::GET && method == Method::HEAD) {
        return (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, allow)]).into_response();
    }
    let answered = match action {
        "settings" => settings(&state, name, &headers, &body),
        "quality" => super::quality::latest(&state, name).await,
        _ => load_or_unload(&state, name, action, &headers).await,
    };
    answered.map(Json).into_response()
}

async fn load_or_unload(
    state: &AppState,
    name: &str,
    action: &str,
    headers: &HeaderMap,
) -> Result<Value, ApiError> {
    let (entry, manager) = managed(state, headers, name, "cannot be loaded or unloaded here")?;
    if action == "load" {
        state.check_fits(&entry.name)?;
        manager.load_now(&entry.name).await.map_err(lease_error)?;
    } else {
        let outcome = manager.unload(&entry.name).map_err(|e| match e {
            UnloadError::NotFound(_) => ApiError::not_found(Missing::Model, e.to_string()),
            UnloadError::Pinned(_) | UnloadError::Loading(_) => ApiError::ModelConflict {
                message: e.to_string(),
            },
        })?;
        let said = match outcome {
            Unloaded::NotLoaded => "not_loaded",
            Unloaded::Stopped => "unloading",
            Unloaded::Draining => "draining",
        };
        let view = manager.view();
        let mut body = json!({ "name": entry.name, "x_unload": said });
        if let Some(m) = view.model(&entry.name) {
            managed_fields(&mut body, m);
        }
        return Ok(body);
    }
    let view = manager.view();
    let mut body = json!({ "name": entry.name });
    if let Some(m) = view.model(&entry.name) {
        managed_fields(&mut body, m);
    }
    Ok(body)
}

/// `PUT /v1/models/NAME/settings`: the body is the model's whole settings (a JSON object with
/// the keys of its `hunch-models.toml` table; a key left out is the server's default).
fn settings(
    state: &AppState,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, ApiError> {
    let (entry, manager) = managed(state, headers, name, "takes no settings here")?;
    let fields = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(fields)) => fields,
        Ok(other) => {
            return Err(ApiError::field(
                vec!["body".into()],
                "type_error",
                format!("the settings must be a JSON object, got {other}"),
            ))
        }
        Err(e) => {
            return Err(ApiError::BadBody {
                kind: BadBody::NotJson,
                message: format!("the body is not JSON: {e}"),
            })
        }
    };
    let applied = manager
        .put_settings(&entry.name, &fields)
        .map_err(|e| match e {
            SettingsError::NotFound(_) => ApiError::not_found(Missing::Model, e.to_string()),
            SettingsError::Invalid(field) => ApiError::field(
                vec!["body".into(), field.key.clone().into()],
                "value_error",
                field.to_string(),
            ),
            SettingsError::Fixed(_)
            | SettingsError::CannotPin(_)
            | SettingsError::Unwritable { .. } => ApiError::ModelConflict {
                message: e.to_string(),
            },
        })?;
    let view = manager.view();
    let mut body = json!({
        "name": entry.name,
        "x_settings_file": applied.file.display().to_string(),
        "x_applied": if applied.sidecar_settings_at_next_load {
            "aliases, pinned, ttl, hidden and the read settings apply now; dtype and \
             sidecar_args take effect at the model's next load (it runs with the old ones until \
             it unloads)"
        } else {
            "applied now (dtype and sidecar_args are used from the model's next load)"
        },
    });
    if let Some(m) = view.model(&entry.name) {
        managed_fields(&mut body, m);
    }
    Ok(body)
}

/// A failed admin load, as the API answers it.
fn lease_error(e: LeaseError) -> ApiError {
    match e {
        LeaseError::NotFound(_) => ApiError::not_found(Missing::Model, e.to_string()),
        LeaseError::NeverFits {
            model,
            needed,
            budget,
            pinned,
        } => ApiError::InsufficientStorage {
            model,
            needed_bytes: needed,
            budget_bytes: budget,
            pinned_bytes: pinned,
        },
        other => super::error::from_read_error(other.into_read_error(), &[]),
    }
}

/// The model an admin route names (after the admin key), with the manager that runs it; a model
/// served by something else is a 409 saying what it `cannot` be here.
fn managed<'a>(
    state: &'a AppState,
    headers: &HeaderMap,
    name: &str,
    cannot: &str,
) -> Result<
    (
        ModelEntry,
        &'a std::sync::Arc<crate::reader::manager::ModelManager>,
    ),
    ApiError,
> {
    authorize(state, headers)?;
    let entry = state.model(name)?;
    let manager = state
        .models
        .as_ref()
        .filter(|m| m.manages(&entry.name))
        .ok_or_else(|| ApiError::ModelConflict {
            message: format!(
                "model {} is not run by this server (an --accelerator or --upstream): it {cannot}",
                entry.name
            ),
        })?;
    Ok((entry, manager))
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = &state.admin_key else {
        return Err(ApiError::Forbidden {
            message: "loading and unloading models over HTTP is disabled: start the server with \
                      --admin-key"
                .into(),
        });
    };
    if super::auth::admin_key_matches(expected, headers) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized {
            message: "POST /v1/models/NAME/load and /unload, and PUT /v1/models/NAME/settings, \
                      need the admin key (X-Admin-Key: KEY, or Authorization: Bearer KEY when API \
                      keys are off)"
                .into(),
        })
    }
}
