//! `hunch replay`: the command line around [`crate::policy::replay`].

use crate::policy::replay::{
    config_beside, parse_policy_arg, read_logs, replay, reread, Filter, ReplayError, ReplayReport,
    RereadReport,
};
use crate::policy::{build_engine, EngineSettings, Limits, LoadedPolicy, PolicyConfig};
use crate::reader::upstream::{UpstreamConfig, UpstreamReader};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use hunch_core::Reader;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// Decision log files (NDJSON, `.gz` too; rotated files in any order).
    #[arg(long = "log", value_name = "FILE", required = true, num_args = 1..)]
    pub logs: Vec<PathBuf>,
    /// The component to replay a policy's decisions with: `NAME=PATH.wasm` (repeatable; a
    /// `PATH.toml` beside it is its config).
    #[arg(long = "policy", value_name = "NAME=PATH.wasm")]
    pub policies: Vec<String>,
    /// A policy directory: `NAME.wasm` (+ `NAME.toml`) for policies not named by `--policy`.
    #[arg(long = "policies", value_name = "DIR")]
    pub policy_dir: Option<PathBuf>,
    /// Only events matching `KEY=VALUE` (repeatable, all must match): policy, version, id,
    /// route, status (ok|error), stage (active|candidate|any; shadow runs only when asked),
    /// since / until (RFC 3339 timestamps).
    #[arg(long = "filter", value_name = "KEY=VALUE")]
    pub filters: Vec<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A System One server for reads the log does not hold (or, with --reread, for all reads).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// The model asked on --server.
    #[arg(long, default_value = "jev-latest")]
    pub model: String,
    /// The bearer key sent to `--server`.
    #[arg(long, env = "HUNCH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The old name of `--api-key` (and `HUNCH_REPLAY_KEY` of `HUNCH_API_KEY`): still read, with
    /// a warning, so scripts written for it keep working.
    #[arg(
        long = "key",
        env = "HUNCH_REPLAY_KEY",
        hide = true,
        hide_env_values = true
    )]
    pub deprecated_key: Option<String>,
    /// Re-ask the recorded reads (raw and policy decisions) on --server and report how the
    /// probabilities and answers moved.
    #[arg(long, requires = "server")]
    pub reread: bool,
    /// Sample decisions and largest moves listed.
    #[arg(long, default_value_t = 10)]
    pub samples: usize,
    /// Exit 1 when a decision changed or could not be replayed (for CI).
    #[arg(long)]
    pub fail_on_change: bool,
    /// Instead of replaying policies: report which recorded `/v1/systemone` answers this
    /// calibration file (from `hunch calibrate`) would flip, against what was served.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["policies", "policy_dir", "reread"])]
    pub calibration: Option<PathBuf>,
}

