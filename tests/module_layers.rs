//! The daemon's modules form layers: no module of `src/` (and no module of
//! the member in `src/server/`) reaches, through the modules it uses, back to
//! itself. Guards against import circles, which make a layer impossible to
//! read, test or replace on its own.
//!
//! The graph is read from the source text: every path through `crate::`
//! (and `super::` between the member's modules) names an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Folders of `src/server/` that hold a layer's modules side by side: each
/// file in one is a module of the graph.
const LAYER_FOLDERS: [&str; 3] = ["api", "keyspace", "member"];

/// The module a file belongs to: `server::<layer>::<name>` for a file of a
/// layer folder, `server::<name>` for the member's other modules, else the
/// crate's top-level module.
fn module_of(rel: &Path) -> Option<String> {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    match parts.as_slice() {
        [only] if only == "lib" || only == "main" => None,
        [server, rest @ ..] if server == "server" && !rest.is_empty() => match rest {
            [only] if only == "mod" => None,
            [layer, file] if LAYER_FOLDERS.contains(&layer.as_str()) => Some(if file == "mod" {
                format!("server::{layer}")
            } else {
                format!("server::{layer}::{file}")
            }),
            [first, ..] => Some(format!("server::{first}")),
            [] => None,
        },
        [first, ..] => Some(first.clone()),
        [] => None,
    }
}

/// The module of the graph that `server::<name>` names from inside
/// `server::<parent>` (`parent` empty: from `server` itself).
fn server_module(src: &Path, parent: &str, name: &str) -> String {
    if parent.is_empty() {
        return format!("server::{name}");
    }
    if src
        .join("server")
        .join(parent)
        .join(format!("{name}.rs"))
        .is_file()
    {
        format!("server::{parent}::{name}")
    } else {
        format!("server::{parent}")
    }
}

/// Identifiers named right after `prefix`: `prefix name` or the first name of
/// each item of `prefix {a, b::c, d}`.
fn names_after(text: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        // Only whole paths: `prefix` must not continue another identifier.
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if depth == 1 && item_start && !c.is_whitespace() => {
                        item_start = false;
                        out.push(ident(&group[i..]));
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident(rest));
        }
    }
    out.retain(|n| !n.is_empty() && n != "self");
    out
}

/// The text with every `//` comment cut off its line (doc comments
/// included).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            // `://` belongs to a URL inside a string, not a comment.
            Some(at) if !line[..at].ends_with(':') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Edges module -> modules it names, over the whole of `src/`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let Some(from) = module_of(rel) else {
            continue;
        };
        // Tests of a module may reach anywhere; comments name no edge.
        if rel.components().any(|c| c.as_os_str() == "tests") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap_or("");
        let text = without_comments(text);
        let text = text.as_str();
        let mut to = BTreeSet::new();
        for name in names_after(text, "crate::") {
            if name == "server" {
                continue;
            }
            to.insert(name);
        }
        for name in names_after(text, "crate::server::") {
            if !LAYER_FOLDERS.contains(&name.as_str()) {
                to.insert(format!("server::{name}"));
            }
        }
        for layer in LAYER_FOLDERS {
            for name in names_after(text, &format!("crate::server::{layer}::")) {
                to.insert(server_module(src, layer, &name));
            }
        }
        if rel.starts_with("server") {
            // `super::` paths that reach `server` or a layer folder.
            let mut path: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if path.last().is_some_and(|l| l == "mod") {
                path.pop();
            }
            for hops in 1..path.len() {
                let parent = &path[..path.len() - hops];
                let parent = match parent {
                    [_server] => "",
                    [_server, layer] if LAYER_FOLDERS.contains(&layer.as_str()) => layer.as_str(),
                    _ => continue,
                };
                for name in names_after(text, &"super::".repeat(hops)) {
                    if name != "super" {
                        to.insert(server_module(src, parent, &name));
                    }
                }
            }
        }
        to.remove(&from);
        graph.entry(from).or_default().extend(to);
    }
    graph
}

/// Every set of modules that reach each other (Tarjan's strongly connected
/// components), for the ones of more than one module.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.graph.contains_key(w) {
                continue;
            }
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn the_graph_reader_finds_paths_and_groups() {
    let text = "use super::{convert, entry::{self, X}, router::Reply};\n\
                let t = crate::server::shard::now_ms(); use crate::raft::{self as r};\n\
                fn f() { mysuper::x(); }";
    assert_eq!(names_after(text, "super::"), ["convert", "entry", "router"]);
    assert_eq!(names_after(text, "crate::server::"), ["shard"]);
    assert_eq!(names_after(text, "crate::"), ["server", "raft"]);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    g.entry("d".into()).or_default().insert("a".into());
    assert_eq!(circles(&g), vec![vec!["a", "b", "c"]]);
}

#[test]
fn no_module_reaches_back_to_itself() {
    // `CAIRN_LAYERS_SRC` points the check at another tree (an older commit's
    // `src/`, to see what it finds there).
    let src = std::env::var_os("CAIRN_LAYERS_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let graph = module_graph(&src);
    assert!(
        graph.contains_key("server::shard") && graph.contains_key("config"),
        "the graph was read: {graph:?}"
    );
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "modules that reach each other: {found:?}\nedges: {:#?}",
        graph
            .iter()
            .filter(|(m, _)| found.iter().flatten().any(|c| c == *m))
            .collect::<Vec<_>>()
    );
}

/// How high a module of the member sits: the member's wiring on top, then
/// the API services (with the gateway and auth), the keyspace layer, the
/// shard driver, what the shard driver keeps for the layers above (the auth
/// state shard 0 applies, the revision counter, the shards' command
/// inboxes), and what they all share at the bottom.
fn layer_rank(module: &str) -> Option<u32> {
    let rest = module.strip_prefix("server::")?;
    let first = rest.split("::").next().unwrap_or(rest);
    Some(match first {
        "member" => 6,
        "api" | "gateway" | "auth" => 5,
        "keyspace" => 4,
        "shard" => 3,
        "auth_state" | "revisions" | "shard_inbox" => 2,
        _ => 1,
    })
}

/// Uses of a higher layer by a lower one that are known and not yet
/// undone (docs/ARCHITECTURE.md, "What is not layered yet"): none now. A
/// new one fails the test.
const KNOWN_UPWARD: &[(&str, &str)] = &[];

#[test]
fn each_layer_uses_only_the_layers_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    let mut upward = Vec::new();
    for (from, tos) in &graph {
        let Some(rank_from) = layer_rank(from) else {
            continue;
        };
        for to in tos {
            let Some(rank_to) = layer_rank(to) else {
                continue;
            };
            if rank_to > rank_from && !KNOWN_UPWARD.contains(&(from.as_str(), to.as_str())) {
                upward.push(format!("(\"{from}\", \"{to}\")"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "lower layers using higher ones:\n{}",
        upward.join(",\n")
    );
}
