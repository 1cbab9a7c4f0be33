//! The OpenAPI document's part for models (docs/models.md): `GET /v1/models` with what the model
//! manager says of each model, the admin routes that load and unload one, and a model's quality
//! report.

use super::openapi_responses::{error, v1_responses, with_retry_after};
use serde_json::{json, Map, Value};

/// `x_*` fields of a model that this server runs, as listed and as the admin routes answer.
fn managed_properties() -> Value {
    json!({
        "x_state": {"type": "string", "enum": ["available", "loading", "loaded", "unloading", "failed"],
                    "description": "A model whose sidecar this server runs (docs/models.md): available (its first read loads it), loading, loaded, unloading (reads in flight finish first), failed (x_error says why). Absent for --accelerator and --upstream models."},
        "x_progress": {"type": "number", "minimum": 0, "maximum": 1, "description": "Load progress, while loading."},
        "x_load_seconds_left": {"type": ["number", "null"], "minimum": 0, "description": "While loading: an estimate of the seconds its load has left, from the progress its sidecar reports and the time spent, or (before any progress) from its bytes at the pace of this server's earlier loads; null when neither can tell."},
        "x_error": {"type": "string", "description": "Why it failed (a failed load, or a pinned model's sidecar restarting)."},
        "x_refused": {"type": "boolean", "description": "Present (true) when its load was refused: its files or settings hold what this server cannot serve (x_error names it), so its reads get a 409 until they change; absent for a failure a retry may fix."},
        "x_estimated_bytes": {"type": "integer", "minimum": 0, "description": "What a load reserves in the memory budget before it is measured: the checkpoint's tensor bytes plus the per-process overhead measured so far."},
        "x_resident_bytes": {"type": ["integer", "null"], "minimum": 0, "description": "What its process holds resident, measured (VmRSS); null while no process runs."},
        "x_pinned": {"type": "boolean", "description": "A --model: loaded at start and never unloaded or evicted."},
        "x_ttl_left_seconds": {"type": ["number", "null"], "minimum": 0, "description": "Seconds until its idle TTL (or the last x_keep_alive) unloads it; null unless loaded, idle and unpinned."},
        "x_last_used": {"type": ["string", "null"], "description": "When its last read ended (RFC 3339); null if never read."},
        "x_reads_in_flight": {"type": "integer", "minimum": 0},
        "x_settings": {"type": "object", "description": "Its settings from its models directory's hunch-models.toml (unset keys left out; docs/models.md, \"Per-model settings\")."},
        "x_settings_error": {"type": "string", "description": "Why its table in hunch-models.toml was not applied (naming the file, the model and the key); it keeps the settings it had."}
    })
}

/// A model's settings, as its `hunch-models.toml` table and the body of `PUT …/settings`.
fn settings_schema() -> Value {
    json!({"type": "object", "additionalProperties": false,
    "description": "A model's whole settings: a key left out is the server's default.",
    "properties": {
        "aliases": {"type": "array", "items": {"type": "string", "minLength": 1, "pattern": "^\\S+$"}, "description": "More names for the model."},
        "pinned": {"type": "boolean", "description": "Loaded at start (and now), never evicted, no TTL."},
        "ttl": {"oneOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 2592000}, {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?(ms|s|m|h)?$"}],
                "description": "Idle time before it unloads: seconds, or 500ms, 30s, 10m, 1h (at most 30 days); else --model-ttl."},
        "hidden": {"type": "boolean", "description": "Left out of GET /v1/models (and its aliases with it); still served by name."},
        "dtype": {"enum": ["auto", "float32", "bfloat16"], "description": "The sidecar's --dtype, from its next load."},
        "sidecar_args": {"type": "array", "items": {"type": "string"}, "description": "More sidecar arguments, after the server's --sidecar-arg ones, from its next load."},
        "questions": {"enum": ["isolated", "joint"], "description": "The question mode of a /v1/systemone request that sends no x_questions."},
        "draws": {"type": "integer", "minimum": 1, "maximum": 64, "description": "Noise draws per read for a /v1/systemone request that sends no x_draws."},
        "prior": {"enum": ["divide", "none"], "description": "The prior remedy of a /v1/systemone request that sends no x_prior (docs/read.md)."},
        "order": {"enum": ["as_given", "reversed_average", "cyclic_average"], "description": "The order remedy of a /v1/systemone request that sends no x_order (docs/read.md)."}
    }})
}

