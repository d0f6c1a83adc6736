//! The fault-injecting network: every connection between members, and between
//! a client and a member, passes through a byte-level TCP proxy in the test
//! process, and a table of cut directed links decides which bytes move.
//!
//! A cut direction holds its bytes (the proxy stops reading, so the sender's
//! socket buffers fill), as a firewall that drops packets would: TCP delivers
//! nothing across the cut and everything once it heals, unless an end gives up
//! first. A connection opened across a cut in either direction waits before
//! reaching its destination, since a TCP handshake needs both directions.
//!
//! Members dial the peer URLs of the member table, the same for every member,
//! so a proxy in front of member `b` cannot tell the dialer from the address
//! (all is 127.0.0.1). It finds it by the source port: the kernel's socket
//! table (/proc/net/tcp) gives the dialing socket's inode, and the member whose
//! /proc/<pid>/fd holds that socket is the dialer. Clients need no lookup: each
//! client has its own proxy port per member.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A node of the network: members are `0..members`, clients follow.
pub type Node = usize;

/// Bytes a proxy reads from one side before writing them to the other.
const RELAY_BUFFER_BYTES: usize = 64 * 1024;

/// The cut links, shared by every proxy.
pub struct Net {
    cut: Mutex<HashSet<(Node, Node)>>,
    changed: watch::Sender<u64>,
    /// Connections accepted, refused for an unknown dialer, and relayed.
    pub accepted: AtomicU64,
    pub unknown_dialers: AtomicU64,
    pub relayed_bytes: AtomicU64,
}

impl Net {
    pub fn new() -> Arc<Net> {
        Arc::new(Net {
            cut: Mutex::new(HashSet::new()),
            changed: watch::channel(0).0,
            accepted: AtomicU64::new(0),
            unknown_dialers: AtomicU64::new(0),
            relayed_bytes: AtomicU64::new(0),
        })
    }

    /// Replaces the set of cut directed links `(from, to)`.
    pub fn set_cut(&self, links: HashSet<(Node, Node)>) {
        *self.cut.lock().unwrap() = links;
        self.changed.send_modify(|v| *v += 1);
    }

    pub fn heal(&self) {
        self.set_cut(HashSet::new());
    }

    pub fn is_cut(&self, from: Node, to: Node) -> bool {
        from != to && self.cut.lock().unwrap().contains(&(from, to))
    }

