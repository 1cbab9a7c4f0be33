//! What a policy can ask the host for, one capability per module (Spin's "factors"): each owns
//! its per-invocation state and implements its WIT interface, so the runtime core never grows a
//! switch over them. A component importing anything else (WASI filesystem, sockets, clocks,
//! environment) links against trapping stubs: calling one fails the invocation.

pub mod log;
pub mod read;

pub use log::{LogCapability, LogLine};
pub use read::{ReadCapability, ReadRecord};
