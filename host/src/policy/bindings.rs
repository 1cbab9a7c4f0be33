//! Host bindings of the `hunch:policy/policy` world (`wit/policy.wit`).
//!
//! Imports are `async` (a read awaits the host's reader) and `trappable` (a broken limit stops
//! the whole invocation with a typed error instead of handing the guest an error it could
//! ignore). Exports are `async` so a guest runs on a fiber and yields to tokio while it computes
//! (fuel-based yielding), which is what lets the wall-clock timeout interrupt an endless loop.
wasmtime::component::bindgen!({
    path: "../wit",
    world: "policy",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub use self::hunch::policy::types;

use hunch_core::ReadErrorKind;

/// The WIT `read-error-kind` is `hunch_core::ReadErrorKind` on the wire: a guest's read failure
/// comes back as the core kind, a read error goes to the guest as the WIT one.
impl From<types::ReadErrorKind> for ReadErrorKind {
    fn from(kind: types::ReadErrorKind) -> Self {
        use types::ReadErrorKind as Wit;
        match kind {
            Wit::InvalidQuestion => Self::InvalidQuestion,
            Wit::TooLarge => Self::TooLarge,
            Wit::Unavailable => Self::Unavailable,
            Wit::Timeout => Self::Timeout,
            Wit::Rejected => Self::Rejected,
            Wit::Internal => Self::Internal,
        }
    }
}

impl From<ReadErrorKind> for types::ReadErrorKind {
    fn from(kind: ReadErrorKind) -> Self {
        match kind {
            ReadErrorKind::InvalidQuestion => Self::InvalidQuestion,
            ReadErrorKind::TooLarge => Self::TooLarge,
            ReadErrorKind::Unavailable => Self::Unavailable,
            ReadErrorKind::Timeout => Self::Timeout,
            ReadErrorKind::Rejected => Self::Rejected,
            ReadErrorKind::Internal => Self::Internal,
        }
    }
}
