//! Per-model settings (docs/models.md, "Per-model settings"): what a model of a models directory
//! is served with, beyond the server's own flags. One file at the root of each `--models-dir`,
//! [`FILE_NAME`], holds a `[models."NAME"]` table per model:
//!
//! ```toml
//! [models."org/qwen3-4b"]
//! aliases = ["qwen"]        # more names for it
//! pinned = true             # loaded at start, never evicted or unloaded by its TTL
//! ttl = "30m"               # idle time before it unloads (else --model-ttl)
//! hidden = false            # left out of GET /v1/models, still served by name
//! dtype = "bfloat16"        # the sidecar's --dtype (auto, float32, bfloat16)
//! sidecar_args = ["--canvas-cap", "32"]
//! questions = "joint"       # isolated or joint, when a request does not say (x_questions)
//! draws = 4                 # noise draws per read, when a request does not say (x_draws)
//! ignore_config_keys = ["some_key"]  # config keys known harmless (the sidecar's
//!                           # --ignore-config-key; docs/models.md, "Configs")
//! chat_template = "chatml"  # a chat model's template where its checkpoint has none
//!                           # (built-in chatml, llama3, gemma, or a Jinja file's path)
//! prior = "divide"          # divide or none, when a request does not say (x_prior)
//! order = "reversed_average" # as_given, reversed_average or cyclic_average (x_order)
//! ```
//!
//! One file per directory rather than one beside each model: a model may be a single `.gguf`
//! file, an `org/name` folder or a Hugging Face cache entry (whose folders belong to the hub's
//! tools), so "beside" has no one meaning; one file is one place to read and review, and the
//! one file `PUT /v1/models/NAME/settings` rewrites (atomically).
//!
//! Both the file's tables and the PUT's JSON body are read by [`ModelSettings::from_fields`],
//! key by key, so an unknown key or a bad value is one error naming the key, whichever way it
//! came. Pure: reading the files is [`read_file`]; the manager applies what it returns.

use hunch_core::{OrderMode, PriorMode, QuestionMode};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The settings file at the root of a models directory.
pub const FILE_NAME: &str = "hunch-models.toml";

/// The most noise draws a read takes (as `x_draws`).
const MAX_DRAWS: u32 = 64;
/// The longest idle TTL (as `x_keep_alive`).
const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// What the sidecar runs with (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    Auto,
    Float32,
    Bfloat16,
}

impl Dtype {
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Auto => "auto",
            Dtype::Float32 => "float32",
            Dtype::Bfloat16 => "bfloat16",
        }
    }
}

/// One model's settings; every field unset means the server's own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelSettings {
    pub aliases: Vec<String>,
    pub pinned: bool,
    pub ttl: Option<Duration>,
    pub hidden: bool,
    pub dtype: Option<Dtype>,
    pub sidecar_args: Vec<String>,
    pub questions: Option<QuestionMode>,
    pub draws: Option<u32>,
    /// Config keys (config.json or GGUF metadata) the user knows do not change the model,
    /// which its load would otherwise refuse as unknown.
    pub ignore_config_keys: Vec<String>,
    /// The chat template a chat model is read with instead of its own (the sidecar's
    /// `--chat-template`: a built-in name or a Jinja file's path).
    pub chat_template: Option<String>,
    pub prior: Option<PriorMode>,
    pub order: Option<OrderMode>,
}

/// A key of a model's settings that could not be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct FieldError {
    pub key: String,
    pub message: String,
}

fn field(key: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        key: key.into(),
        message: message.into(),
    }
}

/// A mode named by a string among `names` (`prior`, `order`).
fn mode<M>(key: &str, value: &Value, names: &[&str]) -> Result<M, FieldError>
where
    M: std::str::FromStr<Err = hunch_core::UnknownMode>,
{
    let expected = || {
        let names: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
        format!("expected {}, got {value}", names.join(" or "))
    };
    value
        .as_str()
        .ok_or_else(|| field(key, expected()))?
        .parse()
        .map_err(|_| field(key, expected()))
}

