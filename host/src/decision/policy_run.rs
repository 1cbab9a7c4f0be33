//! A policy request as a decision: route it (active, canary candidate), run it with its reads
//! recorded, write its event, and run a shadow candidate after the answer, reusing the active
//! decision's reads and counting whether the two agree.

use crate::api::error::ApiError;
use crate::decision::event::{DecisionEvent, ErrorRecord, LimitHit, PolicyRef};
use crate::decision::recorder::{BookReader, ReadBook};
use crate::decision::rollout::Agreement;
use crate::decision::{Decision, DecisionLog};
use crate::policy::registry::{Registry, Stage};
use crate::policy::{Invocation, InvokeError, LoadedPolicy};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Shadow runs in flight at most; beyond, a shadow run is skipped (counted) rather than queued.
pub const MAX_SHADOW_RUNS: usize = 16;

/// A decision's outcome as the client sees it.
pub type Outcome = Result<Invocation, InvokeError>;

pub fn policy_ref(policy: &LoadedPolicy, stage: Stage) -> PolicyRef {
    PolicyRef {
        name: policy.name.clone(),
        version: policy.version.clone(),
        sha256: policy.sha256.clone(),
        declared_version: Some(policy.descriptor.version.clone()),
        stage: stage.as_str().to_string(),
    }
}

/// The event of a policy decision.
pub fn policy_event(
    log: &DecisionLog,
    decision: &Decision,
    policy: &LoadedPolicy,
    stage: Stage,
    model: Option<&str>,
    input: &Value,
    outcome: &Outcome,
) -> DecisionEvent {
    let error = outcome.as_ref().err().map(|e| ApiError::from(e.clone()));
    let mut event = decision.event(error.as_ref().map_or(200, |e| e.status().as_u16()));
    event.policy = Some(policy_ref(policy, stage));
    event.model = model.map(|m| log.model_ref(m));
    event.input = input.clone();
    match outcome {
        Ok(inv) => {
            event.result = Some(inv.output.clone());
            event.usage = inv.usage;
            event.timings.read_ms = inv.timings.read_ms;
        }
        Err(e) => {
            if let InvokeError::Limit(l) = e {
                event.limits_hit.push(LimitHit {
                    limit: l.limit.as_str().to_string(),
                    value: Some(l.limit_value),
                });
            }
            event.error = error.map(|api| ErrorRecord {
                kind: api.error_type().to_string(),
                message: e.to_string(),
            });
        }
    }
    event
}

/// Whether two outcomes agree: identical output JSON, or failures of the same kind.
pub fn agreement(active: &Outcome, candidate: &Outcome) -> Agreement {
    match (active, candidate) {
        (Ok(a), Ok(c)) if a.output == c.output => Agreement::Agree,
        (Ok(_), Ok(_)) => Agreement::Disagree,
        (Err(a), Err(c))
            if ApiError::from(a.clone()).error_type() == ApiError::from(c.clone()).error_type() =>
        {
            Agreement::Agree
        }
        (Err(_), Ok(_)) => Agreement::Disagree,
        _ => Agreement::CandidateError,
    }
}

/// Bounds shadow work so a slow candidate cannot pile up behind live traffic.
#[derive(Debug)]
pub struct ShadowGate(Arc<Semaphore>);

impl Default for ShadowGate {
    fn default() -> Self {
        ShadowGate(Arc::new(Semaphore::new(MAX_SHADOW_RUNS)))
    }
}

/// Everything a shadow run needs from the active decision.
pub struct ShadowJob {
    pub registry: Arc<Registry>,
    pub log: Arc<DecisionLog>,
    pub gate: Arc<ShadowGate>,
    pub candidate: Arc<LoadedPolicy>,
    pub active: Decision,
    pub active_outcome: Outcome,
    pub input: Value,
}

/// Runs the candidate in the background; the caller has its answer already.
pub fn spawn_shadow(job: ShadowJob) {
    let Ok(permit) = job.gate.0.clone().try_acquire_owned() else {
        job.log.rollouts.skipped(&job.candidate.name);
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        run_shadow(job).await;
    });
}

async fn run_shadow(job: ShadowJob) {
    let ShadowJob {
        registry,
        log,
        candidate,
        active,
        active_outcome,
        input,
        ..
    } = job;
    let mut decision = log.begin(
        &active.route,
        active.request_id.clone(),
        active.client_request_id.clone(),
    );
    decision.record_reads();
    // Reads the active version made are answered from its record; new ones go to the model.
    let book = ReadBook::new(&active.reads());
    let decision_for_reads = decision.clone();
    let (outcome, model) = registry
        .invoke_version(&candidate, &input, false, move |live| {
            let model = live.model_name().to_string();
            decision_for_reads.reader(Arc::new(BookReader::new(&model, book, Some(live))))
        })
        .await;
    if matches!(outcome, Err(InvokeError::Busy)) {
        log.rollouts.skipped(&candidate.name);
        return;
    }
    let agreement = agreement(&active_outcome, &outcome);
    log.rollouts.shadowed(&candidate.name, agreement);
    let mut event = policy_event(
        &log,
        &decision,
        &candidate,
        Stage::Candidate,
        model.as_deref(),
        &input,
        &outcome,
    );
    event.shadow_of = Some(active.id.clone());
    // A shadow event is never required: the client was answered already.
    let _ = log.write(event, Some(&candidate.log)).await;
}
