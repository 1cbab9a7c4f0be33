//! `/v1/policies`: list, describe, run, deploy and remove decision policies.
//!
//! Every error is the API's one [`ApiError`] (`api/error.rs` maps the policy runtime's errors
//! to statuses and bodies); every run is a decision finished by `api/decision.rs`.

use crate::api::auth::admin_key_matches;
use crate::api::decision as decision_api;
use crate::api::error::{ApiError, BadBody, BadDeployment, Missing};
use crate::api::middleware::RequestId;
use crate::decision::DecisionLog;
use crate::policy::calibration::CalibrationConfig;
use crate::policy::registry::{Admission, Stage};
use crate::policy::rollout::shadow::{self, ShadowJob, ShadowRunner};
use crate::policy::rollout::{RolloutConfig, RolloutMode, ROUTE_KEY_HEADER};
use crate::policy::{InvokeError, Limits, PolicyConfig, Registry};
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// The response header naming the bundle revision of the version that decided.
pub const BUNDLE_REVISION_HEADER: &str = "x-hunch-bundle-revision";

/// Largest component accepted over HTTP.
const MAX_UPLOAD_BYTES: usize = 32 << 20;

pub struct PolicyApi {
    pub registry: Arc<Registry>,
    /// `None`: deployments over HTTP are disabled.
    pub admin_key: Option<String>,
    /// Decision ids and events.
    pub decisions: Arc<DecisionLog>,
    /// Where shadow runs execute.
    pub shadows: Arc<ShadowRunner>,
}

/// The policy routes, with their own state, ready to `merge` into the server's router whatever
/// its state type.
pub fn router<S: Clone + Send + Sync + 'static>(api: Arc<PolicyApi>) -> Router<S> {
    Router::new()
        .route("/v1/policies", get(list))
        .route(
            "/v1/policies/{name}",
            get(describe).post(decide).put(deploy).delete(remove),
        )
        .route("/v1/policies/{name}/promote", post(promote))
        .route("/v1/policies/{name}/rollback", post(rollback))
        .layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES))
        .with_state(api)
}

async fn list(State(api): State<Arc<PolicyApi>>) -> Json<Value> {
    Json(json!({ "policies": api.registry.summaries() }))
}

/// `?stage=candidate` (or `previous`) describes that version instead of the active one. Other
/// query parameters are ignored (a read never fails over them).
#[derive(Debug, Default, Deserialize)]
pub struct DescribeParams {
    stage: Option<String>,
}

/// A query string the route cannot read (a repeated or unknown parameter, a value of the wrong
/// type) is the API's 400 in its JSON shape, not the framework's plain-text one.
fn query<T>(params: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    params
        .map(|Query(params)| params)
        .map_err(|e| ApiError::BadQuery {
            message: e.body_text(),
        })
}

fn parse_stage(stage: Option<&str>) -> Result<Stage, ApiError> {
    match stage {
        None | Some("active") => Ok(Stage::Active),
        Some("candidate") => Ok(Stage::Candidate),
        Some("previous") => Ok(Stage::Previous),
        Some(other) => Err(ApiError::BadDeployment {
            kind: BadDeployment::Stage,
            message: format!("stage must be `active`, `candidate` or `previous`, got `{other}`"),
        }),
    }
}

async fn describe(
    State(api): State<Arc<PolicyApi>>,
    Path(name): Path<String>,
    params: Result<Query<DescribeParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let params = query(params)?;
    let stage = parse_stage(params.stage.as_deref())?;
    let summary = api.registry.summary_of(&name, stage).ok_or_else(|| {
        ApiError::not_found(
            Missing::Policy,
            match stage {
                Stage::Active => format!("no policy named `{name}`"),
                other => format!("policy `{name}` has no {} version", other.as_str()),
            },
        )
    })?;
    let mut body = json!(summary);
    body["stage"] = json!(stage.as_str());
    body["agreement"] = json!(api.registry.rollouts().summary(&name));
    Ok(Json(body))
}

