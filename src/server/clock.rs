//! The wall clock as the member reads it: lease ids, member ids and the seeds
//! of Raft elections take their milliseconds from here, in one place a test
//! can reach. Leases, elections and timeouts run on the monotonic clock,
//! which no jump of the wall clock moves.
//!
//! For fault tests, the daemon's test-only `--test-clock-file FILE` moves
//! this clock: a thread reads the file every [`FOLLOW_EVERY`] and the offset
//! it holds ("offset <ms>", signed; anything else is 0) is added to every
//! reading, so a test jumps one member's clock forward or back as
//! `date -s` would. A member started without the flag never reads a file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// How often a followed control file is read again.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(20);

/// Milliseconds added to the system's wall clock (0 unless a test moves it).
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    let system = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    system
        .saturating_add(OFFSET_MS.load(Ordering::Relaxed))
        .max(0) as u64
}

/// The offset a control file's text asks for.
pub fn parse_offset(text: &str) -> i64 {
    let mut words = text.split_whitespace();
    match (words.next(), words.next().map(str::parse::<i64>)) {
        (Some("offset"), Some(Ok(ms))) => ms,
        _ => 0,
    }
}

fn read_offset(path: &Path) -> i64 {
    std::fs::read_to_string(path).map_or(0, |t| parse_offset(&t))
}

/// Moves the clock by the offset in `control`, now and whenever the file
/// changes, for the rest of the process (test-only; `None` does nothing).
pub fn follow(control: Option<PathBuf>) {
    let Some(path) = control else {
        return;
    };
    OFFSET_MS.store(read_offset(&path), Ordering::Relaxed);
    let spawned = std::thread::Builder::new()
        .name("test-clock".into())
        .spawn(move || loop {
            std::thread::sleep(FOLLOW_EVERY);
            let offset = read_offset(&path);
            if OFFSET_MS.swap(offset, Ordering::Relaxed) != offset {
                tracing::warn!(offset_ms = offset, "test clock moved");
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot follow the test clock file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_signed_milliseconds_and_anything_else_is_none() {
        assert_eq!(parse_offset("offset 3600000\n"), 3_600_000);
        assert_eq!(parse_offset("offset -86400000"), -86_400_000);
        for other in ["", "none", "offset", "offset x", "stall 5"] {
            assert_eq!(parse_offset(other), 0, "{other:?}");
        }
    }
}
