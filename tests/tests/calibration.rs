//! `hunch calibrate` end to end (docs/calibration.md): a server with the fixture sidecar writes a
//! decision log, labels are written for its decisions, and the command fits, refuses what has too
//! few labels, reports every label it could not use, and writes the file and the HTML report.

use hunch_e2e::http::post_json;
use hunch_e2e::{hunch_bin, start_hunch_with_fixture};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `command` (a `hunch` command line) and fails the test, with its stderr, unless it succeeds.
fn run_ok(command: &mut Command) -> Output {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `hunch calibrate` of decision log `log` with the labels in `labels`, writing `out`.
fn calibrate(log: &str, labels: &Path, out: &Path) -> Command {
    let mut command = Command::new(hunch_bin());
    command
        .args(["calibrate", "--log", log, "--labels"])
        .arg(labels)
        .arg("-o")
        .arg(out);
    command
}

/// The log's events once it holds `n` (the file sink writes in the background).
async fn wait_for_events(path: &Path, n: usize) {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().filter(|l| !l.trim().is_empty()).count() >= n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the log holds fewer than {n} events"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn labelled_decisions_are_calibrated_and_every_unused_label_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("decisions.ndjson");
    let l = log.display().to_string();
    let hunch = start_hunch_with_fixture("dg-test", &["--decision-log", &l]).await;
    let n = 60;
    let mut lines = Vec::new();
    for i in 0..n {
        let body = json!({
            "model": "dg-test",
            "state": format!("ticket {i}: the printer on floor {} is {}", i % 7, i * 13 % 11),
            "questions": {
                "urgent": {"type": "noul", "instructions": "Is this urgent?"},
                "team": {"type": "choice", "instructions": "Which team?",
                         "criteria": {"it": "IT", "facilities": "Facilities", "sales": "Sales"}}
            }
        });
        let (status, headers, answer) =
            post_json(&format!("{}/v1/systemone", hunch.url), &body, &[]).await;
        assert_eq!(status, 200, "{answer}");
        let id = headers["x-hunch-decision-id"].to_str().unwrap().to_owned();
        // The labels agree with the answer three times in four: a model over-confident here.
        let p_yes = answer["answers"]["urgent"]["noul"].as_f64().unwrap();
        let label = (p_yes >= 0.5) != (i % 4 == 0);
        let mut labels = json!({"urgent": label});
        if i < 10 {
            labels["team"] = json!("it");
        }
        if i == 0 {
            labels["nope"] = json!(true);
        }
        if i == 1 {
            labels["team"] = json!("marketing");
        }
        lines.push(json!({"decision_id": id, "labels": labels}).to_string());
    }
    lines.push(json!({"decision_id": "not-a-decision", "labels": {"urgent": true}}).to_string());
    lines.push("not json".into());
    let labels = dir.path().join("labels.jsonl");
    std::fs::write(&labels, lines.join("\n")).unwrap();
    wait_for_events(&log, n).await;

    let out_file = dir.path().join("calibration.json");
    let report = dir.path().join("report");
    let out = run_ok(
        calibrate(&l, &labels, &out_file)
            .arg("--report")
            .arg(&report)
            .arg("--json"),
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let written: Value = serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap();
    assert_eq!(printed, written);

    let questions = printed["questions"].as_array().unwrap();
    assert_eq!(questions.len(), 1, "{printed:#}");
    let urgent = &questions[0];
    assert_eq!(urgent["ids"], json!(["urgent"]));
    assert_eq!(urgent["labels"], json!(n));
    assert!(urgent["temperature"].as_f64().unwrap() > 0.0);
    for side in ["before", "after"] {
        for metric in ["nll", "brier", "ece", "accuracy"] {
            assert!(urgent[side][metric].is_number(), "{side}.{metric}");
        }
    }
    // A temperature never changes which answer is most likely.
    assert_eq!(urgent["before"]["accuracy"], urgent["after"]["accuracy"]);
    assert_eq!(urgent["cut_points"].as_array().unwrap().len(), 3);

    // 9 usable team labels (one named an option the question does not have) are too few.
    let refused = &printed["refused"][0];
    assert_eq!(refused["ids"], json!(["team"]));
    assert_eq!(refused["labels"], json!(9));
    assert_eq!(refused["needed"], printed["min_labels"]);

    let reasons: Vec<String> = printed["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{} {}",
                p["question_id"].as_str().unwrap_or("-"),
                p["reason"]
            )
        })
        .collect();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    assert!(reasons
        .iter()
        .any(|r| r.starts_with("nope ") && r.contains("no question")));
    assert!(reasons
        .iter()
        .any(|r| r.starts_with("team ") && r.contains("marketing")));
    assert!(reasons
        .iter()
        .any(|r| r.contains("no /v1/systemone decision")));
    assert!(reasons.iter().any(|r| r.contains("not JSON")));

    let html = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert_eq!(
        html.matches("<svg").count(),
        2,
        "before and after for the one fitted question"
    );
    assert!(html.contains("Cut-points") && !html.contains("<script"));
}

