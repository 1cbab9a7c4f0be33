//! Serving a calibration: a [`Reader`] that hands the answer math calibrated distributions for
//! the questions a calibration covers, and the calibrated distributions a decision records.

use super::file::Calibrations;
use async_trait::async_trait;
use hunch_core::{
    LabelDistribution, Question, ReadError, ReadOutcome, ReadRequest, Reader, ReaderLimits,
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

    fn limits(&self) -> ReaderLimits {
        self.inner.limits()
    }

    fn fingerprint(&self) -> Option<String> {
        self.inner.fingerprint()
    }
}
