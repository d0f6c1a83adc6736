//! Guards the matrix and its driver: the matrix covers every dimension the lab
//! promises (engines, I/O modes, durability mechanisms, preallocation, block size,
//! queue depth, writers and flush size) without duplicates; the driver measures each
//! experiment in its own file, checks the bytes read back, reports an unsupported
//! mode (O_DIRECT on tmpfs) or a full disk as that experiment's outcome without
//! stopping the run, and leaves nothing of its own behind.

mod common;

use cairn_tuning::engines::RunLimits;
use cairn_tuning::error::ExperimentError;
use cairn_tuning::matrix::{base_for, build_matrix, run_matrix};
use cairn_tuning::model::{Engine, Experiment, IoMode, Outcome, Prealloc, SyncMode};
use cairn_tuning::safety::LabDir;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

const TINY: RunLimits = RunLimits {
    duration: Duration::from_millis(40),
    file_size_bytes: 1 << 20,
};

#[test]
fn matrix_covers_every_dimension_once() {
    for quick in [true, false] {
        let m = build_matrix(quick);
        let unique: HashSet<_> = m.iter().collect();
        assert_eq!(
            unique.len(),
            m.len(),
            "duplicate experiments (quick={quick})"
        );
        for engine in Engine::ALL {
            for io in [IoMode::Buffered, IoMode::Direct] {
                for &sync in engine.sync_modes() {
                    assert!(
                        m.iter()
                            .any(|e| e.engine == engine && e.io_mode == io && e.sync_mode == sync),
                        "{engine} {io:?} {sync:?} missing (quick={quick})"
                    );
                }
            }
        }
        for sync in SyncMode::ALL {
            assert!(m.iter().any(|e| e.sync_mode == sync));
        }
        for p in Prealloc::ALL {
            assert!(m.iter().any(|e| e.prealloc == p));
        }
        assert!(
            m.iter()
                .map(|e| e.block_size_bytes)
                .collect::<HashSet<_>>()
                .len()
                >= 3
        );
        assert!(
            m.iter()
                .map(|e| e.queue_depth)
                .collect::<HashSet<_>>()
                .len()
                >= 3
        );
        assert!(m.iter().any(|e| e.writers == 1) && m.iter().any(|e| e.writers == 256));
        assert!(
            m.iter()
                .filter(|e| e.engine.is_wal())
                .map(|e| e.batch_max_bytes)
                .collect::<HashSet<_>>()
                .len()
                >= 2
        );
        // Only io_uring engines get a queue depth, only the WAL writers and flush sizes.
        for e in &m {
            assert!(
                e.queue_depth == 1 || e.engine.supports_queue_depth(),
                "{}",
                e.label()
            );
            assert!(e.writers == 1 || e.engine.is_wal(), "{}", e.label());
            assert_eq!(e.batch_max_bytes == 0, !e.engine.is_wal(), "{}", e.label());
            assert!(
                e.engine.sync_modes().contains(&e.sync_mode),
                "{}",
                e.label()
            );
        }
    }
    assert!(build_matrix(true).len() < build_matrix(false).len());
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn driver_measures_each_engine_and_leaves_only_what_was_there() {
    let dir = common::scratch_dir();
    std::fs::write(dir.path().join("operator-file"), b"not the lab's").unwrap();
    let before = listing(dir.path());
    let lab = LabDir::open(dir.path()).unwrap();
    let experiments: Vec<Experiment> = vec![
        base_for(Engine::RawPwrite),
        Experiment {
            io_mode: IoMode::Buffered,
            prealloc: Prealloc::None,
            ..base_for(Engine::RawPwrite)
        },
        Experiment {
            sync_mode: SyncMode::RwfDsync,
            queue_depth: 4,
            ..base_for(Engine::RawUring)
        },
        Experiment {
            sync_mode: SyncMode::Linked,
            prealloc: Prealloc::Fallocate,
            ..base_for(Engine::RawUring)
        },
        base_for(Engine::BackendUring),
        base_for(Engine::BackendSync),
        Experiment {
            writers: 8,
            block_size_bytes: 256,
            batch_max_bytes: 16 << 10,
            ..base_for(Engine::WalUring)
        },
        Experiment {
            io_mode: IoMode::Buffered,
            writers: 2,
            ..base_for(Engine::WalSync)
        },
    ];
    let mut seen = 0;
    let results = run_matrix(&lab, &experiments, &TINY, |i, r| {
        assert_eq!(i, seen);
        seen += 1;
        assert_eq!(r.experiment, experiments[i]);
    });
    assert_eq!(results.len(), experiments.len());
    let on_tmpfs = lab.facts().volatile;
    for r in &results {
        match &r.outcome {
            Outcome::Measured(m) => {
                assert!(m.appends > 0, "{}: no appends", r.label);
                assert!(m.verified, "{}: read-back failed", r.label);
                assert!(
                    m.syncs > 0 && m.syncs <= m.appends,
                    "{}: {} syncs",
                    r.label,
                    m.syncs
                );
                let l = &m.latency;
                assert!(
                    l.p50_us > 0.0 && l.p50_us <= l.p99_us && l.p99_us <= l.max_us,
                    "{}: {l:?}",
                    r.label
                );
                assert!(!m.cdf.is_empty());
                // Only the whole WAL prepares space while the clock runs.
                if !r.experiment.engine.is_wal() {
                    assert_eq!(m.zero_fill_bytes, 0, "{}", r.label);
                }
            }
            Outcome::Unsupported { reason }
                if r.experiment.io_mode == IoMode::Direct && on_tmpfs =>
            {
                assert!(reason.contains("O_DIRECT"), "{reason}");
            }
            Outcome::Unsupported { reason }
                if r.experiment.engine.uses_io_uring() && reason.contains("io_uring") => {}
            other => panic!("{}: unexpected outcome {other:?}", r.label),
        }
    }
    // Group commit: 8 writers share flushes.
    if let Some(m) = results[6].outcome.measurement() {
        assert!(
            m.syncs < m.appends,
            "8 writers never shared a flush: {} syncs for {} appends",
            m.syncs,
            m.appends
        );
    }
    drop(lab);
    assert_eq!(listing(dir.path()), before);
}

#[test]
fn tmpfs_is_measured_per_experiment_but_never_recommended() {
    let shm = Path::new("/dev/shm");
    let Ok(lab) = LabDir::open(shm) else {
        eprintln!("note: /dev/shm is not usable here; skipping the tmpfs case");
        return;
    };
    if !lab.facts().volatile {
        eprintln!("note: /dev/shm is not tmpfs here; skipping the tmpfs case");
        return;
    }
    let experiments = vec![
        base_for(Engine::RawUring),
        Experiment {
            io_mode: IoMode::Buffered,
            ..base_for(Engine::RawPwrite)
        },
        base_for(Engine::WalUring),
        base_for(Engine::BackendSync),
    ];
    let results = run_matrix(&lab, &experiments, &TINY, |_, _| {});
    // Kernels before 6.6 refuse O_DIRECT on tmpfs; later ones accept it. Either
    // way the run goes on and the answer is this experiment's alone.
    for i in [0, 2, 3] {
        match &results[i].outcome {
            Outcome::Unsupported { reason } => assert!(reason.contains("O_DIRECT"), "{reason}"),
            Outcome::Measured(m) => assert!(m.verified),
            other => panic!(
                "{}: expected unsupported or measured, got {other:?}",
                results[i].label
            ),
        }
    }
    assert!(
        results[1].outcome.measurement().is_some(),
        "{:?}",
        results[1].outcome
    );
    let rec = cairn_tuning::recommend::recommend(&results, lab.facts());
    assert!(rec.is_err(), "tmpfs must never get a recommendation");
}

#[test]
fn io_errors_map_to_per_experiment_outcomes() {
    let path = Path::new("/data/seg");
    let full = ExperimentError::from_io(
        "pwrite",
        path,
        8192,
        std::io::Error::from_raw_os_error(libc::ENOSPC),
    );
    assert!(full.to_string().contains("/data/seg") && full.to_string().contains("8192"));
    assert!(matches!(full.into_outcome(), Outcome::NoSpace { .. }));
    let direct = ExperimentError::from_mode_io(
        "open",
        "O_DIRECT",
        path,
        0,
        std::io::Error::from_raw_os_error(libc::EINVAL),
    );
    match direct.into_outcome() {
        Outcome::Unsupported { reason } => assert!(reason.contains("O_DIRECT")),
        other => panic!("{other:?}"),
    }
    let eio = ExperimentError::from_io(
        "fdatasync",
        path,
        0,
        std::io::Error::from_raw_os_error(libc::EIO),
    );
    assert!(matches!(eio.into_outcome(), Outcome::Failed { .. }));
}

/// Forbids io_uring_setup (syscall 425 on every Linux architecture) to the calling
/// thread and the threads it starts, as a container's seccomp profile does.
fn forbid_io_uring_on_this_thread() {
    const IO_URING_SETUP_NR: u32 = 425;
    let filter = [
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0, // seccomp_data.nr
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: IO_URING_SETUP_NR,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with valid arguments; `prog` and `filter` outlive the call (the
    // kernel copies the program); without TSYNC the filter binds this thread only.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        let rc = libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        );
        assert_eq!(rc, 0, "seccomp: {}", std::io::Error::last_os_error());
    }
}

#[test]
fn io_uring_forbidden_is_reported_per_engine_and_the_sync_engines_still_run() {
    let dir = common::scratch_dir();
    let path = dir.path().to_path_buf();
    let results = std::thread::spawn(move || {
        forbid_io_uring_on_this_thread();
        let lab = LabDir::open(&path).unwrap();
        let experiments: Vec<Experiment> = [
            Engine::RawUring,
            Engine::BackendUring,
            Engine::WalUring,
            Engine::TokioUring,
            Engine::Glommio,
            Engine::RawPwrite,
            Engine::BackendSync,
            Engine::WalSync,
        ]
        .into_iter()
        .map(|engine| Experiment {
            io_mode: IoMode::Buffered,
            ..base_for(engine)
        })
        .collect();
        run_matrix(&lab, &experiments, &TINY, |_, _| {})
    })
    .join()
    .unwrap();
    for r in &results {
        if r.experiment.engine.uses_io_uring() {
            match &r.outcome {
                Outcome::Unsupported { reason } => {
                    let why = reason.to_lowercase();
                    assert!(
                        why.contains("io_uring")
                            || why.contains("glommio")
                            || why.contains("operation not permitted"),
                        "{}: {reason}",
                        r.label
                    );
                }
                other => panic!("{}: expected unsupported, got {other:?}", r.label),
            }
        } else {
            assert!(
                r.outcome.measurement().is_some(),
                "{}: {:?}",
                r.label,
                r.outcome
            );
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
