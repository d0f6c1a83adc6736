//! Test harness: real `cairn` processes on 127.0.0.1 with free ports and
//! temporary data directories, stopped (kill -9) when the harness is dropped.

pub mod keyspace;
pub mod membership;
pub mod raw_h2;
pub mod tls;

pub use membership::{add_learner, etcdctl_when_healthy, remove_member};

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How often [`wait_until`] and [`eventually`] look again: often enough
/// that a wait ends soon after its condition holds, rarely enough that a
/// poll running etcdctl does not load the busy machine.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Polls `check` every [`POLL_INTERVAL`] until it returns `Ok`, for at most
/// `within`; otherwise the error names `what` and the last state `check`
/// described, for the caller to add the members' logs. `check` runs at
/// least once, even if the time is up.
pub fn try_wait_until<T>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() >= deadline => {
                return Err(format!("{what}: not within {within:?}; last: {last}"))
            }
            Err(_) => std::thread::sleep(POLL_INTERVAL),
        }
    }
}

/// [`try_wait_until`] that panics when the time is up.
pub fn wait_until<T>(what: &str, within: Duration, check: impl FnMut() -> Result<T, String>) -> T {
    try_wait_until(what, within, check).unwrap_or_else(|e| panic!("{e}"))
}

/// The async twin of [`wait_until`]: polls `check` until it returns `Ok`,
/// for at most `within`; panics with `what` and the last state `check`
/// described otherwise.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) => assert!(
                Instant::now() < deadline,
                "{what}: not within {within:?}; last: {last}"
            ),
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Writes a file as an operator replacing a file a running member reads
/// should (a rotated certificate, a fault to inject): a new file renamed
/// over the old one, so the member never reads half of it.
pub fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("writing {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path)
        .unwrap_or_else(|e| panic!("renaming {} to {}: {e}", tmp.display(), path.display()));
}

/// The shard counts the tests of transactions over several shards run at
/// (`tests/daemon_cross_txn.rs`, `etcdctl_recipes`' txn test): the
/// comma-separated list in `CAIRN_XTXN_SHARDS` (`CAIRN_XTXN_SHARDS=4`,
/// `=1,2,4,8`), else `default`.
pub fn xtxn_shard_counts(default: &[usize]) -> Vec<usize> {
    let Ok(text) = std::env::var("CAIRN_XTXN_SHARDS") else {
        return default.to_vec();
    };
    let counts: Vec<usize> = text
        .split(',')
        .map(|s| match s.trim().parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => panic!("CAIRN_XTXN_SHARDS={text}: `{s}` is not a shard count (1 or more)"),
        })
        .collect();
    counts
}

pub fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("bind an ephemeral port")
            .local_addr()
            .expect("local addr")
            .port();
        if claim(port) {
            return port;
        }
    }
}

/// Claims `port` for this test process until it exits, so that no other
/// test (in this process or in another test binary running at once) is
/// handed it too: a lock on a file named after the port. A port found free
/// is not yet bound by the member it is for, and two tests picking the same
/// one would start two members on one port.
///
/// The files of processes that have exited are removed (once per process,
/// before its first claim): a file is removed only while locked by the
/// remover, and a claim holds only a lock on the file still at its path, so
/// a claim racing a removal locks the new file or tries again.
fn claim(port: u16) -> bool {
    static CLAIMED: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let dir = std::env::temp_dir().join("cairn-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    SWEPT.call_once(|| remove_unheld_claims(&dir));
    let path = dir.join(port.to_string());
    loop {
        let Some(file) = open_claim_file(&path) else {
            // No lock files here: fall back to the bind check alone.
            return true;
        };
        if !try_lock(&file) {
            return false;
        }
        if still_at(&file, &path) {
            CLAIMED.lock().unwrap_or_else(|e| e.into_inner()).push(file);
            return true;
        }
        // Removed (and perhaps made anew) between our open and our lock.
    }
}

/// Opens (or makes) the claim file at `path`.
pub fn open_claim_file(path: &Path) -> Option<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()
}

/// Takes the file's exclusive lock without waiting; false if another
/// descriptor holds it.
pub fn try_lock(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: flock(2) on a descriptor `file` owns; no memory is passed.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Whether `path` still names the file open as `file`.
fn still_at(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
        _ => false,
    }
}

