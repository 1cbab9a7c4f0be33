//! Many models under one memory budget (docs/models.md), with REAL sidecars (`hunch-accelerator`)
//! on three small real chat checkpoints copied into a models directory, and one pinned `--model`.
//!
//! The budget is sized from a sidecar's measured resident size (a tiny checkpoint is a few
//! hundred KB; the process around it is the runtime's, tens of MB): room for the pinned model and
//! two more, never three. The test shows that alternating requests are all answered while the
//! sidecars' summed `VmRSS` (sampled from `/proc`) never exceeds the budget, that the least
//! recently used idle model is the one evicted, that the pinned model survives every switch,
//! that 8 concurrent first requests start one sidecar, that a model larger than the budget is a
//! 507 naming both sizes, that `x_keep_alive` 0 unloads and a short keep-alive expires like a
//! TTL, that a killed sidecar frees its share, and the admin routes.

use hunch_e2e::http::{get_json, metric_in, metrics, post_systemone};
use hunch_e2e::{
    accelerator_bin, child_pids, console_csrf_token, eventually, start_hunch_with,
    wait_ready_or_logs, workspace_root, Hunch,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const ADMIN: &str = "budget-admin";

fn checkpoints() -> PathBuf {
    workspace_root().join("accelerator/tests/data/causal")
}

/// A models directory holding `files` (checkpoint file → name served).
fn models_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (file, name) in files {
        std::fs::copy(
            checkpoints().join(file),
            dir.path().join(format!("{name}.gguf")),
        )
        .expect("copy a checkpoint");
    }
    dir
}

fn start(dir: &Path, extra: &[&str]) -> Hunch {
    let d = dir.to_string_lossy().into_owned();
    let mut args = vec!["--models-dir", d.as_str(), "--admin-key", ADMIN];
    args.extend_from_slice(extra);
    let bin = accelerator_bin().to_string_lossy().into_owned();
    start_hunch_with(&args, &[("HUNCH_ACCELERATOR_BIN", bin)])
}

fn request(model: &str) -> Value {
    json!({"model": model, "state": "I was charged twice this month.",
           "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"}}})
}

/// Reads `model` and insists on a 200.
async fn read(hunch: &Hunch, body: &Value) {
    let response = post_systemone(&hunch.url, body).await;
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    assert_eq!(
        status,
        200,
        "{body}: {text}\nlogs:\n{}",
        hunch.process.logs()
    );
}

async fn listed(hunch: &Hunch, name: &str) -> Value {
    let list = get_json(&format!("{}/v1/models", hunch.url)).await;
    list["models"]
        .as_array()
        .and_then(|m| m.iter().find(|e| e["name"] == name).cloned())
        .unwrap_or_else(|| panic!("{name} is not listed: {list}"))
}

async fn state_of(hunch: &Hunch, name: &str) -> String {
    listed(hunch, name).await["x_state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The running sidecars of `hunch`: (pid, model name from its `--name`).
fn sidecars(hunch: &Hunch) -> Vec<(u32, String)> {
    child_pids(hunch.process.pid())
        .into_iter()
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if !args.first()?.contains("hunch-accelerator") {
                return None;
            }
            let name = args.iter().position(|a| a == "--name")?;
            Some((pid, args.get(name + 1)?.clone()))
        })
        .collect()
}