/// The schemas these routes use (`ModelList`, `ModelAction`, `ModelSettings`, `QualityReport`).
pub fn schemas() -> Map<String, Value> {
    let mut model = json!({
        "name": {"type": "string"}, "description": {"type": "string"}, "release_date": {"type": "string"},
        "x_fingerprint": {"type": ["string", "null"], "description": "The model's identity as it reports it; null while unknown."},
        "x_family": {"type": "string", "description": "The model family, once loaded: chat, decision or diffusion-gemma."},
        "x_architecture": {"type": "string", "description": "llama, qwen2, qwen3, gemma3, modern-bert (a laya decision model) or diffusiongemma."},
        "x_layout": {"type": "string", "description": "The checkpoint's layout on disk: gguf, hf, mlx-affine, nvfp4."},
        "x_quantization": {"type": "string", "description": "How its matrices are stored, the type holding most weights first (Q4_1+Q8_0, BF16, affine-4bit-g64)."},
        "x_read": {"type": "string", "description": "The read that answers: logits-v1, decision (a llama.cpp decision model read by its own prompt) or diffusion."},
        "x_decision_type": {"type": "string", "description": "A decision model's type (its GGUF's decision.type): openjev, lev, pplx-decider, nimble, kev or laya."},
        "x_checkpoint_name": {"type": "string", "description": "The name the checkpoint gives itself (GGUF general.name)."}
    });
    let mut action = json!({"name": {"type": "string"},
        "x_unload": {"enum": ["not_loaded", "unloading", "draining"],
                     "description": "What an unload did: nothing (not loaded), ended the process, or waits for reads in flight."}});
    if let (Some(m), Some(a), Some(managed)) = (
        model.as_object_mut(),
        action.as_object_mut(),
        managed_properties().as_object(),
    ) {
        m.extend(managed.clone());
        a.extend(managed.clone());
    }
    let mut out = Map::new();
    out.insert("ModelList".into(), json!({"type": "object", "required": ["models"], "properties": {
        "models": {"type": "array", "items": {"type": "object", "required": ["name", "description", "release_date"], "properties": model}},
        "x_memory": {"type": "object", "description": "The memory budget the models this server runs share (absent when it runs none).",
                     "required": ["budget_bytes", "used_bytes", "overhead_bytes"],
                     "properties": {"budget_bytes": {"type": "integer", "minimum": 0},
                                    "used_bytes": {"type": "integer", "minimum": 0, "description": "Held by loaded and loading models: measured, else estimated."},
                                    "overhead_bytes": {"type": "integer", "minimum": 0}}},
        "x_calibration": {"type": "object"}}}));
    out.insert(
        "ModelAction".into(),
        json!({"type": "object", "required": ["name"], "properties": action}),
    );
    out.insert("ModelSettings".into(), settings_schema());
    out.insert("QualityReport".into(), quality_schema());
    out
}

/// A quality report as `scripts/quality.sh` stores it (docs/quality.md): what it must hold to be
/// served, the figures the console draws, and whatever else the script wrote.
fn quality_schema() -> Value {
    let estimate = json!({"type": "object", "description": "A figure (0-1) with its 95% bootstrap interval; null where it could not be computed.",
        "properties": {"value": {"type": ["number", "null"]}, "low": {"type": ["number", "null"]}, "high": {"type": ["number", "null"]},
                       "title": {"type": "string", "description": "A dimension's name in words."}}});
    let reference = json!({"type": "object", "description": "A reference model's score on the same subset, overall and per dimension.",
        "properties": {"value": {"type": ["number", "null"]}, "low": {"type": ["number", "null"]}, "high": {"type": ["number", "null"]},
                       "dimensions": {"type": "object", "additionalProperties": estimate}}});
    json!({"type": "object", "required": ["model", "fingerprint", "measured_at", "command"],
    "description": "The newest quality report of the model's current fingerprint, exactly as stored.",
    "properties": {
        "model": {"type": "string"},
        "fingerprint": {"type": "string", "description": "The x_fingerprint of the model measured: always the model's current one."},
        "measured_at": {"type": "string", "description": "When the measurement finished (UTC, RFC 3339)."},
        "command": {"type": "string", "description": "The command line that measured it."},
        "commit": {"type": "string", "description": "The commit of the repository the script ran from."},
        "requests": {"type": "integer", "minimum": 0},
        "errors": {"type": "integer", "minimum": 0},
        "error_list": {"type": "array", "items": {"type": "string"}},
        "score": estimate.clone(),
        "dimensions": {"type": "object", "additionalProperties": estimate.clone(), "description": "JevBench's score per dimension (REP, BAT, MEA, LOG, CHO)."},
        "floor": reference.clone(),
        "ceiling": reference,
        "accuracy": estimate.clone(),
        "ece": estimate,
        "labelled": {"type": "object", "description": "The labelled suite's figures, per remedy."},
        "suite": {"type": "object"}
    }})
}

