//! Per-model settings in the manager (docs/models.md, "Per-model settings"): the models
//! directories' `hunch-models.toml` files applied at every rescan, `PUT
//! /v1/models/NAME/settings` applied at once and written back to its file, and what the rest of
//! the server asks of them (aliases, hidden models, read settings).
//!
//! A table that cannot be applied (an unknown key, a bad value, an alias another model has) is
//! logged and shown on the model's `/v1/models` entry; the model keeps the settings it had. A
//! rescan never fails over a settings file.

use super::{Inner, ModelManager, Phase, Slot};
use crate::reader::models::settings::{self, FieldError, ModelSettings, SettingsFile};
use hunch_core::QuestionMode;
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Why `PUT /v1/models/NAME/settings` changed nothing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SettingsError {
    #[error("unknown model {0:?}")]
    NotFound(String),
    /// 422: a key or a value, named.
    #[error("invalid settings: {0}")]
    Invalid(FieldError),
    /// 409: a `--model`'s settings are its flags.
    #[error(
        "model {0} is a --model: its settings are the server's flags; only models of a \
         --models-dir take settings"
    )]
    Fixed(String),
    /// 409: it cannot be pinned, the budget can never hold it beside the pinned models.
    #[error("{0}")]
    CannotPin(String),
    /// 409: the settings file cannot be written; nothing changed.
    #[error("cannot write {path}: {why}; nothing was changed")]
    Unwritable { path: String, why: String },
}

/// What a `PUT` did.
#[derive(Debug, Clone, PartialEq)]
pub struct SettingsApplied {
    pub settings: ModelSettings,
    /// The file they were written to.
    pub file: PathBuf,
    /// A sidecar runs now with other sidecar settings (`dtype`, `sidecar_args`): they take
    /// effect at its next load.
    pub sidecar_settings_at_next_load: bool,
}

impl ModelManager {
    /// Every models directory's settings file, read now (outside the lock).
    pub(super) fn read_settings_files(&self) -> Vec<(PathBuf, SettingsFile)> {
        self.settings
            .models_dirs
            .iter()
            .map(|root| (root.clone(), settings::read_file(root)))
            .collect()
    }

    /// The models directory a model of `path` was found under (the first that holds it, as
    /// discovery keeps the first root's model of a name).
    fn root_of(&self, path: &std::path::Path) -> Option<PathBuf> {
        self.settings
            .models_dirs
            .iter()
            .find(|root| path.starts_with(root))
            .cloned()
    }

    /// Applies what the settings files say to every model of a models directory; answers the
    /// models this pinned that do not run yet.
    pub(super) fn apply_settings_files(
        &self,
        inner: &mut Inner,
        files: &[(PathBuf, SettingsFile)],
    ) -> Vec<String> {
        let names: Vec<String> = inner
            .models
            .iter()
            .filter(|(_, s)| !s.fixed)
            .map(|(n, _)| n.clone())
            .collect();
        let mut newly_pinned = Vec::new();
        for name in names {
            let Some(root) = inner.models.get(&name).and_then(|s| self.root_of(&s.path)) else {
                continue;
            };
            let Some((_, file)) = files.iter().find(|(r, _)| *r == root) else {
                continue;
            };
            let wanted = match (&file.error, file.models.get(&name)) {
                (Some(e), _) => Err(e.clone()),
                (None, None) => Ok(ModelSettings::default()),
                (None, Some(Ok(s))) => self
                    .check_aliases(inner, &name, s)
                    .map(|()| s.clone())
                    .map_err(|e| format!("{}: [models.{name:?}] {e}", file.path.display())),
                (None, Some(Err(e))) => Err(e.clone()),
            };
            let Some(slot) = inner.models.get_mut(&name) else {
                continue;
            };
            match wanted {
                Ok(s) => {
                    slot.settings_error = None;
                    if s != slot.settings {
                        tracing::info!(model = %name, settings = %s.to_json(), "models dir: settings");
                        if apply(slot, s, self.settings.ttl) {
                            newly_pinned.push(name);
                        }
                    }
                }
                Err(e) => {
                    if slot.settings_error.as_ref() != Some(&e) {
                        tracing::warn!(model = %name, error = %e, "models dir: settings not applied");
                    }
                    slot.settings_error = Some(e);
                }
            }
        }
        newly_pinned
    }

