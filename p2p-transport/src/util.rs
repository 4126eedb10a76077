//! Small helpers with no better home.

/// This machine's host name (from `/proc/sys/kernel/hostname`), or `unknown host`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown host".into())
}
