//! `/openapi.json` tells the truth about a real `hunch serve`:
//!
//! - each served policy is its own path with the input and output schemas it declares, and the
//!   paths follow deployments, reloads from the policy directory and removals;
//! - a property-based fuzzer (schemathesis, from `.venv-fuzz`, made by `scripts/fuzz-env.sh`) run
//!   against the document on a server with the real accelerator and the example policies finds no
//!   undocumented status, no 5xx, no response outside its documented schema or content type, and
//!   no route that ignores its API key. Deterministic, with a fixed number of examples
//!   per operation, so a CI run is reproducible and bounded.

use hunch::policy::testing::built_policy;
use hunch_e2e::http::{get_json, metric, send_json};
use hunch_e2e::{missing_prerequisite, start_hunch_real, start_hunch_with_fixture, workspace_root};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const ADMIN: &str = "openapi-admin-key";
const API_KEY: &str = "openapi-api-key";

/// The example policies, as (name served, crate file).
const EXAMPLES: [(&str, &str); 3] = [
    ("invoice-vat", "invoice_vat"),
    ("ticket-router", "ticket_router"),
    ("tool-firewall", "tool_firewall"),
];

fn install(dir: &Path, name: &str, crate_file: &str) {
    let wasm = built_policy(crate_file).expect("the policies build (wasm32-wasip2)");
    std::fs::write(dir.join(format!("{name}.wasm")), wasm).unwrap();
}

async fn document(url: &str) -> Value {
    get_json(&format!("{url}/openapi.json")).await
}

/// The served policies' own paths (`/v1/policies/NAME`, not the templated ones).
fn policy_paths(doc: &Value) -> Vec<String> {
    doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|p| p.starts_with("/v1/policies/") && !p.contains('{'))
        .cloned()
        .collect()
}

