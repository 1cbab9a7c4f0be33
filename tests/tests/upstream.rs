//! hunch A (fixture sidecar) ← upstream ← hunch B: B's answers are A's, recomputed from A's
//! probabilities alone; A's errors reach B's clients as B's own.

use hunch_e2e::http::post_json;
use hunch_e2e::{sample_request, start_hunch, start_hunch_with_fixture, wait_ready};
use serde_json::{json, Value};
use std::time::Duration;

async fn post(url: &str, body: &Value) -> (u16, Value) {
    let (status, _, body) = post_json(&format!("{url}/v1/systemone"), body, &[]).await;
    (status, body)
}

#[tokio::test]
async fn answers_through_an_upstream_are_identical() {
    let a = start_hunch_with_fixture("dg-a", &["--api-key", "a-key"]).await;
    let upstream = format!("relay=jev-latest@{}", a.url);
    let b = start_hunch(&["--upstream", &upstream, "--upstream-key", "a-key"]);
    wait_ready(&b.url, Duration::from_secs(10)).await;

    let mut request = sample_request();
    request["questions"]["one sided"] =
        json!({"type": "noul", "criteria": {"false": {"not": "billing"}}});
    request["questions"]["object levels"] = json!({"type": "score", "instructions": ["rate", 1],
                                                   "criteria": ["low", {"mid": true}, "high"]});
    request["questions"]["single"] = json!({"type": "choice", "criteria": {"only": null}});
    let direct = {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/systemone", a.url))
            .bearer_auth("a-key")
            .json(&request)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json::<Value>().await.unwrap()
    };
    let (status, relayed) = post(&b.url, &request).await;
    assert_eq!(status, 200, "{relayed}");
    assert_eq!(relayed["model"], "relay");
    assert_eq!(direct["model"], "dg-a");
    for (id, answer) in direct["answers"].as_object().unwrap() {
        let other = &relayed["answers"][id];
        assert_eq!(answer["type"], other["type"], "{id}");
        for field in ["choice", "legend"] {
            assert_eq!(answer[field], other[field], "{id}.{field}");
        }
        for field in ["noul", "confidence", "score"] {
            if let (Some(x), Some(y)) = (answer[field].as_f64(), other[field].as_f64()) {
                assert!((x - y).abs() < 1e-12, "{id}.{field}: {x} vs {y}");
            }
        }
    }
    assert_eq!(direct["usage"], relayed["usage"]);

    // A reader error on A names the caller's question on B.
    let (status, body) = post(
        &b.url,
        &json!({"model": "relay", "state": "s", "questions": {
            "fine": {"type": "noul", "instructions": "?"},
            "my odd question": {"type": "choice", "criteria": {"__unreadable__": null, "b": null}}}}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        body["detail"][0]["loc"],
        json!(["body", "questions", "my odd question"])
    );
    let (status, _) = post(&b.url, &json!({"model": "relay", "state": "__too_large__",
                                            "questions": {"q": {"type": "noul", "instructions": "?"}}})).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn upstream_errors_map_to_ours() {
    let a = start_hunch_with_fixture("dg-a", &["--api-key", "a-key"]).await;
    // Wrong key: A's 401 is B's configuration problem, passed through as a 4xx (never retried).
    let wrong = start_hunch(&[
        "--upstream",
        &format!("relay=jev-latest@{}", a.url),
        "--upstream-key",
        "nope",
    ]);
    let (status, _) = post(&wrong.url, &sample_request()).await;
    assert_eq!(status, 401);
    // Unknown model upstream: 404.
    let unknown = start_hunch(&[
        "--upstream",
        &format!("relay=missing@{}", a.url),
        "--upstream-key",
        "a-key",
    ]);
    let (status, _) = post(&unknown.url, &sample_request()).await;
    assert_eq!(status, 404);
    // Nothing listening: 503 with Retry-After.
    let dead = start_hunch(&["--upstream", "relay=http://127.0.0.1:9"]);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/systemone", dead.url))
        .json(&sample_request())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
}

/// An HTTPS front for the plain-HTTP server at `backend` (`host:port`): rustls with a
/// certificate for 127.0.0.1 made now, forwarding the decrypted bytes. Returns its port and the
/// certificate (PEM), which no system trusts.
async fn tls_front(backend: String) -> (u16, String) {
    use tokio_rustls::rustls;
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
        .expect("a self-signed certificate");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(vec![made.cert.der().clone()], key)
    .expect("a server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("an address").port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, backend) = (acceptor.clone(), backend.clone());
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake: nothing to forward.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                if let Ok(mut plain) = tokio::net::TcpStream::connect(&backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    (port, made.cert.pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_read_over_tls_trusting_the_ca_file_only_when_given() {
    let a = start_hunch_with_fixture("dg-a", &["--api-key", "a-key"]).await;
    let (port, pem) = tls_front(a.url.trim_start_matches("http://").to_string()).await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, pem).expect("write the CA file");
    let upstream = format!("relay=jev-latest@https://127.0.0.1:{port}");

    let trusting = start_hunch(&[
        "--upstream",
        &upstream,
        "--upstream-key",
        "a-key",
        "--upstream-ca-file",
        ca.to_str().expect("a UTF-8 path"),
    ]);
    wait_ready(&trusting.url, Duration::from_secs(10)).await;
    let (status, body) = post(&trusting.url, &sample_request()).await;
    assert_eq!(status, 200, "{body}\n{}", trusting.process.logs());
    assert_eq!(body["model"], "relay");

    // The same upstream without the CA file: the certificate is not trusted, the read is refused
    // as unavailable (never answered over an unverified connection).
    let untrusting = start_hunch(&["--upstream", &upstream, "--upstream-key", "a-key"]);
    wait_ready(&untrusting.url, Duration::from_secs(10)).await;
    let (status, body) = post(&untrusting.url, &sample_request()).await;
    assert_eq!(status, 503, "{body}");
}

/// A System One server that records every body it is sent and answers each `qN` noul with 0.5:
/// what an upstream receives, seen from the upstream's side.
async fn recording_upstream() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::routing::post;
    let seen: std::sync::Arc<std::sync::Mutex<Vec<Value>>> = Default::default();
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/v1/systemone",
        post(move |axum::Json(body): axum::Json<Value>| {
            let record = record.clone();
            async move {
                let answers: serde_json::Map<String, Value> = body["questions"]
                    .as_object()
                    .map(|q| {
                        q.keys()
                            .map(|id| (id.clone(), json!({"type": "noul", "noul": 0.5})))
                            .collect()
                    })
                    .unwrap_or_default();
                record.lock().expect("the record").push(body);
                axum::Json(json!({"model": "remote", "answers": answers,
                                  "usage": {"input_tokens": 1, "output_tokens": 1}}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, seen)
}

#[tokio::test]
async fn the_question_mode_and_read_options_are_sent_upstream() {
    let (url, seen) = recording_upstream().await;
    let relay = start_hunch(&["--upstream", &format!("relay=remote@{url}")]);
    wait_ready(&relay.url, Duration::from_secs(10)).await;
    let questions = json!({"a": {"type": "noul", "instructions": "?"}});

    // Asked for: the mode, the seed and the draws reach the upstream as asked.
    let (status, body) = post(
        &relay.url,
        &json!({"model": "relay", "state": "s", "questions": questions,
                "x_questions": "joint", "x_seed": 5, "x_draws": 2}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Not asked for: this server's default mode (`--questions`, isolated), not the upstream's.
    let (status, body) = post(
        &relay.url,
        &json!({"model": "relay", "state": "s", "questions": questions}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    let seen = seen.lock().expect("the record").clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0]["model"], "remote");
    assert_eq!(
        (
            &seen[0]["x_questions"],
            &seen[0]["x_seed"],
            &seen[0]["x_draws"]
        ),
        (&json!("joint"), &json!(5), &json!(2)),
        "{}",
        seen[0]
    );
    assert_eq!(seen[1]["x_questions"], "isolated", "{}", seen[1]);
    assert!(seen[1].get("x_seed").is_none() && seen[1].get("x_draws").is_none());
}
