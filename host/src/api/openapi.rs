//! `GET /openapi.json`: every route, with the request schema the host validates against (the
//! same file, inlined) and the response and error shapes.

use super::validate::REQUEST_SCHEMA;
use axum::Json;
use serde_json::{json, Value};

/// Replaces `{"$ref": "#/$defs/x"}` with the definition itself, so the JSON Schema file can be
/// embedded in an OpenAPI document (whose `$ref`s resolve against the document root).
fn inline_refs(value: &Value, defs: &Value) -> Value {
    match value {
        Value::Object(map) => {
            if let Some(target) = map.get("$ref").and_then(Value::as_str) {
                if let Some(def) = target
                    .strip_prefix("#/$defs/")
                    .and_then(|name| defs.get(name))
                {
                    return inline_refs(def, defs);
                }
            }
            Value::Object(
                map.iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "$defs" | "$schema" | "$id"))
                    .map(|(k, v)| (k.clone(), inline_refs(v, defs)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| inline_refs(v, defs)).collect()),
        other => other.clone(),
    }
}

pub fn document() -> Value {
    let schema: Value = serde_json::from_str(REQUEST_SCHEMA).unwrap_or(Value::Null);
    let defs = schema.get("$defs").cloned().unwrap_or(Value::Null);
    let request_schema = inline_refs(&schema, &defs);
    let error = |description: &str| json!({"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Hunch",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "TypeSafe's System One API (0.2.0) served by Hunch: fast, typed, calibrated decisions read in one pass of a diffusion LM. Text-only: box questions and image assets are refused with a 422."
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "SystemOneRequest": request_schema,
                "SystemOneResponse": {
                    "type": "object",
                    "required": ["model", "answers", "usage"],
                    "properties": {
                        "model": {"type": "string", "description": "The real model name (never an alias)."},
                        "answers": {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/Answer"},
                                    "description": "One answer per question, under the same id, in request order."},
                        "usage": {"type": "object", "required": ["input_tokens", "output_tokens"],
                                  "properties": {"input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"}}}
                    }
                },
                "Answer": {"oneOf": [
                    {"type": "object", "required": ["type", "noul"], "properties": {"type": {"const": "noul"}, "noul": {"type": "number", "minimum": 0, "maximum": 1}}},
                    {"type": "object", "required": ["type", "choice", "confidence", "probabilities"], "properties": {
                        "type": {"const": "choice"}, "choice": {"type": "string"}, "confidence": {"type": "number"},
                        "probabilities": {"type": "object", "additionalProperties": {"type": "number"}}}},
                    {"type": "object", "required": ["type", "score", "confidence", "legend", "probabilities"], "properties": {
                        "type": {"const": "score"}, "score": {"type": "number"}, "confidence": {"type": "number"},
                        "legend": {"type": "object"}, "probabilities": {"type": "object", "additionalProperties": {"type": "number"}}}}
                ]},
                "ValidationError": {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "array", "items": {
                    "type": "object", "required": ["loc", "msg", "type"], "properties": {
                        "loc": {"type": "array", "items": {"type": ["string", "integer"]}},
                        "msg": {"type": "string"}, "type": {"type": "string"}}}}}},
                "Error": {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "object",
                    "required": ["error_type", "message"], "properties": {"error_type": {"type": "string"}, "message": {"type": "string"}}}}},
                "ModelList": {"type": "object", "required": ["models"], "properties": {"models": {"type": "array", "items": {
                    "type": "object", "required": ["name", "description", "release_date"], "properties": {
                        "name": {"type": "string"}, "description": {"type": "string"}, "release_date": {"type": "string"}}}}}}
            }
        },
        "paths": {
            "/v1/systemone": {"post": {
                "summary": "Answer typed questions about a state (System One)",
                "security": [{"bearer": []}],
                "parameters": [
                    {"name": "Content-Encoding", "in": "header", "required": false, "schema": {"enum": ["zstd", "gzip", "deflate", "identity"]}},
                    {"name": "x-request-id", "in": "header", "required": false, "schema": {"type": "string"}, "description": "Echoed in x-typesafe-request-id when plain."}
                ],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SystemOneRequest"}}}},
                "responses": {
                    "200": {"description": "Answers", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SystemOneResponse"}}},
                            "headers": {
                                "x-hunch-batch-requests": {"schema": {"type": "integer", "minimum": 1},
                                    "description": "The most requests whose rows shared one forward pass with this one (1: read alone); absent when the reader does not say."},
                                "x-hunch-batch-deviation": {"schema": {"type": "number", "minimum": 0},
                                    "description": "Present when the answer was computed in a batch with other requests: the largest probability change the engine measured at startup between a read alone and batched (0: bit-exact)."},
                                "x-hunch-questions": {"schema": {"enum": ["isolated", "joint"]},
                                    "description": "How the answers were read: isolated (each question alone; an answer does not depend on the other questions) or joint (one prompt for all)."},
                                "x-hunch-ignored-fields": {"schema": {"type": "string"},
                                    "description": "Unknown top-level request fields that were ignored, comma-separated in request order (characters a header cannot carry are percent-encoded); absent when none."},
                                "x-hunch-answer-cache-hits": {"schema": {"type": "integer", "minimum": 0},
                                    "description": "With the answer cache on and an isolated read: how many answers came from the cache (they cost no tokens)."}}},
                    "400": error("Beyond a limit of the model, or an undecodable body"),
                    "401": error("Missing or wrong bearer key"),
                    "404": error("Unknown model"),
                    "413": error("Body too large (compressed or decompressed)"),
                    "415": error("Unsupported Content-Encoding"),
                    "422": {"description": "Invalid request; loc names the field", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ValidationError"}}}},
                    "503": error("Loading, restarting or overloaded; see Retry-After"),
                    "504": error("Timed out")
                }
            }},
            "/v1/models": {"get": {
                "summary": "Served models and aliases (jev-latest is the default model)",
                "security": [{"bearer": []}],
                "responses": {"200": {"description": "Models", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ModelList"}}}},
                              "401": error("Missing or wrong bearer key")}
            }},
            "/v1/policies": {"get": {
                "summary": "Decision policies: name, version (content hash), loaded-at, schemas, limits, last reload status (docs/policies.md)",
                "security": [{"bearer": []}],
                "responses": {"200": {"description": "Policies"}, "401": error("Missing or wrong bearer key")}
            }},
            "/v1/policies/{name}": {
                "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$"}}],
                "get": {"summary": "One policy", "security": [{"bearer": []}],
                        "responses": {"200": {"description": "The policy"}, "404": error("No such policy")}},
                "post": {"summary": "Run the policy on a JSON input (validated against its input schema): output, version, reads, usage, timings",
                         "security": [{"bearer": []}],
                         "requestBody": {"required": true, "content": {"application/json": {"schema": {}}}},
                         "responses": {"200": {"description": "The decision"}, "404": error("No such policy"),
                                       "422": error("Invalid input, a broken limit (detail.limit) or the policy declined"),
                                       "500": error("The policy trapped, used an ungranted capability or broke its output schema"),
                                       "503": error("Busy or a read was unavailable"), "504": error("Timeout")}},
                "put": {"summary": "Deploy a component (admin key in X-Admin-Key); limits and reader as query parameters",
                        "requestBody": {"required": true, "content": {"application/wasm": {"schema": {"type": "string", "format": "binary"}}}},
                        "responses": {"200": {"description": "New version serving"}, "201": {"description": "New policy serving"},
                                      "401": error("Missing or wrong admin key"), "403": error("Deployments over HTTP are off"),
                                      "422": error("Refused: does not compile, link, describe or validate")}},
                "delete": {"summary": "Remove a policy (admin key)",
                           "responses": {"204": {"description": "Removed"}, "401": error("Missing or wrong admin key"), "404": error("No such policy")}}
            },
            "/healthz": {"get": {"summary": "Liveness: the process answers", "responses": {"200": {"description": "Alive"}}}},
            "/readyz": {"get": {"summary": "Readiness: every model can take reads",
                                "responses": {"200": {"description": "Ready"}, "503": error("Not ready; see Retry-After")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics (text format 0.0.4)",
                                 "responses": {"200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1"}}}}
        }
    })
}

pub async fn openapi() -> Json<Value> {
    Json(document())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_request_schema_is_inlined_without_dangling_refs() {
        let doc = super::document();
        let text = doc.to_string();
        assert!(!text.contains("#/$defs/"));
        assert!(
            doc["components"]["schemas"]["SystemOneRequest"]["properties"]["questions"].is_object()
        );
        for path in [
            "/v1/systemone",
            "/v1/models",
            "/v1/policies",
            "/v1/policies/{name}",
            "/healthz",
            "/readyz",
            "/metrics",
            "/openapi.json",
        ] {
            assert!(doc["paths"][path].is_object(), "{path}");
        }
    }
}
