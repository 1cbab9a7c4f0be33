//! `hunch replay --calibration NEW.json`: which recorded decisions (`/v1/systemone`, and the reads
//! of policy decisions) a calibration would change. Each recorded read's raw distributions are
//! calibrated with the new file and compared with what was served (the recorded calibrated
//! distribution, else the raw one). For what a policy would then decide, replay it with the new
//! file named in its `NAME.toml` (docs/calibration.md).

use super::file::Calibrations;
use crate::decision::event::DecisionEvent;
use hunch_core::answer::argmax;
use hunch_core::{LabelDistribution, Question, QuestionKind};
use serde::Serialize;

/// What a new calibration does to recorded decisions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalibrationReplay {
    /// The new calibration's id.
    pub calibration: String,
    /// Decisions (`/v1/systemone` and policies', not shadow runs) with at least one recorded
    /// distribution.
    pub decisions: usize,
    /// Answers (one question of one read) compared.
    pub answers: usize,
    /// Answers the new calibration covers.
    pub covered: usize,
    /// Largest change of any probability.
    pub max_probability_move: f64,
    /// Answers whose most likely label (a noul's side, a choice's option, a score's level) flips.
    pub flips: Vec<Flip>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Flip {
    pub decision_id: String,
    /// The caller's id of the question (the request's, or the one a policy gave it), when the
    /// read recorded it: with `decision_id`, what a label of this answer names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub question_id: Option<String>,
    pub instructions: String,
    /// The most likely label as served and as the new calibration would serve it.
    pub served: String,
    pub replayed: String,
}

fn label_name(question: &Question, index: usize) -> String {
    match &question.kind {
        QuestionKind::Noul { .. } => (index == 0).to_string(),
        QuestionKind::Choice { options } => options
            .get(index)
            .map_or_else(|| index.to_string(), |o| o.name.clone()),
        QuestionKind::Score { .. } => index.to_string(),
    }
}

/// Replays `calibrations` over `events`.
pub fn replay(events: &[DecisionEvent], calibrations: &Calibrations) -> CalibrationReplay {
    let mut out = CalibrationReplay {
        calibration: calibrations.id.clone(),
        decisions: 0,
        answers: 0,
        covered: 0,
        max_probability_move: 0.0,
        flips: Vec::new(),
    };
    let replayed = |e: &&DecisionEvent| {
        e.shadow_of.is_none() && (e.route == "/v1/systemone" || e.policy.is_some())
    };
    for event in events.iter().filter(replayed) {
        let mut any = false;
        for read in &event.reads {
            let Some(raw) = &read.distributions else {
                continue;
            };
            for (j, (question, raw)) in read.questions.iter().zip(raw).enumerate() {
                any = true;
                out.answers += 1;
                let served: &LabelDistribution = read
                    .calibrated
                    .as_ref()
                    .and_then(|c| c.get(j))
                    .and_then(Option::as_ref)
                    .unwrap_or(raw);
                let served = normalised(served.probabilities());
                let replayed = match calibrations.for_question(question) {
                    Some(c) => {
                        out.covered += 1;
                        c.apply(raw.probabilities())
                    }
                    None => normalised(raw.probabilities()),
                };
                let moved = served
                    .iter()
                    .zip(&replayed)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                out.max_probability_move = out.max_probability_move.max(moved);
                let (a, b) = (argmax(&served), argmax(&replayed));
                if a != b {
                    out.flips.push(Flip {
                        decision_id: event.decision_id.clone(),
                        question_id: (read.question_ids.len() == read.questions.len())
                            .then(|| read.question_ids[j].0.clone()),
                        instructions: question.instructions.clone(),
                        served: label_name(question, a),
                        replayed: label_name(question, b),
                    });
                }
            }
        }
        out.decisions += usize::from(any);
    }
    out
}

fn normalised(p: &[f64]) -> Vec<f64> {
    let total: f64 = p.iter().sum();
    if total > 0.0 && total.is_finite() {
        p.iter().map(|x| x / total).collect()
    } else {
        p.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::file::{CalibrationFile, QuestionCalibration, FORMAT};
    use crate::calibration::fixtures;
    use hunch_core::calibration::measure;

    fn calibration(offsets: Option<Vec<f64>>) -> Calibrations {
        let m = measure(&[(vec![0.5, 0.5], 0)]).unwrap();
        let file = CalibrationFile {
            format: FORMAT.into(),
            folds: 5,
            ece_bins: 10,
            ece_binning: String::new(),
            min_labels: 30,
            questions: vec![QuestionCalibration {
                key: String::new(),
                ids: vec![],
                question: fixtures::noul("urgent?"),
                temperature: 1.0,
                offsets,
                labels: 0,
                fold_temperatures: vec![],
                before: m.clone(),
                after: m,
                cut_points: vec![],
            }],
            refused: vec![],
            overall: None,
            problems: vec![],
        };
        Calibrations::from_bytes(&serde_json::to_vec(&file).unwrap()).unwrap()
    }

    fn event(id: &str, p_yes: f64) -> DecisionEvent {
        let mut e: DecisionEvent = serde_json::from_value(serde_json::json!({
            "decision_id": id, "timestamp": "t", "route": "/v1/systemone",
            "read_algorithm": "a", "status": 200
        }))
        .unwrap();
        e.reads.push(fixtures::read(
            vec![fixtures::noul("urgent?")],
            vec![vec![p_yes, 1.0 - p_yes]],
        ));
        e
    }

    #[test]
    fn only_answers_whose_most_likely_label_moves_are_flips() {
        // An offset of +1 nat towards "no": 0.6 yes becomes about 0.36, 0.9 stays yes.
        let c = calibration(Some(vec![0.0, 1.0]));
        let mut a = event("a", 0.6);
        a.reads[0].question_ids = vec![hunch_core::QuestionId("urgent".into())];
        let r = replay(&[a, event("b", 0.9)], &c);
        assert_eq!((r.decisions, r.answers, r.covered), (2, 2, 2));
        assert_eq!(r.flips.len(), 1);
        assert_eq!(r.flips[0].decision_id, "a");
        assert_eq!(r.flips[0].question_id.as_deref(), Some("urgent"));
        assert_eq!(
            (r.flips[0].served.as_str(), r.flips[0].replayed.as_str()),
            ("true", "false")
        );
        assert!(r.max_probability_move > 0.2);
        // The identity changes nothing.
        let r = replay(&[event("a", 0.6)], &calibration(None));
        assert!(
            replay(&[event("a", 0.6)], &c).flips[0]
                .question_id
                .is_none(),
            "an older log"
        );
        assert!(r.flips.is_empty() && r.max_probability_move < 1e-12);
    }
}
