//! Where reads go. The raw System One API and the policies both ask a [`ModelEntry`]'s gated
//! reader; which reader serves which model name (and which aliases point at it) is configuration.
//!
//! - [`accelerator`]: the client of an accelerator sidecar (`POST /read`).
//! - [`sidecar`]: starts and supervises a sidecar process and reads through its client.
//! - [`upstream`]: any other System One server, by URL and key.
//! - [`models`]: many models under one memory budget: discovery, the eviction choice, measured
//!   resident sizes.
//! - [`manager`]: the one owner of this server's sidecars: loads on first request, evicts,
//!   unloads idle models, and its [`manager::ModelsView`] snapshot.
//! - [`ReadGate`]: the bounded queue in front of every reader (503 + `Retry-After` when full).

pub mod accelerator;
pub mod manager;
pub mod models;
pub mod sidecar;
pub mod upstream;

use crate::metrics::Metrics;
use hunch_core::{ReadError, ReadOutcome, ReadRequest, Reader};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, SemaphorePermit};

pub use hunch_core::AnswerSettings;

/// The alias every client may use for the default (first) model.
pub const DEFAULT_ALIAS: &str = "jev-latest";

/// A served model: its real name, what `/v1/models` says about it, and its reader.
#[derive(Clone)]
pub struct ModelEntry {
    pub name: String,
    pub description: String,
    pub release_date: String,
    pub reader: Arc<dyn Reader>,
}

impl std::fmt::Debug for ModelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelEntry")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Readers by model name, plus aliases. The first model is the default (`jev-latest`).
#[derive(Debug, Default, Clone)]
pub struct Registry {
    models: Vec<ModelEntry>,
    /// (alias, target model name), in configuration order.
    aliases: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RegistryError {
    #[error("model {0:?} is configured twice")]
    Duplicate(String),
    #[error("alias {alias:?} points at {target:?}, which is not a configured model")]
    UnknownTarget { alias: String, target: String },
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, entry: ModelEntry) -> Result<(), RegistryError> {
        if self.resolve(&entry.name).is_some() {
            return Err(RegistryError::Duplicate(entry.name));
        }
        self.models.push(entry);
        Ok(())
    }

    /// Adds `alias` → `target`. An alias never shadows a real model name.
    pub fn alias(&mut self, alias: &str, target: &str) -> Result<(), RegistryError> {
        if self.models.iter().any(|m| m.name == alias) {
            return Err(RegistryError::Duplicate(alias.to_string()));
        }
        if !self.models.iter().any(|m| m.name == target) {
            return Err(RegistryError::UnknownTarget {
                alias: alias.into(),
                target: target.into(),
            });
        }
        self.aliases.retain(|(a, _)| a != alias);
        self.aliases.push((alias.into(), target.into()));
        Ok(())
    }

    /// Adds `alias` → `target` where `target` is served by the model manager (a model of a
    /// models directory), which the registry does not hold.
    pub fn alias_managed(&mut self, alias: &str, target: &str) -> Result<(), RegistryError> {
        if self.models.iter().any(|m| m.name == alias) {
            return Err(RegistryError::Duplicate(alias.to_string()));
        }
        self.aliases.retain(|(a, _)| a != alias);
        self.aliases.push((alias.into(), target.into()));
        Ok(())
    }

    /// The model an alias points at, as configured (`None` for a name that is no alias).
    pub fn alias_target(&self, alias: &str) -> Option<&str> {
        self.aliases
            .iter()
            .find(|(a, _)| a == alias)
            .map(|(_, t)| t.as_str())
    }

    /// The model a request's `model` names: a real name first, then an alias; `jev-latest` is the
    /// default model unless configured otherwise.
    pub fn resolve(&self, name: &str) -> Option<&ModelEntry> {
        if let Some(m) = self.models.iter().find(|m| m.name == name) {
            return Some(m);
        }
        if let Some((_, target)) = self.aliases.iter().find(|(a, _)| a == name) {
            return self.models.iter().find(|m| &m.name == target);
        }
        if name == DEFAULT_ALIAS {
            return self.models.first();
        }
        None
    }

    pub fn models(&self) -> &[ModelEntry] {
        &self.models
    }

    /// Every alias with its target, `jev-latest` first when it points at the default model.
    pub fn aliases(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !self.aliases.iter().any(|(a, _)| a == DEFAULT_ALIAS)
            && !self.models.iter().any(|m| m.name == DEFAULT_ALIAS)
        {
            if let Some(first) = self.models.first() {
                out.push((DEFAULT_ALIAS.to_string(), first.name.clone()));
            }
        }
        out.extend(self.aliases.iter().cloned());
        out
    }
}

