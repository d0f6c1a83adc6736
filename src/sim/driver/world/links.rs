//! The simulated network between the members: links cut whole or per
//! shard, messages carried with seeded delays, losses and duplicates (and
//! checked on the wire as they leave), snapshot streams spooled by their
//! receiver, and the [`PeerSender`] a member's drivers send through.

use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::raft;
use crate::routing::ShardId;
use crate::server::shard::{
    PeerSender, ShardInbound, SnapshotTransfer, SpoolWriterThread, StreamSpool,
};

use super::{index, World, MAX_DELAY, STREAM_CHUNK_BYTES};
use crate::sim::driver::checks::DriverViolation;

impl World {
    /// Restores the links between `a` and `b`, both ways.
    pub fn connect(&self, a: u64, b: u64) {
        let mut cut = self.cut.borrow_mut();
        cut.remove(&(a, b));
        cut.remove(&(b, a));
        self.shard_cut
            .borrow_mut()
            .retain(|&(from, to, _)| (from, to) != (a, b) && (from, to) != (b, a));
    }

    /// Cuts the links from `from` to `to`.
    pub fn cut(&self, from: u64, to: u64) {
        self.cut.borrow_mut().insert((from, to));
    }

    /// Cuts the link of `shard` from `from` to `to`.
    pub fn cut_shard(&self, from: u64, to: u64, shard: ShardId) {
        self.shard_cut.borrow_mut().insert((from, to, shard));
    }

    /// Whether what `shard` sends from `from` to `to` is lost.
    fn is_cut(&self, from: u64, to: u64, shard: ShardId) -> bool {
        self.cut.borrow().contains(&(from, to))
            || self.shard_cut.borrow().contains(&(from, to, shard))
    }

    /// Restores the link of `shard` from `from` to `to` (not one cut whole).
    pub fn uncut_shard(&self, from: u64, to: u64, shard: ShardId) {
        self.shard_cut.borrow_mut().remove(&(from, to, shard));
    }

    /// Restores every link and every member's timers.
    pub fn heal(&self) {
        self.cut.borrow_mut().clear();
        self.shard_cut.borrow_mut().clear();
        self.drop_per_mille.set(0);
        for m in self.members.borrow().iter() {
            for t in &m.timers {
                t.stall(false);
            }
        }
    }

