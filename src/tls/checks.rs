//! What a verified certificate must also pass, with etcd's flags:
//! revocation lists (`--client-crl-file`, `--peer-crl-file`) and the one
//! name a peer's or client's certificate must carry (`--peer-cert-allowed-cn`,
//! `--peer-cert-allowed-hostname`, `--client-cert-allowed-hostname`).
//!
//! Both are checks on top of the chain's verification against the trusted
//! CAs, never in its place: a certificate that does not chain to them is
//! refused before its name or serial is looked at.
//!
//! - A revocation list is PEM (`X509 CRL` blocks) or DER. A certificate is
//!   refused when a list signed by its issuer names its serial, at any level
//!   of the chain below the trust anchor; a certificate no list speaks for
//!   passes. etcd matches serials from any list without checking who signed
//!   it; here a list counts for its signer's certificates only.
//! - The allowed name is checked on the leaf: its subject common name is the
//!   allowed CN exactly, or it is valid for the allowed hostname (a DNS name
//!   against its DNS subject alternative names, wildcards included, an IP
//!   address against its IP ones; the common name is not used), as Go's
//!   `VerifyHostname` decides for etcd.
//!
//! Both apply to the certificates a member is shown: a client's or a peer's
//! on its ports, and a peer's server certificate when it dials one, as
//! etcd's `VerifyPeerCertificate` does for the name (etcd reads no list when
//! it dials).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::SignatureScheme;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, OtherError};

use super::TlsError;

/// The one name a certificate must carry, and the flag that asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedName {
    /// The subject common name, exactly.
    CommonName { flag: String, cn: String },
    /// A name the certificate is valid for (its subject alternative names).
    Hostname { flag: String, host: String },
}

impl AllowedName {
    /// The allowed name of one side, from its flags; both given is an error
    /// (etcd: "AllowedCN and AllowedHostname are mutually exclusive").
    pub fn from_flags(
        cn: Option<(String, String)>,
        hostname: Option<(String, String)>,
    ) -> Result<Option<AllowedName>, TlsError> {
        match (cn, hostname) {
            (Some((cn_flag, cn)), Some((host_flag, host))) => Err(TlsError::Flag {
                flag: cn_flag,
                reason: format!(
                    "{cn:?} and {host_flag} {host:?} are mutually exclusive: give one of them"
                ),
            }),
            (Some((flag, cn)), None) => {
                if cn.is_empty() {
                    return Ok(None);
                }
                Ok(Some(AllowedName::CommonName { flag, cn }))
            }
            (None, Some((flag, host))) => {
                if host.is_empty() {
                    return Ok(None);
                }
                ServerName::try_from(host.as_str()).map_err(|e| TlsError::Flag {
                    flag: flag.clone(),
                    reason: format!("{host:?} is neither a DNS name nor an IP address: {e}"),
                })?;
                Ok(Some(AllowedName::Hostname { flag, host }))
            }
            (None, None) => Ok(None),
        }
    }

    pub fn flag(&self) -> &str {
        match self {
            AllowedName::CommonName { flag, .. } | AllowedName::Hostname { flag, .. } => flag,
        }
    }

    /// Whether the leaf `der` carries the name; the refusal says why not.
    pub fn check(&self, der: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let refused = |why: String| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(
                NameRefused(format!("{why} ({})", self.flag())),
            ))))
        };
        match self {
            AllowedName::CommonName { cn, .. } => match common_name(der) {
                Some(got) if got == *cn => Ok(()),
                Some(got) => Err(refused(format!(
                    "certificate common name {got:?} is not the allowed {cn:?}"
                ))),
                None => Err(refused(format!(
                    "certificate has no common name; {cn:?} is the allowed one"
                ))),
            },
            AllowedName::Hostname { host, .. } => {
                let name = ServerName::try_from(host.as_str())
                    .map_err(|e| refused(format!("{host:?}: {e}")))?;
                let cert = webpki::EndEntityCert::try_from(der)
                    .map_err(|e| refused(format!("certificate does not parse: {e}")))?;
                cert.verify_is_valid_for_subject_name(&name)
                    .map_err(|_| refused(format!("certificate is not valid for {host:?}")))
            }
        }
    }
}

