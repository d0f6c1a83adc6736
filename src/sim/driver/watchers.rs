//! Simulated watch streams: a few sessions each watch every key through one
//! running member's router, from the first revision they have not seen, as
//! the Watch service does (`keyspace::watch_shards`): registered on every
//! shard, and with several shards the shards' batches merged into one
//! revision order by the real merge, which releases an event once every
//! shard has sent through its revision. When the member crashes, is
//! removed, or a session moves on by itself, it watches again through
//! another member from where it stopped, as an etcd client resumes a watch.
//! One session reads slowly, so its shards' queue fills and they move it to
//! catch-up from the store. With several shards, two more sessions watch
//! from now (start revision 0) each time, through any member and often
//! moving on, so that many watches begin while the member's shards stand at
//! different revisions: each such watch must be sent only what follows its
//! created response's header revision, and from there all of it. With
//! several shards each watch has a window of a few revisions or of the
//! Watch service's width, by turns, so that shards ahead of the others stop
//! short of their events past it and read them from the store as the merge
//! releases events: no shard may send an event past the window
//! ([`Kind::WatchPastWindow`]).
//!
//! What each session is sent is checked as it arrives ([`take`]: revisions
//! never go back, none sent twice, none above its response's revision, none
//! at or below the revision its watch started after) and against the log at
//! the end ([`check`]): every revision once, in order, with the log's keys
//! and values (with several shards, every shard's changes at that revision,
//! e.g. of a txn over several shards), and nothing missing between the
//! first and the last (for a watch from now, between its created header's
//! revision and the last it was sent).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use cairn_proto::mvccpb;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::server::command::{ShardCommand, WatchBatch, WatchSpec};
use crate::server::keyspace::watch_shards::{Delivery, ShardsWatch, WATCH_WINDOW_REVISIONS};

use super::checks::{violation, Change, DriverViolation, DriverViolationKind as Kind, Log};
use super::world::World;

/// Sessions watching at once, each resuming from where it stopped.
const SESSIONS: usize = 3;
/// Sessions, with several shards, that watch from now each time.
const FROM_NOW_SESSIONS: usize = 2;
/// Most responses a watch from now takes before its session moves on.
const FROM_NOW_RESPONSES: u32 = 20;
/// Batches a session's stream holds before its shards move it to catch-up.
const STREAM_QUEUE: usize = 4;
/// The widths of the windows the watches over several shards send within,
/// by turns (the last the Watch service's).
const WINDOWS: [i64; 4] = [1, 3, 16, WATCH_WINDOW_REVISIONS];

/// One event a session was sent.
#[derive(Debug, Clone)]
pub struct Seen {
    pub member: u64,
    pub revision: i64,
    pub key: Bytes,
    /// None: a delete.
    pub value: Option<Bytes>,
    /// Which of its session's watches sent it (its count of watches then).
    pub watch: u64,
    /// The revision that watch started after.
    pub after: i64,
}

/// What one session was sent, in order.
#[derive(Debug)]
pub struct Session {
    pub events: Vec<Seen>,
    /// The first revision not seen yet: for a watch from now, at first the
    /// one after its created header's.
    pub next: i64,
    /// Each watch starts from now (start revision 0) and is checked on its
    /// own, from its created header's revision; else each resumes from
    /// `next`, and the session is checked as one stream from revision 1.
    pub from_now: bool,
    /// The revision the current watch started after: its created header's
    /// (from now), or the one before its start revision.
    pub after: i64,
    /// Watches asked of a member, and those it took.
    pub asked: u64,
    pub watches: u64,
    /// A broken promise of a driver, seen as it happened.
    pub failure: Option<DriverViolation>,
    /// Batches of a watch over several shards that stopped short of their
    /// shard's revision: at the window, or at the end of a catch-up pass.
    pub window_stops: u64,
}

pub type Sessions = Rc<RefCell<Vec<Session>>>;

/// Starts the sessions; they watch until their tasks are aborted.
pub fn start(world: &Rc<World>) -> (Sessions, Vec<tokio::task::JoinHandle<Option<()>>>) {
    // Watches from now with several shards only: one shard's watch from
    // now is that shard's own revision, and those seeds run as they did.
    let from_now = if world.shards() > 1 {
        FROM_NOW_SESSIONS
    } else {
        0
    };
    let sessions: Sessions = Rc::new(RefCell::new(
        (0..SESSIONS + from_now)
            .map(|n| Session {
                events: Vec::new(),
                next: 1,
                from_now: n >= SESSIONS,
                after: 0,
                asked: 0,
                watches: 0,
                failure: None,
                window_stops: 0,
            })
            .collect(),
    ));
    let tasks = (0..SESSIONS + from_now)
        .map(|n| {
            // The last resuming session reads slowly: its queue fills.
            let slow = n + 1 == SESSIONS;
            let task = watch(world.clone(), sessions.clone(), n, slow);
            world.spawn_checked(move || format!("watch session {n}"), task)
        })
        .collect();
    (sessions, tasks)
}

