//! Guards recovery's line between a torn tail and damage. The last batch
//! torn at sector granularity (every subset of its sectors reaching the disk,
//! the rest left as the zeros that were there) must be dropped whole or kept
//! whole, every earlier acknowledged record surviving and the open never
//! failing; any single bit flipped in the last record, which was
//! acknowledged, must fail the open with the file and offset instead of
//! being cut. Runs on every backend.

mod common;

use cairn_wal::{OpenError, Record, Wal, BLOCK_BYTES, SEGMENT_DATA_OFFSET};
use common::{entry, run, Env, ALL};

const PAYLOAD_BYTES: usize = 1200;
const RECORDS: u64 = 6;
const SECTOR_BYTES: usize = cairn_wal::crash::SECTOR_BYTES;
const SECTORS: usize = BLOCK_BYTES / SECTOR_BYTES;

fn expect_recovery(env: &Env, last_intact: bool, torn: bool, what: &str) {
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
        assert_eq!(
            rec.torn_tail.is_some(),
            torn,
            "{:?} {what}: torn tail reported wrongly",
            env.kind
        );
        for (e, i) in rec.shards[&1].entries.iter().zip(1..) {
            let Record::Entry { data, .. } = entry(1, i, 1, PAYLOAD_BYTES) else {
                unreachable!()
            };
            assert_eq!(e.data, data, "{:?} {what}: entry {i} altered", env.kind);
        }
        wal.close().await;
    });
}

fn expect_refusal(env: &Env, seg: &str, what: &str) {
    run(async {
        match Wal::open_with_storage(env.config(), env.storage()).await {
            Ok((wal, rec)) => {
                wal.close().await;
                panic!(
                    "{:?} {what}: open succeeded (torn tail {:?})",
                    env.kind, rec.torn_tail
                );
            }
            Err(OpenError::Corrupt { file, .. }) => {
                assert!(
                    file.to_string_lossy().ends_with(seg),
                    "{:?} {what}",
                    env.kind
                )
            }
            Err(e) => panic!(
                "{:?} {what}: expected a corruption error, got {e}",
                env.kind
            ),
        }
    });
}

#[test]
fn torn_last_batch_is_cut_and_damage_to_it_fails_open() {
    for kind in ALL {
        let mut env = Env::new(kind);
        run(async {
            let (wal, _) = Wal::open_with_storage(env.config(), env.storage())
                .await
                .expect("open");
            // One append per flush, so append i is the batch in block i of the data area.
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
        let sector = |b: &[u8], i: usize| {
            b[start + i * SECTOR_BYTES..start + (i + 1) * SECTOR_BYTES].to_vec()
        };

        // Every subset of the last block's sectors reached the disk.
        for landed in 0u32..1 << SECTORS {
            env.restore(&pristine);
            let mut b = original.clone();
            for i in (0..SECTORS).filter(|i| landed & (1 << i) == 0) {
                b[start + i * SECTOR_BYTES..start + (i + 1) * SECTOR_BYTES].fill(0);
            }
            let intact = (0..SECTORS).all(|i| sector(&b, i) == sector(&original, i));
            // Nothing of the batch on disk: the log simply ends before it.
            let torn = !intact && landed != 0;
            env.write(&seg, &b);
            expect_recovery(
                &env,
                intact,
                torn,
                &format!("sectors {landed:#010b} landed"),
            );
        }

        // The last record was acknowledged: any flipped bit in it is damage.
        let Record::Entry { data, .. } = entry(1, RECORDS, 1, PAYLOAD_BYTES) else {
            unreachable!()
        };
        let at = original
            .windows(data.len())
            .position(|w| w == &data[..])
            .expect("last payload on disk");
        let header_at = at - cairn_wal::RECORD_HEADER_BYTES;
        for bit in (0..(at + data.len() - header_at) * 8).step_by(7) {
            env.restore(&pristine);
            let mut b = original.clone();
            b[header_at + bit / 8] ^= 1 << (bit % 8);
            env.write(&seg, &b);
            expect_refusal(&env, &seg, &format!("bit {bit} of the last record flipped"));
        }

        // After a cut, the log keeps working: new appends land after the
        // surviving records and a further reopen sees them.
        env.restore(&pristine);
        let mut b = original.clone();
        b[start + 2 * SECTOR_BYTES..start + BLOCK_BYTES].fill(0);
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
