//! What the host's benchmarks share: how many samples to take and how to read a percentile.

/// The number of samples: `BENCH_N`, else 2000.
pub fn samples_from_env() -> usize {
    std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// The `p` quantile (0 to 1) of ascending `sorted`, by nearest rank; NaN when it is empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}
