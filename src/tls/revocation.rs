//! Revocation lists (`--client-crl-file`, `--peer-crl-file`): loaded, checked
//! against the trusted CAs, and used to say which certificate was refused.
//!
//! A file holds PEM `X509 CRL` blocks, or one DER list. At load:
//! - every list must parse (v2 lists; delta and indirect lists are not
//!   taken), and at most one list per CA (its issuer name): rustls consults
//!   the first list that speaks for a certificate, so a second one of the
//!   same CA would be silently ignored;
//! - a list whose CA is in the trusted file must carry that CA's signature
//!   (a list that does not would refuse every certificate of the CA at the
//!   handshake); a list of a CA not in the file is kept with a warning, as
//!   it can still speak for an intermediate a peer presents;
//! - a certificate of the trusted file that a list names (an intermediate
//!   revoked by its parent) is dropped from the trust anchors, with a
//!   warning: the handshake never checks a trust anchor's revocation.
//!
//! During the handshake rustls checks every certificate of the chain below
//! the trust anchor against the list of its issuer, when there is one; a
//! certificate no list speaks for passes, as with etcd. Its refusal only
//! says "Revoked": [`Lists::explain`] names the certificate and the flag.

use std::collections::HashSet;
use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};

use super::{file_error, read, TlsError};

/// One list as loaded: its DER, its issuer's raw name, the serials it names.
#[derive(Debug, Clone)]
struct List {
    der: CertificateRevocationListDer<'static>,
    issuer: Vec<u8>,
    issuer_text: String,
    serials: HashSet<Vec<u8>>,
}

/// The revocation lists of one side, as loaded from its flag's file.
#[derive(Debug, Clone, Default)]
pub struct Lists {
    flag: String,
    lists: Vec<List>,
}

impl Lists {
    /// The lists of `path`, checked against the certificates of the trusted
    /// CA file (`trusted`, empty when none is given).
    pub fn load(
        flag: &str,
        path: &Path,
        trusted: &[CertificateDer<'static>],
    ) -> Result<Lists, TlsError> {
        let bad = |reason: String| file_error(flag.to_string(), path, reason);
        let bytes = read(flag, path)?;
        let ders = if bytes.first() == Some(&0x30) {
            // A DER SEQUENCE: one list as it is.
            vec![CertificateRevocationListDer::from(bytes)]
        } else {
            let ders = CertificateRevocationListDer::pem_slice_iter(&bytes)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(format!("not a PEM revocation list file: {e}")))?;
            if ders.is_empty() {
                return Err(bad(
                    "no revocation list found (expected PEM \"X509 CRL\" blocks or DER)".into(),
                ));
            }
            ders
        };
        let mut lists: Vec<List> = Vec::new();
        for (i, der) in ders.into_iter().enumerate() {
            let n = i + 1;
            let (_, crl) = x509_parser::parse_x509_crl(der.as_ref())
                .map_err(|e| bad(format!("revocation list {n} does not parse: {e}")))?;
            // What the handshake's checker takes (v2 lists, no delta or
            // indirect ones, nothing after the list).
            webpki::BorrowedCertRevocationList::from_der(der.as_ref())
                .map_err(|e| bad(format!("revocation list {n} cannot be used: {e:?}")))?;
            let issuer = crl.issuer().as_raw().to_vec();
            let issuer_text = crl.issuer().to_string();
            if let Some(first) = lists.iter().position(|l| l.issuer == issuer) {
                return Err(bad(format!(
                    "revocation lists {} and {n} are both of {issuer_text:?}: keep one \
                     list per CA (only the first would be used)",
                    first + 1
                )));
            }
            // Every trusted certificate of the list's issuer name (two, say,
            // across a key rollover): one of them must have signed it.
            let cas: Vec<_> = trusted
                .iter()
                .filter_map(|c| {
                    let (_, cert) = x509_parser::parse_x509_certificate(c.as_ref()).ok()?;
                    (cert.subject().as_raw() == issuer.as_slice()).then_some(cert)
                })
                .collect();
            let refusals: Vec<_> = cas
                .iter()
                .filter_map(|ca| crl.verify_signature(ca.public_key()).err())
                .collect();
            if !cas.is_empty() {
                if refusals.len() == cas.len() {
                    return Err(bad(format!(
                        "revocation list {n} is not signed by its CA {issuer_text:?} of the \
                         trusted CA file: {}",
                        refusals[0]
                    )));
                }
            } else if !trusted.is_empty() {
                tracing::warn!(
                    flag,
                    list = n,
                    issuer = %issuer_text,
                    "the revocation list's CA is not in the trusted CA file: it is used only \
                     for certificates an intermediate of that name issued"
                );
            }
            let serials = crl
                .iter_revoked_certificates()
                .map(|r| r.raw_serial().to_vec())
                .collect();
            lists.push(List {
                der: der.clone(),
                issuer,
                issuer_text,
                serials,
            });
        }
        Ok(Lists {
            flag: flag.to_string(),
            lists,
        })
    }

    /// The lists as rustls takes them.
    pub fn ders(&self) -> impl Iterator<Item = CertificateRevocationListDer<'static>> + '_ {
        self.lists.iter().map(|l| l.der.clone())
    }

    /// Whether a list names the DER certificate `der`: its description
    /// (subject and serial) when it does.
    fn revoked(&self, der: &[u8]) -> Option<String> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let serial = cert.raw_serial();
        self.lists
            .iter()
            .find(|l| l.issuer == cert.issuer().as_raw() && l.serials.contains(serial))
            .map(|l| {
                format!(
                    "certificate {:?} serial {} is revoked by {} (list of {:?})",
                    cert.subject().to_string(),
                    cert.raw_serial_as_string(),
                    self.flag,
                    l.issuer_text
                )
            })
    }

    /// The trusted certificates less those a list names, each dropped with
    /// a warning.
    pub fn unrevoked(&self, trusted: Vec<CertificateDer<'static>>) -> Vec<CertificateDer<'static>> {
        trusted
            .into_iter()
            .filter(|c| match self.revoked(c.as_ref()) {
                Some(why) => {
                    tracing::warn!(
                        %why,
                        "a certificate of the trusted CA file is revoked: it is no longer trusted"
                    );
                    false
                }
                None => true,
            })
            .collect()
    }

    /// A handshake refusal that says which certificate a list revoked, in
    /// place of rustls's bare "Revoked".
    pub fn explain(
        &self,
        error: rustls::Error,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> rustls::Error {
        if !matches!(
            error,
            rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked)
        ) {
            return error;
        }
        let found = std::iter::once(end_entity)
            .chain(intermediates)
            .find_map(|c| self.revoked(c.as_ref()));
        match found {
            Some(why) => super::refusal(why),
            None => error,
        }
    }
}
