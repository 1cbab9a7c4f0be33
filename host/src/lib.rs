//! The Hunch server: TypeSafe's System One API over HTTP in front of pluggable readers.
//!
//! - [`api`]: routes, validation, errors, middleware ([`api::router`], [`api::AppState`]).
//! - [`reader`]: which reader serves which model, and the bounded queue in front of them.
//! - [`config`]: `hunch` flags, environment and TOML file.
//! - [`server`]: `hunch serve`: listening and graceful shutdown.
//! - [`decision`]: decision ids, the decision log, replay, shadow and canary candidates.
//! - [`policy`]: WebAssembly decision policies: runtime, limits, registry, hot reload.
//! - [`quality`]: the quality reports `scripts/quality.sh` stores, found for a model's fingerprint.

pub mod api;
pub mod calibration;
pub mod cli;
pub mod config;
pub mod decision;
pub mod http_url;
pub mod metrics;
pub mod policy;
pub mod quality;
pub mod reader;
pub mod server;

pub use api::{router, router_with, AppState};
