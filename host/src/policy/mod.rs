//! Decision policies: sandboxed WebAssembly components (`wit/policy.wit`) that turn a JSON input
//! into a JSON decision by asking typed questions through the host's readers.
//!
//! - [`engine`]: the shared wasmtime engine (component model, fuel, pooling, compile cache).
//! - [`limits`]: per-invocation limits and the typed error for breaking one.
//! - [`capabilities`]: what a guest may call (`read`, `log`), one module each.
//! - [`calibration`]: which calibration a version's reads are calibrated with (`NAME.toml`).
//! - [`invoke`]: a loaded version (compiled once, `InstancePre`) and its invocation.
//! - [`readers`]: where policies' reads go (the server's readers by name).
//! - [`registry`] / [`watch`]: the versions being served, from a directory or the API; hot reload.
//! - [`bundle`]: signed policy bundles a fleet pulls (the whole set, atomically).
//! - [`rollout`]: candidate versions in shadow or canary, shadow runs, agreement.
//! - [`replay`]: recorded decisions run again through a version (`hunch replay`).

pub mod bindings;
pub mod bundle;
pub mod calibration;
pub mod capabilities;
pub mod engine;
pub mod invoke;
pub mod limits;
pub mod readers;
pub mod registry;
pub mod replay;
pub mod rollout;
pub mod scaffold;
/// Test support (a reader that answers at once, the policies built for tests): compiled only
/// into this crate's unit tests and, through the `testing` feature, into the test and benchmark
/// builds that ask for it; never into the server.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod watch;

pub use engine::{build_engine, EngineSettings};
pub use invoke::{Invocation, InvokeError, LoadError, LoadedPolicy, PolicyConfig};
pub use limits::{Limit, LimitExceeded, Limits};
pub use readers::{ReaderSource, StaticReaders};
pub use registry::{Admission, Capacity, PolicySummary, Registry, RegistryError, ShadowSlot};
pub use watch::{watch, PolicyWatcher};
