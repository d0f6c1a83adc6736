//! Named points at which a crash test can make the daemon die exactly as
//! `kill -9` would, where a signal from outside could never be timed: with
//! `CAIRN_CRASH_AT=<name>` in its environment the process kills itself with
//! SIGKILL the first time it reaches `<name>` (no destructor runs, nothing is
//! flushed that was not already written). Unset, a point costs one load of a
//! value read once.

use std::sync::OnceLock;

/// The environment variable naming the point to die at.
pub const CRASH_AT_ENV: &str = "CAIRN_CRASH_AT";
/// How many milliseconds the thread that reaches the point waits before the
/// kill (unset: none), while the rest of the process goes on: what a thread
/// slow at that point (a stalled disk) lets the others do meanwhile.
pub const CRASH_DELAY_ENV: &str = "CAIRN_CRASH_DELAY_MS";

/// Dies by SIGKILL if `name` is the crash point this process was given.
pub fn reached(name: &str) {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    if AT
        .get_or_init(|| std::env::var(CRASH_AT_ENV).ok())
        .as_deref()
        != Some(name)
    {
        return;
    }
    let delay_ms = std::env::var(CRASH_DELAY_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    if delay_ms > 0 {
        eprintln!("cairn: crash point {name} reached; killing this process in {delay_ms} ms");
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
    }
    eprintln!("cairn: crash point {name} reached; killing this process");
    // SAFETY: kill(2) on our own pid with SIGKILL takes no pointers and
    // cannot violate memory safety; the process ends here.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
}