    /// Returns once bytes may flow from `from` to `to` (and, with `both`,
    /// back as well).
    async fn wait_open(&self, from: Node, to: Node, both: bool) {
        let mut rx = self.changed.subscribe();
        loop {
            let held = self.is_cut(from, to) || (both && self.is_cut(to, from));
            if !held {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

/// The running members' process ids by member index, kept current by the
/// nemesis across kills and restarts.
pub type Pids = Arc<Mutex<Vec<Option<u32>>>>;

/// Binds a listener on a free loopback port for a proxy to serve later.
pub async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a proxy port")
}

/// Serves the proxy in front of member `to`'s peer port: each accepted
/// connection is relayed to `target` once its dialing member is known.
pub fn serve_peer_front(
    listener: TcpListener,
    to: Node,
    target: SocketAddr,
    net: Arc<Net>,
    pids: Pids,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let front_port = listener.local_addr().expect("proxy address").port();
        loop {
            let Ok((inbound, from_addr)) = listener.accept().await else {
                // Out of descriptors, say: no busy loop meanwhile.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            net.accepted.fetch_add(1, Ordering::Relaxed);
            let net = net.clone();
            let pids = pids.clone();
            tokio::spawn(async move {
                let running: Vec<(Node, u32)> = pids
                    .lock()
                    .unwrap()
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| p.map(|p| (i, p)))
                    .collect();
                let src_port = from_addr.port();
                let dialer = tokio::task::spawn_blocking(move || {
                    dialing_member(src_port, front_port, &running)
                })
                .await
                .ok()
                .flatten();
                match dialer {
                    Some(from) => relay(inbound, from, to, target, net).await,
                    None => {
                        net.unknown_dialers.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    })
}

/// Serves the proxy through which client node `from` reaches member `to`.
pub fn serve_client_front(
    listener: TcpListener,
    from: Node,
    to: Node,
    target: SocketAddr,
    net: Arc<Net>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((inbound, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            net.accepted.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(relay(inbound, from, to, target, net.clone()));
        }
    })
}

/// Relays one connection from node `from` to node `to` until either end
/// closes it, holding each direction's bytes while that direction is cut.
async fn relay(inbound: TcpStream, from: Node, to: Node, target: SocketAddr, net: Arc<Net>) {
    net.wait_open(from, to, true).await;
    // A dialer that gave up while its connection waited is not passed on.
    let mut probe = [0u8; 1];
    if let Ok(Ok(0)) = tokio::time::timeout(Duration::ZERO, inbound.peek(&mut probe)).await {
        return;
    }
    let Ok(outbound) = TcpStream::connect(target).await else {
        // The destination is down: the dialer sees its connection close.
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    let forth = pump(in_read, out_write, from, to, net.clone());
    let back = pump(out_read, in_write, to, from, net);
    // An error on either side drops both, as a reset would.
    let _ = tokio::try_join!(forth, back);
}

async fn pump(
    mut from_side: OwnedReadHalf,
    mut to_side: OwnedWriteHalf,
    from: Node,
    to: Node,
    net: Arc<Net>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; RELAY_BUFFER_BYTES];
    loop {
        net.wait_open(from, to, false).await;
        let n = from_side.read(&mut buf).await?;
        if n == 0 {
            let _ = to_side.shutdown().await;
            return Ok(());
        }
        // Bytes read just before a cut wait for the heal like the rest.
        net.wait_open(from, to, false).await;
        to_side.write_all(&buf[..n]).await?;
        net.relayed_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The member whose process holds the socket connected from loopback port
/// `src_port` to `dst_port`, among `running` (member, pid).
pub fn dialing_member(src_port: u16, dst_port: u16, running: &[(Node, u32)]) -> Option<Node> {
    let inode = socket_inode(src_port, dst_port)?;
    let wanted = format!("socket:[{inode}]");
    running.iter().find_map(|&(member, pid)| {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
        fds.flatten()
            .any(|fd| {
                std::fs::read_link(fd.path())
                    .map(|l| l.as_os_str() == wanted.as_str())
                    .unwrap_or(false)
            })
            .then_some(member)
    })
}

/// The inode of the IPv4 loopback socket whose local port is `local` and
/// remote port `remote`, from /proc/net/tcp (ports in hex, addresses in
/// network order printed as a little-endian word: 127.0.0.1 is 0100007F).
fn socket_inode(local: u16, remote: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let want_local = format!("0100007F:{local:04X}");
    let want_remote = format!("0100007F:{remote:04X}");
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() > 9 && fields[1] == want_local && fields[2] == want_remote)
            .then(|| fields[9].parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    //! Guards the proxy against naming the wrong dialer, and against bytes
    //! or new connections that cross a cut link.

    use super::*;

    /// The dialer lookup finds this very process as the owner of a socket it
    /// connected, and nobody for a port nobody dialed from.
    #[tokio::test]
    async fn finds_the_process_that_dialed() {
        let listener = bind().await;
        let port = listener.local_addr().unwrap().port();
        let dialed = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (_accepted, from) = listener.accept().await.unwrap();
        assert_eq!(from.port(), dialed.local_addr().unwrap().port());
        let me = std::process::id();
        let found = tokio::task::spawn_blocking(move || {
            dialing_member(from.port(), port, &[(7, 1), (3, me)])
        })
        .await
        .unwrap();
        assert_eq!(found, Some(3));
        assert_eq!(
            dialing_member(from.port(), port.wrapping_add(1), &[(3, me)]),
            None
        );
    }

    /// A cut direction holds bytes until healed while the other direction
    /// flows; a new connection across a cut waits for the heal.
    #[tokio::test]
    async fn a_cut_holds_one_direction() {
        let upstream = bind().await;
        let target = upstream.local_addr().unwrap();
        let net = Net::new();
        let front = bind().await;
        let front_addr = front.local_addr().unwrap();
        serve_client_front(front, 1, 0, target, net.clone());
        let mut client = TcpStream::connect(front_addr).await.unwrap();
        let (mut server, _) = upstream.accept().await.unwrap();

        net.set_cut([(1, 0)].into_iter().collect());
        client.write_all(b"held").await.unwrap();
        server.write_all(b"flows").await.unwrap();
        let mut buf = [0u8; 5];
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"flows");
        let mut held = [0u8; 4];
        let early =
            tokio::time::timeout(Duration::from_millis(300), server.read_exact(&mut held)).await;
        assert!(early.is_err(), "bytes crossed a cut link");

        let mut late = TcpStream::connect(front_addr).await.unwrap();
        late.write_all(b"x").await.unwrap();
        let waiting = tokio::time::timeout(Duration::from_millis(300), upstream.accept()).await;
        assert!(waiting.is_err(), "a connection crossed a cut link");

        net.heal();
        server.read_exact(&mut held).await.unwrap();
        assert_eq!(&held, b"held");
        let (mut second, _) = upstream.accept().await.unwrap();
        let mut one = [0u8; 1];
        second.read_exact(&mut one).await.unwrap();
        assert_eq!(&one, b"x");
    }
}
