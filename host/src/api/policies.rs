//! `/v1/policies`: list, describe, run, deploy and remove decision policies.
//!
//! Every error goes through [`PolicyApiError`], the one place that maps runtime errors to status
//! codes and JSON bodies, in the server's error shape: `{"detail": {"error_type", "message", …}}`
//! (policy errors add fields such as `limit`).

use crate::policy::invoke::PolicyFailure;
use crate::policy::{InvokeError, Limit, Limits, PolicyConfig, Registry, RegistryError};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// Largest component accepted over HTTP.
const MAX_UPLOAD_BYTES: usize = 32 << 20;

pub struct PolicyApi {
    pub registry: Arc<Registry>,
    /// `None`: deployments over HTTP are disabled.
    pub admin_key: Option<String>,
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
        .layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES))
        .with_state(api)
}

/// An error response.
#[derive(Debug)]
pub struct PolicyApiError {
    status: StatusCode,
    body: Value,
    retry_after: Option<u64>,
}

impl PolicyApiError {
    fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> Self {
        PolicyApiError {
            status,
            body: json!({"detail": {"error_type": kind, "message": message.into()}}),
            retry_after: None,
        }
    }

    fn with(mut self, key: &str, value: Value) -> Self {
        if let Some(obj) = self.body["detail"].as_object_mut() {
            obj.insert(key.to_string(), value);
        }
        self
    }
}

impl IntoResponse for PolicyApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        response
    }
}

impl From<InvokeError> for PolicyApiError {
    fn from(e: InvokeError) -> Self {
        let message = e.to_string();
        match e {
            InvokeError::NotFound(_) => {
                PolicyApiError::new(StatusCode::NOT_FOUND, "not_found", message)
            }
            InvokeError::InvalidInput(details) => {
                PolicyApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
                    .with("details", json!(details))
            }
            InvokeError::Limit(l) => {
                // A deadline is a timeout; every other limit is a property of the policy and
                // the input, which a retry would break again.
                let status = if l.limit == Limit::Timeout {
                    StatusCode::GATEWAY_TIMEOUT
                } else {
                    StatusCode::UNPROCESSABLE_ENTITY
                };
                PolicyApiError::new(status, "limit_exceeded", message)
                    .with("limit", json!(l.limit.as_str()))
                    .with("limit_value", json!(l.limit_value))
            }
            InvokeError::Trap(_) => {
                PolicyApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "policy_trapped", message)
            }
            InvokeError::Forbidden(_) => PolicyApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "policy_forbidden_capability",
                message,
            ),
            InvokeError::Policy(failure) => {
                let status = match &failure {
                    PolicyFailure::ReadFailed { read_error, .. } => match read_error.as_str() {
                        "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
                        "timeout" => StatusCode::GATEWAY_TIMEOUT,
                        "invalid_question" | "too_large" | "rejected" => {
                            StatusCode::UNPROCESSABLE_ENTITY
                        }
                        _ => StatusCode::BAD_GATEWAY,
                    },
                    _ => StatusCode::UNPROCESSABLE_ENTITY,
                };
                PolicyApiError::new(status, "policy_declined", message)
                    .with("policy_error", json!(failure))
            }
            InvokeError::InvalidOutput(_) => PolicyApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "policy_invalid_output",
                message,
            ),
            InvokeError::Busy => {
                let mut e = PolicyApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message);
                e.retry_after = Some(1);
                e
            }
            InvokeError::Internal(_) => {
                tracing::error!(error = %message, "policy invocation failed");
                PolicyApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

impl From<RegistryError> for PolicyApiError {
    fn from(e: RegistryError) -> Self {
        let message = e.to_string();
        match e {
            RegistryError::InvalidName(_) => {
                PolicyApiError::new(StatusCode::BAD_REQUEST, "invalid_name", message)
            }
            RegistryError::NotFound(_) => {
                PolicyApiError::new(StatusCode::NOT_FOUND, "not_found", message)
            }
            RegistryError::Load(_) => {
                PolicyApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "policy_refused", message)
            }
        }
    }
}

async fn list(State(api): State<Arc<PolicyApi>>) -> Json<Value> {
    Json(json!({ "policies": api.registry.summaries() }))
}

async fn describe(
    State(api): State<Arc<PolicyApi>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, PolicyApiError> {
    let summary = api.registry.summary(&name).ok_or_else(|| {
        PolicyApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no policy named `{name}`"),
        )
    })?;
    Ok(Json(json!(summary)))
}

async fn decide(
    State(api): State<Arc<PolicyApi>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, PolicyApiError> {
    // Parsed by hand so a bad body gets the same error shape as every other error.
    let input: Value = serde_json::from_slice(&body).map_err(|e| {
        PolicyApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not JSON: {e}"),
        )
    })?;
    let invocation = api.registry.invoke(&name, &input).await?;
    Ok(Json(json!(invocation)))
}

/// Optional per-policy configuration of a deployment, as query parameters
/// (`?reader=…&questions=joint&fuel=…&timeout_ms=…&max_reads=…`); written to `NAME.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployParams {
    reader: Option<String>,
    questions: Option<hunch_core::QuestionMode>,
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
        if !any_limit && self.reader.is_none() && self.questions.is_none() {
            return None;
        }
        Some(PolicyConfig {
            reader: self.reader.clone(),
            questions: self.questions,
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
        })
    }
}

fn authorize(api: &PolicyApi, headers: &HeaderMap) -> Result<(), PolicyApiError> {
    let Some(expected) = &api.admin_key else {
        return Err(PolicyApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "deployments over HTTP are disabled: start the server with --admin-key",
        ));
    };
    // `X-Admin-Key` first: when API keys are on, `Authorization` carries the caller's API key.
    let candidates = [
        headers.get("x-admin-key").and_then(|v| v.to_str().ok()),
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ")),
    ];
    let ok = candidates.iter().flatten().fold(false, |acc, key| {
        acc | constant_time_eq(key.trim().as_bytes(), expected.as_bytes())
    });
    if ok {
        Ok(())
    } else {
        Err(PolicyApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "PUT and DELETE need the admin key (X-Admin-Key: KEY, or Authorization: Bearer KEY when API keys are off)",
        ))
    }
}

/// Compares without an early exit, so response timing does not leak the key's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn deploy(
    State(api): State<Arc<PolicyApi>>,
    Path(name): Path<String>,
    Query(params): Query<DeployParams>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), PolicyApiError> {
    authorize(&api, &headers)?;
    let toml_text = match params.to_config() {
        Some(c) => Some(toml::to_string(&c).map_err(|e| {
            PolicyApiError::new(StatusCode::BAD_REQUEST, "invalid_config", e.to_string())
        })?),
        None => None,
    };
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

async fn remove(
    State(api): State<Arc<PolicyApi>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, PolicyApiError> {
    authorize(&api, &headers)?;
    api.registry.remove(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_exactly() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

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
    }
}