/// The bounded queue in front of the readers: at most `slots` reads run at once, at most
/// `max_waiting` more wait; beyond that a read is refused at once with `Unavailable`, which the API
/// answers 503 + `Retry-After` (a retry may succeed, so a 5xx is right).
///
/// Background reads (a shadow candidate's) yield to live ones: one is admitted only while no live
/// read waits and a slot is free, at most a quarter of the slots run them at once, and they wait
/// outside the live queue, so they never count against its bound.
#[derive(Debug)]
pub struct ReadGate {
    slots: Semaphore,
    waiting: AtomicUsize,
    max_waiting: usize,
    /// Background reads running at once.
    background: Semaphore,
    /// Woken whenever a slot is given back, for background reads waiting for one.
    released: tokio::sync::Notify,
    metrics: Arc<Metrics>,
}

/// How a read is admitted to the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// A client is waiting for it.
    Live,
    /// A shadow run's: it waits while live reads need the slots.
    Background,
}

/// A slot of the gate, given back (and waiting background reads woken) when dropped.
pub struct Admitted<'a> {
    gate: &'a ReadGate,
    _slot: SemaphorePermit<'a>,
    _background: Option<SemaphorePermit<'a>>,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        // The slot is released after this body; a woken reader that finds it still taken waits
        // for the next release or its short recheck below.
        self.gate.released.notify_waiters();
    }
}

/// How long a waiting background read sleeps at most before looking again (a release it missed
/// between its check and its wait costs at most this).
const BACKGROUND_RECHECK: Duration = Duration::from_millis(20);

impl ReadGate {
    pub fn new(slots: usize, max_waiting: usize, metrics: Arc<Metrics>) -> Self {
        let slots = slots.max(1);
        ReadGate {
            slots: Semaphore::new(slots),
            waiting: AtomicUsize::new(0),
            max_waiting,
            background: Semaphore::new((slots / 4).max(1)),
            released: tokio::sync::Notify::new(),
            metrics,
        }
    }

    /// Takes a slot for a read of `priority`.
    pub async fn admit(&self, priority: Priority) -> Result<Admitted<'_>, ReadError> {
        match priority {
            Priority::Live => Ok(Admitted {
                gate: self,
                _slot: self.enter().await?,
                _background: None,
            }),
            Priority::Background => self.enter_background().await,
        }
    }

    /// A background read's slot: only while no live read waits, never in the live queue.
    async fn enter_background(&self) -> Result<Admitted<'_>, ReadError> {
        let background = self.background.acquire().await.map_err(|_| {
            ReadError::unavailable("the server is shutting down", Duration::from_secs(1))
        })?;
        loop {
            let released = self.released.notified();
            if self.waiting.load(Ordering::Acquire) == 0 {
                if let Ok(slot) = self.slots.try_acquire() {
                    return Ok(Admitted {
                        gate: self,
                        _slot: slot,
                        _background: Some(background),
                    });
                }
            }
            let _ = tokio::time::timeout(BACKGROUND_RECHECK, released).await;
        }
    }

    /// Takes a slot, waiting in the queue if it has room.
    pub async fn enter(&self) -> Result<SemaphorePermit<'_>, ReadError> {
        if let Ok(permit) = self.slots.try_acquire() {
            return Ok(permit);
        }
        // Reserve a place in the queue; refuse if it is full.
        let reserved = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w < self.max_waiting).then_some(w + 1)
            });
        if reserved.is_err() {
            return Err(ReadError::unavailable(
                "the server is overloaded: the read queue is full",
                Duration::from_secs(1),
            ));
        }
        self.metrics.queue_depth(1);
        // Decrements the queue count however this future ends (acquired, or dropped by a timeout).
        struct Leave<'a>(&'a ReadGate);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.waiting.fetch_sub(1, Ordering::AcqRel);
                self.0.metrics.queue_depth(-1);
            }
        }
        let _leave = Leave(self);
        self.slots.acquire().await.map_err(|_| {
            ReadError::unavailable("the server is shutting down", Duration::from_secs(1))
        })
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

