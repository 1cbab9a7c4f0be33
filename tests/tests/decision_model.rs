//! A llama.cpp decision model (a GGUF with `<arch>.decision.type`, docs/models.md "Decision
//! models") served by `hunch serve` with a REAL sidecar, found in a models directory: it
//! answers every question type on `/v1/systemone`, `/v1/models` says what it is
//! (`x_family`/`x_read` `decision`, `x_decision_type`, the limits its labels give), a question
//! past those limits is a 422 naming the limit, and a decision type Hunch does not serve is a
//! 409 naming the type while the other model keeps answering.

use hunch_e2e::http::{listed_model, post_systemone};
use hunch_e2e::{start_hunch_over_models_dir, workspace_root};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_gguf_is_served_by_its_own_read_and_an_unserved_type_is_refused() {
    let data = workspace_root().join("accelerator/tests/data/decision");
    let dir = tempfile::tempdir().expect("temp dir");
    for (file, name) in [
        ("tiny-qwen3.lev.gguf", "lev"),
        ("tiny-qwen3.kev.gguf", "kev"),
        ("tiny-qwen3.nimble.gguf", "nimble"),
        ("tiny-modernbert.laya.gguf", "laya"),
        ("tiny-llama.laya.gguf", "laya-causal"),
    ] {
        std::fs::copy(data.join(file), dir.path().join(format!("{name}.gguf")))
            .expect("copy a checkpoint");
    }
    let hunch = start_hunch_over_models_dir(dir.path()).await;

    let body = json!({"model": "lev", "state": {"order": 7, "status": "crushed box"},
        "questions": {
            "damaged": {"type": "noul", "instructions": "Did it arrive damaged?",
                        "criteria": {"true": "broken", "false": "intact"}},
            "intent": {"type": "choice", "instructions": "What do they want?",
                       "criteria": {"refund": null, "replacement": "a new one", "nothing": null}},
            "severity": {"type": "score", "instructions": "How bad?",
                         "criteria": ["none", "minor", "serious"]}}});
    let response = post_systemone(&hunch.url, &body).await;
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{text}\nlogs:\n{}", hunch.process.logs());
    let answer: Value = serde_json::from_str(&text).expect("JSON");
    let noul = answer["answers"]["damaged"]["noul"].as_f64().expect("noul");
    assert!((0.0..=1.0).contains(&noul), "{answer}");
    let intent = &answer["answers"]["intent"];
    let probabilities = intent["probabilities"].as_object().expect("probabilities");
    assert_eq!(
        probabilities.keys().collect::<Vec<_>>(),
        ["refund", "replacement", "nothing"],
        "the request's options, in its order: {answer}"
    );
    let total: f64 = probabilities.values().filter_map(Value::as_f64).sum();
    assert!((total - 1.0).abs() < 1e-9, "{answer}");
    assert!(
        answer["answers"]["severity"]["score"].as_f64().is_some(),
        "{answer}"
    );
    // lev reads a choice twice (the options reversed the second time): four prompts for
    // three questions.
    assert!(
        answer["usage"]["input_tokens"].as_u64().unwrap_or(0) > 0,
        "{answer}"
    );

    let entry = listed_model(&hunch.url, "lev").await;
    assert_eq!(entry["x_family"], "decision", "{entry}");
    assert_eq!(entry["x_read"], "decision", "{entry}");
    assert_eq!(entry["x_decision_type"], "lev", "{entry}");
    // The tiny vocabulary spells A..Z as single tokens and no pair: 26 labels.
    assert_eq!(entry["x_max_choice_options"], 26, "{entry}");
    assert_eq!(entry["x_max_score_levels"], 10, "{entry}");
    assert!(
        entry["x_fingerprint"]
            .as_str()
            .unwrap_or_default()
            .contains("/decision-v1-lev/"),
        "{entry}"
    );

    // Past the model's limits: llama-server's bound of ten levels.
    let levels: Vec<String> = (0..11).map(|i| format!("level {i}")).collect();
    let too_many = json!({"model": "lev", "state": "s",
        "questions": {"q": {"type": "score", "instructions": "How much?", "criteria": levels}}});
    let response = post_systemone(&hunch.url, &too_many).await;
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("10"), "names the limit: {text}");

    // Instructions without content: llama-server's 422 (a decision template has no fallback).
    for instructions in [json!(""), json!({}), json!([])] {
        let empty = json!({"model": "lev", "state": "s",
            "questions": {"q": {"type": "noul", "instructions": instructions}}});
        let response = post_systemone(&hunch.url, &empty).await;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        assert_eq!(status, 422, "{instructions}: {text}");
        assert!(text.contains("instructions"), "{text}");
    }

    // The marker-read types through the same API: kev (a pointer head), nimble (the caller's
    // ids reach its prompt) and laya (an encoder), each the request's options in its order.
    // kev and laya read at markers (llama-server's 255 options); nimble has the tiny
    // vocabulary's 26 single-token labels.
    for (model, max_options) in [("kev", 255), ("nimble", 26), ("laya", 255)] {
        let body = json!({"model": model, "state": "The lamp arrived broken, the box crushed.",
            "questions": {
                "damaged": {"type": "noul", "instructions": "Did it arrive damaged?"},
                "intent": {"type": "choice", "instructions": "What do they want?",
                           "criteria": {"refund": null, "replacement": "a new one",
                                        "nothing": null}},
                "severity": {"type": "score", "instructions": "How bad?",
                             "criteria": ["none", "minor", "serious"]}}});
        let response = post_systemone(&hunch.url, &body).await;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        assert_eq!(
            status,
            200,
            "{model}: {text}\nlogs:\n{}",
            hunch.process.logs()
        );
        let answer: Value = serde_json::from_str(&text).expect("JSON");
        let intent = answer["answers"]["intent"]["probabilities"]
            .as_object()
            .unwrap_or_else(|| panic!("{model}: {answer}"));
        assert_eq!(
            intent.keys().collect::<Vec<_>>(),
            ["refund", "replacement", "nothing"],
            "{model}: {answer}"
        );
        let total: f64 = intent.values().filter_map(Value::as_f64).sum();
        assert!((total - 1.0).abs() < 1e-9, "{model}: {answer}");
        let noul = answer["answers"]["damaged"]["noul"].as_f64();
        assert!(
            noul.is_some_and(|p| (0.0..=1.0).contains(&p)),
            "{model}: {answer}"
        );
        assert!(
            answer["answers"]["severity"]["score"].as_f64().is_some(),
            "{model}: {answer}"
        );
        let entry = listed_model(&hunch.url, model).await;
        assert_eq!(entry["x_decision_type"], model, "{entry}");
        assert_eq!(entry["x_max_choice_options"], max_options, "{entry}");
    }
    let entry = listed_model(&hunch.url, "laya").await;
    assert_eq!(entry["x_architecture"], "modern-bert", "{entry}");

    // A type on a family it is not made for: a laya type on a causal model is refused by
    // name, and the other models unaffected.
    let laya = json!({"model": "laya-causal", "state": "s",
        "questions": {"q": {"type": "noul", "instructions": "Is it?"}}});
    let response = post_systemone(&hunch.url, &laya).await;
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    assert_eq!(status, 409, "{text}\nlogs:\n{}", hunch.process.logs());
    assert!(text.contains("laya"), "{text}");
    let entry = listed_model(&hunch.url, "laya-causal").await;
    assert_eq!(entry["x_state"], "failed", "{entry}");
    assert_eq!(entry["x_refused"], true, "{entry}");
    assert!(
        entry["x_error"]
            .as_str()
            .unwrap_or_default()
            .contains("ModernBERT"),
        "{entry}"
    );
    let again = post_systemone(&hunch.url, &body).await;
    assert_eq!(again.status().as_u16(), 200);
}