/// Runs a policy: a decision with an id (header and body), an event when the decision log is
/// on, and the candidate in shadow or canary when the policy has one.
async fn decide(
    State(api): State<Arc<PolicyApi>>,
    Path(name): Path<String>,
    request_id: Option<Extension<RequestId>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let log = &api.decisions;
    let mut decision = decision_api::begin(log, "/v1/policies/{name}", request_id, &headers);
    // Parsed by hand so a bad body gets the same error shape as every other error.
    let input: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let error = ApiError::BadBody {
                kind: BadBody::NotJson,
                message: format!("the body is not JSON: {e}"),
            };
            return decision_api::finish(log, &decision, None, |_| {}, Err(error)).await;
        }
    };
    let route_key = headers.get(ROUTE_KEY_HEADER).and_then(|v| v.to_str().ok());
    let Some(route) = api.registry.route(&name, &input, route_key) else {
        let error = ApiError::from(InvokeError::NotFound(name.clone()));
        return decision_api::finish(
            log,
            &decision,
            None,
            |event| event.input = input.clone(),
            Err(error),
        )
        .await;
    };
    if route.shadow.is_some() {
        decision.record_reads();
    }
    let recorder = decision.clone();
    let run = api
        .registry
        .invoke_version(&route.decider, &input, Admission::Live, move |r| {
            recorder.reader(r)
        })
        .await;
    let outcome = run.outcome;
    if route.canary {
        api.registry.rollouts().routed(&name, route.stage.as_str());
    }
    let answer = match &outcome {
        Ok(invocation) => {
            let mut body = json!(invocation);
            body["decision_id"] = json!(decision.id);
            body["stage"] = json!(route.stage.as_str());
            Ok(Json(body).into_response())
        }
        Err(e) => Err(ApiError::from(e.clone())),
    };
    let mut response = decision_api::finish(
        log,
        &decision,
        Some(&route.decider.log),
        |event| {
            shadow::fill_event(
                event,
                log,
                &route.decider,
                route.stage,
                run.model.as_deref(),
                run.calibration.as_deref(),
                &input,
                &outcome,
            )
        },
        answer,
    )
    .await;
    if let Some(revision) = &route.decider.bundle_revision {
        if let Ok(value) = header::HeaderValue::from_str(revision) {
            response.headers_mut().insert(BUNDLE_REVISION_HEADER, value);
        }
    }
    if let Some(candidate) = route.shadow {
        api.shadows.spawn(ShadowJob {
            registry: api.registry.clone(),
            log: api.decisions.clone(),
            candidate,
            active: decision.clone(),
            active_outcome: outcome,
            input,
            status_of: |e| ApiError::from(e.clone()).status().as_u16(),
        });
    }
    response
}

/// Optional per-policy configuration of a deployment, as query parameters
/// (`?reader=…&questions=joint&calibration=…&fuel=…&timeout_ms=…&max_reads=…`); written to
/// `NAME.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployParams {
    /// `candidate`: deploy beside the active version instead of replacing it.
    stage: Option<String>,
    /// The candidate's `[rollout]`: `mode` (`off`, `shadow`, `canary`), `sample` (shadow),
    /// `percent` and `route_key` (canary).
    mode: Option<RolloutMode>,
    sample: Option<f64>,
    percent: Option<f64>,
    route_key: Option<String>,
    reader: Option<String>,
    questions: Option<hunch_core::QuestionMode>,
    /// `off`, or a calibration file (relative to the policy directory) the version's reads use
    /// instead of the server's.
    calibration: Option<String>,
    fuel: Option<u64>,
    timeout_ms: Option<u64>,
    memory_bytes: Option<u64>,
    max_reads: Option<u32>,
    max_questions: Option<u32>,
    max_output_bytes: Option<u64>,
    max_state_bytes: Option<u64>,
    max_log_lines: Option<u32>,
}

impl DeployParams {
    fn to_config(&self) -> Option<PolicyConfig> {
        let d = Limits::default();
        let any_limit = self.fuel.is_some()
            || self.timeout_ms.is_some()
            || self.memory_bytes.is_some()
            || self.max_reads.is_some()
            || self.max_questions.is_some()
            || self.max_output_bytes.is_some()
            || self.max_state_bytes.is_some()
            || self.max_log_lines.is_some();
        let any_rollout = self.mode.is_some()
            || self.sample.is_some()
            || self.percent.is_some()
            || self.route_key.is_some();
        if !any_limit
            && !any_rollout
            && self.reader.is_none()
            && self.questions.is_none()
            && self.calibration.is_none()
        {
            return None;
        }
        Some(PolicyConfig {
            reader: self.reader.clone(),
            questions: self.questions,
            calibration: self.calibration.as_deref().map(|c| match c {
                "off" => CalibrationConfig::Off,
                file => CalibrationConfig::File(file.into()),
            }),
            limits: any_limit.then(|| Limits {
                fuel: self.fuel.unwrap_or(d.fuel),
                timeout_ms: self.timeout_ms.unwrap_or(d.timeout_ms),
                memory_bytes: self.memory_bytes.unwrap_or(d.memory_bytes),
                max_reads: self.max_reads.unwrap_or(d.max_reads),
                max_questions: self.max_questions.unwrap_or(d.max_questions),
                max_output_bytes: self.max_output_bytes.unwrap_or(d.max_output_bytes),
                max_state_bytes: self.max_state_bytes.unwrap_or(d.max_state_bytes),
                max_log_lines: self.max_log_lines.unwrap_or(d.max_log_lines),
            }),
            rollout: any_rollout.then(|| RolloutConfig {
                mode: self.mode.unwrap_or_default(),
                sample: self.sample,
                percent: self.percent,
                route_key: self.route_key.clone(),
            }),
            ..PolicyConfig::default()
        })
    }
}

