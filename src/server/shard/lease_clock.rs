//! The time left of every lease of one shard, on its leader: TTLs restarted
//! when this member takes over, renewed by keep-alives a quorum has confirmed
//! this leader for, and expired ones handed to the driver to revoke.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// etcd's largest lease TTL, in seconds.
pub const MAX_LEASE_TTL_SECS: i64 = 9_000_000_000;

/// Revocations of expired leases a shard's leader proposes per second at
/// most (etcd's rate), so a mass expiry does not flood the log.
pub const LEASE_REVOKES_PER_SECOND: u64 = 1000;

/// How long an expired lease's revocation may take to apply before the
/// leader proposes it again.
pub const LEASE_REVOKE_RETRY: Duration = Duration::from_secs(3);

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(ttl.clamp(0, MAX_LEASE_TTL_SECS) as u64)
}

/// `now + d`, or a century from now where `d` is past what the clock holds.
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

#[derive(Debug, Clone, Copy)]
struct Tracked {
    ttl: i64,
    deadline: Instant,
    /// Past its deadline, its revocation proposed: no longer renewable.
    expired: bool,
}

/// The time left of every lease of one shard, kept by the shard's leader
/// only (followers keep nothing: a new leader starts every TTL afresh).
#[derive(Debug)]
pub struct LeaseClock {
    /// Added to every TTL when this member becomes leader (one election
    /// timeout): the old leader's clients get time to find the new one.
    extend: Duration,
    revokes_per_tick: usize,
    /// While this member leads the shard: the index the shard must have
    /// applied before the clock answers (the new leader's first entry, so every
    /// grant and revoke of earlier terms is known).
    leading_from: Option<u64>,
    leases: HashMap<i64, Tracked>,
    by_deadline: BTreeSet<(Instant, i64)>,
}

impl LeaseClock {
    pub fn new(tick: Duration, election_ticks: u64) -> LeaseClock {
        let per_tick = (LEASE_REVOKES_PER_SECOND as u128 * tick.as_millis() / 1000).max(1);
        LeaseClock {
            extend: tick * election_ticks.min(u64::from(u32::MAX)) as u32,
            revokes_per_tick: per_tick as usize,
            leading_from: None,
            leases: HashMap::new(),
            by_deadline: BTreeSet::new(),
        }
    }

    /// This member became the shard's leader: every lease (id, TTL, remaining
    /// TTL of a checkpoint or 0) starts its TTL now.
    pub fn promote(
        &mut self,
        ready_index: u64,
        leases: impl IntoIterator<Item = (i64, i64, i64)>,
        now: Instant,
    ) {
        self.leases.clear();
        self.by_deadline.clear();
        self.leading_from = Some(ready_index);
        for (id, ttl, remaining) in leases {
            let left = if remaining > 0 { remaining } else { ttl };
            self.track(id, ttl, later(now, self.extend + secs(left)));
        }
    }

    /// This member no longer leads the shard.
    pub fn demote(&mut self) {
        self.leading_from = None;
        self.leases.clear();
        self.by_deadline.clear();
    }

    pub fn is_leading(&self) -> bool {
        self.leading_from.is_some()
    }

    /// Whether the clock may answer, the shard having applied `applied`.
    pub fn is_ready(&self, applied: u64) -> bool {
        self.leading_from.is_some_and(|from| applied >= from)
    }

    fn track(&mut self, id: i64, ttl: i64, deadline: Instant) {
        if let Some(old) = self.leases.insert(
            id,
            Tracked {
                ttl,
                deadline,
                expired: false,
            },
        ) {
            self.by_deadline.remove(&(old.deadline, id));
        }
        self.by_deadline.insert((deadline, id));
    }

    /// A grant was applied.
    pub fn granted(&mut self, id: i64, ttl: i64, now: Instant) {
        if self.is_leading() && !self.leases.contains_key(&id) {
            self.track(id, ttl, later(now, secs(ttl)));
        }
    }

