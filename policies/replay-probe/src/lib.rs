//! Test-only: decides `urgent` with a fixed 0.5 threshold (see `probe.rs`).

include!("probe.rs");

const RULE: Rule = Rule::FixedThreshold;
