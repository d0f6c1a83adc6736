//! Idle polling: a core about to sleep first polls for work for a short while.
//!
//! A core waits for its next event (a client request, a peer's reply, a WAL
//! completion) in `epoll_wait`. When that thread sleeps, so may its CPU, and on a
//! virtual machine waking a halted virtual CPU costs tens of microseconds per
//! hop; a replicated write crosses several hops. So before the runtime parks, the
//! core keeps checking (non-blocking) whether its runtime's epoll instance has
//! anything ready, yielding between checks so that a thread runnable on the same
//! CPU goes first. (The vCPU itself stays busy while a core polls: on a host
//! that charges for it, or shares it, set `--idle-poll-us 0`.)
//!
//! The polling window adapts per core, as Linux's haltpoll governor does: it grows
//! (doubling from [`GROW_START`] up to the configured maximum) when the core's
//! wait ended after the window but within the maximum, where a longer poll would
//! have caught the event, and halves when a wait outlasted the maximum, where
//! polling only burned CPU. A quiet member, woken by heartbeats and ticks many
//! milliseconds apart, polls little: at most [`GROW_START`] after a short wait,
//! and not again until another short wait.
//!
//! Polling pays only while the CPU would otherwise halt. A yield that ran
//! another thread (it took [`YIELD_GAVE_CPU_AWAY`] or more) shows the CPU has
//! other work, so the core stops polling and sleeps: under load, polling on
//! would only trade turns with that thread (measured with 100 clients on one
//! member: about a fifth of the CPU per request).
//!
//! Polling pays for sparse requests, where each waits on wake-ups. A core
//! busy more than [`BUSY_LIMIT`] of the last [`LOAD_PERIOD`] does not poll: its
//! requests queue behind its own work, so a wake-up's cost delays none of
//! them much, while polling through every short wait (a WAL sync under 100
//! clients, say) costs the member about an eighth more CPU per put (one
//! member, 100 clients, BENCHMARKS.md).
//!
//! A poll watches I/O and wake-ups, not tokio's timers: a timer due inside the
//! window fires when the window ends, so at most the window late (Cairn's timers
//! are Raft ticks and request deadlines, milliseconds and longer).
//!
//! tokio does not expose its driver's epoll descriptor. It is found as the
//! eventpoll descriptor whose target list (in `/proc/self/fdinfo`) holds a probe
//! socket registered with the runtime, and is watched, level-triggered and
//! without consuming anything, from an epoll instance of our own.

use std::cell::{Cell, RefCell};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// The first non-zero window.
const GROW_START: Duration = Duration::from_micros(50);

/// A `sched_yield` that took this long ran another thread: the CPU has other
/// work, and the poll ends (a yield with nothing else runnable returns in
/// about a microsecond).
const YIELD_GAVE_CPU_AWAY: Duration = Duration::from_micros(20);

/// The stretch of time over which a core's load is measured.
const LOAD_PERIOD: Duration = Duration::from_millis(2);

/// The share of [`LOAD_PERIOD`] a core may spend busy (running tasks, not
/// polling or asleep) and still poll when it idles.
const BUSY_LIMIT: f64 = 0.5;

/// An idle poller for `runtime` (built on this thread), or `None` when `max` is
/// zero or the runtime's epoll instance cannot be found, in which case the core
/// simply sleeps as usual.
pub fn watch_runtime(runtime: &tokio::runtime::Runtime, max: Duration) -> Option<IdlePoll> {
    if max.is_zero() {
        return None;
    }
    runtime_epoll(runtime).and_then(|fd| IdlePoll::watching(fd, max))
}

/// The eventpoll descriptor of `runtime`'s driver: one whose target list holds
/// a probe socket registered with the runtime, matched by descriptor number and
/// inode (a number alone could be a closed descriptor's, still listed while a
/// duplicate of it lives).
fn runtime_epoll(runtime: &tokio::runtime::Runtime) -> Option<RawFd> {
    let (probe, _peer) = std::os::unix::net::UnixStream::pair().ok()?;
    probe.set_nonblocking(true).ok()?;
    let _entered = runtime.enter();
    let probe = tokio::net::UnixStream::from_std(probe).ok()?;
    let probe_fd = probe.as_raw_fd();
    let probe_ino = socket_inode(&std::fs::read_link(format!("/proc/self/fd/{probe_fd}")).ok()?)?;
    std::fs::read_dir("/proc/self/fd")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let fd: RawFd = entry.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(entry.path()).ok()?;
            (target.as_os_str() == "anon_inode:[eventpoll]").then_some(fd)
        })
        .find(|fd| {
            std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
                .is_ok_and(|info| lists_target(&info, probe_fd, probe_ino))
        })
}

