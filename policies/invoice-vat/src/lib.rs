//! Invoice VAT check: approve / hold / reject an incoming invoice.
//!
//! The arithmetic is checked exactly (no model needed for sums). The model reads the invoice for
//! what arithmetic cannot see: whether VAT is applied correctly for what was sold (noul), which
//! VAT treatment applies (choice, compared with the treatment the invoice claims) and how
//! anomalous the invoice looks (score). "VAT correct" and "treatment matches" come from the same
//! read of the same text, so they are combined with Fréchet bounds, not as if independent.

use hunch_guest_sdk::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::json;

pub const TREATMENTS: [(&str, &str); 5] = [
    (
        "standard",
        "the standard VAT rate of the supplier's country",
    ),
    ("reduced", "a reduced rate (food, books, transport, ...)"),
    ("zero", "zero-rated (exports outside the EU, ...)"),
    (
        "exempt",
        "exempt supplies (insurance, medical, education, ...)",
    ),
    (
        "reverse_charge",
        "cross-border B2B within the EU: the customer accounts for VAT",
    ),
];

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Party {
    pub name: String,
    pub country: String,
    #[serde(default)]
    pub vat_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Line {
    pub description: String,
    pub net: f64,
    pub vat_rate: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Invoice {
    pub supplier: Party,
    pub customer: Party,
    pub lines: Vec<Line>,
    pub total_net: f64,
    pub total_vat: f64,
    /// The treatment the invoice claims, one of [`TREATMENTS`].
    pub vat_treatment: String,
    #[serde(default)]
    pub notes: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approve,
    Hold,
    Reject,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub decision: Decision,
    pub reasons: Vec<String>,
    /// Bounds on P(VAT applied correctly ∧ claimed treatment is the right one).
    pub p_correct: [f64; 2],
    pub predicted_treatment: String,
    /// Expected anomaly level, 0 (low) ..= 2 (high).
    pub risk: f64,
}

pub struct InvoiceVat;

/// Cents: invoices are rounded per document, so allow one cent per line.
fn tolerance(lines: usize) -> f64 {
    0.01 * (lines.max(1) as f64)
}

impl Policy for InvoiceVat {
    type Input = Invoice;
    type Output = Outcome;

    fn describe() -> Describe {
        Describe::new(
            "invoice-vat",
            env!("CARGO_PKG_VERSION"),
            "Checks an invoice's VAT (arithmetic, treatment, anomalies) and approves, holds or rejects it with reasons.",
        )
        .input_schema(json!({
            "type": "object",
            "required": ["supplier", "customer", "lines", "total_net", "total_vat", "vat_treatment"],
            "properties": {
                "supplier": {"$ref": "#/$defs/party"},
                "customer": {"$ref": "#/$defs/party"},
                "lines": {"type": "array", "minItems": 1, "maxItems": 200, "items": {
                    "type": "object",
                    "required": ["description", "net", "vat_rate"],
                    "properties": {
                        "description": {"type": "string", "maxLength": 2000},
                        "net": {"type": "number"},
                        "vat_rate": {"type": "number", "minimum": 0, "maximum": 1}
                    }
                }},
                "total_net": {"type": "number"},
                "total_vat": {"type": "number"},
                "vat_treatment": {"enum": TREATMENTS.iter().map(|t| t.0).collect::<Vec<_>>()},
                "notes": {"type": ["string", "null"], "maxLength": 4000}
            },
            "$defs": {"party": {
                "type": "object",
                "required": ["name", "country"],
                "properties": {
                    "name": {"type": "string"},
                    "country": {"type": "string", "minLength": 2, "maxLength": 2},
                    "vat_id": {"type": ["string", "null"]}
                }
            }}
        }))
        .output_schema(json!({
            "type": "object",
            "required": ["decision", "reasons", "p_correct", "predicted_treatment", "risk"],
            "properties": {
                "decision": {"enum": ["approve", "hold", "reject"]},
                "reasons": {"type": "array", "items": {"type": "string"}},
                "p_correct": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
                "predicted_treatment": {"type": "string"},
                "risk": {"type": "number"}
            }
        }))
    }

    fn decide(invoice: Invoice, host: &mut dyn Host) -> Result<Outcome, PolicyError> {
        let mut reasons = Vec::new();
        let mut arithmetic_ok = true;
        let tol = tolerance(invoice.lines.len());
        let net: f64 = invoice.lines.iter().map(|l| l.net).sum();
        let vat: f64 = invoice.lines.iter().map(|l| l.net * l.vat_rate).sum();
        if (net - invoice.total_net).abs() > tol {
            arithmetic_ok = false;
            reasons.push(format!(
                "lines add up to {net:.2} net, the invoice says {:.2}",
                invoice.total_net
            ));
        }
        if (vat - invoice.total_vat).abs() > tol {
            arithmetic_ok = false;
            reasons.push(format!(
                "line VAT adds up to {vat:.2}, the invoice says {:.2}",
                invoice.total_vat
            ));
        }

        let set = QuestionSet::new(state_json(&invoice))
            .ask(
                noul("Is VAT applied correctly on this invoice for what is being sold, between these parties and countries?")
                    .id("vat_correct")
                    .yes("every line has the VAT rate and treatment the law requires for that supply")
                    .no("some line has a wrong rate, or VAT is charged or omitted wrongly"),
            )
            .ask(choice("Which VAT treatment should this invoice use?", TREATMENTS).id("treatment"))
            .ask(
                score(
                    "How anomalous does this invoice look (fraud, missing VAT ids, odd descriptions, round amounts)?",
                    ["low", "medium", "high"],
                )
                .id("risk"),
            );
        let answers = host.read(&set)?;
        let p_vat = answers.noul("vat_correct")?;
        let treatment = answers.choice("treatment")?;
        let risk = answers.score("risk")?;
        // A treatment read with little confidence says nothing about the match: the interval
        // [0, 1] (unknown), not its small uniform share, which would look like evidence against.
        let p_match = if treatment.confidence >= 0.3 {
            treatment.p(&invoice.vat_treatment).exact()
        } else {
            Bounds {
                lo: Prob::ZERO,
                hi: Prob::ONE,
            }
        };
        let correct = p_vat.exact().and(p_match);
        let p_high_risk = risk.p_at_least(2);

        // Approve only when even the pessimistic end of the interval is convincing.
        let verdict = Threshold::new(0.75, 0.25)
            .map_err(|e| PolicyError::Failed(e.to_string()))?
            .decide_bounds(correct);
        let risky = Threshold::new(0.6, 0.2)
            .map_err(|e| PolicyError::Failed(e.to_string()))?
            .decide(p_high_risk);

        if verdict == Verdict::No {
            reasons.push(format!(
                "VAT looks wrong: P(correct and {}) is at most {:.2}; the model expects {}",
                invoice.vat_treatment,
                correct.hi.value(),
                treatment.choice
            ));
        }
        if verdict == Verdict::Abstain {
            reasons.push(format!(
                "VAT correctness unclear: P in [{:.2}, {:.2}]",
                correct.lo.value(),
                correct.hi.value()
            ));
        }
        match risky {
            Verdict::Yes => reasons.push(format!(
                "high anomaly risk (P = {:.2})",
                p_high_risk.value()
            )),
            Verdict::Abstain => reasons.push(format!(
                "some anomaly risk (P(high) = {:.2})",
                p_high_risk.value()
            )),
            Verdict::No => {}
        }

        let decision = if !arithmetic_ok || verdict == Verdict::No || risky == Verdict::Yes {
            Decision::Reject
        } else if verdict == Verdict::Yes && risky == Verdict::No {
            reasons.push("arithmetic checks out, VAT treatment confirmed, low risk".into());
            Decision::Approve
        } else {
            Decision::Hold
        };
        host.log(
            Level::Info,
            &format!("invoice from {}: {decision:?}", invoice.supplier.name),
        );
        Ok(Outcome {
            decision,
            reasons,
            p_correct: [correct.lo.value(), correct.hi.value()],
            predicted_treatment: treatment.choice.clone(),
            risk: risk.score,
        })
    }
}

export_policy!(InvoiceVat);

#[cfg(test)]
mod tests {
    use super::*;
    use hunch_guest_sdk::testing::ScriptedHost;

    fn invoice() -> Invoice {
        serde_json::from_value(json!({
            "supplier": {"name": "Acme GmbH", "country": "DE", "vat_id": "DE123456789"},
            "customer": {"name": "Blue SARL", "country": "FR", "vat_id": "FR12345678901"},
            "lines": [{"description": "consulting, 10 h", "net": 1000.0, "vat_rate": 0.0}],
            "total_net": 1000.0,
            "total_vat": 0.0,
            "vat_treatment": "reverse_charge"
        }))
        .unwrap()
    }

    fn run(invoice: Invoice, host: &mut ScriptedHost) -> Outcome {
        InvoiceVat::decide(invoice, host).unwrap()
    }

    #[test]
    fn confident_correct_low_risk_is_approved_with_one_read() {
        let mut host = ScriptedHost::by_id(&[
            ("vat_correct", &[0.97, 0.03]),
            ("treatment", &[0.01, 0.0, 0.01, 0.0, 0.98]),
            ("risk", &[0.9, 0.08, 0.02]),
        ]);
        let out = run(invoice(), &mut host);
        assert_eq!(out.decision, Decision::Approve, "{:?}", out.reasons);
        assert_eq!(host.reads.len(), 1);
        assert_eq!(host.questions_asked(), 3);
        assert!(out.p_correct[0] > 0.9);
    }

    #[test]
    fn wrong_treatment_is_rejected() {
        let mut host = ScriptedHost::by_id(&[
            ("vat_correct", &[0.1, 0.9]),
            ("treatment", &[0.9, 0.0, 0.05, 0.0, 0.05]),
            ("risk", &[0.9, 0.08, 0.02]),
        ]);
        let out = run(invoice(), &mut host);
        assert_eq!(out.decision, Decision::Reject);
        assert_eq!(out.predicted_treatment, "standard");
    }

    #[test]
    fn bad_arithmetic_is_rejected_whatever_the_model_says() {
        let mut inv = invoice();
        inv.total_net = 1200.0;
        let mut host = ScriptedHost::by_id(&[
            ("vat_correct", &[0.99, 0.01]),
            ("treatment", &[0.0, 0.0, 0.0, 0.0, 1.0]),
            ("risk", &[1.0, 0.0, 0.0]),
        ]);
        let out = run(inv, &mut host);
        assert_eq!(out.decision, Decision::Reject);
        assert!(out.reasons[0].contains("1200.00"));
    }

    #[test]
    fn uncertainty_holds() {
        // Uniform answers: nothing is known, so the invoice waits for a human.
        let mut host = ScriptedHost::by_id(&[]);
        assert_eq!(run(invoice(), &mut host).decision, Decision::Hold);
    }

    #[test]
    fn bad_json_is_invalid_input() {
        let mut host = ScriptedHost::by_id(&[]);
        let err =
            hunch_guest_sdk::decide_json::<InvoiceVat>("{\"lines\": 3}", &mut host).unwrap_err();
        assert!(matches!(err, PolicyError::InvalidInput(_)));
    }
}
