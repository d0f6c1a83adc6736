//! Script scenarios from `src/raft/testdata/*.txt`: each file opens with a
//! `#` paragraph saying what it shows, then blocks of a command, a `----`
//! line and the expected output. A reviewer reads the text diff instead of
//! test code. `RAFT_SCRIPT_REWRITE=1 cargo test -p cairn --lib raft::tests::script`
//! rewrites the expected outputs from what the code now does.

use std::fmt::Write as _;
use std::path::Path;

use bytes::Bytes;

use super::harness::Network;
use crate::raft::{Config, MessageType, ReadOnlyOption};

fn plain(_: &mut Config) {}
fn pre_vote(c: &mut Config) {
    c.pre_vote = true;
}
fn check_quorum(c: &mut Config) {
    c.check_quorum = true;
}
fn both(c: &mut Config) {
    c.pre_vote = true;
    c.check_quorum = true;
}
fn lease(c: &mut Config) {
    c.pre_vote = true;
    c.check_quorum = true;
    c.read_only_option = ReadOnlyOption::LeaseBased;
}

fn msg_type(name: &str) -> MessageType {
    MessageType::from_str_name(name).unwrap_or_else(|| panic!("unknown message type {name}"))
}

fn id(s: &str) -> u64 {
    s.parse().unwrap_or_else(|_| panic!("bad member id {s}"))
}

/// Runs one command and returns its output.
fn run(net: &mut Option<Network>, line: &str) -> String {
    let w: Vec<&str> = line.split_whitespace().collect();
    if w[0] == "cluster" {
        let f: fn(&mut Config) = match w.get(2).copied() {
            None => plain,
            Some("pre_vote") => pre_vote,
            Some("check_quorum") => check_quorum,
            Some("pre_vote+check_quorum") => both,
            Some("lease") => lease,
            Some(o) => panic!("unknown cluster option {o}"),
        };
        *net = Some(Network::new_with(id(w[1]), f));
        return "ok".into();
    }
    let net = net.as_mut().expect("`cluster` must come first");
    let res = |r: Result<(), crate::raft::RaftError>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("error: {e}"),
    };
    match w[0] {
        "campaign" => {
            let r = net.node(id(w[1])).campaign();
            net.deliver();
            res(r)
        }
        "tick" => {
            let n: usize = w[2].parse().unwrap();
            for _ in 0..n {
                net.tick(id(w[1]));
                net.deliver();
            }
            "ok".into()
        }
        "tick-all" => {
            net.tick_all(w[1].parse().unwrap());
            "ok".into()
        }
        "propose" => res(net.propose(id(w[1]), w[2])),
        "read" => {
            let r = net
                .node(id(w[1]))
                .read_index(Bytes::copy_from_slice(w[2].as_bytes()));
            net.deliver();
            res(r)
        }
        "transfer" => {
            let r = net.node(id(w[1])).transfer_leader(id(w[2]));
            net.deliver();
            res(r)
        }
        "isolate" => {
            net.isolate(id(w[1]));
            "ok".into()
        }
        "cut" => {
            let (a, b) = (id(w[1]), id(w[2]));
            net.cut.insert((a, b));
            net.cut.insert((b, a));
            "ok".into()
        }
        "heal" => {
            net.heal();
            "ok".into()
        }
        "restart" => {
            net.restart(id(w[1]));
            "ok".into()
        }
        "compact" => format!("snapshot at {}", net.compact(id(w[1]))),
        "clear-sent" => {
            net.sent.clear();
            "ok".into()
        }
        "sent" => {
            let mut out = String::new();
            for m in net.take_sent(msg_type(w[1])) {
                let _ = write!(out, "{}->{} term={}", m.from, m.to, m.term);
                if !m.entries.is_empty() {
                    let _ = write!(out, " entries={}", m.entries.len());
                }
                if !m.context.is_empty() {
                    let _ = write!(out, " ctx");
                }
                if m.reject {
                    let _ = write!(out, " reject");
                }
                out.push('\n');
            }
            net.sent.clear();
            if out.is_empty() {
                "none".into()
            } else {
                out.trim_end().to_string()
            }
        }
        "reads" => {
            let m = net.members.get_mut(&id(w[1])).unwrap();
            let v: Vec<String> = m
                .read_states
                .drain(..)
                .map(|r| format!("{}@{}", String::from_utf8_lossy(&r.request_ctx), r.index))
                .collect();
            if v.is_empty() {
                "none".into()
            } else {
                v.join(" ")
            }
        }
        "applied" => {
            let v = net.applied_data(id(w[1]));
            if v.is_empty() {
                "none".into()
            } else {
                v.join(" ")
            }
        }
        "status" => {
            let ids: Vec<u64> = net.members.keys().copied().collect();
            let mut out = String::new();
            for i in ids {
                let s = net.node(i).status();
                let _ = writeln!(
                    out,
                    "{i}: {:?} term={} lead={} commit={} applied={} last={}",
                    s.soft_state.role,
                    s.hard_state.term,
                    s.soft_state.leader_id,
                    s.hard_state.commit,
                    s.applied,
                    s.last_index
                );
            }
            out.trim_end().to_string()
        }
        other => panic!("unknown command {other}"),
    }
}

fn run_file(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let rewrite = std::env::var("RAFT_SCRIPT_REWRITE").is_ok();
    let mut out = String::new();
    let mut net = None;
    let mut lines = text.lines().peekable();
    let mut failures = Vec::new();
    while let Some(line) = lines.next() {
        if line.starts_with('#') || line.trim().is_empty() {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let cmd = line.trim();
        out.push_str(line);
        out.push('\n');
        assert_eq!(
            lines.next(),
            Some("----"),
            "{}: `----` after `{cmd}`",
            path.display()
        );
        let mut expected = Vec::new();
        while let Some(l) = lines.peek() {
            if l.trim().is_empty() {
                break;
            }
            expected.push(lines.next().unwrap());
        }
        let got = run(&mut net, cmd);
        if got != expected.join("\n") {
            failures.push(format!(
                "{}: `{cmd}`\n--- expected\n{}\n--- got\n{got}",
                path.display(),
                expected.join("\n")
            ));
        }
        out.push_str("----\n");
        out.push_str(&got);
        out.push('\n');
    }
    if rewrite {
        std::fs::write(path, out).unwrap();
    } else {
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }
}

#[test]
fn testdata_scripts() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/raft/testdata");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no scripts in {}", dir.display());
    for f in files {
        run_file(&f);
    }
}