/// The keys a model's table may hold.
pub const KEYS: [&str; 12] = [
    "aliases",
    "pinned",
    "ttl",
    "hidden",
    "dtype",
    "sidecar_args",
    "questions",
    "draws",
    "ignore_config_keys",
    "chat_template",
    "prior",
    "order",
];

impl ModelSettings {
    /// Reads a model's settings from its keys (a TOML table or a JSON object, as JSON values).
    /// The first unknown key or bad value is the error, named.
    pub fn from_fields(fields: &Map<String, Value>) -> Result<ModelSettings, FieldError> {
        let mut s = ModelSettings::default();
        for (key, value) in fields {
            match key.as_str() {
                "aliases" => s.aliases = strings(key, value)?,
                "pinned" => s.pinned = boolean(key, value)?,
                "hidden" => s.hidden = boolean(key, value)?,
                "ttl" => s.ttl = Some(ttl(value)?),
                "dtype" => {
                    s.dtype = Some(match value.as_str() {
                        Some("auto") => Dtype::Auto,
                        Some("float32") => Dtype::Float32,
                        Some("bfloat16") => Dtype::Bfloat16,
                        _ => {
                            return Err(field(
                                key,
                                format!(
                                    "expected \"auto\", \"float32\" or \"bfloat16\", got {value}"
                                ),
                            ))
                        }
                    })
                }
                "sidecar_args" => s.sidecar_args = strings(key, value)?,
                "ignore_config_keys" => s.ignore_config_keys = strings(key, value)?,
                "chat_template" => {
                    s.chat_template = Some(
                        value
                            .as_str()
                            .filter(|t| !t.is_empty())
                            .ok_or_else(|| {
                                field(key, "expected a built-in template's name or a file's path")
                            })?
                            .to_string(),
                    )
                }
                "questions" => {
                    s.questions = Some(
                        value
                            .as_str()
                            .ok_or_else(|| {
                                field(
                                    key,
                                    format!("expected \"isolated\" or \"joint\", got {value}"),
                                )
                            })?
                            .parse()
                            .map_err(|e: hunch_core::reader::UnknownQuestionMode| {
                                field(key, e.to_string())
                            })?,
                    )
                }
                "draws" => {
                    s.draws = Some(
                        value
                            .as_u64()
                            .filter(|n| (1..=u64::from(MAX_DRAWS)).contains(n))
                            .map(|n| n as u32)
                            .ok_or_else(|| {
                                field(
                                    key,
                                    format!(
                                    "expected a whole number from 1 to {MAX_DRAWS}, got {value}"
                                ),
                                )
                            })?,
                    )
                }
                "prior" => s.prior = Some(mode(key, value, PriorMode::NAMES)?),
                "order" => s.order = Some(mode(key, value, OrderMode::NAMES)?),
                other => {
                    return Err(field(
                        other,
                        format!("unknown key (known: {})", KEYS.join(", ")),
                    ))
                }
            }
        }
        for alias in &s.aliases {
            if alias.is_empty() || alias.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(field(
                    "aliases",
                    format!("{alias:?} is not a name (empty, or with spaces)"),
                ));
            }
        }
        Ok(s)
    }

    /// The same settings as JSON (what `GET /v1/models` shows and the PUT answers), unset
    /// fields left out.
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        if !self.aliases.is_empty() {
            out.insert("aliases".into(), self.aliases.clone().into());
        }
        if self.pinned {
            out.insert("pinned".into(), true.into());
        }
        if let Some(ttl) = self.ttl {
            out.insert("ttl".into(), span_text(ttl).into());
        }
        if self.hidden {
            out.insert("hidden".into(), true.into());
        }
        if let Some(d) = self.dtype {
            out.insert("dtype".into(), d.as_str().into());
        }
        if !self.sidecar_args.is_empty() {
            out.insert("sidecar_args".into(), self.sidecar_args.clone().into());
        }
        if let Some(q) = self.questions {
            out.insert("questions".into(), q.as_str().into());
        }
        if let Some(d) = self.draws {
            out.insert("draws".into(), d.into());
        }
        if !self.ignore_config_keys.is_empty() {
            out.insert(
                "ignore_config_keys".into(),
                self.ignore_config_keys.clone().into(),
            );
        }
        if let Some(t) = &self.chat_template {
            out.insert("chat_template".into(), t.clone().into());
        }
        if let Some(p) = self.prior {
            out.insert("prior".into(), p.as_str().into());
        }
        if let Some(o) = self.order {
            out.insert("order".into(), o.as_str().into());
        }
        Value::Object(out)
    }

    /// As a TOML table, for the file.
    pub fn to_toml(&self) -> toml::Table {
        // Every value `to_json` writes is a string, a bool, a whole number or a list of
        // strings, all of which TOML holds.
        let mut table = toml::Table::new();
        if let Value::Object(map) = self.to_json() {
            for (k, v) in map {
                let v = match v {
                    Value::Bool(b) => toml::Value::Boolean(b),
                    Value::Number(n) => toml::Value::Integer(n.as_i64().unwrap_or_default()),
                    Value::String(s) => toml::Value::String(s),
                    Value::Array(items) => toml::Value::Array(
                        items
                            .into_iter()
                            .filter_map(|i| i.as_str().map(|s| toml::Value::String(s.into())))
                            .collect(),
                    ),
                    _ => continue,
                };
                table.insert(k, v);
            }
        }
        table
    }

    /// The arguments the sidecar gets for these settings, after the server's own (`server`):
    /// a `--dtype` of the server's is dropped when the model names its own (the sidecar takes
    /// one).
    pub fn sidecar_args(&self, server: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        let mut args = server.iter();
        while let Some(arg) = args.next() {
            if self.dtype.is_some() && arg == "--dtype" {
                args.next();
                continue;
            }
            if self.dtype.is_some() && arg.starts_with("--dtype=") {
                continue;
            }
            out.push(arg.clone());
        }
        if let Some(d) = self.dtype {
            out.push("--dtype".into());
            out.push(d.as_str().into());
        }
        out.extend(self.sidecar_args.iter().cloned());
        for key in &self.ignore_config_keys {
            out.push("--ignore-config-key".into());
            out.push(key.clone());
        }
        if let Some(t) = &self.chat_template {
            out.push("--chat-template".into());
            out.push(t.clone());
        }
        out
    }
}

