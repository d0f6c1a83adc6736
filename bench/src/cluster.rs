//! Local clusters of real processes, for `compare` and for tests: N members of
//! etcd or Cairn on 127.0.0.1 with free ports and their own data directories,
//! started with etcd's flags (which Cairn shares), stopped on drop.
//!
//! Every process started here is stopped when its [`LocalCluster`] is dropped,
//! including on panic unwinding and when the future owning it is cancelled (which
//! is how `compare` reacts to Ctrl-C). Members run in their own process group so a
//! terminal's Ctrl-C reaches cairn-bench, which then stops them in order.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_proto::etcdserverpb::kv_client::KvClient;
use cairn_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use cairn_proto::etcdserverpb::{MoveLeaderRequest, PutRequest, StatusRequest};
use tonic::transport::Endpoint;

use crate::security::{self, ClusterCerts, Conn, Credentials};

/// Most members one local cluster may have.
pub const MAX_MEMBERS: usize = 9;
/// How long a member gets to exit after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Bytes of a member's log shown when it fails to start.
const LOG_TAIL_BYTES: u64 = 2_048;
/// Per-probe deadline while waiting for a cluster to serve.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum System {
    Etcd,
    Cairn,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Etcd => "etcd",
            System::Cairn => "cairn",
        }
    }
}

impl std::fmt::Display for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    #[error("{system} binary {} cannot be run: {reason}", path.display())]
    Binary {
        system: System,
        path: PathBuf,
        reason: String,
    },
    #[error("invalid cluster size {members} (1..={MAX_MEMBERS})")]
    Size { members: usize },
    #[error("{system}: {action} {}: {source}", path.display())]
    Io {
        system: System,
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{system} member {member} exited while starting ({status}); end of {}:\n{tail}", log.display())]
    Exited {
        system: System,
        member: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("{system}: {action}: {reason}")]
    Security {
        system: System,
        action: &'static str,
        reason: String,
    },
    #[error("{system}: {action}: {reason}")]
    Leadership {
        system: System,
        action: &'static str,
        reason: String,
    },
    #[error("{system} cluster did not serve within {timeout:?}: {reason} (member logs in {})", dir.display())]
    NotReady {
        system: System,
        timeout: Duration,
        reason: String,
        dir: PathBuf,
    },
}

/// One member process and where it lives.
#[derive(Debug)]
pub struct MemberProcess {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    child: Option<Child>,
}

impl MemberProcess {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// CPU time (user + system, every thread) process `pid` has used so far,
/// from `/proc/<pid>/stat`.
pub fn process_cpu_time(pid: u32) -> std::io::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces: fields are counted after its ')'.
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "unexpected /proc stat");
    let rest = stat.rfind(')').map(|i| &stat[i + 1..]).ok_or_else(bad)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ')'.
    let tick = |i: usize| -> std::io::Result<u64> {
        fields.get(i).and_then(|f| f.parse().ok()).ok_or_else(bad)
    };
    let ticks = tick(11)? + tick(12)?;
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = if per_second > 0 {
        per_second as u64
    } else {
        100
    };
    Ok(Duration::from_micros(ticks * 1_000_000 / per_second))
}

/// Resident memory of processes, summed, in bytes (`/proc/<pid>/status`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resident {
    /// VmRSS: everything resident.
    pub total: u64,
    /// RssAnon: heap and stacks.
    pub anon: u64,
    /// RssFile: mapped files (the store's pages) and the binary.
    pub file: u64,
}

impl Resident {
    /// Process `pid`'s resident memory.
    pub fn of(pid: u32) -> Option<Resident> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(name))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        };
        Some(Resident {
            total: field("VmRSS:")?,
            anon: field("RssAnon:")?,
            file: field("RssFile:")?,
        })
    }

    /// The sum over `cluster`'s members (None if one is gone).
    pub fn of_members(cluster: &LocalCluster) -> Option<Resident> {
        cluster
            .members
            .iter()
            .map(|m| Resident::of(m.pid()?))
            .try_fold(Resident::default(), |sum, r| {
                let r = r?;
                Some(Resident {
                    total: sum.total + r.total,
                    anon: sum.anon + r.anon,
                    file: sum.file + r.file,
                })
            })
    }
}

