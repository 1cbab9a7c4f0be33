//! Decision records: every `POST /v1/systemone` and every policy invocation is a *decision* with
//! an id (`x-hunch-decision-id`), and, with a decision log configured, one JSON event holding
//! everything needed to explain and replay it. See `docs/decision-records.md`.
//!
//! This module only records: it imports nothing from `api`, `policy`, `config` or `cli`
//! (docs/architecture.md). Who makes decisions and how they are answered lives above it.
//!
//! - [`event`]: the event's shape (written by the server, read by `hunch replay`), and the typed
//!   vocabulary of failures and limits every event uses.
//! - [`recorder`]: reads captured at the `Reader` boundary, and answered again from a record.
//! - [`mask`]: per-policy masking (`[decision_log]` in `NAME.toml`).
//! - [`sink`]: the NDJSON file and the HTTP collector.
//! - [`settings`]: the decision log's settings.

pub mod event;
pub mod mask;
pub mod recorder;
pub mod ring;
pub mod settings;
pub mod sink;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use event::{DecisionEvent, EventTimings, ModelRef, ReadEvent};
use hunch_core::{Reader, READ_ALGORITHM_VERSION};
use mask::PolicyLogConfig;
use recorder::{ReadLog, RecordingReader};
use ring::DecisionRing;
use serde_json::Value;
use settings::DecisionLogSettings;
use sink::file::{FileSink, FileSinkConfig, FileSinkError};
use sink::http::{HttpSinkConfig, HttpSinkError};
use sink::spool::SpoolConfig;
use sink::{Collector, SinkStats};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// The response header carrying a decision's id.
pub const DECISION_ID_HEADER: &str = "x-hunch-decision-id";

/// A new decision id: 32 lowercase hex digits, random.
pub fn new_decision_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The server's decision log: its sinks, the served models (whose fingerprints events name),
/// and the counters `/metrics` shows.
pub struct DecisionLog {
    settings: DecisionLogSettings,
    file: Option<FileSink>,
    http: Option<Collector>,
    pub stats: Arc<SinkStats>,
    /// The served models by name: an event names the fingerprint its model reports when the
    /// decision is written (a sidecar's changes when it restarts on another checkpoint).
    models: RwLock<BTreeMap<String, Arc<dyn Reader>>>,
    /// Policies whose `drop = true` a required log has overridden (warned once each).
    drop_overridden: Mutex<BTreeSet<String>>,
    /// The recent decisions the operator console shows ([`DecisionLog::keep_recent`]).
    recent: OnceLock<Arc<DecisionRing>>,
}

