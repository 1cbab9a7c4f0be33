//! The response objects every part of the OpenAPI document shares (`openapi.rs`, the policies'
//! `openapi_policies.rs`, the models' `openapi_models.rs`): the API's error, one the framework
//! answers itself, `Retry-After`, and what every authenticated `/v1` route can answer.

use serde_json::{json, Value};

pub(super) fn error(description: &str) -> Value {
    json!({"description": description,
           "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
}

/// An error the HTTP framework answers itself before a handler runs (a query string or a body
/// over the route's limit): plain text, not the API's JSON shape.
pub(super) fn framework_error(description: &str) -> Value {
    json!({"description": description,
           "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}},
                       "text/plain": {"schema": {"type": "string"}}}})
}

pub(super) fn with_retry_after(mut response: Value) -> Value {
    response["headers"] = json!({
        "Retry-After": {"schema": {"type": "integer", "minimum": 0}, "description": "Seconds after which a retry may succeed."},
        "retry-after-ms": {"schema": {"type": "integer", "minimum": 0}, "description": "The same, in milliseconds."}
    });
    response
}

/// What every authenticated `/v1` route can answer whatever it does: a missing or wrong API key
/// (only when keys are configured) and the per-request timeout.
pub(super) fn v1_responses(mut responses: Value) -> Value {
    responses["401"] = error("Missing or wrong bearer key (when API keys are configured)");
    responses["504"] = error("The request did not finish within the per-request timeout");
    responses
}
