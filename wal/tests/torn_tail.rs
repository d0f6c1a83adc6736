//! Guards recovery against torn tails: the last record cut short at every byte
//! offset, or with any single bit flipped, must be dropped cleanly while every
//! earlier acknowledged record survives, and the open must never fail. Runs on
//! every backend.

mod common;

use cairn_wal::{Record, Wal, BLOCK_BYTES, RECORD_HEADER_BYTES, SEGMENT_DATA_OFFSET};
use common::{entry, run, Env, ALL};

/// Payload size making the last record's bytes exactly header + payload.
const PAYLOAD_BYTES: usize = 56;
const RECORD_BYTES: usize = RECORD_HEADER_BYTES + PAYLOAD_BYTES;
const RECORDS: u64 = 6;

fn expect_recovery(env: &Env, last_intact: bool, what: &str) {
    run(async {
        let (wal, rec) = Wal::open_with_storage(env.config(), env.storage())
            .await
            .unwrap_or_else(|e| panic!("{:?} {what}: open failed: {e}", env.kind));
        let got: Vec<u64> = rec
            .shards
            .get(&1)
            .map(|s| s.entries.iter().map(|e| e.index).collect())
            .unwrap_or_default();
        let want = if last_intact { RECORDS } else { RECORDS - 1 };
        assert_eq!(got, (1..=want).collect::<Vec<_>>(), "{:?} {what}", env.kind);
        for (e, i) in rec.shards[&1].entries.iter().zip(1..) {
            let Record::Entry { data, .. } = entry(1, i, 1, PAYLOAD_BYTES) else {
                unreachable!()
            };
            assert_eq!(e.data, data, "{:?} {what}: entry {i} altered", env.kind);
        }
        wal.close().await;
    });
}

#[test]
fn torn_last_record_is_cut_and_earlier_records_survive() {
    for kind in ALL {
        let mut env = Env::new(kind);
        run(async {
            let (wal, _) = Wal::open_with_storage(env.config(), env.storage())
                .await
                .expect("open");
            // One append per flush, so record i starts block i of the data area.
            for i in 1..=RECORDS {
                wal.append(&[entry(1, i, 1, PAYLOAD_BYTES)])
                    .await
                    .expect("append");
            }
            wal.close().await;
        });
        let segs = env.segments();
        assert_eq!(segs.len(), 1, "{kind:?}: {segs:?}");
        let seg = segs[0].clone();
        let start = SEGMENT_DATA_OFFSET + (RECORDS as usize - 1) * BLOCK_BYTES;
        let pristine = env.snapshot();
        let original = env.read(&seg);

        for cut in 0..RECORD_BYTES {
            env.restore(&pristine);
            let mut b = original.clone();
            // The write reached the disk only up to `cut`; the rest of the
            // block (record and pad) is still zero.
            b[start + cut..start + BLOCK_BYTES].fill(0);
            let intact = b[start..start + RECORD_BYTES] == original[start..start + RECORD_BYTES];
            env.write(&seg, &b);
            expect_recovery(&env, intact, &format!("cut at byte {cut}"));
        }
        for bit in 0..RECORD_BYTES * 8 {
            env.restore(&pristine);
            let mut b = original.clone();
            b[start + bit / 8] ^= 1 << (bit % 8);
            env.write(&seg, &b);
            expect_recovery(&env, false, &format!("bit {bit} flipped"));
        }

        // After a cut, the log keeps working: new appends land after the
        // surviving records and a further reopen sees them.
        env.restore(&pristine);
        let mut b = original.clone();
        b[start + 10..start + BLOCK_BYTES].fill(0);
        env.write(&seg, &b);
        run(async {
            let (wal, rec) = Wal::open_with_storage(env.config(), env.storage())
                .await
                .expect("open");
            assert!(rec.torn_tail.is_some(), "{kind:?}: torn tail not reported");
            wal.append(&[entry(1, RECORDS, 2, PAYLOAD_BYTES)])
                .await
                .expect("append after cut");
            wal.close().await;
            let (wal, rec) = Wal::open_with_storage(env.config(), env.storage())
                .await
                .expect("reopen");
            let got: Vec<(u64, u64)> = rec.shards[&1]
                .entries
                .iter()
                .map(|e| (e.index, e.term))
                .collect();
            let mut want: Vec<(u64, u64)> = (1..RECORDS).map(|i| (i, 1)).collect();
            want.push((RECORDS, 2));
            assert_eq!(got, want, "{kind:?}");
            wal.close().await;
        });
    }
}
