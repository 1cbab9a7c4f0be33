//! `hunch policy run` and `hunch policy check`: a component loaded in this process by the
//! server's own policy runtime (engine, limits, `describe`, schema checks), so what passes here
//! loads in `hunch serve`, and a local run decides as the server would.
//!
//! `run`'s reads go through the upstream reader to a System One endpoint: `--server URL`, or
//! the server this process starts on a loopback port for `--model DIR` (the same sidecar and
//! read path as `hunch serve`).

use crate::cli::render;
use crate::cli::target::{Target, TargetArgs};
use crate::decision::event::ReadEvent;
use crate::decision::recorder::{ReadLog, RecordingReader};
use crate::policy::invoke::{Invocation, InvokeError, LoadError, LoadedPolicy, PolicyConfig};
use crate::policy::registry::valid_name;
use crate::policy::{build_engine, EngineSettings, Limits};
use crate::reader::upstream::{UpstreamConfig, UpstreamReader};
use clap::Args;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  hunch policy run policies/target/wasm32-wasip2/release/triage.wasm ticket.json --server http://127.0.0.1:8080
  hunch policy run triage.wasm ticket.json --model dg=/models/diffusiongemma --json
  echo '{\"text\": \"...\"}' | hunch policy run triage.wasm - --server URL

A NAME.toml beside the component (reader, limits) applies as in `hunch serve --policies`.")]
pub struct RunArgs {
    /// The policy component (`.wasm`).
    pub wasm: PathBuf,
    /// The policy's input, a JSON file (`-`: stdin).
    pub input: String,
    #[command(flatten)]
    pub target: TargetArgs,
    /// The policy's configuration (reader, limits) instead of the `.toml` beside the component.
    #[arg(long = "policy-config", value_name = "FILE")]
    pub policy_config: Option<PathBuf>,
    /// How the policy's reads ask their questions when its configuration does not say:
    /// `isolated` (the server's default) or `joint`. Sent with every read, so the server's own
    /// default does not matter.
    #[arg(long, value_name = "isolated|joint", default_value = "isolated")]
    pub questions: hunch_core::QuestionMode,
    /// Print the whole invocation (decision, reads, logs, limits) as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "Example:
  hunch policy check policies/target/wasm32-wasip2/release/triage.wasm

Checks what `hunch serve` checks before serving a version: the component compiles, fits the
hunch:policy world, `describe` returns, and both schemas are valid JSON Schemas; a NAME.toml
beside it (or --policy-config) must parse. `decide` is not run.")]
pub struct CheckArgs {
    /// The policy component (`.wasm`).
    pub wasm: PathBuf,
    /// The policy's configuration instead of the `.toml` beside the component.
    #[arg(long = "policy-config", value_name = "FILE")]
    pub policy_config: Option<PathBuf>,
    /// Print what the policy declares as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyRunError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} has no file name to name the policy by")]
    NoName(PathBuf),
    #[error("the input is not JSON: {0}")]
    Input(serde_json::Error),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Engine(#[from] crate::policy::engine::EngineError),
    #[error(transparent)]
    Target(#[from] crate::cli::target::TargetError),
    #[error("the policy's reader: {0}")]
    Reader(String),
    #[error("{}", invoke_message(.0))]
    Invoke(InvokeError),
    #[error("the loader stopped: {0}")]
    Join(String),
}

/// An invocation error as the server words it, with the schema errors it lists.
fn invoke_message(e: &InvokeError) -> String {
    match e {
        InvokeError::InvalidInput(details) => format!("{e}: {}", details.join("; ")),
        other => other.to_string(),
    }
}

/// A loaded component, its name and the configuration it loaded with.
struct Loaded {
    policy: Arc<LoadedPolicy>,
    /// Where the configuration came from, if anywhere.
    config_path: Option<PathBuf>,
    /// The file stem, if the server would refuse it as a name.
    name_warning: Option<String>,
}

fn read(path: &Path) -> Result<Vec<u8>, PolicyRunError> {
    std::fs::read(path).map_err(|source| PolicyRunError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Loads like the registry does: `NAME.toml` beside `NAME.wasm`, limits capped by the server's.
async fn load(wasm_path: &Path, config: Option<&Path>) -> Result<Loaded, PolicyRunError> {
    let name = wasm_path
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| PolicyRunError::NoName(wasm_path.to_path_buf()))?
        .to_string();
    let wasm = read(wasm_path)?;
    let beside = wasm_path.with_extension("toml");
    let config_path = match config {
        Some(p) => Some(p.to_path_buf()),
        None => beside.is_file().then_some(beside),
    };
    let config = match &config_path {
        Some(p) => {
            let text = String::from_utf8_lossy(&read(p)?).into_owned();
            // A calibration file it names is relative to the config's own directory.
            PolicyConfig::parse(&text)?.relative_to(p.parent().unwrap_or(Path::new("")))
        }
        None => PolicyConfig::default(),
    };
    let name_warning = (!valid_name(&name)).then(|| {
        format!(
            "`hunch serve --policies` ignores a file named {name:?}: a policy name is 1-64 of \
             a-z, 0-9, '-', '_', starting with a letter or digit"
        )
    });
    let settings = EngineSettings::default();
    let engine = build_engine(&settings)?;
    let handle = tokio::runtime::Handle::current();
    let policy = tokio::task::spawn_blocking(move || {
        LoadedPolicy::load(&engine, &name, &wasm, config, &Limits::default(), &handle)
    })
    .await
    .map_err(|e| PolicyRunError::Join(e.to_string()))??;
    Ok(Loaded {
        policy: Arc::new(policy),
        config_path,
        name_warning,
    })
}

fn descriptor_json(loaded: &Loaded) -> Value {
    let p = &loaded.policy;
    json!({
        "name": p.name,
        "version": p.version,
        "declared_name": p.descriptor.name,
        "declared_version": p.descriptor.version,
        "description": p.descriptor.description,
        "input_schema": p.descriptor.input_schema,
        "output_schema": p.descriptor.output_schema,
        "limits": p.limits,
        "reader": p.reader,
        "config": loaded.config_path,
        "wasm_bytes": p.wasm_bytes,
    })
}

fn limits_line(l: &Limits) -> String {
    format!(
        "fuel {}, timeout {} ms, memory {} bytes, {} reads, {} questions, output {} bytes, \
         state {} bytes, {} log lines",
        l.fuel,
        l.timeout_ms,
        l.memory_bytes,
        l.max_reads,
        l.max_questions,
        l.max_output_bytes,
        l.max_state_bytes,
        l.max_log_lines
    )
}

/// `hunch policy check`.
pub async fn check(args: CheckArgs) -> ExitCode {
    match load(&args.wasm, args.policy_config.as_deref()).await {
        Ok(loaded) => {
            if args.json {
                println!("{:#}", descriptor_json(&loaded));
            } else {
                let p = &loaded.policy;
                println!(
                    "ok: {} (version {}): {} {} — {}",
                    p.name,
                    p.version,
                    p.descriptor.name,
                    p.descriptor.version,
                    p.descriptor.description
                );
                println!("input schema:  {}", p.descriptor.input_schema);
                println!("output schema: {}", p.descriptor.output_schema);
                println!("limits: {}", limits_line(&p.limits));
                println!(
                    "reader: {}",
                    p.reader
                        .as_deref()
                        .unwrap_or("the server's default (jev-latest)")
                );
            }
            if let Some(w) = &loaded.name_warning {
                eprintln!("hunch policy check: warning: {w}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hunch policy check: {}: {e}", args.wasm.display());
            ExitCode::FAILURE
        }
    }
}

fn read_input(input: &str) -> Result<Value, PolicyRunError> {
    let text = if input == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|source| PolicyRunError::Read {
                path: "-".into(),
                source,
            })?;
        s
    } else {
        String::from_utf8_lossy(&read(Path::new(input))?).into_owned()
    };
    serde_json::from_str(&text).map_err(PolicyRunError::Input)
}

/// The invocation report for a terminal.
/// What a local run gives: the decision, the model reads exactly as the decision log records
/// them (`reads` of a decision event: one record per question set the policy read, whatever the
/// question mode — an isolated set of n questions is one record whose n questions were each
/// read alone), and the limits it ran under.
struct RunOutcome {
    invocation: Invocation,
    records: Vec<ReadEvent>,
    limits: Limits,
}

fn report(outcome: &RunOutcome) -> String {
    let RunOutcome {
        invocation,
        records,
        limits,
    } = outcome;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "decision ({} {}):\n{:#}",
        invocation.policy, invocation.version, invocation.output
    );
    for (n, record) in invocation.reads.iter().enumerate() {
        let _ = writeln!(
            out,
            "\nread {} ({:.1} ms, {} input tokens): state {:?}",
            n + 1,
            record.elapsed_ms,
            record.usage.input_tokens,
            render::shorten(&record.state, 120)
        );
        let value = serde_json::to_value(record).unwrap_or(Value::Null);
        let questions = value.get("questions").and_then(Value::as_array);
        match value.get("answers").and_then(Value::as_array) {
            Some(answers) => {
                for answer in answers {
                    let id = answer.get("id").and_then(Value::as_str).unwrap_or("?");
                    let question = questions
                        .and_then(|qs| qs.iter().find(|q| q.get("id") == answer.get("id")))
                        .and_then(render::question_text);
                    out.push_str(&render::answer_block(id, question.as_deref(), answer));
                }
            }
            None => {
                let _ = writeln!(
                    out,
                    "    failed: {}",
                    value.get("error").unwrap_or(&Value::Null)
                );
            }
        }
    }
    if !invocation.logs.is_empty() {
        let _ = writeln!(out, "\nlog:");
        for line in &invocation.logs {
            let _ = writeln!(out, "    {:5} {}", line.level, line.message);
        }
    }
    let t = &invocation.timings;
    let _ = writeln!(
        out,
        "\n{} reads, {} input + {} output tokens, {} fuel; {:.1} ms ({:.1} ms reading)",
        invocation.reads.len(),
        invocation.usage.input_tokens,
        invocation.usage.output_tokens,
        invocation.fuel_used,
        t.total_ms,
        t.read_ms
    );
    let _ = writeln!(out, "limits: {}", limits_line(limits));
    let _ = writeln!(
        out,
        "\nmodel reads as the decision log records them ({}):",
        records.len()
    );
    for record in records {
        let _ = writeln!(out, "{}", serde_json::to_string(record).unwrap_or_default());
    }
    out
}

async fn run_inner(args: &RunArgs) -> Result<RunOutcome, PolicyRunError> {
    let input = read_input(&args.input)?;
    let loaded = load(&args.wasm, args.policy_config.as_deref()).await?;
    if let Some(w) = &loaded.name_warning {
        eprintln!("hunch policy run: warning: {w}");
    }
    // Fail on the input before starting a model.
    loaded
        .policy
        .validate_input(&input)
        .map_err(PolicyRunError::Invoke)?;
    let target = Target::start(&args.target).await?;
    let model = loaded
        .policy
        .reader
        .clone()
        .unwrap_or_else(|| crate::reader::DEFAULT_ALIAS.to_string());
    let reader = UpstreamReader::new(UpstreamConfig {
        name: model.clone(),
        url: target.url.clone(),
        remote_model: model,
        key: target.api_key.clone(),
        timeout: loaded.policy.limits.timeout() + Duration::from_secs(1),
        ca_file: None,
    })
    .map_err(|e| PolicyRunError::Reader(e.to_string()))?;
    let log = ReadLog::default();
    let recording = RecordingReader::new(Arc::new(reader), log.clone(), false);
    let answering = hunch_core::AnswerSettings {
        questions: args.questions,
        ..hunch_core::AnswerSettings::default()
    };
    // No server here: only the policy's own calibration (its `NAME.toml`) applies.
    let calibration = loaded.policy.calibration.reads_with(None);
    let result = loaded
        .policy
        .invoke(Some(Arc::new(recording)), answering, calibration, &input)
        .await;
    target.shutdown().await;
    let invocation = result.map_err(PolicyRunError::Invoke)?;
    let records = std::mem::take(&mut *log.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(RunOutcome {
        invocation,
        records,
        limits: loaded.policy.limits,
    })
}

/// `hunch policy run`.
pub async fn run(args: RunArgs) -> ExitCode {
    match run_inner(&args).await {
        Ok(outcome) => {
            if args.json {
                let mut value = json!(outcome.invocation);
                value["limits"] = json!(outcome.limits);
                value["read_records"] = json!(outcome.records);
                println!("{value:#}");
            } else {
                print!("{}", report(&outcome));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hunch policy run: {e}");
            ExitCode::FAILURE
        }
    }
}
