//! Durable-append benchmark for Cairn's WAL.
//!
//! `cargo run --release -p cairn-wal --example walbench -- --dir DIR --writers N
//!  --record-bytes B --seconds S [--backend uring|sync]`
//!
//! N writer tasks on one core each append one entry at a time (each to its own
//! shard) and wait for it to be durable; group commit lets their appends share
//! flushes. Prints a table and, as the last line, one JSON object.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_wal::{
    BackendChoice, Config, DirectIo, Record, SyncMode, SyncOptions, UringOptions, Wal,
};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Backend {
    Auto,
    Uring,
    Sync,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    Fdatasync,
    Linked,
    Dsync,
}

#[derive(Parser, Debug)]
#[command(about = "Measure durable appends per second and append-to-durable latency")]
struct Args {
    /// WAL directory (use the real disk, not tmpfs).
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 1)]
    writers: u64,
    /// Payload bytes per record (a 40-byte header is added).
    #[arg(long, default_value_t = 256)]
    record_bytes: usize,
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// io_uring durable-write submission.
    #[arg(long, value_enum, default_value_t = Mode::Linked)]
    sync_mode: Mode,
    /// Disable O_DIRECT.
    #[arg(long)]
    buffered: bool,
    /// Sync backend: pwrite/fdatasync inline on the core thread instead of the blocking pool.
    #[arg(long)]
    inline: bool,
    #[arg(long, default_value_t = 64)]
    segment_mib: u64,
}

/// Entries a writer keeps before releasing older ones, so segments recycle.
const RETAIN_ENTRIES: u64 = 1000;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    tokio::task::LocalSet::new().block_on(&rt, bench(args));
}

async fn bench(args: Args) {
    std::fs::create_dir_all(&args.dir).expect("create bench dir");
    let mut cfg = Config::new(&args.dir);
    cfg.segment_size_bytes = args.segment_mib << 20;
    cfg.spare_segments = 2;
    let direct = if args.buffered {
        DirectIo::Off
    } else {
        DirectIo::Auto
    };
    cfg.backend = match args.backend {
        Backend::Auto => BackendChoice::Auto,
        Backend::Uring => BackendChoice::Uring(UringOptions {
            direct,
            sync_mode: match args.sync_mode {
                Mode::Fdatasync => SyncMode::Fdatasync,
                Mode::Linked => SyncMode::LinkedFdatasync,
                Mode::Dsync => SyncMode::RwfDsync,
            },
            ..UringOptions::default()
        }),
        Backend::Sync => BackendChoice::Sync(SyncOptions {
            direct: !args.buffered,
            blocking_pool: !args.inline,
        }),
    };
    let (wal, rec) = Wal::open(cfg).await.expect("open wal");
    // Each run starts its shards past whatever an earlier run left behind.
    let base_index = rec
        .shards
        .values()
        .filter_map(|s| s.entries.last().map(|e| e.index))
        .max()
        .unwrap_or(0);
    let wal = Rc::new(wal);
    let payload = Bytes::from(vec![0xa5u8; args.record_bytes]);
    // Warm up: the first segment is zero-filled before its first flush.
    for w in 0..args.writers {
        wal.append(&[Record::Entry {
            shard: w,
            index: base_index + 1,
            term: 1,
            data: payload.clone(),
        }])
        .await
        .expect("warm-up append");
    }
    wal.settle().await;
    let m0 = wal.metrics();

    let latency = Rc::new(RefCell::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram"),
    ));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        let wal = wal.clone();
        let latency = latency.clone();
        let payload = payload.clone();
        tasks.push(tokio::task::spawn_local(async move {
            let mut index = base_index + 1;
            let mut n = 0u64;
            while Instant::now() < deadline {
                index += 1;
                let t0 = Instant::now();
                wal.append(&[Record::Entry {
                    shard: w,
                    index,
                    term: 1,
                    data: payload.clone(),
                }])
                .await
                .expect("append");
                latency
                    .borrow_mut()
                    .saturating_record(t0.elapsed().as_micros() as u64);
                n += 1;
                if index % RETAIN_ENTRIES == 0 {
                    wal.release(w, index - RETAIN_ENTRIES / 2);
                }
            }
            n
        }));
    }
    let mut appends = 0;
    for t in tasks {
        appends += t.await.expect("writer task");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let m = wal.metrics();
    let syncs = m.flushes - m0.flushes;
    let (p50_us, p99_us, p999_us) = {
        let lat = latency.borrow();
        (
            lat.value_at_quantile(0.5),
            lat.value_at_quantile(0.99),
            lat.value_at_quantile(0.999),
        )
    };
    let per_sec = appends as f64 / elapsed;
    let per_sync = appends as f64 / syncs.max(1) as f64;
    let backend = wal.backend();
    let mib_per_sec = (m.bytes_written - m0.bytes_written) as f64 / elapsed / (1 << 20) as f64;
    let zero_fill_mib_per_sec =
        (m.zero_fill_bytes - m0.zero_fill_bytes) as f64 / elapsed / (1 << 20) as f64;
    let spare_waits = m.spare_waits - m0.spare_waits;

    println!("walbench: {backend}");
    println!("{:<28} {:>14}", "writers", args.writers);
    println!("{:<28} {:>14}", "record bytes (payload)", args.record_bytes);
    println!("{:<28} {:>14.2}", "seconds", elapsed);
    println!("{:<28} {:>14}", "appends", appends);
    println!("{:<28} {:>14.0}", "appends/s", per_sec);
    println!("{:<28} {:>14}", "syncs", syncs);
    println!("{:<28} {:>14.2}", "appends/sync", per_sync);
    println!("{:<28} {:>14.1}", "written MiB/s", mib_per_sec);
    println!(
        "{:<28} {:>14.1}",
        "spare zero-fill MiB/s", zero_fill_mib_per_sec
    );
    println!(
        "{:<28} {:>14}",
        "rolls that waited for a spare", spare_waits
    );
    println!("{:<28} {:>14}", "append->durable p50 us", p50_us);
    println!("{:<28} {:>14}", "append->durable p99 us", p99_us);
    println!("{:<28} {:>14}", "append->durable p99.9 us", p999_us);
    println!(
        "{:<28} {:>14}",
        "flush p50 us",
        m.flush_latency_us.value_at_quantile(0.5)
    );
    println!(
        "{:<28} {:>14}",
        "flush p99 us",
        m.flush_latency_us.value_at_quantile(0.99)
    );
    let json = serde_json::json!({
        "backend": backend,
        "writers": args.writers,
        "record_bytes": args.record_bytes,
        "seconds": elapsed,
        "appends": appends,
        "appends_per_sec": per_sec,
        "syncs": syncs,
        "appends_per_sync": per_sync,
        "p50_us": p50_us,
        "p99_us": p99_us,
        "p999_us": p999_us,
        "flush_p50_us": m.flush_latency_us.value_at_quantile(0.5),
        "flush_p99_us": m.flush_latency_us.value_at_quantile(0.99),
        "written_mib_per_sec": mib_per_sec,
        "zero_fill_mib_per_sec": zero_fill_mib_per_sec,
        "spare_waits": spare_waits,
    });
    Rc::try_unwrap(wal)
        .ok()
        .expect("writers finished")
        .close()
        .await;
    println!("{json}");
}
