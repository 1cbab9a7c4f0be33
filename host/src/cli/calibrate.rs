//! `hunch calibrate`: fits a calibration per question from decision logs (or `hunch batch`
//! outputs) and a labels file, and reports it before and after on held-out folds
//! (docs/calibration.md).

use crate::api::validate::RequestValidator;
use crate::calibration::batch::{self, NO_QUESTIONS};
use crate::calibration::dataset::{
    join, Problem, Recorded, RecordedDecision, RecordedPolicyDecision,
};
use crate::calibration::file::{fit_dataset, CalibrationFile};
use crate::calibration::labels::{read_labels, LabelKey};
use crate::calibration::report;
use crate::calibration::sources::read_sources;
use clap::Args;
use hunch_core::{Question, QuestionId};
use serde_json::{json, Value};
use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Clone, Args)]
#[command(after_help = "Example:
  hunch calibrate --log decisions.ndjson --labels labels.jsonl -o calibration.json --report report/
  hunch calibrate --log batch-output.jsonl --labels labels.jsonl -o calibration.json

A labels line: {\"decision_id\": \"…\", \"labels\": {\"QUESTION_ID\": LABEL}} where LABEL is true/false
for a noul, the option name for a choice, the level index or text for a score; with the output of
`hunch batch`, {\"custom_id\": \"…\", \"labels\": {…}}. A policy decision's QUESTION_ID is the
id the policy gave the question in its read.
Exit status: 0 when a calibration was written, 2 when the command could not run.")]
pub struct CalibrateArgs {
    /// Decision log files (NDJSON, gzip too; `/v1/systemone` and policy decisions are used) or
    /// output files of `hunch batch` (labelled by `custom_id`), told apart by their content.
    #[arg(
        long = "log",
        visible_alias = "batch-output",
        value_name = "FILE",
        required = true,
        num_args = 1..
    )]
    pub logs: Vec<PathBuf>,
    /// The labels (JSONL).
    #[arg(long, value_name = "FILE")]
    pub labels: PathBuf,
    /// Where the calibration is written (what `hunch serve --calibration` is meant to read).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// Print the calibration as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write a self-contained HTML report (`index.html`) into this folder.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
enum CalibrateError {
    #[error(transparent)]
    Logs(#[from] crate::calibration::sources::SourceError),
    #[error("{0}")]
    BatchWithoutQuestions(String),
    #[error(transparent)]
    Labels(#[from] crate::calibration::labels::LabelsError),
    #[error("the request schema: {0}")]
    Schema(#[from] crate::api::validate::SchemaError),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub fn main(args: CalibrateArgs) -> ExitCode {
    match run(&args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hunch calibrate: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &CalibrateArgs) -> Result<String, CalibrateError> {
    let log = read_sources(&args.logs)?;
    let (labels, bad_lines) = read_labels(&args.labels)?;
    let validator = RequestValidator::new()?;
    // A `/v1/systemone` decision's questions are typed from its recorded input with the server's
    // own validation, so the rendered questions (and their keys) are exactly those the model was
    // asked; a policy decision's are its reads', named by the ids the policy gave them. A shadow
    // run answered no one, so no one labels it.
    let mut records: Vec<Recorded> = log
        .events
        .iter()
        .filter(|e| e.shadow_of.is_none())
        .filter_map(|e| {
            if e.policy.is_some() {
                return Some(
                    RecordedPolicyDecision {
                        decision_id: &e.decision_id,
                        reads: &e.reads,
                    }
                    .recorded(),
                );
            }
            if e.route != "/v1/systemone" {
                return None;
            }
            let request = validator.validate(&e.input).ok()?;
            Some(
                RecordedDecision {
                    decision_id: &e.decision_id,
                    questions: request
                        .questions
                        .into_iter()
                        .map(|q| (q.id, q.question))
                        .collect(),
                    reads: &e.reads,
                }
                .recorded(),
            )
        })
        .collect();
    refuse_batch_without_questions(&log.batch, &labels)?;
    // A resumed batch may hold a failed line and the answered retry of one custom_id: the
    // answered one counts.
    let mut batch_lines: Vec<&batch::BatchLine> = log.batch.iter().collect();
    batch_lines.sort_by_key(|l| l.answered.is_err());
    let mut seen = std::collections::HashSet::new();
    let type_questions = |questions: &Value| typed_questions(&validator, questions);
    for line in batch_lines {
        if seen.insert(line.custom_id.as_str()) {
            records.push(batch::recorded(line, &type_questions));
        }
    }
    let mut data = join(&labels, &records);
    data.problems.extend(
        bad_lines
            .into_iter()
            .map(|b| Problem::of(b.line, None, None, b.reason)),
    );
    data.problems.sort_by_key(|p| p.line);
    let file = fit_dataset(data);
    let json = serde_json::to_string_pretty(&file).unwrap_or_default();
    write(&args.output, json.as_bytes())?;
    if let Some(dir) = &args.report {
        std::fs::create_dir_all(dir).map_err(|source| CalibrateError::Write {
            path: dir.clone(),
            source,
        })?;
        write(&dir.join("index.html"), report::html(&file).as_bytes())?;
    }
    Ok(if args.json {
        format!("{json}\n")
    } else {
        table(&file, log.skipped_lines)
    })
}

/// A batch output where no answered line carries its questions was written before `hunch batch`
/// kept them: nothing in it can be fitted, which is said once instead of once per label.
fn refuse_batch_without_questions(
    lines: &[batch::BatchLine],
    labels: &[crate::calibration::labels::LabelLine],
) -> Result<(), CalibrateError> {
    let wants_batch = labels.iter().any(|l| matches!(l.key, LabelKey::Custom(_)));
    let answered: Vec<&batch::BatchAnswer> = lines
        .iter()
        .filter_map(|l| l.answered.as_ref().ok())
        .collect();
    if wants_batch && !answered.is_empty() && answered.iter().all(|a| a.questions.is_none()) {
        return Err(CalibrateError::BatchWithoutQuestions(format!(
            "no answered line of the batch outputs can be fitted: {NO_QUESTIONS}"
        )));
    }
    Ok(())
}

/// A batch line's `request.questions` typed by the server's own request validation.
fn typed_questions(
    validator: &RequestValidator,
    questions: &Value,
) -> Result<Vec<(QuestionId, Question)>, String> {
    let request = json!({"model": "calibrate", "state": "-", "questions": questions});
    let request = validator.validate(&request).map_err(|e| match e {
        crate::api::error::ApiError::Validation(errors) => errors
            .iter()
            .map(|f| format!("{}: {}", f.loc_path(), f.msg))
            .collect::<Vec<_>>()
            .join("; "),
        other => other.to_string(),
    })?;
    Ok(request
        .questions
        .into_iter()
        .map(|q| (q.id, q.question))
        .collect())
}

fn write(path: &std::path::Path, bytes: &[u8]) -> Result<(), CalibrateError> {
    std::fs::write(path, bytes).map_err(|source| CalibrateError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// The human summary: one row per question, then what was refused or not used.
fn table(file: &CalibrationFile, skipped_log_lines: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "held out over {} folds; ECE on {} {}",
        file.folds, file.ece_bins, file.ece_binning
    );
    let _ = writeln!(
        out,
        "{:<24} {:>6} {:>7}  {:>15}  {:>15}  {:>15}  {:>8}",
        "question", "labels", "T", "NLL before→after", "Brier", "ECE", "accuracy"
    );
    for q in &file.questions {
        let _ = writeln!(
            out,
            "{:<24} {:>6} {:>7.3}  {:>7.4}→{:<7.4}  {:>7.4}→{:<7.4}  {:>7.4}→{:<7.4}  {:>8.3}",
            q.ids.join(","),
            q.labels,
            q.temperature,
            q.before.nll,
            q.after.nll,
            q.before.brier,
            q.after.brier,
            q.before.ece,
            q.after.ece,
            q.after.accuracy
        );
        for c in &q.cut_points {
            match c.threshold {
                Some(t) => {
                    let _ = writeln!(
                        out,
                        "    precision ≥ {:.2}: act when P(yes) ≥ {t:.4} (coverage {:.1}%, {} cases)",
                        c.target_precision,
                        100.0 * c.coverage,
                        c.support
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "    precision ≥ {:.2}: not reached on held-out answers",
                        c.target_precision
                    );
                }
            }
        }
    }
    for r in &file.refused {
        let _ = writeln!(out, "not fitted: {}: {}", r.ids.join(","), r.reason);
    }
    for p in &file.problems {
        let _ = writeln!(
            out,
            "label not used: line {} {} {}: {}",
            p.line,
            p.record(),
            p.question_id.as_deref().unwrap_or(""),
            p.reason
        );
    }
    if skipped_log_lines > 0 {
        let _ = writeln!(
            out,
            "{skipped_log_lines} log lines were neither decision events nor batch output lines"
        );
    }
    out
}
