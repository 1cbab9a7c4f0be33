//! The vocabulary of the read's remedies (`x_prior`, `x_order`): which are asked for, by name.
//! Their arithmetic is `debias` ([`crate::DebiasingReader`]); the names live apart so that the
//! read options (`reader`) can carry them without importing the reader that applies them.

use serde::{Deserialize, Serialize};

/// Whether a question's prior is divided out (`x_prior`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PriorMode {
    /// The model's distribution as read.
    #[default]
    None,
    /// Divided by the distribution read about a content-free state (`crate::debias`), renormalised.
    Divide,
}

/// In which orders a question's options are read (`x_order`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderMode {
    /// The request's order only.
    #[default]
    AsGiven,
    /// The request's order and its reverse, averaged.
    ReversedAverage,
    /// `min(n, MAX_CYCLIC_SHIFTS)` cyclic shifts spread evenly over the `n` options, averaged.
    CyclicAverage,
}

impl PriorMode {
    pub const NAMES: &'static [&'static str] = &["divide", "none"];

    pub fn as_str(self) -> &'static str {
        match self {
            PriorMode::None => "none",
            PriorMode::Divide => "divide",
        }
    }

    pub fn is_none(&self) -> bool {
        *self == PriorMode::None
    }
}

impl OrderMode {
    pub const NAMES: &'static [&'static str] = &["as_given", "reversed_average", "cyclic_average"];

    pub fn as_str(self) -> &'static str {
        match self {
            OrderMode::AsGiven => "as_given",
            OrderMode::ReversedAverage => "reversed_average",
            OrderMode::CyclicAverage => "cyclic_average",
        }
    }

    pub fn is_as_given(&self) -> bool {
        *self == OrderMode::AsGiven
    }
}

/// A name that is not one of a mode's values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{given}` (expected {expected})")]
pub struct UnknownMode {
    pub what: &'static str,
    pub given: String,
    pub expected: String,
}

fn unknown(what: &'static str, given: &str, names: &[&str]) -> UnknownMode {
    UnknownMode {
        what,
        given: given.to_string(),
        expected: names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(" or "),
    }
}

impl std::str::FromStr for PriorMode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(PriorMode::None),
            "divide" => Ok(PriorMode::Divide),
            other => Err(unknown("prior", other, PriorMode::NAMES)),
        }
    }
}

impl std::str::FromStr for OrderMode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "as_given" => Ok(OrderMode::AsGiven),
            "reversed_average" => Ok(OrderMode::ReversedAverage),
            "cyclic_average" => Ok(OrderMode::CyclicAverage),
            other => Err(unknown("order", other, OrderMode::NAMES)),
        }
    }
}
