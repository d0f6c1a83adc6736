//! HTTP/2 as gRPC uses it, shared by Cairn's gRPC server on the client port
//! and `cairn-bench`'s gRPC client: frame layouts and writers
//! ([`frame`], RFC 9113) and header compression ([`hpack`], RFC 7541).

pub mod frame;
pub mod hpack;