/// Why a certificate's name was refused, as the handshake error carries it
/// (rustls prints it with `Debug`: the plain text either way).
struct NameRefused(String);

impl std::fmt::Debug for NameRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for NameRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NameRefused {}

/// The subject common name of a DER certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// The revocation lists of a file: PEM `X509 CRL` blocks, or one DER list.
/// Whether each parses is decided when the verifier is built.
pub fn load_crls(
    flag: &str,
    path: &Path,
) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| TlsError::File {
        flag: flag.to_string(),
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let bad = |reason: String| TlsError::File {
        flag: flag.to_string(),
        path: path.to_path_buf(),
        reason,
    };
    if bytes.first() == Some(&0x30) {
        // A DER SEQUENCE: one list as it is.
        return Ok(vec![CertificateRevocationListDer::from(bytes)]);
    }
    let crls = CertificateRevocationListDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not a PEM revocation list file: {e}")))?;
    if crls.is_empty() {
        return Err(bad(
            "no revocation list found (expected PEM \"X509 CRL\" blocks or DER)".to_string(),
        ));
    }
    Ok(crls)
}

/// A client verifier that also checks the leaf's allowed name.
#[derive(Debug)]
pub struct NamedClientVerifier {
    pub inner: Arc<dyn ClientCertVerifier>,
    pub allowed: AllowedName,
}

impl ClientCertVerifier for NamedClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        self.allowed.check(end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }
}

/// A server verifier (this member dialing a peer) that also checks the
/// leaf's allowed name.
#[derive(Debug)]
pub struct NamedServerVerifier {
    pub inner: Arc<dyn ServerCertVerifier>,
    pub allowed: AllowedName,
}