fn vm_rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Samples the summed `VmRSS` of `hunch`'s sidecars every 10 ms until stopped: the most seen, and
/// each process's share (pid, bytes) in that sample.
struct RssSampler {
    stop: Arc<AtomicBool>,
    most: Arc<Mutex<(u64, Vec<(u32, u64)>)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(hunch_pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let most = Arc::new(Mutex::new((0, Vec::new())));
        let (s, m) = (stop.clone(), most.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let shares: Vec<(u32, u64)> = child_pids(hunch_pid)
                    .into_iter()
                    .map(|pid| (pid, vm_rss(pid)))
                    .collect();
                let sum = shares.iter().map(|(_, b)| b).sum();
                if let Ok(mut most) = m.lock() {
                    if sum > most.0 {
                        *most = (sum, shares);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        RssSampler {
            stop,
            most,
            thread: Some(thread),
        }
    }

    fn most(mut self) -> (u64, Vec<(u32, u64)>) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.most.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// What one sidecar on a tiny checkpoint holds once it has read: the unit the budget is sized in.
async fn resident_after_a_read() -> u64 {
    let dir = models_dir(&[("tiny-llama.q8_0.gguf", "probe")]);
    let hunch = start(dir.path(), &["--memory-budget", "64G"]);
    wait_ready_or_logs(&hunch, Duration::from_secs(60)).await;
    read(&hunch, &request("probe")).await;
    read(&hunch, &request("probe")).await;
    let (pid, _) = sidecars(&hunch)
        .into_iter()
        .next()
        .expect("the probe's sidecar runs");
    vm_rss(pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn models_load_on_request_and_are_evicted_within_one_budget() {
    let unit = resident_after_a_read().await;
    assert!(unit > 1 << 20, "a sidecar holds memory: {unit}");
    // The pinned model and two more fit; a third needs an eviction. The unit holds for all of
    // them because they run alike: quantised files widened to float32 on the native CPU kernels
    // (an f16 file would keep MLX's path, whose sidecar holds ~1.7x as much).
    let budget = unit * 7 / 2;
    let dir = models_dir(&[
        ("tiny-llama.q8_0.gguf", "llama"),
        ("tiny-qwen3.q8_0.gguf", "qwen"),
        ("tiny-gemma3.q4_0.gguf", "gemma"),
    ]);
    // A checkpoint far larger than any budget (sparse: it takes no disk).
    let huge = std::fs::File::create(dir.path().join("huge.gguf")).unwrap();
    std::io::Write::write_all(&mut &huge, b"GGUF").unwrap();
    huge.set_len(1 << 40).unwrap();
    let pinned_path = checkpoints().join("tiny-llama.q4_0.gguf");
    let pinned = format!("pinned={}", pinned_path.display());
    let budget_arg = budget.to_string();
    let hunch = start(
        dir.path(),
        &[
            "--model",
            &pinned,
            "--memory-budget",
            &budget_arg,
            "--model-ttl",
            "20m",
        ],
    );
    wait_ready_or_logs(&hunch, Duration::from_secs(60)).await;
    let list = get_json(&format!("{}/v1/models", hunch.url)).await;
    assert_eq!(list["x_memory"]["budget_bytes"], budget, "{list}");
    for name in ["llama", "qwen", "gemma", "huge"] {
        let entry = listed(&hunch, name).await;
        assert_eq!(entry["x_state"], "available", "{entry}");
        assert_eq!(entry["x_pinned"], false, "{entry}");
        assert!(entry["x_resident_bytes"].is_null(), "{entry}");
    }
    assert_eq!(listed(&hunch, "pinned").await["x_pinned"], true);
    let pinned_pid = sidecars(&hunch)
        .into_iter()
        .find(|(_, n)| n == "pinned")
        .map(|(pid, _)| pid)
        .expect("the pinned model runs from the start");

    // A model larger than the budget: 507 at once, naming both sizes.
    let response = post_systemone(&hunch.url, &request("huge")).await;
    assert_eq!(response.status().as_u16(), 507);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["detail"]["error_type"], "insufficient_memory",
        "{body}"
    );
    assert_eq!(body["detail"]["budget_bytes"], budget, "{body}");
    assert!(
        body["detail"]["needed_bytes"].as_u64().unwrap() >= 1 << 40,
        "{body}"
    );
    let message = body["detail"]["message"].as_str().unwrap();
    assert!(message.contains(&budget.to_string()), "{message}");

    // 8 concurrent first requests: one sidecar starts, all are answered.
    let sampler = RssSampler::start(hunch.process.pid());
    let reads: Vec<_> = (0..8)
        .map(|_| {
            let url = hunch.url.clone();
            tokio::spawn(async move {
                post_systemone(&url, &request("llama"))
                    .await
                    .status()
                    .as_u16()
            })
        })
        .collect();
    for r in reads {
        assert_eq!(r.await.unwrap(), 200, "logs:\n{}", hunch.process.logs());
    }
    let text = metrics(&hunch.url).await;
    let loads: u64 = metric_in(
        &text,
        "hunch_model_loads_total{model=\"llama\",outcome=\"ok\"}",
    );
    assert_eq!(loads, 1, "one load for 8 first requests");
    assert_eq!(
        sidecars(&hunch)
            .iter()
            .filter(|(_, n)| n == "llama")
            .count(),
        1
    );

    // qwen fits beside llama; then llama is used again, so qwen is the least recently used and
    // is the one gemma evicts.
    read(&hunch, &request("qwen")).await;
    read(&hunch, &request("llama")).await;
    read(&hunch, &request("gemma")).await;
    assert_eq!(state_of(&hunch, "qwen").await, "available");
    assert_eq!(state_of(&hunch, "llama").await, "loaded");
    assert_eq!(state_of(&hunch, "gemma").await, "loaded");

    // Alternating over three models that cannot all fit: every request answered.
    for name in ["qwen", "llama", "gemma", "qwen", "llama", "gemma"] {
        read(&hunch, &request(name)).await;
    }
    let (most, shares) = sampler.most();
    let list = get_json(&format!("{}/v1/models", hunch.url)).await;
    assert!(
        most <= budget,
        "the sidecars held {most} bytes at once ({shares:?}), over the budget of {budget} \
         (a sidecar after a read: {unit}); now: {list}"
    );
    let text = metrics(&hunch.url).await;
    let evictions: u64 = metric_in(&text, "hunch_model_evictions_total{reason=\"budget\"}");
    assert!(evictions >= 6, "every switch evicted: {evictions}\n{text}");
    let running: Vec<String> = sidecars(&hunch).into_iter().map(|(_, n)| n).collect();
    assert_eq!(running.len(), 3, "{running:?}");
    assert!(sidecars(&hunch).contains(&(pinned_pid, "pinned".into())));

    // x_keep_alive 0 unloads once answered; a short keep-alive expires like a TTL.
    let mut body = request("gemma");
    body["x_keep_alive"] = json!(0);
    read(&hunch, &body).await;
    eventually(Duration::from_secs(10), || async {
        match state_of(&hunch, "gemma").await.as_str() {
            "available" => Ok(()),
            other => Err(format!("gemma is {other} after x_keep_alive 0")),
        }
    })
    .await;
    let mut body = request("llama");
    body["x_keep_alive"] = json!("1s");
    read(&hunch, &body).await;
    let entry = listed(&hunch, "llama").await;
    assert!(
        entry["x_ttl_left_seconds"].as_f64().unwrap() <= 1.0,
        "{entry}"
    );
    eventually(Duration::from_secs(10), || async {
        match state_of(&hunch, "llama").await.as_str() {
            "available" => Ok(()),
            other => Err(format!("llama is {other} after its keep-alive of 1s")),
        }
    })
    .await;
    let text = metrics(&hunch.url).await;
    assert_eq!(
        metric_in::<u64>(&text, "hunch_model_evictions_total{reason=\"keep_alive\"}"),
        1
    );
    assert_eq!(
        metric_in::<u64>(&text, "hunch_model_evictions_total{reason=\"ttl\"}"),
        1
    );

    // A killed sidecar frees its share: qwen is loaded, killed, and is then not resident.
    read(&hunch, &request("qwen")).await;
    assert_eq!(state_of(&hunch, "qwen").await, "loaded");
    let (qwen_pid, _) = sidecars(&hunch)
        .into_iter()
        .find(|(_, n)| n == "qwen")
        .expect("qwen runs");
    let used_before = get_json(&format!("{}/v1/models", hunch.url)).await["x_memory"]["used_bytes"]
        .as_u64()
        .unwrap();
    assert!(std::process::Command::new("kill")
        .args(["-9", &qwen_pid.to_string()])
        .status()
        .unwrap()
        .success());
    let used_after = eventually(Duration::from_secs(10), || async {
        let list = get_json(&format!("{}/v1/models", hunch.url)).await;
        let entry = listed(&hunch, "qwen").await;
        let used = list["x_memory"]["used_bytes"].as_u64().unwrap();
        if entry["x_resident_bytes"].is_null() && entry["x_state"] != "loaded" && used < used_before
        {
            Ok(used)
        } else {
            Err(format!(
                "a killed qwen still counts: {entry} ({used} bytes used)"
            ))
        }
    })
    .await;
    assert!(used_after < used_before, "{used_after} < {used_before}");
    // And a read brings it back.
    read(&hunch, &request("qwen")).await;

    // The admin routes: the key is needed, a pinned model is not unloaded, others are.
    let client = reqwest::Client::new();
    let post = |path: &str, key: Option<&str>| {
        let mut r = client.post(format!("{}/v1/models/{path}", hunch.url));
        if let Some(key) = key {
            r = r.header("x-admin-key", key);
        }
        r.send()
    };
    assert_eq!(post("qwen/unload", None).await.unwrap().status(), 401);
    assert_eq!(
        post("pinned/unload", Some(ADMIN)).await.unwrap().status(),
        409
    );
    assert_eq!(post("huge/load", Some(ADMIN)).await.unwrap().status(), 507);
    assert_eq!(post("nope/load", Some(ADMIN)).await.unwrap().status(), 404);
    let unloaded = post("qwen/unload", Some(ADMIN)).await.unwrap();
    assert_eq!(unloaded.status(), 200);
    eventually(Duration::from_secs(10), || async {
        match state_of(&hunch, "qwen").await.as_str() {
            "available" => Ok(()),
            other => Err(format!("qwen is {other} after an unload")),
        }
    })
    .await;
    let loaded = post("gemma/load", Some(ADMIN)).await.unwrap();
    assert_eq!(loaded.status(), 200);
    let loaded: Value = loaded.json().await.unwrap();
    assert_eq!(loaded["x_state"], "loaded", "{loaded}");
    assert!(loaded["x_resident_bytes"].as_u64().unwrap() > 0, "{loaded}");

    // The console does the same for its admin: a session, its CSRF token, the load button.
    let browserless = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = browserless
        .post(format!("{}/console/login", hunch.url))
        .form(&[("key", ADMIN)])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 303);
    let cookie = login
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    let models_page = || async {
        browserless
            .get(format!("{}/console/models", hunch.url))
            .header(reqwest::header::COOKIE, &cookie)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let page = models_page().await;
    assert!(
        page.contains("action=\"/console/models/qwen/load\""),
        "{page}"
    );
    assert!(
        !page.contains("/console/models/pinned/"),
        "a pinned model has no button"
    );
    let csrf = console_csrf_token(&page);
    let without_token = browserless
        .post(format!("{}/console/models/qwen/load", hunch.url))
        .header(reqwest::header::COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert!(without_token.status().is_client_error());
    let loaded = browserless
        .post(format!("{}/console/models/qwen/load", hunch.url))
        .header(reqwest::header::COOKIE, &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(loaded.status(), 303);
    assert_eq!(state_of(&hunch, "qwen").await, "loaded");
    let page = models_page().await;
    assert!(
        page.contains("Loaded qwen."),
        "the outcome is shown: {page}"
    );
    assert!(
        page.contains("action=\"/console/models/qwen/unload\""),
        "{page}"
    );

    // The pinned model survived all of it, in its first process.
    assert!(sidecars(&hunch).contains(&(pinned_pid, "pinned".into())));
    read(&hunch, &request("pinned")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_model_unloads_after_its_ttl_and_a_new_checkpoint_is_found_without_a_restart() {
    let dir = models_dir(&[("tiny-qwen3.q8_0.gguf", "qwen")]);
    let hunch = start(dir.path(), &["--model-ttl", "1s"]);
    wait_ready_or_logs(&hunch, Duration::from_secs(60)).await;
    read(&hunch, &request("qwen")).await;
    eventually(Duration::from_secs(10), || async {
        match state_of(&hunch, "qwen").await.as_str() {
            "available" => Ok(()),
            other => Err(format!("qwen is {other} past its TTL of 1s")),
        }
    })
    .await;
    assert!(sidecars(&hunch).is_empty(), "its process ended");
    // Copied in while the server runs: found on its first request.
    std::fs::copy(
        checkpoints().join("tiny-llama.q8_0.gguf"),
        dir.path().join("late.gguf"),
    )
    .unwrap();
    read(&hunch, &request("late")).await;
    // Removed: no longer listed once idle and unloaded.
    std::fs::remove_file(dir.path().join("qwen.gguf")).unwrap();
    eventually(Duration::from_secs(10), || async {
        let list = get_json(&format!("{}/v1/models", hunch.url)).await;
        let names: Vec<&str> = list["models"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["name"].as_str())
            .collect();
        if names.contains(&"qwen") {
            Err(format!("qwen still listed: {names:?}"))
        } else {
            Ok(())
        }
    })
    .await;
}

/// `PUT /v1/models/NAME/settings` with the admin key; (status, body).
async fn put_settings(hunch: &Hunch, name: &str, key: &str, body: &Value) -> (u16, Value) {
    let (status, _, body) = hunch_e2e::http::send_json(
        reqwest::Client::new()
            .put(format!("{}/v1/models/{name}/settings", hunch.url))
            .header("x-admin-key", key)
            .json(body),
    )
    .await;
    (status, body)
}

fn listed_names(list: &Value) -> Vec<String> {
    list["models"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|e| e["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_settings_file_applies_at_start_and_put_settings_applies_and_persists() {
    let dir = models_dir(&[
        ("tiny-qwen3.q8_0.gguf", "qwen"),
        ("tiny-llama.q8_0.gguf", "llama"),
    ]);
    let file = dir.path().join("hunch-models.toml");
    // qwen: an alias and its own question mode; llama: a misspelt key, shown, never fatal.
    std::fs::write(
        &file,
        "[models.qwen]\naliases = [\"q\"]\nquestions = \"joint\"\n\n[models.llama]\nttll = \"1s\"\n",
    )
    .unwrap();
    let hunch = start(dir.path(), &[]);
    wait_ready_or_logs(&hunch, Duration::from_secs(60)).await;

    let list = get_json(&format!("{}/v1/models", hunch.url)).await;
    assert!(listed_names(&list).contains(&"q".to_string()), "{list}");
    assert_eq!(
        listed(&hunch, "qwen").await["x_settings"]["questions"],
        "joint"
    );
    let llama = listed(&hunch, "llama").await;
    let error = llama["x_settings_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("hunch-models.toml") && error.contains("llama") && error.contains("ttll"),
        "{llama}"
    );
    // The alias serves, and the model's question mode stands in for the server's (isolated).
    let two = json!({"model": "q", "state": "I was charged twice this month.",
        "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"},
                      "angry": {"type": "noul", "instructions": "Is the customer angry?"}}});
    let response = post_systemone(&hunch.url, &two).await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["x-hunch-questions"], "joint");

    // Refused: no admin key (401), a bad value (422 naming it), an unknown model (404).
    let (status, _) = put_settings(&hunch, "llama", "wrong", &json!({})).await;
    assert_eq!(status, 401);
    let (status, body) = put_settings(&hunch, "llama", ADMIN, &json!({"ttl": "soon"})).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["body", "ttl"]), "{body}");
    let (status, _) = put_settings(&hunch, "nope", ADMIN, &json!({})).await;
    assert_eq!(status, 404);

    // llama: a 1 s TTL and hidden, at once; written to the file beside qwen's table.
    let (status, body) = put_settings(
        &hunch,
        "llama",
        ADMIN,
        &json!({"ttl": "1s", "hidden": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("x_settings_error").is_none(), "{body}");
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(
        written.contains("[models.llama]")
            && written.contains("ttl = \"1s\"")
            && written.contains("hidden = true")
            && written.contains("aliases = [\"q\"]"),
        "{written}"
    );
    let list = get_json(&format!("{}/v1/models", hunch.url)).await;
    assert!(
        !listed_names(&list).contains(&"llama".to_string()),
        "hidden: {list}"
    );
    // Hidden, still served by name; its 1 s TTL unloads it.
    read(&hunch, &request("llama")).await;
    eventually(Duration::from_secs(10), || async {
        let running = sidecars(&hunch);
        if running.iter().any(|(_, n)| n == "llama") {
            Err(format!("llama still runs past its 1 s TTL: {running:?}"))
        } else {
            Ok(())
        }
    })
    .await;

    // qwen, loaded: pinned now (its unload is refused), its dtype from its next load.
    let (status, body) = put_settings(
        &hunch,
        "qwen",
        ADMIN,
        &json!({"aliases": ["q"], "pinned": true, "dtype": "float32"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["x_pinned"], true, "{body}");
    assert!(
        body["x_applied"]
            .as_str()
            .unwrap_or_default()
            .contains("next load"),
        "{body}"
    );
    let (status, _, body) = hunch_e2e::http::send_json(
        reqwest::Client::new()
            .post(format!("{}/v1/models/qwen/unload", hunch.url))
            .header("x-admin-key", ADMIN),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    // Another method on the settings route: 405 naming the one it takes.
    let response = reqwest::Client::new()
        .post(format!("{}/v1/models/qwen/settings", hunch.url))
        .header("x-admin-key", ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 405);
    assert_eq!(response.headers()["allow"], "PUT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_waits_too_long_for_a_load_is_told_the_time_left() {
    // The fixture sidecar (a test double) takes 8 s to load, reporting its progress: long enough
    // to watch; a real tiny checkpoint loads in well under a second.
    let dir = tempfile::tempdir().unwrap();
    let mut gguf = b"GGUF".to_vec();
    gguf.resize(4096, 0);
    std::fs::write(dir.path().join("slow.gguf"), gguf).unwrap();
    let d = dir.path().to_string_lossy().into_owned();
    let bin = hunch_e2e::fixture_sidecar_bin()
        .to_string_lossy()
        .into_owned();
    let hunch = start_hunch_with(
        &["--models-dir", d.as_str(), "--request-timeout", "4"],
        &[
            ("HUNCH_ACCELERATOR_BIN", bin),
            ("FIXTURE_LOAD_MS", "8000".into()),
        ],
    );
    wait_ready_or_logs(&hunch, Duration::from_secs(30)).await;
    // The read waits 2 s (the request timeout less 2), then a 503 naming the time left.
    let response = post_systemone(&hunch.url, &request("slow")).await;
    assert_eq!(response.status().as_u16(), 503);
    let retry: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body: Value = response.json().await.unwrap();
    let message = body["detail"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("s left"), "{body}");
    // 2 s of 8: about 6 s left (the sidecar's clock starts a little after the host's).
    assert!((2..=9).contains(&retry), "Retry-After {retry}: {body}");
    let slow = listed(&hunch, "slow").await;
    assert_eq!(slow["x_state"], "loading", "{slow}");
    let left = slow["x_load_seconds_left"].as_f64().expect("a time left");
    assert!(left > 0.0 && left < 9.0, "{slow}");
    // The load went on: a retry after it finds it loaded.
    eventually(Duration::from_secs(20), || async {
        match state_of(&hunch, "slow").await.as_str() {
            "loaded" => Ok(()),
            other => Err(format!("slow is {other}")),
        }
    })
    .await;
    assert!(listed(&hunch, "slow")
        .await
        .get("x_load_seconds_left")
        .is_none());
}
