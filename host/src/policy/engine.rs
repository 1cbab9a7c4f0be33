//! The one wasmtime `Engine` every policy shares: component model, fuel metering, a pooling
//! allocator sized for the server's concurrency, and wasmtime's on-disk compilation cache (a
//! restarted server, or a policy file touched without changing, compiles in ~1 ms instead of
//! ~100 ms).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use wasmtime::{
    Cache, CacheConfig, Config, Engine, InstanceAllocationStrategy, OptLevel,
    PoolingAllocationConfig, RegallocAlgorithm,
};

/// How the engine is built. Chosen at startup; changing it needs a restart.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Invocations (and `describe` calls) running at once; also sizes the instance pool.
    pub max_concurrent: u32,
    /// Largest linear memory any policy may ask for (the pool's slot size).
    pub max_memory_bytes: u64,
    /// Wasm stack per invocation: deep recursion traps past this.
    pub max_wasm_stack_bytes: usize,
    /// `Some(dir)`: wasmtime's compilation cache there; `None`: no cache.
    pub cache_dir: Option<PathBuf>,
    /// Cranelift's optimisation level. Policies are glue around reads; compile latency is what
    /// a hot reload waits for, so the default favours fast compiles.
    pub opt_level: OptLevel,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            max_concurrent: 64,
            max_memory_bytes: 256 << 20,
            max_wasm_stack_bytes: 512 << 10,
            cache_dir: default_cache_dir(),
            opt_level: OptLevel::None,
        }
    }
}

/// `$XDG_CACHE_HOME/hunch/wasmtime` or `~/.cache/hunch/wasmtime`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("hunch").join("wasmtime"))
}

#[derive(Debug, thiserror::Error)]
#[error("cannot build the policy engine: {0}")]
pub struct EngineError(String);

/// Cores of a component produced by `wasm32-wasip2` Rust: the main module plus the shims
/// wit-component adds; generous so odd toolchains still fit.
const CORE_INSTANCES_PER_COMPONENT: u32 = 16;

/// The wasm stack size of the engine last built, so a stack-overflow error can say what the
/// limit was (wasmtime's trap does not carry it). One engine per process in practice.
static WASM_STACK_BYTES: AtomicU64 = AtomicU64::new(0);

pub(crate) fn wasm_stack_bytes() -> u64 {
    WASM_STACK_BYTES.load(Ordering::Relaxed)
}

pub fn build_engine(settings: &EngineSettings) -> Result<Engine, EngineError> {
    WASM_STACK_BYTES.store(settings.max_wasm_stack_bytes as u64, Ordering::Relaxed);
    let mut config = Config::new();
    config.wasm_component_model(true);
    // Fuel, not epochs: a deterministic CPU budget that does not charge a policy for the time
    // its reads take. Wall-clock deadlines are a tokio timeout around the invocation; guests
    // yield to tokio every so often (see `invoke`) so the timeout can fire inside a loop.
    config.consume_fuel(true);
    config.max_wasm_stack(settings.max_wasm_stack_bytes);
    config.cranelift_opt_level(settings.opt_level);
    // Reload latency is a cold compile: the single-pass register allocator compiles in linear
    // time (slightly more spills in code that mostly waits for reads), and no address map is
    // kept (trap reports name limits, not native offsets).
    config.cranelift_regalloc_algorithm(RegallocAlgorithm::SinglePass);
    config.generate_address_map(false);

    let n = settings.max_concurrent.max(1);
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(n)
        .total_core_instances(n * CORE_INSTANCES_PER_COMPONENT)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(2)
        .total_memories(n * 2)
        .total_tables(n * 4)
        .total_stacks(n)
        .max_memory_size(settings.max_memory_bytes as usize);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    // Reserve only what a slot may use instead of wasmtime's 4 GiB per memory: the pool then
    // fits in a modest address space (bounds checks come back; policies are not memory-bound).
    config.memory_reservation(settings.max_memory_bytes);

    if let Some(dir) = &settings.cache_dir {
        let mut cache_config = CacheConfig::new();
        cache_config.with_directory(dir.clone());
        // The cache only saves time: an unwritable cache directory must not stop the server.
        match Cache::new(cache_config) {
            Ok(cache) => {
                config.cache(Some(cache));
            }
            Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "no compilation cache"),
        }
    }
    match Engine::new(&config) {
        Ok(engine) => Ok(engine),
        Err(pooled) => {
            // The pool reserves its address space up front; where that is refused (strict
            // overcommit, small ulimit -v) fall back to allocating instances on demand: slower
            // instantiation, same limits.
            tracing::warn!(error = %pooled, "pooling allocator unavailable; instances allocated on demand");
            config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
            Engine::new(&config).map_err(|e| EngineError(e.to_string()))
        }
    }
}
