//! What a model's sidecar holds, measured (docs/models.md, "The size estimate"): the REAL sidecar
//! on the tiny checkpoint reports its process's resident bytes on `/metrics`, and a sidecar that
//! dies is accounted as holding nothing until its replacement runs.

use hunch_e2e::http::metric_in;
use hunch_e2e::{sidecar_pid, start_hunch_real, Hunch, TINY_MODEL};
use std::time::{Duration, Instant};

async fn resident_metric(hunch: &Hunch) -> u64 {
    let text = hunch_e2e::http::metrics(&hunch.url).await;
    metric_in(
        &text,
        &format!("hunch_model_resident_bytes{{model=\"{TINY_MODEL}\"}}"),
    )
}

/// `VmRSS` of `pid` in bytes, read here as the server reads it.
fn vm_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the sidecar runs");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("a VmRSS line");
    kb * 1024
}

#[tokio::test]
async fn the_sidecars_resident_bytes_are_measured_and_a_dead_one_holds_nothing() {
    let hunch = start_hunch_real(&[]).await;
    let pid = sidecar_pid(hunch.process.pid()).expect("hunch runs a hunch-accelerator child");

    // The server's figure is the process's own, give or take what the process did between the
    // two readings.
    let reported = resident_metric(&hunch).await;
    let measured = vm_rss(pid);
    assert!(
        reported > 1 << 20,
        "a loaded sidecar holds memory: {reported}"
    );
    let (lo, hi) = (measured / 4 * 3, measured / 4 * 5);
    assert!(
        (lo..=hi).contains(&reported),
        "/metrics says {reported} bytes, /proc/{pid}/status says {measured}"
    );

    // /v1/models says the same of the model and of its alias.
    let listed: serde_json::Value = reqwest::get(format!("{}/v1/models", hunch.url))
        .await
        .expect("GET /v1/models")
        .json()
        .await
        .expect("a JSON list");
    for name in [TINY_MODEL, "jev-latest"] {
        let entry = listed["models"]
            .as_array()
            .and_then(|m| m.iter().find(|e| e["name"] == name))
            .unwrap_or_else(|| panic!("{name} listed in {listed}"));
        assert_eq!(entry["x_state"], "loaded", "{entry}");
        assert_eq!(entry["x_pinned"], true, "{entry}");
        let bytes = entry["x_resident_bytes"].as_u64().expect("measured bytes");
        assert!((lo..=hi).contains(&bytes), "{entry} against {measured}");
    }

    // Killed, it holds nothing: the figure drops to 0 before the restarted sidecar (after a
    // backoff of a second) runs.
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if resident_metric(&hunch).await == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a dead sidecar is still counted; logs:\n{}",
            hunch.process.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The replacement is measured in its turn.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(new) = sidecar_pid(hunch.process.pid()).filter(|p| *p != pid) {
            if resident_metric(&hunch).await > 0 {
                assert!(vm_rss(new) > 0);
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the restarted sidecar is not measured; logs:\n{}",
            hunch.process.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
