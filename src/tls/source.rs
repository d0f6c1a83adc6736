//! Certificate files into rustls configs, re-read when they change.
//!
//! Every handshake asks [`CertSource`] for its config; it looks at the
//! files' metadata (up to four `stat` calls, a few microseconds against a
//! handshake's hundreds) and rebuilds the configs when any file changed. A
//! change that does not load (a key written before its certificate, a file
//! half copied) keeps the configs in use and is logged once; the next change
//! is tried again. So rotating is: write the new files (ideally each with an
//! atomic rename), and the next handshake uses them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{VerifierBuilderError, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

use super::checks::{AllowedName, CheckedClientVerifier, CheckedServerVerifier, Checks};
use super::peer_addr;
use super::revocation::Lists;
use super::{file_error, read, Side, TlsError};

/// Where the system's CA bundle is looked for, as Go's TLS does on Linux
/// (after `SSL_CERT_FILE`): etcd verifies against it when no CA file is given.
const SYSTEM_CA_FILES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/ssl/cert.pem",
];

/// What one port's TLS is made of, with every choice already made.
#[derive(Debug, Clone)]
pub struct CertSpec {
    pub side: Side,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub trusted_ca_file: Option<PathBuf>,
    /// The server asks for a client certificate and verifies it.
    pub require_client_cert: bool,
    /// Auto TLS: a dialer does not verify the peer's certificate.
    pub self_signed: bool,
    /// ALPN protocols the server offers, in its order of preference.
    pub alpn: Vec<Vec<u8>>,
    /// Revocation lists checked against the certificates this side is
    /// shown (re-read when the file changes, as the certificates are).
    pub crl_file: Option<PathBuf>,
    /// The name those certificates must carry.
    pub allowed: Option<AllowedName>,
    /// A peer's client certificate is checked against the address it
    /// connects from ([`super::peer_addr`]).
    pub check_client_addr: bool,
}

/// A file's identity and contents' version, as far as metadata tells.
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

struct Loaded {
    stamps: Vec<Stamp>,
    /// Stamps of the last change that failed to load: not tried again.
    failed: Option<Vec<Stamp>>,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

/// One port's certificates and keys as rustls configs, re-read when the
/// files change. `Send + Sync`: every core asks the same source.
pub struct CertSource {
    spec: CertSpec,
    provider: Arc<CryptoProvider>,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for CertSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertSource")
            .field("spec", &self.spec)
            .finish()
    }
}

impl CertSource {
    /// Loads the files; an error names the flag and the file at fault.
    pub fn new(spec: CertSpec, provider: Arc<CryptoProvider>) -> Result<CertSource, TlsError> {
        let stamps = spec_stamps(&spec);
        let (server, client) = build(&spec, &provider)?;
        Ok(CertSource {
            spec,
            provider,
            loaded: Mutex::new(Loaded {
                stamps,
                failed: None,
                server,
                client,
            }),
        })
    }

    pub fn spec(&self) -> &CertSpec {
        &self.spec
    }

    /// The server config for the next handshake.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.refreshed(|l| l.server.clone())
    }

    /// The client config (this member dialing a peer) for the next handshake.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.refreshed(|l| l.client.clone())
    }

    fn refreshed<T>(&self, take: impl FnOnce(&Loaded) -> T) -> T {
        let stamps = spec_stamps(&self.spec);
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if stamps != loaded.stamps && loaded.failed.as_ref() != Some(&stamps) {
            match build(&self.spec, &self.provider) {
                Ok((server, client)) => {
                    tracing::info!(
                        cert_file = %self.spec.cert_file.display(),
                        key_file = %self.spec.key_file.display(),
                        trusted_ca_file = ?self.spec.trusted_ca_file,
                        crl_file = ?self.spec.crl_file,
                        side = ?self.spec.side,
                        "TLS files changed on disk; new handshakes use them"
                    );
                    loaded.server = server;
                    loaded.client = client;
                    loaded.stamps = stamps;
                    loaded.failed = None;
                }
                Err(error) => {
                    tracing::warn!(
                        %error,
                        side = ?self.spec.side,
                        "TLS files changed but do not load; handshakes keep the previous ones"
                    );
                    loaded.failed = Some(stamps);
                }
            }
        }
        take(&loaded)
    }
}

impl cairn_net::TlsSource for CertSource {
    fn server_config(&self) -> Result<Arc<ServerConfig>, String> {
        Ok(CertSource::server_config(self))
    }

    fn client_config(&self) -> Result<Arc<ClientConfig>, String> {
        Ok(CertSource::client_config(self))
    }

    fn check_accepted(
        &self,
        leaf: Option<CertificateDer<'static>>,
        peer_addr: SocketAddr,
    ) -> cairn_net::tls::AcceptCheck {
        match (self.spec.check_client_addr, leaf) {
            (true, Some(leaf)) => peer_addr::check(leaf.as_ref(), peer_addr),
            _ => Box::pin(std::future::ready(Ok(()))),
        }
    }
}

