//! How much memory a loaded model takes, worked out before anything is allocated, and the
//! refusal when it would not fit (docs/checkpoint-layouts.md, "The dtype each weight is held in,
//! and memory").
//!
//! MLX's CPU and CUDA backends copy every weight into their own memory when the array is made
//! (only Metal can wrap the mapped file), so the whole model counts: the weights kept as stored
//! and the copies converted at load (bf16 widened to float32 for float32 activations).

use std::path::PathBuf;

use mlx_rs::Dtype;

use super::arrays::{element_size, mlx_dtype};
use super::layout::Checkpoint;
use super::mapped::held_dtype;

/// What loading a checkpoint with given activations takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes of tensor data the model uses, as stored.
    pub stored: u64,
    /// Of those, the bytes kept in their stored dtype.
    pub mapped: u64,
    /// Bytes of the converted copies made at load.
    pub allocated: u64,
    /// The largest single stored tensor that is converted (read while its copy is written).
    pub largest_converted: u64,
    /// The largest single stored tensor the model uses: the bound on what loading or a read
    /// may hold beyond the loaded weights (docs/checkpoint-layouts.md, "Transient memory").
    pub largest: u64,
}

impl MemoryPlan {
    /// What the loaded model holds: kept as stored plus converted.
    pub fn resident(&self) -> u64 {
        self.mapped + self.allocated
    }

    /// The plan for `checkpoint`'s model tensors with `activation` dtype.
    pub fn of(checkpoint: &Checkpoint, activation: Dtype) -> Self {
        let mut plan = MemoryPlan {
            stored: 0,
            mapped: 0,
            allocated: 0,
            largest_converted: 0,
            largest: 0,
        };
        for module in checkpoint.module_names() {
            let Some(r) = checkpoint.module_ref(module) else {
                continue;
            };
            for (name, kind) in r.parts() {
                let Some(view) = checkpoint.tensors().get(name) else {
                    continue;
                };
                let bytes = view.bytes.len() as u64;
                plan.stored += bytes;
                plan.largest = plan.largest.max(bytes);
                let Some(stored) = mlx_dtype(view.dtype) else {
                    continue;
                };
                let held = held_dtype(kind, stored, activation);
                if held == stored {
                    plan.mapped += bytes;
                } else {
                    plan.allocated += view.numel() as u64 * element_size(held) as u64;
                    plan.largest_converted = plan.largest_converted.max(bytes);
                }
            }
        }
        plan
    }
}

/// Where the memory figure a load is checked against came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitSource {
    /// The `memory_limit` setting (`--memory-limit`, `HUNCH_MEMORY_LIMIT`).
    Setting,
    /// What the OS reports available (Linux `MemAvailable`, capped by the cgroup's limit).
    Available(PathBuf),
    /// The machine's physical memory (macOS `hw.memsize`).
    Physical,
}

impl std::fmt::Display for LimitSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitSource::Setting => f.write_str("the memory limit set (--memory-limit)"),
            LimitSource::Available(p) => write!(f, "the memory available ({})", p.display()),
            LimitSource::Physical => f.write_str("the machine's memory (hw.memsize)"),
        }
    }
}

/// The refusal: the converted weights would not fit.
#[derive(Debug, thiserror::Error)]
pub struct TooLarge {
    /// The checkpoint.
    pub dir: PathBuf,
    /// The `--dtype` the load asked for: `float32` or `bfloat16` (on the CPU bfloat16 holds
    /// bf16 weights under float32 activations, so the dtype is named, not the activations').
    pub activation: &'static str,
    /// What the load would take.
    pub plan: MemoryPlan,
    /// Bytes it was checked against.
    pub limit: u64,
    /// Where that figure came from.
    pub limit_source: LimitSource,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.plan;
        write!(
            f,
            "{}: with --dtype {} the loaded model would take {} ({} as stored, {} converted \
             from {} on disk, plus {} while converting), more than {} of {}; refused before \
             allocating. Use --dtype bfloat16 to keep the weights as stored ({} on disk), a \
             quantised checkpoint, or a larger --memory-limit",
            self.dir.display(),
            self.activation,
            gb(p.resident() + p.largest_converted),
            gb(p.mapped),
            gb(p.allocated),
            gb(p.stored - p.mapped),
            gb(p.largest_converted),
            gb(self.limit),
            self.limit_source,
            gb(p.stored),
        )
    }
}

fn gb(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

/// Refuses the plan when the model it loads, plus the largest tensor read during a conversion,
/// exceeds `limit` (or, unset, what the machine has available).
pub fn check(
    plan: &MemoryPlan,
    limit: Option<u64>,
    dir: &std::path::Path,
    activation: Dtype,
) -> Result<(), TooLarge> {
    let (limit, limit_source) = match limit {
        Some(l) => (l, LimitSource::Setting),
        None => match available_memory() {
            Some(found) => found,
            None => return Ok(()),
        },
    };
    if plan.resident() + plan.largest_converted <= limit {
        return Ok(());
    }
    Err(TooLarge {
        dir: dir.to_path_buf(),
        activation: if activation == Dtype::Float32 {
            "float32"
        } else {
            "bfloat16"
        },
        plan: *plan,
        limit,
        limit_source,
    })
}

/// Memory the OS says a new allocation can take, and where that figure came from.
pub fn available_memory() -> Option<(u64, LimitSource)> {
    #[cfg(target_os = "linux")]
    {
        let meminfo = std::path::Path::new("/proc/meminfo");
        let text = std::fs::read_to_string(meminfo).ok()?;
        let kb: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        let mut available = (kb * 1024, LimitSource::Available(meminfo.to_path_buf()));
        // Inside a container the cgroup's limit may be the tighter one.
        let cg = std::path::Path::new("/sys/fs/cgroup");
        let read = |f: &str| -> Option<u64> {
            std::fs::read_to_string(cg.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        if let (Some(max), Some(current)) = (read("memory.max"), read("memory.current")) {
            let room = max.saturating_sub(current);
            if room < available.0 {
                available = (room, LimitSource::Available(cg.join("memory.max")));
            }
        }
        Some(available)
    }
    #[cfg(target_os = "macos")]
    {
        let out = std::process::Command::new("sysctl")
            .args(["-n", "hw.memsize"])
            .output()
            .ok()?;
        let bytes = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
        Some((bytes, LimitSource::Physical))
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_over_the_limit_is_refused() {
        let plan = MemoryPlan {
            stored: 100 << 30,
            mapped: 100 << 30,
            allocated: 0,
            largest_converted: 0,
            largest: 0,
        };
        assert!(check(
            &plan,
            Some(100 << 30),
            std::path::Path::new("x"),
            Dtype::Bfloat16
        )
        .is_ok());
        assert!(check(
            &plan,
            Some(99 << 30),
            std::path::Path::new("x"),
            Dtype::Bfloat16
        )
        .is_err());
        let widened = MemoryPlan {
            mapped: 0,
            allocated: 200 << 30,
            largest_converted: 1 << 30,
            largest: 1 << 30,
            ..plan
        };
        let e = check(
            &widened,
            Some(64 << 30),
            std::path::Path::new("x"),
            Dtype::Float32,
        )
        .expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains("float32") && text.contains("--dtype bfloat16"),
            "{text}"
        );
    }
}
