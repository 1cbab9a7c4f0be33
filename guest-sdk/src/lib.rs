//! # hunch-guest-sdk
//!
//! Write a Hunch decision policy in one short Rust file: ask typed System One questions about
//! states derived from a JSON input, combine the calibrated probabilities soundly, return a JSON
//! decision. The crate compiles to a WebAssembly component (`wasm32-wasip2`) exporting the
//! `hunch:policy/policy` world; on the native target the same policy code runs against a
//! [`testing::ScriptedHost`] in ordinary unit tests.
//!
//! ```ignore
//! use hunch_guest_sdk::prelude::*;
//!
//! struct Refund;
//! impl Policy for Refund {
//!     type Input = serde_json::Value;
//!     type Output = serde_json::Value;
//!     fn describe() -> Describe {
//!         Describe::new("refund", env!("CARGO_PKG_VERSION"), "Refund or not")
//!     }
//!     fn decide(input: Self::Input, host: &mut dyn Host) -> Result<Self::Output, PolicyError> {
//!         let a = host.read(&QuestionSet::new(state_json(&input)).ask(noul("Refund due?").id("due")))?;
//!         Ok(serde_json::json!({ "refund": a.noul("due")?.value() > 0.8 }))
//!     }
//! }
//! export_policy!(Refund);
//! ```

// Lets generated code name this crate by its absolute path, from inside it too.
extern crate self as hunch_guest_sdk;

pub mod answer;
pub mod policy;
pub mod prob;
pub mod question;

#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod wasm;

pub use answer::{Answer, AnswerLookupError, AnswerValue, Answers, ChoiceAnswer, ScoreAnswer};
pub use policy::{
    decide_json, state_json, Describe, Host, Level, Policy, PolicyError, ReadError, ReadErrorKind,
};
pub use prob::{
    all, all_independent, any, any_independent, expected_value, Bounds, Prob, Threshold, Verdict,
};
pub use question::{choice, noul, score, ChoiceOption, Question, QuestionKind, QuestionSet};

/// Everything a policy file needs.
pub mod prelude {
    pub use crate::answer::{Answers, ChoiceAnswer, ScoreAnswer};
    pub use crate::export_policy;
    pub use crate::policy::{
        state_json, Describe, Host, Level, Policy, PolicyError, ReadError, ReadErrorKind,
    };
    pub use crate::prob::{
        all, all_independent, any, any_independent, expected_value, Bounds, Prob, Threshold,
        Verdict,
    };
    pub use crate::question::{choice, noul, score, Question, QuestionSet};
}

/// Exports a [`Policy`] as the component's `describe` and `decide`. Expands to nothing on the
/// native target, so the same file builds for unit tests.
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __HunchPolicyExport;
            impl $crate::wasm::bindings::Guest for __HunchPolicyExport {
                fn describe() -> $crate::wasm::bindings::hunch::policy::types::Descriptor {
                    $crate::wasm::describe::<$policy>()
                }
                fn decide(
                    input: ::std::string::String,
                ) -> ::std::result::Result<
                    ::std::string::String,
                    $crate::wasm::bindings::hunch::policy::types::PolicyError,
                > {
                    $crate::wasm::decide::<$policy>(&input)
                }
            }
            $crate::wasm::bindings::__export_policy_world!(
                __HunchPolicyExport with_types_in $crate::wasm::bindings
            );
        };
    };
}
