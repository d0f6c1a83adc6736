//! Guards recovery against dropping acknowledged records. A tail segment
//! whose header is bad but which holds records of its own past the first
//! record slot must fail the open, not be recycled as never written; a
//! flipped bit in an acknowledged record near the end of the log (in the
//! last batch or any batch before it) must fail the open with the file and
//! offset, not be cut as a torn tail. A real torn write of the last batch
//! (power cut at every sync point, any subset of unsynced sectors on disk)
//! is still cut, and recovery returns whole appends only: every acknowledged
//! one, and the one in flight either whole or not at all.

mod common;

use std::rc::Rc;

use bytes::Bytes;
use cairn_wal::crash::CrashStorage;
use cairn_wal::{HardState, OpenError, Record, Recovered, Wal, SEGMENT_DATA_OFFSET};
use common::{entry, run, Env, Kind};

/// Appends `appends` one after another, each its own flush; returns the env.
fn write_log(appends: &[Vec<Record>]) -> Env {
    let env = Env::new(Kind::Crash);
    run(async {
        let (wal, _) = Wal::open_with_storage(env.config(), env.storage())
            .await
            .expect("open");
        for a in appends {
            wal.append(a).await.expect("append");
        }
        wal.close().await;
    });
    env
}

fn open_result(env: &Env) -> Result<Recovered, OpenError> {
    run(async {
        let (wal, rec) = Wal::open_with_storage(env.config(), env.storage()).await?;
        wal.close().await;
        Ok(rec)
    })
}

fn entry_indexes(rec: &Recovered, shard: u64) -> Vec<u64> {
    rec.shards
        .get(&shard)
        .map(|s| s.entries.iter().map(|e| e.index).collect())
        .unwrap_or_default()
}

/// The only segment of a log of small appends and its bytes.
fn only_segment(env: &Env) -> (String, Vec<u8>) {
    let segs = env.segments();
    assert_eq!(segs.len(), 1, "{segs:?}");
    let b = env.read(&segs[0]);
    (segs[0].clone(), b)
}

fn expect_corrupt(env: &Env, seg: &str, what: &str) -> u64 {
    match open_result(env) {
        Ok(rec) => panic!(
            "{what}: open succeeded and recovered entries {:?} (torn tail {:?})",
            entry_indexes(&rec, 1),
            rec.torn_tail
        ),
        Err(OpenError::Corrupt {
            file,
            offset,
            reason,
        }) => {
            assert!(
                file.to_string_lossy().ends_with(seg),
                "{what}: error names {} instead of {seg}: {reason}",
                file.display()
            );
            offset
        }
        Err(e) => panic!("{what}: expected a corruption error, got {e}"),
    }
}

/// Offsets in `bytes` where `needle` (a payload written by `entry`) starts.
fn find(bytes: &[u8], needle: &[u8]) -> usize {
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("payload present")
}

fn payload(r: &Record) -> Bytes {
    match r {
        Record::Entry { data, .. } => data.clone(),
        _ => unreachable!(),
    }
}

#[test]
fn bad_tail_header_with_records_after_the_first_slot_fails_open() {
    let appends: Vec<Vec<Record>> = (1..=4).map(|i| vec![entry(1, i, 1, 300)]).collect();
    let env = write_log(&appends);
    let (seg, original) = only_segment(&env);
    let pristine = env.snapshot();

    // Header damaged, and the first record slot damaged too: the records in
    // later blocks are still this segment's, so the header was written.
    let mut env = env;
    let mut b = original.clone();
    b[0] ^= 0xff;
    b[SEGMENT_DATA_OFFSET + 1] ^= 0x40;
    env.write(&seg, &b);
    expect_corrupt(
        &env,
        &seg,
        "bad header, bad first slot, valid records later",
    );

    // Header damaged alone: fails as well.
    env.restore(&pristine);
    let mut b = original.clone();
    b[3] ^= 0x01;
    env.write(&seg, &b);
    expect_corrupt(&env, &seg, "bad header in front of valid records");

    // A header that never reached the disk in front of nothing at all is a
    // segment that was named but never written: the open succeeds.
    env.restore(&pristine);
    let mut b = original.clone();
    b.fill(0);
    b[0] = 0x17;
    env.write(&seg, &b);
    let rec = open_result(&env).expect("never-written tail segment");
    assert_eq!(entry_indexes(&rec, 1), Vec::<u64>::new());
}

