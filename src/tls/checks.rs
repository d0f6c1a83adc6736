//! What a verified certificate must also pass, with etcd's flags: the
//! revocation lists of [`super::revocation`] (`--client-crl-file`,
//! `--peer-crl-file`) and the one name a peer's or client's certificate must
//! carry (`--peer-cert-allowed-cn`, `--peer-cert-allowed-hostname`,
//! `--client-cert-allowed-hostname`).
//!
//! Both are checks on top of the chain's verification against the trusted
//! CAs, never in its place: a certificate that does not chain to them is
//! refused before its name or serial is looked at. rustls checks the lists
//! while it verifies the chain; [`Checks`] then names what a list revoked and
//! checks the allowed name, wrapped around rustls's verifiers
//! ([`CheckedClientVerifier`], [`CheckedServerVerifier`]).
//!
//! The allowed name is checked on the leaf: its subject common name is the
//! allowed CN exactly (the last CN of the subject, as Go reads it), or it is
//! valid for the allowed hostname (a DNS name against its DNS subject
//! alternative names, wildcards included, an IP address against its IP ones;
//! the common name is not used), as Go's `VerifyHostname` decides for etcd.
//!
//! Both apply to the certificates a member is shown: a client's or a peer's
//! on its ports, and a peer's server certificate when it dials one, as
//! etcd's `VerifyPeerCertificate` does for the name (etcd reads no list when
//! it dials).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::SignatureScheme;
use rustls::{DigitallySignedStruct, DistinguishedName};

use super::peer_addr::CertNames;
use super::revocation::Lists;
use super::{refusal, TlsError};

/// The one name a certificate must carry, and the flag that asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedName {
    /// The subject common name, exactly.
    CommonName { flag: String, cn: String },
    /// A name the certificate is valid for (its subject alternative names).
    Hostname { flag: String, host: String },
}

impl AllowedName {
    /// The allowed name of one side from its flags, each `(flag, value)`; an
    /// empty value is no value (etcd's), and both given is an error (etcd:
    /// "AllowedCN and AllowedHostname are mutually exclusive"). An IPv6
    /// hostname may come in brackets.
    pub fn from_flags(
        cn: Option<(String, String)>,
        hostname: Option<(String, String)>,
    ) -> Result<Option<AllowedName>, TlsError> {
        let given = |v: Option<(String, String)>| v.filter(|(_, value)| !value.is_empty());
        match (given(cn), given(hostname)) {
            (Some((cn_flag, cn)), Some((host_flag, host))) => Err(TlsError::Flag {
                flag: cn_flag,
                reason: format!(
                    "{cn:?} and {host_flag} {host:?} are mutually exclusive: give one of them"
                ),
            }),
            (Some((flag, cn)), None) => Ok(Some(AllowedName::CommonName { flag, cn })),
            (None, Some((flag, host))) => {
                let host = host
                    .strip_prefix('[')
                    .and_then(|h| h.strip_suffix(']'))
                    .unwrap_or(&host)
                    .to_string();
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
        let refused = |why: String| refusal(format!("{why} ({})", self.flag()));
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
                cert.verify_is_valid_for_subject_name(&name).map_err(|_| {
                    let names = CertNames::of(der.as_ref()).unwrap_or_default();
                    let mut valid: Vec<String> =
                        names.ips.iter().map(|ip| ip.to_string()).collect();
                    valid.extend(names.dns);
                    refused(format!(
                        "certificate is valid for [{}], not {host:?}",
                        valid.join(", ")
                    ))
                })
            }
        }
    }
}

/// The subject common name of a DER certificate: its last CN, as Go (and
/// so etcd, for auth and `--peer-cert-allowed-cn`) reads it.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().last()?;
    cn.as_str().ok().map(str::to_string)
}

/// What a chain rustls verified must also pass, and how a revocation is
/// told.
#[derive(Debug)]
pub struct Checks {
    pub allowed: Option<AllowedName>,
    pub lists: Lists,
}

