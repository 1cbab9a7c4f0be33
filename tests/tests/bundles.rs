//! Policy bundles end to end (docs/deploy.md, "Policy bundles"): bundles made and signed with the
//! `hunch bundle` command, published on a small static HTTP server inside the test (one that
//! answers `If-None-Match` with 304, one that sends no `ETag` at all), followed by a real
//! `hunch serve --bundle-url` with the fixture sidecar as its reader.
//!
//! Covered: activation of a signed revision; bad bundles (truncated, signed with another key,
//! older) refused while the last good revision keeps serving and `/v1/status` names the error;
//! a new revision activated whole; every decision's event and response naming its revision;
//! HTTP deploys refused with 409 `bundle_owned`; a candidate rolled out by publishing a
//! revision; and a restart with the bundle server gone serving the persisted revision.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hunch::policy::testing::{built_policy, with_marker};
use hunch_e2e::http::{get_json, metric, send_json};
use hunch_e2e::{hunch_bin, start_hunch_with_fixture, Hunch};
use serde_json::{json, Value};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const POLICY: &str = "ticket-router";

/// What the static server publishes, and what it was asked.
struct Published {
    bytes: Mutex<Vec<u8>>,
    etag: bool,
    requests: AtomicU32,
    not_modified: AtomicU32,
}

impl Published {
    fn publish(&self, bytes: Vec<u8>) {
        *self.bytes.lock().unwrap() = bytes;
    }
}

async fn serve_bundle(State(p): State<Arc<Published>>, headers: HeaderMap) -> Response {
    p.requests.fetch_add(1, Ordering::SeqCst);
    let bytes = p.bytes.lock().unwrap().clone();
    if bytes.is_empty() {
        return StatusCode::NOT_FOUND.into_response();
    }
    if !p.etag {
        return bytes.into_response();
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    let tag = format!("\"{:016x}\"", hasher.finish());
    let asked = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok());
    if asked == Some(tag.as_str()) {
        p.not_modified.fetch_add(1, Ordering::SeqCst);
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, tag)]).into_response();
    }
    ([(header::ETAG, tag)], bytes).into_response()
}