    /// A revoke was applied (or found no lease).
    pub fn revoked(&mut self, id: i64) {
        if let Some(old) = self.leases.remove(&id) {
            self.by_deadline.remove(&(old.deadline, id));
        }
    }

    /// Restarts the lease's TTL; its granted TTL, or None when it is unknown
    /// or expired.
    pub fn renew(&mut self, id: i64, now: Instant) -> Option<i64> {
        let t = *self.leases.get(&id)?;
        if t.expired {
            return None;
        }
        self.track(id, t.ttl, later(now, secs(t.ttl)));
        Some(t.ttl)
    }

    /// Time left before the lease expires; None when unknown or expired.
    pub fn remaining(&self, id: i64, now: Instant) -> Option<Duration> {
        let t = self.leases.get(&id)?;
        (!t.expired).then(|| t.deadline.saturating_duration_since(now))
    }

    /// Leases whose TTL ran out, at most one tick's share: they are marked
    /// expired and come due again after [`LEASE_REVOKE_RETRY`] unless their
    /// revocation is applied meanwhile.
    pub fn due(&mut self, now: Instant) -> Vec<i64> {
        let mut out = Vec::new();
        while out.len() < self.revokes_per_tick {
            let Some(&(deadline, id)) = self.by_deadline.first() else {
                break;
            };
            if deadline > now {
                break;
            }
            self.by_deadline.pop_first();
            if let Some(t) = self.leases.get_mut(&id) {
                let retry = later(now, LEASE_REVOKE_RETRY);
                t.expired = true;
                t.deadline = retry;
                self.by_deadline.insert((retry, id));
                out.push(id);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_expires_renews_and_restarts_on_promotion() {
        let tick = Duration::from_millis(100);
        let mut c = LeaseClock::new(tick, 10);
        let t0 = Instant::now();
        c.granted(1, 5, t0);
        assert!(c.remaining(1, t0).is_none(), "a follower tracks nothing");
        c.promote(7, [(1, 5, 0), (2, 10, 0)], t0);
        assert!(!c.is_ready(6) && c.is_ready(7));
        // Promotion adds one election timeout (1 s) to every TTL.
        assert_eq!(c.remaining(1, t0), Some(Duration::from_secs(6)));
        assert!(c.due(t0 + Duration::from_secs(5)).is_empty());
        assert_eq!(c.due(t0 + Duration::from_secs(6)), vec![1]);
        assert_eq!(c.renew(1, t0), None, "an expired lease is not renewed");
        assert_eq!(c.renew(2, t0 + Duration::from_secs(6)), Some(10));
        assert_eq!(
            c.remaining(2, t0 + Duration::from_secs(6)),
            Some(Duration::from_secs(10))
        );
        // Its revoke not applied: due again after the retry delay.
        assert_eq!(c.due(t0 + Duration::from_secs(9)), vec![1]);
        c.revoked(1);
        assert!(c.due(t0 + Duration::from_secs(15)).is_empty());
        c.granted(3, 2, t0);
        assert_eq!(c.remaining(3, t0), Some(Duration::from_secs(2)));
        c.demote();
        assert!(c.remaining(2, t0).is_none() && !c.is_leading());
    }

    #[test]
    fn huge_ttls_do_not_overflow_the_clock() {
        let mut c = LeaseClock::new(Duration::from_millis(100), 10);
        let now = Instant::now();
        c.promote(0, [(1, MAX_LEASE_TTL_SECS, 0)], now);
        c.granted(2, i64::MAX, now);
        assert!(c.renew(2, now).is_some());
        assert!(c.due(now).is_empty());
    }

    #[test]
    fn revocations_are_limited_per_tick() {
        let mut c = LeaseClock::new(Duration::from_millis(10), 10);
        let now = Instant::now();
        c.promote(0, (1..=50).map(|id| (id, 1, 0)), now);
        let later = now + Duration::from_secs(5);
        assert_eq!(c.due(later).len(), 10);
        assert_eq!(c.due(later).len(), 10);
    }
}
