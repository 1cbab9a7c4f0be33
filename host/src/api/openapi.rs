//! `GET /openapi.json`: every route with every status it can answer, the request schema the host
//! validates against (the same file, inlined), the response and error shapes, and each served
//! policy as its own path (`/v1/policies/ticket-router`) with the input and output schemas it
//! declares. Built on every request, so it follows deploys, reloads and removals. The policies'
//! part is `openapi_policies.rs`, the models' `openapi_models.rs`.
//!
//! `tests/tests/openapi.rs` runs a property-based fuzzer (schemathesis) against this document on
//! a real server: an undocumented status, a 5xx or a response outside its schema fails it.

use super::openapi_policies::{
    decision_schema, generic_policy_paths, narrow_generic_run_body, served_policy_paths,
};
use super::openapi_responses::{error, v1_responses, with_retry_after};
use super::validate::REQUEST_SCHEMA;
use super::AppState;
use crate::policy::registry::PolicySummary;
use crate::policy::Registry;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::{Arc, OnceLock};

/// The policies the document describes: set once the server builds its policy routes (`hunch
/// serve`), read on every request. Unset (a server without policies, `hunch openapi`): only the
/// generic `/v1/policies/{name}` routes are described.
#[derive(Clone, Default)]
pub struct ServedPolicies(Arc<OnceLock<Arc<Registry>>>);

impl std::fmt::Debug for ServedPolicies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ServedPolicies")
            .field(&self.0.get().is_some())
            .finish()
    }
}

impl ServedPolicies {
    /// From now on the document lists `registry`'s policies (a second call changes nothing: a
    /// server has one registry).
    pub fn serve(&self, registry: Arc<Registry>) {
        let _ = self.0.set(registry);
    }

    fn summaries(&self) -> Vec<PolicySummary> {
        self.0.get().map(|r| r.summaries()).unwrap_or_default()
    }
}

/// Replaces `{"$ref": "#/$defs/x"}` with the definition itself, so the JSON Schema file can be
/// embedded in an OpenAPI document (whose `$ref`s resolve against the document root). Only for
/// the shipped request schema, whose definitions do not refer to themselves.
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

/// The request schema the validator enforces (the shipped file, its definitions inlined).
fn system_one_request_schema() -> Value {
    let schema: Value = serde_json::from_str(REQUEST_SCHEMA).unwrap_or(Value::Null);
    let defs = schema.get("$defs").cloned().unwrap_or(Value::Null);
    inline_refs(&schema, &defs)
}

fn components() -> Value {
    json!({
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "An API key (--api-key); every /v1 route needs it when keys are configured."},
            "admin": {"type": "apiKey", "in": "header", "name": "X-Admin-Key",
                      "description": "The admin key (--admin-key) for policy deployments and model loads and unloads; `Authorization: Bearer KEY` works too when API keys are off."}
        },
        "schemas": {
            "SystemOneRequest": system_one_request_schema(),
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
                "required": ["error_type", "message"], "properties": {"error_type": {"type": "string"}, "message": {"type": "string"},
                    "decision_id": {"type": "string", "description": "The decision's id, on the policy routes."}}}}},
            "PolicySummary": {"type": "object", "required": ["name", "mode"], "properties": {
                "name": {"type": "string"},
                "version": {"type": ["string", "null"], "description": "Content hash of the .wasm; null when no version ever loaded."},
                "loaded_at_ms": {"type": ["integer", "null"]},
                "description": {"type": ["string", "null"]},
                "declared_name": {"type": ["string", "null"]},
                "declared_version": {"type": ["string", "null"]},
                "input_schema": {"description": "The JSON Schema the policy declares for its input (null when none loaded)."},
                "output_schema": {"description": "The JSON Schema the policy declares for its output."},
                "limits": {"type": ["object", "null"]},
                "reader": {"type": ["string", "null"]},
                "wasm_bytes": {"type": ["integer", "null"]},
                "last_reload": {"type": ["object", "null"]},
                "mode": {"enum": ["off", "shadow", "canary"]},
                "candidate": {"type": ["object", "null"]},
                "previous_version": {"type": ["string", "null"]},
                "calibration": {"type": ["object", "null"], "description": "What the version's reads are calibrated with now: source (server, policy or off), id (the calibration file's sha256; null when none applies), questions, file.",
                    "properties": {"source": {"enum": ["server", "policy", "bundle", "off"]}, "id": {"type": ["string", "null"]}}}}},
            "PolicyDescription": {"allOf": [{"$ref": "#/components/schemas/PolicySummary"}, {
                "type": "object", "required": ["stage"], "properties": {
                    "stage": {"type": "string"}, "agreement": {"description": "Shadow or canary agreement with the candidate, when one runs."}}}]},
            "PolicyList": {"type": "object", "required": ["policies"], "properties": {
                "policies": {"type": "array", "items": {"$ref": "#/components/schemas/PolicySummary"}}}},
            "PolicyDecision": decision_schema(json!({})),
            "Status": {"type": "object", "required": ["bundle"], "properties": {"bundle": {"oneOf": [
                {"type": "null"},
                {"type": "object",
                 "required": ["url", "revision", "activated_at", "last_success_at", "last_error", "stale", "stale_seconds", "policies"],
                 "properties": {
                    "url": {"type": "string"},
                    "revision": {"type": ["string", "null"], "description": "The active revision; null before the first activation."},
                    "activated_at": {"type": ["string", "null"], "description": "RFC 3339."},
                    "last_success_at": {"type": ["string", "null"], "description": "The last check answered 200 or 304 and leaving the replica current (RFC 3339)."},
                    "last_error": {"oneOf": [{"type": "null"}, {"type": "object", "required": ["at", "message"],
                        "properties": {"at": {"type": "string"}, "message": {"type": "string"}}}]},
                    "stale": {"type": "boolean", "description": "stale_seconds is over --bundle-stale-after."},
                    "stale_seconds": {"type": "number", "minimum": 0, "description": "Seconds since the last successful check (since start before the first)."},
                    "policies": {"type": "array", "items": {"type": "string"}}}}]}}}
        }
    })
}

