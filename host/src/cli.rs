//! The `hunch` command, callable from any binary (the e2e tests build a copy of it).

pub mod ask;
pub mod batch;
pub mod policy_run;
pub mod render;
pub mod target;

use crate::config::{Cli, Command, PolicyCommand, Settings};
use clap::{CommandFactory, FromArgMatches};
use std::process::ExitCode;

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
        Command::Replay(args) => crate::decision::replay_cli::main(args),
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