/// A reader behind the gate, recording metrics. What the API and the policies call.
///
/// A model of the [`manager::ModelManager`] is leased *before* the gate: a read waiting for its
/// model to load holds no read slot, so it never delays reads of models already loaded.
pub struct GatedReader {
    name: String,
    inner: Arc<dyn Reader>,
    managed: Option<Arc<manager::ModelManager>>,
    gate: Arc<ReadGate>,
    metrics: Arc<Metrics>,
    priority: Priority,
}

impl GatedReader {
    pub fn new(entry: &ModelEntry, gate: Arc<ReadGate>, metrics: Arc<Metrics>) -> Self {
        GatedReader {
            name: entry.name.clone(),
            inner: entry.reader.clone(),
            managed: None,
            gate,
            metrics,
            priority: Priority::Live,
        }
    }

    /// The reader of `name`, a model of `manager`.
    pub fn managed(
        name: &str,
        manager: &Arc<manager::ModelManager>,
        gate: Arc<ReadGate>,
        metrics: Arc<Metrics>,
    ) -> Self {
        GatedReader {
            name: name.to_string(),
            inner: Arc::new(manager.reader(name)),
            managed: Some(manager.clone()),
            gate,
            metrics,
            priority: Priority::Live,
        }
    }

    /// The same reader, admitted to the gate at `priority`.
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }
}

