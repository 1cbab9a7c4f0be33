//! A small WebDriver client (W3C WebDriver over HTTP, with reqwest) for the console's browser
//! test: it starts Debian's `chromedriver` on a free port, opens one headless Chromium session
//! and offers what the test needs (navigate, find, click, type, read text, screenshots, the
//! browser's console log). No client crate: the protocol's few calls are plain JSON.

use crate::Process;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The key under which WebDriver returns an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where `chromium` and `chromedriver` are, when both are installed (`scripts/setup.sh --test`
/// installs Debian's `chromium` and `chromium-driver`).
pub fn browser() -> Option<(PathBuf, PathBuf)> {
    let find = |names: &[&str]| {
        names
            .iter()
            .map(|n| PathBuf::from("/usr/bin").join(n))
            .find(|p| p.is_file())
    };
    Some((
        find(&["chromium", "chromium-browser"])?,
        find(&["chromedriver"])?,
    ))
}

/// A running chromedriver and one browser session; both end when dropped.
pub struct Browser {
    http: reqwest::Client,
    /// `http://127.0.0.1:PORT/session/ID`.
    session: String,
    _driver: Process,
}

/// One element of the page.
#[derive(Debug, Clone)]
pub struct Element(String);

/// A log entry of the browser's console.
#[derive(Debug, Clone)]
pub struct LogEntry {
    pub level: String,
    pub message: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Browser {
    /// Starts chromedriver and a headless Chromium of `width`×`height`.
    pub async fn start(chromium: &Path, chromedriver: &Path, width: u32, height: u32) -> Browser {
        let port = free_port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
        let driver = Process {
            child,
            stderr: Arc::new(Mutex::new(String::new())),
            stdout_rest: Arc::new(Mutex::new(String::new())),
        };
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let started = Instant::now();
        loop {
            let ready = match http.get(format!("{base}/status")).send().await {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .ok()
                    .and_then(|v| v["value"]["ready"].as_bool())
                    .unwrap_or(false),
                Err(_) => false,
            };
            if ready {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not answer on port {port}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            // An unexpected alert (an XSS payload that ran) makes the next command fail.
            "unhandledPromptBehavior": "ignore",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--hide-scrollbars",
                         format!("--window-size={width},{height}")]
            }
        }}});
        let created: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("chromedriver answers")
            .json()
            .await
            .expect("JSON");
        let id = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {created}"))
            .to_string();
        Browser {
            http,
            session: format!("{base}/session/{id}"),
            _driver: driver,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.session));
        if let Some(b) = body {
            request = request.json(&b);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status();
        let value: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{method} {path}: {status} {value}");
        value["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> Value {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub async fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url })).await;
    }

    pub async fn url(&self) -> String {
        self.get("/url")
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn source(&self) -> String {
        self.get("/source")
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn set_size(&self, width: u32, height: u32) {
        self.post("/window/rect", json!({"width": width, "height": height}))
            .await;
    }

    /// The elements `css` selects now.
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        let found = self
            .post("/elements", json!({"using": "css selector", "value": css}))
            .await;
        if std::env::var_os("WEBDRIVER_DEBUG").is_some() {
            eprintln!("elements {css}: {found}");
        }
        found
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(|s| Element(s.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The first element `css` selects, waiting up to `limit` for it to appear.
    pub async fn wait_for(&self, css: &str, limit: Duration) -> Element {
        let started = Instant::now();
        loop {
            if let Some(e) = self.find_all(css).await.into_iter().next() {
                return e;
            }
            if started.elapsed() >= limit {
                panic!(
                    "{css} did not appear within {limit:?} on {}; the page:\n{}",
                    self.url().await,
                    self.source().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn find(&self, css: &str) -> Element {
        self.wait_for(css, Duration::from_secs(5)).await
    }

    pub async fn click(&self, e: &Element) {
        self.post(&format!("/element/{}/click", e.0), json!({}))
            .await;
    }

    pub async fn clear(&self, e: &Element) {
        self.post(&format!("/element/{}/clear", e.0), json!({}))
            .await;
    }

    pub async fn type_text(&self, e: &Element, text: &str) {
        self.post(&format!("/element/{}/value", e.0), json!({ "text": text }))
            .await;
    }

    pub async fn text(&self, e: &Element) -> String {
        self.get(&format!("/element/{}/text", e.0))
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The text of the first element `css` selects.
    pub async fn text_of(&self, css: &str) -> String {
        let e = self.find(css).await;
        self.text(&e).await
    }

    /// Accepts the dialog (a `confirm()`) the last action opened, waiting up to 5 s for it.
    pub async fn accept_alert(&self) {
        let started = Instant::now();
        loop {
            let r = self
                .http
                .post(format!("{}/alert/accept", self.session))
                .json(&json!({}))
                .send()
                .await
                .expect("chromedriver answers");
            if r.status().is_success() {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "no dialog to accept"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The visible page as PNG bytes.
    pub async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine as _;
        let encoded = self.get("/screenshot").await;
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap_or_default())
            .expect("a base64 PNG")
    }

    /// The browser console's entries since the last call (chromedriver's log endpoint).
    pub async fn console_log(&self) -> Vec<LogEntry> {
        let entries = self.post("/se/log", json!({"type": "browser"})).await;
        entries
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| LogEntry {
                        level: e["level"].as_str().unwrap_or_default().to_string(),
                        message: e["message"].as_str().unwrap_or_default().to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Browser {
    /// Ends the session so Chromium exits before its driver is stopped, also when a test fails
    /// halfway (a plain blocking DELETE: no runtime is at hand in `drop`).
    fn drop(&mut self) {
        use std::io::{Read, Write};
        let Some(rest) = self.session.strip_prefix("http://") else {
            return;
        };
        let Some((host, path)) = rest.split_once('/') else {
            return;
        };
        let Ok(mut stream) = std::net::TcpStream::connect(host) else {
            return;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let request =
            format!("DELETE /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        if stream.write_all(request.as_bytes()).is_ok() {
            let mut answer = Vec::new();
            let _ = stream.read_to_end(&mut answer);
        }
    }
}
