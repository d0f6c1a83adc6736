//! Patroni (Debian's `patroni`, PostgreSQL high availability) with its `etcd3`
//! DCS on a 3-member cluster, two nodes each running its own PostgreSQL: one
//! bootstraps and leads, the other streams from it; losing the Cairn member
//! the leader talks to does not cost the leader its lock; kill -9 of the
//! leader's Patroni and postmaster hands leadership to the other node, which
//! has the rows written through the old leader. Guards against gateway answers
//! (`/version`, member list, leases, transactions, watches) that Patroni's own
//! etcd v3 client would trip over, and against a leader key whose lease does
//! not expire when its owner dies.

use crate::common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::try_wait_until;

/// Patroni's leader lock TTL, loop and retry budget (seconds), short to keep
/// the test short; Patroni wants `loop_wait + 2 * retry_timeout <= ttl`.
const TTL_S: u64 = 10;
const LOOP_WAIT_S: u64 = 1;
const RETRY_TIMEOUT_S: u64 = 4;
const _: () = assert!(LOOP_WAIT_S + 2 * RETRY_TIMEOUT_S <= TTL_S);

/// Bootstrap (initdb, a base backup) and failover normally take seconds; this
/// bounds each on a busy 2-core machine.
const STEP_DEADLINE: Duration = Duration::from_secs(90);

const ROWS: i64 = 100;

/// Debian's newest PostgreSQL server binaries (`/usr/lib/postgresql/N/bin`).
fn postgres_bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin)
}

/// The uid and gid of the `postgres` account when running as root (PostgreSQL
/// refuses to run as root), None when already running as someone else.
fn postgres_account() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("postgres").unwrap();
    // SAFETY: getpwnam with a NUL-terminated name; the record is read at
    // once, before any other call that could overwrite it.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "running as root and there is no postgres account"
    );
    // SAFETY: pw is non-null and points at getpwnam's static record.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn chown(path: &Path, account: Option<(u32, u32)>) {
    if let Some((uid, gid)) = account {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
}

/// One Patroni node and the PostgreSQL it runs; both killed when dropped
/// (the postmaster runs in its own session, so by its pid file).
struct Node {
    name: String,
    dir: PathBuf,
    rest_port: u16,
    pg_port: u16,
    patroni: Option<Child>,
}

impl Node {
    fn start(
        name: &str,
        root: &Path,
        bin_dir: &Path,
        cairn_hosts: &str,
        account: Option<(u32, u32)>,
    ) -> Node {
        let dir = root.join(name);
        std::fs::create_dir(&dir).expect("node dir");
        chown(&dir, account);
        let (rest_port, pg_port) = (common::free_port(), common::free_port());
        let config = format!(
            r#"scope: cairn-test
namespace: /service/
name: {name}
restapi:
  listen: 127.0.0.1:{rest_port}
  connect_address: 127.0.0.1:{rest_port}
etcd3:
  hosts: {cairn_hosts}
bootstrap:
  dcs:
    ttl: {TTL_S}
    loop_wait: {LOOP_WAIT_S}
    retry_timeout: {RETRY_TIMEOUT_S}
    maximum_lag_on_failover: 1048576
    postgresql:
      use_pg_rewind: false
  initdb:
    - encoding: UTF8
    - no-sync
  pg_hba:
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
    - local all all trust
postgresql:
  listen: 127.0.0.1:{pg_port}
  connect_address: 127.0.0.1:{pg_port}
  data_dir: {dir}/data
  bin_dir: {bin_dir}
  pgpass: {dir}/pgpass
  authentication:
    replication: {{username: replicator, password: rep}}
    superuser: {{username: postgres, password: pg}}
  parameters:
    unix_socket_directories: {dir}
    fsync: "off"
"#,
            dir = dir.display(),
            bin_dir = bin_dir.display(),
        );
        let config_path = dir.join("patroni.yml");
        std::fs::write(&config_path, config).expect("write patroni.yml");
        chown(&config_path, account);
        let log = std::fs::File::create(dir.join("patroni.log")).expect("patroni log");
        let mut cmd = Command::new("patroni");
        cmd.arg(&config_path)
            .current_dir(&dir)
            .env("HOME", &dir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log);
        if let Some((uid, gid)) = account {
            cmd.uid(uid).gid(gid);
        }
        let patroni = cmd.spawn().expect("start patroni");
        Node {
            name: name.to_string(),
            dir,
            rest_port,
            pg_port,
            patroni: Some(patroni),
        }
    }

    fn patroni_pid(&self) -> Option<u32> {
        self.patroni.as_ref().map(Child::id)
    }