#[derive(Debug)]
pub struct LocalCluster {
    pub system: System,
    pub members: Vec<MemberProcess>,
    pub base_dir: PathBuf,
    /// Every member stopped by [`LocalCluster::pause_all`] and not yet resumed.
    paused: bool,
    /// Mutual TLS on the client and peer ports, with these certificates.
    tls: Option<ClusterCerts>,
    /// The administrator, once [`LocalCluster::enable_auth`] has run: probes
    /// authenticate as it.
    root: Option<Credentials>,
}

/// How [`LocalCluster::start_with`] starts the members.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Cores per member: Cairn's `--cores N`, etcd's `GOMAXPROCS=N` (Go's
    /// count of threads running Go code at once), so both systems get the same
    /// share of a machine that hosts every member.
    pub cores: Option<usize>,
    /// Mutual TLS on both ports with these certificates: https:// URLs and
    /// etcd's flags `--cert-file`, `--key-file`, `--trusted-ca-file`,
    /// `--client-cert-auth` and their `--peer-*` equivalents.
    pub tls: Option<ClusterCerts>,
    /// Cairn only: `--shards N` (etcd has one Raft group).
    pub cairn_shards: Option<usize>,
}

/// Picks `n` distinct free TCP ports on 127.0.0.1. All listeners are held until
/// every port is chosen, so one call never hands out a port twice; and no port
/// is handed out twice by one process ([`HANDED_OUT`]), so clusters started at
/// once by one process (tests running in parallel) cannot get the same port
/// between one's pick and its members' binds. Another process could still
/// take one before the member binds it (then start fails plainly, and a retry
/// picks new ports).
pub fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let mut handed = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    let mut held = Vec::new();
    let mut ports = Vec::with_capacity(n);
    // A port handed out before is held too, so the kernel offers another.
    while ports.len() < n && held.len() < n + MAX_PORTS_SKIPPED {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        if handed.insert(port) {
            ports.push(port);
        }
        held.push(listener);
    }
    if ports.len() < n {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("{MAX_PORTS_SKIPPED} free ports offered were all handed out before"),
        ));
    }
    Ok(ports)
}

/// Every port [`free_ports`] handed out in this process.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Ports handed out before that one call of [`free_ports`] may be offered
/// before it gives up.
const MAX_PORTS_SKIPPED: usize = 1_000;

