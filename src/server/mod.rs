//! The member: shards, the etcd v3 gRPC services, and how they meet.
//!
//! In layers, top to bottom (docs/ARCHITECTURE.md, "Layers"), each using
//! only the layers below it:
//! - `member`: bootstrap, data directory, peers; builds and starts the rest;
//! - `api`: the etcd v3 services, with `gateway` (HTTP/JSON) and `auth`;
//! - `keyspace`: the one place that routes a request to shards and merges
//!   their answers; txns over several shards;
//! - `shard`: the shard driver;
//! - what the shard drivers keep for the layers above: `auth_state` (the
//!   auth state shard 0 applies), `revisions` (the revision counter, what
//!   each shard reached), `shard_inbox` (a shard's commands from every core);
//! - the files here: what the layers share (`command`: what a shard is
//!   asked and answers; `entry`: what its log entries mean; the member
//!   table, the backup file's format, the peer port's client, errors, request checks, the wall clock,
//!   crash points).

pub mod api;
pub mod auth;
pub mod auth_state;
pub mod backup;
pub mod clock;
pub mod command;
pub mod convert;
pub mod crash_point;
pub mod entry;
pub mod errors;
pub mod gateway;
pub mod identity;
pub mod key_ranges;
pub mod keyspace;
pub mod latest_file;
pub mod member;
pub mod members;
pub mod peer_client;
pub mod reply;
pub mod revisions;
pub mod shard;
pub mod shard_inbox;
pub mod validate;
