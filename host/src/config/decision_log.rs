//! The decision log's server settings: flags (`--decision-log…`), `HUNCH_DECISION_LOG…`
//! variables and the `[decision_log]` table of the TOML file. Each source is read into a
//! [`DecisionLogFile`] and merged key by key with the same precedence as every other setting
//! (`config/layer.rs`): the flag over the variable over the file.

use crate::decision::settings::DecisionLogSettings;
use crate::decision::sink::file::Fsync;
use clap::Args;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// The decision log's settings: flag, environment variable, TOML key (in `[decision_log]`).
pub const SETTINGS: &[(&str, &str, &str)] = &[
    ("--decision-log", "HUNCH_DECISION_LOG", "decision_log.path"),
    (
        "--decision-log-max-bytes",
        "HUNCH_DECISION_LOG_MAX_BYTES",
        "decision_log.max_bytes",
    ),
    (
        "--decision-log-rotate-seconds",
        "HUNCH_DECISION_LOG_ROTATE_SECONDS",
        "decision_log.rotate_seconds",
    ),
    (
        "--decision-log-keep",
        "HUNCH_DECISION_LOG_KEEP",
        "decision_log.keep",
    ),
    (
        "--decision-log-required",
        "HUNCH_DECISION_LOG_REQUIRED",
        "decision_log.required",
    ),
    (
        "--decision-log-omit-state",
        "HUNCH_DECISION_LOG_OMIT_STATE",
        "decision_log.omit_state",
    ),
    (
        "--decision-log-url",
        "HUNCH_DECISION_LOG_URL",
        "decision_log.url",
    ),
    (
        "--decision-log-url-key",
        "HUNCH_DECISION_LOG_URL_KEY",
        "decision_log.url_key",
    ),
    (
        "--decision-log-batch-bytes",
        "HUNCH_DECISION_LOG_BATCH_BYTES",
        "decision_log.batch_bytes",
    ),
    (
        "--decision-log-buffer",
        "HUNCH_DECISION_LOG_BUFFER",
        "decision_log.buffer",
    ),
    (
        "--decision-log-buffer-bytes",
        "HUNCH_DECISION_LOG_BUFFER_BYTES",
        "decision_log.buffer_bytes",
    ),
    (
        "--decision-log-write-timeout",
        "HUNCH_DECISION_LOG_WRITE_TIMEOUT",
        "decision_log.write_timeout",
    ),
    (
        "--decision-log-fsync",
        "HUNCH_DECISION_LOG_FSYNC",
        "decision_log.fsync",
    ),
    (
        "--decision-log-spool",
        "HUNCH_DECISION_LOG_SPOOL",
        "decision_log.spool",
    ),
    (
        "--decision-log-spool-bytes",
        "HUNCH_DECISION_LOG_SPOOL_BYTES",
        "decision_log.spool_bytes",
    ),
];

