//! The member: shards, the etcd v3 gRPC services, and how they meet.

pub mod errors;
pub mod kv;
pub mod maintenance;
pub mod members;
pub mod merge;
pub mod router;
pub mod validate;
