//! The operator console (`/console`, docs/console.md) in a real browser: headless Chromium
//! (Debian's `chromium` and `chromium-driver`, installed by `scripts/setup.sh --test`) driven
//! over WebDriver against a real `hunch serve` on the default model with a policy and its shadow
//! candidate. It logs in, sees the model loaded, asks a question and sees its bars, watches
//! decisions appear in the live tail and opens them (an XSS payload in a state shows as text),
//! replays one against the candidate, promotes the candidate, and checks that no page logs a
//! JavaScript error (a CSP violation included). Every page is photographed at desktop and phone
//! widths into `target/console-screenshots/`.
//!
//! Without a browser the browser test fails saying how to install one, unless `HUNCH_TEST_SKIP`
//! lists `browser`. The refusals (no key, wrong key, no CSRF token, an API key's session trying
//! to promote) and the open console are checked over plain HTTP in the other tests here.

use hunch::policy::testing::{built_policy, fresh_version};
use hunch_e2e::webdriver::{browser, Browser};
use hunch_e2e::{
    accelerator_bin, console_csrf_token, default_model_file, missing_prerequisite,
    start_hunch_with, start_hunch_with_fixture, target_dir, wait_ready_or_logs, Hunch,
};
use reqwest::header::{HeaderMap, CONTENT_SECURITY_POLICY, COOKIE, LOCATION, SET_COOKIE};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

const ADMIN: &str = "console-admin-key";
const API_KEY: &str = "console-api-key";
const XSS_SCRIPT: &str = "<script>alert(1)</script>";
const XSS_IMG: &str = "\"><img src=x onerror=alert(1)>";
/// The default model's name (`hunch serve` with no model configured).
const MODEL: &str = "smollm2-135m-instruct";
const DESKTOP: (u32, u32) = (1280, 1300);
const PHONE: (u32, u32) = (390, 844);

/// A client that follows no redirect (the gate's 303s are what is checked).
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

/// The session cookie a login's `Set-Cookie` carries, as a `Cookie` header value.
fn session_cookie(headers: &HeaderMap) -> String {
    let set = headers
        .get(SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .expect("a session cookie");
    for part in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(set.contains(part), "{set}");
    }
    set.split(';').next().unwrap_or_default().to_string()
}

/// Logs in over HTTP with `key`: the cookie and the session's CSRF token (from a page).
async fn login(url: &str, key: &str) -> (String, String) {
    let c = client();
    let r = c
        .post(format!("{url}/console/login"))
        .form(&[("key", key)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303, "login with a valid key");
    let cookie = session_cookie(r.headers());
    let page = c
        .get(format!("{url}/console/policies"))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!page.contains(key), "a key never appears in a page");
    let csrf = console_csrf_token(&page);
    (cookie, csrf)
}

/// A `--policies` directory with the ticket router as `router`.
fn policies_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let wasm = built_policy("ticket_router").expect("the policies build (wasm32-wasip2)");
    std::fs::write(dir.path().join("router.wasm"), wasm).unwrap();
    dir
}

/// Deploys a new version of the router as its shadow candidate; returns its version.
async fn deploy_candidate(url: &str) -> String {
    let wasm = fresh_version("ticket_router", "console").unwrap();
    let r = client()
        .put(format!(
            "{url}/v1/policies/router?stage=candidate&mode=shadow"
        ))
        .bearer_auth(API_KEY)
        .header("x-admin-key", ADMIN)
        .body(wasm)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    body["candidate"]["version"]
        .as_str()
        .expect("a candidate")
        .to_string()
}

fn ticket() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies/ticket.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// POSTs `body` to `route` with the API key; returns the decision id.
async fn decide(url: &str, route: &str, body: &Value) -> String {
    let r = client()
        .post(format!("{url}{route}"))
        .bearer_auth(API_KEY)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let id = r
        .headers()
        .get("x-hunch-decision-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{route}: {text}");
    id
}

