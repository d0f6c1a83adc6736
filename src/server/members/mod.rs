//! Cluster membership: member and cluster ids, the table of members with their
//! peer and client URLs, and its persistence in `member.toml`.
//!
//! Ids of a new cluster are derived as etcd derives them, from what an operator
//! gives at bootstrap: a member's id from its sorted peer URLs and the cluster
//! token, the cluster id from the sorted member ids and the token. So every
//! member computes the same ids without talking, and two clusters bootstrapped
//! with different tokens never accept each other's traffic. A member added later
//! gets an id the cluster chooses (`MemberAdd`), which the new member learns from
//! the cluster when it joins.
//!
//! # How the table changes
//! Every membership change is a Raft conf change in every shard; its context
//! carries the member's record ([`MemberInfo`]). The table follows shard 0's
//! applies alone (updates are idempotent, so a replayed change changes
//! nothing), so every member changes it in the same order. The table is
//! written to `member.toml` by a thread of its own ([`LatestFile`]), and no shard
//! commits its store while a change is not in the file yet, so a crash before
//! the write replays the change in shard 0 and, in every other shard, the
//! changes applied meanwhile (a restart dials the peers the file names; each
//! shard links to the members its own applies add). A member that catches up
//! by snapshot gets the leader's whole table with it, written before the
//! install goes on.

use crate::server::latest_file::LatestFile;
pub use crate::server::latest_file::WriterThread;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use cairn_proto::cairnpb::{MemberInfo, MemberTable};

use crate::config::{Config, InitialMember};
pub use crate::member_file::{Member, MemberFile, LAYOUT_VERSION, MEMBER_FILE};
use crate::routing::{fnv1a64_update, FNV1A64_OFFSET};

/// FNV-1a 64 over `parts` (routing's hash): stable across builds; ids are
/// persisted and exchanged on the wire.
fn fnv1a64(parts: &[&[u8]]) -> u64 {
    parts.iter().fold(FNV1A64_OFFSET, |h, part| {
        // A separator after each part, so ("ab","c") and ("a","bc") differ.
        fnv1a64_update(fnv1a64_update(h, part), &[0xff])
    })
}

/// Raft reserves 0 for "nobody"; an id is never 0.
fn nonzero(h: u64) -> u64 {
    if h == 0 {
        1
    } else {
        h
    }
}

pub fn member_id(peer_urls: &[String], token: &str) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let joined = urls.join(",");
    nonzero(fnv1a64(&[joined.as_bytes(), token.as_bytes()]))
}

/// The id of a member added to a running cluster: like etcd's, from its peer
/// URLs, the cluster and the time, so re-adding the same URLs later gives a new id.
pub fn added_member_id(peer_urls: &[String], cluster_id: u64, now_ms: u64) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let joined = urls.join(",");
    nonzero(fnv1a64(&[
        joined.as_bytes(),
        &cluster_id.to_le_bytes(),
        &now_ms.to_le_bytes(),
    ]))
}

/// A new cluster's id, from its members, token and shard count: members
/// started with a different `--shards` (by default one per core, so machines
/// with different CPU counts) get different ids, and their peer handshakes
/// refuse each other instead of routing keys to different shards.
pub fn cluster_id(member_ids: &[u64], token: &str, shards: usize) -> u64 {
    let mut ids = member_ids.to_vec();
    ids.sort_unstable();
    let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
    if shards <= 1 {
        // As builds before the count was mixed in: a one-shard cluster may
        // be bootstrapped by members of both.
        return nonzero(fnv1a64(&[&bytes, token.as_bytes()]));
    }
    let shards = u64::try_from(shards).unwrap_or(u64::MAX);
    nonzero(fnv1a64(&[&bytes, token.as_bytes(), &shards.to_le_bytes()]))
}

/// Two URL lists name the same endpoints (order does not matter).
pub fn same_urls(a: &[String], b: &[String]) -> bool {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort();
    b.sort();
    a == b
}

/// The members of the cluster as this member knows them.
#[derive(Debug, Clone)]
pub struct Membership {
    pub cluster_id: u64,
    pub local_id: u64,
    pub members: Vec<Member>,
}

impl Membership {
    /// The membership a new cluster starts with, from `--initial-cluster`. Names
    /// come from the flag; client URLs are learnt when each member publishes
    /// them (see `cluster::publish_attributes`).
    pub fn bootstrap(config: &Config) -> Membership {
        let members: Vec<Member> = config
            .initial_cluster
            .iter()
            .map(|m: &InitialMember| Member {
                id: member_id(&m.peer_urls, &config.initial_cluster_token),
                name: m.name.clone(),
                peer_urls: m.peer_urls.clone(),
                // Every member publishes its own once the cluster runs.
                client_urls: Vec::new(),
                is_learner: false,
            })
            .collect();
        let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
        let local_id = member_id(
            &config.initial_advertise_peer_urls,
            &config.initial_cluster_token,
        );
        Membership {
            cluster_id: cluster_id(&ids, &config.initial_cluster_token, config.shards),
            local_id,
            members,
        }
    }

