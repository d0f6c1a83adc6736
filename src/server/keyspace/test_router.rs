//! A router over shards that a test answers itself, for the code above
//! the shards (`watch_shards`, `api::watch_stream`).

use std::sync::Arc;

use cairn_proto::mvccpb::{Event, KeyValue};

use crate::routing::{RoutingTable, ShardId};
use crate::server::command::{ShardCommand, WatchBatch};
use crate::server::errors::ApiError;
use crate::server::keyspace::router::{command_channels, Router};
use crate::server::keyspace::Keyspace;
use crate::server::revisions::RevisionCounter;
use crate::server::shard_inbox::CommandInbox;

/// Channels to `shards` shards, with a keyspace or not.
pub fn router(shards: usize, keyspace: bool) -> (Arc<Router>, Vec<CommandInbox>) {
    let keyspace =
        keyspace.then(|| Arc::new(Keyspace::new(Arc::new(RevisionCounter::new(shards)))));
    let mut channels = command_channels(&RoutingTable::new(shards, 1), 1, keyspace, &[]);
    (channels.routers.remove(0), channels.inboxes)
}

/// Takes the next command of each of `inboxes` in turn and answers a
/// watch with its answer in `answers`; answers what each was sent:
/// `(shard, "watch" or "cancel", progress asked)`.
pub async fn shards_answer(
    inboxes: &mut [CommandInbox],
    answers: &[(ShardId, Result<i64, ApiError>)],
) -> Vec<(ShardId, &'static str, bool)> {
    let mut seen = Vec::new();
    for (shard, answer) in answers {
        match inboxes[*shard as usize].recv().await.expect("a command") {
            ShardCommand::Watch { spec, reply, .. } => {
                seen.push((*shard, "watch", spec.progress));
                let _ = reply.send(answer.clone());
            }
            ShardCommand::CancelWatch { reply, .. } => {
                seen.push((*shard, "cancel", false));
                let _ = reply.send(Ok(()));
            }
            _ => panic!("only watches and cancels are sent"),
        }
    }
    seen
}

/// A batch of watcher 0 from `shard`, sent through `through`, with an
/// event at each of `revisions`.
pub fn batch(shard: ShardId, through: i64, revisions: &[i64]) -> WatchBatch {
    WatchBatch {
        watcher: 0,
        shard,
        revision: through,
        through,
        events: revisions
            .iter()
            .map(|&r| Event {
                kv: Some(KeyValue {
                    key: format!("k{r}").into_bytes().into(),
                    mod_revision: r,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        subs: Vec::new(),
        compact_revision: None,
    }
}
