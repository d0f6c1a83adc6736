//! The Cairn daemon: Raft consensus per shard, thread-per-core, serving the etcd v3 API.

pub mod raft;
