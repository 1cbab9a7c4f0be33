//! The Hunch server: the System One API, readers, decision policies.

pub mod api;
pub mod policy;
