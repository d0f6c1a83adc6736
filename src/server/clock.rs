//! The wall clock as the member reads it: lease ids, member ids and the seeds
//! of Raft elections take their milliseconds from here, in one place a test
//! can reach.

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
