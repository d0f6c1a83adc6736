//! The Cairn daemon: Raft consensus per shard, thread-per-core, serving the etcd v3 API.

pub mod config;
pub mod durable_file;
pub mod grpc;
pub mod idle_poll;
pub mod member_file;
pub mod ops;
pub mod raft;
pub mod routing;
pub mod runtime;
pub mod server;
pub mod sim;
pub mod tls;
