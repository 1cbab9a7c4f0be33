//! How much memory a loaded model takes, worked out before anything is allocated, and the
//! refusal when it would not fit (docs/checkpoint-layouts.md, "Memory").
//!
//! Weights kept in their stored dtype are arrays over the mapped files: their pages are
//! file-backed, so the OS can drop and re-read them under pressure. Weights converted at load
//! (bf16 widened to float32 for float32 activations) are new allocations that cannot be dropped;
//! those are what must fit.

use std::path::PathBuf;

use mlx_rs::Dtype;

use super::arrays::{element_size, mlx_dtype};
use super::layout::{Checkpoint, ModuleRef};
use super::mapped::{held_dtype, TensorKind};

/// What loading a checkpoint with given activations takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes of tensor data the model uses, as stored.
    pub stored: u64,
    /// Of those, the bytes kept as stored (mapped from the files).
    pub mapped: u64,
    /// Bytes of the converted copies made at load.
    pub allocated: u64,
    /// The largest single stored tensor that is converted (read while its copy is written).
    pub largest_converted: u64,
}

impl MemoryPlan {
    /// What the loaded model holds: mapped plus allocated.
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
        };
        for module in checkpoint.module_names() {
            let Some(r) = checkpoint.module_ref(module) else {
                continue;
            };
            let kinds: Vec<(&str, TensorKind)> = match r {
                ModuleRef::Dense { tensor } => vec![(tensor.as_str(), TensorKind::Dense)],
                ModuleRef::Quantized {
                    codes,
                    scales,
                    biases,
                    global_scale,
                    mode,
                } => {
                    let scale_kind = match mode {
                        super::layout::QuantMode::Nvfp4 => TensorKind::Packed,
                        super::layout::QuantMode::Affine { .. } => TensorKind::AffineScale,
                    };
                    let mut v = vec![
                        (codes.as_str(), TensorKind::Packed),
                        (scales.as_str(), scale_kind),
                    ];
                    v.extend(biases.as_deref().map(|b| (b, TensorKind::AffineScale)));
                    v.extend(
                        global_scale
                            .as_deref()
                            .map(|g| (g, TensorKind::GlobalScale)),
                    );
                    v
                }
            };
            for (name, kind) in kinds {
                let Some(view) = checkpoint.tensors().get(name) else {
                    continue;
                };
                let bytes = view.bytes.len() as u64;
                plan.stored += bytes;
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
    /// `float32` or `bfloat16`.
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
            "{}: with {} activations loading would allocate {} for weights converted from {} as \
             stored (the model would hold {} in all, {} of it mapped from disk as stored), more \
             than {} of {}; refused before allocating. Use --dtype bfloat16 to keep the weights \
             as stored ({} on disk), a quantised checkpoint, or a larger --memory-limit",
            self.dir.display(),
            self.activation,
            gb(p.allocated + p.largest_converted),
            gb(p.stored - p.mapped),
            gb(p.resident()),
            gb(p.mapped),
            gb(self.limit),
            self.limit_source,
            gb(p.stored),
        )
    }
}

fn gb(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

/// Refuses the plan when what it allocates, plus the largest tensor read during a conversion,
/// exceeds `limit` (or, unset, what the machine has available). A plan that allocates nothing
/// is never refused: mapped weights are paged in and out by the OS.
pub fn check(
    plan: &MemoryPlan,
    limit: Option<u64>,
    dir: &std::path::Path,
    activation: Dtype,
) -> Result<(), TooLarge> {
    if plan.allocated == 0 {
        return Ok(());
    }
    let (limit, limit_source) = match limit {
        Some(l) => (l, LimitSource::Setting),
        None => match available_memory() {
            Some(found) => found,
            None => return Ok(()),
        },
    };
    if plan.allocated + plan.largest_converted <= limit {
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

/// Parses a memory size: bytes, or a number with `K`, `M`, `G`, `T` (powers of 1024, optional
/// `iB`/`B`), e.g. `64G`, `512MiB`, `1.5GB`.
pub fn parse_size(s: &str) -> Result<u64, InvalidSize> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| InvalidSize(s.to_string()))?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit.trim_end_matches("IB").trim_end_matches('B');
    let scale = match unit {
        "" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(InvalidSize(s.to_string())),
    };
    if !value.is_finite() || value < 0.0 {
        return Err(InvalidSize(s.to_string()));
    }
    Ok((value * scale as f64) as u64)
}

/// A memory size that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a memory size (bytes, or a number with K, M, G or T, e.g. 48G)")]
pub struct InvalidSize(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("64G"), Ok(64 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GB"), Ok(3 << 29));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("12X").is_err());
    }

    #[test]
    fn a_plan_that_allocates_nothing_is_never_refused() {
        let plan = MemoryPlan {
            stored: 100 << 30,
            mapped: 100 << 30,
            allocated: 0,
            largest_converted: 0,
        };
        assert!(check(&plan, Some(1), std::path::Path::new("x"), Dtype::Bfloat16).is_ok());
        let widened = MemoryPlan {
            mapped: 0,
            allocated: 200 << 30,
            largest_converted: 1 << 30,
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