#[derive(Debug, Clone, Default, Args)]
pub struct DecisionLogArgs {
    /// Write one JSON line per decision to this file (`-`: stdout). Rotated by size and age.
    /// [env HUNCH_DECISION_LOG, TOML `decision_log.path`]
    #[arg(long = "decision-log", value_name = "PATH")]
    pub decision_log: Option<PathBuf>,
    /// Rotate the decision log file when it would grow past this many bytes. Default 100 MiB.
    /// [env HUNCH_DECISION_LOG_MAX_BYTES, TOML `decision_log.max_bytes`]
    #[arg(long, value_name = "BYTES")]
    pub decision_log_max_bytes: Option<u64>,
    /// Rotate the decision log file when it is this many seconds old (0: never). Default 0.
    /// [env HUNCH_DECISION_LOG_ROTATE_SECONDS, TOML `decision_log.rotate_seconds`]
    #[arg(long, value_name = "SECONDS")]
    pub decision_log_rotate_seconds: Option<u64>,
    /// Rotated decision log files kept; older ones are deleted. Default 10.
    /// [env HUNCH_DECISION_LOG_KEEP, TOML `decision_log.keep`]
    #[arg(long, value_name = "N")]
    pub decision_log_keep: Option<usize>,
    /// Answer 503 (with Retry-After) for a decision whose event cannot be written and flushed to
    /// the file, within `--decision-log-write-timeout`, before the response. The collector gets
    /// only events the file took. A policy's `drop = true` is overridden: every decision is
    /// recorded.
    /// `--decision-log-required=false` turns a lower source's `true` off.
    /// [env HUNCH_DECISION_LOG_REQUIRED, TOML `decision_log.required`]
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = super::parse_switch)]
    pub decision_log_required: Option<bool>,
    /// Leave state text out of decision events (its sha256 stays, enough to replay).
    /// `--decision-log-omit-state=false` turns a lower source's `true` off.
    /// [env HUNCH_DECISION_LOG_OMIT_STATE, TOML `decision_log.omit_state`]
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = super::parse_switch)]
    pub decision_log_omit_state: Option<bool>,
    /// POST decision events as gzip JSON arrays to this URL (http:// or https://).
    /// [env HUNCH_DECISION_LOG_URL, TOML `decision_log.url`]
    #[arg(long, value_name = "URL")]
    pub decision_log_url: Option<String>,
    /// Bearer key sent to `--decision-log-url`.
    /// [env HUNCH_DECISION_LOG_URL_KEY, TOML `decision_log.url_key`]
    #[arg(long)]
    pub decision_log_url_key: Option<String>,
    /// Largest batch POSTed to the URL, in bytes of JSON before gzip. Default 1 MiB.
    /// [env HUNCH_DECISION_LOG_BATCH_BYTES, TOML `decision_log.batch_bytes`]
    #[arg(long, value_name = "BYTES")]
    pub decision_log_batch_bytes: Option<usize>,
    /// Events held for the URL (or the file) while it is slow or down; more are dropped and
    /// counted. Default 10000.
    /// [env HUNCH_DECISION_LOG_BUFFER, TOML `decision_log.buffer`]
    #[arg(long, value_name = "EVENTS")]
    pub decision_log_buffer: Option<usize>,
    /// Bytes of events held for the URL (and, apart, for the file) while it is slow or down;
    /// more are dropped and counted. Default 64 MiB each.
    /// [env HUNCH_DECISION_LOG_BUFFER_BYTES, TOML `decision_log.buffer_bytes`]
    #[arg(long, value_name = "BYTES")]
    pub decision_log_buffer_bytes: Option<usize>,
    /// With `--decision-log-required`: how long a decision waits for its event to be written
    /// before it is answered 503 (a hung disk). Keep it below `--request-timeout`. Default 2.
    /// [env HUNCH_DECISION_LOG_WRITE_TIMEOUT, TOML `decision_log.write_timeout`]
    #[arg(long, value_name = "SECONDS")]
    pub decision_log_write_timeout: Option<f64>,
    /// `always`: fsync the file after each write, before a required decision is answered
    /// (survives a power loss), and the spool after each append and cursor update; `off`:
    /// flushed to the operating system only. Default off.
    /// [env HUNCH_DECISION_LOG_FSYNC, TOML `decision_log.fsync`]
    #[arg(long, value_name = "WHEN")]
    pub decision_log_fsync: Option<Fsync>,
    /// Spool the collector's events on disk in this directory (one process per directory, locked): a
    /// decision waits for its event's append, unsent events survive a crash or restart and are
    /// sent again (at-least-once; collectors deduplicate by `decision_id`), and a failing
    /// collector is retried without dropping. Needs `--decision-log-url`.
    /// [env HUNCH_DECISION_LOG_SPOOL, TOML `decision_log.spool`]
    #[arg(long, value_name = "DIR")]
    pub decision_log_spool: Option<PathBuf>,
    /// Bytes of unsent events the spool holds at most; more are dropped and counted
    /// (`spool_full`). Default 256 MiB.
    /// [env HUNCH_DECISION_LOG_SPOOL_BYTES, TOML `decision_log.spool_bytes`]
    #[arg(long, value_name = "BYTES")]
    pub decision_log_spool_bytes: Option<u64>,
}

/// `[decision_log]` in the TOML file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionLogFile {
    pub path: Option<PathBuf>,
    pub max_bytes: Option<u64>,
    pub rotate_seconds: Option<u64>,
    pub keep: Option<usize>,
    pub required: Option<bool>,
    pub omit_state: Option<bool>,
    pub url: Option<String>,
    pub url_key: Option<String>,
    pub batch_bytes: Option<usize>,
    pub buffer: Option<usize>,
    pub buffer_bytes: Option<usize>,
    pub write_timeout: Option<f64>,
    pub fsync: Option<Fsync>,
    pub spool: Option<PathBuf>,
    pub spool_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("decision log: {0}")]
pub struct DecisionLogSettingsError(pub String);

