//! The README's commands, run as written, so that one that no longer works fails CI.
//!
//! Every shell block (```` ```sh ````, `bash`, `shell`) of `README.md` and `docs/cli.md` runs in
//! `bash -eo pipefail`, in document order, against real processes:
//!
//! - `hunch` and `hunch-accelerator` are found on PATH, as the README tells a user to put them
//!   there (`export PATH="$PWD/target/release:$PATH"`), except that the directory is this
//!   build's own (`target/debug`, which `cargo test --workspace` in scripts/test.sh builds; run
//!   alone, `cargo build -p hunch -p hunch-accelerator` first).
//! - The server of the quick start (`scripts/serve.sh`: a release build, then `hunch serve`
//!   until stopped) is started by the test as `hunch serve`, the default model, on
//!   `127.0.0.1:8080` — before the first block that talks to it. When 8080 is taken, it listens
//!   elsewhere and the blocks' `127.0.0.1:8080` / `localhost:8080` are rewritten, saying so.
//! - The working directory is a scratch directory whose top-level entries are links to the
//!   repository's, so relative paths (`scripts/…`, `examples/…`) resolve and what the commands
//!   write (`answers.jsonl`, `report/`) stays out of the checkout.
//!
//! A block is marked by an HTML comment on the line before it: `<!-- readme-test: skip: WHY -->`
//! skips it (a GPU, a real checkpoint, a command that serves until stopped) and the test lists
//! it with WHY; `<!-- readme-test: python -->` runs it with `.venv/bin` (scripts/python-env.sh,
//! the official SDK) first on PATH. A block fails when it exits non-zero, runs past
//! [`BLOCK_TIMEOUT`], or exits 0 over a refusal it printed ([`refusal`]: an API error, or a
//! `hunch batch` summary with 4xx/5xx answers). The test prints the blocks it ran and skipped.

use hunch_e2e::{missing_prerequisite, skip_listed, start_process, target_dir, workspace_root};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The files whose shell blocks are run.
const FILES: &[&str] = &["README.md", "docs/cli.md"];
/// The address the README's commands use.
const README_ADDR: &str = "127.0.0.1:8080";
const BLOCK_TIMEOUT: Duration = Duration::from_secs(300);
/// The default model loads in seconds; a loaded 2-core machine gets more.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// What the comment before a block asks.
#[derive(Debug, Clone, PartialEq)]
enum Mark {
    Run,
    Python,
    Skip(String),
}

#[derive(Debug)]
struct Block {
    /// `README.md:31`: the file and the line of the opening fence.
    at: String,
    text: String,
    mark: Mark,
}

impl Block {
    fn first_line(&self) -> &str {
        self.text
            .lines()
            .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .unwrap_or("")
    }

    fn needs_server(&self) -> bool {
        self.text.contains(":8080")
    }
}

/// The marks a block may carry; anything else after `readme-test:` is a mistake in the docs.
fn parse_mark(line: &str, at: &str) -> Mark {
    let Some(rest) = line
        .trim()
        .strip_prefix("<!--")
        .and_then(|l| l.strip_suffix("-->"))
        .map(str::trim)
        .and_then(|l| l.strip_prefix("readme-test:"))
        .map(str::trim)
    else {
        return Mark::Run;
    };
    if rest == "python" {
        return Mark::Python;
    }
    match rest.strip_prefix("skip:") {
        Some(why) if !why.trim().is_empty() => Mark::Skip(why.trim().to_string()),
        _ => panic!("{at}: a readme-test mark is `skip: WHY` or `python`, not {rest:?}"),
    }
}

/// The shell blocks of one markdown file, each with the mark on the line before it.
fn shell_blocks(name: &str, markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = markdown.lines().enumerate();
    let mut previous = "";
    while let Some((n, line)) = lines.next() {
        let Some(lang) = line.trim_start().strip_prefix("```") else {
            if !line.trim().is_empty() {
                previous = line;
            }
            continue;
        };
        let at = format!("{name}:{}", n + 1);
        let mut text = String::new();
        for (_, inner) in lines.by_ref() {
            if inner.trim_start().starts_with("```") {
                break;
            }
            text.push_str(inner);
            text.push('\n');
        }
        if matches!(lang.trim(), "sh" | "bash" | "shell") {
            let mark = parse_mark(previous, &at);
            blocks.push(Block { at, text, mark });
        } else {
            assert!(
                parse_mark(previous, &at) == Mark::Run,
                "{at}: a readme-test mark before a block that is not a shell block"
            );
        }
        previous = "";
    }
    blocks
}

