//! Strict serializability of the list-append txns (`txns.rs`), inferred as
//! Elle does for list-append histories.
//!
//! Values are unique per run, so a value names the txn that appended it, and
//! since a key's list only grows, a read of it names a version and every
//! version before it. Per key the version order is the longest list read;
//! every other read must be a prefix of it. From the version orders the
//! check builds a dependency graph over the committed txns (those that
//! answered ok, and unknown ones whose appends some read observed):
//!
//! - ww: the appender of a key's element `i` precedes that of element `i+1`;
//! - wr: the appender of the last element a read returned precedes the
//!   reader;
//! - rw: a reader of a version precedes the appender of the next element
//!   (the first, for a read of the empty list);
//! - rt: a txn that completed before another was invoked precedes it.
//!
//! A committed append that no read observed comes after the whole version
//! order: after the last element's appender and after the readers of the
//! longest list. Real-time edges go through a chain of virtual nodes, one per
//! completion in completion order: a txn points at its completion's node,
//! each node at the next, and the last node that completed before a txn's
//! invocation points at the txn, so a path from A to B through the chain
//! exists exactly when A completed before B was invoked. Unknown txns have no
//! completion and so no outgoing real-time edge.
//!
//! Every strongly connected component with two txns or more is a cycle of
//! the serialization order, reported with a shortest cycle found in it: G0
//! when ww edges alone close one, G1c when ww and wr do, G-single (one rw
//! edge) or G2 when rw edges are needed, strict-serializability when only a
//! real-time edge closes it. Reads that are not prefixes of the version
//! order (`incompatible-order`), lists holding an element twice
//! (`duplicate-elements`) and elements nobody appended or whose txn failed
//! (`G1a aborted read`) are reported too.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use super::txns::{Mop, TxnOutcome, TxnRecord, FINAL_READER};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Ww,
    Wr,
    Rw,
    Rt,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Ww => "ww",
            Kind::Wr => "wr",
            Kind::Rw => "rw",
            Kind::Rt => "rt",
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Edge<'a> {
    to: usize,
    kind: Kind,
    /// The key the dependency is on ("" for real time).
    key: &'a str,
}

/// The checker's findings.
#[derive(Debug, Default)]
pub struct Verdict {
    pub anomalies: Vec<String>,
    /// Unknown txns that some read showed committed.
    pub committed_unknown: usize,
}

