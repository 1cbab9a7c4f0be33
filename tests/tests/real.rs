//! `hunch serve` with the REAL accelerator (`hunch-accelerator`, DiffusionGemma on MLX) on the
//! generated tiny checkpoint (`hunch_e2e::tiny_checkpoint`, random weights from a fixed seed):
//! every answer type, the limits (255 options, 10 levels), many questions in one request, Unicode
//! ids and names, and determinism (same request, renamed ids).
//!
//! The weights are random, so the tests check the shape and the invariants of the answers, and
//! that the same read gives the same bits, never what the answers "mean".

use hunch_e2e::http::post_systemone;
use hunch_e2e::{start_hunch_real, Hunch};
use serde_json::{json, Map, Value};

/// 255 option names, short (a read's prompt lists every option, and prefill time grows faster
/// than linearly with it on a CPU): ASCII, accented, CJK, emoji, the empty name, a name that
/// looks like a label.
fn many_options() -> Map<String, Value> {
    let mut options = Map::new();
    options.insert(String::new(), Value::Null);
    options.insert("A".into(), json!("looks like a label"));
    options.insert("Zoë".into(), Value::Null);
    options.insert("日本".into(), Value::Null);
    options.insert("🎉".into(), Value::Null);
    let mut i = 0;
    while options.len() < 255 {
        options.insert(format!("o{i}"), Value::Null);
        i += 1;
    }
    options
}

/// One request with 13 questions: every answer type, 10 levels, the certain 1-option and 1-level
/// cases, instructions of every JSON shape, Unicode and empty ids and names.
fn big_request() -> Value {
    let levels: Vec<Value> = (0..10)
        .map(|i| json!(format!("level {i}: {}", "≥".repeat(i + 1))))
        .collect();
    json!({
        "model": "jev-latest",
        "state": {"ticket": "Ich wurde zweimal belastet — bitte erstatten! 請退款 🙏",
                  "customer": {"name": "Zoë", "tier": "gold"}, "amounts": [9.99, 9.99]},
        "questions": {
            "billing": {"type": "noul", "instructions": "Is this message about billing?"},
            "ünïcödé id ✓": {"type": "noul", "criteria": {"true": "The customer is angry"}},
            "": {"type": "noul", "instructions": null, "criteria": {"true": "yes", "false": "no"}},
            "日本語の質問": {"type": "noul", "instructions": {"task": "refund?", "lang": "de"}},
            "team": {"type": "choice", "instructions": "Which team should handle it?",
                     "criteria": {"billing": "Payments and refunds", "technical": null,
                                  "sales team": "New purchases"}},
            "only": {"type": "choice", "criteria": {"the only one": null}},
            "🎉": {"type": "choice", "instructions": ["which", "one"],
                   "criteria": {"ja": "Ja", "nein": ["Nein", "never"]}},
            "urgency": {"type": "score", "instructions": "How urgent is it?",
                        "criteria": ["Can wait", "This week", "Today"]},
            "ten": {"type": "score", "instructions": "Rate it.", "criteria": levels},
            "one level": {"type": "score", "criteria": ["the only level"]},
            "object levels": {"type": "score", "instructions": "Sentiment",
                              "criteria": [{"label": "bad"}, ["meh"], "good"]},
            "q12": {"type": "noul", "instructions": ["Is", "it", "polite?"]},
            "ünï": {"type": "choice", "instructions": "Quelle équipe ?",
                    "criteria": {"facturation": "Paiements", "support technique": null,
                                 "ventes ✓": "Achats"}}
        }
    })
}

async fn post(hunch: &Hunch, body: &Value) -> (u16, String) {
    let r = post_systemone(&hunch.url, body).await;
    (r.status().as_u16(), r.text().await.expect("a body"))
}

async fn post_ok(hunch: &Hunch, body: &Value) -> (String, Value) {
    let (status, text) = post(hunch, body).await;
    assert_eq!(
        status,
        200,
        "{text}\nserver logs:\n{}",
        hunch.process.logs()
    );
    let value = serde_json::from_str(&text).expect("JSON");
    (text, value)
}

