//! A sidecar's measured resident size: what it really holds once loaded, in place of the
//! estimate (docs/models.md, "Truth about memory"). A process per model makes this exact: its
//! memory is the process's, and all of it returns when the process exits.

/// The resident bytes of process `pid` (`VmRSS` in `/proc/PID/status`), or `None` where there is
/// no such process or no `/proc` (a process that is gone holds nothing).
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

/// `VmRSS:   123456 kB` → bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut fields = line["VmRSS:".len()..].split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") | None => value.checked_mul(1024),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_bytes() {
        let status = "Name:\thunch\nVmPeak:\t 9999 kB\nVmRSS:\t   2048 kB\nThreads: 4\n";
        assert_eq!(parse_vm_rss(status), Some(2 * 1024 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert_eq!(parse_vm_rss("VmRSS: lots kB\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_a_resident_size_and_a_missing_one_has_none() {
        let own = resident_bytes(std::process::id()).expect("our own VmRSS");
        assert!(own > 1024 * 1024, "{own}");
        // Above the kernel's pid_max: no such process.
        assert_eq!(resident_bytes(u32::MAX), None);
    }
}
