//! The recorded history: every client operation with its invoke and complete
//! times (nanoseconds since the run began) and its outcome.
//!
//! An outcome is `Ok` (the answer is known), `Fail` (the operation certainly
//! had no effect: a read that errored, or a refusal before anything was
//! proposed) or `Unknown` (a write that timed out or errored: it may have taken
//! effect at any time after its invocation, or never).

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A register operation on one key. Values are unique numbers per run, so a
/// value names the write that produced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegOp {
    Read,
    Write(u64),
    /// Txn: if the key's value is `expect`, put `new`; else read the key.
    Cas {
        expect: u64,
        new: u64,
    },
    /// Txn: if the key's mod revision is `expect_rev`, put `new`; else read
    /// the key.
    CasRev {
        expect_rev: i64,
        new: u64,
    },
}

impl RegOp {
    /// The value the operation writes, if it writes.
    pub fn written(self) -> Option<u64> {
        match self {
            RegOp::Read => None,
            RegOp::Write(v) | RegOp::Cas { new: v, .. } | RegOp::CasRev { new: v, .. } => Some(v),
        }
    }
}

/// What a completed register operation returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegOut {
    /// The value (None: no key) and its mod revision (0: no key).
    Read { value: Option<u64>, mod_rev: i64 },
    /// The write's revision.
    Written { rev: i64 },
    /// A CAS that wrote, at revision `rev`.
    Swapped { rev: i64 },
    /// A CAS whose compare failed; the value it read instead.
    Missed { value: Option<u64>, mod_rev: i64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(RegOut),
    Fail,
    Unknown,
}

/// One operation of one client on one key.
#[derive(Clone, Debug)]
pub struct Record {
    pub client: usize,
    pub key: String,
    pub op: RegOp,
    pub invoke_ns: u64,
    /// `u64::MAX` for an unknown outcome: it may take effect at any time.
    pub complete_ns: u64,
    pub outcome: Outcome,
}

/// The shared, append-only history of a run.
#[derive(Clone)]
pub struct History {
    start: Instant,
    records: Arc<Mutex<Vec<Record>>>,
}

impl Default for History {
    fn default() -> History {
        History::new()
    }
}

impl History {
    pub fn new() -> History {
        History {
            start: Instant::now(),
            records: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Nanoseconds since the run began.
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    pub fn push(&self, mut record: Record) {
        if record.outcome == Outcome::Unknown {
            record.complete_ns = u64::MAX;
        }
        self.records.lock().unwrap().push(record);
    }

    pub fn records(&self) -> Vec<Record> {
        self.records.lock().unwrap().clone()
    }

    /// (ok, failed, unknown) counts.
    pub fn counts(&self) -> (usize, usize, usize) {
        let records = self.records.lock().unwrap();
        let count = |f: fn(&Outcome) -> bool| records.iter().filter(|r| f(&r.outcome)).count();
        (
            count(|o| matches!(o, Outcome::Ok(_))),
            count(|o| matches!(o, Outcome::Fail)),
            count(|o| matches!(o, Outcome::Unknown)),
        )
    }
}
