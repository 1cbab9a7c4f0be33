//! `hunch ask`: one System One read from the shell, questions given as flags (or a JSON body),
//! answers printed as a table with probability bars (or the response JSON).

use crate::cli::batch::send::{Outcome, RetryPolicy, Sender};
use crate::cli::render;
use crate::cli::target::{Target, TargetArgs};
use clap::{ArgMatches, Args};
use serde_json::{json, Map, Value};
use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  hunch ask --server http://127.0.0.1:8080 --state \"I was charged twice\" \\
      --noul \"Is this urgent?\" --choice \"team=Which team?\" billing technical \\
      --score \"How angry?\" calm annoyed furious
  hunch ask --server http://127.0.0.1:8080 --body request.json --json
  echo '{\"state\": \"...\", \"questions\": {...}}' | hunch ask --server URL --body -

Questions are named q1, q2, … in the order given, unless written ID=QUESTION: the text before
the first = is the id when it has no spaces (write q1=2+2=4? to ask \"2+2=4?\"). A choice option
may carry a description as NAME=DESCRIPTION.")]
pub struct AskArgs {
    /// A running server, `http://` or `https://` (TLS trusts the system's roots).
    #[arg(long, value_name = "URL", conflicts_with = "load")]
    pub server: Option<String>,
    /// The bearer key sent to `--server`.
    #[arg(long, env = "HUNCH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Load a model here instead of `--server`, as `hunch serve --model` does: `[NAME=]DIR`.
    #[arg(long = "load", value_name = "[NAME=]DIR")]
    pub load: Vec<String>,
    /// The model asked (default `jev-latest`, or the body's).
    #[arg(long)]
    pub model: Option<String>,
    /// The text the questions are about.
    #[arg(long, required_unless_present = "body")]
    pub state: Option<String>,
    /// A yes/no question: `[ID=]QUESTION`.
    #[arg(long, value_name = "[ID=]QUESTION")]
    pub noul: Vec<String>,
    /// A choice question and its options: `[ID=]QUESTION OPTION…` (an option may be NAME=DESCRIPTION).
    #[arg(long, num_args = 2.., value_names = ["[ID=]QUESTION", "OPTION"])]
    pub choice: Vec<String>,
    /// A score question and its levels, lowest first: `[ID=]QUESTION LEVEL…`.
    #[arg(long, num_args = 2.., value_names = ["[ID=]QUESTION", "LEVEL"])]
    pub score: Vec<String>,
    /// A whole request body from a JSON file (`-`: stdin) instead of the flags above.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["state", "noul", "choice", "score"])]
    pub body: Option<String>,
    /// Print the response JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Why `hunch ask` could not ask.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("give at least one question (--noul, --choice or --score)")]
    NoQuestion,
    #[error("give --server URL (a running server) or --load DIR (a model loaded here)")]
    NoTarget,
    #[error("question id {0:?} is used twice")]
    DuplicateId(String),
    #[error("cannot read the body from {path}: {message}")]
    Body { path: String, message: String },
    #[error(transparent)]
    Target(#[from] crate::cli::target::TargetError),
    #[error("cannot build the HTTP client: {0}")]
    Client(reqwest::Error),
    #[error("no answer: {0}")]
    Transport(String),
    #[error("{0}")]
    Refused(String),
}

/// `ID=TEXT` when the text before the first `=` has no whitespace (docs/cli.md), else `None`:
/// a question's text has spaces, an id none, and the API takes any string as an id, so
/// `urgent?=Is it urgent?` is the id `urgent?`, never silently a question `q1` with that text.
fn split_id(arg: &str) -> (Option<&str>, &str) {
    match arg.split_once('=') {
        Some((id, text)) if !id.is_empty() && !id.chars().any(char::is_whitespace) => {
            (Some(id), text)
        }
        _ => (None, arg),
    }
}

/// One question flag, where it was on the command line.
struct Flag {
    position: usize,
    kind: &'static str,
    values: Vec<String>,
}

/// The question flags in command-line order, each occurrence with its own values (only the
/// matches know both).
fn flags_in_order(matches: &ArgMatches) -> Vec<Flag> {
    let mut flags = Vec::new();
    for kind in ["noul", "choice", "score"] {
        let indices: Vec<usize> = matches
            .indices_of(kind)
            .map(|i| i.collect())
            .unwrap_or_default();
        let Some(occurrences) = matches.get_occurrences::<String>(kind) else {
            continue;
        };
        let mut offset = 0;
        for values in occurrences {
            let values: Vec<String> = values.cloned().collect();
            // The index of an occurrence's first value orders it among all flags.
            let position = indices.get(offset).copied().unwrap_or(usize::MAX);
            offset += values.len();
            flags.push(Flag {
                position,
                kind,
                values,
            });
        }
    }
    flags.sort_by_key(|f| f.position);
    flags
}

/// The request body the flags describe.
pub fn body_from_flags(args: &AskArgs, matches: &ArgMatches) -> Result<Value, AskError> {
    let mut questions = Map::new();
    for (n, flag) in flags_in_order(matches).into_iter().enumerate() {
        let Some((first, rest)) = flag.values.split_first() else {
            continue;
        };
        let (id, text) = split_id(first);
        let id = id
            .map(String::from)
            .unwrap_or_else(|| format!("q{}", n + 1));
        let mut question = json!({"type": flag.kind, "instructions": text});
        match flag.kind {
            "choice" => {
                let options: Map<String, Value> = rest
                    .iter()
                    .map(|o| match o.split_once('=') {
                        Some((name, description)) => (name.to_string(), json!(description)),
                        None => (o.clone(), Value::Null),
                    })
                    .collect();
                question["criteria"] = Value::Object(options);
            }
            "score" => question["criteria"] = json!(rest),
            _ => {}
        }
        if questions.insert(id.clone(), question).is_some() {
            return Err(AskError::DuplicateId(id));
        }
    }
    if questions.is_empty() {
        return Err(AskError::NoQuestion);
    }
    Ok(json!({
        "model": args.model.clone().unwrap_or_else(|| crate::reader::DEFAULT_ALIAS.to_string()),
        "state": args.state.clone().unwrap_or_default(),
        "questions": questions,
    }))
}

fn body_from_file(path: &str, model: Option<&str>) -> Result<Value, AskError> {
    let fail = |message: String| AskError::Body {
        path: path.to_string(),
        message,
    };
    let text = if path == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| fail(e.to_string()))?;
        s
    } else {
        std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?
    };
    let mut body: Value =
        serde_json::from_str(&text).map_err(|e| fail(format!("not JSON: {e}")))?;
    let Some(object) = body.as_object_mut() else {
        return Err(fail("not a JSON object".into()));
    };
    match model {
        Some(m) => {
            object.insert("model".into(), json!(m));
        }
        None => {
            object
                .entry("model")
                .or_insert_with(|| json!(crate::reader::DEFAULT_ALIAS));
        }
    }
    Ok(body)
}

