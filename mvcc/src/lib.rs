//! Cairn's MVCC store: an in-memory key index over a revision-keyed copy-on-write B+tree.
