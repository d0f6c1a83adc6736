//! Cairn's write-ahead log: one log per core, shared by the shards on that core.
