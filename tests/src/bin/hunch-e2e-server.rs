//! The `hunch` command line, built inside the e2e package so `cargo test -p hunch-e2e` always
//! runs a fresh one (cargo does not build another package's binaries for a test). Identical to
//! `host/src/main.rs`.
fn main() -> std::process::ExitCode {
    hunch::cli::main()
}
