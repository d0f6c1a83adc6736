//! What a seed's members sent, in the order they sent them, with when: a
//! digest that two runs of a seed must share, and for a traced seed the
//! lines (messages, draws from the seed, calls, syncs, starts and crashes)
//! that show where two runs part.

use tokio::time::Instant;

use crate::raft;
use crate::sim::digest::fnv1a;

/// The messages a seed's members sent, in the order they sent them.
pub struct WireTrace {
    began: Instant,
    digest: u64,
    sent: u64,
    /// One line per message, kept only for a traced seed.
    lines: Option<Vec<String>>,
}

impl WireTrace {
    /// A trace from now; with lines when `traced`.
    pub(super) fn new(traced: bool) -> WireTrace {
        WireTrace {
            began: Instant::now(),
            digest: 0,
            sent: 0,
            lines: traced.then(Vec::new),
        }
    }

    pub(super) fn record(&mut self, from: u64, shard: u32, msg: &raft::Message) {
        let at = self.began.elapsed().as_micros() as u64;
        let fields = [
            at,
            from,
            u64::from(shard),
            msg.to,
            msg.msg_type as u64,
            msg.term,
            msg.index,
            msg.log_term,
            msg.commit,
            msg.entries.len() as u64,
            u64::from(msg.reject),
        ];
        let mut h = self.digest;
        for f in fields {
            h = fnv1a(h, &f.to_le_bytes());
        }
        self.digest = h;
        self.sent += 1;
        if let Some(lines) = &mut self.lines {
            lines.push(format!(
                "{at:>10}us {from}->{} shard={shard} {:?} term={} index={} log_term={} commit={} entries={} reject={}",
                msg.to,
                msg.msg_type(),
                msg.term,
                msg.index,
                msg.log_term,
                msg.commit,
                msg.entries.len(),
                msg.reject
            ));
        }
    }

    /// A draw from the seed's generator, in a traced seed: where the two
    /// runs of a seed first draw apart shows what took another course.
    pub(super) fn draw(&mut self, at: &std::panic::Location<'_>) {
        self.note(|| format!("draw at {}:{}", at.file(), at.line()));
    }

    pub(super) fn note(&mut self, what: impl FnOnce() -> String) {
        if let Some(lines) = &mut self.lines {
            let when = self.began.elapsed().as_micros() as u64;
            lines.push(format!("{when:>10}us {}", what()));
        }
    }

    /// The digest of every message sent so far.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    pub fn sent(&self) -> u64 {
        self.sent
    }

    pub fn take_lines(&mut self) -> Vec<String> {
        self.lines.take().unwrap_or_default()
    }
}
