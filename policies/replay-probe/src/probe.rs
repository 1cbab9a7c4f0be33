// Shared by `replay-probe` (v1) and `replay-probe-v2`, which differ only in `RULE`: the pair the
// decision-record tests replay against each other, where the flips a version change causes can
// be computed exactly from the recorded distributions.

use hunch_guest_sdk::prelude::*;
use serde_json::{json, Value};

/// How `urgent` is decided from p(urgent) and p(baseline).
pub enum Rule {
    /// p(urgent) ≥ 0.5.
    FixedThreshold,
    /// p(urgent) ≥ p(baseline).
    Baseline,
}

pub struct Probe;

impl Policy for Probe {
    type Input = Value;
    type Output = Value;

    fn describe() -> Describe {
        Describe::new(
            "replay-probe",
            env!("CARGO_PKG_VERSION"),
            "Is a message urgent? (decision-record tests)",
        )
        .input_schema(json!({
            "type": "object",
            "required": ["id", "message"],
            "properties": {"id": {"type": "integer"}, "message": {"type": "string"}}
        }))
        .output_schema(json!({"type": "object", "required": ["urgent", "p_urgent", "p_baseline"]}))
    }

    fn decide(input: Value, host: &mut dyn Host) -> Result<Value, PolicyError> {
        let message = input["message"].as_str().unwrap_or_default();
        let a = host.read(
            &QuestionSet::new(message.to_string())
                .ask(noul("Does this message need an answer today?").id("urgent"))
                .ask(noul("Is this a message?").id("baseline")),
        )?;
        let p = a.noul("urgent")?.value();
        let base = a.noul("baseline")?.value();
        let urgent = match RULE {
            Rule::FixedThreshold => p >= 0.5,
            Rule::Baseline => p >= base,
        };
        Ok(json!({"urgent": urgent, "p_urgent": p, "p_baseline": base}))
    }
}

export_policy!(Probe);