/// A directory whose entries link to the repository's top-level entries.
fn scratch_checkout(root: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a scratch directory");
    for entry in std::fs::read_dir(root).expect("read the repository root") {
        let entry = entry.expect("a directory entry");
        if entry.file_name() == ".git" {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), dir.path().join(entry.file_name()))
            .expect("link a top-level entry");
    }
    dir
}

/// The address the test's server listens on: the README's when it is free.
fn server_addr() -> String {
    match std::net::TcpListener::bind(README_ADDR) {
        Ok(listener) => {
            drop(listener);
            README_ADDR.to_string()
        }
        Err(_) => "127.0.0.1:0".to_string(),
    }
}

/// Runs `script` in bash; its exit status and what it printed, or `None` past the timeout.
fn run_block(script: &str, cwd: &Path, path: &str) -> Option<(bool, String)> {
    let out = tempfile::NamedTempFile::new().expect("an output file");
    let mut child = Command::new("bash")
        .args(["-eo", "pipefail", "-c", script])
        .current_dir(cwd)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(out.reopen().expect("reopen the output file"))
        .stderr(out.reopen().expect("reopen the output file"))
        .spawn()
        .expect("bash runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for bash") {
            break Some(status);
        }
        if started.elapsed() > BLOCK_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let printed = std::fs::read_to_string(out.path()).unwrap_or_default();
    status.map(|s| (s.success(), printed))
}

#[test]
fn the_readme_commands_run_as_written() {
    let root = workspace_root();
    let bin = target_dir();
    for name in ["hunch", "hunch-accelerator"] {
        assert!(
            bin.join(name).is_file(),
            "{} is missing: run `cargo build -p hunch -p hunch-accelerator` first",
            bin.join(name).display()
        );
    }
    let blocks: Vec<Block> = FILES
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(root.join(file)).expect("read the markdown");
            shell_blocks(file, &text)
        })
        .collect();

    let models = std::env::var_os("HUNCH_MODELS_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hunch/models")));
    let have_model = models
        .as_ref()
        .is_some_and(|m| m.join(DEFAULT_MODEL_FILE).is_file());
    if !have_model {
        missing_prerequisite(
            "smollm2",
            "the default model",
            "run scripts/fetch-default-model.sh",
        );
    }
    let venv = root.join(".venv/bin");
    if !venv.join("python3").exists() {
        missing_prerequisite("python", "the .venv of scripts/python-env.sh", "run it");
    }

    let scratch = scratch_checkout(&root);
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let python_path = format!("{}:{path}", venv.display());
    let mut server: Option<(String, hunch_e2e::Process)> = None;
    let mut ran = Vec::new();
    let mut skipped = Vec::new();
    let mut failed = Vec::new();
    for block in &blocks {
        let summary = format!("{} `{}`", block.at, block.first_line());
        let why_not = match &block.mark {
            Mark::Skip(why) => Some(why.clone()),
            _ if block.needs_server() && !have_model => {
                Some("no default model (HUNCH_TEST_SKIP lists smollm2)".into())
            }
            Mark::Python if !venv.join("python3").exists() && skip_listed("python") => {
                Some("no .venv (HUNCH_TEST_SKIP lists python)".into())
            }
            _ => None,
        };
        if let Some(why) = why_not {
            eprintln!("readme: SKIPPED {summary}: {why}");
            skipped.push(format!("{summary}: {why}"));
            continue;
        }
        let mut script = block.text.clone();
        if block.needs_server() {
            let (addr, _) = server.get_or_insert_with(|| {
                let listen = server_addr();
                let (url, process) = start_process(
                    &bin.join("hunch"),
                    &["serve".into(), "--listen".into(), listen],
                    &[],
                    "HUNCH_LISTENING ",
                );
                let addr = url.trim_start_matches("http://").to_string();
                wait_ready(&url, &process);
                eprintln!("readme: `hunch serve` (the default model) on {addr}");
                (addr, process)
            });
            if addr != README_ADDR {
                eprintln!(
                    "readme: {README_ADDR} is taken: {} runs against {addr}",
                    block.at
                );
                script = script
                    .replace(README_ADDR, addr)
                    .replace("localhost:8080", addr);
            }
        }
        let started = Instant::now();
        let on_path = if block.mark == Mark::Python {
            &python_path
        } else {
            &path
        };
        let outcome = run_block(&script, scratch.path(), on_path);
        let took = started.elapsed().as_secs_f64();
        match outcome {
            Some((true, printed)) if refusal(&printed).is_none() => {
                eprintln!("readme: ran {summary} ({took:.1} s)");
                ran.push(format!("{summary} ({took:.1} s)"));
            }
            Some((ok, printed)) => {
                let why = if ok {
                    refusal(&printed).unwrap_or_default()
                } else {
                    "exited non-zero"
                };
                eprintln!("readme: FAILED {summary} ({why}):\n{printed}");
                failed.push(format!("{summary}: {why}"));
            }
            None => {
                eprintln!("readme: FAILED {summary}: still running after {BLOCK_TIMEOUT:?}");
                failed.push(format!("{summary}: timed out"));
            }
        }
    }
    eprintln!("readme: ran {} blocks:", ran.len());
    for line in &ran {
        eprintln!("  ran      {line}");
    }
    eprintln!("readme: skipped {} blocks:", skipped.len());
    for line in &skipped {
        eprintln!("  skipped  {line}");
    }
    if let Some((_, process)) = &server {
        if !failed.is_empty() {
            eprintln!("readme: the server's log:\n{}", process.logs());
        }
    }
    assert!(failed.is_empty(), "README blocks failed: {failed:#?}");
    assert!(!ran.is_empty(), "no README block ran");
}

