//! What the auth scenarios run against: a Cairn cluster, or a real etcd 3.4
//! cluster started the same way (loopback ports, temporary data directories,
//! the same flags, which Cairn names as etcd does) so that every expectation
//! of `daemon_auth.rs` can be checked against etcd itself. Also etcdctl with
//! credentials and stdin, waits bounded by progress, and the users and roles
//! several scenarios start from. The scenarios are in the modules below.

pub mod durability;
pub mod etcdctl;
pub mod rbac;
pub mod tokens;
pub mod transports;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, eventually, Cluster};

/// Longest wait for a cluster to serve, for a member to catch up, or for any
/// other condition polled by the scenarios: generous, as the machine is busy.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// The `--snapshot-count` of a cluster whose members must catch up by
/// snapshot: small, so that a few thousand writes take the log past them.
pub const SNAPSHOT_COUNT: usize = 100;

/// Cairn snapshots every `--snapshot-count` entries and keeps
/// min(5000, `--snapshot-count`) behind the snapshot for slow followers, so
/// its log holds at most twice [`SNAPSHOT_COUNT`] entries: this is well
/// past them.
const CAIRN_WRITES_PAST_THE_LOG: usize = 15 * SNAPSHOT_COUNT;

/// etcd 3.4 keeps 5000 entries behind each snapshot for slow followers
/// (`SnapshotCatchUpEntries`), whatever `--snapshot-count` says.
const ETCD_CATCH_UP_ENTRIES: usize = 5000;

/// Past etcd's catch-up window, with a few snapshots' worth to spare.
const ETCD_WRITES_PAST_THE_LOG: usize = ETCD_CATCH_UP_ENTRIES + 6 * SNAPSHOT_COUNT;

const _: () = assert!(CAIRN_WRITES_PAST_THE_LOG > 2 * SNAPSHOT_COUNT);
const _: () = assert!(ETCD_WRITES_PAST_THE_LOG > ETCD_CATCH_UP_ENTRIES + SNAPSHOT_COUNT);

/// Bcrypt at its cheapest: the tests hash many passwords on a busy machine.
pub const FAST_BCRYPT: [&str; 2] = ["--bcrypt-cost", "4"];

/// The implementation a scenario runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Cairn,
    Etcd,
}

impl Target {
    /// Three members over plain HTTP, each with `flags`.
    pub fn start(self, flags: &[&str]) -> Box<dyn Servers> {
        let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        let dir = tempfile::tempdir().expect("tempdir");
        self.start_in(dir, "http", &vec![flags; 3])
    }

    /// One member per entry of `flags`, on `scheme` ("http" or "https")
    /// client and peer URLs, its files in `dir`.
    pub fn start_in(
        self,
        dir: tempfile::TempDir,
        scheme: &'static str,
        flags: &[Vec<String>],
    ) -> Box<dyn Servers> {
        match self {
            Target::Cairn => Box::new(Cluster::start_in(dir, scheme, flags)),
            Target::Etcd => Box::new(EtcdCluster::start(dir, scheme, flags)),
        }
    }
}

/// A running cluster of either implementation.
pub trait Servers: Send {
    fn endpoints(&self) -> Vec<String>;
    fn kill9(&mut self, member: usize);
    fn restart(&mut self, member: usize);
    /// Every member's log, for a failing test's message.
    fn logs(&self) -> String;
    /// Whether `member` caught up by installing a snapshot from the leader.
    fn installed_snapshot(&self, member: usize) -> bool;
    /// How many writes take the log of a cluster started with
    /// `--snapshot-count` [`SNAPSHOT_COUNT`] past what a member that stopped
    /// before them can catch up by log.
    fn writes_past_the_log(&self) -> usize;
}

impl Servers for Cluster {
    fn endpoints(&self) -> Vec<String> {
        Cluster::endpoints(self)
    }

    fn kill9(&mut self, member: usize) {
        self.members[member].kill9();
    }

    fn restart(&mut self, member: usize) {
        self.members[member].restart();
    }

    fn logs(&self) -> String {
        Cluster::logs(self)
    }

    fn installed_snapshot(&self, member: usize) -> bool {
        self.members[member]
            .log_text()
            .contains("snapshot installed")
    }

    fn writes_past_the_log(&self) -> usize {
        CAIRN_WRITES_PAST_THE_LOG
    }
}

