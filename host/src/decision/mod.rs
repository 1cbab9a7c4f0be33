//! Decision records: every `POST /v1/systemone` and every policy invocation is a *decision* with
//! an id (`x-hunch-decision-id`), and, with a decision log configured, one JSON event holding
//! everything needed to explain and replay it. See `docs/decision-records.md`.
//!
//! - [`event`]: the event's shape (written by the server, read by `hunch replay`).
//! - [`recorder`]: reads captured at the `Reader` boundary, and answered again from a record.
//! - [`mask`]: per-policy masking (`[decision_log]` in `NAME.toml`).
//! - [`sink`]: the NDJSON file and the HTTP collector.
//! - [`settings`]: flags, environment and TOML.
//! - [`replay`], [`replay_cli`]: `hunch replay`.
//! - [`rollout`], [`policy_run`]: candidate versions in shadow or canary, and their agreement.
//! - [`api`]: what the HTTP handlers call to begin and finish a decision.

pub mod api;
pub mod event;
pub mod mask;
pub mod policy_run;
pub mod recorder;
pub mod replay;
pub mod replay_cli;
pub mod rollout;
pub mod settings;
pub mod sink;

use event::{DecisionEvent, EventTimings, ModelRef, ReadEvent};
use hunch_core::{Reader, READ_ALGORITHM_VERSION};
use mask::PolicyLogConfig;
use recorder::{ReadLog, RecordingReader};
use serde_json::Value;
use settings::DecisionLogSettings;
use sink::file::{FileSink, FileSinkConfig, FileSinkError};
use sink::http::{HttpSink, HttpSinkConfig, HttpSinkError};
use sink::SinkStats;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
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
    http: Option<HttpSink>,
    pub stats: Arc<SinkStats>,
    pub rollouts: rollout::RolloutStats,
    /// The served models by name: an event names the fingerprint its model reports when the
    /// decision is written (a sidecar's changes when it restarts on another checkpoint).
    models: RwLock<BTreeMap<String, Arc<dyn Reader>>>,
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
            rollouts: Default::default(),
            models: RwLock::default(),
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
                },
                stats.clone(),
            )
        });
        let http = match &settings.url {
            Some(url) => Some(HttpSink::start(
                HttpSinkConfig {
                    url: url.clone(),
                    key: settings.url_key.clone(),
                    batch_bytes: settings.batch_bytes,
                    buffer: settings.buffer,
                },
                stats.clone(),
            )?),
            None => None,
        };
        if let Some(p) = &settings.path {
            tracing::info!(path = %p.display(), required = settings.required, "decision log file");
        }
        if let Some(u) = &settings.url {
            tracing::info!(url = %u, "decision log collector");
        }
        Ok(Arc::new(DecisionLog {
            settings,
            file,
            http,
            stats,
            rollouts: Default::default(),
            models: RwLock::default(),
        }))
    }

    pub fn settings(&self) -> &DecisionLogSettings {
        &self.settings
    }

    /// Whether events are written anywhere.
    pub fn enabled(&self) -> bool {
        self.file.is_some() || self.http.is_some()
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
            record: self.enabled(),
        }
    }

    /// Masks and writes an event. `Err` only when the log is required and the event could not
    /// be written to the file: the caller answers 503. Every other failure is counted and
    /// logged by the sink, never returned.
    pub async fn write(
        &self,
        mut event: DecisionEvent,
        policy: Option<&PolicyLogConfig>,
    ) -> Result<(), FileSinkError> {
        if !self.enabled() || policy.is_some_and(|p| p.drop) {
            return Ok(());
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
        let mut bytes = match serde_json::to_vec(&event) {
            Ok(b) => b,
            Err(e) => {
                // Cannot happen for these types; never fail a decision over it.
                self.stats
                    .dropped("all", "encode_failed", 1, &e.to_string());
                return Ok(());
            }
        };
        if let Some(http) = &self.http {
            http.submit(bytes.clone());
        }
        if let Some(file) = &self.file {
            bytes.push(b'\n');
            if self.settings.required {
                return file.write_flushed(bytes).await;
            }
            file.submit(bytes);
        }
        Ok(())
    }

    /// Writes what the sinks hold (the collector gets `grace`).
    pub async fn close(&self, grace: Duration) {
        if let Some(http) = &self.http {
            http.close(grace).await;
        }
        if let Some(file) = &self.file {
            file.close();
        }
    }

    /// The decision-log and rollout lines of `/metrics`.
    pub fn render_metrics(&self, out: &mut String) {
        self.stats.render(out);
        self.rollouts.render(out);
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
        }
    }
}