fn finite(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite(), "{what} = {x}");
    x
}

fn probabilities_sum_to_one(answer: &Value, id: &str, n: usize) -> Map<String, Value> {
    let p = answer["probabilities"]
        .as_object()
        .unwrap_or_else(|| panic!("{id}: no probabilities: {answer}"))
        .clone();
    assert_eq!(p.len(), n, "{id}: {} probabilities", p.len());
    let sum: f64 = p.values().map(|v| finite(v, id)).sum();
    assert!((sum - 1.0).abs() < 1e-6, "{id}: probabilities sum to {sum}");
    for v in p.values() {
        let x = finite(v, id);
        assert!((0.0..=1.0).contains(&x), "{id}: probability {x}");
    }
    p
}

/// Checks every answer of [`big_request`] against its question.
fn check_big_answers(request: &Value, response: &Value) {
    assert_eq!(
        response["model"], "dg-tiny",
        "the real model name, not the alias"
    );
    let questions = request["questions"].as_object().expect("questions");
    let answers = response["answers"].as_object().expect("answers");
    let asked: Vec<&String> = questions.keys().collect();
    let answered: Vec<&String> = answers.keys().collect();
    assert_eq!(asked, answered, "one answer per question, in request order");
    for (id, q) in questions {
        let a = &answers[id];
        assert_eq!(a["type"], q["type"], "{id}: {a}");
        match q["type"].as_str() {
            Some("noul") => {
                let x = finite(&a["noul"], id);
                assert!((0.0..=1.0).contains(&x), "{id}: noul {x}");
            }
            Some("choice") => {
                let options = q["criteria"].as_object().expect("options");
                let p = probabilities_sum_to_one(a, id, options.len());
                let names: Vec<&String> = options.keys().collect();
                let got: Vec<&String> = p.keys().collect();
                assert_eq!(
                    names, got,
                    "{id}: probabilities under the option names, in order"
                );
                let choice = a["choice"].as_str().expect("choice");
                assert!(options.contains_key(choice), "{id}: {choice:?}");
                // The argmax, first wins ties.
                let best = p
                    .iter()
                    .fold(None::<(&String, f64)>, |best, (k, v)| {
                        let v = v.as_f64().unwrap_or(0.0);
                        match best {
                            Some((_, b)) if b >= v => best,
                            _ => Some((k, v)),
                        }
                    })
                    .map(|(k, _)| k.as_str());
                assert_eq!(Some(choice), best, "{id}: the choice is the argmax");
                let c = finite(&a["confidence"], id);
                assert!((0.0..=1.0).contains(&c), "{id}: confidence {c}");
                if options.len() == 1 {
                    assert_eq!(c, 1.0, "{id}: a 1-option choice is certain");
                }
            }
            Some("score") => {
                let levels = q["criteria"].as_array().expect("levels");
                let p = probabilities_sum_to_one(a, id, levels.len());
                let keys: Vec<String> = (0..levels.len()).map(|i| i.to_string()).collect();
                assert_eq!(p.keys().cloned().collect::<Vec<_>>(), keys, "{id}");
                let legend = a["legend"].as_object().expect("legend");
                assert_eq!(legend.len(), levels.len(), "{id}");
                for (i, level) in levels.iter().enumerate() {
                    assert_eq!(
                        &legend[&i.to_string()],
                        level,
                        "{id}: the legend echoes level {i}"
                    );
                }
                let score = finite(&a["score"], id);
                assert!(
                    (0.0..=(levels.len() - 1) as f64).contains(&score),
                    "{id}: score {score}"
                );
                let expectation: f64 = p
                    .values()
                    .enumerate()
                    .map(|(i, v)| i as f64 * v.as_f64().unwrap_or(0.0))
                    .sum();
                assert!((score - expectation).abs() < 1e-9, "{id}: score = Σ i·pᵢ");
                let c = finite(&a["confidence"], id);
                assert!((0.0..=1.0).contains(&c), "{id}: confidence {c}");
                if levels.len() == 1 {
                    assert_eq!(c, 1.0, "{id}: a 1-level score is certain");
                }
            }
            other => panic!("{id}: unexpected type {other:?}"),
        }
    }
    let usage = &response["usage"];
    assert!(
        usage["input_tokens"].as_u64().is_some_and(|n| n > 0),
        "{usage}"
    );
    assert!(usage["output_tokens"].as_u64().is_some(), "{usage}");
}

