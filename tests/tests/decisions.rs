//! Decision records end to end (docs/decision-records.md): decision ids, the decision log with
//! every read, `hunch replay` (no changes against the writing version, exactly the flips of a
//! changed version, torn lines), shadow and canary candidates, promote/rollback across a
//! restart, and sinks that fail without failing requests.
//!
//! The log-and-replay test runs on the real accelerator (tiny checkpoint); the rest use the
//! fixture sidecar, which answers instantly.

use hunch::policy::testing::{built_policy, with_marker};
use hunch_e2e::http::{get_json, json_of, metric, post_json};
use hunch_e2e::{hunch_bin, start_hunch_real, start_hunch_with_fixture, Hunch};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const ADMIN: &str = "e2e-admin-key";

fn probe(version: u32) -> Vec<u8> {
    let crate_file = if version == 1 {
        "replay_probe"
    } else {
        "replay_probe_v2"
    };
    built_policy(crate_file).expect("the policies build (wasm32-wasip2)")
}

fn message(i: usize) -> Value {
    let texts = [
        "The production database is down and customers cannot pay.",
        "Thanks for the lovely flowers last week!",
        "Could you send me the invoice for March when you have a minute?",
        "URGENT: our account was charged twice, please refund today.",
        "Lunch on Friday?",
        "The build has been failing since this morning, release is blocked.",
        "Reminder: the newsletter goes out next month.",
        "Security alert: someone logged in from an unknown device.",
    ];
    json!({"id": i, "message": texts[i % texts.len()]})
}

