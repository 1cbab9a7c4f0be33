//! The host's modules import each other one way only (docs/architecture.md):
//!
//! ```text
//! cli → server → config → api → {policy, reader} → calibration → decision → {metrics, http_url, quality} → hunch-core
//! ```
//!
//! This test reads every source file of `host/src`, collects the `crate::MODULE` paths it names
//! outside its unit tests, and fails on an import that runs back up (or sideways between
//! `policy` and `reader`), which is also what makes a cycle impossible. A new top-level module
//! must be given its layer here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules by layer, top first. Modules of one layer may not import each other.
const LAYERS: &[&[&str]] = &[
    &["cli"],
    &["server"],
    &["config"],
    &["api"],
    &["policy", "reader"],
    &["calibration"],
    &["decision"],
    &["metrics", "http_url", "quality"],
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's text without its `#[cfg(test)]` module (tests may reach anywhere) and without
/// line comments (docs may name any module).
fn code_of(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    code.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `code` names as `crate::NAME`, including inside `use crate::{a, b}`.
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        // `hunch_core::` and other crates' paths end in `_core::` etc., not `crate::` preceded by
        // an identifier character.
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name = ident(part.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn host_modules_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut unknown = BTreeSet::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let top = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_string())
            .expect("a file name");
        if top == "lib" || top == "main" {
            continue;
        }
        if rank(&top).is_none() {
            unknown.insert(top.clone());
        }
        let text = std::fs::read_to_string(file).expect("readable source");
        for target in named_modules(&code_of(&text)) {
            if target != top && rank(&target).is_some() {
                edges
                    .entry((top.clone(), target))
                    .or_default()
                    .push(relative.display().to_string());
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "top-level modules without a layer in this test: {unknown:?}"
    );
    let wrong: Vec<String> = edges
        .iter()
        .filter(|((from, to), _)| rank(from) >= rank(to))
        .map(|((from, to), files)| format!("{from} -> {to} (in {})", files.join(", ")))
        .collect();
    assert!(
        wrong.is_empty(),
        "imports that run back up or sideways:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn the_scanner_sees_grouped_and_inline_paths() {
    let code =
        "use crate::{api::x, policy};\nfn f() { crate::decision::g(); hunch_core::crate_like(); }";
    let names = named_modules(code);
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["api", "decision", "policy"]
    );
    assert!(
        code_of("use crate::a;\n#[cfg(test)]\nmod tests { use crate::b; }").contains("crate::a")
    );
    assert!(
        !code_of("use crate::a;\n#[cfg(test)]\nmod tests { use crate::b; }").contains("crate::b")
    );
    assert!(!code_of("// see crate::cli\n").contains("crate::cli"));
}
