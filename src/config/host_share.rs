//! How a member shares its host with the other members of its cluster: the
//! CPUs it takes by default and where it pins them.

use super::url_host_port;
use crate::member_file::MemberFile;

pub(super) fn available_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// How this member shares its host with the other members of its cluster.
/// Cores are pinned threads that poll before they sleep, so members of a
/// cluster started on one host (a local test cluster) that each took every CPU
/// would run several pinned threads on each CPU: instead they divide the CPUs
/// among them, and each pins from its own offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostShare {
    /// Members sharing this host's CPUs: the whole cluster when one host
    /// (the same host name, or any loopback) is in a peer URL of every member,
    /// this one included, else this member alone. The rule reads the cluster's
    /// URLs, not which member applies it, so every member of a cluster comes
    /// to the same answer (and to the same default shard count).
    pub members: usize,
    /// This member's position among them, by name.
    pub index: usize,
}

impl HostShare {
    /// This member's share of its host by the member table `file` holds;
    /// a table without this member's own entry counts it alone.
    pub fn of_file(file: &MemberFile) -> HostShare {
        if !file.members.iter().any(|m| m.id == file.member_id) {
            return HostShare::ALONE;
        }
        HostShare::of(
            &file.name,
            file.members
                .iter()
                .map(|m| (m.name.as_str(), m.peer_urls.as_slice())),
        )
    }

    pub const ALONE: HostShare = HostShare {
        members: 1,
        index: 0,
    };

    /// The share of `own_name` in a cluster of `(name, peer URLs)` that
    /// includes it.
    pub fn of<'a>(
        own_name: &str,
        cluster: impl IntoIterator<Item = (&'a str, &'a [String])>,
    ) -> HostShare {
        let cluster: Vec<(&str, &[String])> = cluster.into_iter().collect();
        let hosts: Vec<Vec<String>> = cluster
            .iter()
            .map(|(_, urls)| urls.iter().filter_map(|u| url_host(u)).collect())
            .collect();
        let one_host = hosts
            .first()
            .is_some_and(|first| first.iter().any(|h| hosts.iter().all(|hs| hs.contains(h))));
        if !one_host {
            return HostShare::ALONE;
        }
        HostShare {
            members: cluster.len(),
            // A member added but not started yet has no name; it is placed
            // when it starts (after the others, as its own start counts them).
            index: cluster
                .iter()
                .filter(|(n, _)| !n.is_empty() && *n < own_name)
                .count(),
        }
    }

    /// The default core count: the host's `cpus` divided among its members,
    /// at least one.
    pub fn cores(&self, cpus: usize) -> usize {
        (cpus / self.members).max(1)
    }

    /// The first CPU (an index into the CPUs the process may use, taken modulo
    /// their number) that this member's `cores` pin to.
    pub fn first_cpu(&self, cores: usize) -> usize {
        self.index * cores
    }
}

/// The host of an `http://host:port` URL as compared between URLs: every
/// loopback name is one host, and names compare without case; None for a URL
/// of another form.
fn url_host(url: &str) -> Option<String> {
    let host_port = url_host_port("peer-urls", url).ok()?;
    let (host, _port) = host_port.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    Some(if loopback {
        "loopback".to_string()
    } else {
        host.to_ascii_lowercase()
    })
}
