//! cairn-bench: an etcd v3 load generator.
