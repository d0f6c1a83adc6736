//! Protocol buffer types of Cairn, generated at build time from the `.proto` files
//! in this directory: the Raft messages exchanged between members and the etcd v3
//! gRPC API served to clients. Message, field and service names and numbers of the
//! etcd API follow etcd's wire format so etcd clients work unchanged.
