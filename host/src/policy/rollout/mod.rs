//! Candidate versions beside the active one, owned here: how a request is routed (`shadow`: the
//! active version decides and the candidate runs after, on all or a sampled fraction of
//! requests; `canary`: a stable share of request keys is decided by the candidate), the shadow
//! runs themselves ([`shadow`]), and the agreement counters `/metrics` and
//! `GET /v1/policies/NAME` show. The registry (`policy/registry/stages.rs`) keeps the stages'
//! versions and files: deploy, promote, rollback.

pub mod shadow;

use crate::metrics::family;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// The request header whose value routes a canary (the same key always gets the same version).
pub const ROUTE_KEY_HEADER: &str = "x-hunch-route-key";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutMode {
    /// The candidate is loaded but never runs.
    #[default]
    Off,
    Shadow,
    Canary,
}

impl RolloutMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutMode::Off => "off",
            RolloutMode::Shadow => "shadow",
            RolloutMode::Canary => "canary",
        }
    }
}

/// `[rollout]` of a policy's `NAME.toml` (or `NAME.candidate.toml`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutConfig {
    #[serde(default)]
    pub mode: RolloutMode,
    /// Shadow: the fraction of requests the candidate also runs on, 0–1. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<f64>,
    /// Canary: the percentage of route keys the candidate decides, 0–100. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    /// Canary: a JSON pointer into the input whose value is the route key; without one (or when
    /// it matches nothing) the `x-hunch-route-key` header is the key, and without that the
    /// request is routed at random.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_key: Option<String>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("rollout: {0}")]
pub struct RolloutError(pub String);

impl RolloutConfig {
    pub fn validate(&self) -> Result<(), RolloutError> {
        if let Some(s) = self.sample {
            if !(0.0..=1.0).contains(&s) {
                return Err(RolloutError(format!(
                    "sample must be within 0..=1, got {s}"
                )));
            }
        }
        if let Some(p) = self.percent {
            if !(0.0..=100.0).contains(&p) {
                return Err(RolloutError(format!(
                    "percent must be within 0..=100, got {p}"
                )));
            }
        }
        if let Some(k) = &self.route_key {
            if !k.is_empty() && !k.starts_with('/') {
                return Err(RolloutError(format!(
                    "route_key must be a JSON pointer (\"/customer/id\"), got {k:?}"
                )));
            }
        }
        Ok(())
    }

    /// The route key of a request: the input's value at `route_key`, else the header.
    pub fn route_key(&self, input: &Value, header: Option<&str>) -> Option<String> {
        let from_input = self
            .route_key
            .as_deref()
            .and_then(|p| input.pointer(p))
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
        from_input.or_else(|| header.map(str::to_string))
    }

    /// Whether a request with this key goes to the canary: a stable hash of the key into
    /// 10 000 buckets, the first `percent × 100` of which are the candidate's.
    pub fn canary_takes(&self, key: Option<&str>) -> bool {
        let percent = self.percent.unwrap_or(0.0);
        let bucket = match key {
            Some(k) => stable_bucket(k),
            None => fastrand::u32(..10_000),
        };
        f64::from(bucket) < percent * 100.0
    }

    /// Whether this request is shadowed.
    pub fn shadow_takes(&self) -> bool {
        let sample = self.sample.unwrap_or(1.0);
        sample >= 1.0 || fastrand::f64() < sample
    }
}

/// A bucket in 0..10 000 from the key's sha256: the same on every server and every restart.
pub fn stable_bucket(key: &str) -> u32 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(key.as_bytes());
    u32::from_be_bytes([d[0], d[1], d[2], d[3]]) % 10_000
}

/// How a shadow run compared with the active decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Agreement {
    /// Identical output JSON (or the same error kind).
    Agree,
    Disagree,
    /// The candidate failed where the active version decided (or the other way round).
    CandidateError,
}

impl Agreement {
    pub fn as_str(self) -> &'static str {
        match self {
            Agreement::Agree => "agree",
            Agreement::Disagree => "disagree",
            Agreement::CandidateError => "candidate_error",
        }
    }
}

/// Shadow and canary counters per policy.
#[derive(Debug, Default)]
pub struct RolloutStats {
    shadow: Mutex<BTreeMap<(String, Agreement), u64>>,
    routed: Mutex<BTreeMap<(String, &'static str), u64>>,
    skipped: Mutex<BTreeMap<String, u64>>,
}

/// What `GET /v1/policies/NAME` shows of a policy's shadow runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AgreementSummary {
    pub shadowed: u64,
    pub agree: u64,
    pub disagree: u64,
    pub candidate_error: u64,
    /// agree / shadowed; `None` before the first shadow run.
    pub rate: Option<f64>,
    /// Requests decided by each stage (canary routing).
    pub decided_by_active: u64,
    pub decided_by_candidate: u64,
    /// Shadow runs skipped because too many were in flight.
    pub shadow_skipped: u64,
}

