//! The behaviour every backend must share: records survive a reopen exactly,
//! concurrent appends share flushes, reads come back from cache and segments
//! alike, truncation rewrites a shard's suffix, released segments are recycled
//! rather than deleted, damage before the tail stops the open with the file
//! and offset, and a failed write poisons the log. Each test runs on io_uring,
//! pwrite + fdatasync and the in-memory crash storage.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use bytes::Bytes;
use cairn_wal::crash::FaultOp;
use cairn_wal::{AppendError, HardState, OpenError, ReadError, Record, Wal};
use common::{entry, run, Env, Kind, ALL};

async fn open(env: &Env) -> (Wal, cairn_wal::Recovered) {
    Wal::open_with_storage(env.config(), env.storage())
        .await
        .unwrap_or_else(|e| panic!("{:?} open: {e}", env.kind))
}

fn for_all(test: impl Fn(&mut Env)) {
    for kind in ALL {
        let mut env = Env::new(kind);
        test(&mut env);
    }
}

#[test]
fn append_and_recover_round_trip() {
    for_all(|env| {
        run(async {
            let (wal, rec) = open(env).await;
            assert!(rec.shards.is_empty());
            let hs = HardState {
                term: 3,
                vote: 2,
                commit: 5,
            };
            let mut recs = vec![Record::HardState {
                shard: 1,
                state: hs,
            }];
            for i in 1..=20 {
                recs.push(entry(1, i, 3, (i * 37) as usize % 300));
                recs.push(entry(2, i, 1, 10));
            }
            let lsn = wal.append(&recs).await.expect("append");
            assert_eq!(lsn, recs.len() as u64);
            assert_eq!(wal.durable_lsn(), lsn);
            assert_eq!(wal.index_range(1), Some((1, 20)));
            let got = wal.entries(1, 5, 9).await.expect("entries");
            assert_eq!(
                got.iter().map(|e| e.index).collect::<Vec<_>>(),
                vec![5, 6, 7, 8]
            );
            wal.close().await;

            let (wal, rec) = open(env).await;
            assert_eq!(rec.shards[&1].hard_state, Some(hs));
            assert_eq!(rec.shards[&2].hard_state, None);
            for shard in [1u64, 2] {
                let want: Vec<Record> = recs
                    .iter()
                    .filter(|r| matches!(r, Record::Entry { shard: s, .. } if *s == shard))
                    .cloned()
                    .collect();
                let got: Vec<Record> = rec.shards[&shard]
                    .entries
                    .iter()
                    .map(|e| Record::Entry {
                        shard,
                        index: e.index,
                        term: e.term,
                        data: e.data.clone(),
                    })
                    .collect();
                assert_eq!(got, want, "{:?} shard {shard}", env.kind);
                // After a reopen the entries come from the segments.
                let read = wal.entries(shard, 1, 21).await.expect("read from segments");
                assert_eq!(read, rec.shards[&shard].entries);
            }
            assert_eq!(wal.hard_state(1), Some(hs));
            wal.close().await;
        })
    });
}

#[test]
fn concurrent_appends_share_flushes() {
    for_all(|env| {
        run(async {
            let (wal, _) = open(env).await;
            let wal = Rc::new(wal);
            let mut tasks = Vec::new();
            for w in 0..16u64 {
                let wal = wal.clone();
                tasks.push(tokio::task::spawn_local(async move {
                    for i in 1..=20 {
                        wal.append(&[entry(w, i, 1, 100)]).await.expect("append");
                    }
                }));
            }
            for t in tasks {
                t.await.expect("writer");
            }
            let m = wal.metrics();
            assert_eq!(m.appends, 320);
            assert!(
                m.flushes < m.appends,
                "{:?}: {} flushes for {} appends: no group commit",
                env.kind,
                m.flushes,
                m.appends
            );
            assert!(m.batch_appends.max() > 1);
            Rc::try_unwrap(wal).ok().expect("sole owner").close().await;
            let (_, rec) = open(env).await;
            for w in 0..16u64 {
                assert_eq!(rec.shards[&w].entries.len(), 20);
            }
        })
    });
}

