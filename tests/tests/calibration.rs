//! `hunch calibrate` end to end (docs/calibration.md): a server with the fixture sidecar writes a
//! decision log, labels are written for its decisions, and the command fits, refuses what has too
//! few labels, reports every label it could not use, and writes the file and the HTML report; the
//! same from a `hunch batch` output labelled by `custom_id`. Serving: `/v1/systemone` and a
//! policy's reads answer with the offline calibrated distribution bit for bit, a policy's own
//! calibration (`NAME.toml`) overrides the server's and reloads with it, and a replay of the
//! calibrated policy decisions changes nothing.

use hunch_e2e::http::post_json;
use hunch_e2e::{eventually, hunch_bin, start_hunch_with_fixture};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

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
    eventually(Duration::from_secs(30), || async {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let held = text.lines().filter(|l| !l.trim().is_empty()).count();
        if held >= n {
            Ok(())
        } else {
            Err(format!("the log holds {held} events, fewer than {n}"))
        }
    })
    .await
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
        .any(|r| r.contains("no /v1/systemone or policy decision")));
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
    let now = until_json(&models, "never reloaded", |m| {
        m["x_calibration"]["id"] != first
    })
    .await["x_calibration"]
        .clone();
    assert_eq!(now["questions"], json!(0));
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

/// A calibration file covering one noul question (no criteria) with `temperature`, written by
/// hand: serving only needs the question and what was fitted.
fn calibration_for(instructions: &str, temperature: f64) -> Vec<u8> {
    let metrics = json!({"nll": 0.0, "brier": 0.0, "ece": 0.0, "accuracy": 0.0, "bins": []});
    serde_json::to_vec_pretty(&json!({
        "format": "hunch-calibration/1", "folds": 5, "ece_bins": 10, "ece_binning": "",
        "min_labels": 30,
        "questions": [{"key": "", "ids": ["urgent"],
            "question": {"instructions": instructions, "type": "noul", "yes": null, "no": null},
            "temperature": temperature, "labels": 60, "fold_temperatures": [],
            "before": metrics, "after": metrics}]
    }))
    .unwrap()
}

/// The question the `replay-probe` policy asks as `urgent` (its `baseline` is never calibrated).
const PROBE_URGENT: &str = "Does this message need an answer today?";

fn probe_input(i: usize) -> Value {
    let texts = [
        "The production database is down and customers cannot pay.",
        "Thanks for the lovely flowers last week!",
        "URGENT: our account was charged twice, please refund today.",
        "Lunch on Friday?",
    ];
    json!({"id": i, "message": texts[i % texts.len()]})
}

/// The noul a question's answer is from `p`, as the answer math computes it.
fn noul_of(question: &hunch_core::Question, p: &[f64]) -> f64 {
    match hunch_core::Answer::from_distribution(
        question,
        &hunch_core::LabelDistribution(p.to_vec()),
    )
    .unwrap()
    {
        hunch_core::Answer::Noul { noul } => noul,
        other => panic!("{other:?}"),
    }
}

