//! Where the command-line clients (`hunch batch`, `hunch ask`, `hunch policy run`) send their
//! requests: a running server (`--server URL`), or the very same server started in this process
//! on an ephemeral loopback port (`--model DIR`, `--policies DIR`, `--config FILE`), so a local
//! run has exactly `hunch serve`'s sidecar, validation, policy runtime and answers.

use crate::config::{ServeArgs, Settings};
use clap::Args;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// `--server URL` or a model loaded here.
#[derive(Debug, Clone, Default, Args)]
pub struct TargetArgs {
    /// A running Hunch (or any System One) server, `http://` or `https://` (TLS trusts the
    /// system's roots).
    #[arg(long, value_name = "URL", conflicts_with_all = ["models", "config", "policies"])]
    pub server: Option<String>,
    /// The bearer key sent to `--server`.
    #[arg(long, env = "HUNCH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Load a model here instead, as `hunch serve --model` does: `NAME=DIR` or `DIR`
    /// (repeatable; the first is `jev-latest`).
    #[arg(long = "model", value_name = "[NAME=]DIR")]
    pub models: Vec<String>,
    /// With `--model`: the policies directory, as `hunch serve --policies`.
    #[arg(long, value_name = "DIR")]
    pub policies: Option<PathBuf>,
    /// With a local model: a `hunch serve` TOML file (models, limits, sidecar arguments…).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The sidecar binary for a local model (default: `HUNCH_ACCELERATOR_BIN`, the config file's
    /// `accelerator_bin`, else `hunch-accelerator` next to this one; read as `hunch serve` does).
    #[arg(long)]
    pub accelerator_bin: Option<PathBuf>,
    /// An extra argument for the local model's sidecar (repeatable).
    #[arg(long = "sidecar-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub sidecar_args: Vec<String>,
}

/// Why no target could be set up.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("give --server URL (a running server) or --model DIR (a model loaded here)")]
    Missing,
    #[error(transparent)]
    BadUrl(#[from] crate::http_url::UrlError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("the local server did not start: {0}")]
    Start(String),
    #[error("the local model did not become ready within {0:?}: {1}")]
    NotReady(Duration, String),
}

/// The local server running in this process, stopped by [`Target::shutdown`].
struct InProcess {
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

/// A base URL to send requests to, and the server behind it when it runs here.
pub struct Target {
    /// `http://host:port`, no trailing slash.
    pub url: String,
    pub api_key: Option<String>,
    local: Option<InProcess>,
}

/// How long a local model may take to load (a large checkpoint on a slow disk takes minutes).
const READY_TIMEOUT: Duration = Duration::from_secs(1800);

impl TargetArgs {
    pub fn is_local(&self) -> bool {
        self.server.is_none()
    }
}

impl Target {
    /// Connects to `--server`, or starts the local server and waits until its models are ready.
    pub async fn start(args: &TargetArgs) -> Result<Target, TargetError> {
        if let Some(url) = &args.server {
            let url = url.trim_end_matches('/').to_string();
            crate::http_url::check("--server", &url)?;
            return Ok(Target {
                url,
                api_key: args.api_key.clone(),
                local: None,
            });
        }
        if args.models.is_empty() && args.config.is_none() {
            return Err(TargetError::Missing);
        }
        let serve = ServeArgs {
            config: args.config.clone(),
            listen: Some("127.0.0.1:0".into()),
            models: args.models.clone(),
            accelerator_bin: args.accelerator_bin.clone(),
            sidecar_args: args.sidecar_args.clone(),
            policies: args.policies.clone(),
            no_demo: Some(true),
            ..ServeArgs::default()
        };
        let mut settings = Settings::resolve(&serve, &|name| std::env::var(name).ok())?;
        // Only this process talks to it, over loopback: no keys, no deployments.
        settings.api_keys.clear();
        settings.admin_key = None;
        settings.listen = "127.0.0.1:0".into();
        let (addr_tx, addr_rx) = oneshot::channel();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(crate::server::serve_policies_until(
            settings,
            move |addr| {
                let _ = addr_tx.send(addr);
            },
            async move {
                let _ = stop_rx.await;
            },
        ));
        let addr = match addr_rx.await {
            Ok(addr) => addr,
            Err(_) => {
                let why = match task.await {
                    Ok(Err(e)) => format!("{e:#}"),
                    Ok(Ok(())) => "it stopped at once".into(),
                    Err(e) => e.to_string(),
                };
                return Err(TargetError::Start(why));
            }
        };
        let target = Target {
            url: format!("http://{addr}"),
            api_key: None,
            local: Some(InProcess { stop, task }),
        };
        target.wait_ready(READY_TIMEOUT).await?;
        Ok(target)
    }

    /// Polls `/readyz` until every model can take reads.
    async fn wait_ready(&self, timeout: Duration) -> Result<(), TargetError> {
        let http = reqwest::Client::new();
        let started = Instant::now();
        let mut said = false;
        let mut last = String::from("no answer yet");
        while started.elapsed() < timeout {
            if let Some(local) = &self.local {
                if local.task.is_finished() {
                    return Err(TargetError::Start("the server stopped".into()));
                }
            }
            match http.get(format!("{}/readyz", self.url)).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => last = r.text().await.unwrap_or_default(),
                Err(e) => last = e.to_string(),
            }
            if !said && started.elapsed() > Duration::from_secs(1) {
                eprintln!("hunch: loading the model…");
                said = true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(TargetError::NotReady(timeout, last))
    }

    /// Whether the server runs in this process.
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// Stops the local server (its sidecars included); nothing for `--server`.
    pub async fn shutdown(self) {
        if let Some(local) = self.local {
            let _ = local.stop.send(());
            match local.task.await {
                Ok(Err(e)) => eprintln!("hunch: the local server stopped with an error: {e:#}"),
                Err(e) => eprintln!("hunch: the local server panicked: {e}"),
                Ok(Ok(())) => {}
            }
        }
    }
}