    /// Carries `msg` of `shard` from `from` to its member, or loses it.
    fn send(self: &Rc<Self>, from: u64, shard: ShardId, mut msg: raft::Message) -> bool {
        let to = msg.to;
        self.wire.borrow_mut().record(from, shard, &msg);
        let on_shard = |v: DriverViolation| {
            if self.cfg.shards > 1 {
                DriverViolation {
                    detail: format!("shard {shard}: {}", v.detail),
                    ..v
                }
            } else {
                v
            }
        };
        if let Err(v) = self.leaders[shard as usize].check(&msg) {
            self.note_failure(on_shard(v));
        }
        if let Err(v) = self.logs[shard as usize].check(&msg) {
            self.note_failure(on_shard(v));
        }
        let carried = self
            .figure8_script
            .as_ref()
            .is_none_or(|script| script.on_send(self, from, &mut msg));
        if !carried {
            self.dropped.set(self.dropped.get() + 1);
            return true;
        }
        let plan = self.plan.borrow().clone().filter(|_| shard == 0);
        if let Some(plan) = plan {
            if let Some(doomed) = self.leaders[0].observe(self, &plan, &msg) {
                crate::sim::driver::faults::doom(self, &plan, doomed);
            }
        }
        if self.is_cut(from, to, shard) || self.chance(self.drop_per_mille.get()) {
            self.dropped.set(self.dropped.get() + 1);
            return true;
        }
        // A proposal forwarded to the leader is not duplicated: the peer
        // transport (TCP) never delivers a message twice, and Raft does not
        // make proposals idempotent (etcd's do not dedupe either).
        let copies = if msg.msg_type() != raft::MessageType::MsgProp && self.chance(5) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = Duration::from_micros(self.gen_range(0..=MAX_DELAY.as_micros() as u64));
            let world = Rc::downgrade(self);
            let msg = msg.clone();
            let what = move || format!("a message from member {from} on shard {shard} on its way");
            self.spawn_checked(what, async move {
                tokio::time::sleep(delay).await;
                if let Some(world) = world.upgrade() {
                    world.deliver(from, shard, msg);
                }
            });
        }
        true
    }

    /// The running incarnation of member `id`, and its directory.
    fn incarnation(&self, id: u64) -> Option<(u64, PathBuf)> {
        let members = self.members.borrow();
        let m = members.get(index(id))?;
        m.running.as_ref()?;
        Some((m.incarnation, m.dir.clone()))
    }

    /// Carries a snapshot stream from `from` to `to` as the peer transport
    /// does: the receiver spools it to a file in its shard's directory as it
    /// arrives and gets it once whole. A cut link or a receiver that crashes
    /// on the way ends the stream (a lost connection), and so does a
    /// receiver's spool that fails.
    async fn stream(
        self: Rc<Self>,
        from: u64,
        to: u64,
        shard: ShardId,
        source: &mut dyn cairn_net::StreamSource,
    ) -> Result<(), cairn_net::StreamError> {
        let closed = || cairn_net::StreamError::Closed {
            shard_id: shard,
            peer_member: to,
        };
        let source_failed = |source| cairn_net::StreamError::Source {
            shard_id: shard,
            peer_member: to,
            source,
        };
        let (incarnation, dir) = self.incarnation(to).ok_or_else(closed)?;
        let dir = dir.join(format!("shard-{shard}"));
        source.rewind().map_err(source_failed)?;
        self.snapshots_started.set(self.snapshots_started.get() + 1);
        let stream_id = self.next_stream.get();
        self.next_stream.set(stream_id + 1);
        let mut spool = StreamSpool::start(
            &dir,
            shard,
            from,
            stream_id,
            1,
            u64::MAX,
            SpoolWriterThread::Caller,
        )
        .map_err(|_| closed())?;
        let same_receiver = |world: &World| {
            !world.is_cut(from, to, shard)
                && world.incarnation(to).is_some_and(|(i, _)| i == incarnation)
        };
        loop {
            let delay = Duration::from_micros(self.gen_range(0..=MAX_DELAY.as_micros() as u64));
            tokio::time::sleep(delay).await;
            if !same_receiver(&self) {
                return Err(closed());
            }
            let Some(chunk) = source
                .next_chunk(STREAM_CHUNK_BYTES)
                .map_err(source_failed)?
            else {
                break;
            };
            spool.append(chunk).await.map_err(|_| closed())?;
        }
        let spooled = spool.finish().await.map_err(|_| closed())?;
        let inbound = same_receiver(&self)
            .then(|| self.inbound(to, shard))
            .flatten();
        let Some(inbound) = inbound else {
            return Err(closed());
        };
        if inbound.try_send(ShardInbound::Snapshot(spooled)).is_err() {
            return Err(closed());
        }
        self.snapshots_delivered
            .set(self.snapshots_delivered.get() + 1);
        Ok(())
    }

    /// The inbound queue of member `id`'s `shard`, while it runs.
    fn inbound(&self, id: u64, shard: ShardId) -> Option<mpsc::Sender<ShardInbound>> {
        let members = self.members.borrow();
        members
            .get(index(id))?
            .running
            .as_ref()
            .map(|r| r.inbound[shard as usize].clone())
    }

    fn deliver(&self, from: u64, shard: ShardId, msg: raft::Message) {
        let to = msg.to;
        let inbound = self.inbound(to, shard);
        let lost = self.is_cut(from, to, shard)
            || inbound.is_none_or(|tx| tx.try_send(ShardInbound::Raft(msg)).is_err());
        if lost {
            self.dropped.set(self.dropped.get() + 1);
        } else {
            self.delivered.set(self.delivered.get() + 1);
        }
    }
}

/// The network as a member's driver sees it.
pub(super) struct SimPeers {
    pub(super) from: u64,
    pub(super) world: std::rc::Weak<World>,
}

impl PeerSender for SimPeers {
    fn send(&self, shard: ShardId, msg: raft::Message) -> bool {
        self.world
            .upgrade()
            .is_some_and(|w| w.send(self.from, shard, msg))
    }

    fn has_link(&self, _shard: ShardId, _to: u64) -> bool {
        // Every member is reachable while the world lasts; cuts and crashes
        // end a stream on its way (see `World::stream`).
        self.world.strong_count() > 0
    }

    fn send_snapshot<'a>(
        &self,
        shard: ShardId,
        to: u64,
        source: &'a mut dyn cairn_net::StreamSource,
    ) -> Option<SnapshotTransfer<'a>> {
        let world = self.world.upgrade()?;
        Some(Box::pin(world.stream(self.from, to, shard, source)))
    }

    fn connect(&self, _shard: ShardId, _to: u64, _peer_urls: &[String]) {}

    fn disconnect(&self, _shard: ShardId, _to: u64) {}

    fn connected_since(&self, _shard: ShardId, _to: u64) -> Option<std::time::Instant> {
        // Connections are not modelled: the simulated members run without
        // the strict reconfiguration check that reads this.
        None
    }
}