/// Polls the document until `ready` holds, for changes the directory watcher picks up.
async fn document_when(url: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let doc = document(url).await;
        if ready(&doc) || start.elapsed() > Duration::from_secs(30) {
            return doc;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn each_served_policy_is_a_path_that_follows_deploys_reloads_and_removals() {
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), "ticket-router", "ticket_router");
    let policies = dir.path().to_string_lossy().into_owned();
    let hunch = start_hunch_with_fixture(
        "dg-test",
        &["--policies", policies.as_str(), "--admin-key", ADMIN],
    )
    .await;
    let client = reqwest::Client::new();

    let doc = document(&hunch.url).await;
    assert_eq!(policy_paths(&doc), ["/v1/policies/ticket-router"]);
    // What `OPTIONS` says a path takes (`Allow`, on its 405) is what the document lists for it.
    for (documented, concrete) in [
        ("/v1/policies/ticket-router", "/v1/policies/ticket-router"),
        ("/v1/policies/{name}", "/v1/policies/no-such-policy"),
        (
            "/v1/policies/{name}/promote",
            "/v1/policies/ticket-router/promote",
        ),
        ("/v1/policies", "/v1/policies"),
        ("/v1/systemone", "/v1/systemone"),
        ("/v1/models", "/v1/models"),
        ("/v1/models/{name}/load", "/v1/models/dg-test/load"),
        ("/v1/models/{name}/unload", "/v1/models/dg-test/unload"),
        ("/v1/models/{name}/settings", "/v1/models/dg-test/settings"),
        ("/v1/models/{name}/quality", "/v1/models/dg-test/quality"),
        ("/openapi.json", "/openapi.json"),
    ] {
        let response = client
            .request(reqwest::Method::OPTIONS, format!("{}{concrete}", hunch.url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "OPTIONS {concrete}");
        let allow = response.headers()["allow"].to_str().unwrap().to_string();
        let mut allowed: Vec<String> = allow.split(',').map(|m| m.trim().to_lowercase()).collect();
        allowed.sort();
        let mut listed: Vec<String> = doc["paths"][documented]
            .as_object()
            .unwrap_or_else(|| panic!("{documented} is not documented"))
            .keys()
            .filter(|k| *k != "parameters")
            .cloned()
            .collect();
        listed.sort();
        assert_eq!(
            allowed, listed,
            "Allow of {concrete} ({allow}) against {documented}"
        );
    }
    let declared = get_json(&format!("{}/v1/policies/ticket-router", hunch.url)).await;
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["policy.ticket-router.input"],
        declared["input_schema"]
    );
    assert_eq!(
        schemas["policy.ticket-router.output"],
        declared["output_schema"]
    );
    let post = &doc["paths"]["/v1/policies/ticket-router"]["post"];
    assert_eq!(
        post["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/policy.ticket-router.input"
    );

    // Deployed over HTTP: a new path.
    let wasm = built_policy("tool_firewall").unwrap();
    let (status, _, body) = send_json(
        client
            .put(format!("{}/v1/policies/tool-firewall", hunch.url))
            .header("x-admin-key", ADMIN)
            .body(wasm),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        policy_paths(&document(&hunch.url).await),
        ["/v1/policies/ticket-router", "/v1/policies/tool-firewall"]
    );

    // Dropped into the watched directory: a new path once the reload loads it. The invoice
    // schema's `$defs` references resolve inside its component.
    install(dir.path(), "invoice-vat", "invoice_vat");
    let doc = document_when(&hunch.url, |d| policy_paths(d).len() == 3).await;
    assert_eq!(
        policy_paths(&doc),
        [
            "/v1/policies/invoice-vat",
            "/v1/policies/ticket-router",
            "/v1/policies/tool-firewall"
        ]
    );
    let invoice = &doc["components"]["schemas"]["policy.invoice-vat.input"];
    let supplier = invoice["properties"]["supplier"]["$ref"].as_str().unwrap();
    let pointer = supplier.strip_prefix('#').unwrap();
    assert!(doc.pointer(pointer).is_some(), "{supplier} dangles");

    // Removed over HTTP and from the directory: the paths go.
    let (status, _, body) = send_json(
        client
            .delete(format!("{}/v1/policies/tool-firewall", hunch.url))
            .header("x-admin-key", ADMIN),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    std::fs::remove_file(dir.path().join("invoice-vat.wasm")).unwrap();
    let doc = document_when(&hunch.url, |d| policy_paths(d).len() == 1).await;
    assert_eq!(policy_paths(&doc), ["/v1/policies/ticket-router"]);
    assert!(doc["components"]["schemas"]
        .get("policy.invoice-vat.input")
        .is_none());
}

/// `.venv-fuzz/bin/schemathesis`, or None after [`missing_prerequisite`] says what to do.
fn schemathesis() -> Option<PathBuf> {
    let bin = workspace_root().join(".venv-fuzz/bin/schemathesis");
    if bin.is_file() {
        return Some(bin);
    }
    missing_prerequisite(
        "fuzz",
        "schemathesis (.venv-fuzz)",
        "run scripts/fuzz-env.sh (scripts/setup.sh --test does)",
    );
    None
}

/// Examples per operation and phase: each successful policy run is one or two real forward
/// passes of the tiny model, so a few dozen keep the whole run to a few minutes on 2 cores.
const EXAMPLES_PER_OPERATION: u32 = 25;

#[tokio::test]
async fn the_fuzzer_finds_no_undocumented_status_and_no_5xx() {
    let Some(schemathesis) = schemathesis() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for (name, crate_file) in EXAMPLES {
        install(dir.path(), name, crate_file);
        // A policy's 10 s deadline (a server ceiling a policy file cannot raise) is a property
        // of the machine as much as of the request: a debug build reading a generated state of
        // several KiB on 2 busy cores can pass it, and the documented 504 would fail
        // `not_a_server_error` for a request that can succeed on a retry. A policy file may
        // tighten limits: states over 2 KiB become the deterministic, documented 422
        // (`limit: max_state_bytes`) and every read stays short.
        std::fs::write(
            dir.path().join(format!("{name}.toml")),
            "[limits]\nmax_state_bytes = 2048\n",
        )
        .unwrap();
    }
    let policies = dir.path().to_string_lossy().into_owned();
    // The admin key is never given to the fuzzer: it must not deploy or remove anything, and
    // every admin route must refuse it with a documented 401.
    let hunch = start_hunch_real(&[
        "--policies",
        policies.as_str(),
        "--admin-key",
        ADMIN,
        "--api-key",
        API_KEY,
    ])
    .await;
    let work = tempfile::tempdir().unwrap();
    let output = Command::new(&schemathesis)
        .current_dir(work.path())
        .arg("run")
        .arg(format!("{}/openapi.json", hunch.url))
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_headers_conformance,response_schema_conformance,ignored_auth",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            &EXAMPLES_PER_OPERATION.to_string(),
            // The very same requests on every run (schemathesis then uses no random seed).
            "--generation-deterministic",
            "--workers",
            "1",
            "--request-timeout",
            "120",
            "--no-color",
            // A failure's `curl` line whole, so it can be replayed.
            "--output-truncate",
            "false",
            "--header",
            &format!("Authorization: Bearer {API_KEY}"),
        ])
        .output()
        .expect("schemathesis runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{report}");
    assert!(
        output.status.success(),
        "schemathesis found a mismatch between the server and /openapi.json (report above); \
         server logs:\n{}",
        hunch.process.logs()
    );
    // The fuzzer got past validation to real reads and real policy runs, not only refusals.
    for route in ["/v1/systemone", "/v1/policies/{name}"] {
        let answered: u64 = metric(
            &hunch.url,
            &format!("hunch_http_requests_total{{route=\"{route}\",status=\"200\"}}"),
        )
        .await;
        assert!(answered > 0, "no 200 from {route} during the fuzzer run");
    }
    let _ = std::fs::remove_dir_all(Path::new(work.path()));
}