    /// An alias of `settings` that is another model's name, a name served by something else,
    /// or another model's alias, is refused.
    fn check_aliases(
        &self,
        inner: &Inner,
        name: &str,
        settings: &ModelSettings,
    ) -> Result<(), FieldError> {
        for alias in &settings.aliases {
            let taken = if alias == name {
                Some("the model's own name".to_string())
            } else if inner.models.contains_key(alias)
                || self.settings.reserved.contains(alias)
                || alias == crate::reader::DEFAULT_ALIAS
            {
                Some("a name already served".to_string())
            } else {
                inner
                    .models
                    .iter()
                    .find(|(other, s)| *other != name && s.settings.aliases.contains(alias))
                    .map(|(other, _)| format!("an alias of {other}"))
            };
            if let Some(taken) = taken {
                return Err(FieldError {
                    key: "aliases".into(),
                    message: format!("{alias:?} is {taken}"),
                });
            }
        }
        Ok(())
    }

    /// Starts the loads of models pinned while the server runs (at start, `start` does).
    pub(super) fn load_pinned(&self, names: Vec<String>) {
        if names.is_empty() || !self.started.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        for name in names {
            let me = me.clone();
            tokio::spawn(async move {
                if let Err(e) = me.load_now(&name).await {
                    tracing::warn!(model = %name, error = %e, "pinned model: load");
                }
            });
        }
    }