/// A member of a real etcd cluster.
struct EtcdMember {
    name: String,
    endpoint: String,
    data_dir: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl EtcdMember {
    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open etcd log");
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A real etcd 3.4 cluster on loopback, killed when dropped.
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    pub fn start(dir: tempfile::TempDir, scheme: &str, flags: &[Vec<String>]) -> EtcdCluster {
        let ports: Vec<(u16, u16)> = (0..flags.len())
            .map(|_| (common::restartable_port(), common::restartable_port()))
            .collect();
        let peer_url = |p: u16| format!("{scheme}://127.0.0.1:{p}");
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}={}", peer_url(*peer)))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<EtcdMember> = ports
            .iter()
            .zip(flags)
            .enumerate()
            .map(|(i, ((client, peer), extra))| {
                let name = format!("m{i}");
                let endpoint = format!("{scheme}://127.0.0.1:{client}");
                let mut args: Vec<String> = [
                    "--name",
                    &name,
                    "--listen-client-urls",
                    &endpoint,
                    "--advertise-client-urls",
                    &endpoint,
                    "--listen-peer-urls",
                    &peer_url(*peer),
                    "--initial-advertise-peer-urls",
                    &peer_url(*peer),
                    "--initial-cluster",
                    &initial_cluster,
                    "--initial-cluster-token",
                    "cairn-auth-test",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                args.extend(extra.iter().cloned());
                EtcdMember {
                    data_dir: dir.path().join(format!("{name}.etcd")),
                    log: dir.path().join(format!("{name}.log")),
                    name,
                    endpoint,
                    args,
                    child: None,
                }
            })
            .collect();
        for m in &mut members {
            m.spawn();
        }
        EtcdCluster { members, _dir: dir }
    }
}

impl Servers for EtcdCluster {
    fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.endpoint.clone()).collect()
    }

    fn kill9(&mut self, member: usize) {
        self.members[member].kill9();
    }

    fn restart(&mut self, member: usize) {
        assert!(self.members[member].child.is_none(), "still running");
        self.members[member].spawn();
    }

    fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("==== {} ====\n{}", m.name, m.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn installed_snapshot(&self, member: usize) -> bool {
        let log = self.members[member].log_text();
        log.contains("applied incoming snapshot")
    }

    fn writes_past_the_log(&self) -> usize {
        ETCD_WRITES_PAST_THE_LOG
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            m.kill9();
        }
    }
}

/// Runs etcdctl (API 3) against `endpoint` with `global` flags (e.g.
/// `--user`, TLS files) and `stdin` as its input; (succeeded, stdout +
/// stderr).
pub fn ctl_with(
    endpoint: &str,
    global: &[String],
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String) {
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--dial-timeout=5s")
        .arg("--command-timeout=20s")
        .args(global)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run etcdctl");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input.as_bytes())
            .expect("write etcdctl stdin");
    }
    let out = child.wait_with_output().expect("wait for etcdctl");
    // etcdctl's client logs each retried call as a JSON line on stderr
    // (`"level":"warn"`): a trace of the client, not part of the answer.
    let stderr: String = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with("{\"level\":"))
        .map(|l| format!("{l}\n"))
        .collect();
    let text = format!("{}{stderr}", String::from_utf8_lossy(&out.stdout));
    (out.status.success(), text)
}

/// etcdctl as `user` ("name:password", or none).
pub fn ctl(endpoint: &str, user: Option<&str>, args: &[&str]) -> (bool, String) {
    let global: Vec<String> = user.map(|u| format!("--user={u}")).into_iter().collect();
    ctl_with(endpoint, &global, args, None)
}

/// etcdctl's output, trimmed, must be `expected`.
pub fn ctl_says(endpoint: &str, user: Option<&str>, args: &[&str], expected: &str) {
    let out = ctl_ok(endpoint, user, args);
    assert_eq!(out.trim(), expected, "etcdctl {user:?} {args:?}");
}

/// etcdctl that must succeed; its output.
pub fn ctl_ok(endpoint: &str, user: Option<&str>, args: &[&str]) -> String {
    let (ok, out) = ctl(endpoint, user, args);
    assert!(ok, "etcdctl {user:?} {args:?} at {endpoint} failed:\n{out}");
    out
}

/// etcdctl that must fail with `message` (etcd's error text, which etcdctl
/// prints after `Error: `).
pub fn ctl_fails(endpoint: &str, user: Option<&str>, args: &[&str], message: &str) {
    let (ok, out) = ctl(endpoint, user, args);
    assert!(
        !ok && out.contains(&format!("Error: {message}")),
        "etcdctl {user:?} {args:?} at {endpoint}: expected `{message}`, got (success {ok}):\n{out}"
    );
}

