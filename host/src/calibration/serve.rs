//! Serving a calibration: a [`Reader`] that hands the answer math calibrated distributions for
//! the questions a calibration covers, and the calibrated distributions a decision records.

use super::file::Calibrations;
use async_trait::async_trait;
use hunch_core::{
    LabelDistribution, Question, ReadError, ReadOutcome, ReadRequest, Reader, ReaderInfo,
};
use std::sync::Arc;

/// Per question of a read, the calibrated distribution (`None` where no calibration covers the
/// question). The one function serving and decision records both use, so what is recorded is
/// what was answered, bit for bit.
pub fn calibrated(
    calibrations: &Calibrations,
    questions: &[Question],
    raw: &[LabelDistribution],
) -> Vec<Option<LabelDistribution>> {
    questions
        .iter()
        .zip(raw)
        .map(|(q, d)| {
            calibrations
                .for_question(q)
                .map(|c| LabelDistribution(c.apply(d.probabilities())))
        })
        .collect()
}

/// The calibration being served, swapped whole when its file changes: a request takes the
/// current one once and keeps it for all its reads and its record.
#[derive(Debug, Default)]
pub struct CalibrationSlot {
    current: std::sync::RwLock<Option<Arc<Calibrations>>>,
}

impl CalibrationSlot {
    pub fn new(calibrations: Option<Calibrations>) -> CalibrationSlot {
        CalibrationSlot {
            current: std::sync::RwLock::new(calibrations.map(Arc::new)),
        }
    }

    pub fn current(&self) -> Option<Arc<Calibrations>> {
        // A poisoned lock only means a writer panicked mid-swap of one `Option<Arc>`; the value
        // is still whole, so it is read anyway.
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn swap(&self, calibrations: Calibrations) {
        let new = Some(Arc::new(calibrations));
        match self.current.write() {
            Ok(mut g) => *g = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }
}

/// Polls `path` every `every` and swaps in its calibration when its bytes change; a file that
/// does not load (half written, broken) leaves the served one in place and is logged.
pub async fn watch(
    slot: Arc<CalibrationSlot>,
    path: std::path::PathBuf,
    every: std::time::Duration,
) {
    let mut last_refused: Option<String> = None;
    loop {
        tokio::time::sleep(every).await;
        let Ok(bytes) = tokio::fs::read(&path).await else {
            continue;
        };
        let id = super::file_id(&bytes);
        let current = slot.current().map(|c| c.id.clone());
        if current.as_deref() == Some(id.as_str()) || last_refused.as_deref() == Some(id.as_str()) {
            continue;
        }
        match Calibrations::from_bytes(&bytes) {
            Ok(c) => {
                tracing::info!(id = %c.id, questions = c.len(), "calibration reloaded");
                slot.swap(c);
                last_refused = None;
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "calibration file refused; the served one stays");
                last_refused = Some(id);
            }
        }
    }
}

/// Wraps a reader (the decision's recording reader, so the record keeps the raw distributions)
/// and calibrates what it answers.
pub struct CalibratingReader {
    pub inner: Arc<dyn Reader>,
    pub calibrations: Arc<Calibrations>,
}

#[async_trait]
impl Reader for CalibratingReader {
    fn model_name(&self) -> &str {
        self.inner.model_name()
    }

    async fn read(&self, request: ReadRequest) -> Result<ReadOutcome, ReadError> {
        let questions = request.questions.clone();
        let mut outcome = self.inner.read(request).await?;
        let calibrated = calibrated(&self.calibrations, &questions, &outcome.distributions);
        for (d, c) in outcome.distributions.iter_mut().zip(calibrated) {
            if let Some(c) = c {
                *d = c;
            }
        }
        Ok(outcome)
    }

    async fn ready(&self) -> bool {
        self.inner.ready().await
    }

    /// The inner reader's limits; no fingerprint, so its answers are never cached: a cached
    /// answer would outlive a reloaded calibration (docs/calibration.md).
    fn info(&self) -> ReaderInfo {
        ReaderInfo {
            limits: self.inner.info().limits,
            fingerprint: None,
        }
    }
}