/// The same request with every question id renamed (same order, same questions).
fn renamed(request: &Value) -> Value {
    let mut out = request.clone();
    let questions = request["questions"].as_object().expect("questions");
    let mut renamed = Map::new();
    for (i, (_, q)) in questions.iter().enumerate() {
        renamed.insert(format!("renamed-{i}-🔁"), q.clone());
    }
    out["questions"] = Value::Object(renamed);
    out
}

/// Reads of long prompts take tens of seconds on a loaded CPU: the default 120 s is too tight
/// when several test binaries share two cores.
const SLOW_CPU: [&str; 2] = ["--request-timeout", "600"];

/// One request of 13 questions (10 levels, Unicode, every type) answered by the real model; sent
/// again it gives the identical bytes; with every id renamed, identical answers.
#[tokio::test]
async fn the_real_model_answers_every_type_10_levels_13_questions_deterministically() {
    let hunch = start_hunch_real(&SLOW_CPU).await;
    assert_eq!(
        big_request()["questions"].as_object().map(|q| q.len()),
        Some(13)
    );
    let request = big_request();
    let (first_text, first) = post_ok(&hunch, &request).await;
    check_big_answers(&request, &first);

    // Determinism: the same request again gives the very same bytes (every f64 printed the same
    // shortest way, so the same bits).
    let (second_text, _) = post_ok(&hunch, &request).await;
    assert_eq!(first_text, second_text, "the same request twice");

    // Ids never reach the model: renamed ids, bit-identical answers, position by position.
    let renamed_request = renamed(&request);
    let (_, renamed_response) = post_ok(&hunch, &renamed_request).await;
    let a: Vec<&Value> = first["answers"]
        .as_object()
        .expect("answers")
        .values()
        .collect();
    let b: Vec<(&String, &Value)> = renamed_response["answers"]
        .as_object()
        .expect("answers")
        .iter()
        .collect();
    assert_eq!(a.len(), b.len());
    for (i, (x, (id, y))) in a.iter().zip(b).enumerate() {
        assert_eq!(id, &format!("renamed-{i}-🔁"));
        assert_eq!(
            serde_json::to_string(x).expect("json"),
            serde_json::to_string(y).expect("json"),
            "question {i}: renaming its id changed its answer"
        );
    }
    assert_eq!(first["usage"], renamed_response["usage"]);
}

/// A plain string state with the sample questions: the everyday request, answered by the model,
/// and the `x_seed` / `x_draws` extensions are honoured (a different seed is still a valid
/// answer; the same seed the same bits).
#[tokio::test]
async fn the_real_model_answers_the_sample_request_and_its_extensions() {
    let hunch = start_hunch_real(&SLOW_CPU).await;
    let request = hunch_e2e::sample_request();
    let (_, plain) = post_ok(&hunch, &request).await;
    assert_eq!(plain["answers"].as_object().map(|a| a.len()), Some(3));

    let mut seeded = request.clone();
    seeded["x_seed"] = json!(7);
    seeded["x_draws"] = json!(4);
    let (a_text, a) = post_ok(&hunch, &seeded).await;
    let (b_text, _) = post_ok(&hunch, &seeded).await;
    assert_eq!(a_text, b_text, "x_seed 7, x_draws 4 twice");
    for id in ["billing", "team", "urgency"] {
        assert_eq!(a["answers"][id]["type"], request["questions"][id]["type"]);
    }
}

