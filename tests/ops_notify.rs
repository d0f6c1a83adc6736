//! systemd notifications on a fake `NOTIFY_SOCKET` (a real unix datagram socket
//! bound by the test). Guards against: `READY=1` sent before the member is ready;
//! keepalives sent while a core is wedged (systemd would never restart a member
//! that silently stopped serving some shards) or not resumed once it recovers;
//! messages out of order (STATUS, READY, keepalives, STOPPING, then silence);
//! abstract socket names ('@...') not reached; and anything sent, or any failure,
//! when there is no `NOTIFY_SOCKET`.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn::ops::lifecycle::Lifecycle;
use cairn::ops::notify::{Notifier, Sent};
use cairn::ops::readiness::Readiness;
use cairn::ops::watchdog::Watchdog;

const CORES: usize = 3;
const PERIOD: Duration = Duration::from_millis(60);

/// Reads every datagram that arrives within `window`.
fn drain(socket: &UnixDatagram, window: Duration) -> Vec<String> {
    let deadline = Instant::now() + window;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return got;
        }
        socket.set_read_timeout(Some(left)).unwrap();
        match socket.recv(&mut buf) {
            Ok(n) => got.push(String::from_utf8(buf[..n].to_vec()).unwrap()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return got
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
}

/// Core threads that check in every check-in period until told to stop; one of
/// them can be wedged.
struct Cores {
    stop: Arc<AtomicBool>,
    wedged: Arc<[AtomicBool; CORES]>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Cores {
    fn start(watchdog: &Arc<Watchdog>) -> Cores {
        let stop = Arc::new(AtomicBool::new(false));
        let wedged: Arc<[AtomicBool; CORES]> =
            Arc::new(std::array::from_fn(|_| AtomicBool::new(false)));
        let threads = (0..CORES)
            .map(|core| {
                let (w, stop, wedged) =
                    (Arc::clone(watchdog), Arc::clone(&stop), Arc::clone(&wedged));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if !wedged[core].load(Ordering::Relaxed) {
                            w.check_in(core);
                        }
                        std::thread::sleep(w.check_in_period());
                    }
                })
            })
            .collect();
        Cores {
            stop,
            wedged,
            threads,
        }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
    }
}

#[test]
fn readiness_and_watchdog_messages_arrive_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let systemd = UnixDatagram::bind(&path).unwrap();
    let notifier = Notifier::from_socket_name(Some(path.as_os_str())).unwrap();
    assert!(notifier.is_enabled());

    let readiness = Readiness::new(&[0, 1, 2]);
    let mut life = Lifecycle::new(notifier, Watchdog::new(CORES, PERIOD));
    let watchdog = Arc::clone(life.watchdog());
    let cores = Cores::start(&watchdog);

    // Start-up as the daemon does it: a status while recovering, READY=1 only
    // once the readiness source says so, then keepalives.
    life.status("recovering 3 shards");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ready = life.ready_when_ready(&readiness, "serving");
        tokio::pin!(ready);
        readiness.set_recovered(true);
        readiness.set_caught_up(true);
        readiness.set_shard_has_leader(0, true);
        readiness.set_shard_has_leader(1, true);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), ready.as_mut())
                .await
                .is_err(),
            "READY=1 with shard 2 leaderless"
        );
        readiness.set_shard_has_leader(2, true);
        tokio::time::timeout(Duration::from_secs(5), ready)
            .await
            .expect("never ready");
    });

    let healthy = drain(&systemd, PERIOD * 6);
    assert_eq!(healthy[0], "STATUS=recovering 3 shards\n");
    assert_eq!(healthy[1], "READY=1\nSTATUS=serving\n");
    let keepalives = healthy[2..].iter().filter(|m| *m == "WATCHDOG=1\n").count();
    assert_eq!(
        keepalives,
        healthy.len() - 2,
        "only keepalives after READY: {healthy:?}"
    );
    assert!(
        keepalives >= 3,
        "expected a keepalive per round, got {healthy:?}"
    );

    // Core 1 wedges: within two rounds keepalives stop, and stay stopped.
    cores.wedged[1].store(true, Ordering::Relaxed);
    let _settling = drain(&systemd, PERIOD * 3);
    let while_wedged = drain(&systemd, PERIOD * 6);
    assert!(
        while_wedged.is_empty(),
        "keepalive sent with core 1 wedged: {while_wedged:?}"
    );
    assert_eq!(watchdog.stalled_cores(), vec![1]);

    // It recovers: keepalives resume.
    cores.wedged[1].store(false, Ordering::Relaxed);
    let resumed = drain(&systemd, PERIOD * 6);
    assert!(
        resumed.iter().filter(|m| *m == "WATCHDOG=1\n").count() >= 2,
        "keepalives did not resume: {resumed:?}"
    );
    assert!(watchdog.stalled_cores().is_empty());

    // Shutdown: keepalives stop, STOPPING=1 is the last message, ever.
    life.stopping("shutting down");
    life.stopping("shutting down twice");
    rt.block_on(life.ready_when_ready(&readiness, "too late"));
    let end = drain(&systemd, PERIOD * 4);
    let (last, before) = end.split_last().expect("no STOPPING=1");
    assert_eq!(last, "STOPPING=1\nSTATUS=shutting down\n");
    assert!(before.iter().all(|m| m == "WATCHDOG=1\n"), "{end:?}");
    cores.stop();
}

#[test]
fn abstract_socket_names_are_reached() {
    let name = format!("cairn-notify-test-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let systemd = UnixDatagram::bind_addr(&addr).unwrap();
    let notifier = Notifier::from_socket_name(Some(format!("@{name}").as_ref())).unwrap();
    assert_eq!(notifier.watchdog().unwrap(), Sent::Delivered);
    assert_eq!(
        notifier.extend_timeout(Duration::from_secs(90)).unwrap(),
        Sent::Delivered
    );
    let got = drain(&systemd, Duration::from_millis(200));
    assert_eq!(got, vec!["WATCHDOG=1\n", "EXTEND_TIMEOUT_USEC=90000000\n"]);
}

#[test]
fn without_notify_socket_nothing_is_sent_and_nothing_fails() {
    let notifier = Notifier::from_socket_name(None).unwrap();
    assert!(!notifier.is_enabled());
    for sent in [
        notifier.status("x"),
        notifier.ready("x"),
        notifier.watchdog(),
        notifier.stopping("x"),
    ] {
        assert_eq!(sent.unwrap(), Sent::Skipped);
    }
    // The keeper runs the same without systemd (it feeds /livez) and sends nothing.
    let watchdog = Watchdog::new(1, Duration::from_millis(10));
    watchdog.check_in(0);
    let keeper = watchdog.spawn_keeper(notifier).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    keeper.stop();
}

#[test]
fn a_vanished_socket_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gone.sock");
    let notifier = Notifier::from_socket_name(Some(path.as_os_str())).unwrap();
    let err = notifier.ready("x").unwrap_err();
    assert!(err.to_string().contains("gone.sock"), "{err}");
}
