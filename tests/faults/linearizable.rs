//! Linearizability of single-key registers with CAS, checked per key by the
//! Wing-Gong search with Lowe's memoisation, as Porcupine does it.
//!
//! The history of one key becomes a list of call and return events in time
//! order. The search walks it: a call whose operation the model accepts from
//! the current state is linearized (lifted out of the list with its return)
//! and the walk restarts; reaching a return whose call is not yet linearized
//! means the last choice was wrong, so it backtracks. A (set of linearized
//! calls, model state) pair seen before is never explored twice. An unknown
//! outcome returns at infinity: it may take effect anywhere after its call,
//! or (linearized last) never.
//!
//! The model is a register holding a value and what is known of its mod
//! revision: exact after a known write or read, or a lower bound after an
//! unknown write. Every write must carry a revision above the one before, and
//! a read must return the revision of the value it returns.

use std::collections::{BTreeMap, HashSet};

use super::history::{Outcome, Record, RegOp, RegOut};

/// What the model knows of the key's mod revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rev {
    Exact(i64),
    AtLeast(i64),
}

impl Rev {
    /// The least revision the next write may carry.
    fn next_floor(self) -> i64 {
        match self {
            Rev::Exact(r) => r + 1,
            Rev::AtLeast(r) => r + 1,
        }
    }

    /// Whether a read may return `mod_rev` for the current value.
    fn admits(self, mod_rev: i64) -> bool {
        match self {
            Rev::Exact(r) => r == mod_rev,
            Rev::AtLeast(r) => mod_rev >= r,
        }
    }

