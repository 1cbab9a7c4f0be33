//! Quality reports served for the model they describe (docs/quality.md, "Where reports live"):
//! a real `hunch serve` on the default model with a temporary `HUNCH_QUALITY_DIR` and an API
//! key. Before any report, `GET /v1/models/NAME/quality` is a 404 naming the command that makes
//! one; a report of another fingerprint put in the model's folder (newer, as a hand-copied file
//! would be) and a broken file beside it are never served; a report written under the served
//! model's real fingerprint (`x_fingerprint`) is answered as stored, by name and by alias, and
//! the console's models page shows its score and draws its plot as inline SVG under the CSP.
//! The route takes the API key as `GET /v1/models` does.
//!
//! Needs the default model (`scripts/fetch-default-model.sh`); `HUNCH_TEST_SKIP=smollm2` skips
//! it on purpose.

use hunch_e2e::http::send_json;
use hunch_e2e::{default_model_or_skip, start_hunch_default_model};
use reqwest::header::{CONTENT_SECURITY_POLICY, COOKIE, SET_COOKIE};
use serde_json::{json, Value};
use std::path::Path;

const API_KEY: &str = "quality-api-key";
/// The default model's name (`hunch serve` with no model configured).
const MODEL: &str = "smollm2-135m-instruct";

fn report(fingerprint: &str, measured_at: &str, score: f64) -> Value {
    json!({
        "model": MODEL, "fingerprint": fingerprint, "measured_at": measured_at,
        "command": "scripts/quality.sh --max-requests 40 --remedies none,both",
        "commit": "abc1234", "requests": 40, "errors": 0, "error_list": [],
        "score": {"value": score, "low": score - 0.05, "high": score + 0.05},
        "dimensions": {
            "REP": {"value": 0.42, "low": 0.31, "high": 0.52, "title": "Repeatability"},
            "BAT": {"value": 0.9, "low": 0.8, "high": 1.0, "title": "Battery"},
            "MEA": {"value": 0.1, "low": 0.05, "high": 0.2, "title": "<b>Meaning</b>"}},
        "floor": {"value": 0.576, "low": 0.525, "high": 0.631, "dimensions": {"REP": {"value": 0.587}}},
        "ceiling": {"value": 0.648, "low": 0.619, "high": 0.676, "dimensions": {"REP": {"value": 0.613}}},
        "accuracy": {"value": 0.358, "low": 0.307, "high": 0.407},
        "ece": {"value": 0.289, "low": 0.249, "high": 0.347}
    })
}

fn write(folder: &Path, name: &str, doc: &Value) {
    std::fs::create_dir_all(folder).expect("the model's folder");
    std::fs::write(folder.join(name), doc.to_string()).expect("a report file");
}

async fn quality(url: &str, name: &str, key: Option<&str>) -> (u16, Value) {
    let mut request = reqwest::Client::new().get(format!("{url}/v1/models/{name}/quality"));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let (status, _, body) = send_json(request).await;
    (status, body)
}