/// A static file server for one bundle at `/policies.tar.gz`: its URL, what it publishes, and
/// the task to abort to take it down.
async fn bundle_server(etag: bool) -> (String, Arc<Published>, tokio::task::JoinHandle<()>) {
    let published = Arc::new(Published {
        bytes: Mutex::new(Vec::new()),
        etag,
        requests: AtomicU32::new(0),
        not_modified: AtomicU32::new(0),
    });
    let app = axum::Router::new()
        .route("/policies.tar.gz", axum::routing::get(serve_bundle))
        .with_state(published.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/policies.tar.gz", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, published, task)
}

/// Runs `hunch ARGS` (the CLI under test) and returns its stdout; fails the test on failure.
fn hunch(args: &[&str]) -> String {
    let out = std::process::Command::new(hunch_bin())
        .args(args)
        .output()
        .expect("hunch runs");
    assert!(
        out.status.success(),
        "hunch {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A signing key pair made by `hunch bundle keygen`: (private, public).
fn keygen(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let private = dir.join(format!("{name}.pem"));
    hunch(&["bundle", "keygen", "-o", &s(&private)]);
    (private, dir.join(format!("{name}.pub.pem")))
}

/// A bundle of the ticket router (marked `marker`, so each revision is a new version) built and
/// signed by `hunch bundle build`.
fn build(work: &Path, revision: &str, marker: &str, key: &Path) -> Vec<u8> {
    build_with(
        work,
        revision,
        &[(format!("{POLICY}.wasm"), router(marker))],
        key,
    )
}

/// The ticket router marked `marker` (each marker a new version with the same behaviour).
fn router(marker: &str) -> Vec<u8> {
    let wasm = built_policy("ticket_router").expect("the policies build (wasm32-wasip2)");
    with_marker(wasm, marker)
}

/// A bundle of `files` built and signed by `hunch bundle build`.
fn build_with(work: &Path, revision: &str, files: &[(String, Vec<u8>)], key: &Path) -> Vec<u8> {
    let dir = work.join(format!("src-{revision}"));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    let out = work.join(format!("{revision}.tar.gz"));
    let printed = hunch(&[
        "bundle",
        "build",
        &s(&dir),
        "-o",
        &s(&out),
        "--revision",
        revision,
        "--signing-key",
        &s(key),
    ]);
    assert!(
        printed.contains(&format!("revision {revision}")),
        "{printed}"
    );
    std::fs::read(out).unwrap()
}

async fn status(url: &str) -> Value {
    get_json(&format!("{url}/v1/status")).await["bundle"].clone()
}

/// Waits (bounded, generously) until `check` holds of the server's bundle status.
async fn until(url: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let bundle = status(url).await;
        if check(&bundle) {
            return bundle;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never {what}; status: {bundle}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Decides once: (status, the revision header, the body).
async fn decide(url: &str) -> (u16, Option<String>, Value) {
    let input = json!({"subject": "Refund", "body": "I was charged twice, please refund me.", "tier": "pro"});
    let (code, headers, body) = send_json(
        reqwest::Client::new()
            .post(format!("{url}/v1/policies/{POLICY}"))
            .json(&input),
    )
    .await;
    let revision = headers
        .get("x-hunch-bundle-revision")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (code, revision, body)
}

/// The decision events written so far.
fn events(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

async fn event_of(log: &Path, decision_id: &str) -> Value {
    let start = Instant::now();
    loop {
        if let Some(e) = events(log)
            .into_iter()
            .find(|e| e["decision_id"] == decision_id)
        {
            return e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no event for decision {decision_id}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn follower(bundle_url: &str, public: &Path, store: &Path, log: &Path) -> Hunch {
    let (public, store, log) = (s(public), s(store), s(log));
    start_hunch_with_fixture(
        "dg-test",
        &[
            "--bundle-url",
            bundle_url,
            "--bundle-public-key",
            &public,
            "--bundle-poll",
            "100ms",
            "--bundle-dir",
            &store,
            "--decision-log",
            &log,
            "--admin-key",
            "k",
        ],
    )
    .await
}

#[tokio::test]
async fn a_signed_bundle_is_followed_bad_ones_refused_and_the_last_good_persisted() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let (key, public) = keygen(w, "fleet");
    let (other_key, _) = keygen(w, "intruder");
    let r1 = build(w, "r1", "one", &key);
    let r2 = build(w, "r2", "two", &key);
    let intruder = build(w, "r3-intruder", "three", &other_key);
    // `hunch bundle inspect` checks the signature with the public key, and refuses another's.
    let inspect = |file: &str| {
        std::process::Command::new(hunch_bin())
            .args([
                "bundle",
                "inspect",
                &s(&w.join(file)),
                "--public-key",
                &s(&public),
            ])
            .output()
            .expect("hunch runs")
    };
    let good = inspect("r1.tar.gz");
    let printed = String::from_utf8_lossy(&good.stdout);
    assert!(good.status.success(), "{good:?}");
    assert!(
        printed.contains("revision    r1") && printed.contains("verified"),
        "{printed}"
    );
    let foreign = inspect("r3-intruder.tar.gz");
    assert_eq!(foreign.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&foreign.stderr).contains("bundle r3-intruder: signed with key"),
        "{foreign:?}"
    );

    let (url, published, server) = bundle_server(true).await;
    published.publish(r1.clone());
    let store = w.join("store");
    let log = w.join("decisions.ndjson");
    let hunch_server = follower(&url, &public, &store, &log).await;
    let base = hunch_server.url.clone();

    let active = until(&base, "activated r1", |b| b["revision"] == "r1").await;
    assert_eq!(active["policies"], json!([POLICY]));
    assert_eq!(active["url"], url);
    assert!(active["activated_at"].is_string());
    let (code, revision, body) = decide(&base).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(revision.as_deref(), Some("r1"));
    let first = body["decision_id"].as_str().unwrap().to_string();
    assert_eq!(event_of(&log, &first).await["bundle_revision"], "r1");

    // Unchanged: the server answers 304 to the ETag the replica sends.
    let start = Instant::now();
    while published.not_modified.load(Ordering::SeqCst) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no If-None-Match was sent"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A bundle server owns the set: no HTTP deploy, removal or promotion.
    let (code, _, body) = send_json(
        reqwest::Client::new()
            .put(format!("{base}/v1/policies/{POLICY}"))
            .header("x-admin-key", "k")
            .body(b"anything".to_vec()),
    )
    .await;
    assert_eq!(
        (code, &body["detail"]["error_type"]),
        (409, &json!("bundle_owned")),
        "{body}"
    );
    let (code, _, body) = send_json(
        reqwest::Client::new()
            .post(format!("{base}/v1/policies/{POLICY}/promote"))
            .header("x-admin-key", "k"),
    )
    .await;
    assert_eq!(
        (code, &body["detail"]["error_type"]),
        (409, &json!("bundle_owned")),
        "{body}"
    );

    // A truncated download, then a bundle signed by another key: refused, r1 keeps serving.
    published.publish(r2[..r2.len() / 2].to_vec());
    let refused = until(&base, "reported the truncated bundle", |b| {
        b["last_error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("truncated"))
    })
    .await;
    assert_eq!(refused["revision"], "r1");
    assert_eq!(decide(&base).await.1.as_deref(), Some("r1"));
    published.publish(intruder);
    let refused = until(&base, "reported the foreign signature", |b| {
        b["last_error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bundle r3-intruder: signed with key"))
    })
    .await;
    assert_eq!(refused["revision"], "r1");
    let (code, revision, _) = decide(&base).await;
    assert_eq!((code, revision.as_deref()), (200, Some("r1")));
    assert!(metric::<f64>(&base, "hunch_bundle_failures_total{reason=\"download\"}").await >= 1.0);
    assert!(metric::<f64>(&base, "hunch_bundle_failures_total{reason=\"signature\"}").await >= 1.0);

    // A new good revision: activated whole, the error cleared, its decisions name it.
    published.publish(r2.clone());
    let published_at = Instant::now();
    let active = until(&base, "activated r2", |b| b["revision"] == "r2").await;
    // A figure, not an assertion: publish to serving, with a 100 ms poll.
    eprintln!(
        "r2 published -> serving on the replica: {:.0} ms",
        published_at.elapsed().as_secs_f64() * 1e3
    );
    assert!(active["last_error"].is_null(), "{active}");
    assert_eq!(active["stale"], false);
    let (code, revision, body) = decide(&base).await;
    assert_eq!((code, revision.as_deref()), (200, Some("r2")), "{body}");
    let second = body["decision_id"].as_str().unwrap().to_string();
    assert_eq!(event_of(&log, &second).await["bundle_revision"], "r2");
    let text = hunch_e2e::http::metrics(&base).await;
    assert!(
        text.contains("hunch_bundle_info{revision=\"r2\"} 1"),
        "{text}"
    );
    assert!(text.contains("hunch_bundle_activations_total 2"), "{text}");
    assert!(text.contains("hunch_bundle_stale 0"), "{text}");

    // The bundle server goes away and the replica restarts: it serves the persisted r2.
    server.abort();
    let _ = server.await;
    drop(hunch_server);
    let restarted = follower(&url, &public, &store, &log).await;
    let restored = status(&restarted.url).await;
    assert_eq!(
        restored["revision"], "r2",
        "served before any poll: {restored}"
    );
    let (code, revision, body) = decide(&restarted.url).await;
    assert_eq!((code, revision.as_deref()), (200, Some("r2")), "{body}");
    let failing = until(&restarted.url, "reported the unreachable server", |b| {
        b["last_error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("download failed"))
    })
    .await;
    assert_eq!(failing["revision"], "r2");
    assert!(failing["last_success_at"].is_null(), "{failing}");
}

#[tokio::test]
async fn without_etags_the_downloaded_bytes_decide_and_an_older_revision_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let (key, public) = keygen(w, "fleet");
    // Built first, so created first: older than both that follow.
    let old = build(w, "r0-old", "zero", &key);
    let r1 = build(w, "r1", "one", &key);
    let r2 = build(w, "r2", "two", &key);

    let (url, published, _server) = bundle_server(false).await;
    published.publish(r1);
    let hunch_server = follower(&url, &public, &w.join("store"), &w.join("d.ndjson")).await;
    let base = hunch_server.url.clone();
    until(&base, "activated r1", |b| b["revision"] == "r1").await;

    // The same bytes again and again, no ETag: compared by digest, nothing re-activated.
    let seen = published.requests.load(Ordering::SeqCst);
    let start = Instant::now();
    while published.requests.load(Ordering::SeqCst) < seen + 3 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the replica stopped polling"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric::<f64>(&base, "hunch_bundle_activations_total").await,
        1.0
    );
    assert_eq!(
        metric::<f64>(&base, "hunch_bundle_failures_total").await,
        0.0
    );
    let current = status(&base).await;
    assert!(
        current["last_error"].is_null() && current["last_success_at"].is_string(),
        "{current}"
    );

    published.publish(r2);
    until(&base, "activated r2", |b| b["revision"] == "r2").await;
    assert_eq!(decide(&base).await.1.as_deref(), Some("r2"));

    // An older revision (a stale mirror) is refused: r2 keeps serving.
    published.publish(old);
    let refused = until(&base, "refused the older revision", |b| {
        b["last_error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bundle r0-old: older than the active revision r2"))
    })
    .await;
    assert_eq!(refused["revision"], "r2");
    assert!(metric::<f64>(&base, "hunch_bundle_failures_total{reason=\"older\"}").await >= 1.0);
    assert_eq!(decide(&base).await.1.as_deref(), Some("r2"));

    // A fleet rolls a candidate out by publishing a revision: r3 shadows it on every decision,
    // and the candidate's shadow event names r3 too.
    let r3 = build_with(
        w,
        "r3",
        &[
            (format!("{POLICY}.wasm"), router("three")),
            (
                format!("{POLICY}.candidate.wasm"),
                router("three-candidate"),
            ),
            (
                format!("{POLICY}.candidate.toml"),
                b"[rollout]\nmode = \"shadow\"\n".to_vec(),
            ),
        ],
        &key,
    );
    published.publish(r3);
    until(&base, "activated r3", |b| b["revision"] == "r3").await;
    let described = get_json(&format!("{base}/v1/policies/{POLICY}")).await;
    assert_eq!(described["mode"], "shadow", "{described}");
    let (code, revision, body) = decide(&base).await;
    assert_eq!((code, revision.as_deref()), (200, Some("r3")), "{body}");
    let id = body["decision_id"].as_str().unwrap().to_string();
    let log = w.join("d.ndjson");
    let start = Instant::now();
    let shadow = loop {
        if let Some(e) = events(&log)
            .into_iter()
            .find(|e| e["shadow_of"] == id.as_str())
        {
            break e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no shadow event for {id}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(shadow["policy"]["stage"], "candidate");
    assert_eq!(shadow["bundle_revision"], "r3");
    assert_eq!(event_of(&log, &id).await["bundle_revision"], "r3");
}
