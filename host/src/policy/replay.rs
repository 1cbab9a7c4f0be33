//! `hunch replay`'s engine: read decision logs, run recorded policy decisions through a
//! component with their reads answered from the log, and report what changed; or re-ask the
//! recorded reads of a model (`--reread`) and report how the answers moved.

use crate::calibration::serve::served_reads;
use crate::decision::event::DecisionEvent;
use crate::decision::mask::PolicyLogConfig;
use crate::decision::recorder::{BookReader, ReadBook};
use crate::policy::calibration::PolicyCalibration;
use crate::policy::LoadedPolicy;
use hunch_core::{Answer, AnswerSettings, ReadRequest, Reader};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid filter {0:?}: use KEY=VALUE with KEY one of policy, version, id, route, status (ok|error), stage (active|candidate|any), since, until")]
    Filter(String),
}

/// The events of some log files, and how many lines were not events.
#[derive(Debug, Default)]
pub struct LogRead {
    pub events: Vec<DecisionEvent>,
    /// Lines that did not parse as an event (a torn last line after a crash, or not JSON).
    pub skipped_lines: u64,
}

/// Reads NDJSON decision logs (gzip when the name ends in `.gz`, as a collector may store them;
/// a file holding one JSON array per line, as the HTTP sink sends, works too). Lines that do not
/// parse are counted and skipped, never fatal.
pub fn read_logs(paths: &[PathBuf]) -> Result<LogRead, ReplayError> {
    let mut out = LogRead::default();
    for path in paths {
        let file = std::fs::File::open(path).map_err(|source| ReplayError::Read {
            path: path.clone(),
            source,
        })?;
        let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(flate2::read::MultiGzDecoder::new(file))
        } else {
            Box::new(file)
        };
        for line in BufReader::new(reader).split(b'\n') {
            let line = line.map_err(|source| ReplayError::Read {
                path: path.clone(),
                source,
            })?;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<Value>(&line) {
                Ok(Value::Array(items)) => {
                    for item in items {
                        match serde_json::from_value::<DecisionEvent>(item) {
                            Ok(e) => out.events.push(e),
                            Err(_) => out.skipped_lines += 1,
                        }
                    }
                }
                Ok(v) => match serde_json::from_value::<DecisionEvent>(v) {
                    Ok(e) => out.events.push(e),
                    Err(_) => out.skipped_lines += 1,
                },
                Err(_) => out.skipped_lines += 1,
            }
        }
    }
    Ok(out)
}

/// Which events take part (`--filter KEY=VALUE`, all must match).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    rules: Vec<(String, String)>,
}

impl Filter {
    pub fn parse(args: &[String]) -> Result<Filter, ReplayError> {
        let mut rules = Vec::new();
        for a in args {
            let (k, v) = a
                .split_once('=')
                .filter(|(k, _)| {
                    matches!(
                        *k,
                        "policy"
                            | "version"
                            | "id"
                            | "route"
                            | "status"
                            | "stage"
                            | "since"
                            | "until"
                    )
                })
                .ok_or_else(|| ReplayError::Filter(a.clone()))?;
            if k == "status" && !matches!(v, "ok" | "error") {
                return Err(ReplayError::Filter(a.clone()));
            }
            if k == "stage" && !matches!(v, "active" | "candidate" | "any") {
                return Err(ReplayError::Filter(a.clone()));
            }
            rules.push((k.to_string(), v.to_string()));
        }
        Ok(Filter { rules })
    }

    /// Shadow runs (stage `candidate` with `shadow_of`) take part only when asked for.
    pub fn matches(&self, e: &DecisionEvent) -> bool {
        let stage = e.policy.as_ref().map(|p| p.stage.as_str());
        let wants_stage = self.rules.iter().find(|(k, _)| k == "stage");
        let stage_ok = match wants_stage.map(|(_, v)| v.as_str()) {
            Some("any") => true,
            Some(s) => stage == Some(s),
            None => e.shadow_of.is_none(),
        };
        stage_ok
            && self.rules.iter().all(|(k, v)| match k.as_str() {
                "policy" => e.policy.as_ref().is_some_and(|p| &p.name == v),
                "version" => e
                    .policy
                    .as_ref()
                    .is_some_and(|p| &p.version == v || p.declared_version.as_ref() == Some(v)),
                "id" => &e.decision_id == v,
                "route" => &e.route == v,
                "status" => (v == "ok") == e.error.is_none(),
                "since" => e.timestamp.as_str() >= v.as_str(),
                "until" => e.timestamp.as_str() < v.as_str(),
                _ => true,
            })
    }
}

/// A numeric output that moved.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Move {
    pub decision_id: String,
    pub field: String,
    pub from: f64,
    pub to: f64,
    pub delta: f64,
}