/// The decision events of `path` once it holds `n`.
async fn decision_events(path: &Path, n: usize) -> Vec<hunch::decision::event::DecisionEvent> {
    wait_for_events(path, n).await;
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Polls the JSON at `url` until `done` holds of it, and returns it; gives up saying `what`
/// with the last body.
async fn until_json(url: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    eventually(Duration::from_secs(20), || async {
        let body = hunch_e2e::http::get_json(url).await;
        if done(&body) {
            Ok(body)
        } else {
            Err(format!("{what}: {body}"))
        }
    })
    .await
}

/// Polls `GET /v1/policies/p` until its calibration's id is `id` (the policy reloaded).
async fn until_policy_calibration(url: &str, id: Option<&str>) -> Value {
    until_json(url, &format!("never reloaded to {id:?}"), |summary| {
        summary["calibration"]["id"].as_str() == id
    })
    .await
}

#[tokio::test]
async fn a_policys_reads_are_calibrated_like_systemone_and_its_own_calibration_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    let wasm = hunch::policy::testing::built_policy("replay_probe")
        .expect("the policies build (wasm32-wasip2)");
    std::fs::write(policies.join("p.wasm"), &wasm).unwrap();
    let server_file = dir.path().join("server.json");
    std::fs::write(&server_file, calibration_for(PROBE_URGENT, 2.0)).unwrap();
    let own_file = policies.join("p.calibration.json");
    std::fs::write(&own_file, calibration_for(PROBE_URGENT, 0.5)).unwrap();
    let server_cal =
        hunch::calibration::file::Calibrations::from_bytes(&std::fs::read(&server_file).unwrap())
            .unwrap();
    let own_cal =
        hunch::calibration::file::Calibrations::from_bytes(&std::fs::read(&own_file).unwrap())
            .unwrap();

    let log = dir.path().join("decisions.ndjson");
    let (l, p, f) = (
        log.display().to_string(),
        policies.display().to_string(),
        server_file.display().to_string(),
    );
    let hunch = start_hunch_with_fixture(
        "dg-test",
        &["--decision-log", &l, "--policies", &p, "--calibration", &f],
    )
    .await;
    let policy_url = format!("{}/v1/policies/p", hunch.url);
    let summary = hunch_e2e::http::get_json(&policy_url).await;
    assert_eq!(summary["calibration"]["source"], "server");
    assert_eq!(summary["calibration"]["id"], json!(server_cal.id));

    // Each phase: which calibration the policy's `urgent` read is answered with.
    let phases: [(
        Option<&str>,
        Option<&hunch::calibration::file::Calibrations>,
    ); 3] = [
        (None, Some(&server_cal)),
        (
            Some("[calibration]\nfile = \"p.calibration.json\"\n"),
            Some(&own_cal),
        ),
        (Some("calibration = \"off\"\n"), None),
    ];
    let mut seen = 0;
    for (phase, (toml, expected)) in phases.iter().enumerate() {
        if let Some(t) = toml {
            std::fs::write(policies.join("p.toml"), t).unwrap();
            let id = expected.map(|c| c.id.as_str());
            let summary = until_policy_calibration(&policy_url, id).await;
            let source = if expected.is_some() { "policy" } else { "off" };
            assert_eq!(summary["calibration"]["source"], source, "{summary}");
        }
        for i in 0..4 {
            let (status, _, body) = post_json(&policy_url, &probe_input(phase * 4 + i), &[]).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(
                body["calibration"].as_str(),
                expected.map(|c| c.id.as_str()),
                "the response names the calibration"
            );
            seen += 1;
            let events = decision_events(&log, seen).await;
            let event = &events[seen - 1];
            assert_eq!(
                event.calibration.as_deref(),
                expected.map(|c| c.id.as_str())
            );
            let read = &event.reads[0];
            let raw = read.distributions.as_ref().unwrap();
            let j = read
                .questions
                .iter()
                .position(|q| q.instructions == PROBE_URGENT)
                .unwrap();
            let question = &read.questions[j];
            let served_from = match expected {
                Some(c) => {
                    let offline = c
                        .for_question(question)
                        .expect("covered")
                        .apply(raw[j].probabilities());
                    // The record keeps raw and calibrated.
                    assert_eq!(
                        read.calibrated.as_ref().unwrap()[j].as_ref().unwrap().0,
                        offline
                    );
                    offline
                }
                None => {
                    assert!(read.calibrated.is_none());
                    raw[j].probabilities().to_vec()
                }
            };
            let p_urgent = body["output"]["p_urgent"].as_f64().unwrap();
            assert_eq!(
                p_urgent.to_bits(),
                noul_of(question, &served_from).to_bits(),
                "phase {phase}: the policy saw the offline calibrated distribution bit for bit"
            );
            if expected.is_some() {
                assert_ne!(p_urgent, noul_of(question, raw[j].probabilities()));
            }
            // The baseline question is covered by no calibration: raw.
            let b = 1 - j;
            assert_eq!(
                body["output"]["p_baseline"].as_f64().unwrap().to_bits(),
                noul_of(&read.questions[b], raw[b].probabilities()).to_bits()
            );
        }
    }

    // The policy's own file changing alone reloads the policy with it.
    std::fs::write(
        policies.join("p.toml"),
        "[calibration]\nfile = \"p.calibration.json\"\n",
    )
    .unwrap();
    until_policy_calibration(&policy_url, Some(&own_cal.id)).await;
    std::fs::write(&own_file, calibration_for(PROBE_URGENT, 3.0)).unwrap();
    let new_id = hunch::calibration::file_id(&std::fs::read(&own_file).unwrap());
    until_policy_calibration(&policy_url, Some(&new_id)).await;
    // A broken file is refused and the loaded calibration keeps serving.
    std::fs::write(&own_file, b"{ not a calibration").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let summary = hunch_e2e::http::get_json(&policy_url).await;
    assert_eq!(summary["calibration"]["id"], json!(new_id));
    assert_eq!(summary["last_reload"]["ok"], false, "{summary}");

    // Replaying the recorded decisions through the same component with no `NAME.toml` answers
    // from what was served: nothing changes, whichever calibration each decision had.
    let replay_dir = dir.path().join("replay");
    std::fs::create_dir(&replay_dir).unwrap();
    std::fs::write(replay_dir.join("p.wasm"), &wasm).unwrap();
    let component = format!("p={}", replay_dir.join("p.wasm").display());
    let out = Command::new(hunch_bin())
        .args(["replay", "--log", &l, "--policy", &component, "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["decisions"], json!(12), "{report}");
    assert_eq!(report["unchanged"], json!(12), "{report}");
    // With its own calibration beside it, the component calibrates the recorded raw reads: the
    // decisions served with that same calibration are unchanged, every other one moves.
    std::fs::write(
        replay_dir.join("own.json"),
        calibration_for(PROBE_URGENT, 0.5),
    )
    .unwrap();
    std::fs::write(
        replay_dir.join("p.toml"),
        "[calibration]\nfile = \"own.json\"\n",
    )
    .unwrap();
    let out = Command::new(hunch_bin())
        .args(["replay", "--log", &l, "--policy", &component, "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (report["unchanged"].clone(), report["changed"].clone()),
        (json!(4), json!(8)),
        "{report}"
    );

    // A new calibration shadowed before promotion: the same component as a candidate whose own
    // TOML names the new file. Its shadow runs answer the active decision's raw reads with it.
    std::fs::write(&own_file, calibration_for(PROBE_URGENT, 3.0)).unwrap();
    let next_file = policies.join("p.next.calibration.json");
    std::fs::write(&next_file, calibration_for(PROBE_URGENT, 1.5)).unwrap();
    let next_id = hunch::calibration::file_id(&std::fs::read(&next_file).unwrap());
    std::fs::write(
        policies.join("p.candidate.toml"),
        "[calibration]\nfile = \"p.next.calibration.json\"\n[rollout]\nmode = \"shadow\"\n",
    )
    .unwrap();
    std::fs::write(policies.join("p.candidate.wasm"), &wasm).unwrap();
    let summary = until_json(&policy_url, "no candidate", |summary| {
        summary["candidate"]["calibration"]["id"] == json!(next_id)
    })
    .await;
    assert_eq!(
        summary["calibration"]["id"],
        json!(new_id),
        "the active keeps its own"
    );
    assert_eq!(summary["mode"], "shadow");
    let (status, _, body) = post_json(&policy_url, &probe_input(3), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["calibration"], json!(new_id));
    let shadow = eventually(Duration::from_secs(20), || async {
        let events = decision_events(&log, seen + 1).await;
        events
            .into_iter()
            .find(|e| e.shadow_of.is_some())
            .ok_or("no shadow run")
    })
    .await;
    assert_eq!(shadow.calibration.as_deref(), Some(next_id.as_str()));
    let read = &shadow.reads[0];
    let j = read
        .questions
        .iter()
        .position(|q| q.instructions == PROBE_URGENT)
        .unwrap();
    let next =
        hunch::calibration::file::Calibrations::from_bytes(&std::fs::read(&next_file).unwrap())
            .unwrap();
    let offline = next
        .for_question(&read.questions[j])
        .unwrap()
        .apply(read.distributions.as_ref().unwrap()[j].probabilities());
    assert_eq!(
        shadow.result.as_ref().unwrap()["p_urgent"]
            .as_f64()
            .unwrap()
            .to_bits(),
        noul_of(&read.questions[j], &offline).to_bits()
    );
}

/// Defect: a policy decision's reads kept the rendered questions but not the ids the policy gave
/// them, so its labels could not be joined and `hunch calibrate` fitted `/v1/systemone` decisions
/// only. Now each read records `question_ids`, and labels name a policy decision's answers by
/// them.
#[tokio::test]
async fn a_policy_decision_is_labelled_by_the_policys_question_ids() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    let wasm = hunch::policy::testing::built_policy("replay_probe")
        .expect("the policies build (wasm32-wasip2)");
    std::fs::write(policies.join("p.wasm"), &wasm).unwrap();
    let log = dir.path().join("decisions.ndjson");
    let (l, p) = (log.display().to_string(), policies.display().to_string());
    let hunch =
        start_hunch_with_fixture("dg-test", &["--decision-log", &l, "--policies", &p]).await;
    let url = format!("{}/v1/policies/p", hunch.url);
    let n = 60;
    let mut lines = Vec::new();
    let mut labelled = std::collections::HashMap::new();
    for i in 0..n {
        let input = json!({"id": i, "message": format!(
            "ticket {i}: the printer on floor {} is {}", i % 7, i * 13 % 11)});
        let (status, _, body) = post_json(&url, &input, &[]).await;
        assert_eq!(status, 200, "{body}");
        let id = body["decision_id"].as_str().unwrap().to_owned();
        // As for `/v1/systemone` above: the labels agree with the policy's answer three times
        // in four.
        let p_urgent = body["output"]["p_urgent"].as_f64().unwrap();
        let label = (p_urgent >= 0.5) != (i % 4 == 0);
        let mut labels = json!({"urgent": label});
        if i < 10 {
            labels["baseline"] = json!(true);
        }
        if i == 0 {
            labels["nope"] = json!(true);
        }
        lines.push(json!({"decision_id": id, "labels": labels}).to_string());
        labelled.insert(id, label);
    }
    let labels = dir.path().join("labels.jsonl");
    std::fs::write(&labels, lines.join("\n")).unwrap();
    let events = decision_events(&log, n).await;

    // Each read names its questions by the policy's ids, in the questions' order; the label of
    // each decision is joined to its read's `urgent` distribution, so the raw (before) NLL is
    // known from the log alone.
    let urgent = hunch_core::Question {
        instructions: PROBE_URGENT.into(),
        kind: hunch_core::QuestionKind::Noul {
            yes: None,
            no: None,
        },
    };
    let mut nll = 0.0;
    for e in &events {
        assert_eq!(e.reads.len(), 1);
        let read = &e.reads[0];
        let ids: Vec<&str> = read.question_ids.iter().map(|i| i.as_str()).collect();
        assert_eq!(ids, ["urgent", "baseline"], "{read:?}");
        assert_eq!(read.questions[0], urgent);
        let d = read.distributions.as_ref().unwrap()[0].probabilities();
        let p_label = if labelled[&e.decision_id] { d[0] } else { d[1] };
        nll -= (p_label / (d[0] + d[1])).ln();
    }
    nll /= n as f64;

    let out = Command::new(hunch_bin())
        .args(["calibrate", "--log", &l, "--labels"])
        .arg(&labels)
        .arg("-o")
        .arg(dir.path().join("calibration.json"))
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fit: Value = serde_json::from_slice(&out.stdout).unwrap();
    let questions = fit["questions"].as_array().unwrap();
    assert_eq!(questions.len(), 1, "{fit:#}");
    let q = &questions[0];
    assert_eq!(q["ids"], json!(["urgent"]));
    assert_eq!(q["labels"], json!(n));
    assert_eq!(q["key"], json!(hunch::calibration::question_key(&urgent)));
    let before = q["before"]["nll"].as_f64().unwrap();
    assert!((before - nll).abs() < 1e-9, "{before} vs {nll}");
    assert!(q["temperature"].as_f64().unwrap() > 0.0);
    assert_eq!(q["before"]["accuracy"], q["after"]["accuracy"]);
    // 10 baseline labels are too few; an id the policy never asked is reported.
    assert_eq!(fit["refused"][0]["ids"], json!(["baseline"]));
    assert_eq!(fit["refused"][0]["labels"], json!(10));
    let problems = fit["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0]["question_id"], "nope");
    assert!(problems[0]["reason"]
        .as_str()
        .unwrap()
        .contains("no recorded read"));

    // The fitted file serves the policy's question: it is keyed by the question, not the route.
    let file = hunch::calibration::file::Calibrations::from_bytes(
        &std::fs::read(dir.path().join("calibration.json")).unwrap(),
    )
    .unwrap();
    assert!(file.for_question(&urgent).is_some());
}

#[tokio::test]
async fn a_batch_output_labelled_by_custom_id_fits_like_the_decision_log() {
    let dir = tempfile::tempdir().unwrap();
    // The same 60 states and labels as `fitted_calibration`, which fits from a decision log.
    let from_log = fitted_calibration(dir.path()).await;
    let log_fit: Value = serde_json::from_slice(&std::fs::read(&from_log).unwrap()).unwrap();

    let hunch = start_hunch_with_fixture("dg-test", &[]).await;
    let n = 60;
    let input: Vec<String> = (0..n)
        .map(|i| {
            json!({"custom_id": format!("t{i}"), "method": "POST", "url": "/v1/systemone",
                   "body": urgent_request(i)})
            .to_string()
        })
        .collect();
    let input_file = dir.path().join("in.jsonl");
    std::fs::write(&input_file, input.join("\n")).unwrap();
    let output_file = dir.path().join("out.jsonl");
    let out = Command::new(hunch_bin())
        .args(["batch", "-i"])
        .arg(&input_file)
        .arg("-o")
        .arg(&output_file)
        .args(["--server", &hunch.url, "--progress", "off"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = std::fs::read_to_string(&output_file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), n);
    let mut labels = Vec::new();
    for line in &lines {
        let id = line["custom_id"].as_str().unwrap();
        let i: usize = id[1..].parse().unwrap();
        let p_yes = line["response"]["body"]["answers"]["urgent"]["noul"]
            .as_f64()
            .unwrap();
        let label = (p_yes >= 0.5) != (i % 4 == 0);
        labels.push(json!({"custom_id": id, "labels": {"urgent": label}}).to_string());
    }
    labels.push(json!({"custom_id": "t999", "labels": {"urgent": true}}).to_string());
    let labels_file = dir.path().join("labels.jsonl");
    std::fs::write(&labels_file, labels.join("\n")).unwrap();

    let calibrate = |log: &Path| {
        Command::new(hunch_bin())
            .arg("calibrate")
            .arg("--batch-output")
            .arg(log)
            .arg("--labels")
            .arg(&labels_file)
            .arg("-o")
            .arg(dir.path().join("batch-calibration.json"))
            .arg("--json")
            .output()
            .unwrap()
    };
    let out = calibrate(&output_file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fit: Value = serde_json::from_slice(&out.stdout).unwrap();
    let q = &fit["questions"][0];
    assert_eq!(q["ids"], json!(["urgent"]));
    assert_eq!(q["labels"], json!(n));
    assert_eq!(
        q["key"], log_fit["questions"][0]["key"],
        "the same question"
    );
    let (t_batch, t_log) = (
        q["temperature"].as_f64().unwrap(),
        log_fit["questions"][0]["temperature"].as_f64().unwrap(),
    );
    // The same fit up to the last bits: a batch answer keeps P(yes), and 1 − P(yes) may differ
    // from the recorded P(no) in its last bit, which moves the minimum of the flat NLL by ~1e-8.
    assert!((t_batch - t_log).abs() < 1e-6, "{t_batch} vs {t_log}");
    let problems = fit["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0]["custom_id"], "t999");

    // An output written without the questions (as before `hunch batch` kept them) is refused,
    // saying what is missing.
    let stripped = dir.path().join("old.jsonl");
    let old: Vec<String> = lines
        .iter()
        .map(|l| {
            let mut l = l.clone();
            l.as_object_mut().unwrap().remove("request");
            l.to_string()
        })
        .collect();
    std::fs::write(&stripped, old.join("\n")).unwrap();
    let out = calibrate(&stripped);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("request.questions"), "{err}");
}
