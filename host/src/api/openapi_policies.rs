//! The OpenAPI document's part for policies (docs/api.md, "The OpenAPI document"): the
//! templated `/v1/policies/{name}` routes (describe, run, deploy, remove, promote, rollback), each
//! served policy as its own path with the schemas it declares (as components), and the run's
//! body on the templated path.

use super::openapi_responses::{error, framework_error, v1_responses, with_retry_after};
use crate::policy::registry::PolicySummary;
use serde_json::{json, Map, Value};

/// A policy's own schema as a component named `component`: kept whole (its `$defs` included) and
/// every local `$ref` (`#`, `#/$defs/x`, any JSON pointer) rewritten to point inside that
/// component, so recursive definitions stay references instead of being expanded forever.
pub(super) fn as_component(schema: &Value, component: &str) -> Value {
    fn rewrite(value: &Value, base: &str) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let v = match (k.as_str(), v) {
                            ("$ref", Value::String(target)) if target.starts_with('#') => {
                                json!(format!("{base}{}", &target[1..]))
                            }
                            _ => rewrite(v, base),
                        };
                        (k.clone(), v)
                    })
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|v| rewrite(v, base)).collect()),
            other => other.clone(),
        }
    }
    let base = format!("#/components/schemas/{component}");
    let mut rewritten = rewrite(schema, &base);
    // The root's identifiers would change how the document's references resolve.
    if let Value::Object(map) = &mut rewritten {
        map.remove("$id");
        map.remove("$schema");
    }
    rewritten
}

/// The body of a policy's 200: its output (`output` matching `output`) and how it was reached.
pub(super) fn decision_schema(output: Value) -> Value {
    json!({"type": "object",
           "required": ["output", "policy", "version", "reads", "usage", "decision_id", "stage"],
           "properties": {
               "output": output,
               "policy": {"type": "string"},
               "version": {"type": "string"},
               "reads": {"type": "array", "items": {"type": "object"}},
               "usage": {"type": "object"},
               "fuel_used": {"type": "integer", "minimum": 0},
               "logs": {"type": "array"},
               "timings": {"type": "object"},
               "decision_id": {"type": "string"},
               "calibration": {"type": "string", "description": "The id of the calibration the reads' answers were computed with; absent when none was."},
               "stage": {"type": "string", "description": "The version that decided: active, or the candidate in a canary."}}})
}

fn decision_id_header() -> Value {
    json!({"x-hunch-decision-id": {"schema": {"type": "string"}, "description": "The decision's id (also in the body)."}})
}

/// A decision's headers: its id and, for a policy served from a bundle, the bundle revision.
fn decision_headers() -> Value {
    let mut headers = decision_id_header();
    headers["x-hunch-bundle-revision"] = json!({"schema": {"type": "string"}, "required": false,
        "description": "The policy bundle revision the deciding version came with (only when a bundle owns the policies)."});
    headers
}

/// `POST` on a policy: what running it can answer, with `input` as the body's schema and
/// `output` as the decision's `output`.
fn run_operation(summary: &str, input: Value, output: Value) -> Value {
    json!({
        "summary": summary,
        "security": [{"bearer": []}],
        "parameters": [{"name": "x-hunch-route-key", "in": "header", "required": false, "schema": {"type": "string"},
                        "description": "Pins a canary's routing to this key (docs/decision-records.md)."}],
        "requestBody": {"required": true, "content": {"application/json": {"schema": input}}},
        "responses": v1_responses(json!({
            "200": {"description": "The decision", "headers": decision_headers(),
                    "content": {"application/json": {"schema": decision_schema(output)}}},
            "400": error("The body is not JSON"),
            "404": error("No such policy"),
            "413": framework_error("Body over 32 MiB"),
            "422": error("Input not matching the policy's input schema (detail.details), a broken limit (detail.limit), or the policy declined (detail.policy_error)"),
            "500": error("The policy trapped, used an ungranted capability or broke its own output schema (a bug in the policy)"),
            "502": error("A read the policy needed failed inside the reader"),
            "503": with_retry_after(error("Busy, a read was unavailable, or a required decision log could not record the decision")),
        }))
    })
}