/// Removes the claim files no process holds (their claimers have exited).
pub fn remove_unheld_claims(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else {
            continue;
        };
        if try_lock(&file) && still_at(&file, &path) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// A free loopback port below the kernel's ephemeral range: no outgoing
/// connection takes it as its source port, so a member killed and restarted
/// finds its ports free again.
pub fn restartable_port() -> u16 {
    use rand::Rng;
    let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    if ephemeral_low <= 12_000 {
        return free_port();
    }
    let mut rng = rand::thread_rng();
    loop {
        let port = rng.gen_range(10_000..ephemeral_low);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && claim(port) {
            return port;
        }
    }
}

/// Whether an external tool is on PATH; under CI (`CI` set) a missing tool is a
/// failure, elsewhere the test says it skips.
pub fn require_tool(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !found {
        if std::env::var_os("CI").is_some() {
            panic!("{tool} is required under CI but is not installed");
        }
        eprintln!(
            "SKIP: {tool} is not installed (.ci/run installs the Debian packages the tests drive)"
        );
    }
    found
}

/// Runs etcdctl (API 3) against `endpoint`; (succeeded, stdout + stderr).
pub fn etcdctl(endpoint: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--command-timeout=20s")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run etcdctl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A real single-member etcd on free loopback ports, its data and log
/// (`etcd.log`) in a temporary directory; killed when dropped.
pub struct Etcd {
    child: Child,
    pub endpoint: String,
    pub dir: tempfile::TempDir,
}

impl Etcd {
    pub fn start() -> Etcd {
        Etcd::start_with("http", &[])
    }

    /// etcd serving clients on `scheme` ("http" or "https") URLs, with
    /// `extra` flags (its TLS files, say).
    pub fn start_with(scheme: &str, extra: &[String]) -> Etcd {
        let dir = tempdir();
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("{scheme}://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd log");
        let child = Command::new("etcd")
            .arg("--name")
            .arg("m0")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(&endpoint)
            .arg("--advertise-client-urls")
            .arg(&endpoint)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(format!("m0={peer_url}"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .expect("start etcd");
        Etcd {
            child,
            endpoint,
            dir,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Member {
    pub name: String,
    pub client_port: u16,
    /// The port the member listens on for peers.
    pub peer_port: u16,
    /// The port its peer URL names: `peer_port`, or a proxy in front of it.
    pub advertised_peer_port: u16,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    extra_args: Vec<String>,
    extra_env: Vec<(String, String)>,
    initial_cluster: String,
    /// "http" or "https", for both ports.
    scheme: &'static str,
}

impl Member {
    pub fn endpoint(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.client_port)
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open member log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cairn"));
        cmd.arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(self.endpoint())
            .arg("--advertise-client-urls")
            .arg(self.endpoint())
            .arg("--listen-peer-urls")
            .arg(format!("{}://127.0.0.1:{}", self.scheme, self.peer_port))
            .arg("--initial-advertise-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-cluster")
            .arg(&self.initial_cluster)
            .arg("--initial-cluster-token")
            .arg("cairn-test")
            .args(&self.extra_args)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log);
        self.child = Some(cmd.spawn().expect("start cairn"));
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id while the member runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` (e.g. SIGSTOP, SIGCONT) to the running member.
    pub fn signal(&self, signal: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on the pid of a child we own and have not reaped.
            unsafe {
                libc::kill(pid as i32, signal);
            }
        }
    }

    /// kill -9: no chance to sync or say goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait for a clean exit; returns its exit status code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!("{} did not exit within 20 s of SIGTERM", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "{} is still running", self.name);
        self.spawn();
    }

    /// Waits for the process to exit by itself; its exit code, or None if it
    /// is still running after `timeout` (it is left running).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            let c = self.child.as_mut()?;
            if let Some(status) = c.try_wait().expect("wait") {
                self.child = None;
                return Some(status.code().unwrap_or(-1));
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs the binary once more with this member's flags and waits for it to
    /// exit: for starts that must be refused. Returns (exit code, the output
    /// of this run alone: the log file also holds earlier runs').
    pub fn start_expecting_refusal(&mut self) -> (i32, String) {
        assert!(self.child.is_none(), "{} is still running", self.name);
        let earlier = self.log_text().len();
        self.spawn();
        let code = self
            .wait_exit(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{} kept running", self.name));
        let log = self.log_text();
        (code, log.get(earlier..).unwrap_or(&log).to_string())
    }

    /// kill -9, then starts the member again with crash point `point` armed:
    /// it kills itself `delay_ms` after reaching it (`CAIRN_CRASH_AT`,
    /// `CAIRN_CRASH_DELAY_MS`), its other threads going on meanwhile.
    pub fn restart_armed(&mut self, point: &str, delay_ms: u64) {
        self.kill9();
        self.set_env(&[
            ("CAIRN_CRASH_AT", point),
            ("CAIRN_CRASH_DELAY_MS", &delay_ms.to_string()),
        ]);
        self.restart();
    }

    /// Replaces the extra environment the member is started with.
    pub fn set_env(&mut self, env: &[(&str, &str)]) {
        self.extra_env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// Replaces the extra flags the member is started with.
    pub fn set_args(&mut self, args: &[&str]) {
        self.extra_args = args.iter().map(|s| s.to_string()).collect();
    }

    pub fn peer_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.advertised_peer_port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

pub struct Cluster {
    pub members: Vec<Member>,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` members with `extra` flags each (e.g. `--shards 4`).
    pub fn start(n: usize, extra: &[&str]) -> Cluster {
        Cluster::start_each(&vec![extra; n])
    }

    /// Starts one member per entry of `extra`, each with its own flags.
    pub fn start_each(extra: &[&[&str]]) -> Cluster {
        let extra: Vec<Vec<String>> = extra.iter().map(|e| owned(e)).collect();
        Cluster::start_with(tempdir(), "http", &extra, &[])
    }

    /// Starts `n` members; member `i` advertises `fronts[i]` as its peer port
    /// (a proxy the test runs in front of its listen port, so every byte
    /// between members passes through the test).
    pub fn start_with_peer_fronts(n: usize, extra: &[&str], fronts: &[u16]) -> Cluster {
        Cluster::start_with(tempdir(), "http", &vec![owned(extra); n], fronts)
    }

    /// Starts one member per entry of `extra`, each with its own flags, in
    /// `dir`, on `scheme` ("http" or "https") client and peer URLs.
    pub fn start_in(
        dir: tempfile::TempDir,
        scheme: &'static str,
        extra: &[Vec<String>],
    ) -> Cluster {
        Cluster::start_with(dir, scheme, extra, &[])
    }

    /// Starts one member per entry of `extra` (its flags) in `dir`, on
    /// `scheme` URLs, member `i` advertising `fronts[i]` as its peer port when
    /// fronts are given (else its listen port).
    pub fn start_with(
        dir: tempfile::TempDir,
        scheme: &'static str,
        extra: &[Vec<String>],
        fronts: &[u16],
    ) -> Cluster {
        let n = extra.len();
        assert!(
            fronts.is_empty() || fronts.len() == n,
            "one front per member"
        );
        let names: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
        let mut taken = std::collections::HashSet::new();
        let mut pick = || loop {
            let port = restartable_port();
            if taken.insert(port) {
                return port;
            }
        };
        let ports: Vec<(u16, u16, u16)> = (0..n)
            .map(|i| {
                let (client, peer) = (pick(), pick());
                (client, peer, fronts.get(i).copied().unwrap_or(peer))
            })
            .collect();
        let initial_cluster = names
            .iter()
            .zip(&ports)
            .map(|(name, (_, _, front))| format!("{name}={scheme}://127.0.0.1:{front}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<Member> = names
            .iter()
            .zip(&ports)
            .zip(extra)
            .map(
                |((name, &(client_port, peer_port, advertised_peer_port)), extra)| Member {
                    name: name.clone(),
                    client_port,
                    peer_port,
                    advertised_peer_port,
                    data_dir: dir.path().join(format!("{name}.cairn")),
                    log: dir.path().join(format!("{name}.log")),
                    child: None,
                    extra_args: extra.clone(),
                    extra_env: Vec::new(),
                    initial_cluster: initial_cluster.clone(),
                    scheme,
                },
            )
            .collect();
        for m in &mut members {
            m.spawn();
        }
        Cluster { members, dir }
    }

    /// Prepares (does not start) a member that joins this cluster with
    /// `--initial-cluster-state existing`: add it with MemberAdd (its
    /// [`Member::peer_url`]) first, then start it with [`Member::restart`].
    /// Returns its index in `members`.
    pub fn new_joining_member(&mut self, name: &str, extra: &[&str]) -> usize {
        let (client_port, peer_port) = (free_port(), free_port());
        let mut initial_cluster: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        let scheme = self.members.first().map_or("http", |m| m.scheme);
        initial_cluster.push(format!("{name}={scheme}://127.0.0.1:{peer_port}"));
        let mut extra_args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        extra_args.extend([
            "--initial-cluster-state".to_string(),
            "existing".to_string(),
        ]);
        self.members.push(Member {
            name: name.to_string(),
            client_port,
            peer_port,
            advertised_peer_port: peer_port,
            data_dir: self.dir.path().join(format!("{name}.cairn")),
            log: self.dir.path().join(format!("{name}.log")),
            child: None,
            extra_args,
            extra_env: Vec::new(),
            initial_cluster: initial_cluster.join(","),
            scheme,
        });
        self.members.len() - 1
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.endpoint()).collect()
    }

    /// Every member's logs, for a failing test's message.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("==== {} ====\n{}", m.name, m.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Connects an etcd client to one endpoint, retrying while the member starts.
pub async fn client(endpoint: &str) -> etcd_client::Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match etcd_client::Client::connect([endpoint], None).await {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("connecting to {endpoint}: {e}"),
        }
    }
}

/// Waits until writes through the client succeed on every shard (keys under
/// many routing prefixes), retrying on errors: the member serves and each shard
/// has a leader.
pub async fn wait_writable(c: &mut etcd_client::Client, key: &str) {
    if let Err(e) = try_wait_writable(c, key).await {
        panic!("{e}");
    }
}

/// [`wait_writable`], returning the failure (with the last error) so the
/// caller can add the members' logs.
pub async fn try_wait_writable(c: &mut etcd_client::Client, key: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut prefix = 0;
    loop {
        let k = if prefix == 0 {
            key.to_string()
        } else {
            format!("/ready{prefix}/{key}")
        };
        match c.put(k.clone(), "ready", None).await {
            Ok(_) if prefix == 32 => return Ok(()),
            Ok(_) => prefix += 1,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(format!("member never became writable ({k}): {e}")),
        }
    }
}

/// The member that leads shard 0 (Status reports shard 0's leader).
pub async fn shard0_leader(cluster: &Cluster) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for (i, m) in cluster.members.iter().enumerate() {
            if !m.is_running() {
                continue;
            }
            let mut c = client(&m.endpoint()).await;
            if let Ok(s) = c.status().await {
                if s.leader() != 0 && s.header().map(|h| h.member_id()) == Some(s.leader()) {
                    return i;
                }
            }
        }
        assert!(Instant::now() < deadline, "no leader of shard 0");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The gRPC status of a refused request (panics on any other kind of error).
pub fn status_of(e: etcd_client::Error) -> tonic::Status {
    match e {
        etcd_client::Error::GRpcStatus(s) => s,
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

/// A plain HTTP/1.1 GET of `path` on 127.0.0.1:`port`: the status code (0
/// when nothing listens yet, so the caller retries) and the body.
/// etcd's watch gauges on member `port`'s `/metrics`: (open Watch streams,
/// live watches).
pub fn watch_gauges(port: u16) -> (Option<f64>, Option<f64>) {
    let (code, body) = http_get(port, "/metrics");
    assert_eq!(code, 200, "{body}");
    let e = crate::promtext::parse(&body).expect("metrics parse");
    (
        e.value("etcd_debugging_mvcc_watch_stream_total", &[]),
        e.value("etcd_debugging_mvcc_watcher_total", &[]),
    )
}

pub fn http_get(port: u16, path: &str) -> (u16, String) {
    http_request(port, &format!("GET {path} HTTP/1.1\r\n"), "")
}

/// A plain HTTP/1.1 POST of `body` to `path` on 127.0.0.1:`port`, as
/// [`http_get`].
pub fn http_post(port: u16, path: &str, body: &str) -> (u16, String) {
    let head = format!("POST {path} HTTP/1.1\r\nContent-Length: {}\r\n", body.len());
    http_request(port, &head, body)
}

fn http_request(port: u16, head: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    // Not listening yet: code 0, and the caller retries.
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "{head}Host: 127.0.0.1\r\nConnection: close\r\n\r\n{body}"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}
