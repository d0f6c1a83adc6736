//! Guards the `cairn-bench` command itself: `--json` prints exactly one JSON object
//! per run and nothing else on stdout, the human mode ends with that JSON line,
//! `compare` says plainly when a system cannot be measured, pauses the system
//! it is not measuring, and on Ctrl-C it stops every process it started and
//! removes its data directories.
//!
//! Needs `etcd` on PATH: without it these tests print a skip note, unless `CI` is
//! set, in which case they fail.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn_bench::{LocalCluster, System};

const BIN: &str = env!("CARGO_BIN_EXE_cairn-bench");

async fn single_etcd(dir: &Path) -> Option<LocalCluster> {
    if !cairn_bench::binary_available_or_skip(Path::new("etcd")) {
        return None;
    }
    let mut cluster =
        LocalCluster::start(System::Etcd, Path::new("etcd"), 1, dir).expect("start etcd");
    cluster
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("etcd serves");
    Some(cluster)
}

fn run(args: &[&str]) -> (String, String, i32) {
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run cairn-bench");
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
        out.status.code().unwrap_or(-1),
    )
}

#[tokio::test]
async fn json_mode_prints_one_object_and_human_mode_ends_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = single_etcd(dir.path()).await else {
        return;
    };
    let ep = etcd.endpoints_arg();

    let (stdout, stderr, code) = run(&["--endpoints", &ep, "--total", "50", "--json", "put"]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "stdout: {stdout}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(v["workload"], "put");
    assert_eq!(v["requests"], 50);
    assert_eq!(v["errors"], 0);
    for field in [
        "requests_per_sec",
        "avg_ms",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "p999_ms",
        "max_ms",
    ] {
        assert!(v[field].as_f64().is_some_and(|x| x > 0.0), "{field} in {v}");
    }
    assert!(
        stderr.is_empty(),
        "no progress bar without a terminal: {stderr}"
    );

    let (stdout, stderr, code) = run(&["--endpoints", &ep, "--total", "50", "range", "00000000"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("| p99.9 |"), "{stdout}");
    assert!(stdout.contains("excluded from all figures"), "{stdout}");
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["workload"], "range");

    let (_, stderr, code) = run(&["--endpoints", &ep, "--conns", "0", "put"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("--conns"), "{stderr}");
}

#[test]
fn compare_refuses_a_leader_that_is_no_member() {
    for (members, leader) in [("1", "1"), ("3", "3"), ("3", "first")] {
        let (stdout, stderr, code) = run(&[
            "compare",
            "--members",
            members,
            "--leader",
            leader,
            "--cairn-bin",
            "/nonexistent/cairn",
        ]);
        assert_ne!(code, 0, "--members {members} --leader {leader}: {stdout}");
        assert!(stderr.contains("--leader"), "{stderr}");
        assert!(stdout.is_empty(), "nothing measured: {stdout}");
    }
}

#[test]
fn compare_says_plainly_when_cairn_is_missing() {
    if !cairn_bench::binary_available_or_skip(Path::new("etcd")) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (stdout, stderr, code) = run(&[
        "--duration",
        "1s",
        "--warmup",
        "200ms",
        "compare",
        "--workloads",
        "put-1,range-s",
        "--cairn-bin",
        "/nonexistent/cairn",
        "--leader",
        "1",
        "--work-dir",
        work.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("cairn: NOT MEASURED"), "{stderr}");
    // Leadership moved to the second member before each run: the single
    // client's writes go through a follower.
    let progress: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("] put-1 on etcd"))
        .collect();
    assert!(
        !progress.is_empty() && progress.iter().all(|l| l.ends_with("(etcd1 leads)")),
        "{stderr}"
    );
    assert!(stdout.contains("cairn was NOT measured"), "{stdout}");
    let row = stdout
        .lines()
        .find(|l| l.starts_with("| put-1 |"))
        .expect("put-1 row");
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert!(
        cells[2].parse::<f64>().unwrap() > 0.0,
        "etcd req/s in {row}"
    );
    assert_eq!(cells[3], "-", "no cairn figure in {row}");
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["compare"][1]["workload"], "range-s");
    assert!(
        summary["compare"][1]["results"]["etcd"]["requests"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(summary["not_measured"]["cairn"].is_string());
    assert_eq!(summary["leader"], "1");
    // The members' CPU per request, for the system that ran.
    assert!(
        summary["compare"][0]["results"]["etcd"]["server_cpu_us_per_op"]
            .as_f64()
            .is_some_and(|us| us > 0.0),
        "etcd's CPU per request in {summary}"
    );
    assert!(stdout.contains("| workload | etcd CPU µs/op |"), "{stdout}");
    // With one system started there is nothing to pause, and the header and
    // summary say so.
    assert_eq!(summary["others_paused"], false);
    assert!(
        stdout.contains("every system running throughout"),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read_dir(work.path()).unwrap().count(),
        0,
        "data directories removed"
    );
}

/// Running processes (other than cairn-bench) whose command line names
/// `needle`: their command lines and /proc directories.
fn processes_with(needle: &str) -> Vec<(String, std::path::PathBuf)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) && !cmdline.starts_with(BIN) {
                found.push((cmdline, entry.path()));
            }
        }
    }
    found
}

/// Command lines of running processes (other than cairn-bench) naming `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    processes_with(needle).into_iter().map(|(c, _)| c).collect()
}

