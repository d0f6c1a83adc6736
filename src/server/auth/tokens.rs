//! Auth tokens, as etcd's `--auth-token` names them.
//!
//! - **simple**: a random string Authenticate hands out, assigned through
//!   shard 0's log; the table of them is part of what shard 0's driver
//!   applies ([`crate::server::auth_state::simple_tokens`]).
//! - **jwt**: a signed JSON Web Token carrying the user name and the auth
//!   revision it was issued at (`--auth-token jwt,pub-key=..,priv-key=..,
//!   sign-method=RS256,ttl=5m`); any member holding the public key checks it.
//!   Signed and checked here ([`JwtTokens`]).

use std::path::PathBuf;

pub use crate::config::auth::{JwtOptions, TokenKind};
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};

/// The signing algorithm etcd's `sign-method=` names (the names are checked
/// against [`crate::config::auth::JWT_SIGN_METHODS`] when the flag is parsed).
fn algorithm(sign_method: &str) -> Result<Algorithm, String> {
    sign_method
        .parse()
        .map_err(|e| format!("unsupported jwt sign-method {sign_method:?}: {e}"))
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Claims {
    username: String,
    revision: u64,
    exp: u64,
}

/// Signs and checks JSON Web Tokens.
pub struct JwtTokens {
    algorithm: Algorithm,
    encoding: Option<EncodingKey>,
    decoding: DecodingKey,
    ttl: Duration,
}

impl JwtTokens {
    pub fn load(o: &JwtOptions) -> Result<JwtTokens, String> {
        let algorithm = algorithm(&o.sign_method)?;
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| format!("--auth-token: reading {}: {e}", p.display()))
        };
        let public = read(&o.pub_key)?;
        let bad = |p: &PathBuf, e: jsonwebtoken::errors::Error| {
            format!("--auth-token: {} is not a usable key: {e}", p.display())
        };
        let decoding = match algorithm {
            Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_pem(&public),
            _ => DecodingKey::from_rsa_pem(&public),
        }
        .map_err(|e| bad(&o.pub_key, e))?;
        let encoding = match &o.priv_key {
            None => None,
            Some(path) => {
                let private = read(path)?;
                Some(
                    match algorithm {
                        Algorithm::ES256 | Algorithm::ES384 => EncodingKey::from_ec_pem(&private),
                        _ => EncodingKey::from_rsa_pem(&private),
                    }
                    .map_err(|e| bad(path, e))?,
                )
            }
        };
        Ok(JwtTokens {
            algorithm,
            encoding,
            decoding,
            ttl: o.ttl,
        })
    }

    /// A token for `user` at auth revision `revision`; None when this member
    /// has no private key (it then checks tokens but does not sign them).
    pub fn sign(&self, user: &str, revision: u64) -> Option<Result<String, String>> {
        let key = self.encoding.as_ref()?;
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            + self.ttl;
        let claims = Claims {
            username: user.to_string(),
            revision,
            exp: exp.as_secs(),
        };
        Some(
            jsonwebtoken::encode(&Header::new(self.algorithm), &claims, key)
                .map_err(|e| e.to_string()),
        )
    }

    /// The user and auth revision a valid, unexpired token carries.
    pub fn verify(&self, token: &str) -> Option<(String, u64)> {
        let mut validation = Validation::new(self.algorithm);
        validation.leeway = 0;
        validation.set_required_spec_claims(&["exp"]);
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation).ok()?;
        Some((data.claims.username, data.claims.revision))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwt_tokens_round_trip_and_reject_tampering() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let (pub_key, priv_key) = (dir.path().join("k.pub"), dir.path().join("k"));
        std::fs::write(&pub_key, key.public_key_pem()).unwrap();
        std::fs::write(&priv_key, key.serialize_pem()).unwrap();
        let t = JwtTokens::load(&JwtOptions {
            pub_key,
            priv_key: Some(priv_key),
            sign_method: "ES256".into(),
            ttl: Duration::from_secs(60),
        })
        .unwrap();
        let token = t.sign("alice", 7).unwrap().unwrap();
        assert_eq!(t.verify(&token), Some(("alice".to_string(), 7)));
        let mut tampered = token.clone();
        tampered.insert(tampered.len() - 3, 'A');
        assert_eq!(t.verify(&tampered), None);
        assert_eq!(t.verify("a.b.c"), None);
    }
}