/// The events in `path` once it holds at least `n` lines (the file sink writes in the
/// background).
async fn events(path: &Path, n: usize) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let events: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if events.len() >= n {
            return events;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} holds {} events, wanted {n}",
            path.display(),
            events.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn replay(args: &[&str]) -> Value {
    let out = Command::new(hunch_bin())
        .arg("replay")
        .args(args)
        .arg("--json")
        .output()
        .expect("hunch replay runs");
    assert!(
        out.status.success(),
        "hunch replay failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn write(dir: &Path, file: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A temporary folder with `probe` v1 in its policy directory `p/`, and where its decision log
/// goes: (the folder, which must outlive the test's server, the log, the policy directory).
fn probe_policies() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("decisions.ndjson");
    let policies = dir.path().join("p");
    std::fs::create_dir(&policies).unwrap();
    write(&policies, "probe.wasm", &probe(1));
    (dir, log, policies)
}

/// `probe` deciding `message(i)` on the server at `url`: status, headers, body.
async fn decide(url: &str, i: usize) -> (u16, reqwest::header::HeaderMap, Value) {
    post_json(&format!("{url}/v1/policies/probe"), &message(i), &[]).await
}

/// The sample System One request to the server at `url`: status, headers, body.
async fn systemone(url: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    post_json(
        &format!("{url}/v1/systemone"),
        &hunch_e2e::sample_request(),
        &[],
    )
    .await
}

/// One System One decision, which must be answered 200 (`n` names it in a failure).
async fn ask_a_question(url: &str, n: usize) {
    let (s, _, body) = systemone(url).await;
    assert_eq!(s, 200, "request {n}: {body}");
}

fn sha256(bytes: &[u8]) -> String {
    hunch::decision::event::sha256_hex(bytes)
}

#[tokio::test]
async fn the_real_model_logs_every_read_and_replay_reproduces_or_names_every_flip() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    let v1 = probe(1);
    let v1_path = write(&policies, "probe.wasm", &v1);
    let v2_path = write(dir.path(), "probe-v2.wasm", &probe(2));
    let log = dir.path().join("decisions.ndjson");
    let (p, l) = (policies.display().to_string(), log.display().to_string());
    let hunch = start_hunch_real(&["--policies", &p, "--decision-log", &l]).await;

    let n = 8;
    let mut ids = Vec::new();
    for i in 0..n {
        let rid = format!("client-{i}");
        let (status, headers, body) = post_json(
            &format!("{}/v1/policies/probe", hunch.url),
            &message(i),
            &[("x-request-id", rid.as_str())],
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let id = headers["x-hunch-decision-id"].to_str().unwrap().to_string();
        assert_eq!(body["decision_id"], id.as_str());
        ids.push((id, body["output"].clone()));
    }
    let (status, headers, _) = systemone(&hunch.url).await;
    assert_eq!(status, 200);
    let raw_id = headers["x-hunch-decision-id"].to_str().unwrap().to_string();

    let all = events(&log, n + 1).await;
    // The model's identity has one owner: the fingerprint the sidecar reports, which `/v1/models`
    // shows and every event records.
    let models = get_json(&format!("{}/v1/models", hunch.url)).await;
    let fingerprint = models["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == hunch_e2e::TINY_MODEL)
        .map(|m| m["x_fingerprint"].clone())
        .unwrap();
    assert!(
        fingerprint
            .as_str()
            .is_some_and(|f| f.contains(hunch_core::READ_ALGORITHM_VERSION)),
        "{models}"
    );
    let policy_events: Vec<&Value> = all.iter().filter(|e| e["policy"].is_object()).collect();
    assert_eq!(policy_events.len(), n);
    let mut expected_flips = Vec::new();
    for (e, (id, output)) in policy_events.iter().zip(&ids) {
        assert_eq!(&e["decision_id"], id.as_str());
        assert!(e["client_request_id"]
            .as_str()
            .unwrap()
            .starts_with("client-"));
        assert_eq!(e["policy"]["sha256"], sha256(&v1));
        assert_eq!(e["policy"]["stage"], "active");
        assert_eq!(e["model"]["name"], hunch_e2e::TINY_MODEL);
        assert_eq!(e["model"]["fingerprint"], fingerprint, "{}", e["model"]);
        assert_eq!(e["read_algorithm"], hunch_core::READ_ALGORITHM_VERSION);
        assert_eq!(&e["result"], output);
        let reads = e["reads"].as_array().unwrap();
        assert_eq!(reads.len(), 1, "one read of two questions");
        let r = &reads[0];
        assert_eq!(r["state"], e["input"]["message"]);
        assert_eq!(r["questions"].as_array().unwrap().len(), 2);
        let d = r["distributions"].as_array().unwrap();
        let p: Vec<f64> = d.iter().map(|q| q[0].as_f64().unwrap()).collect();
        for q in d {
            let sum: f64 = q
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .sum();
            assert!((sum - 1.0).abs() < 1e-6, "{q}");
        }
        assert!(r["stats"]["draws"].as_u64().unwrap() >= 1);
        // What replay against v2 must find: the decisions whose rule flips.
        if (p[0] >= 0.5) != (p[0] >= p[1]) {
            expected_flips.push(id.clone());
        }
    }
    let raw = all
        .iter()
        .find(|e| e["decision_id"] == raw_id.as_str())
        .unwrap();
    assert_eq!(raw["route"], "/v1/systemone");
    assert_eq!(
        raw["reads"][0]["distributions"].as_array().unwrap().len(),
        3
    );
    drop(hunch);

    // A crash tore the last line: the rest still replays.
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str("{\"decision_id\": \"torn");
    std::fs::write(&log, text).unwrap();

    let same = replay(&[
        "--log",
        &l,
        "--policy",
        &format!("probe={}", v1_path.display()),
    ]);
    assert_eq!(same["decisions"], n);
    assert_eq!(same["changed"], 0, "{same}");
    assert_eq!(same["not_replayable"], 0, "{same}");
    assert_eq!(same["skipped_lines"], 1);

    let changed = replay(&[
        "--log",
        &l,
        "--policy",
        &format!("probe={}", v2_path.display()),
        "--samples",
        "100",
    ]);
    assert_eq!(changed["decisions"], n);
    assert_eq!(changed["changed"], expected_flips.len(), "{changed}");
    let mut found: Vec<String> = changed["samples"]["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    found.sort();
    expected_flips.sort();
    assert_eq!(found, expected_flips);
    if !expected_flips.is_empty() {
        assert_eq!(changed["fields"], json!({"/urgent": expected_flips.len()}));
    }
    eprintln!("v1 -> v2 flips {} of {n} decisions", expected_flips.len());
}

async fn fixture_server(dir: &Path, log: &Path, extra: &[&str]) -> Hunch {
    let (d, l) = (dir.display().to_string(), log.display().to_string());
    let mut args = vec![
        "--policies",
        d.as_str(),
        "--admin-key",
        ADMIN,
        "--decision-log",
        l.as_str(),
    ];
    args.extend_from_slice(extra);
    start_hunch_with_fixture("dg-test", &args).await
}

/// A decision answered from the answer cache is recorded with every read, the cached answers
/// included (the cache sits below the recorder), so `hunch replay` replays it without a server.
#[tokio::test]
async fn a_decision_answered_from_the_cache_replays_without_a_server() {
    let (dir, log, policies) = probe_policies();
    let hunch = fixture_server(&policies, &log, &["--answer-cache-mb", "64"]).await;
    for _ in 0..2 {
        let (status, _, body) = decide(&hunch.url, 3).await;
        assert_eq!(status, 200, "{body}");
    }
    let all = events(&log, 2).await;
    drop(hunch);
    // The second decision's two questions both came from the cache, and its record holds them.
    let read = &all[1]["reads"][0];
    assert_eq!(read["stats"]["answer_cache_hits"], 2, "{}", all[1]);
    assert_eq!(read["distributions"], all[0]["reads"][0]["distributions"]);
    let l = log.display().to_string();
    let v1 = write(dir.path(), "probe-v1.wasm", &probe(1));
    let replayed = replay(&["--log", &l, "--policy", &format!("probe={}", v1.display())]);
    assert_eq!(replayed["decisions"], 2, "{replayed}");
    assert_eq!(replayed["not_replayable"], 0, "{replayed}");
    assert_eq!(replayed["changed"], 0, "{replayed}");
}

/// With the decision log on, every read goes through a recording wrapper: the model's limits and
/// fingerprint must still reach the host's checks and the answer cache through it.
#[tokio::test]
async fn with_a_decision_log_the_models_limits_and_the_answer_cache_still_apply() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("decisions.ndjson");
    let policies = dir.path().join("p");
    std::fs::create_dir(&policies).unwrap();
    write(&policies, "probe.wasm", &probe(1));
    let (p, l) = (policies.display().to_string(), log.display().to_string());
    let model = format!("dg-test={}", std::env::temp_dir().display());
    let hunch = hunch_e2e::start_hunch_with(
        &[
            "--model",
            model.as_str(),
            "--policies",
            p.as_str(),
            "--decision-log",
            l.as_str(),
            "--answer-cache-mb",
            "64",
        ],
        &[
            (
                "HUNCH_ACCELERATOR_BIN",
                hunch_e2e::fixture_sidecar_bin()
                    .to_string_lossy()
                    .into_owned(),
            ),
            ("FIXTURE_LOAD_MS", "0".into()),
            // A context of 50 tokens of at most 4 bytes: a 1000-byte state can never fit.
            ("FIXTURE_MAX_PROMPT_TOKENS", "50".into()),
        ],
    );
    hunch_e2e::wait_ready(&hunch.url, Duration::from_secs(30)).await;

    // The same isolated question twice: the second answer comes from the cache.
    let ask = json!({"model": "dg-test", "state": "short",
                     "questions": {"q": {"type": "noul", "instructions": "Is it short?"}}});
    let url = format!("{}/v1/systemone", hunch.url);
    let (status, headers, first) = post_json(&url, &ask, &[]).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(headers["x-hunch-answer-cache-hits"], "0");
    let (status, headers, again) = post_json(&url, &ask, &[]).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(headers["x-hunch-answer-cache-hits"], "1");
    assert_eq!(first["answers"], again["answers"]);
    assert_eq!(
        metric::<u64>(&hunch.url, "hunch_answer_cache_hits_total").await,
        1
    );

    // A policy read the model can never take is refused by the host (4xx), never sent.
    let (status, _, body) = post_json(
        &format!("{}/v1/policies/probe", hunch.url),
        &json!({"id": 1, "message": "x".repeat(1000)}),
        &[],
    )
    .await;
    assert!((400..500).contains(&status), "{status}: {body}");
    assert_eq!(
        metric::<u64>(
            &hunch.url,
            "hunch_reads_total{model=\"dg-test\",outcome=\"too_large\"}"
        )
        .await,
        0,
        "the read reached the sidecar"
    );
    let all = events(&log, 3).await;
    let refused = all
        .iter()
        .find(|e| e["policy"].is_object())
        .expect("the policy decision's event");
    assert_eq!(refused["status"], status);
    assert_eq!(refused["reads"], json!([]), "{refused}");
    // Events name the model by the fingerprint it reports, the one the cache keys on.
    assert_eq!(
        all[0]["model"]["fingerprint"],
        format!("fixture/dg-test/{}", hunch_core::READ_ALGORITHM_VERSION)
    );
}

async fn put_candidate(client: &reqwest::Client, url: &str, query: &str, wasm: Vec<u8>) -> Value {
    let r = client
        .put(format!("{url}/v1/policies/probe?stage=candidate&{query}"))
        .header("x-admin-key", ADMIN)
        .body(wasm)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert!(status.is_success(), "{status}: {body}");
    body
}

fn without_ids(mut body: Value) -> Value {
    for k in ["decision_id", "timings", "fuel_used"] {
        body.as_object_mut().unwrap().remove(k);
    }
    for r in body["reads"].as_array_mut().into_iter().flatten() {
        r.as_object_mut().unwrap().remove("elapsed_ms");
    }
    body
}

#[tokio::test]
async fn a_shadow_candidate_never_changes_the_active_answer_and_its_agreement_matches_the_log() {
    let (_dir, log, policies) = probe_policies();
    let hunch = fixture_server(&policies, &log, &[]).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/policies/probe", hunch.url);
    let n = 6;

    let mut alone = Vec::new();
    for i in 0..n {
        let (s, _, body) = post_json(&url, &message(i), &[]).await;
        assert_eq!(s, 200);
        alone.push(without_ids(body));
    }
    // A candidate that breaks a limit (no reads allowed; describe reads nothing, so it deploys,
    // and every decide fails): the active answers must not notice.
    put_candidate(&client, &hunch.url, "mode=shadow&max_reads=0", probe(2)).await;
    for (i, expected) in alone.iter().enumerate() {
        let (s, _, body) = post_json(&url, &message(i), &[]).await;
        assert_eq!(s, 200);
        assert_eq!(&without_ids(body), expected);
    }
    let shadow_events = events(&log, 3 * n).await;
    let failed = shadow_events
        .iter()
        .filter(|e| e["shadow_of"].is_string())
        .count();
    assert_eq!(failed, n);
    assert!(shadow_events
        .iter()
        .filter(|e| e["shadow_of"].is_string())
        .all(|e| e["error"]["kind"] == "limit_exceeded" && e["limits_hit"][0]["limit"] == "reads"));
    assert_eq!(
        metric::<u64>(
            &hunch.url,
            "hunch_policy_shadow_total{policy=\"probe\",agreement=\"candidate_error\"}"
        )
        .await,
        n as u64
    );

    // A working candidate (v2): agreement counted per policy matches what the log says.
    put_candidate(&client, &hunch.url, "mode=shadow", probe(2)).await;
    let before = std::fs::read_to_string(&log).unwrap().lines().count();
    for (i, expected) in alone.iter().enumerate() {
        let (s, _, body) = post_json(&url, &message(i), &[]).await;
        assert_eq!(s, 200);
        assert_eq!(&without_ids(body), expected);
    }
    let all = events(&log, before + 2 * n).await;
    let recent = &all[before..];
    let mut agree = 0;
    for shadow in recent.iter().filter(|e| e["shadow_of"].is_string()) {
        assert_eq!(shadow["policy"]["stage"], "candidate");
        let active = recent
            .iter()
            .find(|e| e["decision_id"] == shadow["shadow_of"])
            .expect("the active event of a shadow run");
        // Shared reads were answered from the active decision's record.
        assert_eq!(
            shadow["reads"][0]["distributions"],
            active["reads"][0]["distributions"]
        );
        if shadow["result"] == active["result"] {
            agree += 1;
        }
    }
    let summary = get_json(&url).await;
    assert_eq!(summary["mode"], "shadow");
    assert_eq!(summary["agreement"]["shadowed"], n);
    assert_eq!(summary["agreement"]["agree"], agree);
    assert_eq!(
        metric::<u64>(
            &hunch.url,
            "hunch_policy_shadow_total{policy=\"probe\",agreement=\"agree\"}"
        )
        .await,
        agree as u64
    );
}

#[tokio::test]
async fn canary_routes_a_stable_share_and_promote_and_rollback_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("decisions.ndjson");
    let policies = dir.path().join("p");
    std::fs::create_dir(&policies).unwrap();
    let v1 = probe(1);
    write(&policies, "probe.wasm", &v1);
    let hunch = fixture_server(&policies, &log, &[]).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/policies/probe", hunch.url);
    let candidate = with_marker(probe(1), "canary");
    put_candidate(
        &client,
        &hunch.url,
        "mode=canary&percent=30",
        candidate.clone(),
    )
    .await;
    assert!(policies.join("probe.candidate.wasm").is_file());

    // 200 fixed keys at 30 %: the share must be within 30 % ± 8 points (about 3.5 standard
    // deviations of a binomial share), and a key always gets the same version.
    let keys = 200;
    let mut to_candidate = 0;
    let (mut decided, mut by_candidate) = (0, 0);
    for k in 0..keys {
        let key = format!("customer-{k}");
        let (s, _, body) =
            post_json(&url, &message(k), &[("x-hunch-route-key", key.as_str())]).await;
        assert_eq!(s, 200, "{body}");
        let stage = body["stage"].as_str().unwrap().to_string();
        decided += 1;
        if stage == "candidate" {
            to_candidate += 1;
            by_candidate += 1;
        }
        if k % 20 == 0 {
            let (_, _, again) =
                post_json(&url, &message(k), &[("x-hunch-route-key", key.as_str())]).await;
            assert_eq!(again["stage"], stage.as_str(), "key {key} moved");
            decided += 1;
            by_candidate += usize::from(stage == "candidate");
        }
    }
    let share = to_candidate as f64 / keys as f64;
    assert!((0.22..=0.38).contains(&share), "canary share {share}");
    let summary = get_json(&url).await;
    assert_eq!(summary["mode"], "canary");
    assert_eq!(summary["agreement"]["decided_by_candidate"], by_candidate);
    assert_eq!(
        summary["agreement"]["decided_by_active"],
        decided - by_candidate
    );

    // Promote: the candidate serves, the old version is kept for a rollback; both survive a
    // restart because they are files.
    let promoted = json_of(
        client
            .post(format!("{url}/promote"))
            .header("x-admin-key", ADMIN),
    )
    .await;
    let candidate_version = hunch::policy::invoke::content_hash(&candidate);
    let v1_version = hunch::policy::invoke::content_hash(&v1);
    assert_eq!(promoted["version"], candidate_version.as_str());
    assert_eq!(promoted["previous_version"], v1_version.as_str());
    assert_eq!(promoted["mode"], "off");
    assert_eq!(
        std::fs::read(policies.join("probe.wasm")).unwrap(),
        candidate
    );
    drop(hunch);
    let hunch = fixture_server(&policies, &log, &[]).await;
    let summary = get_json(&format!("{}/v1/policies/probe", hunch.url)).await;
    assert_eq!(summary["version"], candidate_version.as_str());
    let rolled = json_of(
        client
            .post(format!("{}/v1/policies/probe/rollback", hunch.url))
            .header("x-admin-key", ADMIN),
    )
    .await;
    assert_eq!(rolled["version"], v1_version.as_str());
    drop(hunch);
    let hunch = fixture_server(&policies, &log, &[]).await;
    let summary = get_json(&format!("{}/v1/policies/probe", hunch.url)).await;
    assert_eq!(summary["version"], v1_version.as_str());
    // Nothing to roll back to any more, and promoting needs a candidate: 409s, not 5xx.
    for action in ["rollback", "promote"] {
        let r = client
            .post(format!("{}/v1/policies/probe/{action}", hunch.url))
            .header("x-admin-key", ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 409, "{action}");
    }
}

/// A collector that answers every POST with `status`, or never answers (`None`).
async fn collector(status: Option<u16>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let app = axum::Router::new().route(
            "/",
            axum::routing::post(move || async move {
                match status {
                    Some(s) => axum::http::StatusCode::from_u16(s).unwrap(),
                    None => {
                        std::future::pending::<()>().await;
                        axum::http::StatusCode::OK
                    }
                }
            }),
        );
        let _ = axum::serve(listener, app).await;
    });
    url
}

