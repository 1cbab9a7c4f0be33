//! Support-ticket router: team, priority and SLA from one read; a second read (what kind of
//! escalation, refund or not) only when the first says the ticket may need escalating or the
//! team is unclear — most tickets cost one read.

use hunch_guest_sdk::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::json;

pub const TEAMS: [(&str, &str); 5] = [
    ("billing", "invoices, charges, refunds, plans"),
    ("technical", "bugs, errors, outages, integrations"),
    ("account", "login, access, profile, deletion"),
    ("sales", "quotes, upgrades, new contracts"),
    ("abuse", "spam, fraud, harassment reports"),
];

pub const URGENCY: [&str; 4] = ["low", "normal", "high", "critical"];
/// SLA hours per urgency level; the SLA is their expectation under the urgency distribution.
pub const SLA_HOURS: [f64; 4] = [72.0, 24.0, 8.0, 1.0];

pub const ESCALATIONS: [(&str, &str); 5] = [
    ("legal", "threatens legal action or mentions regulators"),
    ("outage", "a production outage or data loss"),
    ("security", "a breach, leaked credentials, a vulnerability"),
    ("churn", "threatens to cancel or move to a competitor"),
    ("none", "nothing that needs escalation"),
];

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ticket {
    pub subject: String,
    pub body: String,
    /// "free", "pro" or "enterprise".
    #[serde(default = "default_tier")]
    pub tier: String,
}