    /// The postmaster's pid, from its pid file, while it is a live postgres.
    fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline)
            .contains("postgres")
            .then_some(pid)
    }

    /// kill -9 of Patroni (and what it spawned in its process group) and of
    /// the postmaster.
    fn kill9(&mut self) {
        if let Some(mut child) = self.patroni.take() {
            // SAFETY: kill(2) on the process group our child leads.
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(pid) = self.postmaster_pid() {
            // SAFETY: kill(2) on the postmaster this node started.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }

    /// Patroni's REST answer status for `GET path`, None if it does not answer.
    fn rest_status(&self, path: &str) -> Option<u16> {
        self.rest_get(path).map(|(status, _)| status)
    }

    fn rest_get(&self, path: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.rest_port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        let status = answer.split_whitespace().nth(1)?.parse().ok()?;
        let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((status, body))
    }

    fn is_leader(&self) -> bool {
        self.rest_status("/leader") == Some(200)
    }

    /// Runs SQL through psql on this node's PostgreSQL; (succeeded, output).
    fn psql(&self, sql: &str) -> (bool, String) {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres"])
            .args(["-v", "ON_ERROR_STOP=1", "-tA", "-c", sql])
            .arg("-p")
            .arg(self.pg_port.to_string())
            .env("PGCONNECT_TIMEOUT", "5")
            .stdin(Stdio::null())
            .output()
            .expect("run psql");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text.trim().to_string())
    }

    fn count_rows(&self) -> Option<i64> {
        let (ok, out) = self.psql("SELECT count(*) FROM cairn_rows");
        if ok {
            out.parse().ok()
        } else {
            None
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("patroni.log")).unwrap_or_default()
    }
}

/// Whether `node`'s PostgreSQL has `rows` rows, for a wait.
fn has_rows(node: &Node, rows: i64) -> Result<(), String> {
    match node.count_rows() {
        Some(n) if n == rows => Ok(()),
        other => Err(format!("{} counts {other:?} rows", node.name)),
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The ports among `ports` that process `pid` has established TCP
/// connections to, with how many, busiest first (read from /proc: its socket
/// inodes, then the TCP table).
fn connected_ports(pid: u32, ports: &[u16]) -> Vec<(u16, usize)> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|target| {
                    let t = target.to_string_lossy().to_string();
                    Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let mut counts: Vec<(u16, usize)> = ports.iter().map(|&p| (p, 0)).collect();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(remote), Some(state), Some(inode)) = (f.get(2), f.get(3), f.get(9)) else {
            continue;
        };
        let port = remote
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok());
        // 01: TCP_ESTABLISHED.
        if *state != "01" || !inodes.contains(*inode) {
            continue;
        }
        if let Some(entry) = counts.iter_mut().find(|(p, _)| Some(*p) == port) {
            entry.1 += 1;
        }
    }
    counts.retain(|&(_, n)| n > 0);
    counts.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patroni_fails_over_on_cairn() {
    if !common::require_tool("patroni") || !common::require_tool("psql") {
        return;
    }
    let Some(bin_dir) = postgres_bin_dir() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "PostgreSQL is required under CI but /usr/lib/postgresql/*/bin is missing"
        );
        eprintln!("SKIP: PostgreSQL is not installed (apt-get install postgresql)");
        return;
    };
    let started = Instant::now();
    let mut cluster = common::Cluster::start(3, &[]);
    let mut c = common::client(&cluster.members[0].endpoint()).await;
    common::wait_writable(&mut c, "/patroni-ready").await;
    drop(c);

    let account = postgres_account();
    let root = tempfile::tempdir().expect("tempdir");
    chown(root.path(), account);
    let client_ports: Vec<u16> = cluster.members.iter().map(|m| m.client_port).collect();
    let hosts = client_ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes = [
        Node::start("node1", root.path(), &bin_dir, &hosts, account),
        Node::start("node2", root.path(), &bin_dir, &hosts, account),
    ];
    let context = |nodes: &[Node], cluster: &common::Cluster| {
        let mut text = String::new();
        for n in nodes {
            text += &format!("==== {} ====\n{}\n", n.name, n.log_text());
        }
        text + &cluster.logs()
    };

    // One node bootstraps and takes the leader key; the other follows it.
    let leader = try_wait_until("a Patroni leader", STEP_DEADLINE, || {
        nodes
            .iter()
            .position(Node::is_leader)
            .ok_or_else(|| "no node leads".to_string())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", context(&nodes, &cluster)));
    let replica = 1 - leader;
    eprintln!(
        "{} leads after {:.1} s",
        nodes[leader].name,
        started.elapsed().as_secs_f64()
    );
    let (ok, out) = nodes[leader].psql(&format!(
        "CREATE TABLE cairn_rows (n int); INSERT INTO cairn_rows SELECT generate_series(1, {ROWS})"
    ));
    assert!(ok, "writing through the leader: {out}");
    try_wait_until("the replica streaming the rows", STEP_DEADLINE, || {
        has_rows(&nodes[replica], ROWS)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", context(&nodes, &cluster)));
    // Patroni reports the replica healthy once its next loop has seen it.
    try_wait_until(
        "the replica reported healthy",
        STEP_DEADLINE,
        || match nodes[replica].rest_status("/replica") {
            Some(200) => Ok(()),
            other => Err(format!("GET /replica: {other:?}")),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", context(&nodes, &cluster)));

    // kill -9 the Cairn member the leader's Patroni talks to (any one of the
    // three leaves a quorum): Patroni moves to another and keeps its lock
    // past a whole TTL.
    let patroni_pid = nodes[leader].patroni_pid().expect("leader's patroni runs");
    // Patroni keeps its connection to Cairn open between its loops; a poll
    // rides over one being reopened.
    let (victim, used) = try_wait_until(
        &format!("{}'s Patroni connected to Cairn", nodes[leader].name),
        STEP_DEADLINE,
        || {
            let used = connected_ports(patroni_pid, &client_ports);
            match used
                .first()
                .and_then(|(port, _)| client_ports.iter().position(|c| c == port))
            {
                Some(victim) => Ok((victim, used)),
                None => Err(format!(
                    "pid {patroni_pid} has no connection to the client ports {client_ports:?}"
                )),
            }
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: the member it talks to is unknown, so losing it cannot be tested\n{}",
            context(&nodes, &cluster)
        )
    });
    eprintln!(
        "{} talks to Cairn ports (port, connections) {used:?}; killing {}",
        nodes[leader].name, cluster.members[victim].name
    );
    cluster.members[victim].kill9();
    let hold_until = Instant::now() + Duration::from_secs(TTL_S + 3);
    while Instant::now() < hold_until {
        assert_ne!(
            nodes[leader].rest_status("/leader"),
            Some(503),
            "{} lost the leader lock with one Cairn member down\n{}",
            nodes[leader].name,
            context(&nodes, &cluster)
        );
        assert_ne!(
            nodes[replica].rest_status("/leader"),
            Some(200),
            "{} took over while the leader was alive\n{}",
            nodes[replica].name,
            context(&nodes, &cluster)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(nodes[leader].is_leader());
    let (ok, out) = nodes[leader].psql("INSERT INTO cairn_rows VALUES (0)");
    assert!(
        ok,
        "writing through the leader after the member died: {out}"
    );
    try_wait_until("the replica streaming the last row", STEP_DEADLINE, || {
        has_rows(&nodes[replica], ROWS + 1)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", context(&nodes, &cluster)));

    // kill -9 the leader's Patroni and postmaster: its lease expires and the
    // replica promotes itself.
    let postmaster = nodes[leader].postmaster_pid();
    assert!(postmaster.is_some(), "no postmaster pid for the leader");
    nodes[leader].kill9();
    let killed = Instant::now();
    try_wait_until("the replica taking over", STEP_DEADLINE, || {
        if nodes[replica].is_leader() {
            Ok(())
        } else {
            Err("not the leader".into())
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", context(&nodes, &cluster)));
    eprintln!(
        "{} leads {:.1} s after the leader was killed (TTL {TTL_S} s)",
        nodes[replica].name,
        killed.elapsed().as_secs_f64()
    );
    // Promotion follows the leader key; wait until PostgreSQL takes writes.
    try_wait_until(
        "the new leader taking writes",
        STEP_DEADLINE,
        || match nodes[replica].psql("INSERT INTO cairn_rows VALUES (-1)") {
            (true, _) => Ok(()),
            (false, out) => Err(out),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", context(&nodes, &cluster)));
    assert_eq!(nodes[replica].count_rows(), Some(ROWS + 2));
    let (status, body) = nodes[replica].rest_get("/cluster").expect("GET /cluster");
    assert_eq!(status, 200, "{body}");
    let cluster_view: serde_json::Value = serde_json::from_str(&body).expect("cluster json");
    let leaders: Vec<&str> = cluster_view["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter(|m| m["role"] == "leader")
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(leaders, [nodes[replica].name.as_str()], "{body}");
    eprintln!(
        "patroni scenario took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
