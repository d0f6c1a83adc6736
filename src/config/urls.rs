//! URLs and lists as the flags give them: listen and advertise URLs, and
//! `--initial-cluster`.

use std::net::{SocketAddr, ToSocketAddrs};

use super::{invalid, ConfigError, InitialMember};

/// Splits a comma-separated list, dropping empty items.
pub(super) fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Whether an etcd-style URL asks for TLS (`https://`).
pub fn url_is_https(url: &str) -> bool {
    url.starts_with("https://")
}

/// The `host:port` of an etcd-style URL (`http://host:port` or
/// `https://host:port`), checked for form only: no name is looked up (that
/// happens where the address is used, off the cores' threads).
pub fn url_host_port(flag: &'static str, url: &str) -> Result<String, ConfigError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| {
            invalid(
                flag,
                format!("{url:?}: only http:// and https:// URLs are supported"),
            )
        })?;
    let hostport = rest.trim_end_matches('/');
    if hostport.contains('/') {
        return Err(invalid(flag, format!("{url:?}: a URL here has no path")));
    }
    let port_ok = hostport
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !port_ok {
        return Err(invalid(
            flag,
            format!("{url:?}: expected http://host:port or https://host:port"),
        ));
    }
    Ok(hostport.to_string())
}

/// The addresses to listen on for URLs this member binds: each resolved now.
/// A host name such as localhost may resolve to both families; the first is
/// used.
pub(super) fn urls_to_addrs(
    flag: &'static str,
    urls: &[String],
) -> Result<Vec<SocketAddr>, ConfigError> {
    urls.iter()
        .map(|url| {
            url_host_port(flag, url)?
                .to_socket_addrs()
                .map_err(|e| invalid(flag, format!("{url:?}: {e}")))?
                .next()
                .ok_or_else(|| invalid(flag, format!("{url:?}: resolves to no address")))
        })
        .collect()
}

/// Parses `--initial-cluster` ("a=http://h:1,b=http://h:2"); a name may repeat to
/// give one member several peer URLs, as in etcd.
pub fn parse_initial_cluster(s: &str) -> Result<Vec<InitialMember>, ConfigError> {
    let mut members: Vec<InitialMember> = Vec::new();
    for item in split_list(s) {
        let (name, url) = item.split_once('=').ok_or_else(|| {
            invalid(
                "initial-cluster",
                format!("{item:?}: expected name=url, e.g. infra0=http://127.0.0.1:2380"),
            )
        })?;
        if name.is_empty() {
            return Err(invalid("initial-cluster", format!("{item:?}: empty name")));
        }
        url_host_port("initial-cluster", url)?;
        match members.iter_mut().find(|m| m.name == name) {
            Some(m) => m.peer_urls.push(url.to_string()),
            None => members.push(InitialMember {
                name: name.to_string(),
                peer_urls: vec![url.to_string()],
            }),
        }
    }
    if members.is_empty() {
        return Err(invalid("initial-cluster", "no members given"));
    }
    Ok(members)
}