/// Why `hunch replay` could not run (exit code 2).
#[derive(Debug, thiserror::Error)]
enum ReplayCliError {
    #[error(transparent)]
    Logs(#[from] ReplayError),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("--server: {0}")]
    Server(#[from] crate::reader::upstream::UpstreamError),
    #[error("--reread needs --server")]
    RereadNeedsServer,
    #[error("--policy wants NAME=PATH.wasm, got {0:?}")]
    PolicyArg(String),
    #[error("the policy runtime: {0}")]
    Engine(#[from] crate::policy::engine::EngineError),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Policy { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Calibration {
        path: PathBuf,
        source: crate::calibration::file::LoadError,
    },
}

/// Runs `hunch replay`; the exit code is 0, 1 (`--fail-on-change` and a change) or 2 (bad
/// arguments, unreadable files).
pub fn main(mut args: ReplayArgs, matches: &ArgMatches) -> ExitCode {
    let (key, warning) = server_key(
        sourced(matches, "api_key", args.api_key.take()),
        sourced(matches, "deprecated_key", args.deprecated_key.take()),
    );
    if let Some(warning) = warning {
        eprintln!("hunch replay: {warning}");
    }
    args.api_key = key;
    match run(&args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("hunch replay: {message}");
            ExitCode::from(2)
        }
    }
}

/// A value with where it came from: the command line or a variable.
fn sourced(matches: &ArgMatches, id: &str, value: Option<String>) -> Option<(String, ValueSource)> {
    let source = matches.value_source(id)?;
    value.map(|v| (v, source))
}

/// The key sent to `--server`: `--api-key` / `HUNCH_API_KEY`, the name every client command
/// uses, or the old `--key` / `HUNCH_REPLAY_KEY`, ranked like any setting (a flag over a
/// variable; the new name over the old one from the same kind of source). The warning says
/// which old name was used.
fn server_key(
    api_key: Option<(String, ValueSource)>,
    old: Option<(String, ValueSource)>,
) -> (Option<String>, Option<String>) {
    let rank = |source: ValueSource| u8::from(source == ValueSource::CommandLine);
    let warning = old.as_ref().map(|(_, source)| match source {
        ValueSource::CommandLine => "--key is deprecated: use --api-key".to_string(),
        _ => "HUNCH_REPLAY_KEY is deprecated: use HUNCH_API_KEY".to_string(),
    });
    let key = match (api_key, old) {
        (Some((new, new_source)), Some((old, old_source))) => {
            if rank(old_source) > rank(new_source) {
                Some(old)
            } else {
                Some(new)
            }
        }
        (new, old) => new.or(old).map(|(key, _)| key),
    };
    (key, warning)
}

fn model(args: &ReplayArgs) -> Result<Option<Arc<dyn Reader>>, ReplayCliError> {
    let Some(url) = &args.server else {
        return Ok(None);
    };
    let reader = UpstreamReader::new(UpstreamConfig {
        name: args.model.clone(),
        url: url.clone(),
        remote_model: args.model.clone(),
        key: args.api_key.clone(),
        timeout: Duration::from_secs(300),
        ca_file: None,
    })?;
    Ok(Some(Arc::new(reader)))
}

fn run(args: &ReplayArgs) -> Result<ExitCode, ReplayCliError> {
    let filter = Filter::parse(&args.filters)?;
    let read = read_logs(&args.logs)?;
    let events: Vec<_> = read
        .events
        .into_iter()
        .filter(|e| filter.matches(e))
        .collect();
    if let Some(path) = &args.calibration {
        return replay_calibration(args, path, &events);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ReplayCliError::Runtime)?;
    let model = {
        let _guard = runtime.enter();
        model(args)?
    };
    if args.reread {
        let model = model.ok_or(ReplayCliError::RereadNeedsServer)?;
        let mut report = runtime.block_on(reread(&events, model, args.samples));
        report.skipped_lines = read.skipped_lines;
        print(args.json, &report, reread_table(&report));
        return Ok(ExitCode::SUCCESS);
    }

    // Components, loaded before the runtime runs anything (loading blocks on it).
    let mut paths: BTreeMap<String, PathBuf> = BTreeMap::new();
    for p in &args.policies {
        let (name, path) =
            parse_policy_arg(p).ok_or_else(|| ReplayCliError::PolicyArg(p.clone()))?;
        paths.insert(name, path);
    }
    if let Some(dir) = &args.policy_dir {
        for e in &events {
            if let Some(p) = &e.policy {
                let wasm = dir.join(format!("{}.wasm", p.name));
                if wasm.is_file() {
                    paths.entry(p.name.clone()).or_insert(wasm);
                }
            }
        }
    }
    let engine = build_engine(&EngineSettings {
        max_concurrent: 4,
        ..EngineSettings::default()
    })?;
    let mut components = BTreeMap::new();
    for (name, path) in paths {
        let wasm = std::fs::read(&path).map_err(|source| ReplayCliError::Read {
            path: path.clone(),
            source,
        })?;
        let config = match config_beside(&path) {
            Some(t) => {
                let text = std::fs::read_to_string(&t).map_err(|source| ReplayCliError::Read {
                    path: t.clone(),
                    source,
                })?;
                PolicyConfig::parse(&text)
                    .map_err(|e| ReplayCliError::Policy {
                        path: t.clone(),
                        message: e.to_string(),
                    })?
                    .relative_to(t.parent().unwrap_or(Path::new("")))
            }
            None => PolicyConfig::default(),
        };
        let policy = LoadedPolicy::load(
            &engine,
            &name,
            &wasm,
            config,
            &Limits::default(),
            runtime.handle(),
        )
        .map_err(|e| ReplayCliError::Policy {
            path: path.clone(),
            message: e.to_string(),
        })?;
        components.insert(name, Arc::new(policy));
    }
    let mut report = runtime.block_on(replay(&events, &components, model, args.samples));
    report.skipped_lines = read.skipped_lines;
    print(args.json, &report, replay_table(&report));
    let failed = report.changed > 0 || report.not_replayable > 0;
    Ok(if args.fail_on_change && failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn print(json: bool, report: &impl serde::Serialize, table: String) {
    if json {
        println!("{}", serde_json::to_string(report).unwrap_or_default());
    } else {
        print!("{table}");
    }
}

fn replay_table(r: &ReplayReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "events read            {}", r.events);
    let _ = writeln!(out, "decisions replayed     {}", r.decisions);
    let _ = writeln!(out, "  unchanged            {}", r.unchanged);
    let _ = writeln!(out, "  changed              {}", r.changed);
    let _ = writeln!(out, "not replayable         {}", r.not_replayable);
    for (reason, n) in &r.not_replayable_reasons {
        let _ = writeln!(out, "  {n:>6}  {reason}");
    }
    if r.reads_from_model > 0 {
        let _ = writeln!(out, "reads asked of a model {}", r.reads_from_model);
    }
    let _ = writeln!(out, "log lines skipped      {}", r.skipped_lines);
    if !r.fields.is_empty() {
        let _ = writeln!(out, "\nchanged field                            decisions");
        for (field, n) in &r.fields {
            let _ = writeln!(out, "{field:<40} {n}");
        }
    }
    if !r.largest_moves.is_empty() {
        let _ = writeln!(out, "\nlargest numeric moves");
        for m in &r.largest_moves {
            let _ = writeln!(
                out,
                "  {}  {}  {} -> {}  ({:+})",
                m.decision_id, m.field, m.from, m.to, m.delta
            );
        }
    }
    if !r.samples.changed.is_empty() {
        let _ = writeln!(out, "\nchanged decisions: {}", r.samples.changed.join(" "));
    }
    for n in &r.samples.not_replayable {
        let _ = writeln!(out, "not replayable: {}  {}", n.decision_id, n.reason);
    }
    out
}

fn reread_table(r: &RereadReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "events read            {}", r.events);
    let _ = writeln!(out, "recorded reads         {}", r.reads);
    let _ = writeln!(out, "  re-read              {}", r.reread);
    let _ = writeln!(out, "  not re-readable      {}", r.not_rereadable);
    for (reason, n) in &r.not_rereadable_reasons {
        let _ = writeln!(out, "    {n:>6}  {reason}");
    }
    let _ = writeln!(out, "questions compared     {}", r.questions);
    let _ = writeln!(out, "max |Δp|               {:.6}", r.max_abs_delta);
    let _ = writeln!(out, "mean |Δp|              {:.6}", r.mean_abs_delta);
    let _ = writeln!(out, "answers changed        {}", r.answers_changed);
    let _ = writeln!(out, "log lines skipped      {}", r.skipped_lines);
    if !r.largest_moves.is_empty() {
        let _ = writeln!(
            out,
            "\nlargest moves (decision, read, question, max |Δp|, answer)"
        );
        for m in &r.largest_moves {
            let _ = writeln!(
                out,
                "  {}  {}  {}  {:.6}  {} -> {}",
                m.decision_id, m.read, m.question, m.max_abs_delta, m.from, m.to
            );
        }
    }
    out
}

/// `--calibration FILE`: the flips a calibration would make, against what was served.
fn replay_calibration(
    args: &ReplayArgs,
    path: &std::path::Path,
    events: &[crate::decision::event::DecisionEvent],
) -> Result<ExitCode, ReplayCliError> {
    let bytes = std::fs::read(path).map_err(|source| ReplayCliError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let calibrations =
        crate::calibration::file::Calibrations::from_bytes(&bytes).map_err(|source| {
            ReplayCliError::Calibration {
                path: path.to_path_buf(),
                source,
            }
        })?;
    let report = crate::calibration::replay::replay(events, &calibrations);
    let mut table = format!(
        "calibration {}: {} decisions, {} answers, {} covered, largest probability move {:.4}, {} flips\n",
        report.calibration,
        report.decisions,
        report.answers,
        report.covered,
        report.max_probability_move,
        report.flips.len()
    );
    for f in report.flips.iter().take(args.samples) {
        let _ = writeln!(
            table,
            "  {} {}{:?}: {} -> {}",
            f.decision_id,
            f.question_id
                .as_ref()
                .map(|id| format!("{id} "))
                .unwrap_or_default(),
            f.instructions,
            f.served,
            f.replayed
        );
    }
    let changed = !report.flips.is_empty();
    print(args.json, &report, table);
    Ok(if args.fail_on_change && changed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_key_is_api_key_and_the_old_key_still_works_with_a_warning() {
        let flag = |k: &str| Some((k.to_string(), ValueSource::CommandLine));
        let var = |k: &str| Some((k.to_string(), ValueSource::EnvVariable));
        assert_eq!(server_key(flag("new"), None), (Some("new".into()), None));
        assert_eq!(server_key(None, None), (None, None));
        let (key, warning) = server_key(None, flag("old"));
        assert_eq!(key.as_deref(), Some("old"));
        assert!(warning.is_some_and(|w| w.contains("--api-key")));
        let (key, warning) = server_key(None, var("old"));
        assert_eq!(key.as_deref(), Some("old"));
        assert!(warning.is_some_and(|w| w.contains("HUNCH_API_KEY")));
        // A flag wins over a variable, whichever its name; the new name wins a tie.
        assert_eq!(
            server_key(var("new"), flag("old")).0.as_deref(),
            Some("old")
        );
        assert_eq!(
            server_key(flag("new"), var("old")).0.as_deref(),
            Some("new")
        );
        assert_eq!(
            server_key(flag("new"), flag("old")).0.as_deref(),
            Some("new")
        );
    }
}
