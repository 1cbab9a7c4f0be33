//! Overload, timeouts, auth, sidecar death and restart, loading, graceful shutdown: each against a
//! real `hunch serve` supervising the fixture sidecar.

use hunch_e2e::http::{json_of, post_systemone};
use hunch_e2e::{
    child_pids, fixture_sidecar_bin, sample_request, start_hunch_with, start_hunch_with_fixture,
    wait_ready,
};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn with_state(state: &str) -> Value {
    let mut r = sample_request();
    r["state"] = json!(state);
    r
}

#[tokio::test]
async fn a_sidecar_dying_mid_request_is_a_503_then_it_is_restarted() {
    let hunch = start_hunch_with_fixture("dg-test", &[]).await;
    let started = Instant::now();
    let r = post_systemone(&hunch.url, &with_state("please __die__ now")).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the failed request must not hang"
    );
    // Until the new sidecar is ready, reads are refused at once (503 + Retry-After), never hung;
    // then the restarted sidecar answers.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let t = Instant::now();
        let r = post_systemone(&hunch.url, &sample_request()).await;
        if r.status() == 200 {
            break;
        }
        assert_eq!(r.status(), 503);
        assert!(r.headers().contains_key("retry-after"));
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "a refused read must not hang"
        );
        assert!(Instant::now() < deadline, "the sidecar was not restarted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logs = hunch.process.logs();
    assert!(logs.contains("the sidecar exited"), "{logs}");
}