impl Checks {
    /// `verified` (rustls's answer for this chain), with a revocation named
    /// and the allowed name checked.
    fn after<T>(
        &self,
        verified: Result<T, rustls::Error>,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<T, rustls::Error> {
        let verified = verified.map_err(|e| self.lists.explain(e, end_entity, intermediates))?;
        if let Some(allowed) = &self.allowed {
            allowed.check(end_entity)?;
        }
        Ok(verified)
    }
}

/// The methods both verifiers take from the rustls verifier they wrap
/// unchanged: the handshake's signatures and the schemes that make them.
macro_rules! signatures_of_inner {
    () => {
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
    };
}

/// A client verifier with [`Checks`] after rustls's.
#[derive(Debug)]
pub struct CheckedClientVerifier {
    pub inner: Arc<dyn ClientCertVerifier>,
    pub checks: Arc<Checks>,
}

impl ClientCertVerifier for CheckedClientVerifier {
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
            .verify_client_cert(end_entity, intermediates, now);
        self.checks.after(verified, end_entity, intermediates)
    }

    signatures_of_inner!();
}

/// A server verifier (this member dialing a peer) with [`Checks`] after
/// rustls's.
#[derive(Debug)]
pub struct CheckedServerVerifier {
    pub inner: Arc<dyn ServerCertVerifier>,
    pub checks: Arc<Checks>,
}

