//! Shadow runs: after the active version has answered, the candidate runs on the same input with
//! the active decision's reads answered from its record (new reads go to the model), and the two
//! outcomes are compared. Shadowing must not slow live decisions, so a shadow run
//!
//! - takes an instance slot of its own (never a live one) or is skipped and counted;
//! - runs on a thread of its own at the lowest CPU priority ([`ShadowRunner`]), so its guest
//!   code yields the CPU to live decisions;
//! - reads at background priority (`Admission::Shadow`: the read queue admits its reads only when no
//!   live read waits, and never counts it against the live queue's bound).
//!
//! Its event is written like any decision's, marked `shadow_of`.

use crate::decision::event::{DecisionEvent, ErrorRecord, PolicyRef};
use crate::decision::recorder::{BookReader, ReadBook};
use crate::decision::{Decision, DecisionLog};
use crate::policy::registry::{Admission, Registry, ShadowSlot, Stage};
use crate::policy::rollout::Agreement;
use crate::policy::{Invocation, InvokeError, LoadedPolicy};
use serde_json::Value;
use std::sync::Arc;

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

/// What a policy decision adds to its event: the version, the model, the input, and the result
/// (or the failure, by its kind, with the limit it hit).
pub fn fill_event(
    event: &mut DecisionEvent,
    log: &DecisionLog,
    policy: &LoadedPolicy,
    stage: Stage,
    model: Option<&str>,
    input: &Value,
    outcome: &Outcome,
) {
    event.policy = Some(policy_ref(policy, stage));
    event.bundle_revision = policy.bundle_revision.clone();
    event.model = model.map(|m| log.model_ref(m));
    event.input = input.clone();
    match outcome {
        Ok(inv) => {
            event.result = Some(inv.output.clone());
            event.usage = inv.usage;
            event.timings.read_ms = inv.timings.read_ms;
        }
        Err(e) => {
            event.limits_hit.extend(e.limit_hit());
            event.error = Some(ErrorRecord {
                kind: e.kind(),
                message: e.to_string(),
            });
        }
    }
}

/// Whether two outcomes agree: identical output JSON, or failures of the same kind.
pub fn agreement(active: &Outcome, candidate: &Outcome) -> Agreement {
    match (active, candidate) {
        (Ok(a), Ok(c)) if a.output == c.output => Agreement::Agree,
        (Ok(_), Ok(_)) => Agreement::Disagree,
        (Err(a), Err(c)) if a.kind() == c.kind() => Agreement::Agree,
        (Err(_), Ok(_)) => Agreement::Disagree,
        _ => Agreement::CandidateError,
    }
}

/// Everything a shadow run needs from the active decision.
pub struct ShadowJob {
    pub registry: Arc<Registry>,
    pub log: Arc<DecisionLog>,
    pub candidate: Arc<LoadedPolicy>,
    pub active: Decision,
    pub active_outcome: Outcome,
    pub input: Value,
    /// The status a failure would have been answered with, had the candidate decided (the API
    /// owns that mapping; the event records it).
    pub status_of: fn(&InvokeError) -> u16,
}

/// Where shadow runs execute: one OS thread with a tokio runtime of its own, at the lowest CPU
/// priority the OS gives a thread (Linux: nice 19 for that thread alone). Live decisions run on
/// the server's runtime at normal priority, so on a busy machine the scheduler gives them the
/// CPU first and a candidate's guest code waits.
pub struct ShadowRunner {
    handle: tokio::runtime::Handle,
}

impl std::fmt::Debug for ShadowRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShadowRunner")
    }
}

impl ShadowRunner {
    /// Starts the shadow thread. It lives as long as the process: shadow runs in flight at
    /// shutdown are abandoned (their events are not required).
    pub fn start() -> std::io::Result<ShadowRunner> {
        let (sent, received) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("hunch-shadow".into())
            .spawn(move || {
                lower_this_threads_priority();
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => {
                        let _ = sent.send(Ok(runtime.handle().clone()));
                        runtime.block_on(std::future::pending::<()>());
                    }
                    Err(e) => {
                        let _ = sent.send(Err(e));
                    }
                }
            })?;
        let handle = received.recv().map_err(|_| {
            std::io::Error::other("the shadow thread stopped before its runtime started")
        })??;
        Ok(ShadowRunner { handle })
    }

    /// Runs the candidate in the background when a shadow slot is free, else counts it skipped;
    /// the caller has its answer already.
    pub fn spawn(&self, job: ShadowJob) {
        match job.registry.shadow_slot() {
            Some(slot) => {
                self.handle.spawn(run_shadow(job, slot));
            }
            None => job.registry.rollouts().skipped(&job.candidate.name),
        }
    }
}

/// Nice 19 for the calling thread (Linux keeps a nice value per thread); elsewhere nothing.
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: setpriority with who = 0 changes only the calling thread's nice value; it
        // reads and writes no memory of ours.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
        if rc != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "shadow runs keep normal CPU priority"
            );
        }
    }
}

async fn run_shadow(job: ShadowJob, slot: ShadowSlot) {
    let ShadowJob {
        registry,
        log,
        candidate,
        active,
        active_outcome,
        input,
        status_of,
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
        .invoke_version(&candidate, &input, Admission::Shadow(slot), move |live| {
            let model = live.model_name().to_string();
            decision_for_reads.reader(Arc::new(BookReader::new(&model, book, Some(live))))
        })
        .await;
    if matches!(outcome, Err(InvokeError::Busy)) {
        registry.rollouts().skipped(&candidate.name);
        return;
    }
    let agreement = agreement(&active_outcome, &outcome);
    registry.rollouts().shadowed(&candidate.name, agreement);
    let mut event = decision.event(match &outcome {
        Ok(_) => 200,
        Err(e) => status_of(e),
    });
    fill_event(
        &mut event,
        &log,
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
