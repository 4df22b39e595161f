//! The host-memory check before a KV tier is allocated on the host: a DRAM tier (or the CPU
//! path's HBM-tier arena) larger than the memory the kernel says is available is a clear
//! start-up error naming the setting, not an allocation that aborts the process or an
//! overcommitted arena that the OOM killer ends later.

use crate::error::EngineError;

/// `MemAvailable` of `/proc/meminfo` in bytes (None where there is no such file).
pub fn available_bytes() -> Option<u64> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Refuses a host allocation of `bytes` for `what` (set by `setting`) when more than
/// `available` bytes (None: unknown, allowed).
pub fn check(
    bytes: u64,
    available: Option<u64>,
    what: &str,
    setting: &str,
) -> Result<(), EngineError> {
    match available {
        Some(avail) if bytes > avail => Err(EngineError::Config(format!(
            "the {what} needs {:.2} GB of host memory but {:.2} GB are available: lower {setting}",
            bytes as f64 / 1e9,
            avail as f64 / 1e9
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_from_meminfo() {
        let m = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_mem_available(m), Some(20_000_000 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert!(
            available_bytes().is_some(),
            "this Linux machine has /proc/meminfo"
        );
    }

    #[test]
    fn a_tier_larger_than_the_available_memory_is_refused_naming_its_setting() {
        let e = check(
            3_000_000_000,
            Some(2_000_000_000),
            "DRAM KV tier",
            "--dram-blocks",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--dram-blocks") && e.contains("3.00 GB") && e.contains("2.00 GB"),
            "{e}"
        );
        assert!(check(1_000, Some(2_000), "DRAM KV tier", "--dram-blocks").is_ok());
        assert!(check(u64::MAX, None, "DRAM KV tier", "--dram-blocks").is_ok());
    }
}