#[test]
fn truncation_replaces_a_suffix() {
    for_all(|env| {
        run(async {
            let (wal, _) = open(env).await;
            let recs: Vec<Record> = (1..=10).map(|i| entry(7, i, 1, 50)).collect();
            wal.append(&recs).await.expect("append");
            // Raft conflict: entries from 6 on are replaced by a new term.
            wal.append(&[Record::Truncate { shard: 7, index: 6 }])
                .await
                .expect("truncate");
            wal.append(&[entry(7, 6, 2, 8), entry(7, 7, 2, 8)])
                .await
                .expect("append");
            // An implicit overwrite, without a truncate record.
            wal.append(&[entry(7, 7, 3, 9)]).await.expect("overwrite");
            let check = |es: &[cairn_wal::Entry]| {
                let v: Vec<(u64, u64)> = es.iter().map(|e| (e.index, e.term)).collect();
                assert_eq!(
                    v,
                    vec![(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2), (7, 3)]
                );
            };
            check(&wal.entries(7, 1, 8).await.expect("read"));
            assert!(matches!(
                wal.entries(7, 1, 9).await,
                Err(ReadError::Unavailable { .. })
            ));
            wal.close().await;
            let (wal, rec) = open(env).await;
            check(&rec.shards[&7].entries);
            check(&wal.entries(7, 1, 8).await.expect("read"));
            wal.close().await;
        })
    });
}

#[test]
fn segments_roll_release_and_recycle() {
    for_all(|env| {
        run(async {
            let mut cfg = env.config();
            cfg.tail_cache_bytes = 8 << 10;
            let (wal, _) = Wal::open_with_storage(cfg.clone(), env.storage())
                .await
                .expect("open");
            let hs = HardState {
                term: 9,
                vote: 1,
                commit: 0,
            };
            wal.append(&[Record::HardState {
                shard: 1,
                state: hs,
            }])
            .await
            .expect("hs");
            let mut index = 0;
            for _ in 0..60 {
                let recs: Vec<Record> = (0..4)
                    .map(|_| {
                        index += 1;
                        entry(1, index, 9, 1000)
                    })
                    .collect();
                wal.append(&recs).await.expect("append");
            }
            wal.settle().await;
            let before = wal.segment_names();
            assert!(before.len() >= 4, "{:?}: {before:?}", env.kind);
            // Old entries are evicted from the cache and read from segments.
            let got = wal.entries(1, 1, 10).await.expect("cold read");
            assert_eq!(got.len(), 9);
            assert_eq!(
                got[3].data,
                match entry(1, 4, 9, 1000) {
                    Record::Entry { data, .. } => data,
                    _ => unreachable!(),
                }
            );
            let spares_before = wal.spare_names();
            // Release everything but the last few entries.
            wal.release(1, index - 5);
            wal.settle().await;
            let after = wal.segment_names();
            assert!(
                after.len() < before.len(),
                "{:?}: nothing released",
                env.kind
            );
            assert_eq!(after.last(), before.last());
            assert!(wal.metrics().segments_recycled > 0);
            // Recycled files become spares; nothing beyond the cap is kept.
            let spares = wal.spare_names();
            assert!(spares.len() <= cfg.max_spare_segments);
            assert!(spares.len() >= spares_before.len());
            assert!(matches!(
                wal.entries(1, 1, 3).await,
                Err(ReadError::Compacted { .. })
            ));
            // A recycled spare is reused by the next segment roll.
            let recycled: Vec<String> = spares
                .iter()
                .filter(|s| !spares_before.contains(s))
                .cloned()
                .collect();
            for _ in 0..30 {
                index += 1;
                wal.append(&[entry(1, index, 9, 2000)])
                    .await
                    .expect("append");
            }
            wal.settle().await;
            let now = wal.spare_names();
            assert!(
                recycled.iter().any(|r| !now.contains(r)),
                "{:?}: recycled spares {recycled:?} never reused (spares now {now:?})",
                env.kind
            );
            wal.close().await;
            // The hard state survives the release of the segment it was written in.
            let (wal, rec) = Wal::open_with_storage(cfg, env.storage())
                .await
                .expect("reopen");
            assert_eq!(rec.shards[&1].hard_state, Some(hs));
            assert_eq!(rec.shards[&1].entries.last().map(|e| e.index), Some(index));
            wal.close().await;
        })
    });
}

#[test]
fn damaged_sealed_segment_fails_open_with_file_and_offset() {
    for_all(|env| {
        run(async {
            let (wal, _) = open(env).await;
            for i in 1..=120 {
                wal.append(&[entry(1, i, 1, 1500)]).await.expect("append");
            }
            wal.close().await;
            let segs = env.segments();
            assert!(segs.len() >= 2);
            let first = segs[0].clone();
            let mut bytes = env.read(&first);
            // One append per flush: each record starts a block.
            let record_at = cairn_wal::SEGMENT_DATA_OFFSET + 3 * cairn_wal::BLOCK_BYTES;
            let offset = record_at + 100;
            bytes[offset] ^= 0x10;
            env.write(&first, &bytes);
            let err = Wal::open_with_storage(env.config(), env.storage())
                .await
                .err()
                .expect("open must fail");
            let msg = err.to_string();
            assert!(matches!(err, OpenError::Corrupt { .. }), "{msg}");
            assert!(msg.contains(&first), "{msg}");
            assert!(msg.contains(&format!("offset {record_at}")), "{msg}");
        })
    });
}

