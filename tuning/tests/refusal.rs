//! Guards the lab's safety promises: it refuses a DIR that does not exist, is not a
//! directory or cannot be written, before creating anything; the binary says why and
//! exits non-zero; and on Ctrl-C it stops, removes its own files and nothing else.

mod common;

use cairn_tuning::error::LabError;
use cairn_tuning::safety::{LabDir, FILE_PREFIX};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cairn-tune");

#[test]
fn missing_dir_is_refused() {
    let dir = common::scratch_dir();
    let missing = dir.path().join("nope");
    assert!(matches!(
        LabDir::open(&missing),
        Err(LabError::DirMissing { .. })
    ));
    assert!(!missing.exists(), "the lab must not create DIR");
    let out = Command::new(BIN)
        .args(["run", "--quick", "--dir"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("does not exist") && stderr.contains("nope"),
        "{stderr}"
    );
    let out = Command::new(BIN)
        .args(["etcd-check", "--dir"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_file_is_not_a_dir() {
    let dir = common::scratch_dir();
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        LabDir::open(&file),
        Err(LabError::NotADirectory { .. })
    ));
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn unwritable_dir_is_refused() {
    // sysfs refuses new files even to root, unlike a chmod'ed directory.
    let sys = Path::new("/sys/kernel");
    if !sys.is_dir() {
        eprintln!("note: no /sys/kernel here; skipping");
        return;
    }
    match LabDir::open(sys) {
        Err(LabError::DirNotWritable { path, .. }) => assert_eq!(path, sys),
        other => panic!("expected DirNotWritable, got {other:?}"),
    }
    let out = Command::new(BIN)
        .args(["run", "--dir", "/sys/kernel"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not writable"));
}

#[test]
fn lab_removes_only_what_it_created() {
    let dir = common::scratch_dir();
    let theirs = dir.path().join(format!("{FILE_PREFIX}looks-like-ours"));
    std::fs::write(&theirs, b"keep").unwrap();
    let lab = LabDir::open(dir.path()).unwrap();
    let a = lab.file_path("dat");
    std::fs::write(&a, b"a").unwrap();
    let b = lab.file_path("wal");
    std::fs::create_dir(&b).unwrap();
    std::fs::write(b.join("segment"), b"b").unwrap();
    lab.remove(&a);
    assert!(!a.exists());
    drop(lab);
    assert!(!b.exists());
    assert_eq!(std::fs::read(&theirs).unwrap(), b"keep");
}

#[test]
fn ctrl_c_stops_the_run_and_cleans_up() {
    let dir = common::scratch_dir();
    std::fs::write(dir.path().join("operator-file"), b"keep").unwrap();
    let child = Command::new(BIN)
        .args(["run", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the lab has files in DIR, so the signal lands mid-experiment.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ours = std::fs::read_dir(dir.path()).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(FILE_PREFIX)
        });
        if ours || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill with a valid signal on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(rc, 0);
    let started = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the run did not stop promptly"
    );
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, vec!["operator-file".to_string()]);
}

#[test]
fn a_full_disk_is_one_rows_outcome() {
    // A 1 MiB tmpfs in a private mount namespace fills up without touching anyone
    // else's disk; an experiment's 32 MiB file cannot fit.
    let dir = common::scratch_dir();
    let script = format!(
        "mount -t tmpfs -o size=1m cairn-tune-full {d} && exec {bin} run --quick --json --dir {d} --only 'raw-pwrite buffered rwf_dsync prealloc=none'",
        d = dir.path().display(),
        bin = BIN
    );
    let out = match Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("note: unshare unavailable ({e}); skipping the full-disk run");
            return;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && (stderr.contains("mount") || stderr.contains("unshare")) {
        eprintln!(
            "note: cannot mount a private tmpfs here ({}); skipping",
            stderr.trim()
        );
        return;
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let rows = report["experiments"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{stdout}");
    assert_eq!(rows[0]["outcome"]["status"], "no-space", "{stdout}");
    assert!(
        stdout.contains("no space: no space left on the device"),
        "{stdout}"
    );
    assert!(report["no_recommendation"].is_string());
}