impl std::fmt::Debug for DecisionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionLog")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl DecisionLog {
    /// Ids for every decision, no events.
    pub fn disabled() -> Arc<DecisionLog> {
        Arc::new(DecisionLog {
            settings: DecisionLogSettings::default(),
            file: None,
            http: None,
            stats: Arc::default(),
            models: RwLock::default(),
            drop_overridden: Mutex::default(),
            recent: OnceLock::new(),
        })
    }

    /// Starts the configured sinks (inside a tokio runtime).
    pub fn start(settings: DecisionLogSettings) -> Result<Arc<DecisionLog>, HttpSinkError> {
        let stats: Arc<SinkStats> = Arc::default();
        let file = settings.path.as_ref().map(|path| {
            FileSink::start(
                FileSinkConfig {
                    path: path.clone(),
                    max_bytes: settings.max_bytes,
                    rotate_after: settings.rotate_after,
                    keep: settings.keep,
                    queue: settings.buffer,
                    queue_bytes: settings.buffer_bytes,
                    fsync: settings.fsync,
                },
                stats.clone(),
            )
        });
        let http = match &settings.url {
            Some(url) => Some(Collector::start(
                HttpSinkConfig {
                    url: url.clone(),
                    key: settings.url_key.clone(),
                    batch_bytes: settings.batch_bytes,
                    buffer: settings.buffer,
                    buffer_bytes: settings.buffer_bytes,
                },
                settings.spool.as_ref().map(|dir| SpoolConfig {
                    dir: dir.clone(),
                    max_bytes: settings.spool_bytes,
                    fsync: settings.fsync,
                }),
                stats.clone(),
            )?),
            None => None,
        };
        if let Some(p) = &settings.path {
            tracing::info!(
                path = %p.display(),
                required = settings.required,
                fsync = settings.fsync.as_str(),
                "decision log file"
            );
        }
        if let Some(u) = &settings.url {
            tracing::info!(url = %u, spool = ?settings.spool, "decision log collector");
        }
        Ok(Arc::new(DecisionLog {
            settings,
            file,
            http,
            stats,
            models: RwLock::default(),
            drop_overridden: Mutex::default(),
            recent: OnceLock::new(),
        }))
    }

    pub fn settings(&self) -> &DecisionLogSettings {
        &self.settings
    }

    /// Whether events are written to a sink (a file or a collector).
    pub fn enabled(&self) -> bool {
        self.file.is_some() || self.http.is_some()
    }

    /// Whether decisions are recorded at all: written to a sink, or kept for the console.
    pub fn recording(&self) -> bool {
        self.enabled() || self.recent.get().is_some()
    }

    /// Keeps the last `capacity` decisions in memory (masked as the sinks get them) for the
    /// operator console; 0 keeps none. Called once, before the server takes requests; a second
    /// call changes nothing.
    pub fn keep_recent(&self, capacity: usize) {
        if let Some(ring) = DecisionRing::new(capacity) {
            let _ = self.recent.set(Arc::new(ring));
        }
    }

    /// The decisions kept for the console, when it keeps any.
    pub fn recent(&self) -> Option<&Arc<DecisionRing>> {
        self.recent.get()
    }

    /// The served models, by the name decisions give them.
    pub fn set_models(&self, models: impl IntoIterator<Item = (String, Arc<dyn Reader>)>) {
        let mut map = self.models.write().unwrap_or_else(|p| p.into_inner());
        map.extend(models);
    }

    /// The model a decision read with, as events name it: its fingerprint is the one the model
    /// reports ([`hunch_core::ReaderInfo`]), the same the answer cache and `/v1/models` use;
    /// absent when it is not known (an upstream, a sidecar not loaded yet).
    pub fn model_ref(&self, name: &str) -> ModelRef {
        let map = self.models.read().unwrap_or_else(|p| p.into_inner());
        ModelRef {
            name: name.to_string(),
            fingerprint: map.get(name).and_then(|reader| reader.info().fingerprint),
        }
    }

    /// Starts a decision: a new id; its reads are recorded when the log is on.
    pub fn begin(
        &self,
        route: &str,
        request_id: Option<String>,
        client_request_id: Option<String>,
    ) -> Decision {
        Decision {
            id: new_decision_id(),
            route: route.to_string(),
            request_id,
            client_request_id,
            at: SystemTime::now(),
            started: Instant::now(),
            reads: ReadLog::default(),
            record: self.recording(),
        }
    }

    /// Masks and writes an event. `Err` only when the log is required and the event could not
    /// be written to the file within the write timeout: the caller answers 503 with
    /// `Retry-After` ([`FileSinkError::retry_after_seconds`]). Every other failure is counted
    /// and logged by the sink, never returned.
    ///
    /// With a spool (`--decision-log-spool`), this waits until the event is appended to it,
    /// at most the write timeout; a failed append is counted, never returned.
    ///
    /// With a required log the file comes first: the collector is offered only an event the
    /// file took, so a decision answered 503 never reaches it (it is counted as dropped for the
    /// collector, cause `unrecorded`). A required log records every decision, so a policy's
    /// `drop = true` is overridden (its masks still apply).
    ///
    /// The console's ring of recent decisions ([`DecisionLog::keep_recent`]) gets the very event
    /// the sinks get, after the same masking; it never makes the decision wait (a busy ring drops
    /// the event).
    pub async fn write(
        &self,
        mut event: DecisionEvent,
        policy: Option<&PolicyLogConfig>,
    ) -> Result<(), FileSinkError> {
        if !self.recording() {
            return Ok(());
        }
        if policy.is_some_and(|p| p.drop) {
            if !self.settings.required {
                return Ok(());
            }
            self.warn_drop_overridden(&event);
        }
        if let Some(p) = policy {
            p.apply(&mut event);
        }
        if self.settings.omit_state || policy.is_some_and(|p| p.omit_state) {
            for r in &mut event.reads {
                r.state = None;
            }
            // A System One request carries its state in the input too.
            if event.policy.is_none() {
                if let Some(input) = event.input.as_object_mut() {
                    if input.shift_remove("state").is_some() {
                        event.erased.push("/input/state".into());
                    }
                }
            }
        }
        if !self.enabled() {
            if let Some(ring) = self.recent.get() {
                ring.push(Arc::new(event));
            }
            return Ok(());
        }
        let bytes = match serde_json::to_vec(&event) {
            Ok(b) => b,
            Err(e) => {
                // Cannot happen for these types; never fail a decision over it.
                self.stats
                    .dropped("all", "encode_failed", 1, &e.to_string());
                return Ok(());
            }
        };
        if let Some(file) = &self.file {
            let mut line = Vec::with_capacity(bytes.len() + 1);
            line.extend_from_slice(&bytes);
            line.push(b'\n');
            if self.settings.required {
                if let Err(e) = file.write_required(line, self.settings.write_timeout).await {
                    if let Some(http) = &self.http {
                        http.skipped("unrecorded", &e.to_string());
                    }
                    return Err(e);
                }
            } else {
                file.submit(line);
            }
        }
        // After a required file took it: a decision answered 503 is not shown as made.
        if let Some(ring) = self.recent.get() {
            ring.push(Arc::new(event));
        }
        if let Some(http) = &self.http {
            // Spooled, this waits for the append: an answered decision's event is on disk.
            http.submit(bytes, self.settings.write_timeout).await;
        }
        Ok(())
    }

    fn warn_drop_overridden(&self, event: &DecisionEvent) {
        let name = event.policy.as_ref().map_or("", |p| p.name.as_str());
        let mut warned = self
            .drop_overridden
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if warned.insert(name.to_string()) {
            tracing::warn!(
                policy = name,
                "the decision log is required: this policy's `drop = true` is overridden and its decisions are recorded"
            );
        }
    }

    /// Writes what the sinks hold; each gets `grace`, and what is still held in memory after it
    /// is counted as dropped (cause `shutdown`). What a spool still holds stays there for the
    /// next start.
    pub async fn close(&self, grace: Duration) {
        let http = async {
            if let Some(http) = &self.http {
                http.close(grace).await;
            }
        };
        let file = async {
            if let Some(file) = &self.file {
                file.close(grace).await;
            }
        };
        tokio::join!(http, file);
    }
}

