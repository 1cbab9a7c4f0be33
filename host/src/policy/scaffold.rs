//! `hunch policy new NAME`: writes a policy crate that builds as it is — one `src/lib.rs` with a
//! working `Policy`, a unit test against the scripted host, and a `Cargo.toml` wired to the SDK.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    #[error("invalid policy name `{0}`: use 1-64 of a-z, 0-9, '-', '_'")]
    InvalidName(String),
    #[error("{0} already exists")]
    Exists(PathBuf),
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Creates `parent/NAME/` with `Cargo.toml` and `src/lib.rs`. `sdk` is how the crate depends on
/// the SDK: e.g. `{ path = "../../guest-sdk" }` or `{ workspace = true }` inside `policies/`.
pub fn new_policy(parent: &Path, name: &str, sdk: &str) -> Result<PathBuf, ScaffoldError> {
    if !crate::policy::registry::valid_name(name) {
        return Err(ScaffoldError::InvalidName(name.to_string()));
    }
    let root = parent.join(name);
    if root.exists() {
        return Err(ScaffoldError::Exists(root));
    }
    let type_name: String = name
        .split(['-', '_'])
        .filter(|s| !s.is_empty())
        .map(|s| {
            let mut c = s.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect();
    let type_name = if type_name.starts_with(|c: char| c.is_ascii_digit()) {
        format!("P{type_name}")
    } else {
        type_name
    };
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ScaffoldError::Io { path, source }
    };
    let src = root.join("src");
    std::fs::create_dir_all(&src).map_err(io(&src))?;
    let cargo = CARGO_TEMPLATE.replace("{name}", name).replace("{sdk}", sdk);
    std::fs::write(root.join("Cargo.toml"), cargo).map_err(io(&root.join("Cargo.toml")))?;
    let lib = LIB_TEMPLATE
        .replace("{name}", name)
        .replace("{Type}", &type_name);
    std::fs::write(src.join("lib.rs"), lib).map_err(io(&src.join("lib.rs")))?;
    Ok(root)
}

const CARGO_TEMPLATE: &str = r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"

# Test:   cargo test
# Build:  cargo build --target wasm32-wasip2 --release, then copy the `.wasm` from
#         target/wasm32-wasip2/release/ into the server's --policies directory as {name}.wasm
#         (or PUT it to /v1/policies/{name}).
[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
hunch-guest-sdk = {sdk}
serde = { version = "1", features = ["derive"] }
serde_json = "1"
"#;

const LIB_TEMPLATE: &str = r#"//! {name}: a Hunch decision policy.

use hunch_guest_sdk::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug, Deserialize, Serialize)]
pub struct Input {
    pub text: String,
}

#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Yes,
    No,
    Unsure,
}

#[derive(Debug, Deserialize, Serialize)]
pub struct Output {
    pub decision: Decision,
    pub p_yes: f64,
}

pub struct {Type};

impl Policy for {Type} {
    type Input = Input;
    type Output = Output;

    fn describe() -> Describe {
        Describe::new("{name}", env!("CARGO_PKG_VERSION"), "Describe what this policy decides.")
            .input_schema(json!({
                "type": "object",
                "required": ["text"],
                "properties": {"text": {"type": "string"}}
            }))
            .output_schema(json!({
                "type": "object",
                "required": ["decision", "p_yes"]
            }))
    }

    fn decide(input: Input, host: &mut dyn Host) -> Result<Output, PolicyError> {
        let answers = host.read(
            &QuestionSet::new(input.text).ask(noul("Does this text ask for something?").id("asks")),
        )?;
        let p = answers.noul("asks")?;
        let decision = match Threshold::new(0.8, 0.2)
            .map_err(|e| PolicyError::Failed(e.to_string()))?
            .decide(p)
        {
            Verdict::Yes => Decision::Yes,
            Verdict::No => Decision::No,
            Verdict::Abstain => Decision::Unsure,
        };
        Ok(Output { decision, p_yes: p.value() })
    }
}

export_policy!({Type});

#[cfg(test)]
mod tests {
    use super::*;
    use hunch_guest_sdk::testing::ScriptedHost;

    #[test]
    fn a_confident_yes_decides_yes() {
        let mut host = ScriptedHost::by_id(&[("asks", &[0.9, 0.1])]);
        let out = {Type}::decide(Input { text: "Please refund me".into() }, &mut host).unwrap();
        assert_eq!(out.decision, Decision::Yes);
    }
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaffolds_a_crate_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let root = new_policy(dir.path(), "refund-check", "{ path = \"../sdk\" }").unwrap();
        let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
        assert!(lib.contains("pub struct RefundCheck;"));
        assert!(lib.contains("export_policy!(RefundCheck);"));
        let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        assert!(cargo.contains("hunch-guest-sdk = { path = \"../sdk\" }"));
        assert!(matches!(
            new_policy(dir.path(), "refund-check", "x"),
            Err(ScaffoldError::Exists(_))
        ));
        assert!(matches!(
            new_policy(dir.path(), "../x", "x"),
            Err(ScaffoldError::InvalidName(_))
        ));
    }
}