/// Judges the txns (the final reads included).
pub fn check(txns: &[TxnRecord]) -> Verdict {
    let mut anomalies = Vec::new();
    let mut writer: HashMap<(&str, u64), usize> = HashMap::new();
    for (t, txn) in txns.iter().enumerate() {
        for mop in &txn.mops {
            if let Mop::Append { key, value } = mop {
                writer.insert((key.as_str(), *value), t);
            }
        }
    }
    // The reads of committed txns, per key.
    let mut reads: BTreeMap<&str, Vec<(usize, &[u64])>> = BTreeMap::new();
    for (t, txn) in txns.iter().enumerate() {
        if txn.outcome != TxnOutcome::Ok {
            continue;
        }
        for mop in &txn.mops {
            if let Mop::Read {
                key,
                list: Some(list),
            } = mop
            {
                reads.entry(key).or_default().push((t, list));
            }
        }
    }

    // Version orders, and what the reads say on their own.
    let mut versions: BTreeMap<&str, &[u64]> = BTreeMap::new();
    // Every element read, with its first reader.
    let mut observed: BTreeMap<(&str, u64), usize> = BTreeMap::new();
    for (&key, rs) in &reads {
        let (longest_by, longest) = rs
            .iter()
            .copied()
            .max_by_key(|(_, l)| l.len())
            .expect("a key with reads");
        versions.insert(key, longest);
        let mut duplicated: HashSet<&[u64]> = HashSet::new();
        for &(t, list) in rs {
            if !longest.starts_with(list) {
                anomalies.push(format!(
                    "incompatible-order: {key}: T{t} read {}, not a prefix of {} read by T{longest_by}",
                    show(list),
                    show(longest)
                ));
            }
            let mut seen = HashSet::new();
            if let Some(twice) = list.iter().find(|v| !seen.insert(**v)) {
                if duplicated.insert(list) {
                    anomalies.push(format!(
                        "duplicate-elements: {key}: T{t} read {twice} twice in {}",
                        show(list)
                    ));
                }
            }
            for &v in list {
                observed.entry((key, v)).or_insert(t);
            }
        }
    }
    for (&(key, v), &reader) in &observed {
        match writer.get(&(key, v)) {
            None => anomalies.push(format!(
                "G1a aborted read: {key}: T{reader} read {v}, which no txn appended"
            )),
            Some(&w) if txns[w].outcome == TxnOutcome::Failed => anomalies.push(format!(
                "G1a aborted read: {key}: T{reader} read {v}, appended by T{w}, which failed"
            )),
            Some(_) => {}
        }
    }

    let committed: Vec<bool> = txns
        .iter()
        .map(|txn| match txn.outcome {
            TxnOutcome::Ok => true,
            TxnOutcome::Failed => false,
            TxnOutcome::Unknown => txn.mops.iter().any(|m| {
                matches!(m, Mop::Append { key, value }
                    if observed.contains_key(&(key.as_str(), *value)))
            }),
        })
        .collect();
    let committed_unknown = txns
        .iter()
        .zip(&committed)
        .filter(|(txn, c)| **c && txn.outcome == TxnOutcome::Unknown)
        .count();

    let graph = build_graph(txns, &committed, &writer, &reads, &versions);
    let n = txns.len();
    let plain: Vec<Vec<usize>> = graph
        .iter()
        .map(|edges| edges.iter().map(|e| e.to).collect())
        .collect();
    for component in tarjan(&plain) {
        let in_txns = component.iter().filter(|&&v| v < n).count();
        if in_txns >= 2 {
            anomalies.push(describe(txns, &graph, &component));
        }
    }
    Verdict {
        anomalies,
        committed_unknown,
    }
}

/// The dependency graph: nodes `0..txns.len()` are the txns (only committed
/// ones get edges), then one virtual node per completion.
fn build_graph<'a>(
    txns: &[TxnRecord],
    committed: &[bool],
    writer: &HashMap<(&'a str, u64), usize>,
    reads: &BTreeMap<&'a str, Vec<(usize, &[u64])>>,
    versions: &BTreeMap<&'a str, &[u64]>,
) -> Vec<Vec<Edge<'a>>> {
    let n = txns.len();
    let mut graph: Vec<Vec<Edge<'a>>> = vec![Vec::new(); n];
    let add = |graph: &mut Vec<Vec<Edge<'a>>>, from: usize, to: usize, kind, key| {
        if from != to {
            graph[from].push(Edge { to, kind, key });
        }
    };
    let appender = |key: &'a str, v: u64| writer.get(&(key, v)).copied().filter(|&w| committed[w]);
    let mut in_version: HashSet<(&str, u64)> = HashSet::new();
    for (&key, &version) in versions {
        in_version.extend(version.iter().map(|&v| (key, v)));
        for pair in version.windows(2) {
            if let (Some(a), Some(b)) = (appender(key, pair[0]), appender(key, pair[1])) {
                add(&mut graph, a, b, Kind::Ww, key);
            }
        }
        for &(r, list) in &reads[key] {
            if let Some(w) = list.last().and_then(|&v| appender(key, v)) {
                add(&mut graph, w, r, Kind::Wr, key);
            }
            if version.starts_with(list) {
                if let Some(w) = version.get(list.len()).and_then(|&v| appender(key, v)) {
                    add(&mut graph, r, w, Kind::Rw, key);
                }
            }
        }
    }
    // A committed append outside the version order comes after all of it.
    for (t, txn) in txns.iter().enumerate() {
        if !committed[t] {
            continue;
        }
        for mop in &txn.mops {
            let Mop::Append { key, value } = mop else {
                continue;
            };
            let Some((&key, &version)) = versions.get_key_value(key.as_str()) else {
                continue;
            };
            if in_version.contains(&(key, *value)) {
                continue;
            }
            if let Some(w) = version.last().and_then(|&v| appender(key, v)) {
                add(&mut graph, w, t, Kind::Ww, key);
            }
            for &(r, list) in &reads[key] {
                if list == version {
                    add(&mut graph, r, t, Kind::Rw, key);
                }
            }
        }
    }
    // Real time through the chain of completions.
    let mut done: Vec<usize> = (0..n)
        .filter(|&t| committed[t] && txns[t].complete_ns != u64::MAX)
        .collect();
    done.sort_by_key(|&t| txns[t].complete_ns);
    graph.resize(n + done.len(), Vec::new());
    for (j, &t) in done.iter().enumerate() {
        add(&mut graph, t, n + j, Kind::Rt, "");
        if j + 1 < done.len() {
            add(&mut graph, n + j, n + j + 1, Kind::Rt, "");
        }
    }
    let completions: Vec<u64> = done.iter().map(|&t| txns[t].complete_ns).collect();
    for t in (0..n).filter(|&t| committed[t]) {
        let before = completions.partition_point(|&c| c < txns[t].invoke_ns);
        if before > 0 {
            add(&mut graph, n + before - 1, t, Kind::Rt, "");
        }
    }
    graph
}