/// How a `/v1/systemone` body may be encoded (`api/body.rs`).
const BODY_ENCODINGS: &str = "JSON, sent as it is or compressed with Content-Encoding: zstd (the SDK compresses from 1 KiB up), gzip or deflate; the header must say how the bytes are encoded (400 when they are not what it says, 415 for another encoding).";

/// Every route that answers `GET` answers `HEAD` too (the router adds it, and the `Allow` of an
/// `OPTIONS` lists it): each path item with a `get` gets a `head` with its statuses and headers,
/// without bodies.
fn add_head_operations(paths: &mut Map<String, Value>) {
    for item in paths.values_mut() {
        let Some(get) = item.get("get").cloned() else {
            continue;
        };
        if item.get("head").is_some() {
            continue;
        }
        let mut head = get;
        if let Some(summary) = head.get("summary").and_then(Value::as_str) {
            head["summary"] = json!(format!("{summary} (headers only)"));
        }
        if let Some(responses) = head.get_mut("responses").and_then(Value::as_object_mut) {
            for response in responses.values_mut() {
                if let Some(r) = response.as_object_mut() {
                    r.remove("content");
                }
            }
        }
        item["head"] = head;
    }
}

/// The document with no policy served (what `hunch openapi` prints).
pub fn document() -> Value {
    document_with(&[])
}