#[test]
fn missing_segment_fails_open() {
    for_all(|env| {
        run(async {
            let (wal, _) = open(env).await;
            for i in 1..=150 {
                wal.append(&[entry(1, i, 1, 1500)]).await.expect("append");
            }
            wal.close().await;
            let segs = env.segments();
            assert!(segs.len() >= 3, "{segs:?}");
            env.delete(&segs[1]);
            let err = Wal::open_with_storage(env.config(), env.storage())
                .await
                .err()
                .expect("open must fail");
            assert!(matches!(err, OpenError::MissingSegment { .. }), "{err}");
            assert!(err.to_string().contains(&segs[0]), "{err}");
        })
    });
}

#[test]
fn write_error_poisons_until_reopen() {
    // Fault injection needs the crash storage; the real backends are covered
    // by the shared paths above.
    let env = Env::new(Kind::Crash);
    run(async {
        let (wal, _) = open(&env).await;
        wal.append(&[entry(1, 1, 1, 10)]).await.expect("append");
        env.crash.inject(FaultOp::Write, 1, libc::EIO);
        let err = wal
            .append(&[entry(1, 2, 1, 10)])
            .await
            .expect_err("write fails");
        assert!(matches!(err, AppendError::Poisoned { .. }), "{err}");
        assert!(err.to_string().contains(".wal"), "{err}");
        env.crash.clear_faults();
        // No retry into corruption: the log stays refused.
        let err = wal
            .append(&[entry(1, 2, 1, 10)])
            .await
            .expect_err("still poisoned");
        assert!(matches!(err, AppendError::Poisoned { .. }));
        assert!(wal.poisoned().is_some());
        drop(wal);
        let (wal, rec) = open(&env).await;
        assert_eq!(rec.shards[&1].entries.len(), 1);
        wal.append(&[entry(1, 2, 1, 10)])
            .await
            .expect("append after reopen");
        wal.close().await;
    });
}

#[test]
fn enospc_is_reported_as_such() {
    let env = Env::new(Kind::Crash);
    run(async {
        let (wal, _) = open(&env).await;
        wal.append(&[entry(1, 1, 1, 10)]).await.expect("append");
        env.crash.inject(FaultOp::SyncData, 1, libc::ENOSPC);
        let err = wal
            .append(&[entry(1, 2, 1, 10)])
            .await
            .expect_err("disk full");
        assert!(matches!(err, AppendError::NoSpace { .. }), "{err}");
        assert!(err.to_string().contains("disk full"), "{err}");
    });
    // Disk full while preparing spare segments: the roll that needs one fails.
    let env = Env::new(Kind::Crash);
    run(async {
        let (wal, _) = open(&env).await;
        wal.append(&[entry(1, 1, 1, 10)]).await.expect("append");
        wal.settle().await;
        env.crash.inject(FaultOp::Write, 1, libc::ENOSPC);
        let mut err = None;
        for i in 2..200 {
            if let Err(e) = wal.append(&[entry(1, i, 1, 2000)]).await {
                err = Some(e);
                break;
            }
        }
        let err = err.expect("disk full must surface");
        assert!(matches!(err, AppendError::NoSpace { .. }), "{err}");
    });
}

#[test]
fn flush_observer_and_metrics_see_every_flush() {
    for_all(|env| {
        run(async {
            let (wal, _) = open(env).await;
            let seen = Rc::new(RefCell::new(Vec::new()));
            let s = seen.clone();
            wal.set_flush_observer(Box::new(move |e| s.borrow_mut().push(*e)));
            for i in 1..=5 {
                wal.append(&[entry(3, i, 1, 64)]).await.expect("append");
            }
            let seen = seen.borrow();
            let m = wal.metrics();
            assert_eq!(seen.len() as u64, m.flushes);
            assert_eq!(m.flush_latency_us.len(), m.flushes);
            assert_eq!(seen.iter().map(|e| e.appends as u64).sum::<u64>(), 5);
            assert_eq!(seen.last().map(|e| e.durable_lsn), Some(wal.durable_lsn()));
            assert!(seen.iter().all(|e| e.bytes % cairn_wal::BLOCK_BYTES == 0));
        })
    });
}

