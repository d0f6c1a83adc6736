//! Scenario tests of the Raft core, one file per feature, each test citing the
//! part of the Raft paper or thesis it checks. They guard against regressions
//! in the safety and liveness rules that the simulator only finds by chance.

mod async_append;
mod election;
mod harness;
mod membership;
mod proposals;
mod random;
mod reads;
mod replication;
mod script;
mod snapshot;
mod transfer;
