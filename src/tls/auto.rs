//! `--auto-tls` and `--peer-auto-tls`: a self-signed certificate for the
//! hosts this member listens on, made once and kept in
//! `<data-dir>/fixtures/{client,peer}/{cert,key}.pem` (etcd's places), valid
//! for a year as etcd's are. Meant for tests and trials: it encrypts, but a
//! client cannot tell this member from another holder of such a certificate.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};

use super::{Side, TlsError};

/// How long a generated certificate is valid (etcd's default
/// `--self-signed-cert-validity` of one year).
pub const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The certificate and key files of `side` under `data_dir`, made now for
/// `hosts` (names or IP addresses) unless both already exist.
pub fn self_cert(
    data_dir: &Path,
    side: Side,
    hosts: &[String],
) -> Result<(PathBuf, PathBuf), TlsError> {
    let dir = data_dir.join("fixtures").join(side.fixtures_dir());
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    if cert_path.is_file() && key_path.is_file() {
        return Ok((cert_path, key_path));
    }
    let fail = |path: &Path, reason: String| TlsError::File {
        flag: side.auto_flag().to_string(),
        path: path.to_path_buf(),
        reason,
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail(&dir, e.to_string()))?;
    let mut names: Vec<String> = hosts.to_vec();
    names.sort();
    names.dedup();
    let mut params =
        CertificateParams::new(names).map_err(|e| fail(&cert_path, format!("host names: {e}")))?;
    params
        .distinguished_name
        .push(DnType::OrganizationName, "cairn");
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = SystemTime::now();
    params.not_before = date(now - Duration::from_secs(3600));
    params.not_after = date(now + VALIDITY);
    let key = KeyPair::generate().map_err(|e| fail(&key_path, e.to_string()))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| fail(&cert_path, e.to_string()))?;
    // The key first, readable by this user only; the certificate last, so a
    // crash between the two leaves no certificate without its key.
    write_file(&key_path, key.serialize_pem().as_bytes(), 0o600)
        .map_err(|e| fail(&key_path, e.to_string()))?;
    write_file(&cert_path, cert.pem().as_bytes(), 0o644)
        .map_err(|e| fail(&cert_path, e.to_string()))?;
    tracing::warn!(
        cert_file = %cert_path.display(),
        key_file = %key_path.display(),
        flag = side.auto_flag(),
        "generated a self-signed certificate"
    );
    Ok((cert_path, key_path))
}

/// Writes a certificate or key file atomically and durably.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(std::io::Error::other(format!(
            "{} is not a file path",
            path.display()
        )));
    };
    crate::durable_file::write(dir, name, bytes, mode)
}

/// `at` as a certificate date (whole seconds, UTC).
fn date(at: SystemTime) -> time::OffsetDateTime {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_is_made_once_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = ["127.0.0.1".to_string(), "localhost".to_string()];
        let (cert, key) = self_cert(dir.path(), Side::Peer, &hosts).unwrap();
        assert!(cert.ends_with("fixtures/peer/cert.pem"));
        let first = std::fs::read(&cert).unwrap();
        let again = self_cert(dir.path(), Side::Peer, &hosts).unwrap();
        assert_eq!(again, (cert.clone(), key.clone()));
        assert_eq!(std::fs::read(&cert).unwrap(), first, "kept, not remade");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let provider = super::super::provider(&[]);
        super::super::source::load_certs("--peer-cert-file", &cert).unwrap();
        super::super::source::load_key("--peer-key-file", &key, &provider).unwrap();
    }
}
