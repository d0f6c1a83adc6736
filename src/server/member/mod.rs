//! The member itself: its data directory, its membership, its peers, and
//! the start that builds the shards and the services on every core.

pub mod data_dir;
pub mod node;
pub mod peer_http;
pub mod peer_lease;
pub mod peer_links;
pub mod restore;
mod setup;
pub mod start_error;
