//! The systemd notification protocol (`sd_notify`): datagrams of `KEY=VALUE` lines
//! sent to the unix socket named by `NOTIFY_SOCKET`.
//!
//! Without `NOTIFY_SOCKET` (not started by systemd, or `Type=` other than notify)
//! every call is a no-op that reports [`Sent::Skipped`], so the daemon runs the
//! same with or without systemd. A name starting with '@' is a Linux abstract
//! socket; one starting with '/' is a filesystem path. Each send is one datagram
//! from a fresh unbound socket, as systemd expects; the calls are rare (start,
//! stop, a keepalive every few seconds), so no socket is kept open.

use std::ffi::OsStr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Longest `STATUS=` text sent; systemd shows it in `systemctl status`.
pub const MAX_STATUS_BYTES: usize = 1024;
/// Longest socket name accepted (the size of `sun_path` on Linux, less the NUL).
pub const MAX_SOCKET_NAME_BYTES: usize = 107;

/// Errors from notifying systemd. The daemon logs them and carries on: a failed
/// notification must not stop a member that is otherwise serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotifyError {
    #[error(
        "NOTIFY_SOCKET={value:?} is not a unix socket path ('/...') or abstract name ('@...')"
    )]
    UnsupportedAddress { value: String },
    #[error("NOTIFY_SOCKET={value:?}: {source}")]
    BadAddress {
        value: String,
        source: std::io::Error,
    },
    #[error("notification {message:?} has a line break or is too long ({len} bytes)")]
    InvalidMessage { message: String, len: usize },
    #[error("sending {message:?} to NOTIFY_SOCKET={socket:?}: {source}")]
    Send {
        message: String,
        socket: String,
        source: std::io::Error,
    },
    #[error("WATCHDOG_USEC={value:?} is not a positive number of microseconds")]
    BadWatchdogUsec { value: String },
}

/// What a notification call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Delivered,
    /// No `NOTIFY_SOCKET`: nothing was sent.
    Skipped,
}