/// The anomaly of one strongly connected component: its class, its txns and
/// edge kinds, and a shortest cycle of the class found in it.
fn describe(txns: &[TxnRecord], graph: &[Vec<Edge>], component: &[usize]) -> String {
    let n = txns.len();
    let local: HashMap<usize, usize> = component.iter().enumerate().map(|(i, &v)| (v, i)).collect();
    let kinds: BTreeSet<Kind> = component
        .iter()
        .flat_map(|&v| graph[v].iter())
        .filter(|e| local.contains_key(&e.to))
        .map(|e| e.kind)
        .collect();
    let levels: [(&str, &[Kind]); 4] = [
        ("G0", &[Kind::Ww]),
        ("G1c", &[Kind::Ww, Kind::Wr]),
        ("G2", &[Kind::Ww, Kind::Wr, Kind::Rw]),
        (
            "strict-serializability",
            &[Kind::Ww, Kind::Wr, Kind::Rw, Kind::Rt],
        ),
    ];
    let mut found = None;
    for (class, allowed) in levels {
        // The component's edges of the allowed kinds, on local indices.
        let edges: Vec<Vec<(usize, Edge)>> = component
            .iter()
            .map(|&v| {
                graph[v]
                    .iter()
                    .filter(|e| allowed.contains(&e.kind))
                    .filter_map(|e| local.get(&e.to).map(|&to| (to, *e)))
                    .collect()
            })
            .collect();
        let plain: Vec<Vec<usize>> = edges
            .iter()
            .map(|es| es.iter().map(|(to, _)| *to).collect())
            .collect();
        let sub = tarjan(&plain)
            .into_iter()
            .find(|s| s.iter().filter(|&&l| component[l] < n).count() >= 2);
        if let Some(sub) = sub {
            // The earliest txn of the cycle, for a stable report.
            let start = *sub
                .iter()
                .filter(|&&l| component[l] < n)
                .min_by_key(|&&l| component[l])
                .expect("a txn in the cycle");
            let cycle = shortest_cycle(&edges, &sub, start);
            let rw = cycle.iter().filter(|(_, e)| e.kind == Kind::Rw).count();
            let class = if class == "G2" && rw == 1 {
                "G-single"
            } else {
                class
            };
            found = Some((class, start, cycle));
            break;
        }
    }
    let (class, start, cycle) = found.expect("a strongly connected component holds a cycle");
    let mut path = String::new();
    let mut in_cycle = Vec::new();
    for (from, e) in &cycle {
        let from = component[*from];
        if from < n {
            path.push_str(&format!("T{from} "));
            in_cycle.push(from);
            if e.kind == Kind::Rt {
                path.push_str("-rt-> ");
            } else {
                path.push_str(&format!("-{}({})-> ", e.kind.name(), e.key));
            }
        }
    }
    path.push_str(&format!("T{}", component[start]));
    let members: Vec<usize> = component.iter().copied().filter(|&v| v < n).collect();
    let mut named: Vec<String> = members.iter().take(20).map(|t| format!("T{t}")).collect();
    if members.len() > 20 {
        named.push(format!("and {} more", members.len() - 20));
    }
    let kinds: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    let details: Vec<String> = in_cycle.iter().map(|&t| show_txn(t, &txns[t])).collect();
    format!(
        "{class}: {} txns in a cycle over {} edges ({}); a cycle: {path}; {}",
        members.len(),
        kinds.join("/"),
        named.join(" "),
        details.join("; ")
    )
}

