//! The etcd v3 API services: each turns a client's request into commands
//! for the keyspace layer and its answers into etcd's responses. etcd's Lock
//! and Election services (`lock`, `election`, on `recipes`) are built on the
//! others, called in-process on the client's behalf (`in_process`).

pub mod auto_compaction;
pub mod call_gate;
pub mod cluster;
pub mod election;
pub mod health;
pub mod in_process;
pub mod kv;
pub mod lease;
pub mod lease_renewals;
pub mod lock;
pub mod maintenance;
pub mod recipes;
pub mod require_leader;
pub mod stream_end;
pub mod watch;
pub mod watch_stream;
