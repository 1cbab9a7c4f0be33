//! Test support for the policy runtime (tests and the benchmark; behind the `testing` feature, so
//! never in the server): a reader that answers at once, uniformly or from a script, and the
//! example policies built for `wasm32-wasip2`.

use hunch_core::{LabelDistribution, ReadError, ReadOutcome, ReadRequest, Reader, Usage};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

type Script = dyn Fn(&ReadRequest, usize) -> Vec<f64> + Send + Sync;

/// Answers every question instantly.
pub struct InstantReader {
    script: Option<Box<Script>>,
    /// Reads served, for assertions.
    pub reads: AtomicU64,
}

impl InstantReader {
    /// Uniform distributions.
    pub fn uniform() -> Self {
        InstantReader {
            script: None,
            reads: AtomicU64::new(0),
        }
    }

    /// `script(request, question_index)` → the distribution.
    pub fn scripted(
        script: impl Fn(&ReadRequest, usize) -> Vec<f64> + Send + Sync + 'static,
    ) -> Self {
        InstantReader {
            script: Some(Box::new(script)),
            reads: AtomicU64::new(0),
        }
    }
}

#[async_trait::async_trait]
impl Reader for InstantReader {
    fn model_name(&self) -> &str {
        "instant"
    }

    fn info(&self) -> hunch_core::ReaderInfo {
        hunch_core::ReaderInfo::unknown()
    }

    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let distributions = request
            .questions
            .iter()
            .enumerate()
            .map(|(i, q)| match &self.script {
                Some(s) => LabelDistribution(s(&request, i)),
                None => {
                    let n = q.label_count().max(1);
                    LabelDistribution(vec![1.0 / n as f64; n])
                }
            })
            .collect();
        Ok(ReadOutcome {
            distributions,
            usage: Usage {
                input_tokens: request.state.len() as u64 / 4 + 1,
                output_tokens: request.questions.len() as u64,
            },
            stats: Default::default(),
        })
    }
}

/// Why the example policies could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PolicyBuildError {
    #[error("cannot run cargo to build the policies: {0}")]
    Cargo(String),
    #[error(
        "building the policies for wasm32-wasip2 failed ({0}); the target is installed with \
         `rustup target add wasm32-wasip2`"
    )]
    Build(String),
    #[error("cannot read the built policy {path}: {message}")]
    Read { path: PathBuf, message: String },
}

/// Builds the policies workspace (`policies/Cargo.toml`) for `wasm32-wasip2` once per process
/// and returns the directory holding the `.wasm` files (`example_policy("invoice_vat")`…).
///
/// Cargo's own lock and incremental build make concurrent and repeated calls cheap. Set
/// `HUNCH_POLICY_WASM_DIR` to use prebuilt files instead (CI builds them in a separate step).
pub fn built_policies_dir() -> Result<PathBuf, PolicyBuildError> {
    use std::sync::OnceLock;
    static DIR: OnceLock<Result<PathBuf, PolicyBuildError>> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("HUNCH_POLICY_WASM_DIR") {
            return Ok(dir.into());
        }
        // The repository this test build was compiled from.
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap_or(Path::new(env!("CARGO_MANIFEST_DIR")))
            .to_path_buf();
        let target_dir = root.join("policies").join("target");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = std::process::Command::new(cargo)
            .arg("build")
            .arg("--manifest-path")
            .arg(root.join("policies").join("Cargo.toml"))
            .args(["--target", "wasm32-wasip2", "--release", "--quiet"])
            .arg("--target-dir")
            .arg(&target_dir)
            // The outer build's flags are for the host target, not for wasm guests.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .status()
            .map_err(|e| PolicyBuildError::Cargo(e.to_string()))?;
        if !status.success() {
            return Err(PolicyBuildError::Build(status.to_string()));
        }
        Ok(target_dir.join("wasm32-wasip2").join("release"))
    })
    .clone()
}

/// The bytes of a built policy (`name` as cargo names the file: `invoice_vat`, `hostile`…).
pub fn built_policy(name: &str) -> Result<Vec<u8>, PolicyBuildError> {
    let path = built_policies_dir()?.join(format!("{name}.wasm"));
    std::fs::read(&path).map_err(|e| PolicyBuildError::Read {
        message: e.to_string(),
        path,
    })
}

/// Appends a custom section to a component: a different content hash (a new version) with the
/// same behaviour — how the hot-reload tests and the benchmark make "a new version".
pub fn with_marker(mut wasm: Vec<u8>, marker: &str) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"hunch-marker";
    let mut payload = Vec::new();
    leb(name.len(), &mut payload);
    payload.extend_from_slice(name);
    payload.extend_from_slice(marker.as_bytes());
    wasm.push(0); // custom section id
    leb(payload.len(), &mut wasm);
    wasm.extend_from_slice(&payload);
    wasm
}

/// `name` built (see [`built_policy`]) and marked as a version no compile cache can hold yet: the
/// marker is `prefix` and the current time in nanoseconds, so a test that deploys it measures a
/// real compile.
pub fn fresh_version(name: &str, prefix: &str) -> Result<Vec<u8>, PolicyBuildError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    Ok(with_marker(
        built_policy(name)?,
        &format!("{prefix}-{nanos}"),
    ))
}
