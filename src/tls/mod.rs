//! TLS on the client and peer ports, with etcd's flags and meaning (rustls
//! with the ring provider; no OpenSSL in the daemon).
//!
//! - [`TlsFiles`]: one port's flags (`--cert-file`, `--key-file`,
//!   `--trusted-ca-file`, `--client-cert-auth`, `--auto-tls`, and the same
//!   with `peer-`; the revocation list, the allowed name and the peer
//!   address check), and [`parse_cipher_suites`] for `--cipher-suites`.
//! - [`checks`]: what a verified certificate must also pass, wrapped around
//!   rustls's verifiers: the allowed name, and the naming of a revoked
//!   certificate; [`revocation`]: the revocation lists, loaded and checked
//!   against the trusted CAs; [`peer_addr`]: a peer's client certificate
//!   against the address it connects from.
//! - [`source`]: loads the files into rustls configs and re-reads them when
//!   they change, checked at every handshake (etcd re-reads its certificate
//!   per handshake), so certificates rotate without a restart.
//! - [`auto`]: `--auto-tls` / `--peer-auto-tls`, self-signed certificates in
//!   `<data-dir>/fixtures/{client,peer}/`, as etcd makes them.
//! - [`client_port`]: the TLS side of the client port, before the sniffing
//!   that sends HTTP/2 to gRPC and HTTP/1 to the health and metrics endpoints.
//!
//! etcd 3.4's meaning, kept here: a server asks for and verifies a client
//! certificate when `--client-cert-auth` is set *or* `--trusted-ca-file` is
//! given (against the system's CAs when only the former is); an `http://`
//! URL serves in clear even with certificates given (a warning says so);
//! `--auto-tls` is ignored, with a warning, when certificate files are given;
//! a member dialing a peer presents its peer certificate and checks the
//! peer's against `--peer-trusted-ca-file` and the dialed host, except with
//! `--peer-auto-tls`, whose self-signed certificates are not checked (and
//! `--peer-client-cert-auth` is then ignored, as by etcd).

pub mod auto;
pub mod checks;
pub mod client_port;
pub mod peer_addr;
pub mod revocation;
pub mod source;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{CipherSuite, SupportedCipherSuite};

pub use checks::AllowedName;
pub use client_port::{ClientConn, ClientConnInfo, ClientPortTls};
pub use source::CertSource;

/// One port's TLS flags, as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub trusted_ca_file: Option<PathBuf>,
    pub client_cert_auth: bool,
    pub auto_tls: bool,
    /// `--client-crl-file` / `--peer-crl-file`: revoked certificates.
    pub crl_file: Option<PathBuf>,
    /// `--peer-cert-allowed-cn` (peers only; no client flag in etcd 3.4).
    pub allowed_cn: Option<String>,
    /// `--client-cert-allowed-hostname` / `--peer-cert-allowed-hostname`.
    pub allowed_hostname: Option<String>,
    /// `--experimental-peer-skip-client-san-verification` (peers only).
    pub skip_client_san_verify: bool,
}

impl TlsFiles {
    /// Whether certificate files are given (then `--auto-tls` is ignored).
    pub fn has_files(&self) -> bool {
        self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Whether the port can serve TLS: files given, or auto TLS.
    pub fn can_serve(&self) -> bool {
        self.has_files() || self.auto_tls
    }
}

/// Which port a setting belongs to; names its flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Peer,
}

impl Side {
    /// The flag `name` (say `cert-file`) of this side: `--cert-file` or
    /// `--peer-cert-file`.
    pub fn flag(self, name: &str) -> String {
        match self {
            Side::Client => format!("--{name}"),
            Side::Peer => format!("--peer-{name}"),
        }
    }

    pub fn auto_flag(self) -> &'static str {
        match self {
            Side::Client => "--auto-tls",
            Side::Peer => "--peer-auto-tls",
        }
    }

    /// `--client-crl-file` or `--peer-crl-file`.
    pub fn crl_flag(self) -> &'static str {
        match self {
            Side::Client => "--client-crl-file",
            Side::Peer => "--peer-crl-file",
        }
    }

    /// `--client-cert-allowed-hostname` or `--peer-cert-allowed-hostname`.
    pub fn allowed_hostname_flag(self) -> &'static str {
        match self {
            Side::Client => "--client-cert-allowed-hostname",
            Side::Peer => "--peer-cert-allowed-hostname",
        }
    }

    /// The folder of `<data-dir>/fixtures/` auto TLS writes to (etcd's names).
    pub fn fixtures_dir(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Peer => "peer",
        }
    }
}

/// A TLS setting or file that cannot be used; names the flag and the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("{flag} {}: {reason}", path.display())]
    File {
        flag: String,
        path: PathBuf,
        reason: String,
    },
    #[error("{flag}: {reason}")]
    Flag { flag: String, reason: String },
}

