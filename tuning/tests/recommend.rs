//! Guards the recommendation logic: it must pick the fastest setting that is safe,
//! never one that failed its read-back, looks too fast to be durable, stalls more
//! than the default, or only wins by noise; it must compare with the default measured
//! the same way, refuse volatile disks, and emit a `[wal]` section whose keys and
//! values are exactly those Cairn's config file accepts.

mod common;

use cairn_tuning::model::{Engine, Experiment, IoMode, Outcome, SyncMode};
use cairn_tuning::recommend::{recommend, Backend, NoRecommendation, GAIN_PERCENT_MIN};
use common::*;

/// The keys and values the daemon's `[wal]` table accepts (src/config/mod.rs).
fn assert_config_section(toml_text: &str) -> toml::Table {
    let doc: toml::Table = toml::from_str(toml_text).expect("recommendation is valid TOML");
    let wal = doc["wal"].as_table().expect("a [wal] table");
    for key in wal.keys() {
        assert!(
            ["backend", "direct-io", "sync-mode", "segment-size-bytes"].contains(&key.as_str()),
            "key {key} is not accepted by Cairn's [wal] config"
        );
    }
    assert!(["auto", "uring", "sync"].contains(&wal["backend"].as_str().unwrap()));
    assert!(wal["direct-io"].is_bool());
    assert!(["fdatasync", "dsync", "linked"].contains(&wal["sync-mode"].as_str().unwrap()));
    wal.clone()
}

#[test]
fn picks_fastest_safe_setting_and_reports_gain_over_default() {
    let results = vec![
        result(
            wal(IoMode::Direct, SyncMode::RwfDsync),
            measured(5000.0, 400.0),
        ),
        result(
            wal(IoMode::Direct, SyncMode::Fdatasync),
            measured(8000.0, 300.0),
        ),
        result(
            wal(IoMode::Direct, SyncMode::Linked),
            measured(6000.0, 350.0),
        ),
        result(
            wal(IoMode::Buffered, SyncMode::RwfDsync),
            measured(4000.0, 500.0),
        ),
    ];
    let rec = recommend(&results, &disk()).unwrap();
    assert_eq!(rec.setting.backend, Backend::Uring);
    assert!(rec.setting.direct_io);
    assert_eq!(rec.setting.sync_mode, SyncMode::Fdatasync);
    assert!(
        (rec.gain_percent - 60.0).abs() < 1e-9,
        "{}",
        rec.gain_percent
    );
    assert_eq!(
        rec.default_experiment,
        wal(IoMode::Direct, SyncMode::RwfDsync).label()
    );
    let wal = assert_config_section(&rec.toml);
    assert_eq!(wal["sync-mode"].as_str(), Some("fdatasync"));
    assert_eq!(wal["direct-io"].as_bool(), Some(true));
    assert!(rec.toml.contains("+60.0%"), "{}", rec.toml);
}

#[test]
fn unsafe_and_failed_experiments_are_never_recommended() {
    let mut unverified = measured(20_000.0, 100.0);
    if let Outcome::Measured(m) = &mut unverified {
        m.verified = false;
    }
    let results = vec![
        result(
            wal(IoMode::Direct, SyncMode::RwfDsync),
            measured(5000.0, 400.0),
        ),
        result(wal(IoMode::Direct, SyncMode::Fdatasync), unverified),
        // 2 µs per durable append: the flush never reached the device.
        result(
            wal(IoMode::Direct, SyncMode::Linked),
            measured(500_000.0, 4.0),
        ),
        result(
            wal(IoMode::Buffered, SyncMode::Linked),
            Outcome::NoSpace {
                reason: "disk full".into(),
            },
        ),
        result(
            wal(IoMode::Buffered, SyncMode::Fdatasync),
            measured(7000.0, 380.0),
        ),
    ];
    let rec = recommend(&results, &disk()).unwrap();
    assert!(!rec.setting.direct_io);
    assert_eq!(rec.setting.sync_mode, SyncMode::Fdatasync);
}

#[test]
fn a_worse_tail_or_a_gain_within_noise_keeps_the_default() {
    let results = vec![
        result(
            wal(IoMode::Direct, SyncMode::RwfDsync),
            measured(5000.0, 400.0),
        ),
        // Faster on average but p99 three times worse.
        result(
            wal(IoMode::Direct, SyncMode::Fdatasync),
            measured(9000.0, 1200.0),
        ),
        // Faster, but by less than the noise threshold.
        result(
            wal(IoMode::Direct, SyncMode::Linked),
            measured(5000.0 * (1.0 + (GAIN_PERCENT_MIN - 1.0) / 100.0), 390.0),
        ),
    ];
    let rec = recommend(&results, &disk()).unwrap();
    assert_eq!(rec.setting.sync_mode, SyncMode::RwfDsync);
    assert!(rec.setting.direct_io);
    assert_eq!(rec.gain_percent, 0.0);
    assert_eq!(rec.rejected.len(), 2, "{:?}", rec.rejected);
    assert_config_section(&rec.toml);
}

