//! Decision policies end to end: a real `hunch serve --policies DIR --admin-key K` (with the
//! fixture sidecar as its reader) over HTTP — the example policies deciding, hostile policies
//! stopped by the limit they break while the server keeps serving, hot reload under load,
//! refusal of a broken file, deployments over HTTP.

use hunch::policy::testing::{built_policy, fresh_version};
use hunch_e2e::http::{get_json, send_json};
use hunch_e2e::{start_hunch_with_fixture, Hunch};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ADMIN: &str = "e2e-admin-key";

fn install(dir: &Path, name: &str, crate_file: &str, toml: Option<&str>) {
    let wasm = built_policy(crate_file).expect("the policies build (wasm32-wasip2)");
    std::fs::write(dir.join(format!("{name}.wasm")), wasm).unwrap();
    if let Some(t) = toml {
        std::fs::write(dir.join(format!("{name}.toml")), t).unwrap();
    }
}

async fn server(dir: &Path) -> Hunch {
    let dir = dir.to_string_lossy().into_owned();
    start_hunch_with_fixture(
        "dg-test",
        &["--policies", dir.as_str(), "--admin-key", ADMIN],
    )
    .await
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let (status, _, body) = send_json(client.post(url).json(body)).await;
    (status, body)
}

/// A server with the hostile policy installed in `dir` as `p`: the server, `p`'s URL and the
/// version it serves.
async fn serving_hostile(dir: &Path) -> (Hunch, String, String) {
    install(dir, "p", "hostile", None);
    let hunch = server(dir).await;
    let url = format!("{}/v1/policies/p", hunch.url);
    let (_, first) = post(&reqwest::Client::new(), &url, &json!({"attack": "none"})).await;
    let version = first["version"].as_str().unwrap().to_string();
    (hunch, url, version)
}

fn examples() -> Vec<(&'static str, Value)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies");
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(root.join(f)).unwrap()).unwrap()
    };
    vec![
        ("invoice-vat", read("invoice.json")),
        ("tool-firewall", read("tool-call.json")),
        ("ticket-router", read("ticket.json")),
    ]
}

