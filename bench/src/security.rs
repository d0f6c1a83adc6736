//! Client TLS, authentication and the certificates of a secure local cluster.
//!
//! A connection authenticates once, when it is opened (etcd's Authenticate:
//! a bcrypt check on the server, tens of milliseconds at etcd's default cost
//! 10), and every request it carries sends the token in the `token` metadata,
//! as etcd's Go client and its benchmark tool do. Per-request authentication
//! would measure bcrypt, not the store.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use cairn_proto::authpb::permission::Type as PermissionType;
use cairn_proto::authpb::Permission;
use cairn_proto::etcdserverpb::auth_client::AuthClient;
use cairn_proto::etcdserverpb::{
    AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
    AuthUserGrantRoleRequest, AuthenticateRequest,
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::BenchError;

/// The gRPC metadata key that carries an auth token (etcd's).
pub const TOKEN_METADATA_KEY: &str = "token";
/// The administrator a secure cluster is set up with (etcd requires the user
/// `root` holding the role `root` before auth can be enabled).
pub const ROOT_USER: &str = "root";
/// The user the workloads of a secure comparison run as: not root, so every
/// request goes through the permission check.
pub const BENCH_USER: &str = "bench";
/// The role granting [`BENCH_USER`] read and write on the whole key space.
pub const BENCH_ROLE: &str = "bench-readwrite";
/// Passwords of the secure local clusters: throwaway clusters on 127.0.0.1, so
/// they are fixed and printed with the commands that reproduce a run.
pub const ROOT_PASSWORD: &str = "cairn-bench-root";
pub const BENCH_PASSWORD: &str = "cairn-bench";
/// Common name of the client certificate: no user has this name, so a request
/// without a token is never taken for a user by its certificate (etcd and
/// Cairn fall back to the common name under --client-cert-auth).
pub const CLIENT_COMMON_NAME: &str = "cairn-bench-client";

/// `--user name:password`.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub name: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("name", &self.name)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl Credentials {
    pub fn new(name: &str, password: &str) -> Credentials {
        Credentials {
            name: name.to_owned(),
            password: password.to_owned(),
        }
    }

    /// Parses `name:password`; the password may itself hold ':'.
    pub fn parse(text: &str) -> Result<Credentials, String> {
        let Some((name, password)) = text.split_once(':') else {
            return Err("expected name:password".into());
        };
        if name.is_empty() {
            return Err("the user name is empty".into());
        }
        Ok(Credentials::new(name, password))
    }

    /// The `--user` value naming these credentials.
    pub fn arg(&self) -> String {
        format!("{}:{}", self.name, self.password)
    }
}

/// The user the workloads of a secure local cluster run as.
pub fn bench_user() -> Credentials {
    Credentials::new(BENCH_USER, BENCH_PASSWORD)
}

/// Adds a connection's token, if it has one, to every request it carries.
#[derive(Clone, Debug, Default)]
pub struct TokenInterceptor {
    token: Option<MetadataValue<Ascii>>,
}

impl Interceptor for TokenInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert(TOKEN_METADATA_KEY, token.clone());
        }
        Ok(request)
    }
}

/// One gRPC connection as the workloads use it: TLS or not, and its token.
pub type Conn = InterceptedService<Channel, TokenInterceptor>;

/// A connection that sends no token.
pub fn anonymous(channel: Channel) -> Conn {
    InterceptedService::new(channel, TokenInterceptor::default())
}

/// Authenticates `user` over `channel` (one Authenticate call): the token.
pub async fn token(channel: Channel, user: &Credentials) -> Result<String, tonic::Status> {
    Ok(AuthClient::new(channel)
        .authenticate(AuthenticateRequest {
            name: user.name.clone(),
            password: user.password.clone(),
        })
        .await?
        .into_inner()
        .token)
}

/// Authenticates `user` over `channel` (one Authenticate call) and returns the
/// connection that sends the token it got.
pub async fn authenticate(channel: Channel, user: &Credentials) -> Result<Conn, tonic::Status> {
    let token = token(channel.clone(), user)
        .await?
        .parse::<MetadataValue<Ascii>>()
        .map_err(|e| {
            tonic::Status::internal(format!(
                "Authenticate returned a token that is not valid metadata: {e}"
            ))
        })?;
    Ok(InterceptedService::new(
        channel,
        TokenInterceptor { token: Some(token) },
    ))
}

fn read_pem(option: &'static str, path: &Path) -> Result<Vec<u8>, BenchError> {
    std::fs::read(path).map_err(|e| BenchError::Option {
        option,
        reason: format!("{}: {e}", path.display()),
    })
}