#[test]
fn whole_wal_evidence_wins_over_backend_and_raw_loops() {
    let raw = Experiment {
        sync_mode: SyncMode::Fdatasync,
        ..cairn_tuning::matrix::base_for(Engine::RawUring)
    };
    let results = vec![
        result(
            wal(IoMode::Direct, SyncMode::RwfDsync),
            measured(5000.0, 400.0),
        ),
        result(
            wal(IoMode::Direct, SyncMode::Linked),
            measured(6000.0, 400.0),
        ),
        // The raw loop is faster, but it is not what Cairn runs.
        result(raw, measured(9000.0, 200.0)),
        result(
            Experiment {
                sync_mode: SyncMode::ODsync,
                ..cairn_tuning::matrix::base_for(Engine::TokioUring)
            },
            measured(20_000.0, 100.0),
        ),
    ];
    let rec = recommend(&results, &disk()).unwrap();
    assert_eq!(rec.setting.sync_mode, SyncMode::Linked);
    assert_eq!(
        assert_config_section(&rec.toml)["sync-mode"].as_str(),
        Some("linked")
    );
}

#[test]
fn without_io_uring_the_sync_backend_is_compared_with_its_fallback() {
    let unsupported = || Outcome::Unsupported {
        reason: "io_uring is not supported here: io_uring_setup failed".into(),
    };
    let sync = |io_mode| Experiment {
        io_mode,
        ..cairn_tuning::matrix::base_for(Engine::WalSync)
    };
    let results = vec![
        result(wal(IoMode::Direct, SyncMode::RwfDsync), unsupported()),
        result(wal(IoMode::Buffered, SyncMode::RwfDsync), unsupported()),
        result(sync(IoMode::Buffered), measured(3000.0, 600.0)),
        result(sync(IoMode::Direct), measured(4000.0, 500.0)),
    ];
    let rec = recommend(&results, &disk()).unwrap();
    assert_eq!(rec.setting.backend, Backend::Sync);
    assert!(rec.setting.direct_io);
    assert_eq!(rec.default_experiment, sync(IoMode::Buffered).label());
    let wal = assert_config_section(&rec.toml);
    assert_eq!(wal["backend"].as_str(), Some("sync"));
    assert_eq!(wal["sync-mode"].as_str(), Some("fdatasync"));
}

#[test]
fn volatile_disk_or_nothing_measured_gives_no_recommendation() {
    let results = vec![result(
        wal(IoMode::Direct, SyncMode::RwfDsync),
        measured(5000.0, 400.0),
    )];
    let mut tmpfs = disk();
    tmpfs.filesystem = "tmpfs".into();
    tmpfs.volatile = true;
    assert!(matches!(
        recommend(&results, &tmpfs),
        Err(NoRecommendation::VolatileDisk(_))
    ));
    let failed = vec![result(
        wal(IoMode::Direct, SyncMode::RwfDsync),
        Outcome::Failed {
            reason: "EIO".into(),
        },
    )];
    assert!(matches!(
        recommend(&failed, &disk()),
        Err(NoRecommendation::NothingSafe)
    ));
}

#[test]
fn confirmation_rounds_keep_a_real_gain_and_overturn_a_lucky_one() {
    use cairn_tuning::recommend::{apply_confirmation, DEFAULT_SETTINGS};
    let results = vec![
        result(
            wal(IoMode::Direct, SyncMode::RwfDsync),
            measured(5000.0, 400.0),
        ),
        result(
            wal(IoMode::Direct, SyncMode::Linked),
            measured(8000.0, 350.0),
        ),
    ];
    let first = recommend(&results, &disk()).unwrap();
    assert_eq!(first.setting.sync_mode, SyncMode::Linked);

    // The gain holds in two of three rounds (one round failed to run at all).
    let kept = apply_confirmation(
        first.clone(),
        DEFAULT_SETTINGS[0],
        &[Some(7000.0), Some(3000.0), Some(6600.0), None],
        &[Some(5000.0), Some(5000.0), Some(6000.0), Some(5000.0)],
        &disk(),
    );
    let c = kept.confirmation.as_ref().unwrap();
    assert!(c.confirmed);
    assert_eq!(c.candidate_appends_per_sec.len(), 3);
    assert!(
        (kept.gain_percent - 10.0).abs() < 1e-9,
        "{}",
        kept.gain_percent
    );
    assert_eq!(kept.setting.sync_mode, SyncMode::Linked);
    assert!(kept.toml.contains("median gain +10.0%"), "{}", kept.toml);

    // Re-measured side by side, the pick is no better: the default stays.
    let overturned = apply_confirmation(
        first,
        DEFAULT_SETTINGS[0],
        &[Some(5100.0), Some(4900.0), Some(5200.0)],
        &[Some(5000.0), Some(5000.0), Some(5000.0)],
        &disk(),
    );
    assert!(!overturned.confirmation.as_ref().unwrap().confirmed);
    assert_eq!(overturned.setting, DEFAULT_SETTINGS[0]);
    assert_eq!(overturned.gain_percent, 0.0);
    assert_eq!(overturned.experiment, overturned.default_experiment);
    let wal = assert_config_section(&overturned.toml);
    assert_eq!(wal["sync-mode"].as_str(), Some("dsync"));
    assert!(overturned
        .rejected
        .iter()
        .any(|r| r.contains("alternating rounds")));
}