/// A file of a TLS flag that cannot be used.
pub(crate) fn file_error(flag: String, path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::File {
        flag,
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The bytes of a file a TLS flag names.
pub(crate) fn read(flag: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path)
        .map_err(|e: std::io::Error| file_error(flag.to_string(), path, e.to_string()))
}

/// A handshake refusal with its reason in words (a revoked or misnamed
/// certificate, one from another address).
pub(crate) fn refusal(why: String) -> rustls::Error {
    rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(
        Arc::new(Refusal(why)),
    )))
}

/// Why a certificate was refused, as the handshake error carries it; rustls
/// prints it inside `invalid peer certificate: Other(OtherError(...))`, with
/// `Debug`, which is the plain text here.
pub struct Refusal(pub String);

impl std::fmt::Debug for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

/// Cipher suites by the names etcd takes (Go's), each with the rustls suite
/// it names. Go also spells the ChaCha20 ones without `_SHA256`.
const CIPHER_SUITES: &[(&str, CipherSuite)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// Suites etcd accepts that rustls does not implement (CBC, RC4, 3DES, RSA
/// key exchange): refused with a message saying so rather than "unknown".
const GO_ONLY_SUITES: &[&str] = &[
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

/// The TLS 1.2 suites `--cipher-suites` names (etcd's names). As with etcd,
/// the list limits TLS 1.2 only: TLS 1.3's suites are always offered.
pub fn parse_cipher_suites(names: &[String]) -> Result<Vec<CipherSuite>, TlsError> {
    let flag = || "--cipher-suites".to_string();
    let mut suites = Vec::new();
    for name in names {
        let Some((_, suite)) = CIPHER_SUITES.iter().find(|(n, _)| n == name) else {
            let supported: Vec<&str> = CIPHER_SUITES.iter().map(|(n, _)| *n).collect();
            let reason = if GO_ONLY_SUITES.contains(&name.as_str()) {
                format!(
                    "{name:?} is not implemented by rustls (no CBC, RC4, 3DES or RSA key \
                     exchange); supported: {}",
                    supported.join(", ")
                )
            } else {
                format!(
                    "unexpected TLS cipher suite {name:?}; supported: {}",
                    supported.join(", ")
                )
            };
            return Err(TlsError::Flag {
                flag: flag(),
                reason,
            });
        };
        if !suites.contains(suite) {
            suites.push(*suite);
        }
    }
    Ok(suites)
}

/// The ring provider, with TLS 1.2 limited to `tls12` when not empty.
pub fn provider(tls12: &[CipherSuite]) -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    if !tls12.is_empty() {
        provider.cipher_suites.retain(|s| match s {
            SupportedCipherSuite::Tls13(_) => true,
            SupportedCipherSuite::Tls12(_) => tls12.contains(&s.suite()),
        });
    }
    Arc::new(provider)
}

/// ALPN on the client port, in the server's order of preference: a client
/// offering both (curl, browsers, Go's HTTP client) gets HTTP/1.1, which the
/// health, metrics and gateway endpoints speak; gRPC clients offer only
/// `h2` and get it.
pub const CLIENT_PORT_ALPN: [&[u8]; 2] = [b"http/1.1", b"h2"];

/// What a port is asked to do with TLS, besides its flags.
#[derive(Debug, Clone)]
pub struct PortUse<'a> {
    /// Its listen URLs that are https://.
    pub https_urls: usize,
    /// Its listen URLs that are http:// (served in clear whatever the flags).
    pub http_urls: usize,
    /// This member dials https:// URLs of this kind (peers).
    pub dials_https: bool,
    /// Hosts a self-signed certificate is made for (the listen URLs').
    pub hosts: &'a [String],
    /// Where `--auto-tls` keeps its certificates.
    pub data_dir: &'a std::path::Path,
    /// `--cipher-suites`.
    pub cipher_suites: &'a [String],
}

