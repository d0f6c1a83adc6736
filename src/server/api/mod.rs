//! The etcd v3 API services: each turns a client's request into commands
//! for the keyspace layer and its answers into etcd's responses.

pub mod call_gate;
pub mod cluster;
pub mod kv;
pub mod lease;
pub mod lease_renewals;
pub mod maintenance;
pub mod require_leader;
pub mod stream_end;
pub mod watch;
pub mod watch_stream;