async fn watch(world: Rc<World>, sessions: Sessions, n: usize, slow: bool) {
    let from_now = sessions.borrow()[n].from_now;
    loop {
        tokio::time::sleep(Duration::from_millis(world.gen_range(5..200))).await;
        let Some(member) = world.pick_up() else {
            continue;
        };
        let Some(router) = world.router(member) else {
            continue;
        };
        // This incarnation's queues, for a cancel that does not wait for the
        // shards' answers.
        let queues: Vec<_> = (world.routing.shard_ids())
            .map(|s| world.commands_of(member, s))
            .collect();
        let (start_revision, asked) = {
            let mut all = sessions.borrow_mut();
            all[n].asked += 1;
            let start = if from_now { 0 } else { all[n].next };
            (start, all[n].asked)
        };
        // Distinct for every watch of the run, so a restarted driver never
        // meets an earlier stream's key.
        let key = (((n as u64) << 32) | asked, 0);
        let (tx, mut rx) = mpsc::channel::<WatchBatch>(STREAM_QUEUE);
        let spec = WatchSpec::every_change(&[0], &[0]);
        let window = WINDOWS[asked as usize % WINDOWS.len()];
        let created = ShardsWatch::create(&router, key, spec, start_revision, tx, window).await;
        let Ok((mut shards_watch, header)) = created else {
            // Refused or stopped: another member, later.
            continue;
        };
        {
            let session = &mut sessions.borrow_mut()[n];
            session.watches += 1;
            // From now: only what follows the created response's header.
            session.after = if from_now { header } else { start_revision - 1 };
            session.next = session.after + 1;
        }
        // Now and then a session moves on by itself after some responses;
        // one watching from now always does, to watch from now again.
        let moves_after = if from_now {
            Some(world.gen_range(1..=FROM_NOW_RESPONSES))
        } else {
            world.chance(200).then(|| world.gen_range(1..20u32))
        };
        let mut responses = 0u32;
        while let Some(batch) = rx.recv().await {
            if let Some(limit) = shards_watch.event_limit() {
                let last = batch.events.last().and_then(|e| e.kv.as_ref());
                if let Some(kv) = last.filter(|kv| kv.mod_revision > limit) {
                    sessions.borrow_mut()[n].failure = Some(violation(
                        Kind::WatchPastWindow,
                        format!(
                            "shard {} of member {member} sent a watch revision {} past its \
                             window, which ends at {limit}",
                            batch.shard, kv.mod_revision
                        ),
                    ));
                    return;
                }
                if batch.through < batch.revision {
                    sessions.borrow_mut()[n].window_stops += 1;
                }
            }
            if let Some(delivery) = shards_watch.take(batch) {
                let broken = take(&mut sessions.borrow_mut()[n], member, delivery);
                if broken.is_some() {
                    sessions.borrow_mut()[n].failure = broken;
                    return;
                }
                responses += 1;
                if moves_after.is_some_and(|m| responses >= m) {
                    for &s in shards_watch.shards() {
                        if let Some(queue) = &queues[s as usize] {
                            let (reply, _) = crate::server::command::Reply::channel();
                            let _ = queue.try_send(ShardCommand::CancelWatch { key, reply });
                        }
                    }
                    break;
                }
            }
            if slow {
                tokio::time::sleep(Duration::from_millis(world.gen_range(2..40))).await;
            }
        }
    }
}