/// A client of the systemd notification socket, or a no-op one.
#[derive(Debug, Clone)]
pub struct Notifier {
    target: Option<(SocketAddr, String)>,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET`. Unset or empty: a no-op notifier.
    pub fn from_env() -> Result<Notifier, NotifyError> {
        Notifier::from_socket_name(std::env::var_os("NOTIFY_SOCKET").as_deref())
    }

    /// As [`Notifier::from_env`], from an explicit value of `NOTIFY_SOCKET`.
    pub fn from_socket_name(value: Option<&OsStr>) -> Result<Notifier, NotifyError> {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            return Ok(Notifier::disabled());
        };
        let shown = value.to_string_lossy().into_owned();
        let bytes = value.as_bytes();
        if bytes.len() > MAX_SOCKET_NAME_BYTES {
            return Err(NotifyError::BadAddress {
                value: shown,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("longer than {MAX_SOCKET_NAME_BYTES} bytes"),
                ),
            });
        }
        let addr = match bytes.first() {
            Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..]),
            Some(b'/') => SocketAddr::from_pathname(std::path::Path::new(value)),
            _ => return Err(NotifyError::UnsupportedAddress { value: shown }),
        }
        .map_err(|source| NotifyError::BadAddress {
            value: shown.clone(),
            source,
        })?;
        Ok(Notifier {
            target: Some((addr, shown)),
        })
    }

    /// A notifier that sends nothing.
    pub fn disabled() -> Notifier {
        Notifier { target: None }
    }

    pub fn is_enabled(&self) -> bool {
        self.target.is_some()
    }

    /// `READY=1`, with a status line. Send only once the member is ready (see
    /// [`super::readiness::Readiness::wait_ready`]).
    pub fn ready(&self, status: &str) -> Result<Sent, NotifyError> {
        self.send(&[("READY", "1"), ("STATUS", &status_text(status))])
    }

    /// `STOPPING=1`, when a clean shutdown begins.
    pub fn stopping(&self, status: &str) -> Result<Sent, NotifyError> {
        self.send(&[("STOPPING", "1"), ("STATUS", &status_text(status))])
    }

    /// `WATCHDOG=1`: the keepalive. Send through [`super::watchdog::Watchdog`],
    /// which sends it only while every core checks in.
    pub fn watchdog(&self) -> Result<Sent, NotifyError> {
        self.send(&[("WATCHDOG", "1")])
    }

    /// `STATUS=...`, free text shown by `systemctl status`.
    pub fn status(&self, status: &str) -> Result<Sent, NotifyError> {
        self.send(&[("STATUS", &status_text(status))])
    }

    /// `EXTEND_TIMEOUT_USEC=...`: asks for more time to start or stop, e.g. while
    /// a long WAL replay is running.
    pub fn extend_timeout(&self, extra: Duration) -> Result<Sent, NotifyError> {
        let usec = extra.as_micros().to_string();
        self.send(&[("EXTEND_TIMEOUT_USEC", &usec)])
    }

    /// Sends one datagram of `KEY=VALUE` lines.
    pub fn send(&self, fields: &[(&str, &str)]) -> Result<Sent, NotifyError> {
        let mut message = String::new();
        for (key, value) in fields {
            message.push_str(key);
            message.push('=');
            message.push_str(value);
            message.push('\n');
        }
        // A line break inside a value would smuggle in another assignment.
        let bad_value = fields
            .iter()
            .any(|(k, v)| k.contains(['\n', '=']) || v.contains('\n'));
        if bad_value || message.len() > MAX_STATUS_BYTES + 64 {
            return Err(NotifyError::InvalidMessage {
                len: message.len(),
                message,
            });
        }
        let Some((addr, shown)) = &self.target else {
            return Ok(Sent::Skipped);
        };
        let send = || -> std::io::Result<()> {
            let socket = UnixDatagram::unbound()?;
            socket.send_to_addr(message.as_bytes(), addr)?;
            Ok(())
        };
        send().map_err(|source| NotifyError::Send {
            message: message.trim_end().to_string(),
            socket: shown.clone(),
            source,
        })?;
        Ok(Sent::Delivered)
    }
}

/// A status line as systemd shows it: one line, at most [`MAX_STATUS_BYTES`].
/// Status text often carries error messages; a stray line break or a long
/// message must not cost the `READY=1` or `STOPPING=1` sent with it.
fn status_text(status: &str) -> String {
    let mut line = status.replace(['\n', '\r'], " ");
    if line.len() > MAX_STATUS_BYTES {
        let mut end = MAX_STATUS_BYTES;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
    }
    line
}

/// Reads `WATCHDOG_USEC` (and `WATCHDOG_PID`, which must name this process if
/// set): the watchdog timeout systemd enforces, or `None` when it is off.
pub fn watchdog_timeout_from_env() -> Result<Option<Duration>, NotifyError> {
    watchdog_timeout(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

/// As [`watchdog_timeout_from_env`], from explicit values.
pub fn watchdog_timeout(
    usec: Option<&str>,
    pid: Option<&str>,
    own_pid: u32,
) -> Result<Option<Duration>, NotifyError> {
    let Some(usec) = usec.filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    // The watchdog is meant for another process of the service (e.g. a wrapper
    // that exec'd us would have the same pid, a forked helper not).
    if let Some(pid) = pid.filter(|p| !p.is_empty()) {
        if pid.parse::<u32>().ok() != Some(own_pid) {
            return Ok(None);
        }
    }
    match usec.parse::<u64>() {
        Ok(us) if us > 0 => Ok(Some(Duration::from_micros(us))),
        _ => Err(NotifyError::BadWatchdogUsec {
            value: usec.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_socket_is_a_no_op() {
        let n = Notifier::from_socket_name(None).unwrap();
        assert!(!n.is_enabled());
        assert_eq!(n.ready("up").unwrap(), Sent::Skipped);
        assert_eq!(n.watchdog().unwrap(), Sent::Skipped);
        let empty = Notifier::from_socket_name(Some(OsStr::new(""))).unwrap();
        assert!(!empty.is_enabled());
    }

    #[test]
    fn relative_or_vsock_names_are_refused() {
        for v in ["relative/path", "vsock:2:1234"] {
            let err = Notifier::from_socket_name(Some(OsStr::new(v))).unwrap_err();
            assert!(err.to_string().contains(v), "{err}");
        }
    }

    #[test]
    fn raw_fields_with_line_breaks_are_refused_even_without_socket() {
        let n = Notifier::disabled();
        assert!(matches!(
            n.send(&[("STATUS", "a\nREADY=1")]),
            Err(NotifyError::InvalidMessage { .. })
        ));
    }

    #[test]
    fn status_text_is_one_bounded_line() {
        assert_eq!(status_text("disk\nfull\r"), "disk full ");
        let long = "é".repeat(MAX_STATUS_BYTES);
        let clipped = status_text(&long);
        assert!(clipped.len() <= MAX_STATUS_BYTES && clipped.chars().all(|c| c == 'é'));
        assert_eq!(Notifier::disabled().status(&long).unwrap(), Sent::Skipped);
    }

    #[test]
    fn watchdog_usec_parsing() {
        assert_eq!(watchdog_timeout(None, None, 5).unwrap(), None);
        assert_eq!(
            watchdog_timeout(Some("30000000"), None, 5).unwrap(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            watchdog_timeout(Some("30000000"), Some("5"), 5).unwrap(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            watchdog_timeout(Some("30000000"), Some("6"), 5).unwrap(),
            None
        );
        assert!(watchdog_timeout(Some("0"), None, 5).is_err());
        assert!(watchdog_timeout(Some("soon"), None, 5).is_err());
    }
}