fn default_tier() -> String {
    "free".into()
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Route {
    pub team: String,
    pub team_confidence: f64,
    /// Expected urgency level, 0 (low) ..= 3 (critical).
    pub urgency: f64,
    pub sla_hours: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escalation: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refund_requested: Option<bool>,
    pub queue: String,
    /// How many question sets were read (1 or 2).
    pub reads: u32,
}

pub struct TicketRouter;

impl Policy for TicketRouter {
    type Input = Ticket;
    type Output = Route;

    fn describe() -> Describe {
        Describe::new(
            "ticket-router",
            env!("CARGO_PKG_VERSION"),
            "Routes a support ticket to a team and queue with an SLA; reads escalation details only when the first read calls for them.",
        )
        .input_schema(json!({
            "type": "object",
            "required": ["subject", "body"],
            "properties": {
                "subject": {"type": "string", "maxLength": 500},
                "body": {"type": "string", "maxLength": 50000},
                "tier": {"enum": ["free", "pro", "enterprise"]}
            }
        }))
        .output_schema(json!({
            "type": "object",
            "required": ["team", "urgency", "sla_hours", "queue", "reads"],
            "properties": {
                "team": {"enum": TEAMS.iter().map(|t| t.0).collect::<Vec<_>>()},
                "queue": {"type": "string"},
                "reads": {"type": "integer", "minimum": 1, "maximum": 2}
            }
        }))
    }

    fn decide(ticket: Ticket, host: &mut dyn Host) -> Result<Route, PolicyError> {
        let state = state_json(&json!({"subject": ticket.subject, "body": ticket.body}));
        let first = host.read(
            &QuestionSet::new(state.clone())
                .ask(choice("Which team should handle this ticket?", TEAMS).id("team"))
                .ask(score("How urgent is this ticket?", URGENCY).id("urgency"))
                .ask(
                    noul("Could this ticket need escalation (legal threat, outage, security incident, cancellation)?")
                        .id("escalate"),
                ),
        )?;
        let team = first.choice("team")?;
        let urgency = first.score("urgency")?;
        let p_escalate = first.noul("escalate")?;
        let mut sla = expected_value(&urgency.probabilities, &SLA_HOURS)
            .map_err(|e| PolicyError::Failed(e.to_string()))?;
        if ticket.tier == "enterprise" {
            sla /= 2.0;
        }

        let mut route = Route {
            team: team.choice.clone(),
            team_confidence: team.confidence,
            urgency: urgency.score,
            sla_hours: (sla * 10.0).round() / 10.0,
            escalation: None,
            refund_requested: None,
            queue: format!(
                "{}-{}",
                team.choice,
                if urgency.p_at_least(2).value() >= 0.5 {
                    "priority"
                } else {
                    "standard"
                }
            ),
            reads: 1,
        };

        // The second set is asked only when the first one calls for it.
        let unclear_team = team.confidence < 0.25;
        if p_escalate.value() >= 0.5 || unclear_team {
            host.log(
                Level::Debug,
                &format!(
                    "second read: p(escalate) = {:.2}, team confidence = {:.2}",
                    p_escalate.value(),
                    team.confidence
                ),
            );
            let second = host.read(
                &QuestionSet::new(state)
                    .ask(
                        choice(
                            "What kind of escalation does this ticket need?",
                            ESCALATIONS,
                        )
                        .id("escalation"),
                    )
                    .ask(noul("Does the customer ask for a refund or credit?").id("refund")),
            )?;
            route.reads = 2;
            let escalation = second.choice("escalation")?;
            let refund = second.noul("refund")?;
            route.refund_requested = Some(refund.value() >= 0.5);
            if escalation.choice != "none" && escalation.p("none").value() < 0.5 {
                route.queue = format!("escalations-{}", escalation.choice);
                route.sla_hours = route.sla_hours.min(4.0);
                route.escalation = Some(escalation.choice.clone());
            }
            if route.refund_requested == Some(true) && unclear_team {
                route.team = "billing".into();
            }
        }
        Ok(route)
    }
}

export_policy!(TicketRouter);

#[cfg(test)]
mod tests {
    use super::*;
    use hunch_guest_sdk::testing::ScriptedHost;

    fn ticket(tier: &str) -> Ticket {
        Ticket {
            subject: "Charged twice".into(),
            body: "My card was charged twice this month.".into(),
            tier: tier.into(),
        }
    }

    #[test]
    fn a_plain_ticket_costs_one_read() {
        let mut host = ScriptedHost::by_id(&[
            ("team", &[0.9, 0.05, 0.05, 0.0, 0.0]),
            ("urgency", &[0.1, 0.8, 0.1, 0.0]),
            ("escalate", &[0.1, 0.9]),
        ]);
        let r = TicketRouter::decide(ticket("pro"), &mut host).unwrap();
        assert_eq!(host.reads.len(), 1);
        assert_eq!(r.team, "billing");
        assert_eq!(r.queue, "billing-standard");
        assert_eq!(r.reads, 1);
        // E[SLA] = 0.1·72 + 0.8·24 + 0.1·8 = 27.2 h.
        assert!((r.sla_hours - 27.2).abs() < 1e-9);
    }

    #[test]
    fn escalation_signals_trigger_the_second_read() {
        let mut host = ScriptedHost::by_id(&[
            ("team", &[0.1, 0.8, 0.1, 0.0, 0.0]),
            ("urgency", &[0.0, 0.1, 0.3, 0.6]),
            ("escalate", &[0.9, 0.1]),
            ("escalation", &[0.05, 0.85, 0.05, 0.0, 0.05]),
            ("refund", &[0.2, 0.8]),
        ]);
        let r = TicketRouter::decide(ticket("enterprise"), &mut host).unwrap();
        assert_eq!(host.reads.len(), 2);
        assert_eq!(r.escalation.as_deref(), Some("outage"));
        assert_eq!(r.queue, "escalations-outage");
        assert!(r.sla_hours <= 4.0);
        assert_eq!(r.refund_requested, Some(false));
    }

    #[test]
    fn an_unclear_team_also_asks_again() {
        // Uniform answers: team confidence 0, so the second set is read.
        let mut host = ScriptedHost::by_id(&[("escalate", &[0.0, 1.0])]);
        let r = TicketRouter::decide(ticket("free"), &mut host).unwrap();
        assert_eq!(r.reads, 2);
    }
}