/// The response every `/v1/systemone` (and admin load) answers for a model that can never fit.
pub fn insufficient_memory() -> Value {
    error("The model can never fit the memory budget (less what pinned models hold): detail names needed_bytes and budget_bytes (error_type insufficient_memory); a retry never helps")
}

/// `/v1/models` and the admin routes.
pub fn paths() -> Map<String, Value> {
    let admin = |summary: &str, extra: Value| {
        let mut responses = json!({
            "200": {"description": "The model after the action",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ModelAction"}}}},
            "401": error("Missing or wrong admin key (or API key)"),
            "403": error("Loading and unloading over HTTP are off (no --admin-key)"),
            "404": error("Unknown model"),
            "409": error("Not a model this server runs (an --accelerator or --upstream), (unload) a pinned or loading model, or (load) a model whose checkpoint was refused at load (its files or settings)"),
            "504": error("The request did not finish within the per-request timeout")
        });
        if let (Some(r), Some(e)) = (responses.as_object_mut(), extra.as_object()) {
            r.extend(e.clone());
        }
        json!({"post": {"summary": summary, "security": [{"bearer": [], "admin": []}],
                        "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"},
                                        "description": "The model's name or an alias (a name may hold a /, as org/name)."}],
                        "responses": responses}})
    };
    let mut paths = Map::new();
    paths.insert("/v1/models".into(), json!({"get": {
        "summary": "Served models and aliases (jev-latest is the default model); models this server runs say their state, sizes, TTL and last use (docs/models.md)",
        "security": [{"bearer": []}],
        "responses": {
            "200": {"description": "Models", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ModelList"}}}},
            "401": error("Missing or wrong bearer key (when API keys are configured)"),
            "504": error("The request did not finish within the per-request timeout")}}}));
    paths.insert("/v1/models/{name}/load".into(), admin(
        "Load a model now (admin key), evicting idle models to make room as a read would; answers once it is loaded",
        json!({"503": with_retry_after(error("Still loading after the wait, no room while every resident model is busy, or its load failed")),
               "507": insufficient_memory()})));
    paths.insert(
        "/v1/models/{name}/unload".into(),
        admin(
            "Unload a model (admin key): its process ends once its reads in flight have finished",
            json!({}),
        ),
    );
    paths.insert("/v1/models/{name}/settings".into(), settings_path());
    paths.insert("/v1/models/{name}/quality".into(), json!({"get": {
        "summary": "The newest quality report of the model's current fingerprint (scripts/quality.sh stores them in the quality directory; docs/quality.md)",
        "security": [{"bearer": []}],
        "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"},
                        "description": "The model's name or an alias (a name may hold a /, as org/name)."}],
        "responses": v1_responses(json!({
            "200": {"description": "The report, as stored", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/QualityReport"}}}},
            "404": error("Unknown model (error_type model_not_found); or (not_found) its fingerprint is not known yet (not loaded), no quality directory is known, or no report describes its current fingerprint: the message names the command that makes one")}))}}));
    paths
}

/// `PUT /v1/models/{name}/settings`.
fn settings_path() -> Value {
    json!({"put": {
        "summary": "Set a model's settings (admin key): validated, written to its models directory's hunch-models.toml (atomically), and applied: aliases, pinned, ttl, hidden and the read settings at once, dtype and sidecar_args at its next load",
        "security": [{"bearer": [], "admin": []}],
        "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"},
                        "description": "The model's name or an alias (a name may hold a /, as org/name)."}],
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ModelSettings"}}}},
        "responses": {
            "200": {"description": "The model with its new settings; x_applied says what applies now and what at its next load",
                    "content": {"application/json": {"schema": {"allOf": [{"$ref": "#/components/schemas/ModelAction"}, {"type": "object",
                        "required": ["x_settings_file", "x_applied"],
                        "properties": {"x_settings_file": {"type": "string"}, "x_applied": {"type": "string"}}}]}}}},
            "400": error("The body is not JSON"),
            "401": error("Missing or wrong admin key (or API key)"),
            "403": error("Settings over HTTP are off (no --admin-key)"),
            "404": error("Unknown model"),
            "409": error("Not a model of a --models-dir (a --model, an --accelerator or an --upstream), a model the budget can never hold pinned, or a settings file that cannot be written; nothing changed"),
            "422": {"description": "A setting that is unknown or has a bad value; loc names it", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ValidationError"}}}},
            "504": error("The request did not finish within the per-request timeout")}}})
}
