//! Limits failed Authenticate calls, per user name and per client address
//! (etcd has no such limit): each has a bucket of [`BURST`] failures that
//! refills at one per [`REFILL`]. While either bucket is empty, Authenticate
//! is refused with etcd's "too many requests", even with the right password,
//! so guessing a password costs time however many connections are used.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures allowed in a row before Authenticate is refused.
pub const BURST: f64 = 5.0;
/// One more failure is allowed after each such interval.
pub const REFILL: Duration = Duration::from_secs(1);
/// Buckets kept at most; full ones are dropped first when there are more.
const MAX_BUCKETS: usize = 65_536;

#[derive(Default)]
pub struct FailureLimiter {
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl FailureLimiter {
    /// Whether an attempt by `user` from `addr` may go ahead now.
    pub fn allows(&self, user: &str, addr: Option<&str>) -> bool {
        let mut buckets = self.buckets.lock().expect("limiter");
        let now = Instant::now();
        keys(user, addr).all(|k| level(&mut buckets, &k, now) >= 1.0)
    }

    /// Records a failed attempt.
    pub fn failed(&self, user: &str, addr: Option<&str>) {
        let mut buckets = self.buckets.lock().expect("limiter");
        let now = Instant::now();
        for k in keys(user, addr) {
            let left = level(&mut buckets, &k, now);
            buckets.insert(k, ((left - 1.0).max(0.0), now));
        }
        if buckets.len() > MAX_BUCKETS {
            buckets.retain(|_, (left, at)| refilled(*left, *at, now) < BURST);
        }
    }
}

fn keys<'a>(user: &'a str, addr: Option<&'a str>) -> impl Iterator<Item = String> + 'a {
    std::iter::once(format!("user:{user}")).chain(addr.map(|a| format!("addr:{a}")))
}

fn refilled(left: f64, at: Instant, now: Instant) -> f64 {
    (left + now.duration_since(at).as_secs_f64() / REFILL.as_secs_f64()).min(BURST)
}

fn level(buckets: &mut HashMap<String, (f64, Instant)>, key: &str, now: Instant) -> f64 {
    match buckets.get(key) {
        Some((left, at)) => refilled(*left, *at, now),
        None => BURST,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_limited_per_user_and_per_address() {
        let l = FailureLimiter::default();
        for _ in 0..5 {
            assert!(l.allows("bob", Some("10.0.0.1")));
            l.failed("bob", Some("10.0.0.1"));
        }
        assert!(
            !l.allows("bob", Some("10.0.0.2")),
            "the user's bucket is empty"
        );
        assert!(!l.allows("alice", Some("10.0.0.1")), "the address's is too");
        assert!(l.allows("alice", Some("10.0.0.2")));
        assert!(l.allows("alice", None));
        std::thread::sleep(REFILL + Duration::from_millis(50));
        assert!(l.allows("bob", Some("10.0.0.2")), "refilled");
    }
}