/// A calibration fitted on 60 fixture decisions whose `urgent` labels agree with the answer three
/// times in four; returns the calibration file.
async fn fitted_calibration(dir: &Path) -> std::path::PathBuf {
    let log = dir.join("fit.ndjson");
    let l = log.display().to_string();
    let hunch = start_hunch_with_fixture("dg-test", &["--decision-log", &l]).await;
    let mut lines = Vec::new();
    let n = 60;
    for i in 0..n {
        let (status, headers, answer) = post_json(
            &format!("{}/v1/systemone", hunch.url),
            &urgent_request(i),
            &[],
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let id = headers["x-hunch-decision-id"].to_str().unwrap().to_owned();
        let p_yes = answer["answers"]["urgent"]["noul"].as_f64().unwrap();
        let label = (p_yes >= 0.5) != (i % 4 == 0);
        lines.push(json!({"decision_id": id, "labels": {"urgent": label}}).to_string());
    }
    let labels = dir.join("fit-labels.jsonl");
    std::fs::write(&labels, lines.join("\n")).unwrap();
    wait_for_events(&log, n).await;
    let file = dir.join("calibration.json");
    run_ok(&mut calibrate(&l, &labels, &file));
    file
}

fn urgent_request(i: usize) -> Value {
    json!({
        "model": "dg-test",
        "state": format!("ticket {i}: the printer on floor {} is {}", i % 7, i * 13 % 11),
        "questions": {"urgent": {"type": "noul", "instructions": "Is this urgent?"}}
    })
}

#[tokio::test]
async fn a_served_calibrated_answer_equals_the_offline_calibration_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let file = fitted_calibration(dir.path()).await;
    let bytes = std::fs::read(&file).unwrap();
    let calibrations = hunch::calibration::file::Calibrations::from_bytes(&bytes).unwrap();
    let temperature = serde_json::from_slice::<Value>(&bytes).unwrap()["questions"][0]
        ["temperature"]
        .as_f64()
        .unwrap();
    assert_ne!(temperature, 1.0);

    let log = dir.path().join("served.ndjson");
    let (l, f) = (log.display().to_string(), file.display().to_string());
    let hunch =
        start_hunch_with_fixture("dg-test", &["--decision-log", &l, "--calibration", &f]).await;
    let models = hunch_e2e::http::get_json(&format!("{}/v1/models", hunch.url)).await;
    assert_eq!(models["x_calibration"]["id"], json!(calibrations.id));

    // A state the calibration was not fitted on, asked calibrated and raw.
    let mut request = urgent_request(1000);
    let (_, _, calibrated) = post_json(&format!("{}/v1/systemone", hunch.url), &request, &[]).await;
    request["x_calibration"] = json!("off");
    let (status, _, raw) = post_json(&format!("{}/v1/systemone", hunch.url), &request, &[]).await;
    assert_eq!(status, 200, "{raw}");
    wait_for_events(&log, 2).await;

    let text = std::fs::read_to_string(&log).unwrap();
    let events: Vec<hunch::decision::event::DecisionEvent> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let read = &events[0].reads[0];
    let question = &read.questions[0];
    let recorded_raw = &read.distributions.as_ref().unwrap()[0];
    let offline = hunch_core::LabelDistribution(
        calibrations
            .for_question(question)
            .expect("the calibration covers the question")
            .apply(recorded_raw.probabilities()),
    );
    let noul = |d: &hunch_core::LabelDistribution| match hunch_core::Answer::from_distribution(
        question, d,
    )
    .unwrap()
    {
        hunch_core::Answer::Noul { noul } => noul,
        other => panic!("{other:?}"),
    };
    let served = calibrated["answers"]["urgent"]["noul"].as_f64().unwrap();
    assert_eq!(served.to_bits(), noul(&offline).to_bits());
    assert_eq!(
        raw["answers"]["urgent"]["noul"].as_f64().unwrap().to_bits(),
        noul(recorded_raw).to_bits()
    );
    assert_ne!(served, noul(recorded_raw));
    // The record holds raw and calibrated distributions and the calibration's id; the raw
    // request's record names no calibration.
    assert_eq!(
        events[0].calibration.as_deref(),
        Some(calibrations.id.as_str())
    );
    assert_eq!(
        read.calibrated.as_ref().unwrap()[0].as_ref(),
        Some(&offline)
    );
    assert_eq!(events[1].calibration, None);
    assert!(events[1].reads[0].calibrated.is_none());

    // Replaying the same calibration: the calibrated decision does not move at all, the raw one
    // moves by exactly the calibration's change of its probabilities.
    let out = run_ok(Command::new(hunch_bin()).args([
        "replay",
        "--log",
        &l,
        "--calibration",
        &f,
        "--json",
    ]));
    let replayed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(replayed["calibration"], json!(calibrations.id));
    assert_eq!(
        (replayed["decisions"].clone(), replayed["covered"].clone()),
        (json!(2), json!(2))
    );
    let moved = replayed["max_probability_move"].as_f64().unwrap();
    assert!(
        (moved - (served - noul(recorded_raw)).abs()).abs() < 1e-12,
        "{moved}"
    );
}

#[tokio::test]
async fn a_rewritten_calibration_file_is_swapped_in_while_serving_and_a_broken_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let file = fitted_calibration(dir.path()).await;
    let served = dir.path().join("served.json");
    std::fs::copy(&file, &served).unwrap();
    let s = served.display().to_string();
    let hunch = start_hunch_with_fixture("dg-test", &["--calibration", &s]).await;
    let models = format!("{}/v1/models", hunch.url);
    let first = hunch_e2e::http::get_json(&models).await["x_calibration"]["id"].clone();

    // The same calibration with one question fewer is another file, so another id.
    let mut edited: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    edited["questions"] = json!([]);
    std::fs::write(&served, serde_json::to_vec(&edited).unwrap()).unwrap();
    let start = Instant::now();
    loop {
        let now = hunch_e2e::http::get_json(&models).await["x_calibration"].clone();
        if now["id"] != first {
            assert_eq!(now["questions"], json!(0));
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never reloaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A broken file leaves the served calibration in place.
    std::fs::write(&served, b"{ not a calibration").unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let now = hunch_e2e::http::get_json(&models).await["x_calibration"]["questions"].clone();
    assert_eq!(now, json!(0));
    let (status, _, _) = post_json(
        &format!("{}/v1/systemone", hunch.url),
        &urgent_request(1),
        &[],
    )
    .await;
    assert_eq!(status, 200);
}
