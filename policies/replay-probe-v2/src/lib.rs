//! Test-only: `replay-probe` whose `urgent` threshold is a baseline question (see
//! `../replay-probe/src/probe.rs`).

include!("../../replay-probe/src/probe.rs");

const RULE: Rule = Rule::Baseline;
