//! Certificates for TLS tests: a test CA, leaf certificates for 127.0.0.1,
//! written as the files etcd's flags name.

use std::path::{Path, PathBuf};

use std::process::{Command, Stdio};
use std::time::Duration;

use super::{replace_file, Cluster};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams,
    SerialNumber,
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
        self.leaf_for(common_name, &["127.0.0.1", "localhost"], None)
    }

    /// A certificate named `common_name`, valid for `names` (its subject
    /// alternative names), with `serial` when given (else a random one).
    pub fn leaf_for(
        &self,
        common_name: &str,
        names: &[&str],
        serial: Option<u64>,
    ) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.serial_number = serial.map(SerialNumber::from);
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

    /// A revocation list of this CA naming `serials`, as PEM.
    pub fn crl(&self, serials: &[u64]) -> String {
        let at = rcgen::date_time_ymd(2024, 1, 1);
        CertificateRevocationListParams {
            this_update: at,
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(serials.len() as u64 + 1),
            issuing_distribution_point: None,
            revoked_certs: serials
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
        .signed_by(&self.issuer)
        .unwrap()
        .pem()
        .unwrap()
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
        Certs::write_pair(dir, name, ca, ca.leaf(common_name))
    }

    /// The files of `(cert, key)`, made by `ca`.
    pub fn write_pair(dir: &Path, name: &str, ca: &Ca, (cert, key): (String, String)) -> Certs {
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

/// etcdctl against `endpoint` with `tls` flags; (succeeded, output).
pub fn ctl(endpoint: &str, tls: &[String], args: &[&str]) -> (bool, String) {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--dial-timeout=3s")
        .arg("--command-timeout=8s")
        .args(tls)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run etcdctl");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Retries `args` until it succeeds (the cluster starting), for at most 60 s.
pub fn ctl_eventually(cluster: &Cluster, endpoint: &str, tls: &[String], args: &[&str]) -> String {
    super::try_wait_until(
        &format!("etcdctl {args:?} at {endpoint} succeeding"),
        Duration::from_secs(60),
        || match ctl(endpoint, tls, args) {
            (true, out) => Ok(out),
            (false, out) => Err(out),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()))
}

pub fn get_value(endpoint: &str, tls: &[String], key: &str) -> Option<String> {
    let (ok, out) = ctl(endpoint, tls, &["get", key, "--print-value-only"]);
    assert!(ok, "get {key} at {endpoint}: {out}");
    let v = out.trim().to_string();
    (!v.is_empty()).then_some(v)
}