#[tokio::test]
async fn failing_sinks_never_fail_requests_and_count_what_they_drop() {
    let (dir, _, policies) = probe_policies();
    let unwritable = dir.path().join("no-such-dir").join("decisions.ndjson");

    // An unwritable file and a collector that refuses: requests answer, drops are counted.
    let refusing = collector(Some(400)).await;
    let hunch = fixture_server(&policies, &unwritable, &["--decision-log-url", &refusing]).await;
    for i in 0..3 {
        let (s, h, _) = decide(&hunch.url, i).await;
        assert_eq!(s, 200);
        assert!(h.contains_key("x-hunch-decision-id"));
    }
    let start = Instant::now();
    while metric::<u64>(
        &hunch.url,
        "hunch_decision_events_dropped_total{sink=\"http\"",
    )
    .await
        < 3
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "http drops not counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric::<u64>(
            &hunch.url,
            "hunch_decision_events_dropped_total{sink=\"file\",cause=\"open_failed\"}"
        )
        .await,
        3
    );
    drop(hunch);

    // A collector that hangs, with room for 2 events: requests keep answering at once while the
    // sink's one POST hangs, and what does not fit in its queue is dropped and counted. (The
    // sink gathers events for a moment before it sends, so keep asking until it is stuck.)
    let hanging = collector(None).await;
    let hunch = fixture_server(
        &policies,
        &dir.path().join("ok.ndjson"),
        &["--decision-log-url", &hanging, "--decision-log-buffer", "2"],
    )
    .await;
    let mut sent = 0;
    loop {
        ask_a_question(&hunch.url, sent).await;
        sent += 1;
        let dropped = metric::<u64>(
            &hunch.url,
            "hunch_decision_events_dropped_total{sink=\"http\",cause=\"buffer_full\"}",
        )
        .await;
        if dropped > 0 {
            break;
        }
        assert!(
            sent < 500,
            "a hanging collector with a 2-event queue dropped nothing"
        );
    }
    // The file sink beside it lost nothing.
    assert_eq!(
        events(&dir.path().join("ok.ndjson"), sent).await.len(),
        sent
    );
    drop(hunch);

    // The collector's buffer is bounded in bytes too: with room for 10 000 events but only
    // 4 KiB, a hanging collector makes the sink drop within a few events.
    let hunch = fixture_server(
        &policies,
        &dir.path().join("ok2.ndjson"),
        &[
            "--decision-log-url",
            &hanging,
            "--decision-log-buffer-bytes",
            "4096",
        ],
    )
    .await;
    let mut sent = 0;
    while metric::<u64>(
        &hunch.url,
        "hunch_decision_events_dropped_total{sink=\"http\",cause=\"buffer_full\"}",
    )
    .await
        == 0
    {
        ask_a_question(&hunch.url, sent).await;
        sent += 1;
        assert!(sent < 100, "a 4 KiB buffer took {sent} events");
    }
    drop(hunch);

    // Required: a decision that cannot be recorded is a 503, never an unrecorded answer.
    let hunch = fixture_server(&policies, &unwritable, &["--decision-log-required"]).await;
    let (s, h, body) = decide(&hunch.url, 0).await;
    assert_eq!(s, 503, "{body}");
    assert!(h.contains_key("x-hunch-decision-id"));
    let (s, _, _) = systemone(&hunch.url).await;
    assert_eq!(s, 503);
}

