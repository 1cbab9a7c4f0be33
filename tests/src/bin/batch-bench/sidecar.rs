//! A `hunch-accelerator serve` process to benchmark: start it, post reads to it, read its
//! memory use and stop it.

use hunch_core::{ReadOutcome, ReadRequest};
use hunch_e2e::Process;
use std::path::Path;
use std::time::{Duration, Instant};

/// A `/proc/PID/status` memory field (`VmHWM`: peak resident set, `VmRSS`: resident now), in MB.
pub(crate) fn status_mb(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0 / 1e6)
}

/// A sidecar's resident memory just before it was stopped.
#[derive(Clone, Copy, Default)]
pub(crate) struct MemoryUse {
    pub(crate) peak_mb: Option<f64>,
    pub(crate) now_mb: Option<f64>,
}

impl MemoryUse {
    pub(crate) fn show(&self) -> String {
        format!(
            "{} (resident at the end {})",
            fmt_opt(self.peak_mb, "MB"),
            fmt_opt(self.now_mb, "MB")
        )
    }
}

/// The `deviation=` of the sidecar's start-up probe log line.
pub(crate) fn probe_deviation_logged(logs: &str) -> Option<String> {
    let line = logs
        .lines()
        .find(|l| l.contains("batch invariance probe"))?;
    let rest = &line[line.find("deviation=")? + "deviation=".len()..];
    Some(rest.split_whitespace().next().unwrap_or("").to_string())
}

pub(crate) fn fmt_opt(v: Option<f64>, unit: &str) -> String {
    v.map(|v| format!("{v:.0} {unit}"))
        .unwrap_or_else(|| "unknown".into())
}

pub(crate) struct Sidecar {
    pub(crate) url: String,
    pub(crate) process: Process,
    pub(crate) load_seconds: f64,
    /// The BLAS libraries it has mapped, as its `/health` said.
    pub(crate) blas: Vec<String>,
}

pub(crate) fn http_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(3600))
        .build()
        .map_err(|e| format!("building the HTTP client: {e}"))
}

pub(crate) async fn start_sidecar(
    accelerator: &Path,
    dir: &Path,
    dtype: &str,
    extra: &[&str],
) -> Result<Sidecar, String> {
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--model".into(),
        dir.display().to_string(),
        "--dtype".into(),
        dtype.into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let started = Instant::now();
    let ready =
        hunch_e2e::bench::start_ready_sidecar(accelerator, &args, Duration::from_secs(1200))
            .await?;
    Ok(Sidecar {
        url: ready.url,
        process: ready.process,
        load_seconds: started.elapsed().as_secs_f64(),
        blas: ready.blas_libraries,
    })
}

impl Sidecar {
    pub(crate) fn describe(&self, label: &str) {
        println!(
            "  sidecar [{label}] pid {}: ready in {:.1} s, BLAS mapped: {:?}, start-up probe \
             deviation={}",
            self.process.pid(),
            self.load_seconds,
            self.blas,
            probe_deviation_logged(&self.process.logs()).unwrap_or_else(|| "(not logged)".into())
        );
    }

    /// Reads the peak and current RSS, then stops the process.
    pub(crate) fn stop(self) -> MemoryUse {
        let pid = self.process.pid();
        let memory = MemoryUse {
            peak_mb: status_mb(pid, "VmHWM"),
            now_mb: status_mb(pid, "VmRSS"),
        };
        drop(self.process);
        memory
    }
}

/// Posts one read; returns the outcome and the HTTP round trip in seconds.
pub(crate) async fn post_read(
    client: &reqwest::Client,
    url: &str,
    request: &ReadRequest,
) -> Result<(ReadOutcome, f64), String> {
    let t = Instant::now();
    let r = client
        .post(format!("{url}/read"))
        .json(request)
        .send()
        .await
        .map_err(|e| format!("POST {url}/read: {e}"))?;
    if !r.status().is_success() {
        return Err(format!(
            "POST {url}/read: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        ));
    }
    let outcome: ReadOutcome = r
        .json()
        .await
        .map_err(|e| format!("POST {url}/read: reading the answer: {e}"))?;
    Ok((outcome, t.elapsed().as_secs_f64()))
}
