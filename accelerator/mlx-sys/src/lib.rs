//! Raw bindings to mlx-c, built against a prebuilt MLX (see `docs/mlx-on-linux.md`).
//!
//! Same generated API as the published `mlx-sys` 0.7.0, so `mlx-rs` 0.33 builds on top of it
//! unchanged through `[patch.crates-io]`.
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]
#![allow(rustdoc::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// The MLX version these bindings are built for and link (the pin, in the file `MLX_VERSION`).
pub const MLX_VERSION: &str = env!("MLX_SYS_MLX_VERSION");

extern "C" {
    /// The distinct operations (primitives) reachable from `outputs[..count]` that are not
    /// evaluated yet: how much graph evaluating them runs (`shim/hunch_graph.cpp`). 0 on error.
    pub fn hunch_mlx_graph_operations(outputs: *const mlx_array, count: usize) -> usize;
}

/// mlx-rs 0.33 seeds its default random state with the macOS-only `mach_approximate_time`
/// (through `mach-sys`). Off macOS nothing provides that symbol, so we do: the value is only a
/// seed, so any monotonically increasing nanosecond count will do.
#[cfg(not(target_vendor = "apple"))]
#[no_mangle]
pub extern "C" fn mach_approximate_time() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
