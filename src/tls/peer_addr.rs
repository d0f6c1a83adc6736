//! etcd's check of a peer's client certificate against the address it
//! connects from: a certificate stolen from one member's host does not let
//! another host join the peer port.
//!
//! After the handshake verified the chain, the leaf's subject alternative
//! names are matched against the connection's remote IP, as etcd 3.4's peer
//! listener does (`checkCertSAN`), unless
//! `--experimental-peer-skip-client-san-verification` is given:
//! - a certificate with no IP or DNS names passes;
//! - the remote IP among its IP names passes;
//! - failing that, when it has DNS names: a name of the remote IP by reverse
//!   lookup equal to one of them, or under one of its wildcards
//!   (`*.example.com`), passes; so does a name of it whose forward lookup
//!   gives the remote IP;
//! - anything else is refused, and the peer port logs why.
//!
//! The lookups are the system's (`getnameinfo`, `getaddrinfo`, so
//! `/etc/hosts` first), off the core, and made only when the IP names did
//! not decide.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// The names a certificate is valid for: its IP and its DNS subject
/// alternative names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertNames {
    pub ips: Vec<IpAddr>,
    pub dns: Vec<String>,
}

impl CertNames {
    /// The names of the DER certificate `leaf`.
    pub fn of(leaf: &[u8]) -> Result<CertNames, String> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf)
            .map_err(|e| format!("peer certificate does not parse: {e}"))?;
        let mut names = CertNames::default();
        let sans = cert
            .subject_alternative_name()
            .map_err(|e| format!("peer certificate's alternative names do not parse: {e}"))?;
        for name in sans.iter().flat_map(|ext| ext.value.general_names.iter()) {
            match name {
                GeneralName::DNSName(dns) => names.dns.push(dns.to_string()),
                GeneralName::IPAddress(bytes) => {
                    if let Ok(v4) = <[u8; 4]>::try_from(*bytes) {
                        names.ips.push(IpAddr::from(v4));
                    } else if let Ok(v6) = <[u8; 16]>::try_from(*bytes) {
                        names.ips.push(IpAddr::from(v6));
                    } else {
                        // Go refuses such a certificate outright.
                        return Err(format!(
                            "peer certificate has an IP name of {} bytes",
                            bytes.len()
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(names)
    }

    /// The answer the IP names give for `remote`, or None when the DNS
    /// names must be looked up.
    pub fn by_address(&self, remote: IpAddr) -> Option<Result<(), String>> {
        if self.ips.is_empty() && self.dns.is_empty() {
            return Some(Ok(()));
        }
        let remote = remote.to_canonical();
        if self.ips.iter().any(|ip| ip.to_canonical() == remote) {
            return Some(Ok(()));
        }
        if self.dns.is_empty() {
            let valid: Vec<String> = self.ips.iter().map(IpAddr::to_string).collect();
            return Some(Err(format!(
                "peer certificate is valid for {}, not {remote}, the address it connected from",
                valid.join(", ")
            )));
        }
        None
    }

    /// The answer the DNS names give for `remote`, by `resolver`.
    pub fn by_dns(&self, remote: IpAddr, resolver: &dyn Resolve) -> Result<(), String> {
        let remote = remote.to_canonical();
        let (wildcards, exact): (Vec<&String>, Vec<&String>) =
            self.dns.iter().partition(|n| n.starts_with("*."));
        let mut lookup_error = None;
        match resolver.names_of(remote) {
            Ok(found) => {
                for name in found {
                    let name = name.trim_end_matches('.');
                    // Bytes, not chars: a name need not be ASCII.
                    let under = |w: &&String| {
                        let (name, suffix) = (name.as_bytes(), &w.as_bytes()[1..]);
                        name.len() > suffix.len()
                            && name[name.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                    };
                    if wildcards.iter().any(under)
                        || exact.iter().any(|n| n.eq_ignore_ascii_case(name))
                    {
                        return Ok(());
                    }
                }
            }
            Err(e) => lookup_error = Some(e),
        }
        for name in &exact {
            match resolver.addrs_of(name) {
                Ok(addrs) => {
                    if addrs.iter().any(|a| a.to_canonical() == remote) {
                        return Ok(());
                    }
                }
                Err(e) => lookup_error = Some(e),
            }
        }
        let why = lookup_error.map_or(String::new(), |e| format!(" (lookup: {e})"));
        Err(format!(
            "{remote}, the address the peer connected from, does not match any of its \
             certificate's DNS names {:?}{why}",
            self.dns
        ))
    }
}

/// The check of an accepted peer's certificate `leaf` against `peer_addr`:
/// decided at once by its IP names, else by lookups on the blocking pool.
pub fn check(leaf: &[u8], peer_addr: SocketAddr) -> cairn_net::tls::AcceptCheck {
    let decided = |r| -> cairn_net::tls::AcceptCheck { Box::pin(std::future::ready(r)) };
    let names = match CertNames::of(leaf) {
        Ok(names) => names,
        Err(e) => return decided(Err(e)),
    };
    let remote = peer_addr.ip();
    if let Some(answer) = names.by_address(remote) {
        return decided(answer);
    }
    Box::pin(async move {
        tokio::task::spawn_blocking(move || names.by_dns(remote, &SystemResolver))
            .await
            .unwrap_or_else(|e| Err(format!("peer address check failed: {e}")))
    })
}

/// Name lookups, a seam for tests.
pub trait Resolve: Send + Sync {
    /// Names of `ip` (reverse lookup).
    fn names_of(&self, ip: IpAddr) -> io::Result<Vec<String>>;
    /// Addresses of `name` (forward lookup).
    fn addrs_of(&self, name: &str) -> io::Result<Vec<IpAddr>>;
}

/// The system's resolver: blocking calls, made off the core.
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn names_of(&self, ip: IpAddr) -> io::Result<Vec<String>> {
        let addr = socket2::SockAddr::from(SocketAddr::new(ip, 0));
        let mut host = [0 as libc::c_char; 1025];
        // SAFETY: `addr` is a valid socket address of `addr.len()` bytes that
        // outlives the call; `host` is a writable buffer of the length given;
        // no service buffer is asked for (null, length 0).
        let rc = unsafe {
            libc::getnameinfo(
                addr.as_ptr().cast(),
                addr.len(),
                host.as_mut_ptr(),
                host.len() as libc::socklen_t,
                std::ptr::null_mut(),
                0,
                libc::NI_NAMEREQD,
            )
        };
        if rc != 0 {
            // SAFETY: gai_strerror returns a static, NUL-terminated string.
            let text = unsafe { CStr::from_ptr(libc::gai_strerror(rc)) };
            return Err(io::Error::other(format!(
                "no name for {ip}: {}",
                text.to_string_lossy()
            )));
        }
        // SAFETY: on success getnameinfo wrote a NUL-terminated name into `host`.
        let name = unsafe { CStr::from_ptr(host.as_ptr()) };
        Ok(vec![name.to_string_lossy().into_owned()])
    }

    fn addrs_of(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        Ok((name, 0).to_socket_addrs()?.map(|a| a.ip()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    fn names_of_cert(sans: &[&str]) -> CertNames {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(sans)
            .unwrap()
            .self_signed(&key)
            .unwrap();
        CertNames::of(cert.der()).unwrap()
    }

    /// A resolver of fixed answers.
    struct Fixed {
        reverse: Vec<(IpAddr, &'static str)>,
        forward: Vec<(&'static str, IpAddr)>,
    }

    impl Resolve for Fixed {
        fn names_of(&self, ip: IpAddr) -> io::Result<Vec<String>> {
            let names: Vec<String> = self
                .reverse
                .iter()
                .filter(|(a, _)| *a == ip)
                .map(|(_, n)| n.to_string())
                .collect();
            if names.is_empty() {
                return Err(io::Error::other("no name"));
            }
            Ok(names)
        }

        fn addrs_of(&self, name: &str) -> io::Result<Vec<IpAddr>> {
            Ok(self
                .forward
                .iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, a)| *a)
                .collect())
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ip_names_decide_without_a_lookup() {
        let c = names_of_cert(&["10.0.0.1", "127.0.0.1"]);
        assert_eq!(c.ips, [ip("10.0.0.1"), ip("127.0.0.1")]);
        assert_eq!(c.by_address(ip("127.0.0.1")), Some(Ok(())));
        assert_eq!(c.by_address(ip("::ffff:10.0.0.1")), Some(Ok(())));
        let err = c.by_address(ip("10.0.0.2")).unwrap().unwrap_err();
        assert!(
            err.contains("valid for 10.0.0.1, 127.0.0.1, not 10.0.0.2"),
            "{err}"
        );
        // No names at all: nothing to check, as etcd.
        let key = KeyPair::generate().unwrap();
        let bare = CertificateParams::default().self_signed(&key).unwrap();
        let bare = CertNames::of(bare.der()).unwrap();
        assert_eq!(bare.by_address(ip("10.9.9.9")), Some(Ok(())));
        // An IP that does not match, with DNS names beside: look them up.
        let mixed = names_of_cert(&["10.0.0.1", "node1.example"]);
        assert_eq!(mixed.by_address(ip("10.0.0.2")), None);
    }

    #[test]
    fn dns_names_match_by_reverse_then_forward_lookup() {
        let c = names_of_cert(&["node1.example", "*.pool.example"]);
        assert_eq!(c.by_address(ip("10.0.0.1")), None);
        let resolver = Fixed {
            reverse: vec![
                (ip("10.0.0.1"), "NODE1.example."),
                (ip("10.0.0.7"), "m7.pool.example"),
                (ip("10.0.0.8"), "pool.example"),
                // Not ASCII where the wildcard's suffix would begin.
                (ip("10.0.0.5"), "é.example"),
            ],
            forward: vec![("node1.example", ip("10.0.0.2"))],
        };
        // Reverse: an exact name, any case, trailing dot; a wildcard's subdomain.
        assert_eq!(c.by_dns(ip("10.0.0.1"), &resolver), Ok(()));
        assert_eq!(c.by_dns(ip("10.0.0.7"), &resolver), Ok(()));
        // Forward: node1.example resolves to 10.0.0.2.
        assert_eq!(c.by_dns(ip("10.0.0.2"), &resolver), Ok(()));
        // The wildcard's own domain is not under it; an unknown address fails
        // naming the lookup's error.
        assert!(c.by_dns(ip("10.0.0.8"), &resolver).is_err());
        let short = names_of_cert(&["*.xexample"]);
        assert!(
            short.by_dns(ip("10.0.0.5"), &resolver).is_err(),
            "no panic, no match"
        );
        let err = c.by_dns(ip("10.0.0.9"), &resolver).unwrap_err();
        assert!(
            err.contains("does not match")
                && err.contains("node1.example")
                && err.contains("no name"),
            "{err}"
        );
    }

    #[test]
    fn the_system_resolver_names_loopback() {
        // /etc/hosts names 127.0.0.1 on every Debian system.
        let names = SystemResolver.names_of(ip("127.0.0.1")).unwrap();
        assert!(!names.is_empty(), "{names:?}");
        let addrs = SystemResolver.addrs_of("localhost").unwrap();
        assert!(addrs.iter().any(|a| a.is_loopback()), "{addrs:?}");
    }
}