#[async_trait::async_trait]
impl Reader for GatedReader {
    fn model_name(&self) -> &str {
        &self.name
    }

    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        let lease = match &self.managed {
            Some(manager) => Some(manager.lease(&self.name).await.map_err(|e| {
                self.metrics
                    .record_read(&self.name, "refused", 0, Duration::ZERO);
                e.into_read_error()
            })?),
            None => None,
        };
        let _admitted = self.gate.admit(self.priority).await.inspect_err(|_| {
            self.metrics
                .record_read(&self.name, "refused", 0, Duration::ZERO);
        })?;
        self.metrics.reads_in_flight(1);
        struct Done<'a>(&'a Metrics);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.reads_in_flight(-1);
            }
        }
        let _done = Done(&self.metrics);
        let started = Instant::now();
        let result = match &lease {
            Some(lease) => lease.read(request).await,
            None => self.inner.read(request).await,
        };
        let (outcome, draws) = match &result {
            Ok(o) => {
                self.metrics.record_read_stats(&self.name, &o.stats);
                ("ok", o.stats.draws)
            }
            Err(e) => (e.kind().as_str(), 0),
        };
        self.metrics
            .record_read(&self.name, outcome, draws, started.elapsed());
        result
    }

    async fn ready(&self) -> bool {
        self.inner.ready().await
    }

    fn info(&self) -> hunch_core::ReaderInfo {
        self.inner.info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(&'static str);

    #[async_trait::async_trait]
    impl Reader for Fixed {
        fn model_name(&self) -> &str {
            self.0
        }
        async fn read(&self, _r: ReadRequest) -> Result<ReadOutcome, ReadError> {
            Err(ReadError::internal("unused"))
        }
        fn info(&self) -> hunch_core::ReaderInfo {
            hunch_core::ReaderInfo::unknown()
        }
    }

    fn entry(name: &'static str) -> ModelEntry {
        ModelEntry {
            name: name.into(),
            description: String::new(),
            release_date: String::new(),
            reader: Arc::new(Fixed(name)),
        }
    }

    #[test]
    fn jev_latest_is_the_first_model_and_aliases_resolve() {
        let mut r = Registry::new();
        r.add(entry("a")).unwrap();
        r.add(entry("b")).unwrap();
        r.alias("fast", "b").unwrap();
        assert_eq!(r.resolve("jev-latest").map(|m| m.name.as_str()), Some("a"));
        assert_eq!(r.resolve("fast").map(|m| m.name.as_str()), Some("b"));
        assert!(r.resolve("nope").is_none());
        assert!(r.add(entry("a")).is_err());
        assert!(r.alias("x", "nope").is_err());
        assert_eq!(
            r.aliases(),
            vec![
                ("jev-latest".into(), "a".into()),
                ("fast".into(), "b".into())
            ]
        );
    }

    /// A model that knows its limits and its fingerprint.
    struct Known;

    #[async_trait::async_trait]
    impl Reader for Known {
        fn model_name(&self) -> &str {
            "known"
        }
        async fn read(&self, _r: ReadRequest) -> Result<ReadOutcome, ReadError> {
            Err(ReadError::internal("unused"))
        }
        fn info(&self) -> hunch_core::ReaderInfo {
            hunch_core::ReaderInfo {
                limits: hunch_core::ReaderLimits {
                    max_prompt_tokens: Some(123),
                    max_token_bytes: Some(7),
                    max_request_bytes: Some(4567),
                    ..Default::default()
                },
                fingerprint: Some("known-model/bfloat16/read-x".into()),
                kind: None,
            }
        }
    }

    /// Every reader in the host that wraps another (the gate, a decision's recorder, the replay
    /// and shadow book, the answer cache) reports the inner reader's limits and fingerprint: a wrapper that
    /// dropped them would switch the answer cache and the host's own size checks off.
    #[test]
    fn every_wrapper_reports_its_inner_readers_limits_and_fingerprint() {
        use crate::decision::recorder::{BookReader, ReadBook, ReadLog, RecordingReader};
        let inner: Arc<dyn Reader> = Arc::new(Known);
        let expected = inner.info();
        assert!(expected.fingerprint.is_some());
        let metrics = Arc::new(Metrics::new());
        let gate = Arc::new(ReadGate::new(1, 1, metrics.clone()));
        let entry = ModelEntry {
            name: "known".into(),
            description: String::new(),
            release_date: String::new(),
            reader: inner.clone(),
        };
        let wrappers: Vec<(&str, Arc<dyn Reader>)> = vec![
            (
                "GatedReader",
                Arc::new(GatedReader::new(&entry, gate, metrics)),
            ),
            (
                "RecordingReader",
                Arc::new(RecordingReader::new(
                    inner.clone(),
                    ReadLog::default(),
                    false,
                )),
            ),
            (
                "BookReader",
                Arc::new(BookReader::new(
                    "known",
                    ReadBook::default(),
                    Some(inner.clone()),
                )),
            ),
            (
                "CachingReader",
                Arc::new(hunch_core::CachingReader::new(
                    inner.clone(),
                    Arc::new(hunch_core::AnswerCache::new(1 << 20)),
                )),
            ),
        ];
        for (name, wrapper) in &wrappers {
            assert_eq!(wrapper.info(), expected, "{name}");
        }
        // Wrappers of wrappers too (a recorded read through the gate, a shadow's book over it).
        let stacked: Arc<dyn Reader> = Arc::new(RecordingReader::new(
            Arc::new(BookReader::new(
                "known",
                ReadBook::default(),
                Some(wrappers[0].1.clone()),
            )),
            ReadLog::default(),
            true,
        ));
        assert_eq!(stacked.info(), expected);
        // A book without a model knows nothing: no fingerprint, so nothing is cached.
        let alone = BookReader::new("known", ReadBook::default(), None);
        assert_eq!(alone.info(), hunch_core::ReaderInfo::unknown());
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let gate = Arc::new(ReadGate::new(1, 1, Arc::new(Metrics::new())));
        let first = gate.enter().await.unwrap();
        // One may wait…
        let g2 = gate.clone();
        let second = tokio::spawn(async move { g2.enter().await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(gate.waiting(), 1);
        // …the next is refused.
        assert!(matches!(
            gate.enter().await,
            Err(ReadError::Unavailable { .. })
        ));
        drop(first);
        assert!(second.await.unwrap().is_ok());
        assert_eq!(gate.waiting(), 0);
    }

    /// Defect: shadow reads queued with live reads and could push them into 503 "queue full".
    #[tokio::test]
    async fn background_reads_wait_for_live_ones_and_never_fill_the_live_queue() {
        let gate = Arc::new(ReadGate::new(1, 1, Arc::new(Metrics::new())));
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let running = gate.admit(Priority::Live).await.unwrap();
        let spawn = |priority: Priority, label: &'static str| {
            let (g, order) = (gate.clone(), order.clone());
            tokio::spawn(async move {
                let admitted = g.admit(priority).await?;
                order.lock().unwrap().push(label);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(admitted);
                Ok::<_, ReadError>(())
            })
        };
        // Background reads waiting for the slot are not in the live queue...
        let background: Vec<_> = (0..3)
            .map(|_| spawn(Priority::Background, "background"))
            .collect();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(gate.waiting(), 0);
        // ...so a live read still finds room to wait, and gets the slot before them.
        let live = spawn(Priority::Live, "live");
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(gate.waiting(), 1);
        drop(running);
        assert!(live.await.unwrap().is_ok());
        for b in background {
            assert!(b.await.unwrap().is_ok());
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["live", "background", "background", "background"]
        );
        assert_eq!(gate.waiting(), 0);
    }
}