async fn ask(args: &AskArgs, matches: &ArgMatches) -> Result<(Value, Value), AskError> {
    let body = match &args.body {
        Some(path) => body_from_file(path, args.model.as_deref())?,
        None => body_from_flags(args, matches)?,
    };
    if args.server.is_none() && args.load.is_empty() {
        return Err(AskError::NoTarget);
    }
    let target = Target::start(&TargetArgs {
        server: args.server.clone(),
        api_key: args.api_key.clone(),
        models: args.load.clone(),
        ..TargetArgs::default()
    })
    .await?;
    let sender = Sender::new(
        &target.url,
        target.api_key.clone(),
        RetryPolicy {
            retries: 2,
            ..RetryPolicy::default()
        },
        Duration::from_secs(300),
    )
    .map_err(AskError::Client)?;
    let (_never, mut stop) = tokio::sync::watch::channel(false);
    let outcome = sender.send("/v1/systemone", &body, &mut stop).await;
    target.shutdown().await;
    match outcome {
        Outcome::Response {
            status: 200..=299,
            body: response,
            ..
        } => Ok((body, response)),
        Outcome::Response {
            status,
            body: response,
            ..
        } => {
            if args.json {
                println!("{response:#}");
            }
            Err(AskError::Refused(render::error_summary(status, &response)))
        }
        Outcome::Transport(message) => Err(AskError::Transport(message)),
        Outcome::Interrupted => Err(AskError::Transport("interrupted".into())),
    }
}

pub async fn run(args: AskArgs, matches: ArgMatches) -> ExitCode {
    match ask(&args, &matches).await {
        Ok((request, response)) => {
            if args.json {
                println!("{response:#}");
            } else {
                print!("{}", render::response_table(&request, &response));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hunch ask: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        ask: AskArgs,
    }

    fn parse(argv: &[&str]) -> Value {
        let matches = Wrap::command().get_matches_from(argv);
        let wrap = Wrap::from_arg_matches(&matches).unwrap();
        body_from_flags(&wrap.ask, &matches).unwrap()
    }

    #[test]
    fn flags_become_questions_in_command_line_order() {
        let body = parse(&[
            "ask",
            "--state",
            "hello",
            "--score",
            "How angry?",
            "calm",
            "furious",
            "--noul",
            "urgent=Is this urgent?",
            "--choice",
            "Team?",
            "billing=Payments",
            "technical",
            "--noul",
            "Polite?",
        ]);
        assert_eq!(
            body,
            json!({
                "model": "jev-latest",
                "state": "hello",
                "questions": {
                    "q1": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "furious"]},
                    "urgent": {"type": "noul", "instructions": "Is this urgent?"},
                    "q3": {"type": "choice", "instructions": "Team?",
                           "criteria": {"billing": "Payments", "technical": null}},
                    "q4": {"type": "noul", "instructions": "Polite?"}
                }
            })
        );
    }

    #[test]
    fn a_question_with_an_equals_sign_in_its_text_is_not_an_id() {
        assert_eq!(split_id("Is 1+1=2?"), (None, "Is 1+1=2?"));
        assert_eq!(split_id("a.b=Why?"), (Some("a.b"), "Why?"));
        // Any text without whitespace is an id, as docs/cli.md says.
        assert_eq!(
            split_id("urgent?=Is this urgent?"),
            (Some("urgent?"), "Is this urgent?")
        );
        assert_eq!(split_id("q1=2+2=4?"), (Some("q1"), "2+2=4?"));
        assert_eq!(split_id("=Why?"), (None, "=Why?"));
        assert_eq!(split_id("a\tb=Why?"), (None, "a\tb=Why?"));
    }
}