/// Defect: `POST /v1/policies/NAME` invoked policies with default answer settings, so a server
/// started with `--questions joint` logged its policies' reads as isolated and never used the
/// answer cache. The HTTP path now goes through the one invoke path with the server's settings.
#[tokio::test]
async fn a_policy_served_over_http_reads_in_the_servers_question_mode_and_uses_its_cache() {
    let (_dir, log, policies) = probe_policies();
    let joint = fixture_server(&policies, &log, &["--questions", "joint"]).await;
    let url = format!("{}/v1/policies/probe", joint.url);
    let (s, _, body) = post_json(&url, &message(0), &[]).await;
    assert_eq!(s, 200, "{body}");
    let e = &events(&log, 1).await[0];
    assert_eq!(e["reads"][0]["options"]["questions"], "joint", "{e}");
    drop(joint);

    // Isolated with the answer cache on (no decision log): the same decision twice is answered
    // from the cache the second time.
    let d = policies.display().to_string();
    let cached = start_hunch_with_fixture(
        "dg-test",
        &["--policies", d.as_str(), "--answer-cache-mb", "16"],
    )
    .await;
    let url = format!("{}/v1/policies/probe", cached.url);
    for _ in 0..2 {
        let (s, _, body) = post_json(&url, &message(1), &[]).await;
        assert_eq!(s, 200, "{body}");
    }
    let hits: u64 = metric(&cached.url, "hunch_answer_cache_hits_total").await;
    assert!(
        hits >= 1,
        "no answer-cache hit for a repeated policy decision"
    );
}

