//! The liveness goal once the faults stop: a probe write applied on every
//! member, then a probe read served, within `LIVENESS_BOUND_TICKS`.

use std::collections::HashMap;

use bytes::Bytes;

use super::Sim;
use crate::sim::checker::Check;
use crate::sim::ELECTION_TIMEOUT_TICKS;

/// Progress towards the liveness goal once the faults stopped.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    pub(super) calm_since_tick: u64,
    probes: Vec<Bytes>,
    /// Index each probe write was applied at.
    pub(super) probe_index: HashMap<Bytes, u64>,
    last_probe_tick: Option<u64>,
    pub(super) write_done: bool,
    last_read_tick: Option<u64>,
    pub(super) read_done: bool,
}

pub(super) const PROBE_WRITE_PREFIX: &[u8] = b"probe-w";
pub(super) const PROBE_READ_PREFIX: &[u8] = b"probe-r";

impl Sim {
    pub(super) fn liveness_round(&mut self) -> Check {
        let Some(lead) = self.leader() else {
            return Ok(());
        };
        if !self.live.write_done {
            let sm = &self.members[lead].sm;
            let members: Vec<u64> = sm
                .voters
                .iter()
                .chain(sm.learners.iter())
                .copied()
                .collect();
            let done = self.live.probes.iter().any(|p| {
                self.live.probe_index.get(p).is_some_and(|&at| {
                    members.iter().all(|id| {
                        let m = &self.members[*id as usize - 1];
                        m.sm.applied_index >= at
                    })
                })
            });
            if done {
                self.live.write_done = true;
                self.note(|| "liveness: probe write applied on every member".into());
            } else if self
                .live
                .last_probe_tick
                .is_none_or(|t| self.tick - t >= ELECTION_TIMEOUT_TICKS)
            {
                self.live.last_probe_tick = Some(self.tick);
                let data = Bytes::from(format!(
                    "{}{}",
                    String::from_utf8_lossy(PROBE_WRITE_PREFIX),
                    self.live.probes.len()
                ));
                self.live.probes.push(data.clone());
                self.propose(lead, data)?;
            }
        }
        if self.live.write_done
            && !self.live.read_done
            && self
                .live
                .last_read_tick
                .is_none_or(|t| self.tick - t >= ELECTION_TIMEOUT_TICKS)
        {
            self.live.last_read_tick = Some(self.tick);
            self.next_read += 1;
            let ctx = Bytes::from(format!(
                "{}{}",
                String::from_utf8_lossy(PROBE_READ_PREFIX),
                self.next_read
            ));
            self.read(lead, ctx)?;
        }
        Ok(())
    }
}