#[tokio::test]
async fn a_full_queue_answers_503_with_retry_after() {
    let hunch = start_hunch_with_fixture(
        "dg-test",
        &["--max-concurrent-reads", "1", "--max-queued-reads", "1"],
    )
    .await;
    let slow = with_state("slow __sleep_ms=3000");
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let url = hunch.url.clone();
            let body = slow.clone();
            tokio::spawn(async move {
                let r = post_systemone(&url, &body).await;
                (r.status().as_u16(), r.headers().get("retry-after").cloned())
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for c in calls {
        let (status, retry_after) = c.await.unwrap();
        if status == 503 {
            assert!(retry_after.is_some());
        }
        statuses.push(status);
    }
    statuses.sort();
    assert_eq!(
        statuses,
        vec![200, 200, 503, 503],
        "one runs, one waits, the rest are refused"
    );
}

#[tokio::test]
async fn a_slow_read_is_a_504() {
    let hunch = start_hunch_with_fixture("dg-test", &["--request-timeout", "1.5"]).await;
    let started = Instant::now();
    let r = post_systemone(&hunch.url, &with_state("__sleep_ms=6000")).await;
    assert_eq!(r.status(), 504);
    assert!(started.elapsed() < Duration::from_secs(5));
    // The slot is free again: the next read is answered.
    assert_eq!(
        post_systemone(&hunch.url, &sample_request()).await.status(),
        200
    );
}

#[tokio::test]
async fn api_keys_from_the_flags_replace_the_environments() {
    let bin = fixture_sidecar_bin().to_string_lossy().into_owned();
    let hunch = start_hunch_with(
        &["--model", "dg=/tmp", "--api-key", "flag-key"],
        &[
            ("HUNCH_ACCELERATOR_BIN", bin),
            ("HUNCH_API_KEYS", "env-key-1, env-key-2".into()),
            ("FIXTURE_LOAD_MS", "0".into()),
        ],
    );
    wait_ready(&hunch.url, Duration::from_secs(30)).await;
    let client = reqwest::Client::new();
    let call = |key: Option<&str>| {
        let mut r = client
            .post(format!("{}/v1/systemone", hunch.url))
            .json(&sample_request());
        if let Some(k) = key {
            r = r.header("authorization", k);
        }
        r.send()
    };
    assert_eq!(call(None).await.unwrap().status(), 401);
    assert_eq!(call(Some("Bearer wrong")).await.unwrap().status(), 401);
    assert_eq!(call(Some("flag-key")).await.unwrap().status(), 401);
    assert_eq!(call(Some("Bearer flag-key")).await.unwrap().status(), 200);
    // A list set by a flag replaces the variable's (docs/api.md): the variable's keys are off.
    assert_eq!(call(Some("Bearer env-key-2")).await.unwrap().status(), 401);
    let r = client
        .get(format!("{}/v1/models", hunch.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // Health and metrics stay open for probes.
    assert_eq!(
        client
            .get(format!("{}/healthz", hunch.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn without_keys_any_authorization_header_is_accepted() {
    let hunch = start_hunch_with_fixture("dg-test", &[]).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/systemone", hunch.url))
        .header("authorization", "Bearer whatever-the-sdk-sends")
        .json(&sample_request())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn while_loading_reads_are_refused_with_retry_after() {
    let bin = fixture_sidecar_bin().to_string_lossy().into_owned();
    let hunch = start_hunch_with(
        &["--model", "dg=/tmp"],
        &[
            ("HUNCH_ACCELERATOR_BIN", bin),
            ("FIXTURE_LOAD_MS", "8000".into()),
        ],
    );
    let client = reqwest::Client::new();
    let r = client
        .get(format!("{}/readyz", hunch.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let r = post_systemone(&hunch.url, &sample_request()).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    wait_ready(&hunch.url, Duration::from_secs(30)).await;
    assert_eq!(
        post_systemone(&hunch.url, &sample_request()).await.status(),
        200
    );
    assert!(hunch.process.logs().contains("sidecar loading"));
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests_and_stops_the_sidecar() {
    let mut hunch = start_hunch_with_fixture("dg-test", &[]).await;
    let url = hunch.url.clone();
    let in_flight = tokio::spawn(async move {
        post_systemone(&url, &with_state("__sleep_ms=3000"))
            .await
            .status()
            .as_u16()
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    hunch.process.terminate();
    assert_eq!(
        in_flight.await.unwrap(),
        200,
        "the in-flight request was drained"
    );
    let status = hunch
        .process
        .wait_exit(Duration::from_secs(15))
        .expect("hunch exits after draining");
    assert!(status.success(), "{status:?}");
    let logs = hunch.process.logs();
    assert!(logs.contains("sidecar stopped"), "{logs}");
}

#[tokio::test]
async fn a_sidecar_started_elsewhere_is_used_by_url_and_named_by_its_health() {
    let (url, _sidecar) = hunch_e2e::start_process(
        &fixture_sidecar_bin(),
        &[
            "serve".into(),
            "--model".into(),
            "/none".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--name".into(),
            "outside".into(),
        ],
        &[("FIXTURE_LOAD_MS", "0".to_string())],
        "HUNCH_ACCELERATOR_LISTENING ",
    );
    let hunch = hunch_e2e::start_hunch(&["--accelerator", &url]);
    wait_ready(&hunch.url, Duration::from_secs(10)).await;
    let r = post_systemone(&hunch.url, &sample_request()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["model"], "outside");
}

#[tokio::test]
async fn a_sidecar_that_fails_to_load_is_restarted_and_never_ready() {
    let bin = fixture_sidecar_bin().to_string_lossy().into_owned();
    let hunch = start_hunch_with(
        &["--model", "dg=/tmp"],
        &[
            ("HUNCH_ACCELERATOR_BIN", bin),
            ("FIXTURE_FAIL_LOAD", "1".into()),
        ],
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(format!("{}/readyz", hunch.url))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
    let r = post_systemone(&hunch.url, &sample_request()).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let logs = hunch.process.logs();
    assert!(logs.contains("the sidecar failed"), "{logs}");
}

#[tokio::test]
async fn a_toml_file_configures_models_keys_and_limits() {
    let dir = std::env::temp_dir().join(format!("hunch-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("hunch.toml");
    std::fs::write(
        &file,
        format!(
            "api_keys = [\"toml-key\"]\nmax_body_bytes = 5000\naccelerator_bin = {:?}\n\
             [[models]]\nname = \"from-toml\"\ndir = \"/tmp\"\ndescription = \"configured in TOML\"\nrelease_date = \"2026-09-15\"\n\
             [aliases]\nfast = \"from-toml\"\n",
            fixture_sidecar_bin().to_string_lossy()
        ),
    )
    .unwrap();
    let hunch = start_hunch_with(
        &["--config", file.to_str().unwrap()],
        &[("FIXTURE_LOAD_MS", "0".into())],
    );
    wait_ready(&hunch.url, Duration::from_secs(10)).await;
    let client = reqwest::Client::new();
    let models = json_of(
        client
            .get(format!("{}/v1/models", hunch.url))
            .bearer_auth("toml-key"),
    )
    .await;
    // TypeSafe's fields and the fingerprint as configured; the process's own fields beside them
    // (docs/api.md) are checked in model_memory.rs.
    let listed = &models["models"][2];
    for (field, value) in [
        ("name", json!("from-toml")),
        ("description", json!("configured in TOML")),
        ("release_date", json!("2026-09-15")),
        (
            "x_fingerprint",
            json!(format!(
                "fixture/from-toml/{}",
                hunch_core::READ_ALGORITHM_VERSION
            )),
        ),
        ("x_state", json!("loaded")),
    ] {
        assert_eq!(listed[field], value, "{field} of {listed}");
    }
    let mut big = sample_request();
    big["model"] = json!("fast");
    big["state"] = json!("x".repeat(6000));
    let r = client
        .post(format!("{}/v1/systemone", hunch.url))
        .bearer_auth("toml-key")
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_hung_sidecar_is_restarted_and_reads_time_out_meanwhile() {
    let hunch = start_hunch_with_fixture("dg-test", &["--request-timeout", "2"]).await;
    let sidecar = child_pids(hunch.process.pid())
        .into_iter()
        .find(|k| {
            std::fs::read_to_string(format!("/proc/{k}/cmdline"))
                .is_ok_and(|c| c.contains("fixture-sidecar"))
        })
        .expect("the sidecar is a child of hunch");
    // Freeze it: it still accepts connections (the kernel does) but never answers.
    std::process::Command::new("kill")
        .args(["-STOP", &sidecar.to_string()])
        .status()
        .unwrap();
    // Wait until the kernel reports it stopped (state T) before asking anything.
    let stopped = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{sidecar}/stat")).is_ok_and(|st| {
        st.rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('T'))
    }) {
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "the sidecar did not stop"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = Instant::now();
    let r = post_systemone(&hunch.url, &sample_request()).await;
    assert!(matches!(r.status().as_u16(), 503 | 504), "{}", r.status());
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "a read of a hung sidecar must not hang"
    );
    // After a few failed health checks the supervisor kills it and starts a new one.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = post_systemone(&hunch.url, &sample_request()).await;
        if r.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hung sidecar was not replaced"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        !child_pids(hunch.process.pid()).contains(&sidecar),
        "the hung sidecar is gone"
    );
    assert!(hunch.process.logs().contains("health checks in a row"));
}
