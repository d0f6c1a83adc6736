//! The simple tokens this member knows (etcd's `--auth-token simple`): a
//! random string Authenticate hands out, assigned through shard 0's log so
//! that every member knows it. Each member stops answering one after
//! `--auth-token-ttl` seconds without use, when its user is deleted or
//! changes password, and when auth is disabled; shard 0's driver makes those
//! changes as it applies the log ([`super::AuthReplica::apply`]). Tokens
//! live in memory only: after a restart clients authenticate again (etcd's
//! clients do so on `invalid auth token`). An expired token leaves memory
//! when a later Authenticate sweeps its bucket (`SimpleTokens::edit`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

use super::published::Published;

/// The table is [`FANOUT`] groups of [`FANOUT`] buckets. A token handed out
/// copies its bucket, about a 4,096th of the live tokens, and the two lists
/// of `FANOUT` pointers above it, not the table (shard 0's core applies
/// every Authenticate, so this is work on a core).
const FANOUT: usize = 64;

/// Buckets an assignment also sweeps for expired tokens, in turn.
const SWEEP_BUCKETS: usize = 16;

/// [`bucket_of`] takes group and bucket from 32 bits of hash.
const _: () = assert!(FANOUT * FANOUT <= 1 << 32);

/// One bucket: each live token with its use.
type Bucket = HashMap<Arc<str>, Arc<TokenUse>>;

/// [`FANOUT`] buckets.
type Group = Vec<Arc<Bucket>>;

/// The simple tokens this member knows, each with the user it stands for and
/// when it was last used. Every request with a token reads the table, so it
/// is [`Published`]: looked up without a lock; a use renews the token with
/// one atomic store, at most every [`SimpleTokens::renew_step`].
pub struct SimpleTokens {
    ttl: Duration,
    /// Instants are kept as milliseconds since this one.
    epoch: Instant,
    /// [`FANOUT`] groups, a token in the bucket [`bucket_of`] names.
    tokens: Published<Vec<Arc<Group>>>,
    /// The next bucket an edit sweeps for expired tokens (counted over the
    /// table's buckets in order; edits are serialised by the writer's lock).
    sweep: AtomicUsize,
}

/// A token's user and when it was last used.
struct TokenUse {
    user: String,
    used_ms: AtomicU64,
}

/// The group and the bucket in it that `token` is in: a multiplicative
/// fold of its bytes, cheap on every request. Tokens are random letters
/// and digits, so buckets fill evenly; a token a client makes up only
/// picks the bucket it is looked up in (tokens are only ever inserted as
/// [`SimpleTokens::generate`] makes them).
fn bucket_of(token: &str) -> (usize, usize) {
    let hash = token.bytes().fold(0u64, |h, b| {
        (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95)
    });
    // The high bits mix every byte; the low ones mostly the last.
    let hash = (hash >> 32) as usize;
    (hash % FANOUT, (hash / FANOUT) % FANOUT)
}