fn send_signal(pid: u32, signal: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; the pid
    // is a child we spawned and have not yet reaped, so it cannot name a recycled
    // process.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn log_tail(path: &Path) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::from("(no log)");
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

impl LocalCluster {
    /// Spawns `members` processes of `binary` under `base_dir` (one subdirectory per
    /// member holding its data directory and its log). Returns once spawned; call
    /// [`LocalCluster::wait_ready`] before sending load.
    pub fn start(
        system: System,
        binary: &Path,
        members: usize,
        base_dir: &Path,
    ) -> Result<LocalCluster, ClusterError> {
        LocalCluster::start_with(system, binary, members, base_dir, &StartOptions::default())
    }

    /// [`LocalCluster::start`] with every option.
    pub fn start_with(
        system: System,
        binary: &Path,
        members: usize,
        base_dir: &Path,
        options: &StartOptions,
    ) -> Result<LocalCluster, ClusterError> {
        let cores = options.cores;
        if members == 0 || members > MAX_MEMBERS {
            return Err(ClusterError::Size { members });
        }
        let probe = Command::new(binary)
            .arg("--version")
            .stdin(Stdio::null())
            .output();
        match probe {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                let said = String::from_utf8_lossy(&out.stderr);
                let said = said.lines().next().unwrap_or("").trim();
                return Err(ClusterError::Binary {
                    system,
                    path: binary.to_owned(),
                    reason: format!("`--version` exited with {} saying \"{said}\"", out.status),
                });
            }
            Err(e) => {
                return Err(ClusterError::Binary {
                    system,
                    path: binary.to_owned(),
                    reason: e.to_string(),
                })
            }
        }
        let io = |action: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| ClusterError::Io {
                system,
                action,
                path,
                source,
            }
        };
        std::fs::create_dir_all(base_dir).map_err(io("create", base_dir))?;
        let ports = free_ports(2 * members).map_err(io("pick free ports for", base_dir))?;
        let mut cluster = LocalCluster {
            system,
            members: Vec::with_capacity(members),
            base_dir: base_dir.to_owned(),
            paused: false,
            tls: options.tls.clone(),
            root: None,
        };
        let scheme = if options.tls.is_some() {
            "https"
        } else {
            "http"
        };
        for i in 0..members {
            let name = format!("{}{i}", system.name());
            let dir = base_dir.join(&name);
            std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
            cluster.members.push(MemberProcess {
                client_url: format!("{scheme}://127.0.0.1:{}", ports[2 * i]),
                peer_url: format!("{scheme}://127.0.0.1:{}", ports[2 * i + 1]),
                data_dir: dir.join("data"),
                log_path: dir.join("member.log"),
                name,
                child: None,
            });
        }
        let initial_cluster = cluster
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("cairn-bench-{}-{}", system.name(), std::process::id());
        for i in 0..members {
            let m = &cluster.members[i];
            let log = File::create(&m.log_path).map_err(io("create", &m.log_path))?;
            let log_err = log.try_clone().map_err(io("duplicate", &m.log_path))?;
            // Same flags, same meaning for both systems. Durability is each
            // system's default, which for both is an fsync before a write is
            // acknowledged; nothing here relaxes it.
            let mut command = Command::new(binary);
            if let Some(n) = cores {
                match system {
                    System::Cairn => command.args(["--cores", &n.to_string()]),
                    System::Etcd => command.env("GOMAXPROCS", n.to_string()),
                };
            }
            if let Some(certs) = &options.tls {
                command.args(certs.member_flags());
            }
            if let (System::Cairn, Some(n)) = (system, options.cairn_shards) {
                command.args(["--shards", &n.to_string()]);
            }
            let child = command
                .args(["--name", &m.name])
                .arg("--data-dir")
                .arg(&m.data_dir)
                .args(["--listen-client-urls", &m.client_url])
                .args(["--advertise-client-urls", &m.client_url])
                .args(["--listen-peer-urls", &m.peer_url])
                .args(["--initial-advertise-peer-urls", &m.peer_url])
                .args(["--initial-cluster", &initial_cluster])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", &token])
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err)
                .process_group(0)
                .spawn()
                .map_err(io("spawn", binary))?;
            cluster.members[i].child = Some(child);
        }
        Ok(cluster)
    }

    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// The `--endpoints` value reaching every member.
    pub fn endpoints_arg(&self) -> String {
        self.client_urls().join(",")
    }

    /// Waits until every member answers Status, agrees that there is a leader, and a
    /// write commits. Fails early, with the end of its log, if a member exits.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let last_reason = match self.probe().await {
                Ok(()) => return Ok(()),
                Err(reason) => reason,
            };
            if Instant::now() >= deadline {
                return Err(ClusterError::NotReady {
                    system: self.system,
                    timeout,
                    reason: last_reason,
                    dir: self.base_dir.clone(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn check_alive(&mut self) -> Result<(), ClusterError> {
        for m in &mut self.members {
            if let Some(child) = m.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    m.child = None;
                    return Err(ClusterError::Exited {
                        system: self.system,
                        member: m.name.clone(),
                        status: status.to_string(),
                        log: m.log_path.clone(),
                        tail: log_tail(&m.log_path),
                    });
                }
            }
        }
        Ok(())
    }

    /// A connection to member `i`, over TLS with the client certificate when
    /// the cluster has TLS, authenticated as root once auth is enabled.
    pub async fn connect_member(&self, i: usize, timeout: Duration) -> Result<Conn, String> {
        let m = &self.members[i];
        let mut endpoint = Endpoint::from_shared(m.client_url.clone())
            .map_err(|e| e.to_string())?
            .timeout(timeout)
            .connect_timeout(timeout);
        if let Some(certs) = &self.tls {
            let tls = certs.client_tls_config().map_err(|e| e.to_string())?;
            endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("{} not accepting: {e}", m.name))?;
        match &self.root {
            Some(root) => security::authenticate(channel, root)
                .await
                .map_err(|s| format!("{} authenticate: {}", m.name, s.message())),
            None => Ok(security::anonymous(channel)),
        }
    }

    async fn probe(&self) -> Result<(), String> {
        for (i, m) in self.members.iter().enumerate() {
            let channel = self.connect_member(i, PROBE_TIMEOUT).await?;
            let status = MaintenanceClient::new(channel.clone())
                .status(StatusRequest {})
                .await
                .map_err(|s| format!("{} status: {}", m.name, s.message()))?
                .into_inner();
            if status.leader == 0 {
                return Err(format!("{} knows no leader yet", m.name));
            }
            KvClient::new(channel)
                .put(PutRequest {
                    key: Bytes::from_static(b"cairn-bench/ready"),
                    value: Bytes::from(m.name.clone()),
                    ..Default::default()
                })
                .await
                .map_err(|s| format!("write through {}: {}", m.name, s.message()))?;
        }
        Ok(())
    }

    /// The index of the member that leads, by its own Status.
    pub async fn leader_index(&self) -> Result<usize, ClusterError> {
        self.find_leader()
            .await
            .map_err(|reason| ClusterError::Leadership {
                system: self.system,
                action: "finding the leader",
                reason,
            })
    }

    /// [`LocalCluster::leader_index`], or why no member says it leads.
    async fn find_leader(&self) -> Result<usize, String> {
        let mut reason = String::from("no member says it leads");
        for (i, m) in self.members.iter().enumerate() {
            let status = match self.connect_member(i, PROBE_TIMEOUT).await {
                Ok(c) => MaintenanceClient::new(c)
                    .status(StatusRequest {})
                    .await
                    .map_err(|s| format!("{} status: {}", m.name, s.message())),
                Err(e) => Err(e),
            };
            match status.map(|s| s.into_inner()) {
                Ok(s) if s.leader != 0 && s.header.is_some_and(|h| h.member_id == s.leader) => {
                    return Ok(i)
                }
                Ok(_) => {}
                Err(e) => reason = e,
            }
        }
        Err(reason)
    }

    /// Member `i`'s id, by its own Status.
    async fn member_id(&self, i: usize) -> Result<u64, String> {
        let name = &self.members[i].name;
        MaintenanceClient::new(self.connect_member(i, PROBE_TIMEOUT).await?)
            .status(StatusRequest {})
            .await
            .map_err(|s| format!("{name} status: {}", s.message()))?
            .into_inner()
            .header
            .map(|h| h.member_id)
            .ok_or_else(|| format!("{name} answered Status without a response header"))
    }

    /// Makes member `target` the leader (Maintenance.MoveLeader, sent to the
    /// current leader) unless it already is, and waits until it says it leads.
    /// Members of one host divide its CPUs by their position, so which one leads
    /// changes what a single client measures.
    pub async fn move_leader_to(
        &self,
        target: usize,
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        let failed = |reason: String| ClusterError::Leadership {
            system: self.system,
            action: "moving the leader",
            reason,
        };
        let deadline = Instant::now() + timeout;
        let target_id = self.member_id(target).await.map_err(failed)?;
        loop {
            // No leader at the moment (an election under way, as right after a
            // MoveLeader or a resume), a leader out of reach and a refused
            // MoveLeader all mean "not yet": retried until the deadline.
            let leader = self.find_leader().await;
            if leader == Ok(target) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(failed(match leader {
                    Ok(other) => {
                        format!("{} still leads after {timeout:?}", self.members[other].name)
                    }
                    Err(reason) => format!("no leader after {timeout:?}: {reason}"),
                }));
            }
            if let Ok(leader) = leader {
                if let Ok(conn) = self.connect_member(leader, PROBE_TIMEOUT).await {
                    let _ = MaintenanceClient::new(conn)
                        .move_leader(MoveLeaderRequest { target_id })
                        .await;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Turns auth on as `etcdctl` would (see [`security::enable_auth`]): root
    /// with `root_password`, and `user` with readwrite on every key. Probes
    /// authenticate as root from then on.
    pub async fn enable_auth(
        &mut self,
        root_password: &str,
        user: &Credentials,
    ) -> Result<(), ClusterError> {
        let failed = |reason: String| ClusterError::Security {
            system: self.system,
            action: "enabling auth",
            reason,
        };
        let conn = self
            .connect_member(0, PROBE_TIMEOUT)
            .await
            .map_err(failed)?;
        security::enable_auth(conn, root_password, user)
            .await
            .map_err(|s| failed(s.to_string()))?;
        self.root = Some(Credentials::new(security::ROOT_USER, root_password));
        Ok(())
    }

    /// The `cairn-bench` options that reach this cluster as `user` (TLS
    /// options when it has TLS; `--user` when given).
    /// CPU time the running members have used so far, summed; None when a
    /// member's is unreadable (it is not running).
    pub fn cpu_time(&self) -> Option<Duration> {
        self.members
            .iter()
            .map(|m| process_cpu_time(m.pid()?).ok())
            .sum()
    }

    pub fn client_args(&self, user: Option<&Credentials>) -> Vec<String> {
        let mut args = self
            .tls
            .as_ref()
            .map(ClusterCerts::client_args)
            .unwrap_or_default();
        if let Some(user) = user {
            args.extend(["--user".into(), user.arg()]);
        }
        args
    }

    /// Pauses member `i` (SIGSTOP): it keeps its sockets but answers nothing.
    pub fn pause(&self, i: usize) -> std::io::Result<()> {
        self.signal_member(i, libc::SIGSTOP)
    }

    /// Resumes member `i` after [`LocalCluster::pause`] (SIGCONT).
    pub fn resume(&self, i: usize) -> std::io::Result<()> {
        self.signal_member(i, libc::SIGCONT)
    }

    /// Pauses every member (see [`LocalCluster::pause`]).
    pub fn pause_all(&mut self) -> Result<(), ClusterError> {
        self.signal_all(libc::SIGSTOP, "pausing member")?;
        self.paused = true;
        Ok(())
    }

    /// Resumes every member (see [`LocalCluster::resume`]).
    pub fn resume_all(&mut self) -> Result<(), ClusterError> {
        self.signal_all(libc::SIGCONT, "resuming member")?;
        self.paused = false;
        Ok(())
    }

    /// Whether [`LocalCluster::pause_all`] stopped the members and nothing has
    /// resumed them since.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    fn signal_all(&self, signal: libc::c_int, action: &'static str) -> Result<(), ClusterError> {
        for (i, m) in self.members.iter().enumerate() {
            self.signal_member(i, signal)
                .map_err(|source| ClusterError::Io {
                    system: self.system,
                    action,
                    path: m.data_dir.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    fn signal_member(&self, i: usize, signal: libc::c_int) -> std::io::Result<()> {
        let pid = self.members[i]
            .pid()
            .ok_or_else(|| std::io::Error::other(format!("member {i} is not running")))?;
        send_signal(pid, signal)
    }

    /// Kills member `i` at once (SIGKILL) and reaps it.
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops every member: SIGCONT (in case it is paused), SIGTERM, and SIGKILL
    /// for any still running after [`STOP_GRACE`]. Every child is reaped.
    pub fn stop(&mut self) {
        let mut running: Vec<Child> = self
            .members
            .iter_mut()
            .filter_map(|m| m.child.take())
            .collect();
        self.paused = false;
        for child in &running {
            let _ = send_signal(child.id(), libc::SIGCONT);
            let _ = send_signal(child.id(), libc::SIGTERM);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while !running.is_empty() && Instant::now() < deadline {
            running.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));
            std::thread::sleep(Duration::from_millis(20));
        }
        for mut child in running {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls from several threads at once, each port dropped as soon as it
    /// is picked (as a cluster's members bind theirs later): no port comes
    /// back from two calls. 3,000 ports over ~14,000 the kernel offers for a
    /// bind to port 0 would repeat some hundreds of times without the record.
    #[test]
    fn no_port_is_handed_out_twice_by_one_process() {
        let picks: Vec<Vec<u16>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..125)
                            .flat_map(|_| free_ports(6).expect("free ports"))
                            .collect::<Vec<u16>>()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let all: Vec<u16> = picks.concat();
        let distinct: BTreeSet<u16> = all.iter().copied().collect();
        assert_eq!(all.len(), 3_000);
        assert_eq!(distinct.len(), all.len(), "a port was handed out twice");
    }

    #[test]
    fn a_process_cpu_time_grows_with_work() {
        let me = std::process::id();
        let before = process_cpu_time(me).unwrap();
        // Busy until the clock-tick counters move (a loaded machine may give
        // this thread little CPU), bounded.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut x = 0u64;
        while process_cpu_time(me).unwrap() <= before {
            assert!(
                Instant::now() < deadline,
                "CPU time never grew from {before:?}"
            );
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        assert!(process_cpu_time(u32::MAX).is_err(), "no such process");
    }
}
