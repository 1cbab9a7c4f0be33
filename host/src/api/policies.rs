//! `/v1/policies`: list, describe, run, deploy and remove decision policies.
//!
//! Every error is the API's one [`ApiError`]; the `From` impls below map the policy runtime's
//! errors to its statuses and bodies (`{"detail": {"error_type", "message", …}}`, policy errors
//! adding fields such as `limit`).

use crate::api::auth::{bearer_token, matches_any};
use crate::api::error::ApiError;
use crate::policy::invoke::PolicyFailure;
use crate::policy::{InvokeError, Limit, Limits, PolicyConfig, Registry, RegistryError};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
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

impl From<InvokeError> for ApiError {
    fn from(e: InvokeError) -> Self {
        let message = e.to_string();
        match e {
            InvokeError::NotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
            }
            InvokeError::InvalidInput(details) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
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
                ApiError::new(status, "limit_exceeded", message)
                    .with("limit", json!(l.limit.as_str()))
                    .with("limit_value", json!(l.limit_value))
            }
            InvokeError::Trap(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "policy_trapped", message)
            }
            InvokeError::Forbidden(_) => ApiError::new(
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
                ApiError::new(status, "policy_declined", message)
                    .with("policy_error", json!(failure))
            }
            InvokeError::InvalidOutput(_) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "policy_invalid_output",
                message,
            ),
            InvokeError::Busy => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message).retry_after(1)
            }
            InvokeError::Internal(_) => {
                tracing::error!(error = %message, "policy invocation failed");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        let message = e.to_string();
        match e {
            RegistryError::InvalidName(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_name", message)
            }
            RegistryError::NotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
            }
            RegistryError::Load(_) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "policy_refused", message)
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
) -> Result<Json<Value>, ApiError> {
    let summary = api.registry.summary(&name).ok_or_else(|| {
        ApiError::new(
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
) -> Result<Json<Value>, ApiError> {
    // Parsed by hand so a bad body gets the same error shape as every other error.
    let input: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not JSON: {e}"),
        )
    })?;
    let invocation = api.registry.invoke(&name, &input).await?;
    Ok(Json(json!(invocation)))
}

/// Optional per-policy configuration of a deployment, as query parameters
/// (`?reader=…&fuel=…&timeout_ms=…&max_reads=…`); written to `NAME.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployParams {
    reader: Option<String>,
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
        if !any_limit && self.reader.is_none() {
            return None;
        }
        Some(PolicyConfig {
            reader: self.reader.clone(),
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

fn authorize(api: &PolicyApi, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = &api.admin_key else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "deployments over HTTP are disabled: start the server with --admin-key",
        ));
    };
    // `X-Admin-Key` first: when API keys are on, `Authorization` carries the caller's API key.
    let candidates = [
        headers
            .get("x-admin-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim),
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token),
    ];
    let ok = candidates.iter().flatten().fold(false, |acc, key| {
        acc | matches_any([expected.as_bytes()], key)
    });
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "PUT and DELETE need the admin key (X-Admin-Key: KEY, or Authorization: Bearer KEY when API keys are off)",
        ))
    }
}

async fn deploy(
    State(api): State<Arc<PolicyApi>>,
    Path(name): Path<String>,
    Query(params): Query<DeployParams>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    authorize(&api, &headers)?;
    let toml_text = match params.to_config() {
        Some(c) => Some(toml::to_string(&c).map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_config", e.to_string())
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
) -> Result<StatusCode, ApiError> {
    authorize(&api, &headers)?;
    api.registry.remove(&name).await?;
    Ok(StatusCode::NO_CONTENT)
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
    }
}