/// What a replay found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    /// Events read (after filtering), policy decisions or not.
    pub events: u64,
    /// Policy decisions replayed (changed + unchanged).
    pub decisions: u64,
    pub unchanged: u64,
    pub changed: u64,
    pub not_replayable: u64,
    pub not_replayable_reasons: BTreeMap<String, u64>,
    /// Lines of the logs that were not events (torn or not JSON).
    pub skipped_lines: u64,
    /// Reads a model answered because the log did not hold them (`--server`).
    pub reads_from_model: u64,
    /// Output fields (JSON pointers) that changed, with how many decisions they changed in.
    pub fields: BTreeMap<String, u64>,
    pub largest_moves: Vec<Move>,
    pub samples: Samples,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Samples {
    pub changed: Vec<String>,
    pub not_replayable: Vec<NotReplayable>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NotReplayable {
    pub decision_id: String,
    pub reason: String,
}

/// Runs every policy decision of `events` through `components` (by policy name).
pub async fn replay(
    events: &[DecisionEvent],
    components: &BTreeMap<String, Arc<LoadedPolicy>>,
    model: Option<Arc<dyn Reader>>,
    samples: usize,
) -> ReplayReport {
    let mut report = ReplayReport {
        events: events.len() as u64,
        ..Default::default()
    };
    let mut moves = Vec::new();
    for e in events {
        let Some(policy_ref) = &e.policy else {
            continue;
        };
        let verdict = replay_one(e, components.get(&policy_ref.name), model.clone()).await;
        match verdict {
            Verdict::NotReplayable(reason, from_model) => {
                report.reads_from_model += from_model;
                report.not_replayable += 1;
                *report
                    .not_replayable_reasons
                    .entry(reason.clone())
                    .or_default() += 1;
                if report.samples.not_replayable.len() < samples {
                    report.samples.not_replayable.push(NotReplayable {
                        decision_id: e.decision_id.clone(),
                        reason,
                    });
                }
            }
            Verdict::Same(from_model) => {
                report.reads_from_model += from_model;
                report.decisions += 1;
                report.unchanged += 1;
            }
            Verdict::Changed(diff, from_model) => {
                report.reads_from_model += from_model;
                report.decisions += 1;
                report.changed += 1;
                for field in diff.fields {
                    *report.fields.entry(field).or_default() += 1;
                }
                moves.extend(diff.moves.into_iter().map(|(field, from, to)| Move {
                    decision_id: e.decision_id.clone(),
                    field,
                    from,
                    to,
                    delta: to - from,
                }));
                if report.samples.changed.len() < samples {
                    report.samples.changed.push(e.decision_id.clone());
                }
            }
        }
    }
    moves.sort_by(|a, b| b.delta.abs().total_cmp(&a.delta.abs()));
    moves.truncate(samples);
    report.largest_moves = moves;
    report
}

enum Verdict {
    /// Why, and the reads a model answered.
    NotReplayable(String, u64),
    Same(u64),
    Changed(Diff, u64),
}

async fn replay_one(
    e: &DecisionEvent,
    component: Option<&Arc<LoadedPolicy>>,
    model: Option<Arc<dyn Reader>>,
) -> Verdict {
    let Some(policy) = component else {
        let name = e.policy.as_ref().map(|p| p.name.as_str()).unwrap_or("?");
        return Verdict::NotReplayable(format!("no component given for policy `{name}`"), 0);
    };
    let input_masked = e
        .masked
        .iter()
        .chain(&e.erased)
        .any(|p| p.starts_with("/input"));
    let model_name = e.model.as_ref().map(|m| m.name.clone()).unwrap_or_default();
    let has_model = model.is_some();
    // The component's `NAME.toml` decides the calibration, as when serving: its own file
    // calibrates the raw recorded reads, `off` answers from them raw, and without either the
    // reads are answered as they were served (calibrated where the record says so), which keeps
    // the replay of an unchanged version bit-exact (docs/calibration.md).
    let (reads, calibration) = match &policy.calibration {
        PolicyCalibration::Server => (served_reads(&e.reads), None),
        own => (e.reads.clone(), own.reads_with(None)),
    };
    let reader = Arc::new(BookReader::new(&model_name, ReadBook::new(&reads), model));
    // The candidate asks in the mode the decision was recorded in (so its reads match the
    // record), without an answer cache: replay answers from the log.
    // Likewise the prior and order remedies it was recorded with.
    let first = e.reads.first().map(|r| &r.options);
    let answering = AnswerSettings {
        questions: first.map(|o| o.questions).unwrap_or_default(),
        prior: first.map(|o| o.prior).unwrap_or_default(),
        order: first.map(|o| o.order).unwrap_or_default(),
        cache: None,
    };
    let outcome = policy
        .invoke(
            Some(reader.clone() as Arc<dyn Reader>),
            answering,
            calibration,
            &e.input,
        )
        .await;
    let from_model = if has_model { reader.missed() } else { 0 };
    if !has_model && reader.missed() > 0 {
        return Verdict::NotReplayable("a read not in the log".into(), 0);
    }
    // The new result, masked as the recorded one was, so masked fields compare equal.
    let result_masks = PolicyLogConfig {
        mask: e
            .masked
            .iter()
            .filter(|p| p.starts_with("/result"))
            .cloned()
            .collect(),
        erase: e
            .erased
            .iter()
            .filter(|p| p.starts_with("/result"))
            .cloned()
            .collect(),
        ..Default::default()
    };
    let new = match &outcome {
        Ok(inv) => {
            let mut masked = e.clone();
            masked.result = Some(inv.output.clone());
            masked.masked.clear();
            masked.erased.clear();
            result_masks.apply(&mut masked);
            Ok(masked.result.unwrap_or(Value::Null))
        }
        Err(err) => Err(err.kind()),
    };
    let old = match (&e.result, &e.error) {
        (Some(r), None) => Ok(r.clone()),
        (_, Some(err)) => Err(err.kind),
        (None, None) => Ok(Value::Null),
    };
    if old == new {
        return Verdict::Same(from_model);
    }
    if input_masked {
        return Verdict::NotReplayable("the input was masked in the log".into(), from_model);
    }
    let diff = match (&old, &new) {
        (Ok(a), Ok(b)) => diff(a, b),
        (Ok(_), Err(kind)) => Diff {
            fields: vec![format!("(error: {kind})")],
            moves: vec![],
        },
        (Err(kind), _) => Diff {
            fields: vec![format!("(was error: {kind})")],
            moves: vec![],
        },
    };
    Verdict::Changed(diff, from_model)
}

/// Fields (JSON pointers of leaves) that differ, and the numeric ones' moves.
#[derive(Debug, Default, PartialEq)]
pub struct Diff {
    pub fields: Vec<String>,
    pub moves: Vec<(String, f64, f64)>,
}

pub fn diff(old: &Value, new: &Value) -> Diff {
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    leaves(old, String::new(), &mut a);
    leaves(new, String::new(), &mut b);
    let mut out = Diff::default();
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for k in keys {
        let (x, y) = (a.get(k), b.get(k));
        if x == y {
            continue;
        }
        out.fields
            .push(if k.is_empty() { "/".into() } else { k.clone() });
        if let (Some(Value::Number(x)), Some(Value::Number(y))) = (x, y) {
            if let (Some(x), Some(y)) = (x.as_f64(), y.as_f64()) {
                out.moves.push((k.clone(), x, y));
            }
        }
    }
    out
}

fn leaves<'a>(v: &'a Value, at: String, out: &mut BTreeMap<String, &'a Value>) {
    let escape = |k: &str| k.replace('~', "~0").replace('/', "~1");
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                leaves(v, format!("{at}/{}", escape(k)), out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                leaves(v, format!("{at}/{i}"), out);
            }
        }
        _ => {
            out.insert(at, v);
        }
    }
}

