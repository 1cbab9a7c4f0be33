//! The `hunch` command, callable from any binary (the e2e tests build a copy of it).

pub mod ask;
pub mod batch;
pub mod bundle;
pub mod calibrate;
pub mod policy_run;
pub mod render;
pub mod replay;
pub mod target;

use crate::config::Settings;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "hunch",
    version,
    about = "Fast, typed, calibrated System One decisions"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the System One API.
    Serve(crate::config::ServeArgs),
    /// Print the JSON Schema requests are validated against.
    Schema,
    /// Print the OpenAPI document.
    Openapi,
    /// Replay recorded policy decisions from decision logs through a component (reads answered
    /// from the log) and report what changed; `--reread --server URL` re-asks recorded reads.
    Replay(replay::ReplayArgs),
    /// Answer a JSONL file of requests (OpenAI's batch format), resumably.
    Batch(batch::BatchArgs),
    /// Fit a calibration per question from decision logs and labels, and report it before and
    /// after on held-out folds.
    Calibrate(calibrate::CalibrateArgs),
    /// Ask one System One question set from the shell and print the answers.
    Ask(ask::AskArgs),
    /// Decision policies: `new` scaffolds a crate, `run` runs one locally, `check` validates one.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Policy bundles for a fleet: `build` packs and signs a policy directory, `keygen` makes a
    /// signing key pair, `inspect` checks a bundle (docs/deploy.md).
    Bundle {
        #[command(subcommand)]
        command: bundle::BundleCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Write a policy crate (Cargo.toml + src/lib.rs) that builds and tests as it is.
    New {
        /// The policy's name (`[a-z0-9][a-z0-9_-]*`): the crate, the file and the URL segment.
        name: String,
        /// Where to create the crate's folder (default: the repository's policies workspace).
        #[arg(long, default_value = "policies")]
        dir: PathBuf,
        /// How the crate depends on the SDK, as a Cargo dependency spec. The default suits a crate
        /// inside `policies/`; elsewhere use e.g. `{ path = "/path/to/hunch/guest-sdk" }`.
        #[arg(long, default_value = "{ workspace = true }")]
        sdk: String,
    },
    /// Run a policy component in this process on one input, its reads sent to a server or a
    /// local model; print the decision, its reads, logs and limits.
    Run(policy_run::RunArgs),
    /// Validate a policy component as the server would before serving it, without deciding.
    Check(policy_run::CheckArgs),
}

/// Runs the command line and returns the process' exit code.
pub fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Schema => {
            println!("{}", crate::api::validate::REQUEST_SCHEMA);
            ExitCode::SUCCESS
        }
        Command::Openapi => {
            println!("{:#}", crate::api::openapi::document());
            ExitCode::SUCCESS
        }
        Command::Policy {
            command: PolicyCommand::New { name, dir, sdk },
        } => match crate::policy::scaffold::new_policy(&dir, &name, &sdk) {
            Ok(root) => {
                println!("created {}", root.display());
                println!(
                    "inside policies/: add \"{name}\" to `members` in policies/Cargo.toml, then\n  \
                     cargo test --manifest-path policies/Cargo.toml -p {name}\n  \
                     cargo build --manifest-path policies/Cargo.toml --target wasm32-wasip2 --release"
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("hunch: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Replay(args) => {
            // Which name its key was given under (`--api-key` or the old `--key`), and from
            // which source, only the matches know.
            let replay_matches = matches
                .subcommand_matches("replay")
                .cloned()
                .unwrap_or_default();
            replay::main(args, &replay_matches)
        }
        Command::Bundle { command } => bundle::main(command),
        Command::Calibrate(args) => calibrate::main(args),
        Command::Batch(args) => client_runtime(|| batch::run(args)),
        Command::Ask(args) => {
            // `ask` numbers its questions in command-line order, which only the matches know.
            let ask_matches = matches
                .subcommand_matches("ask")
                .cloned()
                .unwrap_or_default();
            client_runtime(|| ask::run(args, ask_matches))
        }
        Command::Policy {
            command: PolicyCommand::Run(args),
        } => client_runtime(|| policy_run::run(args)),
        Command::Policy {
            command: PolicyCommand::Check(args),
        } => client_runtime(|| policy_run::check(args)),
        Command::Serve(args) => {
            init_tracing();
            let settings = match Settings::resolve(&args, &|name| std::env::var(name).ok()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("hunch: {e}");
                    return ExitCode::from(2);
                }
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("hunch: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(crate::server::serve(settings)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("hunch: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Logs to stderr; `RUST_LOG` filters (default `info`).
fn init_tracing() {
    init_tracing_at("info");
}

/// Logs to stderr; `RUST_LOG` filters (default `default`).
fn init_tracing_at(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs a client command (`batch`, `ask`, `policy run`) on a fresh async runtime. Its logs (and
/// those of a server it runs in-process) default to warnings: the command's output is the point.
fn client_runtime<F: std::future::Future<Output = ExitCode>>(
    command: impl FnOnce() -> F,
) -> ExitCode {
    init_tracing_at("warn");
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(command()),
        Err(e) => {
            eprintln!("hunch: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_has_a_variable_and_a_key_and_its_help_names_both() {
        let command = Cli::command();
        let serve = command
            .find_subcommand("serve")
            .expect("a serve subcommand");
        for arg in serve.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "config" {
                continue;
            }
            let flag = format!("--{long}");
            let (_, env, key) = crate::config::SETTINGS
                .iter()
                .chain(crate::config::decision_log::SETTINGS)
                .find(|(f, _, _)| *f == flag)
                .unwrap_or_else(|| panic!("{flag} is missing from SETTINGS"));
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default()
                + &arg
                    .get_long_help()
                    .map(|h| h.to_string())
                    .unwrap_or_default();
            assert!(help.contains(env), "--help of {flag} does not name {env}");
            assert!(
                help.contains(&format!("`{key}`")),
                "--help of {flag} does not name `{key}`"
            );
        }
    }
}