/// A change of one policy: refused with 409 `bundle_owned` when a bundle owns the set (whoever
/// asks: no key makes it possible), else it needs the admin key.
fn authorize_change(api: &PolicyApi, name: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    if api.registry.is_bundle_owned() {
        return Err(crate::policy::RegistryError::BundleOwned(name.to_string()).into());
    }
    authorize(api, headers)
}

fn authorize(api: &PolicyApi, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = &api.admin_key else {
        return Err(ApiError::Forbidden {
            message: "deployments over HTTP are disabled: start the server with --admin-key".into(),
        });
    };
    if admin_key_matches(expected, headers) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized {
            message: "PUT, DELETE, promote and rollback need the admin key (X-Admin-Key: KEY, or Authorization: Bearer KEY when API keys are off)".into(),
        })
    }
}

async fn deploy(
    State(api): State<Arc<PolicyApi>>,
    Path(name): Path<String>,
    params: Result<Query<DeployParams>, QueryRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    authorize_change(&api, &name, &headers)?;
    let params = query(params)?;
    let toml_text = match params.to_config() {
        Some(c) => Some(toml::to_string(&c).map_err(|e| ApiError::BadDeployment {
            kind: BadDeployment::Config,
            message: e.to_string(),
        })?),
        None => None,
    };
    match params.stage.as_deref() {
        None | Some("active") => {}
        Some("candidate") => {
            api.registry
                .deploy_candidate(&name, body.to_vec(), toml_text)
                .await?;
            return Ok((StatusCode::OK, Json(json!(api.registry.summary(&name)))));
        }
        Some(other) => {
            return Err(ApiError::BadDeployment {
                kind: BadDeployment::Stage,
                message: format!("stage must be `active` or `candidate`, got `{other}`"),
            })
        }
    }
    let existed = api.registry.get(&name).is_some();
    let policy = api.registry.deploy(&name, body.to_vec(), toml_text).await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let summary = api.registry.summary(&policy.name);
    Ok((status, Json(json!(summary))))
}

/// `?stage=candidate` removes only the candidate.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveParams {
    stage: Option<String>,
}

async fn remove(
    State(api): State<Arc<PolicyApi>>,
    Path(name): Path<String>,
    params: Result<Query<RemoveParams>, QueryRejection>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    authorize_change(&api, &name, &headers)?;
    let params = query(params)?;
    match params.stage.as_deref() {
        Some("candidate") => api.registry.remove_candidate(&name).await?,
        None | Some("active") => api.registry.remove(&name).await?,
        Some(other) => {
            return Err(ApiError::BadDeployment {
                kind: BadDeployment::Stage,
                message: format!("stage must be `active` or `candidate`, got `{other}`"),
            })
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The candidate becomes the active version (the old one is kept for a rollback).
async fn promote(
    State(api): State<Arc<PolicyApi>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize_change(&api, &name, &headers)?;
    api.registry.promote(&name).await?;
    Ok(Json(json!(api.registry.summary(&name))))
}

/// The version before the last promotion becomes the active one again.
async fn rollback(
    State(api): State<Arc<PolicyApi>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize_change(&api, &name, &headers)?;
    api.registry.rollback(&name).await?;
    Ok(Json(json!(api.registry.summary(&name))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deploy_params_become_a_config_only_when_given() {
        assert!(DeployParams::default().to_config().is_none());
        let p = DeployParams {
            max_reads: Some(3),
            ..DeployParams::default()
        };
        let c = p.to_config().unwrap();
        assert_eq!(c.limits.unwrap().max_reads, 3);
        let text = toml::to_string(&c).unwrap();
        assert_eq!(PolicyConfig::parse(&text).unwrap(), c);
        for (given, config) in [
            ("off", CalibrationConfig::Off),
            (
                "p.calibration.json",
                CalibrationConfig::File("p.calibration.json".into()),
            ),
        ] {
            let p = DeployParams {
                calibration: Some(given.into()),
                ..DeployParams::default()
            };
            let c = p.to_config().unwrap();
            assert_eq!(c.calibration, Some(config));
            let text = toml::to_string(&c).unwrap();
            assert_eq!(PolicyConfig::parse(&text).unwrap(), c);
        }
    }
}