/// How re-asking recorded reads moved the answers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RereadReport {
    pub events: u64,
    /// Recorded reads (with distributions) seen.
    pub reads: u64,
    pub reread: u64,
    pub not_rereadable: u64,
    pub not_rereadable_reasons: BTreeMap<String, u64>,
    /// Questions compared.
    pub questions: u64,
    /// Largest and mean |Δ probability| over every label of every question compared.
    pub max_abs_delta: f64,
    pub mean_abs_delta: f64,
    /// Questions whose derived answer changed (noul side of 0.5, choice, rounded score).
    pub answers_changed: u64,
    pub largest_moves: Vec<ReadMove>,
    pub skipped_lines: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReadMove {
    pub decision_id: String,
    pub read: usize,
    pub question: usize,
    pub max_abs_delta: f64,
    pub from: Value,
    pub to: Value,
}

/// The answer's decisive value: what a client would act on.
fn derived(a: &Answer) -> Value {
    match a {
        Answer::Noul { noul } => json!(*noul >= 0.5),
        Answer::Choice { choice, .. } => json!(choice),
        Answer::Score { score, .. } => json!(score.round()),
    }
}

/// Re-asks every recorded read of `events` with `model`.
pub async fn reread(
    events: &[DecisionEvent],
    model: Arc<dyn Reader>,
    samples: usize,
) -> RereadReport {
    let mut report = RereadReport {
        events: events.len() as u64,
        ..Default::default()
    };
    let mut total_delta = 0.0;
    let mut labels = 0u64;
    let mut moves = Vec::new();
    let not = |report: &mut RereadReport, reason: &str| {
        report.not_rereadable += 1;
        *report
            .not_rereadable_reasons
            .entry(reason.to_string())
            .or_default() += 1;
    };
    for e in events {
        for (ri, r) in e.reads.iter().enumerate() {
            let Some(old) = &r.distributions else {
                continue;
            };
            report.reads += 1;
            let Some(state) = &r.state else {
                not(&mut report, "state text left out of the log");
                continue;
            };
            let request = ReadRequest {
                state: state.clone(),
                questions: r.questions.clone(),
                options: r.options.clone(),
                asked: None,
            };
            let new = match model.read(request).await {
                Ok(o) if o.distributions.len() == old.len() => o.distributions,
                Ok(_) => {
                    not(
                        &mut report,
                        "the model answered a different number of questions",
                    );
                    continue;
                }
                Err(err) => {
                    not(
                        &mut report,
                        &format!("the model refused: {}", err.kind().as_str()),
                    );
                    continue;
                }
            };
            report.reread += 1;
            for (qi, ((q, a), b)) in r.questions.iter().zip(old).zip(&new).enumerate() {
                report.questions += 1;
                let mut max = 0.0f64;
                for (x, y) in a.probabilities().iter().zip(b.probabilities()) {
                    let d = (x - y).abs();
                    max = max.max(d);
                    total_delta += d;
                    labels += 1;
                }
                report.max_abs_delta = report.max_abs_delta.max(max);
                let (from, to) = match (
                    Answer::from_distribution(q, a),
                    Answer::from_distribution(q, b),
                ) {
                    (Ok(x), Ok(y)) => (derived(&x), derived(&y)),
                    _ => (Value::Null, Value::Null),
                };
                if from != to {
                    report.answers_changed += 1;
                }
                moves.push(ReadMove {
                    decision_id: e.decision_id.clone(),
                    read: ri,
                    question: qi,
                    max_abs_delta: max,
                    from,
                    to,
                });
            }
        }
    }
    report.mean_abs_delta = if labels > 0 {
        total_delta / labels as f64
    } else {
        0.0
    };
    moves.sort_by(|a, b| b.max_abs_delta.total_cmp(&a.max_abs_delta));
    moves.truncate(samples);
    report.largest_moves = moves;
    report
}

