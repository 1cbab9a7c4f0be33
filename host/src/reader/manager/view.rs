//! What the model manager shows: [`ModelsView`], one consistent snapshot of every model (what
//! `GET /v1/models` lists and an operator console can call), and its `/metrics` lines.

use super::{ModelManager, Phase, Reason};
use crate::reader::sidecar::SidecarStatus;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

/// Where a model stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelState {
    /// Known, not loaded: its first read loads it.
    Available,
    /// Its sidecar is starting or reading its checkpoint.
    Loading,
    Loaded,
    /// Reads in flight finish, then its process ends.
    Unloading,
    /// Its load failed, or (a pinned model) its sidecar is restarting: `error` says why.
    Failed,
}

impl ModelState {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Available => "available",
            ModelState::Loading => "loading",
            ModelState::Loaded => "loaded",
            ModelState::Unloading => "unloading",
            ModelState::Failed => "failed",
        }
    }
}

/// One model, as of the snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelView {
    pub name: String,
    pub path: PathBuf,
    pub state: ModelState,
    /// 0–1 while loading.
    pub progress: Option<f64>,
    /// While loading: the seconds it has left (`models::load_eta`), when they can be told.
    pub load_seconds_left: Option<f64>,
    /// Why it failed.
    pub error: Option<String>,
    /// Its load was refused (its files or settings), so its reads get a 4xx, not a 503.
    pub refused: bool,
    /// The checkpoint's tensor bytes plus the runtime overhead learnt so far: what a load
    /// reserves before it is measured.
    pub estimated_bytes: u64,
    /// Measured (`VmRSS`) while its process runs.
    pub resident_bytes: Option<u64>,
    pub pinned: bool,
    pub reads_in_flight: usize,
    /// Seconds until its idle TTL unloads it (loaded, unpinned and idle).
    pub ttl_left_seconds: Option<f64>,
    /// RFC 3339, the end of its last read.
    pub last_used: Option<String>,
    /// Left out of listings (its settings say `hidden`), still served by name.
    pub hidden: bool,
    /// Its settings from its models directory's `hunch-models.toml` (an object, unset keys left
    /// out).
    pub settings: serde_json::Value,
    /// Why its table in that file was not applied (it keeps the settings it had).
    pub settings_error: Option<String>,
}

/// Every model the manager knows, and the budget they share.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelsView {
    pub budget_bytes: u64,
    /// What the loaded and loading models hold against the budget now.
    pub used_bytes: u64,
    /// What a sidecar holds beyond its checkpoint, learnt from measurements.
    pub overhead_bytes: u64,
    /// Sorted by name.
    pub models: Vec<ModelView>,
    /// What the models directories hold that is no model, and why.
    pub skipped: Vec<(PathBuf, String)>,
}

impl ModelsView {
    pub fn model(&self, name: &str) -> Option<&ModelView> {
        self.models.iter().find(|m| m.name == name)
    }
}

/// Loads, load time and evictions, for `/metrics`.
#[derive(Debug, Default)]
pub(super) struct Counters(Mutex<CounterValues>);

#[derive(Debug, Default)]
struct CounterValues {
    /// (model, outcome) → loads.
    loads: BTreeMap<(String, &'static str), u64>,
    load_seconds_sum: f64,
    load_seconds_count: u64,
    evictions: BTreeMap<Reason, u64>,
}

impl Counters {
    fn with(&self, f: impl FnOnce(&mut CounterValues)) {
        let mut values = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut values);
    }

    pub(super) fn loaded(&self, model: &str, ok: bool, seconds: f64) {
        self.with(|v| {
            let outcome = if ok { "ok" } else { "failed" };
            *v.loads.entry((model.to_string(), outcome)).or_default() += 1;
            if ok {
                v.load_seconds_sum += seconds;
                v.load_seconds_count += 1;
            }
        });
    }

    pub(super) fn evicted(&self, reason: Reason) {
        self.with(|v| *v.evictions.entry(reason).or_default() += 1);
    }
}

