//! A full disk: a member whose data directory runs out of space mid-load
//! (a small tmpfs), or whose WAL alone cannot write (ENOSPC through the
//! test-only disk fault file), fails what cannot be written, says so once per
//! shard, stays up and idle instead of spinning on the failure, and once
//! restarted with room holds every write it acknowledged. Guards against a daemon that
//! panics, busy-loops logging the same error, or loses acknowledged writes
//! when the disk fills.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::GetOptions;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size_mib` at `dir`; None where mounting is not
    /// allowed (not root, or a container without the capability).
    fn mount(dir: &Path, size_mib: u64) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(data_dir: &Path, log: &Path, client_port: u16, peer_port: u16, extra: &[&str]) -> Daemon {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["--name", "full", "--cores", "1", "--shards", "1"])
        .arg("--data-dir")
        .arg(data_dir)
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("full={peer}")])
        .args(["--wal-segment-size-bytes", &(4 << 20).to_string()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    Daemon(child)
}

/// CPU time (user + system) the process has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_shard_once_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_fs) = Tmpfs::mount(&dir.path().join("small"), 48) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "mounting a tmpfs is needed under CI"
        );
        eprintln!("SKIP: cannot mount a tmpfs here");
        return;
    };
    let data = dir.path().join("small").join("full.cairn");
    let log = dir.path().join("full.log");
    let (client_port, peer_port) = (common::free_port(), common::free_port());
    let endpoint = format!("http://127.0.0.1:{client_port}");
    let daemon = start(&data, &log, client_port, peer_port, &[]);
    let mut c = common::client(&endpoint).await;
    common::wait_writable(&mut c, "/full/ready").await;

    // Fill the disk: 8 KiB values until the member refuses writes.
    let value = "x".repeat(8 << 10);
    let mut acked = BTreeMap::new();
    let mut refused = None;
    for i in 0..20_000u32 {
        let key = format!("/full/{i:06}");
        match tokio::time::timeout(
            Duration::from_secs(10),
            c.put(key.clone(), value.clone(), None),
        )
        .await
        {
            Ok(Ok(_)) => {
                acked.insert(key, value.clone());
            }
            Ok(Err(e)) => {
                refused = Some(e.to_string());
                break;
            }
            Err(_) => {
                refused = Some("timed out".to_string());
                break;
            }
        }
    }
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let refused = refused.unwrap_or_else(|| panic!("48 MiB never filled:\n{}", text()));
    assert!(!acked.is_empty(), "{refused}\n{}", text());

    stays_up_and_idle(&daemon, &endpoint, &log, &refused).await;
    drop(daemon);

    // With room again, every acknowledged write is there.
    let roomy = dir.path().join("roomy.cairn");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&data)
        .arg(&roomy)
        .status()
        .unwrap();
    assert!(copied.success());
    // The same ports: the copy's member table names them.
    let _daemon = start(&roomy, &log, client_port, peer_port, &[]);
    let mut c = common::client(&endpoint).await;
    common::wait_writable(&mut c, "/after/ready").await;
    let got = c
        .get(
            "/full/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    let stored: Vec<&str> = got.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    let missing: Vec<&String> = acked
        .keys()
        .filter(|k| !stored.contains(&k.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged writes lost, e.g. {:?}\n{}",
        missing.len(),
        acked.len(),
        missing.first(),
        text()
    );
}

/// A member whose shard failed stays up, idle (no spinning on the failure),
/// reports the failure once, and still answers Status.
async fn stays_up_and_idle(daemon: &Daemon, endpoint: &str, log: &Path, refused: &str) {
    let text = || std::fs::read_to_string(log).unwrap_or_default();
    let pid = daemon.0.id();
    std::thread::sleep(Duration::from_secs(1));
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(pid) - before;
    let ticks_per_s = 100; // USER_HZ on Linux
    assert!(
        used < ticks_per_s * 3 / 2,
        "{used} ticks of CPU in 3 s after the disk filled ({refused}):\n{}",
        text()
    );
    let log_text = text();
    assert!(
        log_text.matches("shard failed").count() <= 1,
        "one failure report per shard:\n{log_text}"
    );
    assert!(!log_text.contains("panicked"), "{log_text}");
    let mut probe = common::client(endpoint).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while probe.status().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "status never answered:\n{}",
            text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The WAL itself full (ENOSPC on its writes, through the test-only disk
/// fault file) while a write is queued: the shard fails once, drops the
/// queued write with an error, does not spin on the poisoned WAL, and after
/// a restart with room holds every write it acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_wal_fails_the_shard_once_without_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("wal-full.cairn");
    let log = dir.path().join("wal-full.log");
    let faults = ["--test-disk-faults", "faults"];
    let (client_port, peer_port) = (common::free_port(), common::free_port());
    let endpoint = format!("http://127.0.0.1:{client_port}");
    let daemon = start(&data, &log, client_port, peer_port, &faults);
    let mut c = common::client(&endpoint).await;
    common::wait_writable(&mut c, "/walfull/ready").await;
    let mut acked = Vec::new();
    for i in 0..50 {
        let key = format!("/walfull/{i:03}");
        c.put(key.clone(), "v", None).await.unwrap();
        acked.push(key);
    }
    common::replace_file(&data.join("faults"), "full");
    let refused = match tokio::time::timeout(
        Duration::from_secs(10),
        c.put("/walfull/refused", "v", None),
    )
    .await
    {
        Ok(Ok(_)) => panic!("a put was acknowledged on a full WAL"),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("a put on a full WAL got no answer in 10 s"),
    };
    assert!(refused.contains("disk full"), "{refused}");
    stays_up_and_idle(&daemon, &endpoint, &log, &refused).await;
    drop(daemon);

    common::replace_file(&data.join("faults"), "none");
    let _daemon = start(&data, &log, client_port, peer_port, &faults);
    let mut c = common::client(&endpoint).await;
    common::wait_writable(&mut c, "/walfull/after").await;
    for key in &acked {
        let got = c.get(key.as_str(), None).await.unwrap();
        assert_eq!(got.kvs().len(), 1, "acknowledged {key} lost");
    }
}
