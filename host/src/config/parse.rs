//! The textual forms of settings shared by flags and environment variables: `[NAME=]PATH`,
//! `[NAME=]URL`, `NAME=[MODEL@]URL`, `ALIAS=MODEL` and on/off switches.

use super::model_path::model_name_of_path;
use super::ConfigError;
use std::path::{Path, PathBuf};

/// `NAME=PATH` or `PATH`, a checkpoint directory or a `.gguf` file (without a name, the model is
/// named after the path: [`model_name_of_path`]).
pub fn parse_model_arg(arg: &str) -> (String, PathBuf) {
    match arg.split_once('=') {
        Some((name, path)) if !name.is_empty() && !name.contains('/') => {
            (name.to_string(), PathBuf::from(path))
        }
        _ => (model_name_of_path(Path::new(arg)), PathBuf::from(arg)),
    }
}

/// `[NAME=]URL`: a name only when what precedes `=` is not part of the URL.
pub fn split_named_url(arg: &str) -> (Option<String>, String) {
    match arg.split_once('=') {
        Some((name, url)) if !name.contains("://") && !name.is_empty() => {
            (Some(name.to_string()), url.to_string())
        }
        _ => (None, arg.to_string()),
    }
}

/// `NAME=URL` or `NAME=MODEL@URL` (the upstream's model name defaults to NAME): the name, the
/// model sent upstream and the URL.
pub fn parse_upstream_arg(arg: &str) -> Result<(String, String, String), ConfigError> {
    let (name, rest) = arg
        .split_once('=')
        .filter(|(n, r)| !n.is_empty() && !r.is_empty())
        .ok_or_else(|| {
            ConfigError::Invalid(format!(
                "--upstream wants NAME=URL or NAME=MODEL@URL, got {arg:?}"
            ))
        })?;
    let (model, url) = match rest.split_once('@') {
        Some((model, url)) if !url.contains('@') && !model.contains("://") => {
            (model.to_string(), url.to_string())
        }
        _ => (name.to_string(), rest.to_string()),
    };
    crate::http_url::check("--upstream", &url).map_err(|e| ConfigError::Invalid(e.to_string()))?;
    Ok((name.to_string(), model, url))
}

/// `ALIAS=MODEL`.
pub fn parse_alias_arg(arg: &str) -> Result<(String, String), ConfigError> {
    arg.split_once('=')
        .filter(|(a, t)| !a.is_empty() && !t.is_empty())
        .map(|(a, t)| (a.to_string(), t.to_string()))
        .ok_or_else(|| ConfigError::Invalid(format!("--alias wants ALIAS=MODEL, got {arg:?}")))
}

/// A switch as people write it in an environment variable.
pub fn parse_bool(value: &str) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(ConfigError::Invalid(format!(
            "{value:?} is not a switch (use true or false)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_args_name_or_path() {
        assert_eq!(
            parse_model_arg("jev=/models/dg"),
            ("jev".to_string(), PathBuf::from("/models/dg"))
        );
        assert_eq!(
            parse_model_arg("/models/diffusiongemma-1b/"),
            (
                "diffusiongemma-1b".to_string(),
                PathBuf::from("/models/diffusiongemma-1b/")
            )
        );
        assert_eq!(
            parse_model_arg("gemma=/m/gemma-3-4b-it-Q4_0.gguf"),
            (
                "gemma".to_string(),
                PathBuf::from("/m/gemma-3-4b-it-Q4_0.gguf")
            )
        );
        assert_eq!(
            parse_model_arg("/m/gemma-3-4b-it-Q4_0.gguf"),
            (
                "gemma-3-4b-it-q4_0".to_string(),
                PathBuf::from("/m/gemma-3-4b-it-Q4_0.gguf")
            )
        );
    }

    #[test]
    fn upstream_args() {
        assert_eq!(
            parse_upstream_arg("up=http://h:1").unwrap(),
            ("up".into(), "up".into(), "http://h:1".into())
        );
        assert_eq!(
            parse_upstream_arg("up=jev-latest@http://h:1").unwrap(),
            ("up".into(), "jev-latest".into(), "http://h:1".into())
        );
        assert!(parse_upstream_arg("nourl").is_err());
        assert!(parse_upstream_arg("a=ftp://x").is_err());
    }

    #[test]
    fn accelerator_urls_keep_their_equals_signs() {
        assert_eq!(
            split_named_url("http://h:1/?a=b"),
            (None, "http://h:1/?a=b".to_string())
        );
        assert_eq!(
            split_named_url("x=http://h:1"),
            (Some("x".to_string()), "http://h:1".to_string())
        );
    }

    #[test]
    fn switches() {
        assert!(parse_bool("Yes").unwrap());
        assert!(!parse_bool("0").unwrap());
        assert!(parse_bool("maybe").is_err());
    }
}