/// A shortest cycle through `start` within `sub` (local indices): the steps
/// as (from, edge).
fn shortest_cycle<'a>(
    edges: &[Vec<(usize, Edge<'a>)>],
    sub: &[usize],
    start: usize,
) -> Vec<(usize, Edge<'a>)> {
    let inside: HashSet<usize> = sub.iter().copied().collect();
    let mut parent: HashMap<usize, (usize, Edge)> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(u) = queue.pop_front() {
        for &(to, e) in &edges[u] {
            if to == start {
                let mut cycle = vec![(u, e)];
                let mut at = u;
                while at != start {
                    let (p, pe) = parent[&at];
                    cycle.push((p, pe));
                    at = p;
                }
                cycle.reverse();
                return cycle;
            }
            if inside.contains(&to) && !parent.contains_key(&to) {
                parent.insert(to, (u, e));
                queue.push_back(to);
            }
        }
    }
    unreachable!("a node of a strongly connected component reaches itself")
}

/// Strongly connected components (Tarjan's, without recursion).
fn tarjan(graph: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const NONE: usize = usize::MAX;
    let n = graph.len();
    let mut index = vec![NONE; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut next = 0;
    let mut calls: Vec<(usize, usize)> = Vec::new();
    for root in 0..n {
        if index[root] != NONE {
            continue;
        }
        calls.push((root, 0));
        while let Some(&(v, i)) = calls.last() {
            if index[v] == NONE {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if i < graph[v].len() {
                calls.last_mut().expect("a call").1 += 1;
                let w = graph[v][i];
                if index[w] == NONE {
                    calls.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(u, _)) = calls.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                loop {
                    let w = stack.pop().expect("on the stack");
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// A list, its last few elements when long.
fn show(list: &[u64]) -> String {
    const TAIL: usize = 4;
    if list.len() <= TAIL {
        return format!("{list:?}");
    }
    let tail: Vec<String> = list[list.len() - TAIL..]
        .iter()
        .map(u64::to_string)
        .collect();
    format!("[({} before), {}]", list.len() - TAIL, tail.join(", "))
}

fn show_txn(t: usize, txn: &TxnRecord) -> String {
    let who = match txn.client {
        FINAL_READER => "final read".to_string(),
        c => format!("client {c}"),
    };
    let complete = match txn.complete_ns {
        u64::MAX => "?".to_string(),
        c => format!("{:.3}", c as f64 / 1e9),
    };
    let mops: Vec<String> = txn
        .mops
        .iter()
        .map(|m| match m {
            Mop::Read {
                key,
                list: Some(list),
            } => format!("r {key} {}", show(list)),
            Mop::Read { key, list: None } => format!("r {key} ?"),
            Mop::Append { key, value } => format!("a {key} {value}"),
        })
        .collect();
    format!(
        "T{t} = {who} {:?} {:.3}-{complete} s [{}]",
        txn.outcome,
        txn.invoke_ns as f64 / 1e9,
        mops.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(key: &str, list: &[u64]) -> Mop {
        Mop::Read {
            key: key.into(),
            list: Some(list.to_vec()),
        }
    }

    fn a(key: &str, value: u64) -> Mop {
        Mop::Append {
            key: key.into(),
            value,
        }
    }

    fn txn(outcome: TxnOutcome, invoke_ns: u64, complete_ns: u64, mops: Vec<Mop>) -> TxnRecord {
        TxnRecord {
            client: 0,
            mops,
            invoke_ns,
            complete_ns: if outcome == TxnOutcome::Unknown {
                u64::MAX
            } else {
                complete_ns
            },
            outcome,
        }
    }

    fn ok(invoke_ns: u64, complete_ns: u64, mops: Vec<Mop>) -> TxnRecord {
        txn(TxnOutcome::Ok, invoke_ns, complete_ns, mops)
    }

    /// The one anomaly found, which must start with `class`.
    fn only(found: &Verdict, class: &str) -> String {
        assert_eq!(found.anomalies.len(), 1, "{:#?}", found.anomalies);
        let a = found.anomalies[0].clone();
        assert!(a.starts_with(&format!("{class}:")), "{a}");
        a
    }

    #[test]
    fn elle_passes_a_serial_history_and_overlapping_txns() {
        let h = [
            ok(0, 10, vec![a("x", 1), r("y", &[])]),
            ok(20, 30, vec![r("x", &[1]), a("y", 2)]),
            ok(40, 50, vec![a("x", 3), r("y", &[2])]),
            // Overlapping txns may take effect in either order: this read
            // sees an append that completed after the read did.
            ok(60, 70, vec![r("x", &[1, 3, 4])]),
            ok(55, 80, vec![a("x", 4)]),
            ok(90, 95, vec![r("x", &[1, 3, 4]), r("y", &[2])]),
        ];
        let found = check(&h);
        assert!(found.anomalies.is_empty(), "{:#?}", found.anomalies);
        assert_eq!(found.committed_unknown, 0);
    }

    #[test]
    fn elle_catches_write_skew_as_g2() {
        // Each read the key the other appended to, both saw it empty.
        let h = [
            ok(0, 10, vec![r("x", &[]), a("y", 1)]),
            ok(0, 10, vec![r("y", &[]), a("x", 2)]),
            ok(20, 30, vec![r("x", &[2]), r("y", &[1])]),
        ];
        let said = only(&check(&h), "G2");
        assert!(
            said.contains("-rw(x)->") && said.contains("-rw(y)->"),
            "{said}"
        );
    }

    #[test]
    fn elle_catches_a_lost_update_as_g_single() {
        // Both read x empty and appended to it; only one append survived.
        let h = [
            ok(0, 10, vec![r("x", &[]), a("x", 1)]),
            ok(0, 10, vec![r("x", &[]), a("x", 2)]),
            ok(20, 30, vec![r("x", &[2])]),
        ];
        let said = only(&check(&h), "G-single");
        assert!(said.contains("T0 -rw(x)-> T1 -ww(x)-> T0"), "{said}");
    }

    #[test]
    fn elle_catches_a_wr_cycle_as_g1c_and_a_ww_cycle_as_g0() {
        let g1c = [
            ok(0, 10, vec![a("x", 1), r("y", &[2])]),
            ok(0, 10, vec![a("y", 2), r("x", &[1])]),
        ];
        let said = only(&check(&g1c), "G1c");
        assert!(
            said.contains("-wr(x)->") && said.contains("-wr(y)->"),
            "{said}"
        );
        let g0 = [
            ok(0, 10, vec![a("x", 1), a("y", 2)]),
            ok(0, 10, vec![a("x", 3), a("y", 4)]),
            ok(20, 30, vec![r("x", &[1, 3]), r("y", &[4, 2])]),
        ];
        only(&check(&g0), "G0");
    }

    #[test]
    fn elle_catches_a_stale_read_as_strict_serializability() {
        // T1 was invoked after T0 completed, yet misses T0's append.
        let h = [
            ok(0, 10, vec![a("x", 1)]),
            ok(20, 30, vec![r("x", &[])]),
            ok(40, 50, vec![r("x", &[1])]),
        ];
        let said = only(&check(&h), "strict-serializability");
        assert!(said.contains("T0 -rt-> T1 -rw(x)-> T0"), "{said}");
        // Overlapping in time, the same reads are serializable.
        let h = [
            ok(0, 25, vec![a("x", 1)]),
            ok(20, 30, vec![r("x", &[])]),
            ok(40, 50, vec![r("x", &[1])]),
        ];
        assert!(check(&h).anomalies.is_empty());
        // An acknowledged append the final read lacks is lost.
        let h = [ok(0, 10, vec![a("x", 1)]), ok(20, 30, vec![r("x", &[])])];
        only(&check(&h), "strict-serializability");
    }

    #[test]
    fn elle_catches_incompatible_orders_and_duplicates() {
        let h = [
            ok(0, 10, vec![a("x", 1)]),
            ok(0, 10, vec![a("x", 2)]),
            ok(20, 30, vec![r("x", &[1, 2])]),
            ok(20, 30, vec![r("x", &[2])]),
        ];
        let said = only(&check(&h), "incompatible-order");
        assert!(said.contains("T3 read [2]"), "{said}");
        let h = [
            ok(0, 10, vec![a("x", 1)]),
            ok(20, 30, vec![r("x", &[1, 1])]),
        ];
        only(&check(&h), "duplicate-elements");
    }

    #[test]
    fn elle_catches_aborted_reads() {
        let h = [
            txn(TxnOutcome::Failed, 0, 10, vec![a("x", 1)]),
            ok(20, 30, vec![r("x", &[1]), r("y", &[7])]),
        ];
        let found = check(&h);
        assert_eq!(found.anomalies.len(), 2, "{:#?}", found.anomalies);
        assert!(found
            .anomalies
            .iter()
            .all(|a| a.starts_with("G1a aborted read:")));
        assert!(found
            .anomalies
            .iter()
            .any(|a| a.contains("T0, which failed")));
        assert!(found
            .anomalies
            .iter()
            .any(|a| a.contains("7, which no txn appended")));
    }

    #[test]
    fn elle_counts_an_observed_unknown_txn_as_committed() {
        let unknown = |mops| txn(TxnOutcome::Unknown, 0, 0, mops);
        // T0's append to x was seen, so its append to y committed with it;
        // T1's was never seen: it may never have happened.
        let h = [
            unknown(vec![a("x", 1), a("y", 2)]),
            unknown(vec![a("z", 9)]),
            ok(20, 30, vec![r("x", &[1])]),
            ok(40, 50, vec![r("x", &[1]), r("y", &[2]), r("z", &[])]),
        ];
        let found = check(&h);
        assert!(found.anomalies.is_empty(), "{:#?}", found.anomalies);
        assert_eq!(found.committed_unknown, 1);
        // Committed, it takes part in cycles: T2 sees its x but not its y.
        let h = [
            unknown(vec![a("x", 1), a("y", 2)]),
            ok(20, 30, vec![r("x", &[1]), r("y", &[])]),
            ok(40, 50, vec![r("x", &[1]), r("y", &[2])]),
        ];
        let said = only(&check(&h), "G-single");
        assert!(said.contains("T0 -wr(x)-> T1 -rw(y)-> T0"), "{said}");
    }
}
