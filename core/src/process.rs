//! Facts about a running process that the benchmarks of the sidecar (`accel-bench`) and of the
//! whole stack (`read-bench`, `batch-bench`, `isolation-bench`) record beside their figures.

/// The shared libraries process `pid` has mapped whose names say BLAS or LAPACK (Linux
/// `/proc/PID/maps`; empty where that cannot be read).
pub fn mapped_blas(pid: u32) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut libs: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            let base = p.rsplit('/').next().unwrap_or("").to_lowercase();
            ["blas", "lapack", "mkl", "accelerate"]
                .iter()
                .any(|t| base.contains(t))
        })
        .map(str::to_owned)
        .collect();
    libs.sort();
    libs.dedup();
    libs
}