impl ServerCertVerifier for NamedServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        self.allowed.check(end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }

    fn root_hint_subjects(&self) -> Option<&[DistinguishedName]> {
        self.inner.root_hint_subjects()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::source::{CertSource, CertSpec};
    use crate::tls::Side;
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer,
        DnType, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams, SerialNumber,
    };
    use std::path::PathBuf;

    type Issuer = CertifiedIssuer<'static, KeyPair>;

    fn new_ca(name: &str) -> Issuer {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    }

    /// A leaf of `ca` named `cn`, valid for `names`, with serial `serial`:
    /// (cert, key) as PEM.
    fn leaf(ca: &Issuer, cn: &str, names: &[&str], serial: u64) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.serial_number = Some(SerialNumber::from(serial));
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, ca).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn crl(ca: &Issuer, revoked: &[u64]) -> String {
        CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2024, 1, 1),
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|&serial| RevokedCertParams {
                    serial_number: SerialNumber::from(serial),
                    revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(ca)
        .unwrap()
        .pem()
        .unwrap()
    }

    fn put(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    /// A peer-side source of `name`'s certificate, trusting `ca_file`, with
    /// the given list and allowed name.
    fn source(
        dir: &Path,
        name: &str,
        (cert, key): &(String, String),
        ca_file: &Path,
        crl_file: Option<PathBuf>,
        allowed: Option<AllowedName>,
    ) -> CertSource {
        let spec = CertSpec {
            side: Side::Peer,
            cert_file: dir.join(format!("{name}.pem")),
            key_file: dir.join(format!("{name}-key.pem")),
            trusted_ca_file: Some(ca_file.to_path_buf()),
            require_client_cert: true,
            self_signed: false,
            alpn: Vec::new(),
            crl_file,
            allowed,
        };
        put(&spec.cert_file, cert);
        put(&spec.key_file, key);
        CertSource::new(spec, crate::tls::provider(&[])).unwrap()
    }

    /// One handshake of `client` dialing `server` at 127.0.0.1 over memory:
    /// the server's and the client's outcome, errors as text.
    fn handshake(
        server: &CertSource,
        client: &CertSource,
    ) -> (Result<(), String>, Result<(), String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let acceptor = tokio_rustls::TlsAcceptor::from(server.server_config());
        let connector = tokio_rustls::TlsConnector::from(client.client_config());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (a, b) = tokio::io::duplex(1 << 16);
            let serve = async move {
                let mut s = acceptor.accept(a).await.map_err(|e| e.to_string())?;
                let mut byte = [0u8; 1];
                s.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
                s.write_all(&byte).await.map_err(|e| e.to_string())?;
                s.flush().await.map_err(|e| e.to_string())
            };
            let dial = async move {
                let name = ServerName::try_from("127.0.0.1").unwrap();
                let mut c = connector
                    .connect(name, b)
                    .await
                    .map_err(|e| e.to_string())?;
                c.write_all(b"x").await.map_err(|e| e.to_string())?;
                c.flush().await.map_err(|e| e.to_string())?;
                let mut byte = [0u8; 1];
                c.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
                Ok(())
            };
            tokio::join!(serve, dial)
        })
    }

    fn cn(name: &str) -> Option<AllowedName> {
        Some(AllowedName::CommonName {
            flag: "--peer-cert-allowed-cn".into(),
            cn: name.into(),
        })
    }

    fn host(name: &str) -> Option<AllowedName> {
        Some(AllowedName::Hostname {
            flag: "--peer-cert-allowed-hostname".into(),
            host: name.into(),
        })
    }

    #[test]
    fn revoked_certificates_are_refused_both_ways_and_the_list_is_reread() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ca = new_ca("test CA");
        let ca_file = d.join("ca.pem");
        put(&ca_file, &ca.pem());
        let crl_file = d.join("crl.pem");
        put(&crl_file, &crl(&ca, &[2]));
        let local = &["127.0.0.1", "localhost"];
        let server = source(
            d,
            "a",
            &leaf(&ca, "peer", local, 1),
            &ca_file,
            Some(crl_file.clone()),
            None,
        );
        let good = source(d, "b", &leaf(&ca, "peer", local, 3), &ca_file, None, None);
        let revoked = source(d, "c", &leaf(&ca, "peer", local, 2), &ca_file, None, None);

        assert_eq!(handshake(&server, &good), (Ok(()), Ok(())));
        let (served, _) = handshake(&server, &revoked);
        let err = served.unwrap_err();
        assert!(err.contains("Revoked"), "{err}");

        // Dialing: the member with the list refuses a revoked server.
        let dialer = source(
            d,
            "e",
            &leaf(&ca, "peer", local, 4),
            &ca_file,
            Some(crl_file.clone()),
            None,
        );
        let (_, dialed) = handshake(&revoked, &dialer);
        let err = dialed.unwrap_err();
        assert!(err.contains("Revoked"), "{err}");

        // A list of another CA says nothing about this CA's certificates.
        let other_ca = new_ca("another CA");
        put(&crl_file, &crl(&other_ca, &[2, 3]));
        assert_eq!(handshake(&server, &revoked), (Ok(()), Ok(())));

        // A new list is used at the next handshake, DER as well as PEM.
        let der = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2024, 1, 1),
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(2u64),
            issuing_distribution_point: None,
            revoked_certs: vec![RevokedCertParams {
                serial_number: SerialNumber::from(3u64),
                revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                reason_code: None,
                invalidity_date: None,
            }],
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&ca)
        .unwrap();
        let tmp = crl_file.with_extension("tmp");
        std::fs::write(&tmp, der.der().as_ref()).unwrap();
        std::fs::rename(&tmp, &crl_file).unwrap();
        let (served, _) = handshake(&server, &good);
        assert!(served.unwrap_err().contains("Revoked"));
        assert_eq!(handshake(&server, &revoked), (Ok(()), Ok(())));
    }

    #[test]
    fn only_the_allowed_name_gets_in_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ca = new_ca("test CA");
        let ca_file = d.join("ca.pem");
        put(&ca_file, &ca.pem());
        let local = &["127.0.0.1", "localhost"];
        let peer = leaf(&ca, "peer", local, 1);
        let other = leaf(&ca, "other", &["127.0.0.1", "node.example.com"], 2);
        let wild = leaf(&ca, "peer", &["127.0.0.1", "*.example.com"], 3);

        let by_cn = source(d, "a", &peer, &ca_file, None, cn("peer"));
        assert_eq!(
            handshake(&by_cn, &source(d, "b", &peer, &ca_file, None, None)),
            (Ok(()), Ok(()))
        );
        let (served, _) = handshake(&by_cn, &source(d, "c", &other, &ca_file, None, None));
        let err = served.unwrap_err();
        assert!(
            err.contains("common name \"other\" is not the allowed \"peer\"")
                && err.contains("--peer-cert-allowed-cn"),
            "{err}"
        );
        // Dialing a server whose name is not the allowed one.
        let (_, dialed) = handshake(&source(d, "e", &other, &ca_file, None, None), &by_cn);
        assert!(dialed.unwrap_err().contains("not the allowed"));

        let by_host = source(d, "f", &peer, &ca_file, None, host("node.example.com"));
        let (served, _) = handshake(&by_host, &source(d, "g", &peer, &ca_file, None, None));
        assert!(served
            .unwrap_err()
            .contains("not valid for \"node.example.com\""));
        for (name, cert) in [("h", &other), ("i", &wild)] {
            let dialer = source(d, name, cert, &ca_file, None, None);
            assert_eq!(handshake(&by_host, &dialer), (Ok(()), Ok(())), "{name}");
        }
        // An IP address is matched against the IP names, not the CN.
        let by_ip = source(d, "j", &peer, &ca_file, None, host("127.0.0.1"));
        assert_eq!(
            handshake(&by_ip, &source(d, "k", &other, &ca_file, None, None)),
            (Ok(()), Ok(()))
        );
        let no_ip = leaf(&ca, "127.0.0.1", &["localhost"], 4);
        let (served, _) = handshake(&by_ip, &source(d, "l", &no_ip, &ca_file, None, None));
        assert!(served.is_err());
    }

    #[test]
    fn flags_and_files_are_checked_at_start() {
        let both = AllowedName::from_flags(
            Some(("--peer-cert-allowed-cn".into(), "a".into())),
            Some(("--peer-cert-allowed-hostname".into(), "b".into())),
        )
        .unwrap_err()
        .to_string();
        assert!(
            both.starts_with("--peer-cert-allowed-cn") && both.contains("mutually exclusive"),
            "{both}"
        );
        let bad = AllowedName::from_flags(
            None,
            Some(("--peer-cert-allowed-hostname".into(), "a b".into())),
        )
        .unwrap_err()
        .to_string();
        assert!(bad.starts_with("--peer-cert-allowed-hostname"), "{bad}");
        assert_eq!(
            AllowedName::from_flags(Some(("f".into(), String::new())), None).unwrap(),
            None
        );

        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ca = new_ca("test CA");
        let ca_file = d.join("ca.pem");
        put(&ca_file, &ca.pem());
        let garbage = d.join("garbage.pem");
        put(
            &garbage,
            "-----BEGIN X509 CRL-----\nbm90IGEgbGlzdA==\n-----END X509 CRL-----\n",
        );
        let text = d.join("text.pem");
        put(&text, "just text\n");
        for file in [&garbage, &text, &d.join("missing.pem")] {
            let spec = CertSpec {
                side: Side::Peer,
                cert_file: d.join("a.pem"),
                key_file: d.join("a-key.pem"),
                trusted_ca_file: Some(ca_file.clone()),
                require_client_cert: true,
                self_signed: false,
                alpn: Vec::new(),
                crl_file: Some(file.clone()),
                allowed: None,
            };
            let (cert, key) = leaf(&ca, "peer", &["127.0.0.1"], 1);
            put(&spec.cert_file, &cert);
            put(&spec.key_file, &key);
            let err = CertSource::new(spec, crate::tls::provider(&[]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("--peer-crl-file") && err.contains(&file.display().to_string()),
                "{err}"
            );
        }
    }
}
