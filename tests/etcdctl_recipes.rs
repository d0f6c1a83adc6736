//! etcd 3.4's etcdctl recipes that run for a while against Cairn, as operators
//! run them: `elect` (campaign and observe on a 3-member cluster, leadership
//! passing on when the leader resigns or its lease goes), `lock` and `elect`
//! under contention on names of every shape at every shard count, `txn` over
//! keys of unrelated routing prefixes (one shard or several), and `make-mirror`
//! (from a real etcd into Cairn and from Cairn into etcd: the existing keys
//! under a prefix, then the puts and deletes that follow). Guards against
//! watch, lease or transaction behaviour that etcd's concurrency package
//! (election) or its mirror syncer (a paged read at one revision, then a watch
//! from the next) would trip over, and against a txn an operator types that
//! applies on some shards and not others.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long any one step may take on a busy 2-core machine before the test
/// gives up; steps normally take well under a second.
const STEP_DEADLINE: Duration = Duration::from_secs(60);

/// A long-running etcdctl whose stdout lines are collected as they come;
/// killed when dropped.
struct Background {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    what: String,
}

impl Background {
    fn start(endpoints: &str, args: &[&str]) -> Background {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start etcdctl");
        let lines = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Background {
            child,
            lines,
            what: format!("etcdctl {}", args.join(" ")),
        }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits until the output satisfies `done`.
    fn wait_for(&self, what: &str, done: impl Fn(&[String]) -> bool) {
        common::wait_until(&format!("{}: {what}", self.what), STEP_DEADLINE, || {
            let lines = self.lines();
            if done(&lines) {
                Ok(())
            } else {
                Err(format!("output so far: {lines:?}"))
            }
        });
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe {
            libc::kill(self.child.id() as i32, signal);
        }
    }

    /// Waits for the process to exit (after a signal); its success.
    fn wait_exit(&mut self) -> bool {
        let what = format!("{} exiting", self.what);
        common::wait_until(&what, STEP_DEADLINE, || {
            match self.child.try_wait().expect("wait etcdctl") {
                Some(status) => Ok(status.success()),
                None => Err("still running".into()),
            }
        })
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The values an `elect` campaigner or observer printed: it prints each
/// leader's key (`<election>/<lease id>`) and then its proposal.
fn proposals(lines: &[String], election: &str) -> Vec<String> {
    let key_prefix = format!("{election}/");
    lines
        .iter()
        .filter(|l| !l.starts_with(&key_prefix))
        .cloned()
        .collect()
}

/// `etcdctl get --prefix` as (key, value) pairs, each key's value on the
/// line after it.
fn get_prefix(endpoint: &str, prefix: &str) -> Vec<(String, String)> {
    let (ok, out) = common::etcdctl(endpoint, &["get", "--prefix", prefix]);
    assert!(ok, "get --prefix {prefix} from {endpoint}: {out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len().is_multiple_of(2), "odd get output: {out}");
    lines
        .chunks(2)
        .map(|kv| (kv[0].to_string(), kv[1].to_string()))
        .collect()
}

/// Waits until `count` campaigners' keys are under `election`.
fn campaigners(endpoints: &str, election: &str, count: usize, what: &str) {
    common::wait_until(what, STEP_DEADLINE, || {
        let keys = get_prefix(endpoints, &format!("{election}/"));
        if keys.len() >= count {
            Ok(())
        } else {
            Err(format!("keys {keys:?}"))
        }
    });
}

fn put(endpoint: &str, key: &str, value: &str) {
    let (ok, out) = common::etcdctl(endpoint, &["put", key, value]);
    assert!(ok, "put {key} on {endpoint}: {out}");
}

fn del(endpoint: &str, key: &str) {
    let (ok, out) = common::etcdctl(endpoint, &["del", key]);
    assert!(ok && out.trim() == "1", "del {key} on {endpoint}: {out}");
}

/// Waits until `endpoint` holds exactly `want` under `prefix`.
fn wait_contents(
    endpoint: &str,
    prefix: &str,
    want: &[(&str, &str)],
    context: &dyn Fn() -> String,
) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    common::try_wait_until(
        &format!("{endpoint} holding {want:?} under {prefix}"),
        STEP_DEADLINE,
        || {
            let got = get_prefix(endpoint, prefix);
            if got == want {
                Ok(())
            } else {
                Err(format!("have {got:?}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", context()));
}

/// Waits until a put through `endpoint` succeeds (a leader exists).
fn wait_writable(endpoint: &str) {
    wait_writable_key(endpoint, "/ready");
}

/// Waits until a put of `key` through `endpoint` succeeds (its shard has
/// a leader).
fn wait_writable_key(endpoint: &str, key: &str) {
    common::wait_until(
        &format!("{endpoint} taking a put of {key}"),
        STEP_DEADLINE,
        || match common::etcdctl(endpoint, &["put", key, "1"]) {
            (true, _) => Ok(()),
            (false, out) => Err(out),
        },
    );
}

#[test]
fn etcdctl_elect_passes_leadership_on() {
    if !common::require_tool("etcdctl") {
        return;
    }
    let cluster = common::Cluster::start(3, &[]);
    let endpoints = cluster.endpoints().join(",");
    wait_writable(&endpoints);
    let election = "cairn-election";
    let observer = Background::start(&endpoints, &["elect", "-l", election]);
    let p1 = Background::start(&endpoints, &["elect", election, "p1"]);
    p1.wait_for("won the empty election", |l| {
        proposals(l, election) == ["p1"]
    });
    observer.wait_for("saw p1 lead", |l| proposals(l, election) == ["p1"]);

    // p2 campaigns: its key is there, behind p1's, and it does not lead.
    let p2 = Background::start(&endpoints, &["elect", election, "p2"]);
    campaigners(&endpoints, election, 2, "p2 campaigning");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(proposals(&p2.lines(), election), Vec::<String>::new());
    assert_eq!(proposals(&observer.lines(), election), ["p1"]);

    // SIGTERM: etcdctl resigns (deletes its key) and revokes its lease.
    let mut p1 = p1;
    p1.signal(libc::SIGTERM);
    p1.wait_exit();
    p2.wait_for("won after p1 resigned", |l| {
        proposals(l, election) == ["p2"]
    });
    observer.wait_for("saw p2 lead", |l| proposals(l, election) == ["p1", "p2"]);

    // kill -9 leaves p2's key and lease behind until the lease expires (60 s
    // for etcdctl's session); revoking the lease is what its expiry does.
    let p3 = Background::start(&endpoints, &["elect", election, "p3"]);
    campaigners(&endpoints, election, 2, "p3 campaigning");
    let mut p2 = p2;
    p2.signal(libc::SIGKILL);
    p2.wait_exit();
    let leader_key = p2.lines()[0].clone();
    let lease_hex = leader_key
        .strip_prefix(&format!("{election}/"))
        .expect("p2 printed its key");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        proposals(&p3.lines(), election),
        Vec::<String>::new(),
        "p3 led while p2's lease was alive"
    );
    let (ok, out) = common::etcdctl(&endpoints, &["lease", "revoke", lease_hex]);
    assert!(ok, "lease revoke {lease_hex}: {out}");
    p3.wait_for("won after p2's lease went", |l| {
        proposals(l, election) == ["p3"]
    });
    observer.wait_for("saw p3 lead", |l| {
        proposals(l, election) == ["p1", "p2", "p3"]
    });
}

/// The shard counts the recipes run at, single and three members.
const SHARD_COUNTS: [usize; 4] = [1, 2, 4, 8];

/// Names of every shape a user gives a lock or an election: plain, with a
/// dash, and a '/' path. etcd's recipes put `<name>/<lease>` and read the
/// `<name>/` prefix in one txn, so a name works only if routing keeps its
/// keys on one shard, whatever `--shards` is.
const NAME_SHAPES: [&str; 3] = ["mylock", "locks-x", "/locks/y"];

/// `etcdctl lock` contenders per name.
const CONTENDERS: usize = 3;

/// Contenders lock every name shape at once, each holding its lock for a
/// moment while it writes `enter`/`exit` to the name's log: no two holds of
/// one name may overlap. Then one election per name shape: the first
/// campaigner leads, the second waits, and leads once the first resigns.
fn recipes_hold_on_every_name_shape(endpoints: &str, what: &str, context: &dyn Fn() -> String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = |n: usize| dir.path().join(format!("lock-{n}.log"));
    let mut holders = Vec::new();
    for (n, name) in NAME_SHAPES.iter().enumerate() {
        for c in 0..CONTENDERS {
            let section = format!(
                "echo enter {c} >> {log}; sleep 0.05; echo exit {c} >> {log}",
                log = log(n).display()
            );
            holders.push(Background::start(
                endpoints,
                &["lock", name, "--", "sh", "-c", &section],
            ));
        }
    }
    for h in &mut holders {
        let ok = h.wait_exit();
        assert!(
            ok,
            "{what}: {} failed: {:?}\n{}",
            h.what,
            h.lines(),
            context()
        );
    }
    for (n, name) in NAME_SHAPES.iter().enumerate() {
        let text = std::fs::read_to_string(log(n)).expect("lock log");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines.len(),
            2 * CONTENDERS,
            "{what}: lock {name}: {lines:?}"
        );
        let mut holders_seen = Vec::new();
        for pair in lines.chunks(2) {
            let who = pair[0].strip_prefix("enter ");
            assert!(
                who.is_some() && pair[1].strip_prefix("exit ") == who,
                "{what}: holds of lock {name} overlapped: {lines:?}"
            );
            holders_seen.push(who);
        }
        holders_seen.sort();
        holders_seen.dedup();
        assert_eq!(
            holders_seen.len(),
            CONTENDERS,
            "{what}: lock {name}: {lines:?}"
        );
    }
    for name in NAME_SHAPES {
        let election = format!("{name}-election");
        let mut first = Background::start(endpoints, &["elect", &election, "first"]);
        first.wait_for("won the empty election", |l| {
            proposals(l, &election) == ["first"]
        });
        let second = Background::start(endpoints, &["elect", &election, "second"]);
        campaigners(endpoints, &election, 2, "second campaigning");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            proposals(&second.lines(), &election),
            Vec::<String>::new(),
            "{what}: second led {election} while first did"
        );
        first.signal(libc::SIGTERM);
        first.wait_exit();
        let won = common::try_wait_until("won after first resigned", STEP_DEADLINE, || {
            let lines = second.lines();
            if proposals(&lines, &election) == ["second"] {
                Ok(())
            } else {
                Err(format!("output so far: {lines:?}"))
            }
        });
        if let Err(e) = won {
            panic!("{what}: {} {e}\n{}", second.what, context());
        }
    }
}

#[test]
fn lock_and_elect_hold_on_names_of_every_shape_at_every_shard_count() {
    if !common::require_tool("etcdctl") {
        return;
    }
    for members in [1, 3] {
        for shards in SHARD_COUNTS {
            let what = format!("{members} member(s), --shards {shards}");
            let cluster = common::Cluster::start(members, &["--shards", &shards.to_string()]);
            let endpoints = cluster.endpoints().join(",");
            wait_writable(&endpoints);
            recipes_hold_on_every_name_shape(&endpoints, &what, &|| cluster.logs());
        }
    }
}

/// Keys of three unrelated routing prefixes (a name up to its '/', a
/// Kubernetes resource type, a key without '/'): at 2, 4 and 8 shards they
/// route to more than one shard.
const TXN_KEYS: [&str; 3] = ["acct-a/x", "/registry/pods/p", "plainkey"];

/// Runs `etcdctl txn -w json` with `script` (compares, a blank line, the
/// success ops, a blank line, the failure ops, a blank line) on stdin:
/// whether it succeeded, and its JSON or the output that says why not.
fn etcdctl_txn(endpoints: &str, script: &str) -> Result<serde_json::Value, String> {
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .arg("--command-timeout=20s")
        .args(["txn", "-w", "json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start etcdctl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .expect("write the txn to etcdctl");
    let out = child.wait_with_output().expect("wait etcdctl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_str(&stdout).map_err(|e| format!("not JSON ({e}): {stdout}"))
}

/// `etcdctl get KEY [--rev REV] -w fields`: the key's value and mod
/// revision, or None when it is absent.
fn value_and_mod(endpoints: &str, key: &str, revision: Option<i64>) -> Option<(String, i64)> {
    let mut args = vec![
        "get".to_string(),
        key.to_string(),
        "-w".into(),
        "fields".into(),
    ];
    if let Some(r) = revision {
        args.extend(["--rev".into(), r.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out) = common::etcdctl(endpoints, &args);
    assert!(ok, "etcdctl {args:?}: {out}");
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("\"{name}\" : ")))
            .map(str::to_string)
    };
    field("Key")?;
    let value = field("Value").expect("a value beside the key");
    let modified = field("ModRevision").expect("a mod revision beside the key");
    Some((
        value.trim_matches('"').to_string(),
        modified.parse().expect("a numeric mod revision"),
    ))
}

/// Three `etcdctl txn`s over [`TXN_KEYS`], whose compares and operations
/// name keys of different shards when there are several: one whose
/// compares hold (every put at its header's revision), one whose compares
/// fail (the failure branch applied whole at its revision, the success
/// branch not at all), and one comparing exact mod revisions and a value
/// that puts and deletes.
fn txn_over_unrelated_keys(endpoints: &str, shards: usize, what: &str) {
    let routing = cairn::routing::RoutingTable::new(shards, 1);
    let placed = TXN_KEYS
        .map(|k| format!("{k} (shard {})", routing.shard_for_key(k.as_bytes())))
        .join(", ");
    let reached: std::collections::BTreeSet<u32> = TXN_KEYS
        .iter()
        .map(|k| routing.shard_for_key(k.as_bytes()))
        .collect();
    assert!(
        shards == 1 || reached.len() > 1,
        "{what}: the txn keys must span shards: {placed}"
    );
    // Every shard the txns touch takes a put first (each has a leader).
    for shard in &reached {
        let probe = (0..)
            .map(|i| format!("ready-{i}"))
            .find(|k| routing.shard_for_key(k.as_bytes()) == *shard)
            .expect("some key routes to every shard");
        wait_writable_key(endpoints, &probe);
    }
    let [a, pods, plain] = TXN_KEYS;
    let txn = |step: &str, script: &str| {
        let j = etcdctl_txn(endpoints, script).unwrap_or_else(|out| {
            panic!("{what}: etcdctl txn ({step}) over {placed} failed:\n{script}\n{out}")
        });
        let revision = j["header"]["revision"]
            .as_i64()
            .unwrap_or_else(|| panic!("{what}: etcdctl txn ({step}): no header revision: {j}"));
        // etcdctl's JSON leaves `succeeded` out when it is false.
        let succeeded = j["succeeded"].as_bool().unwrap_or(false);
        let responses = j["responses"].as_array().map_or(0, Vec::len);
        (succeeded, revision, responses)
    };
    let expect = |key: &str, want: Option<(&str, i64)>, step: &str| {
        let got = value_and_mod(endpoints, key, None);
        assert_eq!(
            got.as_ref().map(|(v, m)| (v.as_str(), *m)),
            want,
            "{what}: after the txn ({step}) over {placed}: {key} (value, mod revision)"
        );
    };

    let fresh = format!(
        "mod(\"{a}\") = \"0\"\nver(\"{pods}\") = \"0\"\n\nput {a} s1\nput {pods} s1\nput {plain} s1\n\nput {plain} f1\n\n"
    );
    let (succeeded, r1, responses) = txn("compares hold", &fresh);
    assert!(succeeded && responses == 3, "{what}: the first txn over {placed} took its success branch: {succeeded}, {responses} responses");
    for key in TXN_KEYS {
        expect(key, Some(("s1", r1)), "compares hold");
    }

    let again = format!(
        "mod(\"{a}\") = \"0\"\nver(\"{pods}\") = \"0\"\n\nput {a} s2\nput {pods} s2\n\nput {pods} f2\nput {plain} f2\nget {a}\n\n"
    );
    let (succeeded, r2, responses) = txn("compares fail", &again);
    assert!(!succeeded && responses == 3, "{what}: the second txn over {placed} took its failure branch: succeeded {succeeded}, {responses} responses");
    assert!(
        r2 > r1,
        "{what}: the failure branch's puts at {r2}, after {r1}"
    );
    expect(a, Some(("s1", r1)), "compares fail");
    expect(pods, Some(("f2", r2)), "compares fail");
    expect(plain, Some(("f2", r2)), "compares fail");

    let exact = format!(
        "mod(\"{a}\") = \"{r1}\"\nmod(\"{plain}\") = \"{r2}\"\nval(\"{pods}\") = \"f2\"\n\nput {a} s3\ndel {plain}\n\nput {a} f3\n\n"
    );
    let (succeeded, r3, responses) = txn("exact revisions", &exact);
    assert!(succeeded && responses == 2, "{what}: the third txn over {placed} took its success branch: {succeeded}, {responses} responses");
    expect(a, Some(("s3", r3)), "exact revisions");
    expect(pods, Some(("f2", r2)), "exact revisions");
    expect(plain, None, "exact revisions");
    assert_eq!(
        value_and_mod(endpoints, plain, Some(r3 - 1)),
        Some(("f2".to_string(), r2)),
        "{what}: {plain} just before the txn that deleted it, at {}",
        r3 - 1
    );
}

#[test]
fn etcdctl_txn_over_keys_of_different_shards_applies_one_branch_whole() {
    if !common::require_tool("etcdctl") {
        return;
    }
    // SHARD_COUNTS once transactions over several shards land; until then
    // a txn whose keys span shards is refused (FAILED_PRECONDITION).
    for shards in common::xtxn_shard_counts(&SHARD_COUNTS) {
        for members in [1, 3] {
            let what = format!("{members} member(s), --shards {shards}");
            let cluster = common::Cluster::start(members, &["--shards", &shards.to_string()]);
            let endpoints = cluster.endpoints().join(",");
            wait_writable(&endpoints);
            txn_over_unrelated_keys(&endpoints, shards, &what);
        }
    }
}

/// One `make-mirror` round from `source` to `dest`, of the keys under
/// `prefix` (under `dest_prefix` at `dest` if given, else the same keys):
/// `seed` is put at the source before the mirror starts, and the
/// destination must then hold `want[0]` (the mirror's first paged read);
/// `changes` (a put, or a delete for `None`) follow at the source while it
/// runs, and the destination must then hold `want[1]` (its watch). The
/// mirror, still running.
fn mirror_round(
    (source, dest): (&str, &str),
    (prefix, dest_prefix): (&str, Option<&str>),
    seed: &[(&str, &str)],
    changes: &[(&str, Option<&str>)],
    want: [&[(&str, &str)]; 2],
    context: &dyn Fn() -> String,
) -> Background {
    for (k, v) in seed {
        put(source, k, v);
    }
    let mut args = vec!["make-mirror", "--prefix", prefix];
    if let Some(d) = dest_prefix {
        args.extend(["--dest-prefix", d]);
    }
    args.push(dest);
    let mirror = Background::start(source, &args);
    let under = dest_prefix.unwrap_or(prefix);
    wait_contents(dest, under, want[0], context);
    for (k, v) in changes {
        match v {
            Some(v) => put(source, k, v),
            None => del(source, k),
        }
    }
    wait_contents(dest, under, want[1], context);
    mirror
}

#[test]
fn etcdctl_make_mirror_between_etcd_and_cairn() {
    if !common::require_tool("etcdctl") || !common::require_tool("etcd") {
        return;
    }
    let etcd = common::Etcd::start();
    let cluster = common::Cluster::start(1, &["--cores", "1"]);
    let cairn = cluster.members[0].endpoint();
    let etcd_ep = etcd.endpoint.clone();
    wait_writable(&etcd_ep);
    wait_writable(&cairn);
    let context = || format!("==== etcd ====\n{}\n{}", etcd.log_text(), cluster.logs());

    // etcd -> Cairn, same keys.
    let to_cairn = mirror_round(
        (&etcd_ep, &cairn),
        ("/src/", None),
        &[
            ("/src/a", "1"),
            ("/src/b", "2"),
            ("/src/c", "3"),
            ("/other", "x"),
        ],
        &[
            ("/src/d", Some("4")),
            ("/src/a", None),
            ("/src/b", Some("2b")),
        ],
        [
            &[("/src/a", "1"), ("/src/b", "2"), ("/src/c", "3")],
            &[("/src/b", "2b"), ("/src/c", "3"), ("/src/d", "4")],
        ],
        &context,
    );
    assert!(
        get_prefix(&cairn, "/other").is_empty(),
        "mirrored outside the prefix"
    );

    // Cairn -> etcd, under another prefix.
    let to_etcd = mirror_round(
        (&cairn, &etcd_ep),
        ("/app/", Some("/copy/")),
        &[("/app/x", "10"), ("/app/y", "20")],
        &[
            ("/app/z", Some("30")),
            ("/app/x", None),
            ("/app/y", Some("21")),
        ],
        [
            &[("/copy/x", "10"), ("/copy/y", "20")],
            &[("/copy/y", "21"), ("/copy/z", "30")],
        ],
        &context,
    );

    // Both mirrors were still running: neither gave up on an error.
    let mut to_cairn = to_cairn;
    let mut to_etcd = to_etcd;
    for m in [&mut to_cairn, &mut to_etcd] {
        assert!(
            m.child.try_wait().expect("wait").is_none(),
            "{} exited: {:?}",
            m.what,
            m.lines()
        );
    }
}
