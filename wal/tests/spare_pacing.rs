//! Guards the pacing of spare zero-fill against its two failure modes: a
//! spare zero-filled flat out beside a busy log (every append then queues
//! behind zero writes), and a spare paced so lazily that a segment roll has
//! to wait for it. Under continuous appends the zeros written beside the
//! log stay within a lead of the log's own bytes, every roll finds a spare
//! ready, and the spare is complete once the log goes idle. Each test runs
//! on io_uring, pwrite + fdatasync and the in-memory crash storage.

mod common;

use cairn_wal::{Config, Record, Wal};
use common::{entry, run, Env, ALL};

/// A segment large enough that a paced zero-fill is visibly behind a flat-out
/// one, with flushes of two blocks per lone 4000-byte entry.
fn paced_config(env: &Env) -> Config {
    let mut c = env.config();
    c.segment_size_bytes = 2 << 20;
    c.max_batch_bytes = 128 << 10;
    c.max_queued_bytes = 1 << 20;
    c.zero_chunk_bytes = 16 << 10;
    c.spare_segments = 1;
    c.max_spare_segments = 2;
    c
}

async fn open(env: &Env, cfg: &Config) -> Wal {
    let (wal, _) = Wal::open_with_storage(cfg.clone(), env.storage())
        .await
        .unwrap_or_else(|e| panic!("{:?} open: {e}", env.kind));
    wal
}

#[test]
fn zero_fill_beside_a_busy_log_keeps_within_a_lead_of_it() {
    for kind in ALL {
        let env = Env::new(kind);
        let cfg = paced_config(&env);
        run(async {
            let wal = open(&env, &cfg).await;
            // The first segment's spare is prepared before any append.
            wal.settle().await;
            let before = wal.metrics();
            assert_eq!(before.zero_fill_bytes, cfg.segment_size_bytes, "{kind:?}");
            // A quarter of a segment, one append at a time: the roll to the
            // first segment used the spare, and its successor is being filled.
            let mut index = 0;
            while wal.metrics().bytes_written < cfg.segment_size_bytes / 4 {
                index += 1;
                wal.append(&[entry(1, index, 1, 4000)])
                    .await
                    .expect("append");
                let m = wal.metrics();
                let busy = m.zero_fill_busy_bytes - before.zero_fill_busy_bytes;
                let bound =
                    m.bytes_written + cfg.zero_fill_lead_bytes() + cfg.zero_chunk_bytes as u64;
                assert!(
                    busy <= bound,
                    "{kind:?}: {busy} bytes of zeros beside {} bytes of log (bound {bound})",
                    m.bytes_written
                );
            }
            let m = wal.metrics();
            assert_eq!(m.segments_started, 1, "{kind:?}");
            // Paced, never flat out: at least the lead went out beside the log.
            assert!(
                m.zero_fill_busy_bytes - before.zero_fill_busy_bytes >= cfg.zero_fill_lead_bytes(),
                "{kind:?}: {} busy bytes",
                m.zero_fill_busy_bytes - before.zero_fill_busy_bytes
            );
            // Idle, the rest of the spare is filled at once.
            wal.settle().await;
            assert_eq!(wal.spare_names().len(), cfg.spare_segments, "{kind:?}");
            assert_eq!(
                wal.metrics().zero_fill_bytes,
                2 * cfg.segment_size_bytes,
                "{kind:?}"
            );
            assert_eq!(wal.metrics().spare_waits, 0, "{kind:?}");
            wal.close().await;
        });
    }
}

#[test]
fn every_roll_finds_a_spare_ready_under_continuous_appends() {
    for kind in ALL {
        let env = Env::new(kind);
        let cfg = paced_config(&env);
        run(async {
            let wal = std::rc::Rc::new(open(&env, &cfg).await);
            wal.settle().await;
            // Three writers, so flushes carry one to three entries.
            let rolls = 3u64;
            let mut tasks = Vec::new();
            for shard in 1..=3u64 {
                let wal = wal.clone();
                tasks.push(tokio::task::spawn_local(async move {
                    let mut index = 0;
                    while wal.metrics().segments_started <= rolls {
                        index += 1;
                        let r: Record = entry(shard, index, 1, 4000);
                        wal.append(std::slice::from_ref(&r)).await.expect("append");
                    }
                    index
                }));
            }
            let mut appended = 0;
            for t in tasks {
                appended += t.await.expect("writer");
            }
            let m = wal.metrics();
            assert!(m.segments_started > rolls, "{kind:?}");
            assert_eq!(
                m.spare_waits, 0,
                "{kind:?}: a roll waited for its spare ({} appends, {} zero bytes beside the log)",
                appended, m.zero_fill_busy_bytes
            );
            // Every segment after the first had its spare filled beside the log.
            assert!(m.zero_fill_busy_bytes > 0, "{kind:?}");
            let wal = std::rc::Rc::try_unwrap(wal).unwrap_or_else(|_| panic!("writers done"));
            wal.close().await;
            // Nothing acknowledged was lost across the rolls.
            let (wal, rec) = Wal::open_with_storage(cfg.clone(), env.storage())
                .await
                .expect("reopen");
            let recovered: u64 = rec.shards.values().map(|s| s.entries.len() as u64).sum();
            assert_eq!(recovered, appended, "{kind:?}");
            wal.close().await;
        });
    }
}
