//! Guards the backend seam itself: automatic selection picks io_uring here
//! and says so; every io_uring submission mode (write then fdatasync, linked
//! write + fdatasync, RWF_DSYNC) with and without O_DIRECT writes what reads
//! back after a reopen; and a runtime torn down with I/O in flight neither
//! frees buffers the kernel still uses nor hangs.

mod common;

use std::rc::Rc;

use cairn_wal::{BackendChoice, DirectIo, SyncMode, SyncOptions, UringOptions, Wal};
use common::{entry, run, Env, Kind};

#[test]
fn auto_selects_io_uring_when_available() {
    let env = Env::new(Kind::Uring);
    run(async {
        let mut cfg = env.config();
        cfg.backend = BackendChoice::Auto;
        let (wal, _) = Wal::open(cfg).await.expect("open");
        assert!(wal.backend().starts_with("uring"), "{}", wal.backend());
        wal.append(&[entry(1, 1, 1, 10)]).await.expect("append");
        wal.close().await;
    });
}

#[test]
fn preferring_io_uring_keeps_the_options_given() {
    let env = Env::new(Kind::Uring);
    run(async {
        let mut cfg = env.config();
        cfg.backend = BackendChoice::UringOr(
            UringOptions {
                sync_mode: SyncMode::RwfDsync,
                ..UringOptions::default()
            },
            SyncOptions::default(),
        );
        let (wal, _) = Wal::open(cfg).await.expect("open");
        assert!(wal.backend().starts_with("uring"), "{}", wal.backend());
        assert!(wal.backend().contains("RwfDsync"), "{}", wal.backend());
        wal.append(&[entry(1, 1, 1, 10)]).await.expect("append");
        wal.close().await;
    });
}

#[test]
fn every_submission_mode_round_trips() {
    let modes = [
        SyncMode::Fdatasync,
        SyncMode::LinkedFdatasync,
        SyncMode::RwfDsync,
    ];
    for sync_mode in modes {
        for direct in [DirectIo::Auto, DirectIo::Off] {
            let env = Env::new(Kind::Uring);
            let mut cfg = env.config();
            cfg.backend = BackendChoice::Uring(UringOptions {
                sync_mode,
                direct,
                ..UringOptions::default()
            });
            run(async {
                let (wal, _) = Wal::open(cfg.clone()).await.expect("open");
                let recs: Vec<_> = (1..=50)
                    .map(|i| entry(2, i, 1, (i * 97 % 3000) as usize))
                    .collect();
                for r in recs.chunks(7) {
                    wal.append(r).await.expect("append");
                }
                wal.close().await;
                let (wal, rec) = Wal::open(cfg.clone()).await.expect("reopen");
                let got = &rec.shards[&2].entries;
                assert_eq!(got.len(), 50, "{sync_mode:?} {direct:?}");
                assert_eq!(wal.entries(2, 1, 51).await.expect("read"), *got);
                wal.close().await;
            });
        }
    }
    // The sync backend's knobs as well.
    for opts in [
        SyncOptions {
            blocking_pool: false,
            direct: false,
        },
        SyncOptions {
            blocking_pool: true,
            direct: true,
        },
    ] {
        let env = Env::new(Kind::Sync);
        let mut cfg = env.config();
        cfg.backend = BackendChoice::Sync(opts);
        run(async {
            let (wal, _) = Wal::open(cfg.clone()).await.expect("open");
            wal.append(&[entry(1, 1, 1, 100), entry(1, 2, 1, 100)])
                .await
                .expect("append");
            wal.close().await;
            let (_, rec) = Wal::open(cfg.clone()).await.expect("reopen");
            assert_eq!(rec.shards[&1].entries.len(), 2, "{opts:?}");
        });
    }
}

#[test]
fn teardown_with_io_in_flight_is_safe() {
    let env = Env::new(Kind::Uring);
    for _ in 0..5 {
        run(async {
            let (wal, _) = Wal::open_with_storage(env.config(), env.storage())
                .await
                .expect("open");
            let wal = Rc::new(wal);
            for w in 0..8u64 {
                let wal = wal.clone();
                tokio::task::spawn_local(async move {
                    for i in 1.. {
                        if wal.append(&[entry(w, i, 1, 3000)]).await.is_err() {
                            break;
                        }
                    }
                });
            }
            // Let flushes get under way, then drop everything mid-flight.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        });
    }
    // Whatever was acknowledged or not, the log opens cleanly.
    run(async {
        let (wal, rec) = Wal::open_with_storage(env.config(), env.storage())
            .await
            .expect("open");
        assert!(!rec.shards.is_empty());
        wal.close().await;
    });
}

#[test]
fn a_directory_is_opened_by_one_log_at_a_time() {
    let env = Env::new(Kind::Sync);
    run(async {
        let (wal, _) = Wal::open(env.config()).await.expect("open");
        let err = Wal::open(env.config())
            .await
            .err()
            .expect("second open refused");
        assert!(matches!(err, cairn_wal::OpenError::Locked { .. }), "{err}");
        wal.close().await;
        let (wal, _) = Wal::open(env.config()).await.expect("open after close");
        wal.close().await;
    });
}

#[test]
fn a_core_ring_does_not_outlive_its_runtime() {
    // A ring kept alive past its runtime cannot be reaped any more; the next
    // runtime on the same thread must get a fresh one.
    let kept = run(async { cairn_wal::Uring::for_this_core().expect("ring") });
    let env = Env::new(Kind::Uring);
    run(async {
        let (wal, _) = Wal::open_with_storage(env.config(), env.storage())
            .await
            .expect("open");
        wal.append(&[entry(1, 1, 1, 10)])
            .await
            .expect("append on a fresh ring");
        wal.close().await;
    });
    drop(kept);
}