/// The inode of a socket from its `/proc/self/fd` link (`socket:[12345]`).
fn socket_inode(link: &std::path::Path) -> Option<u64> {
    link.to_str()?
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Whether an eventpoll descriptor's fdinfo text lists descriptor `fd` with
/// inode `ino` among its targets (lines such as `tfd:  12 events: 19 data: 0
/// pos:0 ino:1a2b sdev:9`, the inode in hex).
fn lists_target(fdinfo: &str, fd: RawFd, ino: u64) -> bool {
    fdinfo.lines().any(|line| {
        let Some(rest) = line.strip_prefix("tfd:") else {
            return false;
        };
        let mut words = rest.split_whitespace();
        let listed_fd = words.next().and_then(|n| n.parse::<RawFd>().ok());
        let listed_ino = words
            .find_map(|w| w.strip_prefix("ino:"))
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        listed_fd == Some(fd) && listed_ino == Some(ino)
    })
}

/// Told after each poll whether it found an event ready, and how long it
/// polled (the time spent checking and yielding, not a yield that ran
/// another thread).
pub type PollObserver = Box<dyn Fn(bool, Duration)>;

/// One core's idle poller; lives on the core's thread.
pub struct IdlePoll {
    /// Our epoll instance, with the runtime's epoll descriptors registered.
    watch: OwnedFd,
    max: Duration,
    window: Cell<Duration>,
    /// When the core last started to idle.
    idle_since: Cell<Option<Instant>>,
    /// Whether the last idle period was polled: whether the poll caught work,
    /// and how long it polled.
    last_poll: Cell<Option<(bool, Duration)>>,
    /// Told of every poll (whether it caught work), e.g. to count them.
    observer: RefCell<Option<PollObserver>>,
    /// The core's load over the current [`LOAD_PERIOD`].
    load: Cell<Load>,
    /// Whether the core was busy more than [`BUSY_LIMIT`] of the last whole
    /// period; it then does not poll.
    loaded: Cell<bool>,
}

/// Time a core spent busy and idle since its load was last measured, and
/// when its current busy stretch began.
#[derive(Clone, Copy, Default)]
struct Load {
    busy: Duration,
    idle: Duration,
    busy_since: Option<Instant>,
}

impl Load {
    /// The busy stretch ends at `now`.
    fn park(mut self, now: Instant) -> Load {
        if let Some(since) = self.busy_since.take() {
            self.busy += now.saturating_duration_since(since);
        }
        self
    }

    /// An idle stretch of `idled` ends at `now`; once a whole period is
    /// counted, whether the core was loaded over it, and a fresh count.
    fn unpark(mut self, now: Instant, idled: Duration) -> (Load, Option<bool>) {
        self.idle += idled;
        self.busy_since = Some(now);
        let total = self.busy + self.idle;
        if total < LOAD_PERIOD {
            return (self, None);
        }
        let loaded = self.busy.as_secs_f64() > BUSY_LIMIT * total.as_secs_f64();
        (
            Load {
                busy_since: Some(now),
                ..Load::default()
            },
            Some(loaded),
        )
    }
}

impl IdlePoll {
    fn watching(runtime_epoll: RawFd, max: Duration) -> Option<IdlePoll> {
        // SAFETY: epoll_create1 takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let watch = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        // SAFETY: `event` is a valid epoll_event that the kernel only reads; the
        // descriptors are plain numbers to the kernel, which answers EBADF if
        // either is not open, so no memory is at stake.
        let rc = unsafe {
            libc::epoll_ctl(
                watch.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                runtime_epoll,
                &mut event,
            )
        };
        if rc != 0 {
            return None;
        }
        Some(IdlePoll {
            watch,
            max,
            window: Cell::new(Duration::ZERO),
            idle_since: Cell::new(None),
            last_poll: Cell::new(None),
            observer: RefCell::new(None),
            load: Cell::new(Load::default()),
            loaded: Cell::new(false),
        })
    }

    /// Whether the runtime's epoll instance has an event ready (non-blocking).
    fn ready(&self) -> bool {
        let mut event = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: `watch` is open and `event` has room for the one event asked for.
        unsafe { libc::epoll_wait(self.watch.as_raw_fd(), &mut event, 1, 0) > 0 }
    }

    /// Runs as the runtime is about to park: polls for up to the current window.
    pub fn before_park(&self) {
        let start = Instant::now();
        self.idle_since.set(Some(start));
        self.load.set(self.load.get().park(start));
        let window = self.window.get();
        if window.is_zero() || self.loaded.get() {
            return;
        }
        // One clock read a turn: the time after a yield both ends the window
        // and tells how long the yield took (the readiness check before it,
        // one syscall, counts too: far below the threshold).
        let mut now = start;
        let caught = loop {
            if self.ready() {
                // The check itself counts: measured again.
                now = Instant::now();
                break true;
            }
            if now - start >= window {
                break false;
            }
            // SAFETY: sched_yield takes no arguments; it lets any runnable thread
            // on this CPU go first.
            unsafe { libc::sched_yield() };
            let after = Instant::now();
            if after - now >= YIELD_GAVE_CPU_AWAY {
                // Another thread ran on this CPU: it is busy, so it will not
                // halt when this core sleeps, and waking it costs no more
                // than polling on would. Polling further would only take
                // turns from that thread.
                break false;
            }
            now = after;
        };
        self.last_poll.set(Some((caught, now - start)));
    }

    /// Runs as the runtime wakes: adapts the window to how long the core idled.
    pub fn after_unpark(&self) {
        if let Some(since) = self.idle_since.take() {
            let now = Instant::now();
            let idled = now.saturating_duration_since(since);
            self.window
                .set(next_window(self.window.get(), idled, self.max));
            let (load, loaded) = self.load.get().unpark(now, idled);
            self.load.set(load);
            if let Some(loaded) = loaded {
                self.loaded.set(loaded);
            }
        }
        if let (Some((caught, polled)), Some(observer)) =
            (self.last_poll.take(), &*self.observer.borrow())
        {
            observer(caught, polled);
        }
    }

    /// Calls `observer` after every poll with whether it found an event ready
    /// before its window ran out, and how long it polled.
    pub fn observe(&self, observer: PollObserver) {
        *self.observer.borrow_mut() = Some(observer);
    }
}

/// The window after an idle period of `idled` that was polled for up to `window`.
fn next_window(window: Duration, idled: Duration, max: Duration) -> Duration {
    if idled <= window {
        window
    } else if idled <= max {
        (window * 2).max(GROW_START).min(max)
    } else {
        let half = window / 2;
        if half < GROW_START {
            Duration::ZERO
        } else {
            half
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_micros(300);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn the_window_grows_when_a_longer_poll_would_have_caught_the_wake() {
        assert_eq!(next_window(Duration::ZERO, us(120), MAX), GROW_START);
        assert_eq!(next_window(us(50), us(120), MAX), us(100));
        assert_eq!(next_window(us(200), us(250), MAX), MAX);
    }

    /// Runs `load` through 400 µs cycles `cycles` from `t0`, each busy for
    /// `busy_us` then idle: the verdicts of the periods completed.
    fn cycles(
        mut load: Load,
        t0: Instant,
        cycles: std::ops::Range<u64>,
        busy_us: u64,
    ) -> (Load, Vec<bool>) {
        let mut verdicts = Vec::new();
        for cycle in cycles {
            load = load.park(t0 + us(cycle * 400 + busy_us));
            let (next, verdict) = load.unpark(t0 + us(cycle * 400 + 400), us(400 - busy_us));
            load = next;
            verdicts.extend(verdict);
        }
        (load, verdicts)
    }

    #[test]
    fn a_core_busy_over_half_a_period_is_loaded() {
        let t0 = Instant::now();
        let load = Load {
            busy_since: Some(t0),
            ..Load::default()
        };
        // Busy 300 µs of every 400: loaded, once a whole period is counted.
        let (load, verdicts) = cycles(load, t0, 0..6, 300);
        assert_eq!(verdicts, [true], "one whole period of 2 ms counted");
        // Busy 50 µs of every 400: not loaded.
        let (_, verdicts) = cycles(load, t0, 6..12, 50);
        assert_eq!(verdicts, [false]);
    }

    #[test]
    fn the_window_holds_when_the_poll_caught_the_wake() {
        assert_eq!(next_window(us(200), us(150), MAX), us(200));
        assert_eq!(
            next_window(Duration::ZERO, Duration::ZERO, MAX),
            Duration::ZERO
        );
    }

    #[test]
    fn the_window_shrinks_to_nothing_when_waits_outlast_the_maximum() {
        let mut window = MAX;
        for _ in 0..4 {
            window = next_window(window, Duration::from_millis(100), MAX);
        }
        assert_eq!(window, Duration::ZERO);
        assert_eq!(next_window(MAX, us(301), MAX), us(150));
    }

    /// Pins the calling thread to CPU 0.
    fn pin_to_cpu0() {
        // SAFETY: `set` is a plain bit set the kernel reads; pid 0 is this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                0
            );
        }
    }

    #[test]
    fn a_poll_ends_once_another_thread_wants_the_cpu() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let window = Duration::from_secs(1);
        let poll = watch_runtime(&runtime, window).expect("the runtime's epoll instance is found");
        poll.window.set(window);
        pin_to_cpu0();
        // A thread that wants the same CPU throughout the poll.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinner = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin_to_cpu0();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        let started = Instant::now();
        poll.before_park();
        let polled = started.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spinner.join().expect("spinner");
        let (caught, counted) = poll.last_poll.get().expect("the core polled");
        assert!(!caught, "nothing was ready");
        assert!(
            polled < window / 2,
            "polled {polled:?} of a {window:?} window while another thread wanted the CPU"
        );
        // The time reported is the polling's own, within the call's.
        assert!(
            counted <= polled,
            "reported {counted:?}, call took {polled:?}"
        );
    }

    #[test]
    fn fdinfo_targets_are_matched_by_number_and_inode() {
        let info = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1057\n\
                    tfd:       41 events: 8000201d data: 7fc4a2606e80  pos:0 ino:727d1a sdev:9\n\
                    tfd:        5 events: 8000201d data: 7fc4a2606580  pos:0 ino:727ba2 sdev:9\n";
        assert!(lists_target(info, 41, 0x727d1a));
        assert!(lists_target(info, 5, 0x727ba2));
        assert!(!lists_target(info, 41, 0x727ba2), "a reused number");
        assert!(!lists_target(info, 4, 0x727d1a));
        assert!(!lists_target(info, 1057, 1057));
        assert_eq!(
            socket_inode(std::path::Path::new("socket:[7502755]")),
            Some(7502755)
        );
        assert_eq!(socket_inode(std::path::Path::new("pipe:[7]")), None);
    }

    #[test]
    fn a_watched_runtime_reports_ready_work_and_a_quiet_one_does_not() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let poll = watch_runtime(&runtime, MAX).expect("the runtime's epoll instance is found");
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        a.set_nonblocking(true).expect("nonblocking");
        let mut a =
            runtime.block_on(async { tokio::net::UnixStream::from_std(a).expect("register") });
        runtime.block_on(async {
            // Drain the registration's initial readiness.
            let _ = tokio::time::timeout(Duration::from_millis(10), a.readable()).await;
        });
        assert!(!poll.ready(), "nothing pending yet");
        std::io::Write::write_all(&mut &b, b"x").expect("write");
        let started = Instant::now();
        while !poll.ready() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "readiness never seen"
            );
        }
        let mut byte = [0u8; 1];
        runtime.block_on(async {
            use tokio::io::AsyncReadExt;
            a.read_exact(&mut byte).await.expect("read");
        });
        assert_eq!(&byte, b"x");
    }
}