/// Defect: `GET /v1/policies/NAME` said `stage: "active"` whatever was asked. `?stage=` now
/// describes the candidate or the previous version, and a stage without a version is a 404.
#[tokio::test]
async fn describing_a_policy_names_the_stage_it_describes() {
    let (_dir, log, policies) = probe_policies();
    let hunch = fixture_server(&policies, &log, &[]).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/policies/probe", hunch.url);
    let active = get_json(&url).await;
    assert_eq!(active["stage"], "active");
    let r = client
        .get(format!("{url}?stage=candidate"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["detail"]["error_type"], "not_found", "{body}");

    let deployed = put_candidate(&client, &hunch.url, "mode=shadow", probe(2)).await;
    let candidate = get_json(&format!("{url}?stage=candidate")).await;
    assert_eq!(candidate["stage"], "candidate");
    assert_eq!(candidate["version"], deployed["candidate"]["version"]);
    assert_ne!(candidate["version"], active["version"]);
    let r = client
        .get(format!("{url}?stage=nonsense"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // A query the route cannot read is the API's JSON 400, not the framework's text (the
    // fuzzer found `?stage=null&stage=null`).
    let r = client
        .get(format!("{url}?stage=active&stage=active"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["detail"]["error_type"], "invalid_query", "{body}");

    let r = client
        .post(format!("{url}/promote"))
        .header("x-admin-key", ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let previous = get_json(&format!("{url}?stage=previous")).await;
    assert_eq!(previous["stage"], "previous");
    assert_eq!(previous["version"], active["version"]);
}

#[tokio::test]
async fn a_required_log_writes_the_file_first_and_the_collector_never_sees_a_503_as_a_200() {
    let (dir, _, policies) = probe_policies();
    let missing = dir.path().join("later");
    let log = missing.join("decisions.ndjson");
    let (url, seen) = hunch::decision::testing::recording_collector().await;
    let hunch = fixture_server(
        &policies,
        &log,
        &["--decision-log-required", "--decision-log-url", &url],
    )
    .await;
    let decide = format!("{}/v1/policies/probe", hunch.url);

    // The file cannot be written: 503, with Retry-After.
    let (s, h, body) = post_json(&decide, &message(0), &[]).await;
    assert_eq!(s, 503, "{body}");
    assert!(h.contains_key("retry-after"), "{h:?}");
    let unrecorded = h["x-hunch-decision-id"].to_str().unwrap().to_string();

    // The directory appears: the next decision is recorded, in the file and at the collector.
    std::fs::create_dir(&missing).unwrap();
    let (s, h, body) = post_json(&decide, &message(1), &[]).await;
    assert_eq!(s, 200, "{body}");
    let recorded = h["x-hunch-decision-id"].to_str().unwrap().to_string();
    assert_eq!(events(&log, 1).await[0]["decision_id"], recorded.as_str());
    let start = Instant::now();
    while seen.lock().unwrap().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nothing collected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The collector gets events in the order they were offered: had the 503 decision been
    // offered, it would be here before the recorded one.
    let collected: Vec<Value> = seen.lock().unwrap().clone();
    assert_eq!(collected.len(), 1, "{collected:?}");
    assert_eq!(collected[0]["decision_id"], recorded.as_str());
    assert_ne!(collected[0]["decision_id"], unrecorded.as_str());
    assert_eq!(
        metric::<u64>(
            &hunch.url,
            "hunch_decision_events_dropped_total{sink=\"http\",cause=\"unrecorded\"}"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn a_hung_disk_answers_503_with_retry_after_not_the_request_timeout() {
    let (dir, _, policies) = probe_policies();
    // A FIFO nobody reads stands for a hung disk: once an event larger than the pipe is
    // written, the writer never returns.
    let fifo = dir.path().join("decisions.ndjson");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let hunch = fixture_server(
        &policies,
        &fifo,
        &[
            "--decision-log-required",
            "--decision-log-write-timeout",
            "0.5",
            "--request-timeout",
            "30",
        ],
    )
    .await;
    let mut big = hunch_e2e::sample_request();
    big["state"] = json!("the disk hangs. ".repeat(20_000));
    let (s, h, body) = post_json(&format!("{}/v1/systemone", hunch.url), &big, &[]).await;
    assert_eq!(s, 503, "{body}");
    assert!(h.contains_key("retry-after"), "{h:?}");
    // The next decisions wait behind it, and are answered 503 at their own timeout too.
    let (s, h, body) = decide(&hunch.url, 0).await;
    assert_eq!(s, 503, "{body}");
    assert!(h.contains_key("retry-after"), "{h:?}");
    assert!(
        metric::<u64>(
            &hunch.url,
            "hunch_decision_events_dropped_total{sink=\"file\",cause=\"timed_out\"}"
        )
        .await
            >= 1
    );
}