    fn admits_write(self, rev: i64) -> bool {
        match self {
            Rev::Exact(r) => rev > r,
            Rev::AtLeast(r) => rev >= r,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct State {
    value: Option<u64>,
    rev: Rev,
}

const INITIAL: State = State {
    value: None,
    rev: Rev::Exact(0),
};

/// The register's transitions: the states after `op` answered `out` (None
/// for an unknown outcome), none when the model cannot give that answer. Two
/// only for an unknown CAS on a revision the model knows a bound of.
fn step(s: State, op: RegOp, out: Option<RegOut>) -> [Option<State>; 2] {
    match (op, out) {
        (RegOp::CasRev { expect_rev, new }, None) => {
            let applied = State {
                value: Some(new),
                rev: Rev::AtLeast(expect_rev + 1),
            };
            match s.rev {
                _ if s.value.is_none() => [Some(s), None],
                Rev::Exact(r) if r == expect_rev => [Some(applied), None],
                Rev::AtLeast(a) if a <= expect_rev => [Some(applied), Some(s)],
                _ => [Some(s), None],
            }
        }
        _ => [step_one(s, op, out), None],
    }
}

fn step_one(s: State, op: RegOp, out: Option<RegOut>) -> Option<State> {
    let read = |value: Option<u64>, mod_rev: i64| {
        (s.value == value && s.rev.admits(mod_rev)).then_some(State {
            value,
            rev: Rev::Exact(mod_rev),
        })
    };
    match (op, out) {
        (RegOp::Read, Some(RegOut::Read { value, mod_rev })) => read(value, mod_rev),
        (RegOp::Write(v), Some(RegOut::Written { rev })) => {
            s.rev.admits_write(rev).then_some(State {
                value: Some(v),
                rev: Rev::Exact(rev),
            })
        }
        (RegOp::Write(v), None) => Some(State {
            value: Some(v),
            rev: Rev::AtLeast(s.rev.next_floor()),
        }),
        (RegOp::Cas { expect, new }, Some(RegOut::Swapped { rev })) => {
            (s.value == Some(expect) && s.rev.admits_write(rev)).then_some(State {
                value: Some(new),
                rev: Rev::Exact(rev),
            })
        }
        (RegOp::Cas { expect, .. }, Some(RegOut::Missed { value, mod_rev })) => {
            if s.value == Some(expect) {
                None
            } else {
                read(value, mod_rev)
            }
        }
        (RegOp::CasRev { expect_rev, new }, Some(RegOut::Swapped { rev })) => {
            (s.value.is_some() && s.rev.admits(expect_rev) && rev > expect_rev).then_some(State {
                value: Some(new),
                rev: Rev::Exact(rev),
            })
        }
        (RegOp::CasRev { expect_rev, .. }, Some(RegOut::Missed { value, mod_rev })) => {
            if mod_rev == expect_rev && value.is_some() {
                None
            } else {
                read(value, mod_rev)
            }
        }
        (RegOp::Cas { expect, new }, None) => Some(if s.value == Some(expect) {
            State {
                value: Some(new),
                rev: Rev::AtLeast(s.rev.next_floor()),
            }
        } else {
            s
        }),
        _ => None,
    }
}

/// The verdict on one key.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order fits; `stuck_at` is the operation (index into the key's
    /// records) the deepest attempt could not get past.
    Violation {
        stuck_at: usize,
        linearized: usize,
    },
    /// The search budget ran out first: no judgement.
    GaveUp,
}

/// Search steps per key before giving up.
pub const SEARCH_BUDGET_STEPS: u64 = 20_000_000;

const HEAD: usize = 0;

/// Checks one key's operations (Fail outcomes are dropped: they had no
/// effect). Records must all be of the same key.
pub fn check_key(records: &[Record], budget_steps: u64) -> Verdict {
    let ops: Vec<&Record> = records
        .iter()
        .filter(|r| r.outcome != Outcome::Fail)
        .collect();
    let n = ops.len();
    if n == 0 {
        return Verdict::Linearizable;
    }
    // Events: (time, is_return, op). Nodes 1..=2n in time order, calls before
    // returns at equal times (the more permissive order); node 0 is the head
    // and node 2n+1 the tail.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, r) in ops.iter().enumerate() {
        events.push((r.invoke_ns, false, i));
        events.push((r.complete_ns, true, i));
    }
    events.sort();
    let tail = 2 * n + 1;
    let mut next: Vec<usize> = (1..=tail + 1).collect();
    let mut prev: Vec<usize> = (0..=tail).map(|i| i.saturating_sub(1)).collect();
    let mut is_return = vec![false; tail + 1];
    let mut op_of = vec![0usize; tail + 1];
    let mut return_node = vec![0usize; n];
    for (pos, &(_, ret, op)) in events.iter().enumerate() {
        let node = pos + 1;
        is_return[node] = ret;
        op_of[node] = op;
        if ret {
            return_node[op] = node;
        }
    }
    let words = n.div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
    // (call linearized, state before it, which of its transitions).
    let mut stack: Vec<(usize, State, usize)> = Vec::new();
    let mut state = INITIAL;
    let mut entry = next[HEAD];
    // The first transition of `entry` still to try.
    let mut alt = 0;
    let (mut deepest, mut stuck_at) = (0usize, 0usize);
    let mut steps = 0u64;

    let lift = |next: &mut [usize], prev: &mut [usize], call: usize, ret: usize| {
        let (p, nx) = (prev[call], next[call]);
        next[p] = nx;
        prev[nx] = p;
        let (p, nx) = (prev[ret], next[ret]);
        next[p] = nx;
        prev[nx] = p;
    };
    let unlift = |next: &mut [usize], prev: &mut [usize], call: usize, ret: usize| {
        let (p, nx) = (prev[ret], next[ret]);
        next[p] = ret;
        prev[nx] = ret;
        let (p, nx) = (prev[call], next[call]);
        next[p] = call;
        prev[nx] = call;
    };

    while next[HEAD] != tail {
        steps += 1;
        if steps > budget_steps {
            return Verdict::GaveUp;
        }
        if !is_return[entry] {
            let op = op_of[entry];
            let out = match ops[op].outcome {
                Outcome::Ok(out) => Some(out),
                _ => None,
            };
            let afters = step(state, ops[op].op, out);
            let mut lifted = false;
            for (i, after) in afters.iter().enumerate().skip(alt) {
                let Some(after) = *after else { continue };
                linearized[op / 64] |= 1 << (op % 64);
                if seen.insert((linearized.clone(), after)) {
                    stack.push((entry, state, i));
                    state = after;
                    lift(&mut next, &mut prev, entry, return_node[op]);
                    lifted = true;
                    break;
                }
                linearized[op / 64] &= !(1 << (op % 64));
            }
            alt = 0;
            entry = if lifted { next[HEAD] } else { next[entry] };
        } else {
            if stack.len() >= deepest {
                deepest = stack.len();
                stuck_at = op_of[entry];
            }
            let Some((call, before, tried)) = stack.pop() else {
                return Verdict::Violation {
                    stuck_at: original_index(records, ops[stuck_at]),
                    linearized: deepest,
                };
            };
            let op = op_of[call];
            state = before;
            linearized[op / 64] &= !(1 << (op % 64));
            unlift(&mut next, &mut prev, call, return_node[op]);
            // The same call again, from its next transition.
            entry = call;
            alt = tried + 1;
        }
    }
    Verdict::Linearizable
}

fn original_index(records: &[Record], wanted: &Record) -> usize {
    records
        .iter()
        .position(|r| std::ptr::eq(r, wanted))
        .unwrap_or(0)
}

/// One key that is not linearizable, with the operations around the point
/// the search could not pass.
#[derive(Debug)]
pub struct KeyViolation {
    pub key: String,
    pub ops: usize,
    pub linearized: usize,
    pub stuck_at: Record,
}

/// The result over a whole history.
#[derive(Debug, Default)]
pub struct Report {
    pub keys: usize,
    pub violations: Vec<KeyViolation>,
    pub gave_up: Vec<String>,
}

/// Checks every key of the history on its own (linearizability is local).
pub fn check(records: &[Record]) -> Report {
    let mut by_key: BTreeMap<&str, Vec<Record>> = BTreeMap::new();
    for r in records {
        by_key.entry(&r.key).or_default().push(r.clone());
    }
    let mut report = Report {
        keys: by_key.len(),
        ..Report::default()
    };
    for (key, ops) in by_key {
        match check_key(&ops, SEARCH_BUDGET_STEPS) {
            Verdict::Linearizable => {}
            Verdict::GaveUp => report.gave_up.push(key.to_string()),
            Verdict::Violation {
                stuck_at,
                linearized,
            } => report.violations.push(KeyViolation {
                key: key.to_string(),
                ops: ops.len(),
                linearized,
                stuck_at: ops[stuck_at].clone(),
            }),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    //! Hand-built histories, linearizable and not, guarding the checker
    //! against both false alarms and missed anomalies.

    use super::*;

    fn rec(op: RegOp, invoke: u64, complete: u64, outcome: Outcome) -> Record {
        Record {
            client: 0,
            key: "k".into(),
            op,
            invoke_ns: invoke,
            complete_ns: if outcome == Outcome::Unknown {
                u64::MAX
            } else {
                complete
            },
            outcome,
        }
    }
    fn write(v: u64, i: u64, c: u64, rev: i64) -> Record {
        rec(RegOp::Write(v), i, c, Outcome::Ok(RegOut::Written { rev }))
    }
    fn read(v: Option<u64>, i: u64, c: u64, mod_rev: i64) -> Record {
        rec(
            RegOp::Read,
            i,
            c,
            Outcome::Ok(RegOut::Read { value: v, mod_rev }),
        )
    }
    fn lin(h: &[Record]) -> bool {
        match check_key(h, 1_000_000) {
            Verdict::Linearizable => true,
            Verdict::Violation { .. } => false,
            Verdict::GaveUp => panic!("gave up on a tiny history"),
        }
    }

    #[test]
    fn sequential_reads_see_the_last_write() {
        assert!(lin(&[
            read(None, 0, 1, 0),
            write(1, 2, 3, 5),
            read(Some(1), 4, 5, 5)
        ]));
        assert!(!lin(&[write(1, 0, 1, 5), read(None, 2, 3, 0)]));
        assert!(!lin(&[write(1, 0, 1, 5), read(Some(1), 2, 3, 6)]));
    }

    #[test]
    fn a_stale_read_after_a_newer_write_completed_is_caught() {
        // The planted-bug shape: a read from a member cut off in a minority.
        assert!(!lin(&[
            write(1, 0, 1, 5),
            write(2, 2, 3, 6),
            read(Some(1), 4, 5, 5),
        ]));
    }

    #[test]
    fn concurrent_operations_may_take_either_order() {
        // The read overlaps the write: old and new values both fit.
        assert!(lin(&[
            write(1, 0, 1, 5),
            write(2, 2, 6, 6),
            read(Some(1), 3, 4, 5)
        ]));
        assert!(lin(&[
            write(1, 0, 1, 5),
            write(2, 2, 6, 6),
            read(Some(2), 3, 4, 6)
        ]));
        // Two reads inside one write cannot see new then old.
        assert!(!lin(&[
            write(1, 0, 1, 5),
            write(2, 2, 10, 6),
            read(Some(2), 3, 4, 6),
            read(Some(1), 5, 6, 5),
        ]));
    }

    #[test]
    fn revisions_must_rise_with_the_order_of_writes() {
        assert!(!lin(&[write(1, 0, 1, 6), write(2, 2, 3, 5)]));
        // Concurrent writes: the order is the revisions' order.
        assert!(lin(&[
            write(1, 0, 5, 6),
            write(2, 1, 4, 5),
            read(Some(1), 6, 7, 6)
        ]));
        assert!(!lin(&[
            write(1, 0, 5, 6),
            write(2, 1, 4, 5),
            read(Some(2), 6, 7, 5)
        ]));
    }

    #[test]
    fn cas_swaps_only_the_expected_value() {
        let cas = |e, n, i, c, out| rec(RegOp::Cas { expect: e, new: n }, i, c, out);
        assert!(lin(&[
            write(1, 0, 1, 5),
            cas(1, 2, 2, 3, Outcome::Ok(RegOut::Swapped { rev: 6 })),
            cas(
                1,
                3,
                4,
                5,
                Outcome::Ok(RegOut::Missed {
                    value: Some(2),
                    mod_rev: 6
                })
            ),
            read(Some(2), 6, 7, 6),
        ]));
        // Two CAS from the same value cannot both win.
        assert!(!lin(&[
            write(1, 0, 1, 5),
            cas(1, 2, 2, 5, Outcome::Ok(RegOut::Swapped { rev: 6 })),
            cas(1, 3, 2, 5, Outcome::Ok(RegOut::Swapped { rev: 7 })),
        ]));
        // A miss that claims the expected value was there is wrong.
        assert!(!lin(&[
            write(1, 0, 1, 5),
            cas(
                1,
                3,
                2,
                3,
                Outcome::Ok(RegOut::Missed {
                    value: Some(1),
                    mod_rev: 5
                })
            ),
        ]));
    }

    #[test]
    fn cas_on_the_mod_revision() {
        let cas = |e, n, i, c, out| {
            rec(
                RegOp::CasRev {
                    expect_rev: e,
                    new: n,
                },
                i,
                c,
                out,
            )
        };
        assert!(lin(&[
            write(1, 0, 1, 5),
            cas(5, 2, 2, 3, Outcome::Ok(RegOut::Swapped { rev: 6 })),
            cas(
                5,
                3,
                4,
                5,
                Outcome::Ok(RegOut::Missed {
                    value: Some(2),
                    mod_rev: 6
                })
            ),
        ]));
        // A swap from a revision the key no longer had.
        assert!(!lin(&[
            write(1, 0, 1, 5),
            write(2, 2, 3, 6),
            cas(5, 3, 4, 5, Outcome::Ok(RegOut::Swapped { rev: 7 })),
        ]));
        // An unknown write leaves only a bound: an unknown CAS on it may or
        // may not have applied, and both continuations are searched.
        let unknown = |v, i| rec(RegOp::Write(v), i, 0, Outcome::Unknown);
        for later in [Some(3), Some(2)] {
            let h = [
                write(1, 0, 1, 5),
                unknown(2, 2),
                cas(7, 3, 3, 0, Outcome::Unknown),
                read(later, 10, 11, 8),
            ];
            assert!(lin(&h), "read {later:?}");
        }
    }

    #[test]
    fn unknown_writes_may_apply_late_or_never() {
        let unknown = |v, i| rec(RegOp::Write(v), i, 0, Outcome::Unknown);
        // Never applied.
        assert!(lin(&[
            write(1, 0, 1, 5),
            unknown(2, 2),
            read(Some(1), 3, 4, 5)
        ]));
        // Applied long after its call.
        assert!(lin(&[
            write(1, 0, 1, 5),
            unknown(2, 2),
            read(Some(1), 3, 4, 5),
            read(Some(2), 5, 6, 9),
        ]));
        // But not before its call, and not undone once seen.
        assert!(!lin(&[
            read(Some(2), 0, 1, 9),
            write(1, 2, 3, 10),
            unknown(2, 4)
        ]));
        assert!(!lin(&[
            write(1, 0, 1, 5),
            unknown(2, 2),
            read(Some(2), 3, 4, 9),
            read(Some(1), 5, 6, 5),
        ]));
        // A value nobody wrote is never read.
        assert!(!lin(&[write(1, 0, 1, 5), read(Some(3), 2, 3, 6)]));
    }

    #[test]
    fn failed_operations_are_ignored() {
        assert!(lin(&[
            write(1, 0, 1, 5),
            rec(RegOp::Read, 2, 3, Outcome::Fail),
            read(Some(1), 4, 5, 5),
        ]));
    }

    #[test]
    fn many_concurrent_clients_stay_within_budget() {
        // 8 clients, 400 overlapping ops, some unknown: linearizable by
        // construction (each op's effect at its midpoint).
        let mut h = Vec::new();
        let (mut value, mut rev) = (None, 0i64);
        let mut events = Vec::new();
        for i in 0..400u64 {
            let start = i * 10;
            events.push((start + 15, i, start, start + 30));
        }
        events.sort();
        for (_, i, s, c) in events {
            if i % 3 == 0 {
                h.push(read(value, s, c, rev));
            } else {
                rev += 1;
                value = Some(i);
                if i % 17 == 0 {
                    h.push(rec(RegOp::Write(i), s, 0, Outcome::Unknown));
                } else {
                    h.push(write(i, s, c, rev));
                }
            }
        }
        assert_eq!(check_key(&h, SEARCH_BUDGET_STEPS), Verdict::Linearizable);
    }
}