/// A choice of 255 options (the most the API takes), with Unicode and empty names, answered by
/// the real model: 255 probabilities under the names, in order, summing to 1.
#[tokio::test]
async fn the_real_model_answers_a_choice_of_255_options() {
    let hunch = start_hunch_real(&SLOW_CPU).await;
    let options = many_options();
    assert_eq!(options.len(), 255);
    let request = json!({
        "model": "jev-latest",
        "state": "Pick the option that fits: Zoë wants 日本 🎉.",
        "questions": {
            "pick ✓": {"type": "choice", "instructions": "Which option?", "criteria": options},
            "yes?": {"type": "noul", "instructions": "Is it clear?"}
        }
    });
    let (_, response) = post_ok(&hunch, &request).await;
    check_big_answers(&request, &response);
}

/// The sample questions about the `i`-th state; every state differs, the question list is
/// shared (so the accelerator's prefix cache reuses it).
fn ticket(i: usize) -> Value {
    let mut request = hunch_e2e::sample_request();
    request["state"] = json!(format!(
        "Ticket {i}: I was charged {} times for my subscription this month. Please refund.",
        i + 2
    ));
    if i % 3 == 2 {
        request["x_draws"] = json!(3);
    }
    request
}

/// Many clients at once: the accelerator batches their reads into shared forward passes and
/// reuses their common question list from its prefix cache, and every answer is byte-identical
/// to the same request sent alone to a fresh server (cold cache, nothing to batch with). The
/// batched answers say so in their headers, with the measured deviation (0 on this CPU build).
#[tokio::test]
async fn concurrent_requests_are_batched_and_answer_exactly_as_alone() {
    const CLIENTS: usize = 8;
    // Alone: a fresh server per request would be slow; one server, one request at a time, and
    // the prefix cache off, is the same thing for the accelerator.
    // Batching is bit-exact on the reference BLAS: pin it (the default, OpenBLAS, is not, and
    // there the sidecar reads one request at a time unless told `--batching on`).
    let alone_server = start_hunch_real(&[
        SLOW_CPU[0],
        SLOW_CPU[1],
        "--sidecar-arg=--blas=reference",
        "--sidecar-arg=--batching=off",
        "--sidecar-arg=--prefix-cache-mb=0",
    ])
    .await;
    let mut alone = Vec::new();
    for i in 0..CLIENTS {
        alone.push(post_ok(&alone_server, &ticket(i)).await.0);
    }
    drop(alone_server);

    let hunch =
        start_hunch_real(&[SLOW_CPU[0], SLOW_CPU[1], "--sidecar-arg=--blas=reference"]).await;
    let client = reqwest::Client::new();
    // Spawned all at once (collected), then awaited.
    let sends: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let client = client.clone();
            let url = format!("{}/v1/systemone", hunch.url);
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .json(&ticket(i))
                    .send()
                    .await
                    .expect("sent");
                let header = |name: &str| {
                    r.headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let batched: Option<u32> =
                    header("x-hunch-batch-requests").and_then(|v| v.parse().ok());
                let deviation = header("x-hunch-batch-deviation");
                let status = r.status().as_u16();
                (status, batched, deviation, r.text().await.expect("body"))
            })
        })
        .collect();
    let mut most_batched = 0;
    for (i, send) in sends.into_iter().enumerate() {
        let (status, batched, deviation, text) = send.await.expect("joined");
        assert_eq!(status, 200, "request {i}: {text}");
        assert_eq!(
            text, alone[i],
            "request {i}: batched answer differs from alone"
        );
        let batched = batched.expect("x-hunch-batch-requests on every answer");
        most_batched = most_batched.max(batched);
        if batched > 1 {
            assert_eq!(
                deviation.as_deref(),
                Some("0"),
                "request {i} was batched with {batched} requests: the CPU build is bit-exact"
            );
        } else {
            assert_eq!(
                deviation, None,
                "request {i} ran alone and claims no deviation"
            );
        }
    }
    assert!(
        most_batched > 1,
        "{CLIENTS} simultaneous requests never shared a forward pass"
    );
    // The question list came from the prefix cache for the later requests.
    let metrics = client
        .get(format!("{}/metrics", hunch.url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let reused = metrics
        .lines()
        .find(|l| l.starts_with("hunch_model_reused_prompt_tokens_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(reused > 0.0, "no prompt tokens were reused:\n{metrics}");
}