/// `10m`, `30s`, `1h`, `500ms` as written back: the largest unit that says it exactly.
fn span_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 3_600_000 == 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

fn boolean(key: &str, value: &Value) -> Result<bool, FieldError> {
    value
        .as_bool()
        .ok_or_else(|| field(key, format!("expected true or false, got {value}")))
}

fn strings(key: &str, value: &Value) -> Result<Vec<String>, FieldError> {
    let bad = || field(key, format!("expected a list of strings, got {value}"));
    value
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|v| v.as_str().map(String::from).ok_or_else(bad))
        .collect()
}

/// A TTL: seconds (a positive number), or `500ms`, `30s`, `10m`, `1h`; at most 30 days.
fn ttl(value: &Value) -> Result<Duration, FieldError> {
    let bad = || {
        field(
            "ttl",
            format!("expected seconds or a duration such as \"10m\" (more than 0, at most 30 days), got {value}"),
        )
    };
    let seconds = match value {
        Value::Number(n) => n.as_f64().ok_or_else(bad)?,
        Value::String(text) => hunch_core::duration::parse(text)
            .ok_or_else(bad)?
            .as_secs_f64(),
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero() && *d <= MAX_TTL)
        .ok_or_else(bad)
}

/// What one settings file says: each model's settings, or why its table could not be read.
/// A file that cannot be read at all is one error for every model of its directory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SettingsFile {
    pub path: PathBuf,
    /// By model name.
    pub models: BTreeMap<String, Result<ModelSettings, String>>,
    /// The file as a whole could not be read (TOML syntax, a key beside `models`).
    pub error: Option<String>,
}