#[test]
fn compare_stops_every_member_on_ctrl_c() {
    if !cairn_bench::binary_available_or_skip(Path::new("etcd")) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let work_path = work.path().to_str().unwrap().to_owned();
    let mut child = Command::new(BIN)
        .args([
            "--duration",
            "60s",
            "compare",
            "--systems",
            "etcd",
            "--workloads",
            "put-1",
        ])
        .args(["--work-dir", &work_path])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drained to the end by a thread: a closed pipe would make cairn-bench's next
    // message fail.
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, lines) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = String::new();
    for line in lines.iter() {
        seen.push_str(&line);
        seen.push('\n');
        if line.starts_with("[1/1]") {
            break;
        }
    }
    assert!(seen.contains("etcd: 3 members serving"), "{seen}");
    assert_eq!(
        processes_mentioning(&work_path).len(),
        3,
        "three etcd members run"
    );
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "cairn-bench did not exit after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    reader.join().unwrap();
    seen.extend(lines.try_iter().map(|l| l + "\n"));
    assert_eq!(status.code(), Some(130), "{seen}");
    assert!(seen.contains("interrupted by SIGINT"), "{seen}");
    assert!(
        processes_mentioning(&work_path).is_empty(),
        "members left running"
    );
    assert_eq!(
        std::fs::read_dir(work.path()).unwrap().count(),
        0,
        "data directories removed"
    );
}

/// Scheduler state ('T' when stopped by SIGSTOP) of every member process whose
/// data lives under `work/<compare's scratch dir>/<system>/`.
fn member_states(work: &str, system: &str) -> Vec<char> {
    let root = format!("{work}/");
    processes_with(&root)
        .into_iter()
        .filter(|(cmdline, _)| {
            cmdline
                .split_once(&root)
                .is_some_and(|(_, rest)| rest.contains(&format!("/{system}/")))
        })
        .filter_map(|(_, dir)| {
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            let (_, rest) = stat.rsplit_once(')')?;
            rest.trim_start().chars().next()
        })
        .collect()
}

/// Kills the child if the test fails before it exits.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn compare_pauses_the_system_it_is_not_measuring() {
    if !cairn_bench::binary_available_or_skip(Path::new("etcd")) {
        return;
    }
    let Some(cairn) = cairn_bench::binaries::workspace_cairn_or_skip() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let work_path = work.path().to_str().unwrap().to_owned();
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args(["--duration", "4s", "--warmup", "200ms", "compare"])
            .args(["--members", "1", "--workloads", "put-1", "--runs", "2"])
            .args(["--cairn-bin", cairn.to_str().unwrap()])
            .args(["--work-dir", &work_path])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = BufReader::new(child.0.stderr.take().unwrap());
    let mut seen = String::new();
    let mut checked = Vec::new();
    for line in stderr.lines().map_while(Result::ok) {
        seen.push_str(&line);
        seen.push('\n');
        // "[n/4] put-1 on <system>": the other system is paused for this run.
        let Some(measured) = line
            .split_once("] put-1 on ")
            .and_then(|(_, rest)| rest.split(':').next())
        else {
            continue;
        };
        let other = if measured == "etcd" { "cairn" } else { "etcd" };
        // A member in the middle of a disk write shows 'D' until it stops.
        let deadline = Instant::now() + Duration::from_millis(2_000);
        let (running, idle) = loop {
            let running = member_states(&work_path, measured);
            let idle = member_states(&work_path, other);
            let isolated =
                running.len() == 1 && idle.len() == 1 && running[0] != 'T' && idle[0] == 'T';
            if isolated || Instant::now() >= deadline {
                break (running, idle);
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(running.len(), 1, "{measured} member: {running:?}\n{seen}");
        assert_eq!(idle.len(), 1, "{other} member: {idle:?}\n{seen}");
        assert_ne!(running[0], 'T', "{measured} runs while measured\n{seen}");
        assert_eq!(
            idle[0], 'T',
            "{other} is paused while {measured} is measured\n{seen}"
        );
        checked.push(measured.to_owned());
    }
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{seen}");
    assert!(!seen.contains("FAILED"), "{seen}");
    // Alternating order: etcd, cairn (resumed), cairn, etcd (resumed).
    assert_eq!(checked, ["etcd", "cairn", "cairn", "etcd"], "{seen}");
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.0.stdout.take().unwrap(), &mut stdout).unwrap();
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["others_paused"], true);
    let row = &summary["compare"][0];
    assert_eq!(row["failed"], serde_json::json!({}), "{summary}");
    for system in ["etcd", "cairn"] {
        assert!(
            row["results"][system]["requests"]
                .as_u64()
                .is_some_and(|n| n > 0),
            "{system} measured after being paused: {summary}"
        );
        assert_eq!(row["results"][system]["errors"], 0, "{summary}");
    }
}

#[test]
fn memory_reports_the_members_resident_memory_after_the_puts() {
    if !cairn_bench::binary_available_or_skip(Path::new("etcd")) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (stdout, stderr, code) = run(&[
        "memory",
        "--systems",
        "etcd",
        "--members",
        "1",
        "--puts",
        "2000",
        "--settle",
        "0s",
        "--work-dir",
        work.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let row = stdout
        .lines()
        .find(|l| l.starts_with("| etcd |"))
        .unwrap_or_else(|| panic!("no etcd row: {stdout}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(cells[3], "2000", "{row}");
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let etcd = &summary["memory"][0];
    assert_eq!(etcd["system"], "etcd");
    let after = etcd["resident_after_bytes"].as_u64().unwrap();
    let parts = etcd["anonymous_after_bytes"].as_u64().unwrap()
        + etcd["file_after_bytes"].as_u64().unwrap();
    assert!(after > 1 << 20, "{etcd}");
    // VmRSS is RssAnon + RssFile + RssShmem.
    assert!(parts <= after, "{etcd}");
    assert!(etcd["puts_per_sec"].as_f64().unwrap() > 0.0, "{etcd}");
    assert_eq!(
        std::fs::read_dir(work.path()).unwrap().count(),
        0,
        "memory left data behind"
    );
}
