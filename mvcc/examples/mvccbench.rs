//! mvccbench: load, read, reopen and overwrite-soak figures of the MVCC store.
//!
//! ```text
//! cargo run --release -p cairn-mvcc --example mvccbench -- --dir DIR --keys N --value-bytes B
//! ```
//! Prints a table, then one JSON object as the last line.
//!
//! Back of the envelope for 1,000,000 keys of 256 bytes: records are about 300
//! bytes, 12 to a 4 KiB leaf, so the load writes about 84,000 leaves (330 MiB);
//! at 1 GB/s of page cache writes plus one fdatasync per 1000 puts (~0.3 ms)
//! the load is CPU-bound near 1-2 µs per put. A point get is a key-index lookup
//! (~0.3 µs) plus three mmapped page reads with CRC checks (~0.3 µs each).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cairn_mvcc::*;

struct Args {
    dir: PathBuf,
    keys: u64,
    value_bytes: usize,
    soak_ops: Option<u64>,
    gets: usize,
}

fn usage() -> ! {
    eprintln!("usage: mvccbench --dir DIR [--keys N] [--value-bytes B] [--soak-ops N] [--gets N]");
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        dir: PathBuf::new(),
        keys: 1_000_000,
        value_bytes: 256,
        soak_ops: None,
        gets: 200_000,
    };
    let mut it = std::env::args().skip(1);
    let mut dir = None;
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--dir" => dir = Some(PathBuf::from(val())),
            "--keys" => a.keys = val().parse().unwrap_or_else(|_| usage()),
            "--value-bytes" => a.value_bytes = val().parse().unwrap_or_else(|_| usage()),
            "--soak-ops" => a.soak_ops = Some(val().parse().unwrap_or_else(|_| usage())),
            "--gets" => a.gets = val().parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    a.dir = dir.unwrap_or_else(|| usage());
    a
}

/// SplitMix64: a seeded generator so runs are repeatable.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("/bench/key/{i:010}").into_bytes()
}