/// Reads `root`'s settings file. No file: no settings, no error.
pub fn read_file(root: &Path) -> SettingsFile {
    let path = root.join(FILE_NAME);
    let mut out = SettingsFile {
        path: path.clone(),
        ..SettingsFile::default()
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            out.error = Some(format!("{}: cannot read: {e}", path.display()));
            return out;
        }
    };
    match parse(&text) {
        Ok(models) => {
            out.models = models
                .into_iter()
                .map(|(name, settings)| {
                    let settings =
                        settings.map_err(|e| format!("{}: [models.{name:?}] {e}", path.display()));
                    (name, settings)
                })
                .collect();
        }
        Err(e) => out.error = Some(format!("{}: {e}", path.display())),
    }
    out
}

/// A settings file's text: each model's settings (or the error of its table); the error when
/// the text is no settings file at all.
pub fn parse(text: &str) -> Result<BTreeMap<String, Result<ModelSettings, FieldError>>, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let mut out = BTreeMap::new();
    for (key, value) in table {
        if key != "models" {
            return Err(format!(
                "unknown key `{key}` (the file holds [models.\"NAME\"] tables)"
            ));
        }
        let toml::Value::Table(models) = value else {
            return Err("`models` must be a table of [models.\"NAME\"] tables".into());
        };
        for (name, settings) in models {
            let settings = match serde_json::to_value(&settings) {
                Ok(Value::Object(fields)) => ModelSettings::from_fields(&fields),
                _ => Err(field(
                    "models",
                    format!("[models.{name:?}] must be a table of settings"),
                )),
            };
            out.insert(name, settings);
        }
    }
    Ok(out)
}

/// The file's text with `name`'s settings replaced by `settings` (`None` removes its table),
/// every other table kept. Comments are not kept: the file is written from its values.
pub fn rewrite(
    existing: Option<&str>,
    name: &str,
    settings: Option<&ModelSettings>,
) -> Result<String, String> {
    let mut table: toml::Table = match existing {
        Some(text) => toml::from_str(text).map_err(|e| e.message().to_string())?,
        None => toml::Table::new(),
    };
    let models = table
        .entry("models")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let toml::Value::Table(models) = models else {
        return Err("`models` is not a table".into());
    };
    match settings {
        Some(s) => {
            models.insert(name.into(), toml::Value::Table(s.to_toml()));
        }
        None => {
            models.remove(name);
        }
    }
    toml::to_string(&table).map_err(|e| e.to_string())
}