impl ServerCertVerifier for CheckedServerVerifier {
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
        );
        self.checks.after(verified, end_entity, intermediates)
    }

    signatures_of_inner!();

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
        BasicConstraints, CertificateParams, CertificateRevocationList,
        CertificateRevocationListParams, CertifiedIssuer, DnType, IsCa, KeyIdMethod, KeyPair,
        KeyUsagePurpose, RevokedCertParams, SerialNumber,
    };
    use std::path::{Path, PathBuf};

    type Issuer = CertifiedIssuer<'static, KeyPair>;

    fn ca_params(name: &str, serial: u64) -> CertificateParams {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.serial_number = Some(SerialNumber::from(serial));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
    }

    fn new_ca(name: &str) -> Issuer {
        CertifiedIssuer::self_signed(ca_params(name, 1000), KeyPair::generate().unwrap()).unwrap()
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

    fn crl(ca: &Issuer, number: u64, revoked: &[u64]) -> CertificateRevocationList {
        let at = rcgen::date_time_ymd(2024, 1, 1);
        CertificateRevocationListParams {
            this_update: at,
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(number),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|&serial| RevokedCertParams {
                    serial_number: SerialNumber::from(serial),
                    revocation_time: at,
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(ca)
        .unwrap()
    }

    fn pem(list: &CertificateRevocationList) -> String {
        list.pem().unwrap()
    }

    fn put(path: &Path, bytes: impl AsRef<[u8]>) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    fn spec(dir: &Path, name: &str, ca_file: &Path) -> CertSpec {
        CertSpec {
            side: Side::Peer,
            cert_file: dir.join(format!("{name}.pem")),
            key_file: dir.join(format!("{name}-key.pem")),
            trusted_ca_file: Some(ca_file.to_path_buf()),
            require_client_cert: true,
            self_signed: false,
            alpn: Vec::new(),
            crl_file: None,
            allowed: None,
            check_client_addr: false,
        }
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
            crl_file,
            allowed,
            ..spec(dir, name, ca_file)
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

    const LOCAL: &[&str] = &["127.0.0.1", "localhost"];

    #[test]
    fn revoked_certificates_are_refused_both_ways_and_the_list_is_reread() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ca = new_ca("test CA");
        let ca_file = d.join("ca.pem");
        put(&ca_file, ca.pem());
        let crl_file = d.join("crl.pem");
        put(&crl_file, pem(&crl(&ca, 1, &[2])));
        let listed = Some(crl_file.clone());
        let server = source(
            d,
            "a",
            &leaf(&ca, "peer", LOCAL, 1),
            &ca_file,
            listed.clone(),
            None,
        );
        let good = source(d, "b", &leaf(&ca, "peer", LOCAL, 3), &ca_file, None, None);
        let revoked = source(d, "c", &leaf(&ca, "peer", LOCAL, 2), &ca_file, None, None);

        assert_eq!(handshake(&server, &good), (Ok(()), Ok(())));
        let (served, _) = handshake(&server, &revoked);
        let err = served.unwrap_err();
        assert!(
            err.contains("\"CN=peer\" serial 02 is revoked by --peer-crl-file"),
            "{err}"
        );

        // Dialing: the member with the list refuses a revoked server.
        let dialer = source(d, "e", &leaf(&ca, "peer", LOCAL, 4), &ca_file, listed, None);
        let (_, dialed) = handshake(&revoked, &dialer);
        let err = dialed.unwrap_err();
        assert!(err.contains("is revoked by --peer-crl-file"), "{err}");

        // A list of another CA says nothing about this CA's certificates.
        put(&crl_file, pem(&crl(&new_ca("another CA"), 1, &[2, 3])));
        assert_eq!(handshake(&server, &revoked), (Ok(()), Ok(())));

        // A new list is used at the next handshake, DER as well as PEM; one
        // that does not load keeps the last that did.
        put(&crl_file, crl(&ca, 2, &[3]).der().as_ref());
        let (served, _) = handshake(&server, &good);
        assert!(served.unwrap_err().contains("serial 03 is revoked"));
        assert_eq!(handshake(&server, &revoked), (Ok(()), Ok(())));
        put(
            &crl_file,
            "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
        );
        assert!(
            handshake(&server, &good).0.is_err(),
            "the last good list stays"
        );
        assert_eq!(handshake(&server, &revoked), (Ok(()), Ok(())));
    }

    #[test]
    fn a_revoked_intermediate_of_the_trusted_file_is_no_longer_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let root = new_ca("root CA");
        let key = KeyPair::generate().unwrap();
        let mid = CertifiedIssuer::signed_by(ca_params("intermediate CA", 77), key, &root).unwrap();
        // The trusted file holds the root and the intermediate, as bundles do.
        let ca_file = d.join("bundle.pem");
        put(&ca_file, format!("{}{}", root.pem(), mid.pem()));
        let (cert, key) = leaf(&mid, "peer", LOCAL, 5);
        let chain = (format!("{cert}{}", mid.pem()), key);
        let server_pair = leaf(&root, "peer", LOCAL, 6);
        let crl_file = d.join("crl.pem");
        put(&crl_file, pem(&crl(&root, 1, &[])));
        let server = source(d, "a", &server_pair, &ca_file, Some(crl_file.clone()), None);
        let client = source(d, "b", &chain, &ca_file, None, None);
        assert_eq!(handshake(&server, &client), (Ok(()), Ok(())));

        // The root revokes the intermediate: its leaf no longer gets in,
        // though the intermediate is in the trusted file.
        put(&crl_file, pem(&crl(&root, 2, &[77])));
        let (served, _) = handshake(&server, &client);
        let err = served.unwrap_err();
        assert!(
            err.contains("\"CN=intermediate CA\" serial 4d is revoked"),
            "{err}"
        );
    }

    #[test]
    fn only_the_allowed_name_gets_in_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ca = new_ca("test CA");
        let ca_file = d.join("ca.pem");
        put(&ca_file, ca.pem());
        let peer = leaf(&ca, "peer", LOCAL, 1);
        let other = leaf(&ca, "other", &["127.0.0.1", "node.example.com"], 2);
        let wild = leaf(&ca, "peer", &["127.0.0.1", "*.example.com"], 3);
        let plain =
            |name: &str, pair: &(String, String)| source(d, name, pair, &ca_file, None, None);

        let by_cn = source(d, "a", &peer, &ca_file, None, cn("peer"));
        assert_eq!(handshake(&by_cn, &plain("b", &peer)), (Ok(()), Ok(())));
        let (served, _) = handshake(&by_cn, &plain("c", &other));
        let err = served.unwrap_err();
        assert!(
            err.contains("common name \"other\" is not the allowed \"peer\"")
                && err.contains("--peer-cert-allowed-cn"),
            "{err}"
        );
        // Dialing a server whose name is not the allowed one.
        let (_, dialed) = handshake(&plain("e", &other), &by_cn);
        assert!(dialed.unwrap_err().contains("not the allowed"));

        let by_host = source(d, "f", &peer, &ca_file, None, host("node.example.com"));
        let (served, _) = handshake(&by_host, &plain("g", &peer));
        let err = served.unwrap_err();
        assert!(
            err.contains("valid for [127.0.0.1, localhost], not \"node.example.com\""),
            "{err}"
        );
        for (name, cert) in [("h", &other), ("i", &wild)] {
            assert_eq!(
                handshake(&by_host, &plain(name, cert)),
                (Ok(()), Ok(())),
                "{name}"
            );
            // And dialing a server valid for the name, or not.
            assert_eq!(
                handshake(&plain(name, cert), &by_host),
                (Ok(()), Ok(())),
                "{name}"
            );
        }
        let (_, dialed) = handshake(&plain("m", &peer), &by_host);
        assert!(dialed.unwrap_err().contains("not \"node.example.com\""));
        // An IP address is matched against the IP names, not the CN.
        let by_ip = source(d, "j", &peer, &ca_file, None, host("127.0.0.1"));
        assert_eq!(handshake(&by_ip, &plain("k", &other)), (Ok(()), Ok(())));
        let no_ip = leaf(&ca, "127.0.0.1", &["localhost"], 4);
        let (served, _) = handshake(&by_ip, &plain("l", &no_ip));
        assert!(served.unwrap_err().contains("not \"127.0.0.1\""));
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
        let host_flag = "--peer-cert-allowed-hostname".to_string();
        let bad = AllowedName::from_flags(None, Some((host_flag.clone(), "a b".into())))
            .unwrap_err()
            .to_string();
        assert!(bad.starts_with("--peer-cert-allowed-hostname"), "{bad}");
        // Empty is unset, as etcd's; an IPv6 host may come in brackets.
        let empty_cn = Some(("--peer-cert-allowed-cn".to_string(), String::new()));
        assert_eq!(
            AllowedName::from_flags(empty_cn.clone(), None).unwrap(),
            None
        );
        let v6 = AllowedName::from_flags(empty_cn, Some((host_flag.clone(), "[::1]".into())));
        assert_eq!(
            v6.unwrap(),
            Some(AllowedName::Hostname {
                flag: host_flag,
                host: "::1".into()
            })
        );

        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ca = new_ca("test CA");
        let ca_file = d.join("ca.pem");
        put(&ca_file, ca.pem());
        let write = |name: &str, text: String| {
            let path = d.join(name);
            put(&path, text);
            path
        };
        let garbage = write(
            "garbage.pem",
            "-----BEGIN X509 CRL-----\nbm90IGEgbGlzdA==\n-----END X509 CRL-----\n".into(),
        );
        let text = write("text.pem", "just text\n".into());
        // Signed by a CA of the same name but another key.
        let forged = write("forged.pem", pem(&crl(&new_ca("test CA"), 1, &[1])));
        let twice = write(
            "twice.pem",
            format!("{}{}", pem(&crl(&ca, 1, &[])), pem(&crl(&ca, 2, &[9]))),
        );
        let cases = [
            (garbage, "revocation list 1 does not parse"),
            (text, "no revocation list found"),
            (d.join("missing.pem"), "No such file"),
            (forged, "revocation list 1 is not signed by its CA"),
            (twice, "revocation lists 1 and 2 are both of"),
        ];
        for (file, why) in cases {
            let spec = CertSpec {
                crl_file: Some(file.clone()),
                ..spec(d, "a", &ca_file)
            };
            let (cert, key) = leaf(&ca, "peer", &["127.0.0.1"], 1);
            put(&spec.cert_file, cert);
            put(&spec.key_file, key);
            let err = CertSource::new(spec, crate::tls::provider(&[]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("--peer-crl-file")
                    && err.contains(&file.display().to_string())
                    && err.contains(why),
                "{err}"
            );
        }
    }
}
