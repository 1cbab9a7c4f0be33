//! What a replica reports about its bundle (`GET /v1/status`, `/metrics`): the active revision,
//! when it was activated, the last successful check (a 200 or a 304), the last error, and how
//! stale the replica is. Fleet tools compare these across replicas to see which lag.

use super::error::{BundleError, Reason};
use crate::metrics::family;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug)]
pub struct BundleStatus {
    url: String,
    stale_after: Duration,
    /// Staleness counts from here until the first successful check.
    started: SystemTime,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    revision: Option<String>,
    activated_at: Option<SystemTime>,
    last_success_at: Option<SystemTime>,
    last_error: Option<(SystemTime, String)>,
    policies: Vec<String>,
    failures: BTreeMap<Reason, u64>,
    activations: u64,
}

/// `GET /v1/status`'s `bundle`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusReport {
    pub url: String,
    pub revision: Option<String>,
    pub activated_at: Option<String>,
    pub last_success_at: Option<String>,
    pub last_error: Option<ErrorReport>,
    pub stale: bool,
    pub stale_seconds: f64,
    pub policies: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorReport {
    pub at: String,
    pub message: String,
}

fn rfc3339(t: SystemTime) -> String {
    hunch_core::date::rfc3339_ms(t)
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl BundleStatus {
    pub fn new(url: &str, stale_after: Duration) -> Self {
        BundleStatus {
            url: url.to_string(),
            stale_after,
            started: SystemTime::now(),
            inner: Mutex::default(),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A revision now serves with these policies. `downloaded`: it came from the bundle server,
    /// so this is also a successful check, recorded in the same step (no reader sees the new
    /// revision beside the previous error).
    pub fn activated(&self, revision: &str, policies: Vec<String>, downloaded: bool) {
        let mut inner = self.inner();
        let now = SystemTime::now();
        inner.revision = Some(revision.to_string());
        inner.activated_at = Some(now);
        inner.policies = policies;
        inner.activations += 1;
        if downloaded {
            inner.last_success_at = Some(now);
            inner.last_error = None;
        }
    }

    /// The bundle server answered and what it serves is active (a 304, the same bytes, the
    /// same revision, or a revision just activated): the replica is current. The last error
    /// stays visible until a check succeeds.
    pub fn checked(&self) {
        let mut inner = self.inner();
        inner.last_success_at = Some(SystemTime::now());
        inner.last_error = None;
    }

    pub fn failed(&self, error: &BundleError) {
        let mut inner = self.inner();
        *inner.failures.entry(error.reason()).or_default() += 1;
        inner.last_error = Some((SystemTime::now(), error.to_string()));
    }

    pub fn revision(&self) -> Option<String> {
        self.inner().revision.clone()
    }

    fn stale_seconds(&self, inner: &Inner) -> f64 {
        let since = inner.last_success_at.unwrap_or(self.started);
        SystemTime::now()
            .duration_since(since)
            .unwrap_or_default()
            .as_secs_f64()
    }

    pub fn report(&self) -> StatusReport {
        let inner = self.inner();
        let stale_seconds = self.stale_seconds(&inner);
        StatusReport {
            url: self.url.clone(),
            revision: inner.revision.clone(),
            activated_at: inner.activated_at.map(rfc3339),
            last_success_at: inner.last_success_at.map(rfc3339),
            last_error: inner.last_error.as_ref().map(|(at, message)| ErrorReport {
                at: rfc3339(*at),
                message: message.clone(),
            }),
            stale: stale_seconds > self.stale_after.as_secs_f64(),
            stale_seconds,
            policies: inner.policies.clone(),
        }
    }
}

/// A Prometheus label value: `\`, `"` and newlines escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl crate::metrics::MetricsSource for BundleStatus {
    fn render_metrics(&self, out: &mut String) {
        let inner = self.inner();
        let stale_seconds = self.stale_seconds(&inner);
        family(
            out,
            "hunch_bundle_info",
            "gauge",
            "The policy bundle revision this replica serves (1 for the active revision).",
        );
        if let Some(revision) = &inner.revision {
            let _ = writeln!(
                out,
                "hunch_bundle_info{{revision=\"{}\"}} 1",
                label(revision)
            );
        }
        family(
            out,
            "hunch_bundle_activated_timestamp_seconds",
            "gauge",
            "When the active bundle revision was activated (Unix seconds).",
        );
        if let Some(t) = inner.activated_at {
            let _ = writeln!(
                out,
                "hunch_bundle_activated_timestamp_seconds {}",
                unix_seconds(t)
            );
        }
        family(
            out,
            "hunch_bundle_last_success_timestamp_seconds",
            "gauge",
            "The last successful check of the bundle server (200 or 304; Unix seconds).",
        );
        if let Some(t) = inner.last_success_at {
            let _ = writeln!(
                out,
                "hunch_bundle_last_success_timestamp_seconds {}",
                unix_seconds(t)
            );
        }
        family(
            out,
            "hunch_bundle_stale_seconds",
            "gauge",
            "Seconds since the last successful check of the bundle server.",
        );
        let _ = writeln!(out, "hunch_bundle_stale_seconds {stale_seconds}");
        family(
            out,
            "hunch_bundle_stale",
            "gauge",
            "1 when the last successful check is older than --bundle-stale-after.",
        );
        let stale = stale_seconds > self.stale_after.as_secs_f64();
        let _ = writeln!(out, "hunch_bundle_stale {}", u8::from(stale));
        family(
            out,
            "hunch_bundle_failures_total",
            "counter",
            "Bundles refused or not downloaded, by reason.",
        );
        for reason in Reason::ALL {
            let n = inner.failures.get(&reason).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "hunch_bundle_failures_total{{reason=\"{}\"}} {n}",
                reason.as_str()
            );
        }
        family(
            out,
            "hunch_bundle_activations_total",
            "counter",
            "Bundle revisions activated (the persisted one at start included).",
        );
        let _ = writeln!(out, "hunch_bundle_activations_total {}", inner.activations);
    }
}

#[cfg(test)]
mod tests {
    use super::super::error::Fault;
    use super::*;
    use crate::metrics::MetricsSource;

    #[test]
    fn status_and_metrics_follow_activations_checks_and_failures() {
        let status = BundleStatus::new("http://b/bundle.tar.gz", Duration::from_secs(30));
        let report = status.report();
        assert_eq!(report.revision, None);
        assert!(!report.stale);
        status.activated("r2", vec!["ticket_router".into()], true);
        assert!(status.report().last_success_at.is_some());
        status.failed(&BundleError::new(
            Some("r3"),
            Fault::Missing("a.wasm".into()),
        ));
        let report = status.report();
        assert_eq!(report.revision.as_deref(), Some("r2"));
        assert_eq!(report.policies, vec!["ticket_router"]);
        let error = report.last_error.unwrap();
        assert_eq!(
            error.message,
            "bundle r3: a.wasm: listed in the manifest but not in the bundle"
        );
        let mut text = String::new();
        status.render_metrics(&mut text);
        for line in [
            "hunch_bundle_info{revision=\"r2\"} 1",
            "hunch_bundle_failures_total{reason=\"missing\"} 1",
            "hunch_bundle_failures_total{reason=\"digest\"} 0",
            "hunch_bundle_activations_total 1",
            "hunch_bundle_stale 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        status.checked();
        assert_eq!(status.report().last_error, None);
    }

    #[test]
    fn a_replica_that_never_checked_is_stale_after_the_bound() {
        let status = BundleStatus::new("u", Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert!(status.report().stale);
        assert!(status.report().stale_seconds > 0.0);
    }
}
