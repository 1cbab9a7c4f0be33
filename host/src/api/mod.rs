//! HTTP API.

pub mod policies;
