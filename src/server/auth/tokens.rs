//! Auth tokens, as etcd's `--auth-token` names them.
//!
//! - **simple**: a random string Authenticate hands out. It is assigned
//!   through shard 0's log, so every member knows it; each member forgets it
//!   after `--auth-token-ttl` seconds without use, when the user is deleted or
//!   changes password, and when auth is disabled. Tokens live in memory only:
//!   after a restart clients authenticate again (etcd's clients do so on
//!   `invalid auth token`).
//! - **jwt**: a signed JSON Web Token carrying the user name and the auth
//!   revision it was issued at (`--auth-token jwt,pub-key=..,priv-key=..,
//!   sign-method=RS256,ttl=5m`); any member holding the public key checks it.

use std::collections::HashMap;
use std::path::PathBuf;

pub use crate::config::auth::{JwtOptions, TokenKind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::published::Published;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::Rng;

/// The signing algorithm etcd's `sign-method=` names (the names are checked
/// against [`crate::config::auth::JWT_SIGN_METHODS`] when the flag is parsed).
fn algorithm(sign_method: &str) -> Result<Algorithm, String> {
    sign_method
        .parse()
        .map_err(|e| format!("unsupported jwt sign-method {sign_method:?}: {e}"))
}

/// The simple tokens this member knows, each with the user it stands for and
/// when it was last used. Every request with a token reads the table, so it
/// is [`Published`]: looked up without a lock; a use renews the token with
/// one atomic store, at most every [`SimpleTokens::renew_step`].
pub struct SimpleTokens {
    ttl: Duration,
    /// Instants are kept as milliseconds since this one.
    epoch: Instant,
    tokens: Published<HashMap<String, Arc<TokenUse>>>,
}

/// A token's user and when it was last used.
struct TokenUse {
    user: String,
    used_ms: AtomicU64,
}

impl SimpleTokens {
    pub fn new(ttl: Duration) -> SimpleTokens {
        SimpleTokens {
            ttl,
            epoch: Instant::now(),
            tokens: Published::new(HashMap::new()),
        }
    }

    /// A fresh token: random letters, then `.` and a number, as etcd's look.
    pub fn generate() -> String {
        let mut rng = rand::thread_rng();
        const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let letters: String = (0..16)
            .map(|_| char::from(LETTERS[rng.gen_range(0..LETTERS.len())]))
            .collect();
        format!("{letters}.{}", rng.gen_range(1..u32::MAX))
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis() as u64
    }

    /// How stale a token's last use may get before a use records a new one:
    /// a sixteenth of the TTL, at most a second. A token in steady use is
    /// renewed without every request writing to the same memory.
    fn renew_step(&self) -> u64 {
        (self.ttl_ms() / 16).min(1_000)
    }

    fn live(&self, t: &TokenUse, now: u64) -> bool {
        now.saturating_sub(t.used_ms.load(Ordering::Relaxed)) < self.ttl_ms()
    }

    /// Replaces the table with `f`'s edit of its live tokens.
    fn edit(&self, f: impl FnOnce(&mut HashMap<String, Arc<TokenUse>>)) {
        let now = self.now_ms();
        let mut w = self.tokens.write();
        let mut next: HashMap<String, Arc<TokenUse>> = w
            .get()
            .iter()
            .filter(|(_, t)| self.live(t, now))
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        f(&mut next);
        w.set(next);
    }

    pub fn assign(&self, token: &str, user: &str) {
        let used_ms = AtomicU64::new(self.now_ms());
        self.edit(|tokens| {
            tokens.insert(
                token.to_string(),
                Arc::new(TokenUse {
                    user: user.to_string(),
                    used_ms,
                }),
            );
        });
    }

    /// The user a token stands for, renewing its time to live.
    pub fn user_of(&self, token: &str) -> Option<String> {
        let now = self.now_ms();
        self.tokens.read(|tokens| {
            let t = tokens.get(token)?;
            if !self.live(t, now) {
                // Dropped from the table by the next change to it.
                return None;
            }
            if now - t.used_ms.load(Ordering::Relaxed) >= self.renew_step() {
                t.used_ms.fetch_max(now, Ordering::Relaxed);
            }
            Some(t.user.clone())
        })
    }

    pub fn invalidate_user(&self, user: &str) {
        self.edit(|tokens| tokens.retain(|_, t| t.user != user));
    }

    pub fn clear(&self) {
        self.edit(|tokens| tokens.clear());
    }
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
    fn simple_tokens_expire_unless_used_and_go_with_their_user() {
        let t = SimpleTokens::new(Duration::from_millis(200));
        let a = SimpleTokens::generate();
        let b = SimpleTokens::generate();
        assert_ne!(a, b);
        t.assign(&a, "alice");
        t.assign(&b, "bob");
        assert_eq!(t.user_of(&a).as_deref(), Some("alice"));
        t.invalidate_user("bob");
        assert_eq!(t.user_of(&b), None);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(t.user_of(&a), None, "expired");
        assert_eq!(t.user_of("nonsense"), None);
    }

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