/// `NAME=PATH.wasm` of `--policy`.
pub fn parse_policy_arg(arg: &str) -> Option<(String, PathBuf)> {
    let (name, path) = arg.split_once('=')?;
    (!name.is_empty() && !path.is_empty()).then(|| (name.to_string(), PathBuf::from(path)))
}

/// The `.toml` beside a component, if any.
pub fn config_beside(wasm: &Path) -> Option<PathBuf> {
    let toml = wasm.with_extension("toml");
    toml.is_file().then_some(toml)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_name_leaf_pointers_and_numeric_moves() {
        let d = diff(
            &json!({"ok": true, "score": 0.5, "tags": ["a"], "same": 1}),
            &json!({"ok": false, "score": 0.75, "tags": ["a", "b"], "same": 1}),
        );
        assert_eq!(d.fields, vec!["/ok", "/score", "/tags/1"]);
        assert_eq!(d.moves, vec![("/score".to_string(), 0.5, 0.75)]);
        assert!(diff(&json!({"a": 1}), &json!({"a": 1})).fields.is_empty());
    }

    #[test]
    fn torn_and_foreign_lines_are_skipped_and_batches_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.ndjson");
        let event = json!({"decision_id": "a", "timestamp": "2026-01-01T00:00:00.000Z",
                           "route": "/v1/systemone", "read_algorithm": "x", "status": 200});
        let mut text = format!("{event}\nnot json\n[{event},{event}]\n");
        text.push_str(&event.to_string()[..20]);
        std::fs::write(&path, text).unwrap();
        let read = read_logs(&[path]).unwrap();
        assert_eq!(read.events.len(), 3);
        assert_eq!(read.skipped_lines, 2);
    }

    #[test]
    fn filters_pick_events_and_leave_shadow_runs_out_by_default() {
        let mut e: DecisionEvent = serde_json::from_value(json!({
            "decision_id": "a", "timestamp": "2026-01-02T00:00:00.000Z", "route": "r",
            "read_algorithm": "x", "status": 200,
            "policy": {"name": "p", "version": "v1", "sha256": "s", "stage": "active"}}))
        .unwrap();
        let f = |args: &[&str]| {
            Filter::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
        };
        assert!(f(&["policy=p", "since=2026-01-01"]).matches(&e));
        assert!(!f(&["policy=q"]).matches(&e));
        assert!(!f(&["status=error"]).matches(&e));
        e.shadow_of = Some("b".into());
        assert!(!f(&[]).matches(&e));
        assert!(f(&["stage=any"]).matches(&e));
        assert!(Filter::parse(&["colour=red".into()]).is_err());
    }
}