/// The client TLS configuration of `--cacert`, `--cert` and `--key`: servers
/// are verified against the CA only (no system roots), by the endpoint's host
/// (so a certificate for 127.0.0.1 needs that IP address among its names).
pub fn client_tls_config(
    cacert: &Path,
    cert_and_key: Option<(&Path, &Path)>,
) -> Result<ClientTlsConfig, BenchError> {
    let mut config =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_pem("--cacert", cacert)?));
    if let Some((cert, key)) = cert_and_key {
        config = config.identity(Identity::from_pem(
            read_pem("--cert", cert)?,
            read_pem("--key", key)?,
        ));
    }
    Ok(config)
}

/// Files of a secure local cluster's certificates, all signed by one CA made
/// for the run: a server certificate for the client port, a peer certificate
/// (used both ways between members) and a client certificate.
#[derive(Debug, Clone)]
pub struct ClusterCerts {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub peer_cert: PathBuf,
    pub peer_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// The names every member's certificates carry: members listen on 127.0.0.1.
pub const MEMBER_SUBJECT_ALT_NAMES: [&str; 2] = ["127.0.0.1", "localhost"];

fn cert_error(what: &str, e: rcgen::Error) -> BenchError {
    BenchError::Option {
        option: "--secure",
        reason: format!("making the {what} certificate: {e}"),
    }
}

impl ClusterCerts {
    /// Where [`ClusterCerts::generate`] writes the files in `dir`. The paths
    /// only: nothing is read or written.
    pub fn in_dir(dir: &Path) -> ClusterCerts {
        ClusterCerts {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server-key.pem"),
            peer_cert: dir.join("peer.pem"),
            peer_key: dir.join("peer-key.pem"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client-key.pem"),
        }
    }

    /// Makes a CA and the three leaf certificates (ECDSA P-256) and writes them
    /// as PEM files into `dir`, at the paths of [`ClusterCerts::in_dir`].
    pub fn generate(dir: &Path) -> Result<ClusterCerts, BenchError> {
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| cert_error("CA", e))?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "cairn-bench CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().map_err(|e| cert_error("CA", e))?;
        let ca =
            CertifiedIssuer::self_signed(ca_params, ca_key).map_err(|e| cert_error("CA", e))?;

        let leaf = |what: &str,
                    common_name: &str,
                    names: &[&str],
                    usages: Vec<ExtendedKeyUsagePurpose>|
         -> Result<(String, String), BenchError> {
            let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
            let mut params = CertificateParams::new(names).map_err(|e| cert_error(what, e))?;
            params
                .distinguished_name
                .push(DnType::CommonName, common_name);
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = usages;
            let key = KeyPair::generate().map_err(|e| cert_error(what, e))?;
            let cert = params
                .signed_by(&key, &ca)
                .map_err(|e| cert_error(what, e))?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let server = leaf(
            "server",
            "cairn-bench-server",
            &MEMBER_SUBJECT_ALT_NAMES,
            vec![ServerAuth],
        )?;
        // A member presents its peer certificate as a server and as a client.
        let peer = leaf(
            "peer",
            "cairn-bench-peer",
            &MEMBER_SUBJECT_ALT_NAMES,
            vec![ServerAuth, ClientAuth],
        )?;
        let client = leaf("client", CLIENT_COMMON_NAME, &[], vec![ClientAuth])?;

        std::fs::create_dir_all(dir).map_err(|e| BenchError::Option {
            option: "--secure",
            reason: format!("creating {}: {e}", dir.display()),
        })?;
        let certs = ClusterCerts::in_dir(dir);
        let files = [
            (&certs.ca, ca.pem()),
            (&certs.server_cert, server.0),
            (&certs.server_key, server.1),
            (&certs.peer_cert, peer.0),
            (&certs.peer_key, peer.1),
            (&certs.client_cert, client.0),
            (&certs.client_key, client.1),
        ];
        for (path, text) in files {
            std::fs::write(path, text).map_err(|e| BenchError::Option {
                option: "--secure",
                reason: format!("writing {}: {e}", path.display()),
            })?;
        }
        Ok(certs)
    }

    /// The flags that give a member mutual TLS on its client and peer ports
    /// (the same for etcd and Cairn).
    pub fn member_flags(&self) -> Vec<String> {
        let s = |p: &Path| p.display().to_string();
        vec![
            "--cert-file".into(),
            s(&self.server_cert),
            "--key-file".into(),
            s(&self.server_key),
            "--trusted-ca-file".into(),
            s(&self.ca),
            "--client-cert-auth".into(),
            "--peer-cert-file".into(),
            s(&self.peer_cert),
            "--peer-key-file".into(),
            s(&self.peer_key),
            "--peer-trusted-ca-file".into(),
            s(&self.ca),
            "--peer-client-cert-auth".into(),
        ]
    }

    /// The `cairn-bench` options of a client of this cluster.
    pub fn client_args(&self) -> Vec<String> {
        let s = |p: &Path| p.display().to_string();
        vec![
            "--cacert".into(),
            s(&self.ca),
            "--cert".into(),
            s(&self.client_cert),
            "--key".into(),
            s(&self.client_key),
        ]
    }

    /// The client TLS configuration of this cluster's client certificate.
    pub fn client_tls_config(&self) -> Result<ClientTlsConfig, BenchError> {
        client_tls_config(&self.ca, Some((&self.client_cert, &self.client_key)))
    }
}

/// Sets up etcd's auth the way `etcdctl user add`, `role add`,
/// `role grant-permission`, `user grant-role` and `auth enable` do: `root`
/// (with the role `root`), and `user` holding a role with readwrite on every
/// key. `conn` reaches any member; auth must not be enabled yet.
pub async fn enable_auth(
    conn: Conn,
    root_password: &str,
    user: &Credentials,
) -> Result<(), tonic::Status> {
    let mut auth = AuthClient::new(conn);
    let step = |what: &'static str| {
        move |s: tonic::Status| tonic::Status::new(s.code(), format!("{what}: {}", s.message()))
    };
    auth.role_add(AuthRoleAddRequest {
        name: ROOT_USER.into(),
    })
    .await
    .map_err(step("role add root"))?;
    auth.user_add(AuthUserAddRequest {
        name: ROOT_USER.into(),
        password: root_password.into(),
        ..Default::default()
    })
    .await
    .map_err(step("user add root"))?;
    auth.user_grant_role(AuthUserGrantRoleRequest {
        user: ROOT_USER.into(),
        role: ROOT_USER.into(),
    })
    .await
    .map_err(step("user grant-role root root"))?;
    auth.role_add(AuthRoleAddRequest {
        name: BENCH_ROLE.into(),
    })
    .await
    .map_err(step("role add"))?;
    // From "\0" to the end ("\0" as the range end): every key.
    auth.role_grant_permission(AuthRoleGrantPermissionRequest {
        name: BENCH_ROLE.into(),
        perm: Some(Permission {
            perm_type: PermissionType::Readwrite as i32,
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
        }),
    })
    .await
    .map_err(step("role grant-permission"))?;
    auth.user_add(AuthUserAddRequest {
        name: user.name.clone(),
        password: user.password.clone(),
        ..Default::default()
    })
    .await
    .map_err(step("user add"))?;
    auth.user_grant_role(AuthUserGrantRoleRequest {
        user: user.name.clone(),
        role: BENCH_ROLE.into(),
    })
    .await
    .map_err(step("user grant-role"))?;
    auth.auth_enable(AuthEnableRequest {})
        .await
        .map_err(step("auth enable"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_split_at_the_first_colon() {
        let c = Credentials::parse("bench:pa:ss").unwrap();
        assert_eq!((c.name.as_str(), c.password.as_str()), ("bench", "pa:ss"));
        assert_eq!(c.arg(), "bench:pa:ss");
        assert_eq!(Credentials::parse("root:").unwrap().password, "");
        assert!(Credentials::parse("root").is_err());
        assert!(Credentials::parse(":secret").is_err());
        assert!(
            !format!("{c:?}").contains("pa:ss"),
            "Debug hides the password"
        );
    }

    #[test]
    fn generated_certificates_chain_to_the_ca_and_name_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let certs = ClusterCerts::generate(dir.path()).unwrap();
        let pem = |p: &Path| std::fs::read_to_string(p).unwrap();
        assert!(pem(&certs.ca).starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pem(&certs.server_key).contains("PRIVATE KEY"));

        // Verify with rustls's own verifier, as a member and a client will.
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let der = |p: &Path| CertificateDer::from_pem_file(p).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(&certs.ca)).unwrap();
        let roots = std::sync::Arc::new(roots);
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let servers = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .unwrap();
        let now = UnixTime::now();
        for cert in [&certs.server_cert, &certs.peer_cert] {
            for name in ["127.0.0.1", "localhost"] {
                servers
                    .verify_server_cert(
                        &der(cert),
                        &[],
                        &ServerName::try_from(name).unwrap(),
                        &[],
                        now,
                    )
                    .unwrap_or_else(|e| panic!("{} for {name}: {e}", cert.display()));
            }
        }
        assert!(
            servers
                .verify_server_cert(
                    &der(&certs.client_cert),
                    &[],
                    &ServerName::try_from("127.0.0.1").unwrap(),
                    &[],
                    now
                )
                .is_err(),
            "the client certificate is no server's"
        );
        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .unwrap();
        for cert in [&certs.client_cert, &certs.peer_cert] {
            clients
                .verify_client_cert(&der(cert), &[], now)
                .unwrap_or_else(|e| panic!("{}: {e}", cert.display()));
        }
        assert!(certs.client_tls_config().is_ok());
    }
}
