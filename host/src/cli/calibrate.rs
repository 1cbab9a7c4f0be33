//! `hunch calibrate`: fits a calibration per question from decision logs and a labels file, and
//! reports it before and after on held-out folds (docs/calibration.md).

use crate::api::validate::RequestValidator;
use crate::calibration::dataset::{join, Problem, RecordedDecision};
use crate::calibration::file::{fit_dataset, CalibrationFile};
use crate::calibration::labels::read_labels;
use crate::calibration::report;
use crate::policy::replay::read_logs;
use clap::Args;
use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Clone, Args)]
#[command(after_help = "Example:
  hunch calibrate --log decisions.ndjson --labels labels.jsonl -o calibration.json --report report/

A labels line: {\"decision_id\": \"…\", \"labels\": {\"QUESTION_ID\": LABEL}} where LABEL is true/false
for a noul, the option name for a choice, the level index or text for a score.
Exit status: 0 when a calibration was written, 2 when the command could not run.")]
pub struct CalibrateArgs {
    /// Decision log files (NDJSON, `.gz` too); `/v1/systemone` decisions are used.
    #[arg(long = "log", value_name = "FILE", required = true, num_args = 1..)]
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
    Logs(#[from] crate::policy::replay::ReplayError),
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
    let log = read_logs(&args.logs)?;
    let (labels, bad_lines) = read_labels(&args.labels)?;
    let validator = RequestValidator::new()?;
    // Questions are typed from each event's recorded input with the server's own validation, so
    // the rendered questions (and their keys) are exactly those the model was asked.
    let decisions: Vec<RecordedDecision<'_>> = log
        .events
        .iter()
        .filter(|e| e.route == "/v1/systemone" && e.shadow_of.is_none())
        .filter_map(|e| {
            let request = validator.validate(&e.input).ok()?;
            Some(RecordedDecision {
                decision_id: &e.decision_id,
                questions: request
                    .questions
                    .into_iter()
                    .map(|q| (q.id, q.question))
                    .collect(),
                reads: &e.reads,
            })
        })
        .collect();
    let mut data = join(&labels, &decisions);
    data.problems.extend(bad_lines.into_iter().map(|b| Problem {
        line: b.line,
        decision_id: String::new(),
        question_id: None,
        reason: b.reason,
    }));
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
            p.decision_id,
            p.question_id.as_deref().unwrap_or(""),
            p.reason
        );
    }
    if skipped_log_lines > 0 {
        let _ = writeln!(
            out,
            "{skipped_log_lines} log lines were not decision events"
        );
    }
    out
}