/// The console's models page, logged in with the API key: its CSP header and its HTML.
async fn models_page(url: &str) -> (String, String) {
    let c = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client");
    let r = c
        .post(format!("{url}/console/login"))
        .form(&[("key", API_KEY)])
        .send()
        .await
        .expect("login");
    assert_eq!(r.status().as_u16(), 303, "login with the API key");
    let cookie = r
        .headers()
        .get(SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    let r = c
        .get(format!("{url}/console/models"))
        .header(COOKIE, cookie)
        .send()
        .await
        .expect("the models page");
    assert_eq!(r.status().as_u16(), 200);
    let csp = r
        .headers()
        .get(CONTENT_SECURITY_POLICY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (csp, r.text().await.expect("a page"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stored_report_is_served_for_its_models_fingerprint_and_drawn_on_the_console() {
    if default_model_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary quality directory");
    let quality_dir = (
        "HUNCH_QUALITY_DIR",
        dir.path().to_string_lossy().into_owned(),
    );
    let hunch = start_hunch_default_model(&["--api-key", API_KEY], &[quality_dir]).await;
    let url = &hunch.url;

    // The fingerprint the server reports for the model it serves.
    let (status, _, models) = send_json(
        reqwest::Client::new()
            .get(format!("{url}/v1/models"))
            .bearer_auth(API_KEY),
    )
    .await;
    assert_eq!(status, 200, "{models}");
    let fingerprint = models["models"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == MODEL))
        .and_then(|m| m["x_fingerprint"].as_str())
        .unwrap_or_else(|| panic!("{MODEL} has a fingerprint once ready: {models}"))
        .to_string();
    let folder = dir.path().join(hunch::quality::key(&fingerprint));

    // The same key as GET /v1/models: none, none.
    assert_eq!(quality(url, MODEL, None).await.0, 401);
    assert_eq!(quality(url, MODEL, Some("wrong")).await.0, 401);

    // No report yet: a 404 that names the command making one.
    let (status, body) = quality(url, MODEL, Some(API_KEY)).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["detail"]["error_type"], "not_found", "{body}");
    let message = body["detail"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("scripts/quality.sh") && message.contains(MODEL),
        "{message}"
    );

    // Another fingerprint's report in this model's folder, newer, and a broken file: neither is
    // ever served.
    write(
        &folder,
        "20261209T000000Z.json",
        &report(
            &format!("{fingerprint}-requantised"),
            "2026-12-09T00:00:00Z",
            0.9,
        ),
    );
    std::fs::write(folder.join("20261210T000000Z.json"), "{\"model\": ").expect("a broken file");
    let (status, body) = quality(url, MODEL, Some(API_KEY)).await;
    assert_eq!(
        status, 404,
        "another fingerprint's report is not this model's: {body}"
    );
    let (_, page) = models_page(url).await;
    assert!(
        !page.contains("<svg class=\"quality\"") && page.contains("No quality report for"),
        "{page}"
    );

    // The model's own reports: the newest is served, exactly as stored.
    write(
        &folder,
        "20261201T000000Z.json",
        &report(&fingerprint, "2026-12-01T00:00:00Z", 0.5),
    );
    let newest = report(&fingerprint, "2026-12-07T01:02:03Z", 0.612);
    write(&folder, "20261207T010203Z.json", &newest);
    let (status, body) = quality(url, MODEL, Some(API_KEY)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, newest);
    let (status, by_alias) = quality(url, "jev-latest", Some(API_KEY)).await;
    assert_eq!((status, &by_alias), (200, &newest));
    let (status, body) = quality(url, "no-such-model", Some(API_KEY)).await;
    assert_eq!(status, 404);
    assert_eq!(body["detail"]["error_type"], "model_not_found", "{body}");

    // The console: the score, accuracy and ECE with their intervals, when and how, and the plot.
    let (csp, page) = models_page(url).await;
    assert!(csp.contains("style-src 'self'"), "{csp}");
    for text in [
        "<svg class=\"quality\"",
        "61.2% [56.2, 66.2]",
        "35.8% [30.7, 40.7]",
        "28.9% [24.9, 34.7]",
        "2026-12-07T01:02:03Z",
        "scripts/quality.sh --max-requests 40 --remedies none,both",
        "REP (Repeatability): 42.0% [31.0, 52.0]; floor 58.7%, ceiling 61.3%",
        "&lt;b&gt;Meaning&lt;/b&gt;",
    ] {
        assert!(page.contains(text), "{text} not on the page:\n{page}");
    }
    assert!(
        !page.contains("style=") && !page.contains("<b>Meaning"),
        "{page}"
    );
    // The broken file was warned about in the log, not answered with a 5xx.
    assert!(
        hunch.process.logs().contains("20261210T000000Z.json"),
        "{}",
        hunch.process.logs()
    );
}