impl SimpleTokens {
    pub fn new(ttl: Duration) -> SimpleTokens {
        let empty_group = Arc::new(std::iter::repeat_n(Arc::new(Bucket::new()), FANOUT).collect());
        SimpleTokens {
            ttl,
            epoch: Instant::now(),
            // Every bucket and group starts as one shared empty one.
            tokens: Published::new(std::iter::repeat_n(empty_group, FANOUT).collect()),
            sweep: AtomicUsize::new(0),
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

    /// Replaces the bucket `only` names (every bucket for `None`) with
    /// `f`'s edit of its live tokens. An edit of one bucket also looks
    /// through the next [`SWEEP_BUCKETS`] buckets in turn and drops their
    /// expired tokens, so that every bucket is swept once in
    /// `FANOUT * FANOUT / SWEEP_BUCKETS` assignments. Expired tokens not yet
    /// swept are never answered.
    fn edit(&self, only: Option<(usize, usize)>, f: impl Fn(&mut Bucket)) {
        let now = self.now_ms();
        let mut w = self.tokens.write();
        let mut next = w.get().clone();
        match only {
            Some((group, bucket)) => {
                self.rebuild(&mut next, group, bucket, now, &f);
                for _ in 0..SWEEP_BUCKETS {
                    let at = self.sweep.fetch_add(1, Ordering::Relaxed) % (FANOUT * FANOUT);
                    let (group, bucket) = (at / FANOUT, at % FANOUT);
                    if next[group][bucket].values().any(|t| !self.live(t, now)) {
                        self.rebuild(&mut next, group, bucket, now, &|_| {});
                    }
                }
            }
            None => {
                for group in 0..FANOUT {
                    for bucket in 0..FANOUT {
                        self.rebuild(&mut next, group, bucket, now, &f);
                    }
                }
            }
        }
        w.set(next);
    }

    /// Replaces one bucket of `groups` with `f`'s edit of its live tokens.
    /// The group is copied the first time one of its buckets changes.
    fn rebuild(
        &self,
        groups: &mut [Arc<Group>],
        group: usize,
        bucket: usize,
        now: u64,
        f: &dyn Fn(&mut Bucket),
    ) {
        let buckets = Arc::make_mut(&mut groups[group]);
        let mut edited: Bucket = buckets[bucket]
            .iter()
            .filter(|(_, t)| self.live(t, now))
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        f(&mut edited);
        buckets[bucket] = Arc::new(edited);
    }

    pub fn assign(&self, token: &str, user: &str) {
        let bucket = bucket_of(token);
        let (token, user) = (Arc::<str>::from(token), user.to_string());
        let used_ms = self.now_ms();
        self.edit(Some(bucket), |tokens| {
            tokens.insert(
                token.clone(),
                Arc::new(TokenUse {
                    user: user.clone(),
                    used_ms: AtomicU64::new(used_ms),
                }),
            );
        });
    }

    /// The user a token stands for, renewing its time to live.
    pub fn user_of(&self, token: &str) -> Option<String> {
        let now = self.now_ms();
        self.tokens.read(|groups| {
            let (group, bucket) = bucket_of(token);
            let t = groups[group][bucket].get(token)?;
            if !self.live(t, now) {
                // Dropped from the table by the next change to its bucket.
                return None;
            }
            // Another thread may have renewed it at a later `now` already.
            if now.saturating_sub(t.used_ms.load(Ordering::Relaxed)) >= self.renew_step() {
                t.used_ms.fetch_max(now, Ordering::Relaxed);
            }
            Some(t.user.clone())
        })
    }

    pub fn invalidate_user(&self, user: &str) {
        self.edit(None, |tokens| tokens.retain(|_, t| t.user != user));
    }

    pub fn clear(&self) {
        self.edit(None, |tokens| tokens.clear());
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
    fn a_user_change_and_a_clear_reach_every_bucket() {
        let t = SimpleTokens::new(Duration::from_secs(60));
        let tokens: Vec<(String, &str)> = (0..20_000)
            .map(|i| (SimpleTokens::generate(), ["alice", "bob"][i % 2]))
            .collect();
        for (token, user) in &tokens {
            t.assign(token, user);
        }
        t.invalidate_user("bob");
        for (token, user) in &tokens {
            let expected = (*user == "alice").then_some(*user);
            assert_eq!(t.user_of(token).as_deref(), expected, "{token} of {user}");
        }
        t.clear();
        assert!(tokens.iter().all(|(token, _)| t.user_of(token).is_none()));
    }

    /// Tokens held, live or not yet swept.
    fn held(t: &SimpleTokens) -> usize {
        t.tokens
            .read(|groups| groups.iter().flat_map(|g| g.iter()).map(|b| b.len()).sum())
    }

    #[test]
    fn expired_tokens_are_swept_by_later_assignments() {
        let t = SimpleTokens::new(Duration::from_secs(1));
        let old: Vec<String> = (0..1_000).map(|_| SimpleTokens::generate()).collect();
        for token in &old {
            t.assign(token, "old");
        }
        assert_eq!(held(&t), old.len());
        std::thread::sleep(Duration::from_millis(1_100));
        // One sweep of every bucket, and the old tokens are gone.
        let sweep = FANOUT * FANOUT / SWEEP_BUCKETS;
        for _ in 0..sweep {
            t.assign(&SimpleTokens::generate(), "new");
        }
        assert!(held(&t) <= sweep, "{} tokens held", held(&t));
        assert!(old.iter().all(|token| t.user_of(token).is_none()));
    }

    #[test]
    fn tokens_fill_the_buckets_evenly() {
        let mut counts = vec![0usize; FANOUT * FANOUT];
        let n = 100 * FANOUT * FANOUT;
        for _ in 0..n {
            let (g, b) = bucket_of(&SimpleTokens::generate());
            counts[g * FANOUT + b] += 1;
        }
        let (min, max) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
        // 100 a bucket on average; a fair draw stays well inside these.
        assert!(
            min >= 40 && max <= 180,
            "buckets hold {min} to {max} tokens"
        );
    }

    /// What one Authenticate's assignment costs as the table grows, the
    /// work shard 0's core does per token handed out:
    /// `cargo test --release -p cairn --lib -- assign_cost --ignored --nocapture`.
    #[test]
    #[ignore = "prints figures"]
    fn assign_cost() {
        for size in [1_000usize, 10_000, 30_000, 300_000] {
            let t = SimpleTokens::new(Duration::from_secs(300));
            let tokens: Vec<String> = (0..size + 1_000)
                .map(|_| SimpleTokens::generate())
                .collect();
            for token in &tokens[..size] {
                t.assign(token, "user");
            }
            let started = Instant::now();
            for token in &tokens[size..] {
                t.assign(token, "user");
            }
            let per = started.elapsed() / 1_000;
            // The first lookup after a change drops this thread's copy of
            // the table before: timed apart from the lookups.
            assert_eq!(t.user_of(&tokens[0]).as_deref(), Some("user"));
            let looked = Instant::now();
            for token in &tokens[..1_000] {
                assert_eq!(t.user_of(token).as_deref(), Some("user"));
            }
            let lookup = looked.elapsed() / 1_000;
            println!("{size} tokens: {per:?} per assign, {lookup:?} per lookup");
            println!(
                "assign_cost tokens={size} assign_ns={} lookup_ns={}",
                per.as_nanos(),
                lookup.as_nanos()
            );
        }
    }
}