fn screenshots_dir() -> PathBuf {
    let dir = target_dir()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(target_dir)
        .join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Photographs the page at both widths, and fails on any error in the browser's console.
async fn check_page(b: &Browser, name: &str) {
    let dir = screenshots_dir();
    for (label, (w, h)) in [("desktop", DESKTOP), ("phone", PHONE)] {
        b.set_size(w, h).await;
        std::fs::write(
            dir.join(format!("{name}-{label}.png")),
            b.screenshot().await,
        )
        .unwrap();
    }
    b.set_size(DESKTOP.0, DESKTOP.1).await;
    let errors: Vec<_> = b
        .console_log()
        .await
        .into_iter()
        .filter(|e| e.level == "SEVERE" || e.level == "WARNING")
        .collect();
    assert!(errors.is_empty(), "{name}: the browser logged {errors:?}");
}

async fn start_server(dir: &Path) -> Hunch {
    let bin = accelerator_bin().to_string_lossy().into_owned();
    let policies = dir.to_string_lossy().into_owned();
    let hunch = start_hunch_with(
        &[
            "--admin-key",
            ADMIN,
            "--api-key",
            API_KEY,
            "--policies",
            &policies,
        ],
        &[("HUNCH_ACCELERATOR_BIN", bin)],
    );
    wait_ready_or_logs(&hunch, Duration::from_secs(300)).await;
    hunch
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_logs_in_asks_watches_decisions_and_promotes_a_candidate_in_a_browser() {
    let Some((chromium, chromedriver)) = browser() else {
        missing_prerequisite(
            "browser",
            "Chromium and chromedriver (/usr/bin/chromium, /usr/bin/chromedriver)",
            "scripts/setup.sh --test installs Debian's chromium and chromium-driver",
        );
        return;
    };
    if default_model_file().is_none() {
        missing_prerequisite(
            "chat_model",
            "the default model SmolLM2-135M-Instruct.Q4_1.gguf",
            "scripts/fetch-default-model.sh",
        );
        return;
    }
    let dir = policies_dir();
    let hunch = start_server(dir.path()).await;
    let url = hunch.url.clone();
    let candidate = deploy_candidate(&url).await;
    let b = Browser::start(&chromium, &chromedriver, DESKTOP.0, DESKTOP.1).await;

    // Refused without the key: the page is the login form, with no data of the console.
    b.goto(&format!("{url}/console/decisions")).await;
    assert!(
        b.url().await.ends_with("/console/login"),
        "{}",
        b.url().await
    );
    b.find("#login input[name=key]").await;
    check_page(&b, "login").await;

    // A wrong key is refused; the admin key logs in.
    let key = b.find("#login input[name=key]").await;
    b.type_text(&key, "not-the-key").await;
    b.click(&b.find("#login button").await).await;
    let refused = b.text_of("p.error").await;
    assert!(refused.contains("not valid"), "{refused}");
    // The browser logs the refused login's 401 as a failed load, and nothing else.
    let logged = b.console_log().await;
    assert!(
        logged
            .iter()
            .filter(|e| e.level == "SEVERE" || e.level == "WARNING")
            .all(|e| e.message.contains("401")),
        "{logged:?}"
    );
    let key = b.find("#login input[name=key]").await;
    b.type_text(&key, ADMIN).await;
    b.click(&b.find("#login button").await).await;
    b.wait_for("#status", Duration::from_secs(10)).await;
    assert!(
        !b.source().await.contains(ADMIN),
        "the key is never in a page"
    );

    // The overview: ready, and the default model loaded with its memory bar.
    assert_eq!(b.text_of("#status .big").await, "ready");
    let model = b
        .text_of(&format!("#memory tr[data-model='{MODEL}']"))
        .await;
    assert!(model.contains("loaded"), "{model}");
    assert_eq!(b.find_all("#memory svg.bar").await.len(), 1);
    check_page(&b, "overview").await;

    b.goto(&format!("{url}/console/models")).await;
    let row = b.text_of(&format!("tr[data-model='{MODEL}']")).await;
    assert!(
        row.contains("loaded") && row.contains("jev-latest"),
        "{row}"
    );
    check_page(&b, "models").await;

    // Ask the example question set and see its bars: 2 (noul) + 3 (choice) + 3 (score).
    b.goto(&format!("{url}/console/ask")).await;
    check_page(&b, "ask").await;
    b.click(&b.find("#ask button[type=submit]").await).await;
    b.wait_for("#answer", Duration::from_secs(60)).await;
    assert_eq!(
        b.find_all("#answer svg.bar").await.len(),
        8,
        "{}",
        b.text_of("#answer").await
    );
    let asked = b.text_of("#answer-decision").await;
    check_page(&b, "ask-answer").await;

    // The live tail: decisions made after the page loaded appear without a reload.
    b.goto(&format!("{url}/console/decisions")).await;
    b.find(&format!("#tail tr a[href='/console/decisions/{asked}']"))
        .await;
    let xss = decide(
        &url,
        "/v1/systemone",
        &json!({"model": "jev-latest", "state": format!("{XSS_SCRIPT} {XSS_IMG}"),
                "questions": {"x": {"type": "noul", "instructions": XSS_IMG}}}),
    )
    .await;
    let routed = decide(&url, "/v1/policies/router", &ticket()).await;
    b.wait_for(
        &format!("#tail tr a[href='/console/decisions/{xss}']"),
        Duration::from_secs(20),
    )
    .await;
    b.wait_for(
        &format!("#tail tr a[href='/console/decisions/{routed}']"),
        Duration::from_secs(20),
    )
    .await;
    let tail = b.text_of("#tail").await;
    assert!(tail.contains(XSS_SCRIPT), "the state shows as text: {tail}");
    assert!(b.find_all("#tail img, #tail script").await.is_empty());
    check_page(&b, "decisions").await;

    // The XSS decision's page: its state and question as text, nothing injected.
    b.click(
        &b.find(&format!("#tail tr a[href='/console/decisions/{xss}']"))
            .await,
    )
    .await;
    assert_eq!(b.text_of("#decision-id").await, xss);
    let page = b.text_of("main").await;
    assert!(
        page.contains(XSS_SCRIPT) && page.contains(XSS_IMG),
        "{page}"
    );
    assert!(b.find_all("main img").await.is_empty());
    assert_eq!(b.find_all("main script").await.len(), 0);
    assert_eq!(b.find_all("section.read svg.bar.raw").await.len(), 2);
    check_page(&b, "decision-xss").await;

    // The policy decision: its reads as bars, and a replay against the candidate.
    b.goto(&format!("{url}/console/decisions/{routed}")).await;
    assert!(!b.find_all("section.read svg.bar.raw").await.is_empty());
    check_page(&b, "decision").await;
    b.click(&b.find("#replay button").await).await;
    let replayed = b.text_of("#replay-result").await;
    assert!(replayed.contains("candidate decides"), "{replayed}");

    // The policies page: the shadow candidate and its agreement; promote it.
    hunch_e2e::eventually(Duration::from_secs(20), || async {
        let summary: Value = client()
            .get(format!("{url}/v1/policies/router"))
            .bearer_auth(API_KEY)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        match summary["agreement"]["shadowed"].as_u64() {
            Some(n) if n >= 1 => Ok(()),
            _ => Err(format!("no shadow run yet: {summary}")),
        }
    })
    .await;
    b.goto(&format!("{url}/console/policies")).await;
    assert_eq!(
        b.text_of("section[data-policy='router'] code.candidate")
            .await,
        candidate
    );
    let agreement = b.text_of("section[data-policy='router'] .agreement").await;
    assert!(
        agreement.ends_with('%'),
        "one shadow run so far: {agreement}"
    );
    check_page(&b, "policies").await;
    b.click(
        &b.find("section[data-policy='router'] form[action$=promote] button")
            .await,
    )
    .await;
    b.accept_alert().await;
    let flash = b.wait_for("p.flash", Duration::from_secs(10)).await;
    assert!(b.text(&flash).await.contains("Promoted router"));
    assert_eq!(
        b.text_of("section[data-policy='router'] code.version")
            .await,
        candidate
    );
    let served: Value = client()
        .get(format!("{url}/v1/policies/router"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(served["version"], candidate.as_str());
    check_page(&b, "policies-promoted").await;

    b.goto(&format!("{url}/console/calibration")).await;
    assert!(b.text_of("main").await.contains("No calibration is in use"));
    check_page(&b, "calibration").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_refuses_without_a_key_and_an_api_key_may_read_but_not_promote() {
    let dir = policies_dir();
    let policies = dir.path().to_string_lossy().into_owned();
    let hunch = start_hunch_with_fixture(
        "dg-test",
        &[
            "--admin-key",
            ADMIN,
            "--api-key",
            API_KEY,
            "--policies",
            &policies,
        ],
    )
    .await;
    let url = &hunch.url;
    let c = client();

    // No session: pages go to the login form, the tail and every POST are 401s.
    let r = c.get(format!("{url}/console")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()[LOCATION], "/console/login");
    let r = c
        .get(format!("{url}/console/decisions/tail"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .post(format!("{url}/console/policies/router/promote"))
        .form(&[("csrf", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    // A made-up cookie is no session either.
    let r = c
        .get(format!("{url}/console"))
        .header(COOKIE, format!("hunch_console={}", "0".repeat(64)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);

    // The login page's headers: a strict CSP, no framing, no sniffing.
    let r = c.get(format!("{url}/console/login")).send().await.unwrap();
    let csp = r.headers()[CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"));
    assert_eq!(r.headers()["x-frame-options"], "DENY");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    let r = c
        .post(format!("{url}/console/login"))
        .form(&[("key", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert!(r.headers().get(SET_COOKIE).is_none());
    // A login posted from another site's page is refused.
    let r = c
        .post(format!("{url}/console/login"))
        .header("origin", "https://evil.example")
        .form(&[("key", ADMIN)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);

    // An API key reads and sees no actions; its promote is refused even with its CSRF token.
    deploy_candidate(url).await;
    let (cookie, csrf) = login(url, API_KEY).await;
    let page = c
        .get(format!("{url}/console/policies"))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("data-policy=\"router\"") && !page.contains("/promote\""),
        "{page}"
    );
    let r = c
        .post(format!("{url}/console/policies/router/promote"))
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);

    // The admin key's session: without its CSRF token a promote is refused; with it, done.
    let (cookie, csrf) = login(url, ADMIN).await;
    for token in ["", "forged"] {
        let r = c
            .post(format!("{url}/console/policies/router/promote"))
            .header(COOKIE, &cookie)
            .form(&[("csrf", token)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403);
    }
    let summary: Value = c
        .get(format!("{url}/v1/policies/router"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        summary["candidate"].is_object(),
        "nothing was promoted: {summary}"
    );
    let r = c
        .post(format!("{url}/console/policies/router/promote"))
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let summary: Value = c
        .get(format!("{url}/v1/policies/router"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(summary["candidate"].is_null(), "promoted: {summary}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_no_key_configured_the_console_is_open_and_read_only() {
    let dir = policies_dir();
    let policies = dir.path().to_string_lossy().into_owned();
    let hunch = start_hunch_with_fixture("dg-test", &["--policies", &policies]).await;
    let url = &hunch.url;
    let c = client();
    let r = c
        .get(format!("{url}/console/policies"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let cookie = session_cookie(r.headers());
    let page = r.text().await.unwrap();
    assert!(
        page.contains("open and read-only") && page.contains("--admin-key"),
        "{page}"
    );
    assert!(page.contains("data-policy=\"router\"") && !page.contains("/promote\""));
    let csrf = page
        .split("data-csrf=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_string();
    // Even with its session's token, an open console changes nothing.
    let r = c
        .post(format!("{url}/console/policies/router/promote"))
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // The login page sends an open console's visitors to it.
    let r = c.get(format!("{url}/console/login")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
}
