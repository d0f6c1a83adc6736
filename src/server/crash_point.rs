//! Named points at which a crash test can make the daemon die exactly as
//! `kill -9` would, where a signal from outside could never be timed: with
//! `CAIRN_CRASH_AT=<name>` in its environment the process kills itself with
//! SIGKILL the first time it reaches `<name>` (no destructor runs, nothing is
//! flushed that was not already written). Unset, a point costs one load of a
//! value read once.

use std::sync::OnceLock;

/// The environment variable naming the point to die at.
pub const CRASH_AT_ENV: &str = "CAIRN_CRASH_AT";

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
    eprintln!("cairn: crash point {name} reached; killing this process");
    // SAFETY: kill(2) on our own pid with SIGKILL takes no pointers and
    // cannot violate memory safety; the process ends here.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
}