impl crate::metrics::MetricsSource for DecisionLog {
    /// The decision log's lines of `/metrics`.
    fn render_metrics(&self, out: &mut String) {
        self.stats.render(out);
        if let Some(http) = &self.http {
            http.render_metrics(out);
        }
    }
}

/// One decision in progress.
#[derive(Debug, Clone)]
pub struct Decision {
    pub id: String,
    pub route: String,
    pub request_id: Option<String>,
    pub client_request_id: Option<String>,
    at: SystemTime,
    started: Instant,
    reads: ReadLog,
    record: bool,
}

impl Decision {
    /// Records this decision's reads even with the log off (a shadow candidate reuses them).
    pub fn record_reads(&mut self) {
        self.record = true;
    }

    /// Whether this decision's reads (and so its event) are recorded.
    pub fn recording(&self) -> bool {
        self.record
    }

    /// `inner`, recording every read into this decision when reads are recorded.
    pub fn reader(&self, inner: Arc<dyn Reader>) -> Arc<dyn Reader> {
        if self.record {
            Arc::new(RecordingReader::new(inner, self.reads.clone(), false))
        } else {
            inner
        }
    }

    pub fn reads(&self) -> Vec<ReadEvent> {
        self.reads.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn elapsed_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1e3
    }

    /// The event with what every decision has; the caller adds the policy, model, input,
    /// result or error.
    pub fn event(&self, status: u16) -> DecisionEvent {
        let reads = self.reads();
        let read_ms = reads.iter().map(|r| r.elapsed_ms).sum();
        let mut usage = hunch_core::Usage::default();
        for r in &reads {
            usage.input_tokens += r.usage.input_tokens;
            usage.output_tokens += r.usage.output_tokens;
        }
        DecisionEvent {
            decision_id: self.id.clone(),
            request_id: self.request_id.clone(),
            client_request_id: self.client_request_id.clone(),
            timestamp: event::rfc3339_ms(self.at),
            route: self.route.clone(),
            policy: None,
            shadow_of: None,
            bundle_revision: None,
            model: None,
            read_algorithm: READ_ALGORITHM_VERSION.to_string(),
            input: Value::Null,
            masked: Vec::new(),
            erased: Vec::new(),
            reads,
            result: None,
            error: None,
            status,
            usage,
            timings: EventTimings {
                total_ms: self.elapsed_ms(),
                read_ms,
            },
            limits_hit: Vec::new(),
            calibration: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn required(path: &Path, url: Option<String>) -> DecisionLogSettings {
        DecisionLogSettings {
            path: Some(path.to_path_buf()),
            required: true,
            url,
            ..Default::default()
        }
    }

    fn policy_event(log: &DecisionLog) -> DecisionEvent {
        let mut event = log.begin("/v1/policies/{name}", None, None).event(200);
        event.policy = Some(event::PolicyRef {
            name: "quiet".into(),
            version: "v".into(),
            sha256: "s".into(),
            declared_version: None,
            stage: "active".into(),
        });
        event
    }

    fn lines(path: &Path) -> usize {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .count()
    }

    #[tokio::test]
    async fn a_required_log_offers_the_collector_only_events_the_file_took() {
        let dir = tempfile::tempdir().unwrap();
        let (url, seen) = testing::recording_collector().await;
        let unwritable = dir.path().join("no-such-dir").join("d.ndjson");
        let log = DecisionLog::start(required(&unwritable, Some(url.clone()))).unwrap();
        let refused = log.write(policy_event(&log), None).await;
        assert!(
            matches!(refused, Err(FileSinkError::Failed(_))),
            "{refused:?}"
        );
        log.close(Duration::from_secs(5)).await;
        assert!(
            seen.lock().unwrap().is_empty(),
            "the collector got an unrecorded decision"
        );
        assert_eq!(log.stats.dropped_for("http", "unrecorded"), 1);

        let path = dir.path().join("d.ndjson");
        let log = DecisionLog::start(required(&path, Some(url))).unwrap();
        log.write(policy_event(&log), None).await.unwrap();
        log.close(Duration::from_secs(5)).await;
        assert_eq!(lines(&path), 1);
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_required_log_records_a_policy_that_asks_to_drop_its_events() {
        let dir = tempfile::tempdir().unwrap();
        let dropping = PolicyLogConfig {
            drop: true,
            mask: vec!["/input/secret".into()],
            ..Default::default()
        };
        let optional = dir.path().join("optional.ndjson");
        let log = DecisionLog::start(DecisionLogSettings {
            path: Some(optional.clone()),
            ..Default::default()
        })
        .unwrap();
        log.write(policy_event(&log), Some(&dropping))
            .await
            .unwrap();
        log.close(Duration::from_secs(5)).await;
        assert_eq!(
            lines(&optional),
            0,
            "drop = true drops when the log is optional"
        );

        let path = dir.path().join("required.ndjson");
        let log = DecisionLog::start(required(&path, None)).unwrap();
        let mut event = policy_event(&log);
        event.input = serde_json::json!({"secret": "s", "plain": 1});
        log.write(event, Some(&dropping)).await.unwrap();
        log.close(Duration::from_secs(5)).await;
        let text = std::fs::read_to_string(&path).unwrap();
        let written: Value = serde_json::from_str(text.trim()).unwrap();
        // Recorded, and still masked as the policy asks.
        assert_eq!(written["input"]["secret"], mask::MASKED);
        assert_eq!(written["input"]["plain"], 1);
    }
}