fn spec_stamps(spec: &CertSpec) -> Vec<Stamp> {
    let mut stamps = vec![stamp(&spec.cert_file), stamp(&spec.key_file)];
    if let Some(ca) = &spec.trusted_ca_file {
        stamps.push(stamp(ca));
    }
    if let Some(crl) = &spec.crl_file {
        stamps.push(stamp(crl));
    }
    stamps
}

/// Every certificate of a PEM file, each checked to be X.509 that rustls
/// can use.
pub fn load_certs(flag: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(flag, path)?;
    let bad = |reason: String| file_error(flag.to_string(), path, reason);
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(bad(
            "no certificate found (expected PEM \"CERTIFICATE\" blocks)".to_string(),
        ));
    }
    for (i, cert) in certs.iter().enumerate() {
        ParsedCertificate::try_from(cert)
            .map_err(|e| bad(format!("certificate {} is not valid X.509: {e}", i + 1)))?;
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 RSA or SEC1 EC), checked to
/// be one the provider can sign with.
pub fn load_key(
    flag: &str,
    path: &Path,
    provider: &CryptoProvider,
) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(flag, path)?;
    let bad = |reason: String| file_error(flag.to_string(), path, reason);
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        bad(format!(
            "no private key found (expected a PEM \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \
             \"EC PRIVATE KEY\" block): {e}"
        ))
    })?;
    provider
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| bad(format!("not a usable private key: {e}")))?;
    Ok(key)
}

/// A trust store of the CA certificates `certs` of the file `path`.
pub fn roots_of(
    flag: &str,
    path: &Path,
    certs: Vec<CertificateDer<'static>>,
) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            file_error(
                flag.to_string(),
                path,
                format!("certificate {} cannot be a trust anchor: {e}", i + 1),
            )
        })?;
    }
    Ok(roots)
}

/// The system's CA bundle, for a side that verifies with no CA file given.
fn system_roots(why_flag: String) -> Result<RootCertStore, TlsError> {
    let from_env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    let path = from_env
        .into_iter()
        .chain(SYSTEM_CA_FILES.iter().map(PathBuf::from))
        .find(|p| p.is_file())
        .ok_or_else(|| TlsError::Flag {
            flag: why_flag.clone(),
            reason: format!(
                "without a trusted CA file, certificates are checked against the system's \
                 CAs, and no CA bundle was found (SSL_CERT_FILE, {})",
                SYSTEM_CA_FILES.join(", ")
            ),
        })?;
    let pem = read(&why_flag, &path)?;
    let mut roots = RootCertStore::empty();
    // A system bundle may hold certificates webpki cannot use; skip those.
    let certs = CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok);
    roots.add_parsable_certificates(certs);
    Ok(roots)
}

type Configs = (Arc<ServerConfig>, Arc<ClientConfig>);

fn build(spec: &CertSpec, provider: &Arc<CryptoProvider>) -> Result<Configs, TlsError> {
    let side = spec.side;
    let certs = load_certs(&side.flag("cert-file"), &spec.cert_file)?;
    let key = load_key(&side.flag("key-file"), &spec.key_file, provider)?;
    let ca_flag = side.flag("trusted-ca-file");
    let trusted = match &spec.trusted_ca_file {
        Some(path) => Some((path, load_certs(&ca_flag, path)?)),
        None => None,
    };
    let lists = match &spec.crl_file {
        Some(path) => {
            let trusted_certs = trusted.as_ref().map_or(&[][..], |(_, c)| c.as_slice());
            Lists::load(side.crl_flag(), path, trusted_certs)?
        }
        None => Lists::default(),
    };
    let roots = match trusted {
        Some((path, certs)) => {
            let kept = lists.unrevoked(certs);
            if kept.is_empty() {
                return Err(file_error(
                    ca_flag,
                    path,
                    format!("every certificate of it is revoked by {}", side.crl_flag()),
                ));
            }
            Some(roots_of(&ca_flag, path, kept)?)
        }
        None => None,
    };
    let checks = (spec.allowed.is_some() || spec.crl_file.is_some()).then(|| {
        Arc::new(Checks {
            allowed: spec.allowed.clone(),
            lists: lists.clone(),
        })
    });
    let versions = |e: rustls::Error| TlsError::Flag {
        flag: "--cipher-suites".to_string(),
        reason: format!("no usable protocol version: {e}"),
    };
    let mismatch = |e: rustls::Error| {
        file_error(
            side.flag("key-file"),
            &spec.key_file,
            format!(
                "does not go with {} {}: {e}",
                side.flag("cert-file"),
                spec.cert_file.display()
            ),
        )
    };
    let unusable = |flag: String, whose: &str, e: VerifierBuilderError| TlsError::Flag {
        flag,
        reason: format!("cannot verify {whose} certificates: {e}"),
    };

    let server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(versions)?;
    let server = if spec.require_client_cert {
        let roots = match &roots {
            Some(r) => r.clone(),
            None => system_roots(side.flag("client-cert-auth"))?,
        };
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .with_crls(lists.ders())
                .allow_unknown_revocation_status()
                .build()
                .map_err(|e| unusable(ca_flag.clone(), "client", e))?;
        let verifier: Arc<dyn ClientCertVerifier> = match &checks {
            Some(checks) => Arc::new(CheckedClientVerifier {
                inner: verifier,
                checks: checks.clone(),
            }),
            None => verifier,
        };
        server.with_client_cert_verifier(verifier)
    } else {
        server.with_no_client_auth()
    };
    let mut server = server
        .with_single_cert(certs.clone(), key.clone_key())
        .map_err(mismatch)?;
    server.alpn_protocols = spec.alpn.clone();

    let client = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(versions)?;
    let client = if spec.self_signed {
        client
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SelfSignedPeer {
                provider: provider.clone(),
            }))
    } else {
        let roots = match roots {
            Some(r) => r,
            None => system_roots(ca_flag.clone())?,
        };
        match &checks {
            // A system bundle with no usable CA: nothing verifies, as before
            // lists and names existed.
            _ if roots.is_empty() => client.with_root_certificates(roots),
            None => client.with_root_certificates(roots),
            Some(checks) => {
                let verifier =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .with_crls(lists.ders())
                        .allow_unknown_revocation_status()
                        .build()
                        .map_err(|e| unusable(ca_flag.clone(), "peer", e))?;
                client
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(CheckedServerVerifier {
                        inner: verifier,
                        checks: checks.clone(),
                    }))
            }
        }
    };
    let client = client.with_client_auth_cert(certs, key).map_err(mismatch)?;
    Ok((Arc::new(server), Arc::new(client)))
}

