//! The client commands of the real `hunch` binary — `batch`, `ask`, `policy run`, `policy
//! check` — against one `hunch serve` with the REAL accelerator on the generated tiny checkpoint
//! (and the example ticket-router policy), and `batch --model DIR` loading the same checkpoint
//! in-process. Every answer is compared with the same request sent straight to the server.
//!
//! One server for the whole file (a model load is the expensive part), so the scenarios run in
//! order inside one test.

use hunch::policy::testing::built_policy;
use hunch_e2e::http::post_json;
use hunch_e2e::{accelerator_bin, hunch_bin, start_hunch_real, tiny_checkpoint, Hunch, TINY_MODEL};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The tiny model on a loaded 2-core CI machine can be slow.
const SLOW_CPU: [&str; 2] = ["--request-timeout", "600"];

fn hunch(args: &[&str]) -> Output {
    Command::new(hunch_bin())
        .args(args)
        .env("HUNCH_ACCELERATOR_BIN", accelerator_bin())
        .stdin(Stdio::null())
        .output()
        .expect("the hunch binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `hunch batch -i input -o output` with `flags`.
fn batch(input: &Path, output: &Path, flags: &[&str]) -> Output {
    let (i, o) = (input.to_string_lossy(), output.to_string_lossy());
    hunch(&[&["batch", "-i", &i, "-o", &o][..], flags].concat())
}

/// Runs `hunch args`, which must exit with `code` and say why in one line on stderr; returns it.
fn one_line_error(args: &[&str], code: i32) -> String {
    let out = hunch(args);
    assert_eq!(out.status.code(), Some(code), "{args:?}");
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

fn questions() -> Value {
    json!({
        "urgent": {"type": "noul", "instructions": "Is this urgent?"},
        "team": {"type": "choice", "instructions": "Which team?",
                 "criteria": {"billing": "Payments and refunds", "technical": null}},
        "anger": {"type": "score", "instructions": "How angry?",
                  "criteria": ["calm", "annoyed", "furious"]}
    })
}

fn systemone(state: &str) -> Value {
    json!({"model": "jev-latest", "state": state, "questions": questions()})
}

fn line(id: &str, url: &str, body: &Value) -> String {
    json!({"custom_id": id, "method": "POST", "url": url, "body": body}).to_string()
}

async fn post(server: &Hunch, url: &str, body: &Value) -> (u16, Value) {
    let (status, _, body) = post_json(&format!("{}{url}", server.url), body, &[]).await;
    (status, body)
}

/// Output lines by `custom_id` (`None` ids under the line's `id`), asserting each is whole JSON.
fn read_output(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("torn line {l:?}: {e}")))
        .collect()
}

fn by_id(lines: &[Value]) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for l in lines {
        let id = l["custom_id"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| l["id"].as_str().unwrap_or("?").to_string());
        assert!(map.insert(id.clone(), l.clone()).is_none(), "{id} twice");
    }
    map
}

/// What of a policy's answer is the decision (timings differ from run to run).
/// A response with its `decision_id`s taken out: every request gets a fresh one (the decision
/// log's key), so two sends of the same request differ there and nowhere else.
fn without_decision_ids(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "decision_id")
                .map(|(k, v)| (k.clone(), without_decision_ids(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_decision_ids).collect()),
        other => other.clone(),
    }
}

fn decision(body: &Value) -> Value {
    json!({"output": body["output"], "reads": body["reads"].as_array().map(|reads| {
        reads.iter().map(|r| json!({"state": r["state"], "answers": r["answers"]})).collect::<Vec<_>>()
    })})
}

