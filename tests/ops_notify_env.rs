//! The notifier and watchdog read their settings from the environment systemd
//! gives a `Type=notify` service. Guards against: the variables being ignored
//! (no READY=1 ever reaches systemd, which then kills the member at
//! TimeoutStartSec), a keepalive period that does not follow `WATCHDOG_USEC`, and
//! anything but a silent no-op when the variables are absent. This file holds a
//! single test because it changes the process environment.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use cairn::ops::notify::{watchdog_timeout_from_env, Notifier, Sent};
use cairn::ops::watchdog::Watchdog;

#[test]
fn notify_socket_and_watchdog_usec_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let systemd = UnixDatagram::bind(&path).unwrap();
    systemd
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();

    std::env::set_var("NOTIFY_SOCKET", &path);
    std::env::set_var("WATCHDOG_USEC", "20000000");
    std::env::set_var("WATCHDOG_PID", std::process::id().to_string());
    let notifier = Notifier::from_env().unwrap();
    assert_eq!(notifier.ready("ok").unwrap(), Sent::Delivered);
    let mut buf = [0u8; 256];
    let n = systemd.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"READY=1\nSTATUS=ok\n");
    let timeout = watchdog_timeout_from_env().unwrap();
    assert_eq!(timeout, Some(Duration::from_secs(20)));
    assert_eq!(
        Watchdog::for_timeout(2, timeout).period(),
        Duration::from_secs(10)
    );

    // A watchdog meant for another process of the unit is not ours to feed.
    std::env::set_var("WATCHDOG_PID", "1");
    assert_eq!(watchdog_timeout_from_env().unwrap(), None);

    std::env::remove_var("NOTIFY_SOCKET");
    std::env::remove_var("WATCHDOG_USEC");
    std::env::remove_var("WATCHDOG_PID");
    let notifier = Notifier::from_env().unwrap();
    assert!(!notifier.is_enabled());
    assert_eq!(notifier.ready("ok").unwrap(), Sent::Skipped);
    assert_eq!(notifier.stopping("bye").unwrap(), Sent::Skipped);
    assert_eq!(watchdog_timeout_from_env().unwrap(), None);
    systemd.set_nonblocking(true).unwrap();
    assert!(
        systemd.recv(&mut buf).is_err(),
        "something was sent without NOTIFY_SOCKET"
    );
}
