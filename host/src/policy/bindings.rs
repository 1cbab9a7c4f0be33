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
