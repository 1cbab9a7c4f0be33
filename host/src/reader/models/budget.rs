//! The memory budget all loaded models share (docs/models.md, "The budget"): `--memory-budget`
//! when given, else what the machine has less a reserve for the host, the OS and the rest of
//! what runs beside it.

/// The reserve's floor: the host process, its policies' stores and the OS's own needs.
const RESERVE_MIN: u64 = 2 << 30;
/// The reserve's share of the machine: page cache for mapped checkpoints while they load, and
/// whatever else runs there.
const RESERVE_SHARE: u64 = 8;

/// The default budget for a machine of `total` bytes: `total` less
/// max(2 GiB, an eighth of `total`).
pub fn default_budget(total: u64) -> u64 {
    total.saturating_sub(RESERVE_MIN.max(total / RESERVE_SHARE))
}

/// This machine's memory (`MemTotal` in `/proc/meminfo`), `None` where there is none to read.
pub fn machine_total() -> Option<u64> {
    parse_mem_total(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `MemTotal:  16384 kB` → bytes.
fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line["MemTotal:".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_two_gib_or_an_eighth_whichever_is_more() {
        const GIB: u64 = 1 << 30;
        assert_eq!(default_budget(8 * GIB), 6 * GIB);
        assert_eq!(default_budget(128 * GIB), 112 * GIB);
        assert_eq!(default_budget(GIB), 0);
    }

    #[test]
    fn mem_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       16384 kB\nMemFree:  1 kB\n";
        assert_eq!(parse_mem_total(meminfo), Some(16384 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        #[cfg(target_os = "linux")]
        assert!(machine_total().is_some_and(|t| t > 0));
    }
}