/// Connects to `endpoint` with `options`, retrying transport errors while
/// the member starts; a refusal by the server (a gRPC status) is returned.
pub async fn connect(
    endpoint: &str,
    options: Option<etcd_client::ConnectOptions>,
) -> Result<etcd_client::Client, etcd_client::Error> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match etcd_client::Client::connect([endpoint], options.clone()).await {
            Ok(c) => return Ok(c),
            // Authenticate goes through the Raft log: right after a restart
            // it can time out or find no leader, and clients try again.
            Err(etcd_client::Error::GRpcStatus(s))
                if s.code() == tonic::Code::Unavailable && Instant::now() < deadline => {}
            Err(e @ etcd_client::Error::GRpcStatus(_)) => return Err(e),
            Err(e) => assert!(Instant::now() < deadline, "connecting to {endpoint}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A client authenticated as `user` with `password`.
pub async fn connect_as(endpoint: &str, user: &str, password: &str) -> etcd_client::Client {
    let options = etcd_client::ConnectOptions::new().with_user(user, password);
    connect(endpoint, Some(options))
        .await
        .unwrap_or_else(|e| panic!("authenticating {user} at {endpoint}: {e}"))
}

/// Waits until every endpoint serves a write (auth not yet enabled): each
/// member is up and the cluster has a leader. Panics with the members' logs
/// (a flag refused, a member that died) after [`PATIENCE`].
pub async fn wait_serving(servers: &dyn Servers) {
    let deadline = Instant::now() + PATIENCE;
    for ep in servers.endpoints() {
        loop {
            let last = match etcd_client::Client::connect([&ep], None).await {
                Ok(mut c) => match c.put("/ready", "1", None).await {
                    Ok(_) => break,
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "{ep} never served a write: {last}\n{}",
                servers.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Waits until `endpoint` serves `user` a write (auth enabled): after a
/// restart, until the member is back and the cluster has a leader.
pub async fn wait_serving_as(endpoint: &str, user: &str, password: &str, key: &str) {
    eventually(
        &format!("{endpoint} serves {user} a write"),
        PATIENCE,
        || async {
            let options = etcd_client::ConnectOptions::new().with_user(user, password);
            let mut c = etcd_client::Client::connect([endpoint], Some(options))
                .await
                .map_err(|e| e.to_string())?;
            c.put(key, "1", None)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await
}

/// Users and roles most scenarios start from (auth still disabled): root,
/// and alice, whose role `app` reads and writes /a/, reads /ro/ and writes
/// /wo/; nothing grants /secret/.
pub async fn set_up_alice(admin: &mut etcd_client::Client) {
    use etcd_client::Permission;

    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_add("alice", "apw", None).await.unwrap();
    admin.role_add("app").await.unwrap();
    for perm in [
        Permission::read_write("/a/").with_prefix(),
        Permission::read("/ro/").with_prefix(),
        Permission::write("/wo/").with_prefix(),
    ] {
        admin.role_grant_permission("app", perm).await.unwrap();
    }
    admin.user_grant_role("alice", "app").await.unwrap();
}

/// Enables auth through the API: unlike `etcdctl auth enable`, which makes
/// the role root and grants it to the root user first, AuthEnable wants
/// both to exist.
pub async fn enable_auth(admin: &mut etcd_client::Client) {
    admin.role_add("root").await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
}

/// The gRPC code and message of a refused call; panics if it succeeded.
pub fn refusal<T>(what: &str, r: Result<T, etcd_client::Error>) -> (tonic::Code, String) {
    match r {
        Ok(_) => panic!("{what}: expected a refusal, the call succeeded"),
        Err(e) => {
            let s = common::status_of(e);
            (s.code(), s.message().to_string())
        }
    }
}

/// Asserts that `r` was refused with `code` and exactly `message`.
pub fn assert_refused<T>(
    what: &str,
    r: Result<T, etcd_client::Error>,
    code: tonic::Code,
    message: &str,
) {
    let got = refusal(what, r);
    assert_eq!(got, (code, message.to_string()), "{what}");
}

/// A call that needs a permission the user lacks: etcd's refusal.
pub fn denied<T>(what: &str, r: Result<T, etcd_client::Error>) {
    assert_refused(what, r, tonic::Code::PermissionDenied, PERMISSION_DENIED)
}

/// A Maintenance call that is root's: etcd 3.4's refusal, the auth
/// package's own error, which its gRPC layer passes on as code Unknown.
pub fn maintenance_denied<T>(what: &str, r: Result<T, etcd_client::Error>) {
    assert_refused(what, r, tonic::Code::Unknown, "auth: permission denied")
}

/// etcd's answer to a call that needs a permission the user lacks.
pub const PERMISSION_DENIED: &str = "etcdserver: permission denied";
pub const USER_EMPTY: &str = "etcdserver: user name is empty";
pub const AUTH_FAILED: &str = "etcdserver: authentication failed, invalid user ID or password";
pub const INVALID_TOKEN: &str = "etcdserver: invalid auth token";