#[test]
fn oversized_record_is_refused() {
    let env = Env::new(Kind::Crash);
    run(async {
        let (wal, _) = open(&env).await;
        let big = Record::Entry {
            shard: 1,
            index: 1,
            term: 1,
            data: Bytes::from(vec![0; 5 << 10]),
        };
        let err = wal.append(&[big]).await.expect_err("too large");
        assert!(
            matches!(err, AppendError::RecordTooLarge { shard: 1, .. }),
            "{err}"
        );
        wal.append(&[entry(1, 1, 1, 4 << 10)])
            .await
            .expect("largest record fits");
    });
}

#[test]
fn damage_deep_in_the_tail_segment_fails_open() {
    for_all(|env| {
        run(async {
            let mut cfg = env.config();
            cfg.segment_size_bytes = 256 << 10;
            let (wal, _) = Wal::open_with_storage(cfg.clone(), env.storage())
                .await
                .expect("open");
            // One record per flush; far more flushes than one batch can span.
            for i in 1..=40 {
                wal.append(&[entry(1, i, 1, 1000)]).await.expect("append");
            }
            wal.close().await;
            let segs = env.segments();
            assert_eq!(segs.len(), 1);
            let mut bytes = env.read(&segs[0]);
            let record_at = cairn_wal::SEGMENT_DATA_OFFSET + 2 * cairn_wal::BLOCK_BYTES;
            bytes[record_at + 60] ^= 1;
            env.write(&segs[0], &bytes);
            let err = Wal::open_with_storage(cfg, env.storage())
                .await
                .err()
                .expect("open must fail");
            let msg = err.to_string();
            assert!(
                msg.contains(&segs[0]) && msg.contains(&format!("offset {record_at}")),
                "{msg}"
            );
        })
    });
}

#[test]
fn durable_watch_follows_flushes() {
    for_all(|env| {
        run(async {
            let (wal, _) = open(env).await;
            let mut watch = wal.durable_watch();
            assert_eq!(watch.durable_lsn(), 0);
            let wal = Rc::new(wal);
            let w = wal.clone();
            let appender = tokio::task::spawn_local(async move {
                w.append(&[entry(4, 1, 1, 8), entry(4, 2, 1, 8)])
                    .await
                    .expect("append")
            });
            assert!(watch.wait_for(2).await);
            assert_eq!(appender.await.expect("task"), 2);
            assert_eq!(wal.durable_lsn(), 2);
            assert_eq!(wal.last_lsn(), 2);
        })
    });
}

#[test]
fn entries_limited_stops_at_the_byte_budget() {
    for_all(|env| {
        run(async {
            let (wal, _) = open(env).await;
            let recs: Vec<Record> = (1..=10).map(|i| entry(5, i, 1, 100)).collect();
            wal.append(&recs).await.expect("append");
            let got = wal.entries_limited(5, 1, 11, 350).await.expect("read");
            assert_eq!(got.len(), 3);
            // The first entry comes back even when it alone exceeds the budget.
            let got = wal.entries_limited(5, 4, 11, 10).await.expect("read");
            assert_eq!(got.iter().map(|e| e.index).collect::<Vec<_>>(), vec![4]);
            wal.close().await;
            // The same from the segments after a reopen.
            let (wal, _) = open(env).await;
            let got = wal.entries_limited(5, 1, 11, 350).await.expect("read");
            assert_eq!(got.len(), 3);
            wal.close().await;
        })
    });
}

// Submitted records (queued without waiting for their flush) get increasing
// LSNs, become durable in order, and survive a reopen like awaited appends.
#[test]
fn submitted_records_become_durable_in_order() {
    for_all(|env| {
        run(async {
            let (wal, _) = open(env).await;
            let mut watch = wal.durable_watch();
            let first = wal.submit(&[entry(1, 1, 1, 40)]).await.expect("submit");
            let second = wal
                .submit(&[entry(1, 2, 1, 40), entry(1, 3, 1, 40)])
                .await
                .expect("submit");
            assert_eq!((first, second), (1, 3));
            assert!(watch.wait_for(first).await, "{:?}", env.kind);
            assert!(watch.durable_lsn() >= first);
            assert!(watch.wait_for(second).await, "{:?}", env.kind);
            assert_eq!(wal.durable_lsn(), second);
            wal.close().await;

            let (_, rec) = open(env).await;
            let got: Vec<u64> = rec.shards[&1].entries.iter().map(|e| e.index).collect();
            assert_eq!(got, vec![1, 2, 3], "{:?}", env.kind);
        })
    });
}