/// Records `delivery`, or says how it breaks the stream's promise: events
/// in revision order, each above the revision its watch started after (for
/// a watch from now, the created response's header revision), none above
/// the response's revision, no revision sent in two responses (one
/// revision's events, of every shard, come together).
fn take(session: &mut Session, member: u64, delivery: Delivery) -> Option<DriverViolation> {
    let (header, events) = match delivery {
        Delivery::Events { revision, events } => (revision, events),
        Delivery::Compacted {
            compact_revision, ..
        } => {
            // Nothing compacts the stores here.
            return Some(violation(
                Kind::WatchGap,
                format!(
                    "member {member} cancelled a watch from revision {} as compacted at \
                     {compact_revision}",
                    session.next
                ),
            ));
        }
    };
    let from = session.next;
    let mut last = from;
    for e in events {
        let deleted = e.r#type == mvccpb::event::EventType::Delete as i32;
        let kv = e.kv.unwrap_or_default();
        let revision = kv.mod_revision;
        if revision <= session.after {
            let start = if session.from_now {
                format!(
                    "a watch from now whose created response's header was revision {}",
                    session.after
                )
            } else {
                format!("a watch from revision {}", session.after + 1)
            };
            return Some(violation(
                Kind::WatchBeforeStart,
                format!("member {member} sent revision {revision} to {start}"),
            ));
        }
        if revision < last {
            return Some(violation(
                Kind::WatchOrder,
                format!(
                    "member {member} sent revision {revision} to a watch that had been sent \
                     revision {last} already, or every revision before {from}"
                ),
            ));
        }
        if revision > header {
            return Some(violation(
                Kind::WatchOrder,
                format!(
                    "member {member} sent revision {revision} in a response at revision \
                     {header}"
                ),
            ));
        }
        last = revision;
        session.next = revision + 1;
        session.events.push(Seen {
            member,
            revision,
            key: kv.key,
            value: (!deleted).then_some(kv.value),
            watch: session.watches,
            after: session.after,
        });
    }
    None
}

