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

/// How a logged operation ended, as counted in a run's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Ok,
    Failed,
    Unknown,
}

/// A record a [`Log`] holds.
pub trait Logged: Clone {
    fn ended(&self) -> Ended;
    /// Marks an unknown outcome as never completing: it may take effect at
    /// any time.
    fn never_completes(&mut self);
    /// Whether the record is a client's operation (counted in the table).
    fn counted(&self) -> bool {
        true
    }
}

impl Logged for Record {
    fn ended(&self) -> Ended {
        match self.outcome {
            Outcome::Ok(_) => Ended::Ok,
            Outcome::Fail => Ended::Failed,
            Outcome::Unknown => Ended::Unknown,
        }
    }

    fn never_completes(&mut self) {
        self.complete_ns = u64::MAX;
    }
}

/// Records of a run, in the order they completed.
pub struct Log<R> {
    records: Mutex<Vec<R>>,
}

impl<R> Default for Log<R> {
    fn default() -> Self {
        Log {
            records: Mutex::new(Vec::new()),
        }
    }
}

impl<R: Logged> Log<R> {
    pub fn push(&self, mut record: R) {
        if record.ended() == Ended::Unknown {
            record.never_completes();
        }
        self.records.lock().unwrap().push(record);
    }

    pub fn records(&self) -> Vec<R> {
        self.records.lock().unwrap().clone()
    }

    /// (ok, failed, unknown) counts of the counted records.
    pub fn counts(&self) -> (usize, usize, usize) {
        let records = self.records.lock().unwrap();
        let count = |e: Ended| {
            records
                .iter()
                .filter(|r| r.counted() && r.ended() == e)
                .count()
        };
        (
            count(Ended::Ok),
            count(Ended::Failed),
            count(Ended::Unknown),
        )
    }
}

/// The shared, append-only history of a run.
#[derive(Clone)]
pub struct History {
    start: Instant,
    log: Arc<Log<Record>>,
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
            log: Arc::default(),
        }
    }

    /// Nanoseconds since the run began.
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    pub fn push(&self, record: Record) {
        self.log.push(record);
    }

    pub fn records(&self) -> Vec<Record> {
        self.log.records()
    }

    /// (ok, failed, unknown) counts.
    pub fn counts(&self) -> (usize, usize, usize) {
        self.log.counts()
    }
}
