//! cairn-tune: the fsync tuning lab.