    pub fn voter_ids(&self) -> Vec<u64> {
        self.members
            .iter()
            .filter(|m| !m.is_learner)
            .map(|m| m.id)
            .collect()
    }

    pub fn get(&self, id: u64) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    /// Adds or replaces `m`; true when that changed the table.
    fn upsert(&mut self, m: Member) -> bool {
        match self.members.iter_mut().find(|x| x.id == m.id) {
            Some(x) if *x == m => false,
            Some(x) => {
                *x = m;
                true
            }
            None => {
                self.members.push(m);
                true
            }
        }
    }

    fn remove(&mut self, id: u64) -> bool {
        let before = self.members.len();
        self.members.retain(|m| m.id != id);
        self.members.len() != before
    }
}

/// The member table shared by a member's cores, the client API and the peer
/// port, kept in step with `member.toml`.
#[derive(Debug)]
pub struct MemberRegistry {
    /// Writes `member.toml` off the caller's thread.
    writer: LatestFile<MemberFile>,
    /// The number of the newest change made to the file's contents.
    changes_made: AtomicU64,
    /// Fixed for the member's life, so read without a lock on request paths.
    cluster_id: u64,
    local_id: u64,
    /// Whether this member is a learner, kept in step with `state`: read by
    /// every Watch and LeaseKeepAlive stream as it starts.
    local_learner: AtomicBool,
    state: RwLock<Membership>,
    /// The file as last written; serialises writers.
    file: Mutex<MemberFile>,
    /// Members whose peer connections are accepted.
    accepted: cairn_net::MemberSet,
    removed: AtomicBool,
    removed_notify: tokio::sync::Notify,
    /// Membership changes asked of this member run one at a time, so two
    /// requests cannot both pass the checks that only hold for one of them.
    changes: tokio::sync::Mutex<()>,
}

impl MemberRegistry {
    /// The table `file` holds, kept in `dir`'s `member.toml` by the thread
    /// `writes_on` names.
    pub fn new(dir: &Path, file: MemberFile, writes_on: WriterThread) -> MemberRegistry {
        let members = file.members.clone();
        let accepted = cairn_net::MemberSet::new(members.iter().map(|m| m.id));
        let learner = members
            .iter()
            .any(|m| m.id == file.member_id && m.is_learner);
        MemberRegistry {
            writer: {
                let dir = dir.to_path_buf();
                LatestFile::new(MEMBER_FILE, 0, writes_on, move |f: &MemberFile| {
                    crate::server::crash_point::reached("member-file-write");
                    f.write(&dir)
                })
            },
            changes_made: AtomicU64::new(0),
            cluster_id: file.cluster_id,
            local_id: file.member_id,
            local_learner: AtomicBool::new(learner),
            state: RwLock::new(Membership {
                cluster_id: file.cluster_id,
                local_id: file.member_id,
                members,
            }),
            removed: AtomicBool::new(file.removed),
            file: Mutex::new(file),
            accepted,
            removed_notify: tokio::sync::Notify::new(),
            changes: tokio::sync::Mutex::new(()),
        }
    }