/// Auto TLS's dialer: peers' certificates are self-signed, so (as etcd does)
/// they are not checked against a CA or a name; the handshake's signatures
/// still are, so the session is encrypted to the holder of the key.
#[derive(Debug)]
struct SelfSignedPeer {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for SelfSignedPeer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

    fn ca() -> CertifiedIssuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    }

    fn leaf(ca: &CertifiedIssuer<'static, KeyPair>) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, ca)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn put(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn changed_files_are_used_at_the_next_handshake_and_bad_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca();
        let spec = CertSpec {
            side: Side::Client,
            cert_file: dir.path().join("cert.pem"),
            key_file: dir.path().join("key.pem"),
            trusted_ca_file: Some(dir.path().join("ca.pem")),
            require_client_cert: true,
            self_signed: false,
            alpn: vec![b"h2".to_vec()],
            crl_file: None,
            allowed: None,
            check_client_addr: false,
        };
        let (cert, key) = leaf(&ca);
        put(&spec.cert_file, &cert);
        put(&spec.key_file, &key);
        put(spec.trusted_ca_file.as_ref().unwrap(), &ca.pem());
        let source = CertSource::new(spec.clone(), super::super::provider(&[])).unwrap();
        let first = source.server_config();
        assert!(
            Arc::ptr_eq(&first, &source.server_config()),
            "unchanged files are not re-read"
        );
        assert_eq!(first.alpn_protocols, vec![b"h2".to_vec()]);

        // A new certificate and key: the next handshake gets a new config.
        let (cert2, key2) = leaf(&ca);
        put(&spec.key_file, &key2);
        put(&spec.cert_file, &cert2);
        let second = source.server_config();
        assert!(!Arc::ptr_eq(&first, &second));

        // A key that does not go with the certificate keeps the last good
        // config, and is not tried again until the files change again.
        put(&spec.key_file, &key);
        let kept = source.server_config();
        assert!(Arc::ptr_eq(&second, &kept));
        assert!(Arc::ptr_eq(&second, &source.server_config()));
        put(&spec.cert_file, &cert);
        assert!(
            !Arc::ptr_eq(&second, &source.server_config()),
            "the fix is picked up"
        );
    }

    #[test]
    fn bad_files_name_their_flag_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca();
        let (cert, key) = leaf(&ca);
        let cert_file = dir.path().join("cert.pem");
        let key_file = dir.path().join("key.pem");
        put(&cert_file, &cert);
        put(&key_file, &key);
        let spec = CertSpec {
            side: Side::Peer,
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
            trusted_ca_file: None,
            require_client_cert: false,
            self_signed: true,
            alpn: Vec::new(),
            crl_file: None,
            allowed: None,
            check_client_addr: false,
        };
        CertSource::new(spec.clone(), super::super::provider(&[])).unwrap();
        put(
            &key_file,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        );
        let err = CertSource::new(spec.clone(), super::super::provider(&[])).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("--peer-key-file") && text.contains(&key_file.display().to_string()),
            "{text}"
        );
        put(&key_file, &key);
        put(&cert_file, "no PEM here\n");
        let err = CertSource::new(spec, super::super::provider(&[])).unwrap_err();
        assert!(err.to_string().starts_with("--peer-cert-file"), "{err}");
    }
}