#[tokio::test]
async fn example_policies_decide_real_inputs_over_http() {
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), "invoice-vat", "invoice_vat", None);
    install(dir.path(), "tool-firewall", "tool_firewall", None);
    install(dir.path(), "ticket-router", "ticket_router", None);
    let hunch = server(dir.path()).await;
    let client = reqwest::Client::new();

    let list = get_json(&format!("{}/v1/policies", hunch.url)).await;
    let names: Vec<&str> = list["policies"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["invoice-vat", "ticket-router", "tool-firewall"]);
    for p in list["policies"].as_array().unwrap() {
        assert_eq!(p["version"].as_str().unwrap().len(), 16);
        assert!(p["input_schema"].is_object());
        assert_eq!(p["last_reload"]["ok"], true);
        assert!(p["limits"]["fuel"].as_u64().unwrap() > 0);
    }

    for (name, input) in examples() {
        let (status, body) = post(
            &client,
            &format!("{}/v1/policies/{name}", hunch.url),
            &input,
        )
        .await;
        assert_eq!(status, 200, "{name}: {body}");
        assert_eq!(body["policy"], name);
        assert!(body["version"].is_string());
        let reads = body["reads"].as_array().unwrap();
        assert!(!reads.is_empty(), "{name}: {body}");
        for r in reads {
            assert!(r["answers"].is_array(), "{name}: {r}");
            assert!(r["questions"].as_array().unwrap().len() >= 2);
        }
        assert!(body["usage"]["input_tokens"].as_u64().unwrap() > 0);
        assert!(body["timings"]["total_ms"].as_f64().unwrap() > 0.0);
        let output = &body["output"];
        match name {
            "invoice-vat" => assert!(
                ["approve", "hold", "reject"].contains(&output["decision"].as_str().unwrap())
            ),
            "tool-firewall" => {
                assert!(["allow", "ask", "block"].contains(&output["action"].as_str().unwrap()))
            }
            _ => {
                assert!(output["team"].is_string());
                assert_eq!(output["reads"].as_u64().unwrap() as usize, reads.len());
            }
        }
        eprintln!("{name}: {output}");
    }

    // The input schema is enforced before the policy runs.
    let (status, body) = post(
        &client,
        &format!("{}/v1/policies/invoice-vat", hunch.url),
        &json!({"lines": []}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["detail"]["error_type"], "invalid_input");
    let (status, _) = post(
        &client,
        &format!("{}/v1/policies/nope", hunch.url),
        &json!({}),
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn hostile_policies_are_stopped_by_the_limit_they_break_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    install(
        dir.path(),
        "hostile",
        "hostile",
        Some("[limits]\nfuel = 500000000\nmemory_bytes = 33554432\nmax_reads = 16\nmax_output_bytes = 1048576\ntimeout_ms = 5000\n"),
    );
    let hunch = server(dir.path()).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/policies/hostile", hunch.url);
    let cases = [
        ("loop", 422, "limit_exceeded", Some("fuel")),
        ("memory", 422, "limit_exceeded", Some("memory")),
        ("recursion", 422, "limit_exceeded", Some("stack")),
        ("output", 422, "limit_exceeded", Some("output_size")),
        ("reads", 422, "limit_exceeded", Some("reads")),
        ("trap", 500, "policy_trapped", None),
        ("env", 500, "policy_forbidden_capability", None),
        ("file", 500, "policy_forbidden_capability", None),
    ];
    for (attack, status, kind, limit) in cases {
        let started = Instant::now();
        let (got, body) = post(&client, &url, &json!({"attack": attack, "bytes": 4 << 20})).await;
        assert_eq!(got, status, "{attack}: {body}");
        assert_eq!(body["detail"]["error_type"], kind, "{attack}: {body}");
        if let Some(limit) = limit {
            assert_eq!(body["detail"]["limit"], limit, "{attack}: {body}");
            assert!(body["detail"]["message"].as_str().unwrap().contains(limit));
        }
        eprintln!(
            "{attack}: {got} in {:?}: {}",
            started.elapsed(),
            body["detail"]["message"]
        );
        // The host is unharmed: the next request is served.
        let (ok, echo) = post(&client, &url, &json!({"attack": "none"})).await;
        assert_eq!(ok, 200, "after {attack}: {echo}");
        assert_eq!(echo["output"]["echo"]["attack"], "none");
    }
    let health = client
        .get(format!("{}/healthz", hunch.url))
        .send()
        .await
        .unwrap();
    assert!(health.status().is_success());
}

#[tokio::test]
async fn a_policy_replaced_on_disk_is_served_with_no_failed_request_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let (_hunch, url, old) = serving_hostile(dir.path()).await;
    let client = reqwest::Client::new();

    let new_wasm = fresh_version("hostile", "e2e").unwrap();
    let new = hunch::policy::invoke::content_hash(&new_wasm);

    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU32::new(0));
    let served_new_at: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    // One client hammering back to back.
    let hammer = {
        let (client, url, stop, failed, served_new_at, new) = (
            client.clone(),
            url.clone(),
            stop.clone(),
            failed.clone(),
            served_new_at.clone(),
            new.clone(),
        );
        tokio::spawn(async move {
            let mut ok = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let (status, body) = post(&client, &url, &json!({"attack": "none"})).await;
                if status != 200 {
                    eprintln!("failed during reload: {status} {body}");
                    failed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                ok += 1;
                if body["version"] == new.as_str() {
                    let mut at = served_new_at.lock().unwrap();
                    at.get_or_insert_with(Instant::now);
                }
            }
            ok
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tmp = dir.path().join("p.wasm.part");
    std::fs::write(&tmp, &new_wasm).unwrap();
    let written = Instant::now();
    std::fs::rename(&tmp, dir.path().join("p.wasm")).unwrap();
    // How fast is for the benchmark (`host/benches/policy_overhead.rs`); this bounds only the
    // wait for a reload that never comes.
    while written.elapsed() < Duration::from_secs(60) && served_new_at.lock().unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let ok = hammer.await.unwrap();
    let at = served_new_at
        .lock()
        .unwrap()
        .expect("the new version was never served");
    let took = at.duration_since(written);
    eprintln!(
        "new version served {took:?} after the write; {ok} requests ok, {} failed",
        failed.load(Ordering::Relaxed)
    );
    assert_ne!(old, new);
    assert_eq!(failed.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_broken_wasm_is_refused_and_the_old_version_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (hunch, url, good) = serving_hostile(dir.path()).await;
    let client = reqwest::Client::new();

    std::fs::write(
        dir.path().join("p.wasm"),
        b"\0asm\x0d\0\x01\0 definitely not a component",
    )
    .unwrap();
    let started = Instant::now();
    let status = loop {
        let s = get_json(&url).await;
        if s["last_reload"]["ok"] == false {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never refused: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status["version"], good.as_str());
    assert!(
        status["last_reload"]["error"]
            .as_str()
            .unwrap()
            .contains("not a valid policy component"),
        "{status}"
    );
    let (code, body) = post(&client, &url, &json!({"attack": "none"})).await;
    assert_eq!(code, 200);
    assert_eq!(body["version"], good.as_str());
    assert!(hunch.process.logs().contains("policy refused"));
}

#[tokio::test]
async fn deployments_over_http_need_the_admin_key() {
    let dir = tempfile::tempdir().unwrap();
    let hunch = server(dir.path()).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/policies/router", hunch.url);
    let wasm = built_policy("ticket_router").unwrap();

    let r = client.put(&url).body(wasm.clone()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client
        .put(&url)
        .header("x-admin-key", "wrong")
        .body(wasm.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client
        .put(&url)
        .header("x-admin-key", ADMIN)
        .body(b"garbage".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    assert!(!dir.path().join("router.wasm").exists());

    let r = client
        .put(format!("{url}?max_reads=1"))
        .header("x-admin-key", ADMIN)
        .body(wasm.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let summary: Value = r.json().await.unwrap();
    assert_eq!(summary["limits"]["max_reads"], 1);
    assert!(dir.path().join("router.wasm").exists());

    // max_reads = 1: a ticket that needs its second read breaks the limit; the first read works.
    let (status, body) = post(
        &client,
        &url,
        &json!({"subject": "Hi", "body": "Where is my invoice?"}),
    )
    .await;
    assert!(
        status == 200 || (status == 422 && body["detail"]["limit"] == "reads"),
        "{status} {body}"
    );

    let r = client
        .put(&url)
        .header("x-admin-key", ADMIN)
        .body(wasm)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = client.delete(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client
        .delete(&url)
        .header("x-admin-key", ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let (status, _) = post(&client, &url, &json!({"subject": "x", "body": "y"})).await;
    assert_eq!(status, 404);
    assert!(!dir.path().join("router.wasm").exists());
}