impl DecisionLogArgs {
    /// The flags as one source of `[decision_log]`.
    pub fn layer(&self) -> Option<DecisionLogFile> {
        DecisionLogFile {
            path: self.decision_log.clone(),
            max_bytes: self.decision_log_max_bytes,
            rotate_seconds: self.decision_log_rotate_seconds,
            keep: self.decision_log_keep,
            required: self.decision_log_required,
            omit_state: self.decision_log_omit_state,
            url: self.decision_log_url.clone(),
            url_key: self.decision_log_url_key.clone(),
            batch_bytes: self.decision_log_batch_bytes,
            buffer: self.decision_log_buffer,
            buffer_bytes: self.decision_log_buffer_bytes,
            write_timeout: self.decision_log_write_timeout,
            fsync: self.decision_log_fsync,
            spool: self.decision_log_spool.clone(),
            spool_bytes: self.decision_log_spool_bytes,
        }
        .some()
    }
}

/// `value` parsed, or an error naming the variable.
fn parsed<T: std::str::FromStr>(
    name: &str,
    value: Option<String>,
) -> Result<Option<T>, DecisionLogSettingsError> {
    value
        .map(|v| {
            v.parse()
                .map_err(|_| DecisionLogSettingsError(format!("{name}={v:?} is not valid")))
        })
        .transpose()
}

impl DecisionLogFile {
    /// `None` when no key is set, so a source that sets nothing stays `None`.
    fn some(self) -> Option<DecisionLogFile> {
        (self != DecisionLogFile::default()).then_some(self)
    }

