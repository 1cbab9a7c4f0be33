//! What the host's benchmarks share: how many samples to take, how to read a percentile, and a
//! policy server over an instant reader.

use hunch::api::{router_with, ApiKeys, AppState, Limits};
use hunch::decision::settings::DecisionLogSettings;
use hunch::decision::DecisionLog;
use hunch::policy::testing::InstantReader;
use hunch::reader::{ModelEntry, Registry};
use hunch::server::policies::PolicyService;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A policy server on an ephemeral port (not every benchmark uses it) whose reads are answered at once (the first question
/// 0.7/0.3, the others 0.4/0.6), so that what a benchmark measures is the host, not a model.
#[allow(dead_code)]
pub struct PolicyServer {
    /// `http://…/v1/policies/probe`.
    pub url: String,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    decisions: Arc<DecisionLog>,
}

#[allow(dead_code)]
impl PolicyServer {
    /// Serves the policies of `dir` with the decision log `log`.
    pub async fn start(
        dir: &Path,
        log: DecisionLogSettings,
    ) -> Result<PolicyServer, Box<dyn std::error::Error>> {
        let mut models = Registry::new();
        models.add(ModelEntry {
            name: "instant".into(),
            description: String::new(),
            release_date: String::new(),
            reader: Arc::new(InstantReader::scripted(|_, i| {
                if i == 0 {
                    vec![0.7, 0.3]
                } else {
                    vec![0.4, 0.6]
                }
            })),
        })?;
        let mut state = AppState::new(models, Limits::default(), ApiKeys::default())?;
        state.decisions = DecisionLog::start(log)?;
        let service =
            PolicyService::start(Some(dir.to_path_buf()), None, &Default::default(), None).await?;
        let app = router_with(state.clone(), service.routes(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/v1/policies/probe", listener.local_addr()?);
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(PolicyServer {
            url,
            server,
            decisions: state.decisions.clone(),
        })
    }

    /// Lets shadow runs and the log's writer finish, then stops serving.
    pub async fn stop(self) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.decisions.close(Duration::from_secs(5)).await;
        self.server.abort();
    }
}

/// The number of samples: `BENCH_N`, else 2000.
pub fn samples_from_env() -> usize {
    std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// The `p` quantile (0 to 1) of ascending `sorted`, by nearest rank; NaN when it is empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// The body every policy benchmark sends (`probe` reads it in one read of two questions).
pub fn probe_body() -> serde_json::Value {
    serde_json::json!({"id": 1, "message": "The production database is down."})
}

/// One request to `url`, its answer read to the end.
#[allow(dead_code)]
pub async fn post_probe(client: &reqwest::Client, url: &str) -> Result<(), reqwest::Error> {
    let r = client.post(url).json(&probe_body()).send().await?;
    assert!(r.status().is_success(), "{}", r.status());
    r.bytes().await.map(|_| ())
}

/// Requests per second `clients` closed-loop clients get from `url` over `n` requests.
#[allow(dead_code)]
pub async fn closed_loop(
    url: &str,
    n: usize,
    clients: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    let mut handles = Vec::new();
    for _ in 0..clients {
        let (client, url) = (client.clone(), url.to_string());
        handles.push(tokio::spawn(async move {
            for _ in 0..n / clients {
                post_probe(&client, &url).await?;
            }
            Ok::<_, reqwest::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok((n / clients * clients) as f64 / started.elapsed().as_secs_f64())
}

/// The two policy directories the decision benchmarks serve: `probe` alone, and `probe` with a
/// candidate (the same component, marked) shadowing every request.
#[allow(dead_code)]
pub struct ProbeDirs {
    pub plain: tempfile::TempDir,
    pub shadowed: tempfile::TempDir,
    /// Where the decision logs go.
    pub logs: tempfile::TempDir,
}

#[allow(dead_code)]
impl ProbeDirs {
    /// A decision log written to the file `name` in [`ProbeDirs::logs`].
    pub fn log_file(&self, name: &str) -> DecisionLogSettings {
        DecisionLogSettings {
            path: Some(self.logs.path().join(name)),
            ..DecisionLogSettings::default()
        }
    }
}

#[allow(dead_code)]
pub fn probe_dirs() -> Result<ProbeDirs, Box<dyn std::error::Error>> {
    use hunch::policy::testing::{built_policy, with_marker};
    let probe = built_policy("replay_probe")?;
    let plain = tempfile::tempdir()?;
    std::fs::write(plain.path().join("probe.wasm"), &probe)?;
    let shadowed = tempfile::tempdir()?;
    std::fs::write(shadowed.path().join("probe.wasm"), &probe)?;
    std::fs::write(
        shadowed.path().join("probe.candidate.wasm"),
        with_marker(probe.clone(), "candidate"),
    )?;
    std::fs::write(
        shadowed.path().join("probe.candidate.toml"),
        "[rollout]\nmode = \"shadow\"\n",
    )?;
    Ok(ProbeDirs {
        plain,
        shadowed,
        logs: tempfile::tempdir()?,
    })
}
