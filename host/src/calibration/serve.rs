//! Serving a calibration: a [`Reader`] that hands the answer math calibrated distributions for
//! the questions a calibration covers, and the calibrated distributions a decision records.

use super::file::Calibrations;
use crate::decision::event::{DecisionEvent, ReadEvent};
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

/// Records on a decision's event that its answers were computed with `calibrations`: the id, and
/// beside each read's raw distributions the calibrated ones (what `/v1/systemone` and a policy's
/// reads both answered from, so a replay can answer from them again).
pub fn record(event: &mut DecisionEvent, calibrations: &Calibrations) {
    event.calibration = Some(calibrations.id.clone());
    for read in &mut event.reads {
        if let Some(raw) = &read.distributions {
            read.calibrated = Some(calibrated(calibrations, &read.questions, raw));
        }
    }
}

/// The reads as they were served: each read's distributions replaced by the calibrated ones it
/// recorded (where a calibration covered the question), so answering from them again gives the
/// served answers bit for bit without the calibration file.
pub fn served_reads(reads: &[ReadEvent]) -> Vec<ReadEvent> {
    reads
        .iter()
        .map(|read| {
            let mut read = read.clone();
            if let (Some(raw), Some(calibrated)) = (&mut read.distributions, read.calibrated.take())
            {
                for (d, c) in raw.iter_mut().zip(calibrated) {
                    if let Some(c) = c {
                        *d = c;
                    }
                }
            }
            read
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
            kind: self.inner.info().kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::fixtures;

    fn calibration(temperature: f64) -> Calibrations {
        let file = serde_json::json!({
            "format": super::super::file::FORMAT, "folds": 5, "ece_bins": 10,
            "ece_binning": "", "min_labels": 30,
            "questions": [{"key": "", "ids": [], "question": fixtures::noul("urgent?"),
                "temperature": temperature, "labels": 0, "fold_temperatures": [],
                "before": metrics(), "after": metrics()}]
        });
        Calibrations::from_bytes(&serde_json::to_vec(&file).unwrap()).unwrap()
    }

    fn metrics() -> serde_json::Value {
        serde_json::json!({"nll": 0.0, "brier": 0.0, "ece": 0.0, "accuracy": 0.0, "bins": []})
    }

    #[test]
    fn a_record_keeps_raw_and_calibrated_and_served_reads_answer_with_the_calibrated() {
        let c = calibration(2.0);
        let mut event: DecisionEvent = serde_json::from_value(serde_json::json!({
            "decision_id": "d", "timestamp": "t", "route": "/v1/policies/{name}",
            "read_algorithm": "a", "status": 200
        }))
        .unwrap();
        event.reads.push(fixtures::read(
            vec![fixtures::noul("urgent?"), fixtures::noul("other?")],
            vec![vec![0.9, 0.1], vec![0.3, 0.7]],
        ));
        record(&mut event, &c);
        assert_eq!(event.calibration.as_deref(), Some(c.id.as_str()));
        let read = &event.reads[0];
        assert_eq!(read.distributions.as_ref().unwrap()[0].0, vec![0.9, 0.1]);
        let calibrated = read.calibrated.as_ref().unwrap();
        let expected = c
            .for_question(&fixtures::noul("urgent?"))
            .unwrap()
            .apply(&[0.9, 0.1]);
        assert_eq!(calibrated[0].as_ref().unwrap().0, expected);
        assert!(calibrated[1].is_none(), "not covered");
        let served = served_reads(&event.reads);
        let d = served[0].distributions.as_ref().unwrap();
        assert_eq!(d[0].0, expected);
        assert_eq!(d[1].0, vec![0.3, 0.7]);
        assert!(served[0].calibrated.is_none());
    }
}