impl ModelManager {
    /// A snapshot of every model: what the API lists and a console shows.
    pub fn view(&self) -> ModelsView {
        let now = Instant::now();
        let inner = self.lock();
        let overhead = inner.overhead;
        let mut used = 0;
        let models = inner
            .models
            .iter()
            .map(|(name, slot)| {
                used += slot.held(overhead);
                let (mut state, mut progress, mut error) = (ModelState::Available, None, None);
                let mut refused = false;
                match &slot.phase {
                    Phase::Available => {}
                    Phase::Loading { sidecar } => {
                        state = ModelState::Loading;
                        progress = Some(sidecar.as_deref().map_or(0.0, super::lease::progress));
                    }
                    Phase::Loaded { sidecar } => match sidecar.status() {
                        SidecarStatus::Ready => state = ModelState::Loaded,
                        SidecarStatus::Starting => {
                            state = ModelState::Loading;
                            progress = Some(0.0);
                        }
                        SidecarStatus::Loading { progress: p, .. } => {
                            state = ModelState::Loading;
                            progress = Some(p.clamp(0.0, 1.0));
                        }
                        SidecarStatus::Down {
                            message,
                            refused: why_refused,
                        } => {
                            state = ModelState::Failed;
                            error = Some(message);
                            refused = why_refused;
                        }
                    },
                    Phase::Unloading { .. } => state = ModelState::Unloading,
                    Phase::Failed {
                        why,
                        refused: why_refused,
                        ..
                    } => {
                        state = ModelState::Failed;
                        error = Some(why.clone());
                        refused = *why_refused;
                    }
                }
                let running = matches!(
                    slot.phase,
                    Phase::Loaded { .. } | Phase::Unloading { .. } | Phase::Loading { .. }
                );
                let ttl_left_seconds = match (&slot.phase, slot.expires) {
                    (Phase::Loaded { .. }, Some(expires))
                        if !slot.pinned && slot.in_flight == 0 =>
                    {
                        Some(expires.saturating_duration_since(now).as_secs_f64())
                    }
                    _ => None,
                };
                let load_seconds_left = if state == ModelState::Loading {
                    super::lease::loading(slot, &inner.pace).1
                } else {
                    None
                };
                ModelView {
                    name: name.clone(),
                    path: slot.path.clone(),
                    state,
                    progress,
                    load_seconds_left,
                    error,
                    refused,
                    estimated_bytes: slot.estimated_bytes + overhead,
                    // Read now, not as of the last tick: a figure a client compares with
                    // `/proc` must be the process's own (a dead one's is none).
                    resident_bytes: if running {
                        running_sidecar(&slot.phase).and_then(|s| s.resident_bytes())
                    } else {
                        None
                    },
                    pinned: slot.pinned,
                    reads_in_flight: slot.in_flight,
                    ttl_left_seconds,
                    last_used: slot
                        .last_used
                        .map(|(_, at)| hunch_core::date::rfc3339_ms(at)),
                    hidden: slot.settings.hidden,
                    settings: slot.settings.to_json(),
                    settings_error: slot.settings_error.clone(),
                }
            })
            .collect();
        ModelsView {
            budget_bytes: self.settings.budget_bytes,
            used_bytes: used,
            overhead_bytes: overhead,
            models,
            skipped: inner
                .skipped
                .iter()
                .map(|s| (s.path.clone(), s.why.clone()))
                .collect(),
        }
    }
}

/// The process a model's sidecar runs in, if one is running or starting.
fn running_sidecar(phase: &Phase) -> Option<&crate::reader::sidecar::Sidecar> {
    match phase {
        Phase::Loaded { sidecar } | Phase::Unloading { sidecar, .. } => Some(sidecar),
        Phase::Loading { sidecar } => sidecar.as_deref(),
        Phase::Available | Phase::Failed { .. } => None,
    }
}

impl crate::metrics::MetricsSource for ModelManager {
    fn render_metrics(&self, out: &mut String) {
        use crate::metrics::{escape, family};
        let view = self.view();
        family(
            out,
            "hunch_model_budget_bytes",
            "gauge",
            "The memory budget all loaded models share (--memory-budget).",
        );
        let _ = writeln!(out, "hunch_model_budget_bytes {}", view.budget_bytes);
        family(
            out,
            "hunch_model_used_bytes",
            "gauge",
            "What loaded and loading models hold against the budget: measured, else estimated.",
        );
        let _ = writeln!(out, "hunch_model_used_bytes {}", view.used_bytes);
        family(
            out,
            "hunch_model_resident_bytes",
            "gauge",
            "What each model's sidecar process holds resident (VmRSS), measured; 0 while none runs.",
        );
        for m in &view.models {
            let _ = writeln!(
                out,
                "hunch_model_resident_bytes{{model=\"{}\"}} {}",
                escape(&m.name),
                m.resident_bytes.unwrap_or(0)
            );
        }
        family(
            out,
            "hunch_model_loaded",
            "gauge",
            "1 for each model whose sidecar is loaded and ready.",
        );
        for m in &view.models {
            let _ = writeln!(
                out,
                "hunch_model_loaded{{model=\"{}\"}} {}",
                escape(&m.name),
                u8::from(m.state == ModelState::Loaded)
            );
        }
        let values = self.counters.0.lock().unwrap_or_else(|e| e.into_inner());
        family(
            out,
            "hunch_model_loads_total",
            "counter",
            "Loads of models on demand, by outcome (pinned models are started, not counted).",
        );
        for ((model, outcome), n) in &values.loads {
            let _ = writeln!(
                out,
                "hunch_model_loads_total{{model=\"{}\",outcome=\"{outcome}\"}} {n}",
                escape(model)
            );
        }
        family(
            out,
            "hunch_model_load_seconds",
            "summary",
            "Seconds from starting a sidecar to its model being ready, successful loads.",
        );
        let _ = writeln!(
            out,
            "hunch_model_load_seconds_sum {}\nhunch_model_load_seconds_count {}",
            values.load_seconds_sum, values.load_seconds_count
        );
        family(
            out,
            "hunch_model_evictions_total",
            "counter",
            "Models unloaded, by reason: budget, ttl, keep_alive, admin, removed, died.",
        );
        for reason in [
            Reason::Budget,
            Reason::Ttl,
            Reason::KeepAlive,
            Reason::Admin,
            Reason::Removed,
            Reason::Died,
        ] {
            let _ = writeln!(
                out,
                "hunch_model_evictions_total{{reason=\"{}\"}} {}",
                reason.as_str(),
                values.evictions.get(&reason).copied().unwrap_or(0)
            );
        }
    }
}