    /// Held while a membership change asked of this member is checked and
    /// carried out.
    pub async fn change_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.changes.lock().await
    }

    pub fn membership(&self) -> Membership {
        self.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn get(&self, id: u64) -> Option<Member> {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// Whether this member is a learner, as its table says. The table follows
    /// shard 0, so a promotion not yet applied on every shard already counts
    /// as done here (as `member list` shows it); a member missing from its own
    /// table is not a learner (etcd's check is the same).
    pub fn local_is_learner(&self) -> bool {
        self.local_learner.load(Ordering::Acquire)
    }

    pub fn local_id(&self) -> u64 {
        self.local_id
    }

    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// The set the peer listener checks greetings against.
    pub fn accepted(&self) -> cairn_net::MemberSet {
        self.accepted.clone()
    }

    pub fn shard_count(&self) -> u32 {
        self.file.lock().unwrap_or_else(|e| e.into_inner()).shards
    }

    /// Accepts peer connections from `id` (a member being added: its
    /// connections may arrive before shard 0 records it).
    pub fn accept(&self, id: u64) {
        self.accepted.insert(id);
    }

    /// Records a member's (new) record; `member.toml` is written after, off
    /// this thread, if that changed the table (see [`Self::unwritten`]).
    pub fn upsert(&self, info: &MemberInfo) {
        let m = Member::from_info(info);
        self.accepted.insert(m.id);
        if let Some((seq, file)) = self.change(|state| state.upsert(m)) {
            self.writer.queue(seq, file);
        }
    }

    /// Drops a member from the table; written as [`Self::upsert`] is.
    pub fn remove(&self, id: u64) {
        self.accepted.remove(id);
        if let Some((seq, file)) = self.change(|state| state.remove(id)) {
            self.writer.queue(seq, file);
        }
    }

    /// Whether a change to the table is not yet in `member.toml`, so that
    /// shard 0's store must not commit past it yet (a crash would lose it:
    /// the log would not replay it), or why the file could not be written.
    pub fn unwritten(&self) -> Result<bool, String> {
        self.writer.unwritten()
    }

    /// Replaces the table with the one a snapshot of shard 0 carried: the
    /// table as of the snapshot's index.
    pub fn replace_table(&self, table: &MemberTable) -> std::io::Result<()> {
        let members: Vec<Member> = table.members.iter().map(Member::from_info).collect();
        for m in &members {
            self.accepted.insert(m.id);
        }
        let old = self.membership().members;
        for m in old.iter().filter(|o| !members.iter().any(|n| n.id == o.id)) {
            self.accepted.remove(m.id);
        }
        match self.change(|state| {
            let changed = state.members != members;
            state.members = members;
            changed
        }) {
            // Written with the file's lock released: cores read the file's
            // fixed fields under it and must not wait for this sync.
            Some((seq, file)) => self.writer.write_now(seq, &file),
            None => Ok(()),
        }
    }

    /// Applies `f` to the table; if it says the table changed, answers the
    /// change's number and the file as of it, for the caller to write.
    fn change(&self, f: impl FnOnce(&mut Membership) -> bool) -> Option<(u64, MemberFile)> {
        self.change_file(|file| {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            if !f(&mut state) {
                return false;
            }
            let learner = state.get(state.local_id).is_some_and(|m| m.is_learner);
            self.local_learner.store(learner, Ordering::Release);
            file.members = state.members.clone();
            true
        })
    }

    /// Applies `f` to the file's contents; if it says they changed, numbers
    /// the change and answers the file as of it. The file's lock is held
    /// throughout, so the numbers follow the order of the changes, and the
    /// writer never lays an older file over a newer one.
    fn change_file(&self, f: impl FnOnce(&mut MemberFile) -> bool) -> Option<(u64, MemberFile)> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if !f(&mut file) {
            return None;
        }
        let seq = self.changes_made.fetch_add(1, Ordering::AcqRel) + 1;
        Some((seq, file.clone()))
    }

    pub fn table(&self) -> MemberTable {
        let m = self.membership();
        MemberTable {
            cluster_id: m.cluster_id,
            members: m.members.iter().map(Member::to_info).collect(),
            shards: self.shard_count(),
            bootstrap_voters: self.bootstrap_voters(),
            auth: None,
        }
    }

    /// The voters the shards' logs started with (see [`MemberFile`]).
    pub fn bootstrap_voters(&self) -> Vec<u64> {
        let file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if file.bootstrap_voters.is_empty() {
            // Written before the field existed: no membership change could
            // have been made then, so the table's voters are the bootstrap ones.
            return file
                .members
                .iter()
                .filter(|m| !m.is_learner)
                .map(|m| m.id)
                .collect();
        }
        file.bootstrap_voters.clone()
    }

    /// Marks this member removed from the cluster (persisted by the writer
    /// thread: it refuses to start again) and wakes whoever waits in
    /// [`Self::wait_removed`]. Should the write fail, the member's shards
    /// fail as for any unwritten change (it is stopping anyway), and it
    /// starts again if restarted and learns of its removal from the others.
    pub fn mark_removed(&self) {
        if self.removed.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some((seq, file)) = self.change_file(|file| {
            file.removed = true;
            true
        }) {
            self.writer.queue(seq, file);
        }
        self.removed_notify.notify_waiters();
        self.removed_notify.notify_one();
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::SeqCst)
    }

    /// Resolves once this member has been removed from the cluster.
    pub async fn wait_removed(&self) {
        loop {
            let notified = self.removed_notify.notified();
            if self.is_removed() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Flags};
    use clap::Parser;

    fn config(name: &str, port: u16) -> Config {
        Config::from_flags(
            Flags::try_parse_from([
                "cairn",
                "--name",
                name,
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{port}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{port}"),
                "--initial-cluster",
                "a=http://127.0.0.1:12380,b=http://127.0.0.1:22380,c=http://127.0.0.1:32380",
            ])
            .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn every_member_computes_the_same_ids() {
        let a = Membership::bootstrap(&config("a", 12380));
        let b = Membership::bootstrap(&config("b", 22380));
        assert_eq!(a.cluster_id, b.cluster_id);
        assert_eq!(a.voter_ids(), b.voter_ids());
        assert_ne!(a.local_id, b.local_id);
        assert!(a.voter_ids().contains(&a.local_id));
        assert!(b.voter_ids().contains(&b.local_id));
    }

    #[test]
    fn the_token_changes_every_id() {
        let urls = vec!["http://127.0.0.1:2380".to_string()];
        assert_ne!(member_id(&urls, "one"), member_id(&urls, "two"));
        assert_ne!(cluster_id(&[1, 2], "one", 1), cluster_id(&[1, 2], "two", 1));
        assert_eq!(cluster_id(&[2, 1], "t", 1), cluster_id(&[1, 2], "t", 1));
    }

    #[test]
    fn the_shard_count_changes_the_cluster_id() {
        assert_ne!(cluster_id(&[1, 2], "t", 1), cluster_id(&[1, 2], "t", 2));
        assert_ne!(cluster_id(&[1, 2], "t", 2), cluster_id(&[1, 2], "t", 4));
    }
}
