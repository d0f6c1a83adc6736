//! `cairn-tune replicas` on a real disk: rounds with one member and with
//! several, each write counted once a majority has it durable, the appends
//! read back, the lab's files gone afterwards and the operator's left alone.

mod common;

use cairn_tuning::buf::{fill_pattern, AlignedBuf};
use cairn_tuning::engines::{prepare_file, verify_ring};
use cairn_tuning::model::Prealloc;
use cairn_tuning::replicas::{self, ReplicaEngine, BLOCK_BYTES};
use cairn_tuning::safety::{LabDir, FILE_PREFIX};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_cairn-tune");

fn lab_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(FILE_PREFIX))
        .collect()
}

#[test]
fn rounds_measure_majority_writes_and_read_them_back() {
    let dir = common::scratch_dir();
    let lab = LabDir::open(dir.path()).unwrap();
    for (engine, members) in [
        (ReplicaEngine::Uring, 1),
        (ReplicaEngine::Uring, 2),
        (ReplicaEngine::Uring, 3),
        (ReplicaEngine::Uring, 5),
        (ReplicaEngine::Pwrite, 1),
        (ReplicaEngine::Pwrite, 3),
    ] {
        let round = replicas::round(&lab, engine, members, Duration::from_millis(400)).unwrap();
        assert_eq!(round.members, members);
        assert!(round.writes > 0, "{members} members: no write counted");
        assert!(round.verified, "{members} members: read-back mismatch");
        // Every counted write was durable on a majority, the leader included.
        assert_eq!(round.appended.len(), members);
        assert_eq!(round.appended[0], round.writes, "the leader's own appends");
        let holding = round
            .appended
            .iter()
            .filter(|&&n| n >= round.writes)
            .count();
        assert!(
            holding > members / 2,
            "{members} members: only {holding} hold all {} writes: {:?}",
            round.writes,
            round.appended
        );
        let l = round.latency;
        assert!(
            0.0 < l.p50_us && l.p50_us <= l.p99_us && l.p99_us <= l.max_us,
            "{members} members: {l:?}"
        );
        assert!(
            lab_files(dir.path()).is_empty(),
            "{members} members: the round left {:?}",
            lab_files(dir.path())
        );
    }
}

#[test]
fn the_command_alternates_rounds_and_reports_medians() {
    let dir = common::scratch_dir();
    std::fs::write(dir.path().join("operator-file"), b"keep").unwrap();
    let out = Command::new(BIN)
        .args(["replicas", "--members", "3", "--secs", "1", "--rounds", "2"])
        .arg("--dir")
        .arg(dir.path())
        .arg("--json")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("| round | members |"), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let members: Vec<u64> = report["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["members"].as_u64().unwrap())
        .collect();
    assert_eq!(members, [1, 3, 1, 3]);
    assert_eq!(report["engine"].as_str(), Some("raw-uring"));
    assert_eq!(report["block_bytes"].as_u64(), Some(BLOCK_BYTES as u64));
    assert_eq!(report["alone"]["members"].as_u64(), Some(1));
    assert_eq!(report["replicated"]["members"].as_u64(), Some(3));
    for side in ["alone", "replicated"] {
        let m = &report[side];
        assert!(m["writes_per_sec"].as_f64().unwrap() > 0.0, "{m}");
        assert!(
            m["p50_us"].as_f64().unwrap() <= m["p99_us"].as_f64().unwrap(),
            "{m}"
        );
    }
    assert!(lab_files(dir.path()).is_empty());
    assert_eq!(
        std::fs::read(dir.path().join("operator-file")).unwrap(),
        b"keep"
    );
}

#[test]
fn member_counts_and_engines_outside_the_range_are_refused() {
    let dir = common::scratch_dir();
    for (flag, bad) in [
        ("--members", "0"),
        ("--members", "10"),
        ("--members", "three"),
        ("--engine", "glommio"),
        ("--secs", "0"),
    ] {
        let out = Command::new(BIN)
            .args(["replicas", flag, bad, "--dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(flag),
            "{flag} {bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(lab_files(dir.path()).is_empty());
}

/// A file written round and round reads back by its last lap: each block
/// holds the latest append that landed there, and a block of an older lap,
/// or a changed one, is a mismatch.
#[test]
fn a_ring_file_is_read_back_by_its_last_lap() {
    const BS: usize = 4096;
    const RING: u64 = 8 * BS as u64;
    let dir = common::scratch_dir();
    let path = dir.path().join("ring");
    prepare_file(&path, Prealloc::ZeroFill, RING).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let mut block = AlignedBuf::zeroed(BS);
    let mut write = |seq: u64| {
        fill_pattern(block.as_mut_slice(), seq);
        file.write_all_at(block.as_slice(), seq * BS as u64 % RING)
            .unwrap();
    };
    for seq in 0..20 {
        write(seq);
    }
    assert!(verify_ring(&path, BS, 20, RING).unwrap(), "appends 12..20");
    assert!(
        !verify_ring(&path, BS, 21, RING).unwrap(),
        "append 20 never landed: its block holds append 12"
    );
    write(20);
    assert!(verify_ring(&path, BS, 21, RING).unwrap());
    file.write_all_at(b"x", 5 * BS as u64 + 100).unwrap();
    assert!(
        !verify_ring(&path, BS, 21, RING).unwrap(),
        "append 13's block changed"
    );
}