impl RolloutStats {
    pub fn shadowed(&self, policy: &str, a: Agreement) {
        let mut m = self.shadow.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((policy.to_string(), a)).or_default() += 1;
    }

    pub fn skipped(&self, policy: &str) {
        let mut m = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(policy.to_string()).or_default() += 1;
    }

    /// `stage` is `active` or `candidate`.
    pub fn routed(&self, policy: &str, stage: &'static str) {
        let mut m = self.routed.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((policy.to_string(), stage)).or_default() += 1;
    }

    pub fn summary(&self, policy: &str) -> AgreementSummary {
        let m = self.shadow.lock().unwrap_or_else(|p| p.into_inner());
        let get = |a| m.get(&(policy.to_string(), a)).copied().unwrap_or(0);
        let (agree, disagree, candidate_error) = (
            get(Agreement::Agree),
            get(Agreement::Disagree),
            get(Agreement::CandidateError),
        );
        let shadowed = agree + disagree + candidate_error;
        let r = self.routed.lock().unwrap_or_else(|p| p.into_inner());
        let routed = |s| r.get(&(policy.to_string(), s)).copied().unwrap_or(0);
        AgreementSummary {
            shadowed,
            agree,
            disagree,
            candidate_error,
            rate: (shadowed > 0).then(|| agree as f64 / shadowed as f64),
            decided_by_active: routed("active"),
            decided_by_candidate: routed("candidate"),
            shadow_skipped: self
                .skipped
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(policy)
                .copied()
                .unwrap_or(0),
        }
    }

    /// Forgets a policy's counts (a promotion or rollback starts a new comparison).
    pub fn reset(&self, policy: &str) {
        let mut m = self.shadow.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|(p, _), _| p != policy);
        let mut r = self.routed.lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|(p, _), _| p != policy);
        let mut k = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
        k.remove(policy);
    }
}

impl crate::metrics::MetricsSource for RolloutStats {
    fn render_metrics(&self, out: &mut String) {
        family(
            out,
            "hunch_policy_shadow_total",
            "counter",
            "Shadow runs of a policy's candidate, by agreement with the active decision.",
        );
        for ((policy, a), n) in self.shadow.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(
                out,
                "hunch_policy_shadow_total{{policy=\"{policy}\",agreement=\"{}\"}} {n}",
                a.as_str()
            );
        }
        family(
            out,
            "hunch_policy_shadow_skipped_total",
            "counter",
            "Shadow runs skipped because too many were in flight.",
        );
        for (policy, n) in self
            .skipped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "hunch_policy_shadow_skipped_total{{policy=\"{policy}\"}} {n}"
            );
        }
        family(
            out,
            "hunch_policy_decisions_total",
            "counter",
            "Policy decisions by the stage that decided.",
        );
        for ((policy, stage), n) in self.routed.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(
                out,
                "hunch_policy_decisions_total{{policy=\"{policy}\",stage=\"{stage}\"}} {n}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_canary_share_is_close_to_its_percentage_and_stable_per_key() {
        let cfg = RolloutConfig {
            mode: RolloutMode::Canary,
            percent: Some(20.0),
            ..Default::default()
        };
        let keys: Vec<String> = (0..10_000).map(|i| format!("customer-{i}")).collect();
        let taken = keys.iter().filter(|k| cfg.canary_takes(Some(k))).count();
        // 10 000 keys: the binomial standard deviation is 40; allow 4 of them.
        assert!((1840..=2160).contains(&taken), "{taken}");
        for k in keys.iter().take(100) {
            assert_eq!(cfg.canary_takes(Some(k)), cfg.canary_takes(Some(k)));
        }
        let none = RolloutConfig::default();
        assert!(!keys.iter().any(|k| none.canary_takes(Some(k))));
    }

    #[test]
    fn the_route_key_comes_from_the_input_then_the_header() {
        let cfg = RolloutConfig {
            route_key: Some("/customer/id".into()),
            ..Default::default()
        };
        let input = json!({"customer": {"id": 42}});
        assert_eq!(cfg.route_key(&input, Some("h")), Some("42".into()));
        assert_eq!(cfg.route_key(&json!({}), Some("h")), Some("h".into()));
        assert!(RolloutConfig {
            percent: Some(101.0),
            ..Default::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn agreement_is_summarised_and_rendered_per_policy() {
        let s = RolloutStats::default();
        s.shadowed("p", Agreement::Agree);
        s.shadowed("p", Agreement::Agree);
        s.shadowed("p", Agreement::Disagree);
        let sum = s.summary("p");
        assert_eq!((sum.shadowed, sum.agree, sum.disagree), (3, 2, 1));
        let mut out = String::new();
        crate::metrics::MetricsSource::render_metrics(&s, &mut out);
        assert!(out.contains("hunch_policy_shadow_total{policy=\"p\",agreement=\"agree\"} 2\n"));
        s.reset("p");
        assert_eq!(s.summary("p").shadowed, 0);
    }
}
