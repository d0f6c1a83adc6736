//! Raft consensus as a pure state machine: no clock, no I/O, no threads.