/// The certificate source of one port, or None when it speaks no TLS. Says
/// (as etcd does) when flags are ignored: certificates on a port with only
/// http:// URLs, auto TLS beside certificate files, client certificate
/// checks with auto TLS.
pub fn port_source(
    side: Side,
    files: &TlsFiles,
    port: &PortUse<'_>,
) -> Result<Option<Arc<CertSource>>, TlsError> {
    if port.http_urls > 0 && files.has_files() {
        tracing::warn!(
            side = ?side,
            "scheme is HTTP while key and cert files are present; those URLs serve in clear"
        );
    }
    if port.https_urls == 0 && !port.dials_https {
        return Ok(None);
    }
    if !files.can_serve() {
        return Ok(None);
    }
    let tls12 = parse_cipher_suites(port.cipher_suites)?;
    // etcd 3.4 has an allowed CN for peers only; the config never sets
    // one for clients.
    let allowed = AllowedName::from_flags(
        files
            .allowed_cn
            .clone()
            .map(|cn| ("--peer-cert-allowed-cn".to_string(), cn)),
        files
            .allowed_hostname
            .clone()
            .map(|h| (side.allowed_hostname_flag().to_string(), h)),
    )?;
    let alpn = match side {
        Side::Client => CLIENT_PORT_ALPN.iter().map(|p| p.to_vec()).collect(),
        Side::Peer => Vec::new(),
    };
    let spec = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            if files.auto_tls {
                tracing::warn!(
                    flag = side.auto_flag(),
                    "ignoring auto TLS since certs given"
                );
            }
            let require_client_cert = files.client_cert_auth || files.trusted_ca_file.is_some();
            let checks = checks_given(side, files, &allowed);
            if !require_client_cert && !checks.is_empty() {
                let why = match side {
                    Side::Client => {
                        "client certificates are not asked for (no --client-cert-auth \
                                     or --trusted-ca-file): the checks are not made"
                    }
                    Side::Peer => {
                        "peers dialing in are not asked for a certificate (no \
                                   --peer-client-cert-auth or --peer-trusted-ca-file): the checks \
                                   apply only to the peers this member dials"
                    }
                };
                tracing::warn!(flags = %checks.join(", "), "{why}");
            }
            source::CertSpec {
                side,
                cert_file: cert.clone(),
                key_file: key.clone(),
                trusted_ca_file: files.trusted_ca_file.clone(),
                require_client_cert,
                self_signed: false,
                alpn,
                crl_file: files.crl_file.clone(),
                allowed,
                check_client_addr: side == Side::Peer
                    && require_client_cert
                    && !files.skip_client_san_verify,
            }
        }
        (None, None) => {
            if files.client_cert_auth || files.trusted_ca_file.is_some() {
                tracing::warn!(
                    flag = side.auto_flag(),
                    "client certificates are not checked with auto TLS: {} and {} are ignored",
                    side.flag("client-cert-auth"),
                    side.flag("trusted-ca-file")
                );
            }
            let checks = checks_given(side, files, &allowed);
            if !checks.is_empty() {
                tracing::warn!(
                    flags = %checks.join(", "),
                    auto_flag = side.auto_flag(),
                    "certificates are not checked with auto TLS: the checks are not made"
                );
            }
            let (cert_file, key_file) = auto::self_cert(port.data_dir, side, port.hosts)?;
            source::CertSpec {
                side,
                cert_file,
                key_file,
                trusted_ca_file: None,
                require_client_cert: false,
                self_signed: true,
                alpn,
                crl_file: None,
                allowed: None,
                check_client_addr: false,
            }
        }
        (Some(_), None) => {
            return Err(TlsError::Flag {
                flag: side.flag("key-file"),
                reason: format!("must be given with {}", side.flag("cert-file")),
            })
        }
        (None, Some(_)) => {
            return Err(TlsError::Flag {
                flag: side.flag("cert-file"),
                reason: format!("must be given with {}", side.flag("key-file")),
            })
        }
    };
    CertSource::new(spec, provider(&tls12)).map(|s| Some(Arc::new(s)))
}

/// The flags of the revocation list and allowed name given for `side`:
/// named in the warning when certificates are not checked.
fn checks_given(side: Side, files: &TlsFiles, allowed: &Option<AllowedName>) -> Vec<String> {
    let list = files.crl_file.as_ref().map(|_| side.crl_flag().to_string());
    let name = allowed.as_ref().map(|a| a.flag().to_string());
    list.into_iter().chain(name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cipher_suites_take_etcds_names() {
        let names = [
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_string(),
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305".to_string(),
        ];
        let suites = parse_cipher_suites(&names).unwrap();
        assert_eq!(suites.len(), 2);
        let p = provider(&suites);
        let tls12: Vec<_> = p
            .cipher_suites
            .iter()
            .filter(|s| matches!(s, SupportedCipherSuite::Tls12(_)))
            .map(|s| s.suite())
            .collect();
        // The provider's order of preference, the named suites only.
        assert_eq!(tls12.len(), suites.len());
        assert!(suites.iter().all(|s| tls12.contains(s)), "{tls12:?}");
        assert!(
            p.cipher_suites
                .iter()
                .any(|s| matches!(s, SupportedCipherSuite::Tls13(_))),
            "TLS 1.3 stays"
        );
        for bad in ["TLS_RSA_WITH_AES_128_CBC_SHA", "TLS_MADE_UP"] {
            let err = parse_cipher_suites(&[bad.to_string()]).unwrap_err();
            let text = err.to_string();
            assert!(
                text.starts_with("--cipher-suites") && text.contains(bad),
                "{text}"
            );
        }
    }

    #[test]
    fn flags_are_named_per_side() {
        assert_eq!(Side::Client.flag("cert-file"), "--cert-file");
        assert_eq!(Side::Peer.flag("trusted-ca-file"), "--peer-trusted-ca-file");
        assert_eq!(Side::Peer.auto_flag(), "--peer-auto-tls");
    }
}