fn describe_operation() -> Value {
    json!({"summary": "One policy: its summary, the stage described (`?stage=`, default active) and agreement",
           "security": [{"bearer": []}],
           "parameters": [{"name": "stage", "in": "query", "required": false,
                           "schema": {"enum": ["active", "candidate", "previous"]}}],
           "responses": v1_responses(json!({
               "200": {"description": "The policy", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PolicyDescription"}}}},
               "400": error("A stage that is not active, candidate or previous, or a query string that cannot be read (a repeated parameter)"),
               "404": error("No such policy, or no version at the stage asked")}))})
}

/// Admin routes: need the admin key (as well as the API key when keys are configured).
fn admin_responses(mut responses: Value) -> Value {
    responses["401"] = error("Missing or wrong admin key (or API key)");
    responses["403"] = error("Deployments over HTTP are off (no --admin-key)");
    responses["504"] = error("The request did not finish within the per-request timeout");
    responses
}

fn stage_parameter() -> Value {
    json!({"name": "stage", "in": "query", "required": false, "schema": {"enum": ["active", "candidate"]}})
}

/// The routes every server with policies has, whatever it serves.
pub(super) fn generic_policy_paths() -> Map<String, Value> {
    let name = json!({"name": "name", "in": "path", "required": true,
                      "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$"}});
    let summary_200 = |description: &str| {
        json!({"description": description,
               "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PolicySummary"}}}})
    };
    let stage_change = |summary: &str| {
        json!({"post": {"summary": summary, "security": [{"bearer": [], "admin": []}],
                "responses": admin_responses(json!({
                    "200": summary_200("The policy after the change"),
                    "400": error("Not a valid policy name"),
                    "404": error("No such policy, or nothing to promote or restore"),
                    "409": error("Conflicts with the policy's current stages, or a policy bundle owns the policies (error_type bundle_owned)"),
                    "422": error("The stored version no longer loads")}))}})
    };
    let mut paths = Map::new();
    paths.insert("/v1/policies".into(), json!({"get": {
        "summary": "Decision policies: name, version (content hash), loaded-at, schemas, limits, last reload status (docs/policies.md)",
        "security": [{"bearer": []}],
        "responses": v1_responses(json!({"200": {"description": "Policies",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PolicyList"}}}}}))}}));
    let deploy_parameters: Vec<Value> = std::iter::once(stage_parameter())
        .chain(
            [
                ("mode", json!({"enum": ["off", "shadow", "canary"]})),
                ("sample", json!({"type": "number", "minimum": 0, "maximum": 1})),
                ("percent", json!({"type": "number", "minimum": 0, "maximum": 100})),
                ("route_key", json!({"type": "string"})),
                ("reader", json!({"type": "string"})),
                ("questions", json!({"enum": ["isolated", "joint"]})),
                ("calibration", json!({"type": "string", "description": "off, or a calibration file in the policy directory (docs/calibration.md)"})),
                ("fuel", json!({"type": "integer", "minimum": 0})),
                ("timeout_ms", json!({"type": "integer", "minimum": 0})),
                ("memory_bytes", json!({"type": "integer", "minimum": 0})),
                ("max_reads", json!({"type": "integer", "minimum": 0, "maximum": u32::MAX})),
                ("max_questions", json!({"type": "integer", "minimum": 0, "maximum": u32::MAX})),
                ("max_output_bytes", json!({"type": "integer", "minimum": 0})),
                ("max_state_bytes", json!({"type": "integer", "minimum": 0})),
                ("max_log_lines", json!({"type": "integer", "minimum": 0, "maximum": u32::MAX})),
            ]
            .into_iter()
            .map(|(n, schema)| json!({"name": n, "in": "query", "required": false, "schema": schema})),
        )
        .collect();
    paths.insert("/v1/policies/{name}".into(), json!({
        "parameters": [name],
        "get": describe_operation(),
        "post": run_operation(
            "Run a policy on a JSON input (validated against its input schema; each served policy has its own path with that schema): output, version, reads, usage, timings",
            json!({}), json!({})),
        "put": {"summary": "Deploy a component (admin key); limits, reader and rollout as query parameters, written to NAME.toml",
                "security": [{"bearer": [], "admin": []}],
                "parameters": deploy_parameters,
                "requestBody": {"required": true, "description": "The component's bytes; the server reads the body whatever its Content-Type.",
                                "content": {"application/wasm": {"schema": {"type": "string", "format": "binary"}},
                                            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                "responses": admin_responses(json!({
                    "200": summary_200("New version serving (or the candidate deployed)"),
                    "201": summary_200("New policy serving"),
                    "400": framework_error("Not a valid policy name, stage or query parameter"),
                    "404": error("A candidate for a policy that does not exist"),
                    "409": error("Conflicts with the policy's current stages, or a policy bundle owns the policies (error_type bundle_owned)"),
                    "413": framework_error("Component over 32 MiB"),
                    "422": error("Refused: does not compile, link, describe or validate")}))},
        "delete": {"summary": "Remove a policy, or only its candidate with ?stage=candidate (admin key)",
                   "security": [{"bearer": [], "admin": []}],
                   "parameters": [stage_parameter()],
                   "responses": admin_responses(json!({
                       "204": {"description": "Removed"},
                       "400": framework_error("Not a valid policy name, stage or query parameter"),
                       "404": error("No such policy or candidate"),
                       "409": error("A policy bundle owns the policies (error_type bundle_owned)")}))}
    }));
    let mut promote = stage_change("Promote the candidate to active; the old active version is kept for a rollback (admin key)");
    promote["parameters"] = json!([name]);
    paths.insert("/v1/policies/{name}/promote".into(), promote);
    let mut rollback = stage_change("Restore the version before the last promotion (admin key)");
    rollback["parameters"] = json!([name]);
    paths.insert("/v1/policies/{name}/rollback".into(), rollback);
    paths
}

/// One path per served policy, with the schemas it declares (as components `policy.NAME.input`
/// and `policy.NAME.output`). Policies with no loaded version (only refused ones) have none.
pub(super) fn served_policy_paths(
    policies: &[PolicySummary],
    schemas: &mut Map<String, Value>,
) -> Map<String, Value> {
    let mut paths = Map::new();
    // A served policy's path takes every method the generic one does (the server's `Allow`
    // says GET, HEAD, POST, PUT, DELETE): deploying over it and removing it included (HEAD is
    // added with every GET, `add_head_operations`).
    let generic = generic_policy_paths();
    let generic_item = generic.get("/v1/policies/{name}");
    let generic_op = |method: &str| {
        generic_item
            .and_then(|item| item.get(method))
            .cloned()
            .unwrap_or(Value::Null)
    };
    for policy in policies {
        let (Some(input), Some(output)) = (&policy.input_schema, &policy.output_schema) else {
            continue;
        };
        let input_name = format!("policy.{}.input", policy.name);
        let output_name = format!("policy.{}.output", policy.name);
        schemas.insert(input_name.clone(), as_component(input, &input_name));
        schemas.insert(output_name.clone(), as_component(output, &output_name));
        let about = policy.description.as_deref().unwrap_or_default();
        paths.insert(
            format!("/v1/policies/{}", policy.name),
            json!({
                "get": describe_operation(),
                "post": run_operation(
                    &format!("Run {} ({}): {about}", policy.name, policy.version.as_deref().unwrap_or("?")),
                    json!({"$ref": format!("#/components/schemas/{input_name}")}),
                    json!({"$ref": format!("#/components/schemas/{output_name}")})),
                "put": generic_op("put"),
                "delete": generic_op("delete"),
            }),
        );
    }
    paths
}

/// The generic `POST /v1/policies/{name}` takes what the named policy's input schema takes: with
/// policies served, a body that no served policy's schema takes is refused (422), so the generic
/// body is any of their input schemas rather than any JSON value.
pub(super) fn narrow_generic_run_body(paths: &mut Map<String, Value>, policies: &[PolicySummary]) {
    let inputs: Vec<Value> = policies
        .iter()
        .filter(|p| p.input_schema.is_some() && p.output_schema.is_some())
        .map(|p| json!({"$ref": format!("#/components/schemas/policy.{}.input", p.name)}))
        .collect();
    if inputs.is_empty() {
        return;
    }
    if let Some(content) = paths
        .get_mut("/v1/policies/{name}")
        .and_then(|item| item.pointer_mut("/post/requestBody/content/application~1json"))
    {
        content["schema"] = json!({"anyOf": inputs});
    }
}