/// Why a block that exited 0 still failed: curl exits 0 on a 4xx, and `hunch batch` exits 0
/// when every line has a response, a 404 for a policy that is not served included.
fn refusal(printed: &str) -> Option<&'static str> {
    if printed.contains("\"error_type\"") {
        return Some("printed an API error");
    }
    let refused = printed.lines().any(|line| {
        line.split([',', ':', ';']).any(|part| {
            let words: Vec<_> = part.split_whitespace().collect();
            match words[..] {
                [n, "×", "4xx" | "5xx"] => n.parse::<u64>().is_ok_and(|n| n > 0),
                _ => false,
            }
        })
    });
    refused.then_some("hunch batch got 4xx or 5xx answers")
}

/// Polls `/readyz` until the server can take reads; fails with its log.
fn wait_ready(url: &str, process: &hunch_e2e::Process) {
    let started = Instant::now();
    while started.elapsed() < READY_TIMEOUT {
        let ready = Command::new("curl")
            .args(["-fsS", "-o", "/dev/null", &format!("{url}/readyz")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ready {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!(
        "{url} was not ready within {READY_TIMEOUT:?}:\n{}",
        process.logs()
    );
}

#[test]
fn every_doc_is_named_in_the_readme() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read the README");
    for entry in std::fs::read_dir(root.join("docs")).expect("read docs/") {
        let name = entry.expect("a directory entry").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".md") {
            assert!(
                readme.contains(&format!("`{name}`")),
                "docs/{name} is not in the README's list of docs"
            );
        }
    }
}

#[test]
fn a_batch_summary_with_refused_lines_is_a_failure() {
    let summary = "  this run: 2 sent in 9.1 s: 1 × 2xx, 1 × 4xx, 0 × 5xx; 1 reads";
    assert!(refusal(summary).is_some());
    let fine = "  this run: 2 sent in 9.1 s: 2 × 2xx, 0 × 4xx, 0 × 5xx; 2 reads";
    assert_eq!(refusal(fine), None);
    assert!(refusal(r#"{"detail": {"error_type": "not_found"}}"#).is_some());
}

#[test]
fn marks_are_read_from_the_line_before_a_block() {
    let blocks = shell_blocks(
        "x.md",
        "text\n\n<!-- readme-test: skip: needs a GPU -->\n```sh\ngpu\n```\n```json\n{}\n```\n\
         <!-- readme-test: python -->\n```sh\npython3 -\n```\n```bash\n# a comment\nhunch ask\n```\n",
    );
    let marks: Vec<_> = blocks.iter().map(|b| (b.at.as_str(), &b.mark)).collect();
    assert_eq!(
        marks,
        vec![
            ("x.md:4", &Mark::Skip("needs a GPU".into())),
            ("x.md:11", &Mark::Python),
            ("x.md:14", &Mark::Run),
        ]
    );
    assert_eq!(blocks[2].first_line(), "hunch ask");
}
