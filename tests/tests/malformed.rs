//! The malformed-request table: every request that can never succeed is a 4xx that names the
//! field (or the header) at fault, against a real `hunch serve`.

use hunch_e2e::start_hunch_with_fixture;
use serde_json::{json, Map, Value};
use std::io::Write;

enum Expect {
    /// A 422 whose detail has this `loc` (joined with dots).
    Field(&'static str),
    /// This status, with a `detail.message` containing this text.
    Status(u16, &'static str),
}

struct Case {
    name: &'static str,
    body: Vec<u8>,
    headers: Vec<(&'static str, String)>,
    expect: Expect,
}

fn json_case(name: &'static str, body: Value, expect: Expect) -> Case {
    Case {
        name,
        body: serde_json::to_vec(&body).unwrap(),
        headers: vec![],
        expect,
    }
}

fn request(questions: Value) -> Value {
    json!({"model": "jev-latest", "state": "some state", "questions": questions})
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(bytes, ruzstd::encoding::CompressionLevel::Fastest)
}

fn loc_path(loc: &Value) -> String {
    loc.as_array()
        .unwrap()
        .iter()
        .map(|p| match p {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

#[tokio::test]
async fn every_malformed_request_is_a_4xx_naming_the_field() {
    let hunch = start_hunch_with_fixture("dg-test", &["--max-body-bytes", "200000"]).await;
    let noul = json!({"type": "noul", "instructions": "?"});
    let options_256: Map<String, Value> =
        (0..256).map(|i| (format!("o{i}"), Value::Null)).collect();
    let levels_51: Vec<String> = (0..51).map(|i| format!("l{i}")).collect();
    let mut cases = vec![
        json_case("missing model", json!({"state": "s", "questions": {"q": noul}}), Expect::Field("body.model")),
        json_case("missing state", json!({"model": "jev-latest", "questions": {"q": noul}}), Expect::Field("body.state")),
        json_case("missing questions", json!({"model": "jev-latest", "state": "s"}), Expect::Field("body.questions")),
        json_case("body not an object", json!(["model"]), Expect::Field("body")),
        json_case("state a number", json!({"model": "jev-latest", "state": 3, "questions": {"q": noul}}), Expect::Field("body.state")),
        json_case("state null", json!({"model": "jev-latest", "state": null, "questions": {"q": noul}}), Expect::Field("body.state")),
        json_case("model a number", json!({"model": 1, "state": "s", "questions": {"q": noul}}), Expect::Field("body.model")),
        json_case("questions a list", json!({"model": "jev-latest", "state": "s", "questions": [noul]}), Expect::Field("body.questions")),
        json_case("empty questions", request(json!({})), Expect::Field("body.questions")),
        json_case("question not an object", request(json!({"q": "noul"})), Expect::Field("body.questions.q")),
        json_case("missing type", request(json!({"q": {"instructions": "?"}})), Expect::Field("body.questions.q.type")),
        json_case("unknown type", request(json!({"q": {"type": "maybe"}})), Expect::Field("body.questions.q.type")),
        json_case("noul with nothing", request(json!({"q": {"type": "noul"}})), Expect::Field("body.questions.q")),
        json_case("noul with null criteria only", request(json!({"q": {"type": "noul", "criteria": {"true": null, "false": null}}})), Expect::Field("body.questions.q")),
        json_case("noul criteria a list", request(json!({"q": {"type": "noul", "instructions": "?", "criteria": ["yes"]}})), Expect::Field("body.questions.q.criteria")),
        json_case("noul unknown criterion", request(json!({"q": {"type": "noul", "instructions": "?", "criteria": {"maybe": "x"}}})), Expect::Field("body.questions.q.criteria.maybe")),
        json_case("instructions a number", request(json!({"q": {"type": "noul", "instructions": 1}})), Expect::Field("body.questions.q.instructions")),
        json_case("choice without criteria", request(json!({"q": {"type": "choice"}})), Expect::Field("body.questions.q.criteria")),
        json_case("choice empty criteria", request(json!({"q": {"type": "choice", "criteria": {}}})), Expect::Field("body.questions.q.criteria")),
        json_case("choice criteria a list", request(json!({"q": {"type": "choice", "criteria": ["a", "b"]}})), Expect::Field("body.questions.q.criteria")),
        json_case("choice description a number", request(json!({"q": {"type": "choice", "criteria": {"a": 1, "b": null}}})), Expect::Field("body.questions.q.criteria.a")),
        json_case("256 options", request(json!({"q": {"type": "choice", "criteria": options_256}})), Expect::Field("body.questions.q.criteria")),
        json_case("score without criteria", request(json!({"q": {"type": "score"}})), Expect::Field("body.questions.q.criteria")),
        json_case("score no levels", request(json!({"q": {"type": "score", "criteria": []}})), Expect::Field("body.questions.q.criteria")),
        json_case("51 levels", request(json!({"q": {"type": "score", "criteria": levels_51}})), Expect::Field("body.questions.q.criteria")),
        json_case("null level", request(json!({"q": {"type": "score", "criteria": ["a", null]}})), Expect::Field("body.questions.q.criteria.1")),
        json_case("score criteria a map", request(json!({"q": {"type": "score", "criteria": {"a": "b"}}})), Expect::Field("body.questions.q.criteria")),
        json_case("unknown question field", request(json!({"q": {"type": "noul", "instructions": "?", "hint": "x"}})), Expect::Field("body.questions.q.hint")),
        json_case("box question", request(json!({"where": {"type": "box", "instructions": "the dog"}})), Expect::Field("body.questions.where.type")),
        json_case("assets", json!({"model": "jev-latest", "state": "s", "questions": {"q": noul}, "assets": {"a": {"type": "image", "format": "png", "data_base64": "AA=="}}}), Expect::Field("body.assets")),
        json_case("x_draws zero", json!({"model": "jev-latest", "state": "s", "questions": {"q": noul}, "x_draws": 0}), Expect::Field("body.x_draws")),
        json_case("x_seed negative", json!({"model": "jev-latest", "state": "s", "questions": {"q": noul}, "x_seed": -1}), Expect::Field("body.x_seed")),
        // An unknown top-level field (`x_sed`) is not malformed: it is ignored and named in
        // `x-hunch-ignored-fields` (tests/tests/isolation.rs checks that); an unknown field inside
        // a question stays a 422 ("unknown question field" below).
        json_case("unreadable option (reader 422)", request(json!({"fine": noul, "bad one": {"type": "choice", "criteria": {"__unreadable__": null, "b": null}}})), Expect::Field("body.questions.bad one")),
        json_case("unknown model", json!({"model": "no-such-model", "state": "s", "questions": {"q": noul}}), Expect::Status(404, "no-such-model")),
        json_case("prompt too long (reader)", json!({"model": "jev-latest", "state": "__too_large__", "questions": {"q": noul}}), Expect::Status(400, "12288")),
        Case { name: "broken JSON", body: b"{\"model\": ".to_vec(), headers: vec![], expect: Expect::Field("body") },
        Case { name: "NaN in JSON", body: b"{\"model\": \"jev-latest\", \"state\": NaN, \"questions\": {}}".to_vec(), headers: vec![], expect: Expect::Field("body") },
        Case { name: "empty body", body: vec![], headers: vec![], expect: Expect::Field("body") },
        Case {
            name: "huge body",
            body: serde_json::to_vec(&json!({"model": "jev-latest", "state": "x".repeat(300_000), "questions": {"q": noul}})).unwrap(),
            headers: vec![],
            expect: Expect::Status(413, "limit"),
        },
        Case {
            name: "bad zstd",
            body: b"this is not zstd".to_vec(),
            headers: vec![("content-encoding", "zstd".into())],
            expect: Expect::Status(400, "zstd"),
        },
        Case {
            name: "zstd bomb",
            body: zstd(&serde_json::to_vec(&json!({"model": "jev-latest", "state": " ".repeat(5_000_000), "questions": {"q": noul}})).unwrap()),
            headers: vec![("content-encoding", "zstd".into())],
            expect: Expect::Status(413, "decompressed"),
        },
        Case {
            name: "bad gzip",
            body: b"not gzip".to_vec(),
            headers: vec![("content-encoding", "gzip".into())],
            expect: Expect::Status(400, "gzip"),
        },
        Case {
            name: "unknown encoding",
            body: b"{}".to_vec(),
            headers: vec![("content-encoding", "br".into())],
            expect: Expect::Status(415, "br"),
        },
        Case {
            name: "multipart assets",
            body: b"--x\r\n\r\n--x--".to_vec(),
            headers: vec![("content-type", "multipart/form-data; boundary=x".into())],
            expect: Expect::Field("body.assets"),
        },
    ];
    // A valid zstd body that decodes to broken JSON: the JSON is at fault, not the encoding.
    cases.push(Case {
        name: "zstd of broken JSON",
        body: zstd(b"{\"model\": "),
        headers: vec![("content-encoding", "zstd".into())],
        expect: Expect::Field("body"),
    });

    let client = reqwest::Client::new();
    let mut failures = Vec::new();
    for case in cases {
        let mut r = client
            .post(format!("{}/v1/systemone", hunch.url))
            .body(case.body.clone());
        if !case.headers.iter().any(|(k, _)| *k == "content-type") {
            r = r.header("content-type", "application/json");
        }
        for (k, v) in &case.headers {
            r = r.header(*k, v);
        }
        let response = r.send().await.expect("sent");
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let ok = match &case.expect {
            Expect::Field(loc) => {
                status == 422
                    && body["detail"].as_array().is_some_and(|d| {
                        d.iter()
                            .any(|e| loc_path(&e["loc"]) == *loc && e["msg"].is_string())
                    })
            }
            Expect::Status(code, text) => {
                status == *code
                    && body["detail"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(text))
            }
        };
        assert!(
            (400..500).contains(&status),
            "{}: a {status} for a request that can never succeed: {body}",
            case.name
        );
        if !ok {
            failures.push(format!("{}: got {status} {body}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "cases answered wrongly:\n{}",
        failures.join("\n")
    );
}

#[tokio::test]
async fn gzip_and_zstd_bodies_are_accepted_and_answers_are_finite() {
    let hunch = start_hunch_with_fixture("dg-test", &[]).await;
    let options: Map<String, Value> = (0..255)
        .map(|i| (format!("option «{i}»"), json!(format!("d{i}"))))
        .collect();
    let levels: Vec<String> = (0..10).map(|i| format!("level {i}")).collect();
    let body = serde_json::to_vec(&request(json!({
        "many": {"type": "choice", "criteria": options},
        "ten": {"type": "score", "criteria": levels},
    })))
    .unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&body).unwrap();
    let client = reqwest::Client::new();
    let mut answers = Vec::new();
    for (encoding, bytes) in [
        ("identity", body.clone()),
        ("zstd", zstd(&body)),
        ("gzip", gz.finish().unwrap()),
    ] {
        let r = client
            .post(format!("{}/v1/systemone", hunch.url))
            .header("content-type", "application/json")
            .header("content-encoding", encoding)
            .body(bytes)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{encoding}");
        let text = r.text().await.unwrap();
        assert!(
            !text.contains("NaN") && !text.contains("Infinity"),
            "{text}"
        );
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["answers"]["many"]["probabilities"]
                .as_object()
                .unwrap()
                .len(),
            255
        );
        answers.push(v);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0], answers[2]);
}