/// Writes `text` to `path` so that a reader sees the old file or the new one, never half of
/// one: a temporary file beside it, synced, then renamed over it.
/// (The temporary name starts with a dot, which discovery ignores.)
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let temp = dir.join(format!(
        ".{}.{}.tmp",
        file_name.unwrap_or_default(),
        std::process::id()
    ));
    let written = (|| {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from_json(v: Value) -> Result<ModelSettings, FieldError> {
        ModelSettings::from_fields(v.as_object().unwrap())
    }

    #[test]
    fn every_key_is_read_and_written_back_the_same() {
        let text = r#"
[models."org/qwen"]
aliases = ["qwen", "q"]
pinned = true
ttl = "30m"
hidden = true
dtype = "bfloat16"
sidecar_args = ["--canvas-cap", "32"]
questions = "joint"
draws = 4
ignore_config_keys = ["attn_zoom"]
chat_template = "chatml"
prior = "divide"
order = "cyclic_average"

[models.small]
ttl = 90
"#;
        let models = parse(text).unwrap();
        let qwen = models["org/qwen"].clone().unwrap();
        assert_eq!(
            qwen,
            ModelSettings {
                aliases: vec!["qwen".into(), "q".into()],
                pinned: true,
                ttl: Some(Duration::from_secs(1800)),
                hidden: true,
                dtype: Some(Dtype::Bfloat16),
                sidecar_args: vec!["--canvas-cap".into(), "32".into()],
                questions: Some(QuestionMode::Joint),
                draws: Some(4),
                ignore_config_keys: vec!["attn_zoom".into()],
                chat_template: Some("chatml".into()),
                prior: Some(PriorMode::Divide),
                order: Some(OrderMode::CyclicAverage),
            }
        );
        assert_eq!(
            models["small"].clone().unwrap().ttl,
            Some(Duration::from_secs(90))
        );
        // Written back and read again: the same settings; other tables kept.
        let written = rewrite(Some(text), "small", Some(&ModelSettings::default())).unwrap();
        let again = parse(&written).unwrap();
        assert_eq!(again["org/qwen"].clone().unwrap(), qwen);
        assert_eq!(again["small"].clone().unwrap(), ModelSettings::default());
        assert_eq!(
            from_json(qwen.to_json()).unwrap(),
            qwen,
            "the JSON form reads back"
        );
        let removed = rewrite(Some(&written), "small", None).unwrap();
        assert!(!parse(&removed).unwrap().contains_key("small"));
    }

    #[test]
    fn an_unknown_key_or_a_bad_value_names_the_key() {
        let cases = [
            (json!({"pinnned": true}), "pinnned"),
            (json!({"ttl": "soon"}), "ttl"),
            (json!({"ttl": 0}), "ttl"),
            (json!({"ttl": "31d"}), "ttl"),
            (json!({"dtype": "float8"}), "dtype"),
            (json!({"questions": "both"}), "questions"),
            (json!({"draws": 0}), "draws"),
            (json!({"draws": 65}), "draws"),
            (json!({"prior": "subtract"}), "prior"),
            (json!({"prior": true}), "prior"),
            (json!({"order": "reversed"}), "order"),
            (json!({"aliases": "one"}), "aliases"),
            (json!({"aliases": ["a b"]}), "aliases"),
            (json!({"pinned": "yes"}), "pinned"),
            (json!({"sidecar_args": [1]}), "sidecar_args"),
        ];
        for (fields, key) in cases {
            let e = from_json(fields.clone()).unwrap_err();
            assert_eq!(e.key, key, "{fields}: {e}");
        }
        // A file: the model's table error names the file, the model and the key.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(FILE_NAME),
            "[models.m]\nttl = \"soon\"\n[models.ok]\npinned = true\n",
        )
        .unwrap();
        let file = read_file(dir.path());
        let e = file.models["m"].clone().unwrap_err();
        assert!(
            e.contains(FILE_NAME) && e.contains("\"m\"") && e.contains("ttl"),
            "{e}"
        );
        assert!(file.models["ok"].clone().unwrap().pinned);
        // A file that is no settings file: one error, naming the file.
        std::fs::write(dir.path().join(FILE_NAME), "[model.m]\n").unwrap();
        let file = read_file(dir.path());
        assert!(file.error.unwrap().contains("unknown key `model`"));
        std::fs::write(dir.path().join(FILE_NAME), "[models.m\n").unwrap();
        assert!(read_file(dir.path()).error.is_some());
        // No file: nothing, and no error.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(read_file(empty.path()).error, None);
    }

    #[test]
    fn the_models_dtype_replaces_the_servers_and_its_args_follow() {
        let s = ModelSettings {
            dtype: Some(Dtype::Float32),
            sidecar_args: vec!["--canvas-cap".into(), "32".into()],
            ..ModelSettings::default()
        };
        let server = ["--dtype".to_string(), "bfloat16".into(), "--x=1".into()];
        assert_eq!(
            s.sidecar_args(&server),
            ["--x=1", "--dtype", "float32", "--canvas-cap", "32"]
        );
        let server = ["--dtype=bfloat16".to_string()];
        assert_eq!(
            s.sidecar_args(&server),
            ["--dtype", "float32", "--canvas-cap", "32"]
        );
        assert_eq!(ModelSettings::default().sidecar_args(&server), server);
    }

    #[test]
    fn a_file_is_replaced_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        write_atomically(&path, "[models.a]\n").unwrap();
        write_atomically(&path, "[models.b]\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "[models.b]\n");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left behind");
    }
}
