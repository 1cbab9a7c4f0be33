//! `hunch`: see `hunch --help` and docs/api.md.
fn main() -> std::process::ExitCode {
    hunch::cli::main()
}