#[test]
fn flipped_bit_in_an_acknowledged_record_near_the_tail_fails_open() {
    // Small appends, each its own flush: all of them lie within one
    // max_batch_bytes of the end of the log.
    let appends: Vec<Vec<Record>> = (1..=5).map(|i| vec![entry(1, i, 1, 200)]).collect();
    let env = write_log(&appends);
    let (seg, original) = only_segment(&env);
    let pristine = env.snapshot();
    let mut env = env;
    for (victim, what) in [(4usize, "next-to-last append"), (5, "last append")] {
        let at = find(&original, &payload(&appends[victim - 1][0]));
        for bit in [0usize, 7, 77, 800, 1599] {
            env.restore(&pristine);
            let mut b = original.clone();
            b[at + bit / 8] ^= 1 << (bit % 8);
            env.write(&seg, &b);
            let offset = expect_corrupt(&env, &seg, &format!("{what}: bit {bit} flipped"));
            assert!(
                offset as usize <= at + bit / 8,
                "{what}: error offset {offset} is past the damage at {}",
                at + bit / 8
            );
        }
    }
    // Untouched, the same log opens with every record.
    env.restore(&pristine);
    let rec = open_result(&env).expect("pristine log opens");
    assert_eq!(entry_indexes(&rec, 1), (1..=5).collect::<Vec<_>>());
    assert!(rec.torn_tail.is_none());
}

/// Appends of several records each (entries spanning sectors, and a hard
/// state), so a torn write can leave part of an append on disk.
fn multi_record_appends(n: u64) -> Vec<Vec<Record>> {
    (1..=n)
        .map(|i| {
            vec![
                entry(1, 2 * i - 1, 1, 700),
                entry(1, 2 * i, 1, 1500),
                Record::HardState {
                    shard: 1,
                    state: HardState {
                        term: 1,
                        vote: 1,
                        commit: 2 * i,
                    },
                },
            ]
        })
        .collect()
}

/// Runs the appends on `disk` until its power cut; returns how many were acknowledged.
fn run_until_cut(env: &Env, disk: &CrashStorage, appends: &[Vec<Record>]) -> usize {
    run(async {
        let Ok((wal, _)) = Wal::open_with_storage(env.config(), Rc::new(disk.clone())).await else {
            return 0;
        };
        let mut acked = 0;
        for a in appends {
            if wal.append(a).await.is_err() {
                break;
            }
            acked += 1;
        }
        drop(wal);
        acked
    })
}

#[test]
fn torn_last_batch_is_cut_to_whole_acknowledged_appends() {
    let appends = multi_record_appends(10);
    // Sync points of a whole run without a crash.
    let total_syncs = {
        let env = Env::new(Kind::Crash);
        let disk = env.crash.clone();
        assert_eq!(run_until_cut(&env, &disk, &appends), appends.len());
        disk.syncs()
    };
    let mut cut_tails = 0;
    for crash_at in 1..=total_syncs {
        // No unsynced sector on disk, or each one there or not at random.
        let seeds = (0..24).map(|k| Some(crash_at * 1000 + k));
        for torn_seed in std::iter::once(None).chain(seeds) {
            let env = Env::new(Kind::Crash);
            let disk = env.crash.clone();
            disk.crash_at_sync(crash_at);
            let acked = run_until_cut(&env, &disk, &appends);
            let what = format!("crash at sync {crash_at}, torn seed {torn_seed:?}");
            let after = disk.after_crash(torn_seed);
            let rec = run(async {
                let (wal, rec) = Wal::open_with_storage(env.config(), Rc::new(after.clone()))
                    .await
                    .unwrap_or_else(|e| panic!("{what}: open after the cut failed: {e}"));
                wal.close().await;
                rec
            });
            cut_tails += usize::from(rec.torn_tail.is_some());
            let got = entry_indexes(&rec, 1);
            // Whole appends only: each carries two entries and a hard state.
            let whole = got.len() / 2;
            assert_eq!(
                got,
                (1..=2 * whole as u64).collect::<Vec<_>>(),
                "{what}: recovered entries are not whole appends"
            );
            assert!(
                whole == acked || whole == acked + 1,
                "{what}: {acked} appends acknowledged, {whole} recovered"
            );
            let hs = rec.shards.get(&1).and_then(|s| s.hard_state);
            let want_hs = (whole > 0).then(|| HardState {
                term: 1,
                vote: 1,
                commit: 2 * whole as u64,
            });
            assert_eq!(hs, want_hs, "{what}: hard state of another append");
            for (e, i) in rec
                .shards
                .get(&1)
                .map(|s| &s.entries[..])
                .unwrap_or(&[])
                .iter()
                .zip(1u64..)
            {
                let a = &appends[((i - 1) / 2) as usize][((i - 1) % 2) as usize];
                assert_eq!(e.data, payload(a), "{what}: entry {i} altered");
            }
        }
    }
    assert!(
        cut_tails > 20,
        "only {cut_tails} runs left a torn tail to cut"
    );
}
