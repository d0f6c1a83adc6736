//! The simple tokens this member knows (etcd's `--auth-token simple`): a
//! random string Authenticate hands out, assigned through shard 0's log so
//! that every member knows it. Each member forgets one after
//! `--auth-token-ttl` seconds without use, when its user is deleted or
//! changes password, and when auth is disabled; shard 0's driver makes those
//! changes as it applies the log ([`super::AuthReplica::apply`]). Tokens
//! live in memory only: after a restart clients authenticate again (etcd's
//! clients do so on `invalid auth token`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

use super::published::Published;

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
}