    /// The `HUNCH_DECISION_LOG…` variables, through `lookup`; an empty variable is unset.
    pub fn from_env(
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<DecisionLogFile>, DecisionLogSettingsError> {
        let var = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let switch = |name: &str| {
            var(name)
                .map(|v| {
                    super::parse::parse_bool(&v)
                        .map_err(|e| DecisionLogSettingsError(format!("{name}: {e}")))
                })
                .transpose()
        };
        let fsync = var("HUNCH_DECISION_LOG_FSYNC")
            .map(|v| {
                <Fsync as clap::ValueEnum>::from_str(&v, true).map_err(|_| {
                    DecisionLogSettingsError(format!(
                        "HUNCH_DECISION_LOG_FSYNC={v:?} is not always or off"
                    ))
                })
            })
            .transpose()?;
        Ok(DecisionLogFile {
            path: var("HUNCH_DECISION_LOG").map(PathBuf::from),
            max_bytes: parsed(
                "HUNCH_DECISION_LOG_MAX_BYTES",
                var("HUNCH_DECISION_LOG_MAX_BYTES"),
            )?,
            rotate_seconds: parsed(
                "HUNCH_DECISION_LOG_ROTATE_SECONDS",
                var("HUNCH_DECISION_LOG_ROTATE_SECONDS"),
            )?,
            keep: parsed("HUNCH_DECISION_LOG_KEEP", var("HUNCH_DECISION_LOG_KEEP"))?,
            required: switch("HUNCH_DECISION_LOG_REQUIRED")?,
            omit_state: switch("HUNCH_DECISION_LOG_OMIT_STATE")?,
            url: var("HUNCH_DECISION_LOG_URL"),
            url_key: var("HUNCH_DECISION_LOG_URL_KEY"),
            batch_bytes: parsed(
                "HUNCH_DECISION_LOG_BATCH_BYTES",
                var("HUNCH_DECISION_LOG_BATCH_BYTES"),
            )?,
            buffer: parsed(
                "HUNCH_DECISION_LOG_BUFFER",
                var("HUNCH_DECISION_LOG_BUFFER"),
            )?,
            buffer_bytes: parsed(
                "HUNCH_DECISION_LOG_BUFFER_BYTES",
                var("HUNCH_DECISION_LOG_BUFFER_BYTES"),
            )?,
            write_timeout: parsed(
                "HUNCH_DECISION_LOG_WRITE_TIMEOUT",
                var("HUNCH_DECISION_LOG_WRITE_TIMEOUT"),
            )?,
            fsync,
            spool: var("HUNCH_DECISION_LOG_SPOOL").map(PathBuf::from),
            spool_bytes: parsed(
                "HUNCH_DECISION_LOG_SPOOL_BYTES",
                var("HUNCH_DECISION_LOG_SPOOL_BYTES"),
            )?,
        }
        .some())
    }

    /// Each key from `upper` where it is set, else from `lower`: a higher source that sets
    /// `required = false` turns a lower source's `true` off.
    pub fn over(
        upper: Option<DecisionLogFile>,
        lower: Option<DecisionLogFile>,
    ) -> Option<DecisionLogFile> {
        let (u, l) = (upper.unwrap_or_default(), lower.unwrap_or_default());
        DecisionLogFile {
            path: u.path.or(l.path),
            max_bytes: u.max_bytes.or(l.max_bytes),
            rotate_seconds: u.rotate_seconds.or(l.rotate_seconds),
            keep: u.keep.or(l.keep),
            required: u.required.or(l.required),
            omit_state: u.omit_state.or(l.omit_state),
            url: u.url.or(l.url),
            url_key: u.url_key.or(l.url_key),
            batch_bytes: u.batch_bytes.or(l.batch_bytes),
            buffer: u.buffer.or(l.buffer),
            buffer_bytes: u.buffer_bytes.or(l.buffer_bytes),
            write_timeout: u.write_timeout.or(l.write_timeout),
            fsync: u.fsync.or(l.fsync),
            spool: u.spool.or(l.spool),
            spool_bytes: u.spool_bytes.or(l.spool_bytes),
        }
        .some()
    }
}

/// The decision log's settings from the merged `[decision_log]` of every source (flags,
/// variables, file: [`DecisionLogFile::over`]) over the defaults.
pub fn resolve(
    merged: Option<DecisionLogFile>,
) -> Result<DecisionLogSettings, DecisionLogSettingsError> {
    let file = merged.unwrap_or_default();
    let d = DecisionLogSettings::default();
    let s = DecisionLogSettings {
        path: file.path,
        max_bytes: file.max_bytes.unwrap_or(d.max_bytes),
        rotate_after: file
            .rotate_seconds
            .filter(|s| *s > 0)
            .map(Duration::from_secs),
        keep: file.keep.unwrap_or(d.keep),
        required: file.required.unwrap_or(d.required),
        omit_state: file.omit_state.unwrap_or(d.omit_state),
        url: file.url,
        url_key: file.url_key.filter(|k| !k.trim().is_empty()),
        batch_bytes: file.batch_bytes.unwrap_or(d.batch_bytes),
        buffer: file.buffer.unwrap_or(d.buffer),
        buffer_bytes: file.buffer_bytes.unwrap_or(d.buffer_bytes),
        write_timeout: match file.write_timeout {
            Some(seconds) => Duration::try_from_secs_f64(seconds)
                .ok()
                .filter(|t| !t.is_zero())
                .ok_or_else(|| {
                    DecisionLogSettingsError(format!(
                        "write_timeout must be a positive number of seconds, not {seconds}"
                    ))
                })?,
            None => d.write_timeout,
        },
        fsync: file.fsync.unwrap_or(d.fsync),
        spool: file.spool,
        spool_bytes: file.spool_bytes.unwrap_or(d.spool_bytes),
    };
    if s.max_bytes == 0
        || s.batch_bytes == 0
        || s.buffer == 0
        || s.buffer_bytes == 0
        || s.spool_bytes == 0
    {
        return Err(DecisionLogSettingsError(
            "max_bytes, batch_bytes, buffer, buffer_bytes and spool_bytes must be positive".into(),
        ));
    }
    let file_on_disk = s.path.as_ref().is_some_and(|p| p.as_os_str() != "-");
    if s.fsync == Fsync::Always && !file_on_disk && s.spool.is_none() {
        return Err(DecisionLogSettingsError(
            "--decision-log-fsync always needs --decision-log PATH (a file, not stdout) or --decision-log-spool DIR".into(),
        ));
    }
    if s.spool.is_some() && s.url.is_none() {
        return Err(DecisionLogSettingsError(
            "--decision-log-spool needs --decision-log-url (it spools the collector's events)"
                .into(),
        ));
    }
    if s.required && s.path.is_none() {
        return Err(DecisionLogSettingsError(
            "--decision-log-required needs --decision-log PATH (the file sink)".into(),
        ));
    }
    if let Some(url) = &s.url {
        crate::http_url::check("--decision-log-url", url)
            .map_err(|e| DecisionLogSettingsError(e.to_string()))?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags over the file, as `hunch serve` merges them.
    fn flags_over(
        args: &DecisionLogArgs,
        file: Option<DecisionLogFile>,
    ) -> Result<DecisionLogSettings, DecisionLogSettingsError> {
        resolve(DecisionLogFile::over(args.layer(), file))
    }

    #[test]
    fn flags_win_over_the_file() {
        let file: DecisionLogFile =
            toml::from_str("path = \"/f\"\nkeep = 3\nrequired = true\nurl = \"http://l\"").unwrap();
        let args = DecisionLogArgs {
            decision_log: Some("/flag".into()),
            decision_log_rotate_seconds: Some(60),
            ..Default::default()
        };
        let s = flags_over(&args, Some(file)).unwrap();
        assert_eq!(s.path, Some(PathBuf::from("/flag")));
        assert_eq!(s.keep, 3);
        assert!(s.required);
        assert_eq!(s.rotate_after, Some(Duration::from_secs(60)));
        assert_eq!(s.url.as_deref(), Some("http://l"));
        assert!(s.enabled());
        assert_eq!(s.buffer_bytes, 64 << 20);
        assert_eq!(s.write_timeout, Duration::from_secs(2));
        assert_eq!(s.fsync, Fsync::Off);
    }

    #[test]
    fn the_write_path_settings_merge_like_the_others() {
        let file: DecisionLogFile = toml::from_str(
            "path = \"/f\"\nbuffer_bytes = 1000\nwrite_timeout = 0.25\nfsync = \"always\"",
        )
        .unwrap();
        let s = flags_over(&DecisionLogArgs::default(), Some(file.clone())).unwrap();
        assert_eq!(s.buffer_bytes, 1000);
        assert_eq!(s.write_timeout, Duration::from_millis(250));
        assert_eq!(s.fsync, Fsync::Always);
        let args = DecisionLogArgs {
            decision_log_buffer_bytes: Some(5),
            decision_log_write_timeout: Some(3.0),
            decision_log_fsync: Some(Fsync::Off),
            ..Default::default()
        };
        let s = flags_over(&args, Some(file)).unwrap();
        assert_eq!(
            (s.buffer_bytes, s.write_timeout, s.fsync),
            (5, Duration::from_secs(3), Fsync::Off)
        );
    }

    #[test]
    fn the_spool_settings_merge_and_fsync_always_may_apply_to_the_spool_alone() {
        let file: DecisionLogFile = toml::from_str(
            "url = \"http://c\"\nspool = \"/var/lib/hunch/spool\"\nspool_bytes = 1000\nfsync = \"always\"",
        )
        .unwrap();
        let s = flags_over(&DecisionLogArgs::default(), Some(file.clone())).unwrap();
        assert_eq!(s.spool, Some(PathBuf::from("/var/lib/hunch/spool")));
        assert_eq!((s.spool_bytes, s.fsync), (1000, Fsync::Always));
        let args = DecisionLogArgs {
            decision_log_spool: Some("/flag".into()),
            decision_log_spool_bytes: Some(7),
            ..Default::default()
        };
        let s = flags_over(&args, Some(file)).unwrap();
        assert_eq!((s.spool, s.spool_bytes), (Some(PathBuf::from("/flag")), 7));
        let d = flags_over(&DecisionLogArgs::default(), None).unwrap();
        assert_eq!((d.spool, d.spool_bytes), (None, 256 << 20));
    }

    #[test]
    fn nonsense_is_refused() {
        let required_without_file = DecisionLogArgs {
            decision_log_required: Some(true),
            ..Default::default()
        };
        assert!(flags_over(&required_without_file, None).is_err());
        let ftp = DecisionLogArgs {
            decision_log_url: Some("ftp://x".into()),
            ..Default::default()
        };
        assert!(flags_over(&ftp, None).is_err());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let timeout = DecisionLogArgs {
                decision_log: Some("/f".into()),
                decision_log_write_timeout: Some(bad),
                ..Default::default()
            };
            assert!(flags_over(&timeout, None).is_err(), "{bad}");
        }
        for path in [None, Some("-")] {
            let fsync_without_file = DecisionLogArgs {
                decision_log: path.map(PathBuf::from),
                decision_log_fsync: Some(Fsync::Always),
                ..Default::default()
            };
            assert!(flags_over(&fsync_without_file, None).is_err());
        }
        let no_bytes = DecisionLogArgs {
            decision_log_buffer_bytes: Some(0),
            ..Default::default()
        };
        assert!(flags_over(&no_bytes, None).is_err());
        let spool_without_url = DecisionLogArgs {
            decision_log: Some("/f".into()),
            decision_log_spool: Some("/s".into()),
            ..Default::default()
        };
        assert!(flags_over(&spool_without_url, None).is_err());
        let no_spool_bytes = DecisionLogArgs {
            decision_log_url: Some("http://c".into()),
            decision_log_spool: Some("/s".into()),
            decision_log_spool_bytes: Some(0),
            ..Default::default()
        };
        assert!(flags_over(&no_spool_bytes, None).is_err());
        assert!(toml::from_str::<DecisionLogFile>("nonsense = 1").is_err());
    }
}
