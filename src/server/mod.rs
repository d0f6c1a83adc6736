//! The member: shards, the etcd v3 gRPC services, and how they meet.

pub mod auth;
pub mod backup;
pub mod clock;
pub mod cluster;
pub mod command;
pub mod convert;
pub mod crash_point;
pub mod data_dir;
pub mod entry;
pub mod errors;
pub mod gateway;
pub mod identity;
pub mod keyspace;
pub mod kv;
pub mod lease;
pub mod maintenance;
pub mod members;
pub mod merge;
pub mod node;
pub mod peer_http;
pub mod peer_links;
pub mod router;
pub mod shard;
pub mod start_error;
pub mod validate;
pub mod watch;
