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
            PolicyService::start(Some(dir.to_path_buf()), None, &Default::default()).await?;
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