const PUTS_PER_COMMIT: u64 = 1000;
const SOAK_KEYS: u64 = 10_000;
const SOAK_COMPACT_EVERY_REVS: i64 = 100_000;
const RANGE_KEYS: i64 = 1000;
const RANGE_RUNS: usize = 200;

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn main() {
    let args = parse_args();
    let cfg = Config::default();
    std::fs::create_dir_all(&args.dir).expect("create --dir");
    for shard in [0, 1] {
        let _ = std::fs::remove_file(Store::file_path(&args.dir, shard));
    }
    let mut rng = Rng(42);
    let value: Vec<u8> = (0..args.value_bytes).map(|_| rng.next() as u8).collect();

    // Load.
    let mut store = Store::open(&args.dir, 0, cfg.clone()).expect("open");
    let mut index = 0u64;
    let started = Instant::now();
    for i in 0..args.keys {
        index += 1;
        let op = Op::Put(PutRequest {
            key: key(i),
            value: value.clone(),
            ..PutRequest::default()
        });
        store.apply(index, &op).expect("put");
        if index.is_multiple_of(PUTS_PER_COMMIT) {
            store.commit().expect("commit");
        }
    }
    store.commit().expect("commit");
    // The last commit durable too, so the syncer is idle while gets are timed.
    store.sync().expect("sync");
    let load = started.elapsed();
    let put_per_sec = args.keys as f64 / load.as_secs_f64();
    let stats = store.commit_stats();

    // Point gets.
    let mut lat = Vec::with_capacity(args.gets);
    for _ in 0..args.gets {
        let k = key(rng.next() % args.keys);
        let t = Instant::now();
        let kv = store.get(&k).expect("get");
        let ns = t.elapsed().as_nanos() as u64;
        assert!(kv.is_some_and(|kv| kv.value.len() == args.value_bytes));
        lat.push(ns);
    }
    lat.sort_unstable();
    let get_p50_ns = percentile(&lat, 0.50);
    let get_p99_ns = percentile(&lat, 0.99);

    // Ranges of 1000 keys.
    let mut range_total = Duration::ZERO;
    for _ in 0..RANGE_RUNS {
        let start = rng.next() % args.keys.saturating_sub(RANGE_KEYS as u64).max(1);
        let t = Instant::now();
        let r = store
            .range(&RangeRequest {
                key: key(start),
                range_end: key(start + RANGE_KEYS as u64),
                limit: RANGE_KEYS,
                ..RangeRequest::default()
            })
            .expect("range");
        range_total += t.elapsed();
        assert_eq!(r.kvs.len() as i64, RANGE_KEYS);
    }
    let range_1000_keys_us = range_total.as_secs_f64() * 1e6 / RANGE_RUNS as f64;
    let file_bytes = store.size_bytes();

    // Reopen: index rebuild from the revision tree.
    drop(store);
    let t = Instant::now();
    let store = Store::open(&args.dir, 0, cfg.clone()).expect("reopen");
    let reopen_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(store.key_count() as u64, args.keys);
    drop(store);

    // Overwrite soak with periodic compaction.
    let soak_ops = args.soak_ops.unwrap_or(args.keys);
    let mut soak = Store::open(&args.dir, 1, cfg).expect("open soak");
    let mut index = 0u64;
    let mut last_compact = 0i64;
    let mut half = 0u64;
    let soak_started = Instant::now();
    for i in 0..soak_ops {
        index += 1;
        let op = Op::Put(PutRequest {
            key: key(rng.next() % SOAK_KEYS),
            value: value.clone(),
            ..PutRequest::default()
        });
        soak.apply(index, &op).expect("soak put");
        let rev = soak.current_revision();
        if rev - last_compact >= SOAK_COMPACT_EVERY_REVS {
            index += 1;
            soak.apply(index, &Op::Compact(CompactionRequest { revision: rev }))
                .expect("compact");
            last_compact = rev;
        }
        if index.is_multiple_of(PUTS_PER_COMMIT) {
            soak.commit().expect("soak commit");
        }
        if i + 1 == soak_ops / 2 {
            soak.commit().expect("soak commit");
            half = soak.size_bytes();
        }
    }
    soak.commit().expect("soak commit");
    let soak_secs = soak_started.elapsed().as_secs_f64();
    let soak_end = soak.size_bytes();
    let soak_in_use = soak.size_in_use_bytes();
    let defrag = soak.defragment().expect("defragment");

    println!(
        "mvccbench: {} keys x {} B values, {} puts per commit",
        args.keys, args.value_bytes, PUTS_PER_COMMIT
    );
    println!("{:<34} {:>16}", "figure", "value");
    println!("{:<34} {:>16.0}", "put_per_sec", put_per_sec);
    println!("{:<34} {:>16.1}", "load_secs", load.as_secs_f64());
    println!("{:<34} {:>16}", "commit_max_us", stats.max_commit_us);
    println!(
        "{:<34} {:>16}",
        "commit_avg_us",
        stats.total_commit_us / stats.commits.max(1)
    );
    println!("{:<34} {:>16}", "get_p50_ns", get_p50_ns);
    println!("{:<34} {:>16}", "get_p99_ns", get_p99_ns);
    println!("{:<34} {:>16.1}", "range_1000_keys_us", range_1000_keys_us);
    println!("{:<34} {:>16.1}", "reopen_ms", reopen_ms);
    println!("{:<34} {:>16}", "file_bytes", file_bytes);
    println!("{:<34} {:>16}", "soak_ops", soak_ops);
    println!("{:<34} {:>16.1}", "soak_secs", soak_secs);
    println!("{:<34} {:>16}", "soak_file_bytes_half", half);
    println!("{:<34} {:>16}", "soak_file_bytes_end", soak_end);
    println!("{:<34} {:>16}", "soak_in_use_bytes_end", soak_in_use);
    println!(
        "{:<34} {:>16}",
        "defrag_file_bytes_after", defrag.file_bytes_after
    );
    println!(
        "{{\"keys\":{},\"value_bytes\":{},\"put_per_sec\":{:.0},\"get_p50_ns\":{},\"get_p99_ns\":{},\"range_1000_keys_us\":{:.1},\"reopen_ms\":{:.1},\"file_bytes\":{},\"soak_ops\":{},\"soak_file_bytes_half\":{},\"soak_file_bytes_end\":{},\"soak_in_use_bytes_end\":{},\"defrag_file_bytes_after\":{},\"commit_max_us\":{}}}",
        args.keys,
        args.value_bytes,
        put_per_sec,
        get_p50_ns,
        get_p99_ns,
        range_1000_keys_us,
        reopen_ms,
        file_bytes,
        soak_ops,
        half,
        soak_end,
        soak_in_use,
        defrag.file_bytes_after,
        stats.max_commit_us
    );
}