/// The document for a server serving `policies`.
pub fn document_with(policies: &[PolicySummary]) -> Value {
    let mut components = components();
    let mut schemas = components["schemas"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    schemas.extend(super::openapi_models::schemas());
    let served = served_policy_paths(policies, &mut schemas);
    components["schemas"] = Value::Object(schemas);
    let mut paths: Map<String, Value> = json!({
        "/v1/systemone": {"post": {
            "summary": "Answer typed questions about a state (System One)",
            "security": [{"bearer": []}],
            // `Content-Encoding` is not a parameter: it says how the body's bytes are encoded, so
            // a client may send it only with a body encoded that way (a fuzzer that sends `zstd`
            // beside a plain body gets the documented 400). The request body's description says
            // which encodings are decoded.
            "parameters": [
                {"name": "x-request-id", "in": "header", "required": false, "schema": {"type": "string"}, "description": "Echoed in x-typesafe-request-id when plain."}
            ],
            "requestBody": {"required": true, "description": BODY_ENCODINGS, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/SystemOneRequest"},
                "example": {"model": "jev-latest", "state": "I was charged twice. Please help.",
                            "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"},
                                          "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["Can wait", "Today"]}}}}}},
            "responses": v1_responses(json!({
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
                                "description": "With the answer cache on and an isolated read: how many answers came from the cache (they cost no tokens)."},
                            "x-hunch-calibration": {"schema": {"type": "string"},
                                "description": "The id (sha256 of the file) of the calibration the answers were computed with; absent when they are raw."}}},
                "400": error("Beyond a limit of the model, or a body that is not what its Content-Encoding says (plain JSON sent as zstd, say)"),
                "404": error("Unknown model"),
                "409": error("The model's checkpoint was refused at load: its files or settings hold what this server cannot serve (the message names it); no retry helps until they change (docs/models.md, \"Configs\"); error_type upstream_rejected, as every reader's 4xx"),
                "413": error("Body too large (compressed or decompressed)"),
                "415": error("Unsupported Content-Encoding"),
                "422": {"description": "Invalid request; loc names the field", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ValidationError"}}}},
                "500": error("A bug or a broken reader output (logged)"),
                "503": with_retry_after(error("Loading, restarting or overloaded, or no room in the memory budget while every loaded model is busy; see Retry-After")),
                "507": super::openapi_models::insufficient_memory(),
            }))
        }},
        "/v1/status": {"get": {
            "summary": "This replica's policy bundle: active revision, activation and last successful check times, last error, staleness (docs/deploy.md, \"Policy bundles\"); bundle is null without --bundle-url",
            "security": [{"bearer": []}],
            "responses": v1_responses(json!({"200": {"description": "Status",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Status"}}}}}))
        }},
        "/healthz": {"get": {"summary": "Liveness: the process answers", "responses": {"200": {"description": "Alive"}}}},
        "/readyz": {"get": {"summary": "Readiness: every model can take reads",
                            "responses": {"200": {"description": "Ready"}, "503": with_retry_after(error("Not ready; see Retry-After"))}}},
        "/metrics": {"get": {"summary": "Prometheus metrics (text format 0.0.4)",
                             "responses": {"200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/openapi.json": {"get": {"summary": "This document (the served policies' paths change as policies are deployed, reloaded and removed)",
                                  "responses": {"200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}}}}}
    })
    .as_object()
    .cloned()
    .unwrap_or_default();
    paths.extend(super::openapi_models::paths());
    paths.extend(generic_policy_paths());
    paths.extend(served);
    narrow_generic_run_body(&mut paths, policies);
    add_head_operations(&mut paths);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Hunch",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "TypeSafe's System One API (0.2.0) served by Hunch: fast, typed, calibrated decisions read in one pass of a diffusion LM, and decision policies (WebAssembly) built on them. Text-only: box questions and image assets are refused with a 422. Every /v1 route needs a bearer API key when keys are configured."
        },
        "components": components,
        "paths": paths
    })
}

pub async fn openapi(State(state): State<AppState>) -> Json<Value> {
    Json(document_with(&state.served_policies.summaries()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(name: &str, input: Value, output: Value) -> PolicySummary {
        PolicySummary {
            name: name.into(),
            version: Some("0123456789abcdef".into()),
            loaded_at_ms: Some(1),
            description: Some("a test policy".into()),
            declared_name: Some(name.into()),
            declared_version: Some("0.1.0".into()),
            input_schema: Some(input),
            output_schema: Some(output),
            limits: None,
            reader: None,
            wasm_bytes: Some(1),
            last_reload: None,
            mode: "off",
            candidate: None,
            previous_version: None,
            calibration: None,
        }
    }

    /// Every `$ref` in the document, with what it points at (None: dangling).
    fn refs(doc: &Value) -> Vec<(String, bool)> {
        fn walk(v: &Value, doc: &Value, out: &mut Vec<(String, bool)>) {
            match v {
                Value::Object(map) => {
                    for (k, v) in map {
                        match (k.as_str(), v) {
                            ("$ref", Value::String(r)) => {
                                let found =
                                    r.strip_prefix('#').and_then(|p| doc.pointer(p)).is_some();
                                out.push((r.clone(), found));
                            }
                            _ => walk(v, doc, out),
                        }
                    }
                }
                Value::Array(items) => items.iter().for_each(|v| walk(v, doc, out)),
                _ => {}
            }
        }
        let mut out = Vec::new();
        walk(doc, doc, &mut out);
        out
    }

    #[test]
    fn the_request_schema_is_inlined_without_dangling_refs() {
        let doc = document();
        let text = doc.to_string();
        assert!(!text.contains("#/$defs/"));
        assert!(
            doc["components"]["schemas"]["SystemOneRequest"]["properties"]["questions"].is_object()
        );
        for path in [
            "/v1/systemone",
            "/v1/models",
            "/v1/models/{name}/load",
            "/v1/models/{name}/unload",
            "/v1/models/{name}/settings",
            "/v1/models/{name}/quality",
            "/v1/status",
            "/v1/policies",
            "/v1/policies/{name}",
            "/v1/policies/{name}/promote",
            "/v1/policies/{name}/rollback",
            "/healthz",
            "/readyz",
            "/metrics",
            "/openapi.json",
        ] {
            assert!(doc["paths"][path].is_object(), "{path}");
        }
        let dangling: Vec<_> = refs(&doc).into_iter().filter(|(_, ok)| !ok).collect();
        assert!(dangling.is_empty(), "{dangling:?}");
    }

    #[test]
    fn every_authenticated_operation_documents_401_and_every_run_its_400() {
        let doc = document_with(&[summary("p", json!({}), json!({}))]);
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                if op.get("security").is_some() {
                    assert!(op["responses"]["401"].is_object(), "{method} {path}");
                }
            }
        }
        for path in ["/v1/policies/{name}", "/v1/policies/p"] {
            assert!(
                doc["paths"][path]["post"]["responses"]["400"].is_object(),
                "{path}"
            );
            assert!(
                doc["paths"][path]["get"]["responses"]["401"].is_object(),
                "{path}"
            );
        }
    }

    #[test]
    fn a_served_policy_is_its_own_path_with_its_declared_schemas() {
        let input = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://example.com/ticket",
            "type": "object",
            "required": ["customer"],
            "properties": {"customer": {"$ref": "#/$defs/party"}, "parent": {"$ref": "#"}},
            "$defs": {"party": {"type": "object", "properties": {"next": {"$ref": "#/$defs/party"}}}}
        });
        let output = json!({"type": "object", "required": ["team"], "properties": {"team": {"enum": ["a", "b"]}}});
        let doc = document_with(&[summary("ticket-router", input, output.clone())]);
        let post = &doc["paths"]["/v1/policies/ticket-router"]["post"];
        assert_eq!(
            post["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/policy.ticket-router.input"
        );
        assert_eq!(
            post["responses"]["200"]["content"]["application/json"]["schema"]["properties"]
                ["output"]["$ref"],
            "#/components/schemas/policy.ticket-router.output"
        );
        let component = &doc["components"]["schemas"]["policy.ticket-router.input"];
        assert_eq!(component["required"], json!(["customer"]));
        assert!(component.get("$id").is_none() && component.get("$schema").is_none());
        // Recursive definitions stay references, each resolving inside the component.
        assert_eq!(
            component["$defs"]["party"]["properties"]["next"]["$ref"],
            "#/components/schemas/policy.ticket-router.input/$defs/party"
        );
        assert_eq!(
            component["properties"]["parent"]["$ref"],
            "#/components/schemas/policy.ticket-router.input"
        );
        assert_eq!(
            doc["components"]["schemas"]["policy.ticket-router.output"],
            output
        );
        let dangling: Vec<_> = refs(&doc).into_iter().filter(|(_, ok)| !ok).collect();
        assert!(dangling.is_empty(), "{dangling:?}");
    }

    #[test]
    fn every_get_has_its_head_and_the_generic_run_takes_what_a_served_policy_takes() {
        let doc = document_with(&[summary("p", json!({"type": "object"}), json!({}))]);
        for (path, item) in doc["paths"].as_object().unwrap() {
            if let Some(get) = item.get("get") {
                let head = &item["head"];
                assert!(head.is_object(), "{path}: GET without HEAD");
                let statuses = |op: &Value| {
                    op["responses"]
                        .as_object()
                        .unwrap()
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                };
                assert_eq!(statuses(head), statuses(get), "{path}");
                for (status, response) in head["responses"].as_object().unwrap() {
                    assert!(
                        response.get("content").is_none(),
                        "{path} HEAD {status} has a body"
                    );
                }
            }
        }
        assert_eq!(
            doc["paths"]["/v1/policies/{name}"]["post"]["requestBody"]["content"]
                ["application/json"]["schema"],
            json!({"anyOf": [{"$ref": "#/components/schemas/policy.p.input"}]})
        );
        // With none served, any JSON value (nothing narrows it).
        assert_eq!(
            document()["paths"]["/v1/policies/{name}"]["post"]["requestBody"]["content"]
                ["application/json"]["schema"],
            json!({})
        );
        // Content-Encoding is not a free parameter: a fuzzer must not send it beside a plain body.
        let params = doc["paths"]["/v1/systemone"]["post"]["parameters"]
            .as_array()
            .unwrap();
        assert!(params.iter().all(|p| p["name"] != "Content-Encoding"));
    }

    #[test]
    fn a_policy_that_never_loaded_has_no_path() {
        let mut refused = summary("broken", json!({}), json!({}));
        refused.input_schema = None;
        refused.output_schema = None;
        let doc = document_with(&[refused]);
        assert!(doc["paths"].get("/v1/policies/broken").is_none());
        assert!(doc["components"]["schemas"]
            .get("policy.broken.input")
            .is_none());
    }
}
