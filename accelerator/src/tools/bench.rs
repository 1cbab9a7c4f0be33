//! What the bench binaries share (`logits-bench`, `laya-bench`): the statistics of their rounds,
//! the machine line they print beside every figure, and the process's resident peak.

/// The median (the mean of the middle two of an even count); NaN for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `min-max` of per-question seconds, in milliseconds: the spread over the warm rounds.
pub fn spread(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.1}-{:.1}", min * 1e3, max * 1e3)
}

/// `/proc/self/status`'s `field` (`VmHWM:`), in bytes, where the system has one.
pub fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// This process's peak resident set (`VmHWM`), in bytes.
pub fn resident_peak() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// The CPU (its name, and its family and model: the name alone can be as vague as "AMD EPYC"),
/// the cores, the copies of `hunch_kernels` this process runs (its elementwise kernels and its
/// integer products) and the BLAS MLX's products go to.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    // The first processor's `name : value` lines.
    let field = |name: &str| {
        cpuinfo
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.trim().to_owned())
    };
    let mut cpu = field("model name").unwrap_or_else(|| "unknown CPU".into());
    if let (Some(family), Some(model)) = (field("cpu family"), field("model")) {
        cpu = format!("{cpu} (family {family} model {model})");
    }
    format!(
        "{cpu}, {} cores; hunch_kernels: elementwise {}, integer products {}; BLAS {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        hunch_kernels::isa().name(),
        hunch_kernels::quant::quant_isa().name(),
        crate::blas::active().name()
    )
}