/// Waits until every session has been sent revision `revision` (a watch
/// from now created above it has nothing to be sent), or says which one was
/// not within `bound` while every member runs. `after` says what the bound
/// runs from, for the message: the end of the faults, and with leases the
/// end of every lease.
pub async fn caught_up(
    sessions: &Sessions,
    revision: i64,
    bound: Duration,
    after: &str,
) -> Result<(), DriverViolation> {
    let deadline = Instant::now() + bound;
    loop {
        let behind = {
            let mut all = sessions.borrow_mut();
            if let Some(v) = all.iter_mut().find_map(|s| s.failure.take()) {
                return Err(v);
            }
            all.iter()
                .position(|s| s.next <= revision)
                .map(|n| (n, all[n].next))
        };
        let Some((n, next)) = behind else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            return Err(violation(
                Kind::WatchStalled,
                format!(
                    "watch session {n} had been sent the revisions below {next} only, \
                     {bound:?} after {after}; the last revision is {revision}"
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks what the sessions were sent against `log`: each revision a
/// session was sent holds the log's changes there, and none is missing from
/// the log's first revision to a resuming session's last (every such
/// session watched from revision 1, and nothing compacts), nor from a watch
/// from now's created header's revision to the last that watch was sent.
pub fn check(sessions: &Sessions, log: &Log) -> Result<(), DriverViolation> {
    for (n, s) in sessions.borrow_mut().iter_mut().enumerate() {
        if let Some(v) = s.failure.take() {
            return Err(v);
        }
        // One stream per watch from now; a resuming session's watches make
        // one stream.
        let mut streams: BTreeMap<u64, Vec<&Seen>> = BTreeMap::new();
        for e in &s.events {
            let stream = if s.from_now { e.watch } else { 0 };
            streams.entry(stream).or_default().push(e);
        }
        for events in streams.values() {
            check_stream(n, s, events, log)?;
        }
    }
    Ok(())
}

/// [`check`] of one stream of session `n`: `events`, of one watch from now
/// or of every watch of a resuming session.
fn check_stream(n: usize, s: &Session, events: &[&Seen], log: &Log) -> Result<(), DriverViolation> {
    let mut sent: BTreeMap<i64, (u64, Vec<Change>)> = BTreeMap::new();
    for e in events {
        let (_, changes) = sent.entry(e.revision).or_insert((e.member, Vec::new()));
        changes.push((e.key.clone(), e.value.clone()));
    }
    for (revision, (member, changes)) in &mut sent {
        changes.sort();
        let logged = log.get(revision);
        if logged != Some(changes) {
            return Err(violation(
                Kind::WatchPhantom,
                format!(
                    "member {member} sent watch session {n} {changes:?} at revision \
                     {revision}; the log holds {logged:?} there"
                ),
            ));
        }
    }
    let Some(&last) = sent.keys().next_back() else {
        return Ok(());
    };
    // From the log's first revision, or above a watch from now's start.
    let first = if s.from_now { events[0].after + 1 } else { 0 };
    if let Some(missing) = log
        .range(first..=last)
        .map(|(r, _)| *r)
        .find(|r| !sent.contains_key(r))
    {
        let after = sent.range(missing..).next().map(|(r, (m, _))| (*r, *m));
        let stream = if s.from_now {
            format!(
                "its watch {} from now, created at revision {},",
                events[0].watch, events[0].after
            )
        } else {
            format!("after {} watches, it", s.watches)
        };
        return Err(violation(
            Kind::WatchGap,
            format!(
                "watch session {n} was never sent revision {missing} of the log; {stream} \
                 was sent {after:?} (revision, member) next"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> Log {
        (2..=5)
            .map(|r| {
                (
                    r,
                    vec![(Bytes::from("k"), Some(Bytes::from(format!("v{r}"))))],
                )
            })
            .collect()
    }

    fn session(revisions: &[i64], value_of: impl Fn(i64) -> String) -> Session {
        Session {
            events: revisions
                .iter()
                .map(|&revision| Seen {
                    member: 1,
                    revision,
                    key: Bytes::from("k"),
                    value: Some(Bytes::from(value_of(revision))),
                    watch: 1,
                    after: 0,
                })
                .collect(),
            next: revisions.last().map_or(1, |r| r + 1),
            from_now: false,
            after: 0,
            asked: 1,
            watches: 1,
            failure: None,
            window_stops: 0,
        }
    }

    fn checked(s: Session) -> Result<(), Kind> {
        check(&Rc::new(RefCell::new(vec![s])), &log()).map_err(|v| v.kind)
    }

    #[test]
    fn a_session_must_see_the_log_from_its_start_without_gaps_or_strangers() {
        let value = |r: i64| format!("v{r}");
        assert_eq!(checked(session(&[2, 3, 4, 5], value)), Ok(()));
        // Not yet sent the newest: still whole up to its last event.
        assert_eq!(checked(session(&[2, 3], value)), Ok(()));
        assert_eq!(checked(session(&[], value)), Ok(()));
        assert_eq!(checked(session(&[2, 4, 5], value)), Err(Kind::WatchGap));
        assert_eq!(checked(session(&[3, 4], value)), Err(Kind::WatchGap));
        assert_eq!(
            checked(session(&[2, 3], |r| format!("w{r}"))),
            Err(Kind::WatchPhantom)
        );
        assert_eq!(checked(session(&[2, 3, 6], value)), Err(Kind::WatchPhantom));
    }

    /// A session watching from now: its watches' events by `(watch,
    /// created header's revision, revisions)`.
    fn from_now(watches: &[(u64, i64, &[i64])]) -> Session {
        let mut s = session(&[], |_| String::new());
        s.from_now = true;
        for &(watch, after, revisions) in watches {
            s.events.extend(revisions.iter().map(|&revision| Seen {
                member: 1,
                revision,
                key: Bytes::from("k"),
                value: Some(Bytes::from(format!("v{revision}"))),
                watch,
                after,
            }));
        }
        s
    }

    #[test]
    fn a_watch_from_now_must_see_the_log_from_its_created_revision_without_gaps() {
        // Each watch on its own: the second began at 3, after the first
        // had been sent 2 only.
        assert_eq!(checked(from_now(&[(1, 1, &[2]), (2, 3, &[4, 5])])), Ok(()));
        assert_eq!(checked(from_now(&[(1, 3, &[])])), Ok(()));
        assert_eq!(
            checked(from_now(&[(1, 1, &[2]), (2, 3, &[5])])),
            Err(Kind::WatchGap)
        );
    }

    #[test]
    fn a_response_that_goes_back_or_says_compacted_breaks_the_stream() {
        let events = |revisions: &[i64], header| Delivery::Events {
            revision: header,
            events: revisions
                .iter()
                .map(|&r| cairn_proto::mvccpb::Event {
                    kv: Some(cairn_proto::mvccpb::KeyValue {
                        key: Bytes::from("k"),
                        mod_revision: r,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
        };
        let mut s = session(&[], |_| String::new());
        // One revision's events together (a txn), then a later one.
        assert!(take(&mut s, 1, events(&[2, 2, 3], 9)).is_none());
        assert_eq!(s.next, 4);
        let again = take(&mut s, 2, events(&[3], 9)).map(|v| v.kind);
        assert_eq!(again, Some(Kind::WatchOrder));
        // An event above its response's revision: not yet released.
        let ahead = take(&mut s, 2, events(&[10], 9)).map(|v| v.kind);
        assert_eq!(ahead, Some(Kind::WatchOrder));
        let compacted = Delivery::Compacted {
            revision: 9,
            compact_revision: 4,
        };
        assert_eq!(
            take(&mut s, 2, compacted).map(|v| v.kind),
            Some(Kind::WatchGap)
        );
        // A watch from now created at revision 12 is sent nothing at or
        // below it, though a shard behind the others had 11 and 12 to send.
        let mut s = from_now(&[]);
        (s.after, s.next) = (12, 13);
        let early = take(&mut s, 1, events(&[11, 12, 13], 13)).map(|v| v.kind);
        assert_eq!(early, Some(Kind::WatchBeforeStart));
        assert!(take(&mut s, 1, events(&[13], 13)).is_none());
    }
}
