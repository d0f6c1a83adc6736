//! Protocol buffer types of Cairn, generated at build time from the `.proto` files
//! in this directory: the Raft messages exchanged between members and the etcd v3
//! gRPC API served to clients. Message, field and service names and numbers of the
//! etcd API follow etcd's wire format so etcd clients work unchanged.

/// etcd's key-value and event records (`proto/etcd/kv.proto`).
pub mod mvccpb {
    include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
}

/// etcd's users, roles and permissions (`proto/etcd/auth.proto`).
pub mod authpb {
    include!(concat!(env!("OUT_DIR"), "/authpb.rs"));
}

/// The etcd v3 gRPC services and messages (`proto/etcd/rpc.proto`), clients and servers.
pub mod etcdserverpb {
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
}

/// etcd's Lock service (`proto/etcd/v3lock.proto`).
pub mod v3lockpb {
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.rs"));
}

/// etcd's Election service (`proto/etcd/v3election.proto`).
pub mod v3electionpb {
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.rs"));
}

/// gRPC's health service (`proto/grpc/health.proto`).
pub mod grpc_health_v1 {
    include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
}

/// Cairn's Raft messages, entries, hard state and membership (`proto/raftpb.proto`).
pub mod raftpb {
    include!(concat!(env!("OUT_DIR"), "/raftpb.rs"));
}

/// What a shard's Raft log carries: replicated client requests (`proto/cairn/internal.proto`).
pub mod cairnpb {
    include!(concat!(env!("OUT_DIR"), "/cairnpb.rs"));
}

pub mod h2;

/// The encoded `google.protobuf.FileDescriptorSet` of every `.proto` file here:
/// message, field and service names and numbers, as the code above was generated from.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));
