//! When a spare's zero-fill may write: while the log is idle, or when the
//! spare must keep pace to be whole before the log needs it. Otherwise it
//! stays off the disk the appends are waiting on.
//!
//! Back of the envelope: every byte a busy log writes costs a byte of zeros
//! in the spare that follows its segment, so zero-filling can be placed but
//! not avoided. One writer of 4 KiB appends at ~110 µs each writes ~36 MiB/s.
//! Written flat out right after a roll (a 64 MiB spare in chunk writes), the
//! zeros sit in front of every durable append for as long as they run, and
//! on a disk with a volatile write cache each append's cache flush also
//! carries the zeros written since the previous one. Paced, the spare's
//! zeroed prefix stays [`Config::zero_fill_lead_bytes`] ahead of the log,
//! measured against the space the log has left before it needs this spare:
//! after a burst of the lead at each roll, one zero chunk goes out per chunk
//! of log (one 256 KiB write per 64 appends of 4 KiB), and the roll still
//! finds the spare zeroed and synced unless the disk cannot take the log's
//! bytes twice over. What remains is the bandwidth: `wal/BENCHMARKS.md` has
//! its cost to one writer.

use std::time::Duration;
use tokio::time::Instant;

use super::State;
use crate::config::Config;

/// How long the log must have had no flush before a spare's zero-fill writes
/// ahead of its pace: long enough that appends arriving in a steady stream
/// (a new one within microseconds of the last one's acknowledgement, or a
/// Raft round trip later) never find a zero chunk queued in front of them.
pub(crate) const ZERO_FILL_IDLE: Duration = Duration::from_millis(2);

impl State {
    /// Log bytes that can still be appended before the spare being
    /// zero-filled is needed: the space left in the segment being written,
    /// plus a whole segment per ready spare not already claimed by a segment
    /// started in memory whose first batch has not taken one yet. Zero: a
    /// segment start needs this spare now.
    pub(super) fn zero_fill_room_bytes(&self, segment_size_bytes: u64) -> u64 {
        let Some(later) = (self.spares.len() as u64).checked_sub(self.segments_awaiting_spare)
        else {
            return 0;
        };
        let active = if self.cursor.started {
            segment_size_bytes.saturating_sub(self.cursor.offset)
        } else {
            0
        };
        active + later * segment_size_bytes
    }

    /// Whether the spare being zero-filled must write now to stay ahead of
    /// the log (false when no zero-fill is under way).
    pub(super) fn zero_fill_due(&self, cfg: &Config) -> bool {
        self.zero_fill_left_bytes.is_some_and(|left| {
            left + cfg.zero_fill_lead_bytes() >= self.zero_fill_room_bytes(cfg.segment_size_bytes)
        })
    }

    /// When the log counts as idle for zero-filling: `None` while a flush is
    /// in flight or queued (the next flush completion re-evaluates).
    pub(super) fn log_idle_at(&self) -> Option<Instant> {
        (!self.flush_in_flight && self.batches.is_empty())
            .then(|| self.last_flush_end + ZERO_FILL_IDLE)
    }
}
