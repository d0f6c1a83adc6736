//! Certificates for TLS tests: a test CA, leaf certificates for 127.0.0.1,
//! written as the files etcd's flags name.

use std::path::{Path, PathBuf};

use super::replace_file;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A test certificate authority.
pub struct Ca {
    pub issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    /// A certificate for 127.0.0.1 and localhost, for servers and clients
    /// alike (a member presents its peer certificate both ways): (cert, key).
    pub fn leaf(&self, common_name: &str) -> (String, String) {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Files of one certificate and its CA, written under a directory.
#[derive(Clone)]
pub struct Certs {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Certs {
    pub fn write(dir: &Path, name: &str, ca: &Ca, common_name: &str) -> Certs {
        let (cert, key) = ca.leaf(common_name);
        let certs = Certs {
            ca: dir.join(format!("{name}-ca.pem")),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&certs.ca, ca.issuer.pem()).unwrap();
        replace_file(&certs.cert, &cert);
        replace_file(&certs.key, &key);
        certs
    }

    pub fn etcdctl_args(&self) -> Vec<String> {
        vec![
            format!("--cacert={}", self.ca.display()),
            format!("--cert={}", self.cert.display()),
            format!("--key={}", self.key.display()),
        ]
    }
}

pub fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Flags for mutual TLS on both ports with `client` and `peer` certificates.
pub fn mutual_tls_flags(client: &Certs, peer: &Certs) -> Vec<String> {
    vec![
        "--cert-file".into(),
        s(&client.cert),
        "--key-file".into(),
        s(&client.key),
        "--trusted-ca-file".into(),
        s(&client.ca),
        "--client-cert-auth".into(),
        "--peer-cert-file".into(),
        s(&peer.cert),
        "--peer-key-file".into(),
        s(&peer.key),
        "--peer-trusted-ca-file".into(),
        s(&peer.ca),
        "--peer-client-cert-auth".into(),
    ]
}

/// The client, server and peer certificates of a cluster, signed by `ca`.
pub fn cluster_certs(dir: &Path, ca: &Ca) -> [Certs; 3] {
    ["client", "server", "peer"].map(|role| Certs::write(dir, role, ca, role))
}