/// A batch of good, refused and malformed lines: every sent line answered exactly as the server
/// answers it directly; every malformed line an `error` naming why; exit status 1.
async fn batch_of_mixed_lines(server: &Hunch, dir: &Path) {
    let ticket: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies/ticket.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut bad_question = systemone("x");
    bad_question["questions"]["urgent"]["type"] = json!("maybe");
    let mut unknown_model = systemone("x");
    unknown_model["model"] = json!("no-such-model");
    let other_list = json!({"model": "jev-latest", "state": "Where is my parcel?",
                            "questions": {"q": {"type": "noul", "instructions": "Is it about delivery?"}}});
    let sent: Vec<(&str, &str, Value)> = vec![
        (
            "g1",
            "/v1/systemone",
            systemone("I was charged twice this month."),
        ),
        (
            "g2",
            "/v1/systemone",
            systemone("The app crashes when I log in."),
        ),
        ("other", "/v1/systemone", other_list),
        ("g3", "/v1/systemone", systemone("Can I buy more seats?")),
        ("policy", "/v1/policies/ticket-router", ticket),
        ("bad-question", "/v1/systemone", bad_question),
        ("unknown-model", "/v1/systemone", unknown_model),
        ("unknown-policy", "/v1/policies/nope", json!({})),
    ];
    let mut lines: Vec<String> = sent.iter().map(|(id, url, b)| line(id, url, b)).collect();
    lines.push("this is not json".into());
    lines.push(json!({"method": "POST", "url": "/v1/systemone", "body": {}}).to_string());
    lines.push(line("chat", "/v1/chat/completions", &json!({})));
    lines.push(
        json!({"custom_id": "text-body", "method": "POST", "url": "/v1/systemone", "body": "hi"})
            .to_string(),
    );
    lines.push(line("g1", "/v1/systemone", &systemone("a duplicate id")));
    let input = dir.join("mixed.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let output = dir.join("mixed.out.jsonl");
    let run = batch(
        &input,
        &output,
        &[
            "--server",
            &server.url,
            "--progress",
            "lines",
            "--retries",
            "3",
            "--concurrency",
            "2",
        ],
    );
    let stderr = text(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("13 lines: 8 answered"), "{stderr}");
    assert!(
        stderr.contains("5 errors (5 refused, 0 not sent)"),
        "{stderr}"
    );
    assert!(stderr.contains("prefix cache:"), "{stderr}");

    let out = read_output(&output);
    assert_eq!(out.len(), 13, "one output line per input line");
    let answered: Vec<&Value> = out.iter().filter(|l| l["response"].is_object()).collect();
    assert_eq!(answered.len(), 8);
    let map: BTreeMap<&str, &Value> = answered
        .iter()
        .map(|l| (l["custom_id"].as_str().unwrap(), *l))
        .collect();
    for (id, url, body) in &sent {
        let (status, direct) = post(server, url, body).await;
        let got = &map[id]["response"];
        assert_eq!(got["status_code"], status, "{id}: {got}");
        if url.starts_with("/v1/policies/") && status == 200 {
            assert_eq!(decision(&got["body"]), decision(&direct), "{id}");
        } else {
            assert_eq!(
                without_decision_ids(&got["body"]),
                without_decision_ids(&direct),
                "{id}: the batch answer is the server's"
            );
        }
    }
    assert_eq!(map["g1"]["response"]["status_code"], 200);
    assert_eq!(map["bad-question"]["response"]["status_code"], 422);
    assert_eq!(map["unknown-model"]["response"]["status_code"], 404);
    assert_eq!(map["unknown-policy"]["response"]["status_code"], 404);
    let errors: Vec<(Option<&str>, &str)> = out
        .iter()
        .filter(|l| l["error"].is_object())
        .map(|l| {
            (
                l["custom_id"].as_str(),
                l["error"]["code"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        errors,
        [
            (None, "invalid_line"),
            (None, "invalid_line"),
            (Some("chat"), "invalid_line"),
            (Some("text-body"), "invalid_line"),
            (Some("g1"), "duplicate_custom_id"),
        ]
    );
    let messages: Vec<&str> = out
        .iter()
        .filter_map(|l| l["error"]["message"].as_str())
        .collect();
    assert!(messages[0].starts_with("line 9: not JSON"), "{messages:?}");
    assert!(messages[1].contains("no `custom_id`"), "{messages:?}");
}

/// Waits until `path` holds at least `n` lines (or the process ends).
fn wait_for_lines(path: &Path, n: usize, child: &mut std::process::Child) {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(300) {
        let lines = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .count();
        if lines >= n || child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{} never reached {n} lines", path.display());
}

fn spawn_batch(input: &Path, output: &Path, server: &Hunch) -> std::process::Child {
    Command::new(hunch_bin())
        .args(["batch", "-i"])
        .arg(input)
        .arg("-o")
        .arg(output)
        .args([
            "--server",
            &server.url,
            "--concurrency",
            "1",
            "--progress",
            "off",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hunch batch starts")
}

/// Stopped by Ctrl-C, then killed (and its last line torn), then resumed: every line answered
/// exactly once, as the server answers it.
async fn batch_interrupted_killed_and_resumed(server: &Hunch, dir: &Path) {
    let n = 24;
    let bodies: Vec<Value> = (0..n)
        .map(|i| {
            systemone(&format!(
                "Ticket {i}: my order number {} never arrived.",
                1000 + i
            ))
        })
        .collect();
    let input = dir.join("resume.jsonl");
    let text_in: Vec<String> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| line(&format!("t{i}"), "/v1/systemone", b))
        .collect();
    std::fs::write(&input, text_in.join("\n")).unwrap();
    let output = dir.join("resume.out.jsonl");

    // Ctrl-C: stops cleanly, everything written is whole, exit 1 (lines left).
    let mut first = spawn_batch(&input, &output, server);
    wait_for_lines(&output, 2, &mut first);
    let _ = Command::new("kill")
        .arg("-INT")
        .arg(first.id().to_string())
        .status();
    let status = first.wait().unwrap();
    let after_int = read_output(&output);
    assert!(
        after_int.len() < n,
        "the run was not interrupted; make it longer"
    );
    assert_eq!(status.code(), Some(1));
    assert!(after_int
        .iter()
        .all(|l| l["response"]["status_code"] == 200));

    // SIGKILL mid-run, and a torn last line as a kill during a write leaves.
    let mut second = spawn_batch(&input, &output, server);
    wait_for_lines(&output, after_int.len() + 2, &mut second);
    let _ = second.kill();
    let _ = second.wait();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&output)
        .unwrap();
    std::io::Write::write_all(&mut file, b"{\"custom_id\":\"t9\",\"respo").unwrap();
    drop(file);

    let last = batch(
        &input,
        &output,
        &["--server", &server.url, "--progress", "off"],
    );
    let stderr = text(&last.stderr);
    assert_eq!(last.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("torn last line repaired"), "{stderr}");
    let map = by_id(&read_output(&output));
    assert_eq!(map.len(), n, "every line once");
    for (i, body) in bodies.iter().enumerate() {
        let (_, direct) = post(server, "/v1/systemone", body).await;
        assert_eq!(map[&format!("t{i}")]["response"]["body"], direct, "t{i}");
    }

    // Once complete, a rerun sends nothing and loads nothing.
    let again = batch(
        &input,
        &output,
        &["--server", "http://127.0.0.1:9", "--progress", "off"],
    );
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert_eq!(read_output(&output).len(), n);
}

/// `hunch ask`: flags → the request the server answers; JSON and table output.
async fn ask(server: &Hunch) {
    let args = [
        "ask",
        "--server",
        &server.url,
        "--state",
        "I was charged twice this month.",
        "--noul",
        "urgent=Is this urgent?",
        "--choice",
        "team=Which team?",
        "billing=Payments and refunds",
        "technical",
        "--score",
        "anger=How angry?",
        "calm",
        "annoyed",
        "furious",
    ];
    let json_run = hunch(&[&args[..], &["--json"]].concat());
    assert!(json_run.status.success(), "{}", text(&json_run.stderr));
    let got: Value = serde_json::from_slice(&json_run.stdout).expect("--json prints JSON");
    let (_, direct) = post(
        server,
        "/v1/systemone",
        &systemone("I was charged twice this month."),
    )
    .await;
    assert_eq!(got, direct);

    let table = hunch(&args);
    let out = text(&table.stdout);
    assert!(table.status.success(), "{}", text(&table.stderr));
    assert!(out.contains(&format!("model {TINY_MODEL}")), "{out}");
    assert!(out.contains("urgent: noul "), "{out}");
    assert!(out.contains("team: choice "), "{out}");
    assert!(out.contains("2: furious"), "{out}");
    assert!(out.contains('█') || out.contains('▏'), "bars: {out}");

    let err = one_line_error(
        &[
            "ask",
            "--server",
            &server.url,
            "--state",
            "x",
            "--model",
            "nope",
            "--noul",
            "Q?",
        ],
        1,
    );
    assert!(err.contains("HTTP 404"), "{err}");
}

/// `hunch policy run` decides as the server does; `policy check` validates without deciding.
async fn policy_run_and_check(server: &Hunch, wasm: &Path) {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies/ticket.json");
    let w = wasm.to_string_lossy().into_owned();
    let e = example.to_string_lossy().into_owned();
    let run = hunch(&["policy", "run", &w, &e, "--server", &server.url, "--json"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let got: Value = serde_json::from_slice(&run.stdout).expect("JSON");
    let input: Value = serde_json::from_str(&std::fs::read_to_string(&example).unwrap()).unwrap();
    let (status, direct) = post(server, "/v1/policies/ticket-router", &input).await;
    assert_eq!(status, 200, "{direct}");
    assert_eq!(decision(&got), decision(&direct));
    assert!(got["limits"]["fuel"].as_u64().unwrap() > 0);
    // Every model read, in the decision log's record format: parsed by the type the log and
    // `hunch replay` use, each with a distribution per rendered question.
    let records: Vec<hunch::decision::event::ReadEvent> =
        serde_json::from_value(got["read_records"].clone()).expect("decision-log read records");
    assert!(!records.is_empty());
    for r in &records {
        let distributions = r
            .distributions
            .as_ref()
            .expect("a distribution per question");
        assert_eq!(distributions.len(), r.questions.len());
        assert_eq!(r.state_sha256.len(), 64);
    }

    let table = hunch(&["policy", "run", &w, &e, "--server", &server.url]);
    let out = text(&table.stdout);
    assert!(table.status.success(), "{}", text(&table.stderr));
    assert!(out.starts_with("decision (ticket-router "), "{out}");
    assert!(out.contains("read 1 ("), "{out}");
    assert!(out.contains("limits: fuel "), "{out}");
    let logged = out
        .split("model reads as the decision log records them")
        .nth(1)
        .expect("the read records section");
    let first = logged.lines().nth(1).expect("a record line");
    serde_json::from_str::<hunch::decision::event::ReadEvent>(first).expect("a record");

    let bad_input = hunch(&["policy", "run", &w, "-", "--server", &server.url]);
    assert_eq!(bad_input.status.code(), Some(1));
    assert!(text(&bad_input.stderr).contains("not JSON"));

    let ok = hunch(&["policy", "check", &w]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(text(&ok.stdout).starts_with("ok: ticket-router (version "));
    let broken = wasm.with_file_name("broken.wasm");
    std::fs::write(&broken, b"\0asm not really").unwrap();
    let bad = hunch(&["policy", "check", &broken.to_string_lossy()]);
    assert_eq!(bad.status.code(), Some(1));
    let err = text(&bad.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not a valid policy component"), "{err}");
}

/// `hunch batch --model DIR --policies DIR`: the same answers from a model loaded in-process.
async fn batch_with_a_local_model(server: &Hunch, dir: &Path, policies: &Path) {
    let bodies = [
        systemone("Refund please."),
        systemone("Password reset fails."),
    ];
    let input = dir.join("local.jsonl");
    let ticket: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies/ticket.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let lines = [
        line("a", "/v1/systemone", &bodies[0]),
        line("b", "/v1/systemone", &bodies[1]),
        line("p", "/v1/policies/ticket-router", &ticket),
    ];
    std::fs::write(&input, lines.join("\n")).unwrap();
    let output = dir.join("local.out.jsonl");
    let model = format!("{TINY_MODEL}={}", tiny_checkpoint().display());
    let run = batch(
        &input,
        &output,
        &[
            "--model",
            &model,
            "--policies",
            &policies.to_string_lossy(),
            "--progress",
            "off",
        ],
    );
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let map = by_id(&read_output(&output));
    for (id, body) in [("a", &bodies[0]), ("b", &bodies[1])] {
        let (_, direct) = post(server, "/v1/systemone", body).await;
        assert_eq!(map[id]["response"]["body"], direct, "{id}");
    }
    let (_, direct) = post(server, "/v1/policies/ticket-router", &ticket).await;
    assert_eq!(decision(&map["p"]["response"]["body"]), decision(&direct));
}

#[tokio::test]
async fn the_cli_clients_against_the_real_model() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    let wasm = policies.join("ticket-router.wasm");
    std::fs::write(
        &wasm,
        built_policy("ticket_router").expect("the policies build"),
    )
    .unwrap();
    let p = policies.to_string_lossy().into_owned();
    let mut args = vec!["--policies", p.as_str()];
    args.extend_from_slice(&SLOW_CPU);
    let server = start_hunch_real(&args).await;

    batch_of_mixed_lines(&server, dir.path()).await;
    batch_interrupted_killed_and_resumed(&server, dir.path()).await;
    ask(&server).await;
    policy_run_and_check(&server, &wasm).await;
    batch_with_a_local_model(&server, dir.path(), &policies).await;
}

/// Every client subcommand documents itself with an example; usage errors are one line.
#[test]
fn every_client_command_has_help_with_an_example_and_one_line_errors() {
    for cmd in [
        &["batch"][..],
        &["ask"],
        &["policy", "run"],
        &["policy", "check"],
        &["calibrate"],
    ] {
        let out = hunch(&[cmd, &["--help"]].concat());
        assert!(out.status.success(), "{cmd:?}");
        let help = text(&out.stdout);
        assert!(help.contains("Example"), "{cmd:?}: {help}");
        assert!(help.contains("hunch "), "{cmd:?}: {help}");
    }
    let err = one_line_error(
        &[
            "batch",
            "-i",
            "/nonexistent.jsonl",
            "-o",
            "/tmp/x.jsonl",
            "--server",
            "http://127.0.0.1:9",
        ],
        2,
    );
    assert!(err.contains("/nonexistent.jsonl"), "{err}");
    let no_target = hunch(&["ask", "--state", "x", "--noul", "Q?"]);
    assert_eq!(no_target.status.code(), Some(1));
    assert!(text(&no_target.stderr).contains("--server"));
}
