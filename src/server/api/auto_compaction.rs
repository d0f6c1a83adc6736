//! etcd's automatic compaction (`--auto-compaction-mode`,
//! `--auto-compaction-retention`), run by the member that leads shard 0 and
//! paused on the others, as etcd's compactor runs on its leader only.
//!
//! - **periodic** (retention a time, `1h`, `30m`): the current revision is
//!   noted every tenth of the retention (of an hour, when the retention is
//!   longer), and the history older than the retention is compacted: first
//!   once a whole retention has passed since the start, then every
//!   retention (every hour when it is longer), each time at the revision
//!   noted a retention ago. A failed compaction is tried again a tenth
//!   later.
//! - **revision** (retention a count, `1000`): every five minutes, the
//!   history is compacted to the current revision less the retention,
//!   unless that is where the last compaction went.
//!
//! A compaction is the client's Compact, called in-process: one compaction
//! point for the whole keyspace, replicated, physical work in the
//! background. "Already compacted" counts as done, as in etcd.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::etcdserverpb::{CompactionRequest, CompactionResponse};
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::service::Routes;

use crate::config::compaction::AutoCompaction;
use crate::server::api::in_process::Caller;
use crate::server::api::kv::Identity;
use crate::server::keyspace::router::Router;

const COMPACT_PATH: &str = "/etcdserverpb.KV/Compact";

/// One member's automatic compaction.
pub struct AutoCompactor {
    pub policy: AutoCompaction,
    /// How often revision mode looks (etcd's five minutes).
    pub revision_interval: Duration,
    pub routes: Routes,
    pub router: Arc<Router>,
    pub identity: Identity,
}

impl AutoCompactor {
    /// Runs until `stop` changes.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let work = async {
            match self.policy {
                AutoCompaction::Off => std::future::pending().await,
                AutoCompaction::Periodic(period) => self.periodic(period).await,
                AutoCompaction::Revisions(keep) => self.revisions(keep).await,
            }
        };
        tokio::select! {
            () = work => {}
            _ = stop.changed() => {}
        }
    }

    async fn periodic(&self, period: Duration) {
        let compact_every = period.min(Duration::from_secs(3600));
        let note_every = compact_every / 10;
        // Revisions noted a tenth apart: the first is the one of a
        // retention ago.
        let kept = (period.as_nanos() / note_every.as_nanos().max(1)) as usize + 1;
        let mut noted: VecDeque<i64> = VecDeque::new();
        let mut last_done = Instant::now();
        let mut wait = period;
        loop {
            noted.push_back(self.current_revision());
            if noted.len() > kept {
                noted.pop_front();
            }
            tokio::time::sleep(note_every).await;
            if last_done.elapsed() < wait {
                continue;
            }
            let revision = noted.front().copied().unwrap_or(0);
            if self.compact(revision, "periodic").await {
                last_done = Instant::now();
                wait = compact_every;
            }
        }
    }

    async fn revisions(&self, keep: i64) {
        let mut last = 0;
        loop {
            tokio::time::sleep(self.revision_interval).await;
            let revision = self.current_revision() - keep;
            if revision <= 0 || revision == last {
                continue;
            }
            if self.compact(revision, "revision").await {
                last = revision;
            }
        }
    }

    /// The highest revision this member applied (etcd's current revision).
    fn current_revision(&self) -> i64 {
        self.identity.revision.load(Ordering::Acquire)
    }

    /// Compacts at `revision` if this member leads shard 0: whether the
    /// history up to it is compacted now (a member that does not lead
    /// tries nothing, as etcd's paused compactor).
    async fn compact(&self, revision: i64, mode: &'static str) -> bool {
        if revision <= 0 {
            return false;
        }
        match self.router.status(0).await {
            Ok(status) if status.leader == self.identity.member_id => {}
            _ => return false,
        }
        let caller = Caller::internal(self.routes.clone());
        let request = CompactionRequest {
            revision,
            physical: false,
        };
        let started = Instant::now();
        match caller
            .unary::<_, CompactionResponse>(COMPACT_PATH, &request)
            .await
        {
            Ok(_) => {
                tracing::info!(
                    revision,
                    mode,
                    took_ms = started.elapsed().as_millis() as u64,
                    "completed auto compaction"
                );
                true
            }
            Err(status)
                if status
                    .message()
                    .contains("required revision has been compacted") =>
            {
                true
            }
            Err(status) => {
                tracing::warn!(
                    revision,
                    mode,
                    error = %status.message(),
                    "auto compaction failed; tried again later"
                );
                false
            }
        }
    }
}