    /// `PUT /v1/models/NAME/settings`: validates `fields` (the whole of the model's settings:
    /// a key left out is the server's default), writes them to the model's settings file, and
    /// applies them: TTL, pinned, hidden, aliases and read settings at once, sidecar settings at
    /// its next load.
    pub fn put_settings(
        &self,
        name: &str,
        fields: &Map<String, Value>,
    ) -> Result<SettingsApplied, SettingsError> {
        let wanted = ModelSettings::from_fields(fields).map_err(SettingsError::Invalid)?;
        let (root, was) = {
            let inner = self.lock();
            let slot = inner
                .models
                .get(name)
                .ok_or_else(|| SettingsError::NotFound(name.into()))?;
            if slot.fixed {
                return Err(SettingsError::Fixed(name.into()));
            }
            self.check_aliases(&inner, name, &wanted)
                .map_err(SettingsError::Invalid)?;
            let root = self
                .root_of(&slot.path)
                .ok_or_else(|| SettingsError::NotFound(name.into()))?;
            (root, slot.settings.clone())
        };
        if wanted.pinned && !was.pinned {
            // Pinning a model the budget can never hold beside the pinned ones would leave it
            // failing to load forever.
            self.check_fits(name)
                .map_err(|e| SettingsError::CannotPin(format!("cannot pin: {e}")))?;
        }
        let file = root.join(settings::FILE_NAME);
        // Held until the settings are applied too: a rescan reads and applies under it.
        let _writing = self.settings_file.lock().unwrap_or_else(|e| e.into_inner());
        {
            let unwritable = |why: String| SettingsError::Unwritable {
                path: file.display().to_string(),
                why,
            };
            let existing = match std::fs::read_to_string(&file) {
                Ok(text) => Some(text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(unwritable(e.to_string())),
            };
            // A file that is no settings file now is replaced only by a hand that fixes it: its
            // other tables would be lost.
            let text = settings::rewrite(existing.as_deref(), name, Some(&wanted))
                .map_err(|e| unwritable(format!("it is not a settings file ({e})")))?;
            settings::write_atomically(&file, &text).map_err(|e| unwritable(e.to_string()))?;
        }
        let (newly_pinned, running) = {
            let mut inner = self.lock();
            let Some(slot) = inner.models.get_mut(name) else {
                return Err(SettingsError::NotFound(name.into()));
            };
            slot.settings_error = None;
            let running = !matches!(slot.phase, Phase::Available | Phase::Failed { .. });
            (apply(slot, wanted.clone(), self.settings.ttl), running)
        };
        tracing::info!(model = %name, settings = %wanted.to_json(), file = %file.display(), "settings changed");
        if newly_pinned {
            self.load_pinned(vec![name.to_string()]);
        }
        self.changed.notify_waiters();
        Ok(SettingsApplied {
            sidecar_settings_at_next_load: running
                && (wanted.dtype != was.dtype || wanted.sidecar_args != was.sidecar_args),
            settings: wanted,
            file,
        })
    }

    /// The model an alias of a settings file names.
    pub fn alias_target(&self, alias: &str) -> Option<String> {
        let inner = self.lock();
        inner
            .models
            .iter()
            .find(|(_, s)| s.settings.aliases.iter().any(|a| a == alias))
            .map(|(n, _)| n.clone())
    }

    /// Every alias the settings files give, with its model, sorted by alias; a hidden model's
    /// aliases are left out (they resolve, [`ModelManager::alias_target`], unlisted).
    pub fn aliases(&self) -> Vec<(String, String)> {
        let inner = self.lock();
        let mut out: Vec<(String, String)> = inner
            .models
            .iter()
            .filter(|(_, s)| !s.settings.hidden)
            .flat_map(|(n, s)| s.settings.aliases.iter().map(|a| (a.clone(), n.clone())))
            .collect();
        out.sort();
        out
    }

    /// Whether `name` is left out of listings (still served by name).
    pub fn is_hidden(&self, name: &str) -> bool {
        self.lock()
            .models
            .get(name)
            .is_some_and(|s| s.settings.hidden)
    }

    /// Every model a listing shows (all but the hidden ones), sorted.
    pub fn listed_names(&self) -> Vec<String> {
        self.lock()
            .models
            .iter()
            .filter(|(_, s)| !s.settings.hidden)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// How `name` reads when a request does not say: its question mode and noise draws.
    pub fn read_settings(&self, name: &str) -> (Option<QuestionMode>, Option<u32>) {
        self.lock()
            .models
            .get(name)
            .map_or((None, None), |s| (s.settings.questions, s.settings.draws))
    }

    /// The prior and order remedies `name` answers with when a request does not say (`x_prior`,
    /// `x_order`).
    pub fn debias_settings(
        &self,
        name: &str,
    ) -> (Option<hunch_core::PriorMode>, Option<hunch_core::OrderMode>) {
        self.lock()
            .models
            .get(name)
            .map_or((None, None), |s| (s.settings.prior, s.settings.order))
    }
}

/// Puts `new` on `slot`: a changed TTL counts from its last use at once; pinning keeps it (and
/// answers true when it does not run yet, to load it); unpinning starts its TTL.
fn apply(slot: &mut Slot, new: ModelSettings, default_ttl: Duration) -> bool {
    let pinned_now = new.pinned && !slot.settings.pinned;
    let ttl = new.ttl.unwrap_or(default_ttl);
    slot.settings = new;
    slot.pinned = slot.fixed || slot.settings.pinned;
    if slot.pinned {
        slot.expires = None;
    } else if matches!(slot.phase, Phase::Loaded { .. }) {
        let since = slot.last_used.map_or_else(Instant::now, |(t, _)| t);
        slot.expires = Some(since + ttl);
    }
    pinned_now && matches!(slot.phase, Phase::Available | Phase::Failed { .. })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{gguf, settings as manager_settings};
    use super::*;

    #[tokio::test]
    async fn a_settings_file_is_applied_at_rescan_and_a_bad_table_is_shown_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        gguf(dir.path(), "a", 1000);
        gguf(dir.path(), "b", 1000);
        std::fs::write(
            dir.path().join(settings::FILE_NAME),
            "[models.a]\naliases = [\"alpha\"]\nhidden = true\nttl = \"1m\"\nquestions = \"joint\"\ndraws = 3\n\
             [models.b]\nttll = \"1m\"\n",
        )
        .unwrap();
        let manager = ModelManager::new(manager_settings(dir.path(), 10_000), Vec::new());
        assert_eq!(manager.alias_target("alpha").as_deref(), Some("a"));
        assert!(manager.is_hidden("a"));
        assert_eq!(manager.listed_names(), ["b"]);
        assert_eq!(
            manager.read_settings("a"),
            (Some(QuestionMode::Joint), Some(3))
        );
        let view = manager.view();
        let b = view.model("b").unwrap();
        let error = b.settings_error.as_deref().unwrap();
        assert!(
            error.contains(settings::FILE_NAME)
                && error.contains("\"b\"")
                && error.contains("ttll"),
            "{error}"
        );
        assert_eq!(view.model("a").unwrap().settings_error, None);
        // The settings file is the directory's own, not a skipped model.
        assert!(view
            .skipped
            .iter()
            .all(|(p, _)| !p.ends_with(settings::FILE_NAME)));

        // An alias that is another model's name is refused, the model keeps what it had.
        std::fs::write(
            dir.path().join(settings::FILE_NAME),
            "[models.a]\naliases = [\"b\"]\n",
        )
        .unwrap();
        manager.rescan(true);
        assert_eq!(manager.alias_target("alpha").as_deref(), Some("a"));
        assert!(manager
            .view()
            .model("a")
            .unwrap()
            .settings_error
            .as_deref()
            .unwrap()
            .contains("aliases"));
        // A file that is no TOML: every model keeps its settings and shows the error.
        std::fs::write(dir.path().join(settings::FILE_NAME), "[models.a\n").unwrap();
        manager.rescan(true);
        assert!(manager.is_hidden("a"));
        assert!(manager.view().model("b").unwrap().settings_error.is_some());
    }

    #[tokio::test]
    async fn a_put_validates_writes_the_file_and_applies_at_once() {
        let dir = tempfile::tempdir().unwrap();
        gguf(dir.path(), "m", 1000);
        gguf(dir.path(), "other", 1000);
        std::fs::write(
            dir.path().join(settings::FILE_NAME),
            "[models.other]\nhidden = true\n",
        )
        .unwrap();
        let pinned = vec![("fixed".to_string(), dir.path().join("fixed.gguf"), 10)];
        let manager = ModelManager::new(manager_settings(dir.path(), 10_000), pinned);
        let body = |v: Value| v.as_object().unwrap().clone();

        let applied = manager
            .put_settings(
                "m",
                &body(serde_json::json!({"aliases": ["em"], "ttl": "90s", "dtype": "float32"})),
            )
            .unwrap();
        assert_eq!(applied.settings.ttl, Some(Duration::from_secs(90)));
        assert!(!applied.sidecar_settings_at_next_load, "nothing runs");
        assert_eq!(manager.alias_target("em").as_deref(), Some("m"));
        // Written beside the other model's table, which stays.
        let file = settings::read_file(dir.path());
        assert_eq!(file.models["m"].clone().unwrap(), applied.settings);
        assert!(file.models["other"].clone().unwrap().hidden);
        // The sidecar gets the model's dtype.
        let config = manager.sidecar_config("m").unwrap();
        assert!(config
            .extra_args
            .ends_with(&["--dtype".into(), "float32".into()]));
        // A rescan reads the same file and changes nothing.
        manager.rescan(true);
        assert_eq!(manager.alias_target("em").as_deref(), Some("m"));

        assert!(matches!(
            manager.put_settings("m", &body(serde_json::json!({"ttl": "never"}))),
            Err(SettingsError::Invalid(FieldError { key, .. })) if key == "ttl"
        ));
        assert!(matches!(
            manager.put_settings("m", &body(serde_json::json!({"aliases": ["other"]}))),
            Err(SettingsError::Invalid(FieldError { key, .. })) if key == "aliases"
        ));
        assert_eq!(
            manager.put_settings("nope", &Map::new()),
            Err(SettingsError::NotFound("nope".into()))
        );
        assert_eq!(
            manager.put_settings("fixed", &Map::new()),
            Err(SettingsError::Fixed("fixed".into()))
        );
        // A model the budget can never hold is not pinned.
        gguf(dir.path(), "huge", 20_000);
        manager.rescan(true);
        assert!(matches!(
            manager.put_settings("huge", &body(serde_json::json!({"pinned": true}))),
            Err(SettingsError::CannotPin(_))
        ));
        // An empty body: the server's defaults again.
        manager.put_settings("m", &Map::new()).unwrap();
        assert_eq!(manager.alias_target("em"), None);
    }
}
