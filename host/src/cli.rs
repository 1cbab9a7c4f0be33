//! The `hunch` command, callable from any binary (the e2e tests build a copy of it).

use crate::config::{Cli, Command, PolicyCommand, Settings};
use clap::Parser;
use std::process::ExitCode;

/// Runs the command line and returns the process' exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}
