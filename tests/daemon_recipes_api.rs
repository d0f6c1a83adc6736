//! etcd's server-side recipes, the Lock service (`v3lockpb.Lock`) and the
//! Election service (`v3electionpb.Election`), driven through etcd's Rust
//! client against a real etcd 3.4 and against a Cairn member: the same
//! scenario on both, each answer checked against etcd's semantics (a lock's
//! key is `name/<lease in hex>` on the caller's lease, a second locker waits
//! until the holder unlocks or its lease expires, a lock without a lease gets
//! a 60 s one, campaigners queue behind the leader, Proclaim and Resign need
//! the leader's key and revision, Observe follows the leader's values in
//! order), and the two summaries compared, lease ids shown by the name the
//! test gave them and revisions left out. Guards against recipes that hand a
//! lock or leadership to two holders, wait on the wrong keys, or answer with
//! other keys, values, error codes or error texts than etcd's.

use crate::common;

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use common::{client, eventually, status_of, wait_writable, Cluster, Etcd};
use etcd_client::{
    Client, GetOptions, KeyValue, LeaderKey, LeaderResponse, LockOptions, ProclaimOptions,
    ResignOptions, SortOrder, SortTarget,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// What a call of etcd's client answers.
type Answer<T> = Result<T, etcd_client::Error>;

/// How long a step that should end may take on a busy 2-core machine; steps
/// normally take well under a second (a lease's expiry a few).
const STEP: Duration = Duration::from_secs(30);

/// How long a call that must wait is watched for not returning.
const WAITS: Duration = Duration::from_secs(1);

/// The leases of one run by the names the summary shows for them: etcd and
/// Cairn number leases differently.
#[derive(Default)]
struct Leases(Vec<(i64, &'static str)>);

impl Leases {
    async fn grant(&mut self, c: &mut Client, name: &'static str, ttl: i64) -> i64 {
        let id = c
            .lease_grant(ttl, None)
            .await
            .unwrap_or_else(|e| panic!("granting lease {name} (TTL {ttl}): {e}"))
            .id();
        self.0.push((id, name));
        id
    }

    fn name(&self, id: i64) -> String {
        match self.0.iter().find(|(known, _)| *known == id) {
            Some((_, name)) => name.to_string(),
            None => format!("unknown lease {id:x}"),
        }
    }

    /// `prefix/<lease in lower-case hex>` shown as `prefix/<name>`.
    fn key(&self, key: &[u8]) -> String {
        let key = String::from_utf8_lossy(key);
        let lease = key.rsplit_once('/').and_then(|(prefix, hex)| {
            let id = i64::from_str_radix(hex, 16).ok()?;
            (format!("{id:x}") == hex).then_some((prefix, id))
        });
        match lease {
            Some((prefix, id)) => format!("{prefix}/<{}>", self.name(id)),
            None => format!("{key} (not name/<lease in hex>)"),
        }
    }

    fn kv(&self, kv: &KeyValue) -> String {
        format!(
            "{}={:?} lease <{}>",
            self.key(kv.key()),
            String::from_utf8_lossy(kv.value()),
            self.name(kv.lease())
        )
    }

    fn leader(&self, l: &LeaderKey) -> String {
        format!(
            "name {:?} key {} lease <{}>",
            String::from_utf8_lossy(l.name()),
            self.key(l.key()),
            self.name(l.lease())
        )
    }
}

/// The keys under `prefix`, oldest first, as [`Leases::kv`] shows them.
async fn under(c: &mut Client, prefix: &str, leases: &Leases) -> Vec<String> {
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let r = c
        .get(prefix, Some(options))
        .await
        .unwrap_or_else(|e| panic!("get {prefix}: {e}"));
    r.kvs().iter().map(|kv| leases.kv(kv)).collect()
}

/// Waits until the keys under `prefix` are `want`, oldest first.
async fn wait_under(c: &Client, prefix: &str, leases: &Leases, want: &[&str]) {
    eventually(&format!("keys under {prefix} {want:?}"), STEP, || {
        let mut c = c.clone();
        async move {
            let now = under(&mut c, prefix, leases).await;
            if now == want {
                Ok(())
            } else {
                Err(format!("{now:?}"))
            }
        }
    })
    .await;
}

/// Spawns `call`, checks it has not returned after [`WAITS`], and hands back
/// the still-running call.
async fn waiting<T: Debug + Send + 'static>(
    what: &str,
    call: impl Future<Output = T> + Send + 'static,
) -> JoinHandle<T> {
    let mut call = tokio::spawn(call);
    if let Ok(answer) = tokio::time::timeout(WAITS, &mut call).await {
        panic!("{what} returned at once ({answer:?}); it should wait");
    }
    call
}

/// The answer of a call [`waiting`] handed back, within [`STEP`].
async fn returns<T>(what: &str, call: JoinHandle<Answer<T>>) -> T {
    tokio::time::timeout(STEP, call)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {STEP:?}"))
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Checks `answer` is a refusal whose message holds `want`; the refusal as
/// the summary shows it.
fn refused<T: Debug>(what: &str, answer: Answer<T>, want: &str) -> String {
    let status = match answer {
        Ok(r) => panic!("{what}: answered {r:?}; expected a refusal with {want:?}"),
        Err(e) => status_of(e),
    };
    let text = format!("{:?} {:?}", status.code(), status.message());
    assert!(status.message().contains(want), "{what}: {text}");
    format!("{what}: refused, {text}")
}

/// Locks `name` with `lease`; the key held.
async fn lock(c: &mut Client, name: &str, lease: i64) -> String {
    let r = c
        .lock(name, Some(LockOptions::new().with_lease(lease)))
        .await
        .unwrap_or_else(|e| panic!("lock {name} with lease {lease:x}: {e}"));
    String::from_utf8_lossy(r.key()).into_owned()
}

/// Spawns a Lock of `name` with `lease` on a clone of `c`.
fn lock_call(
    c: &Client,
    name: &'static str,
    lease: i64,
) -> impl Future<Output = Answer<etcd_client::LockResponse>> + Send + 'static {
    let mut c = c.clone();
    async move {
        c.lock(name, Some(LockOptions::new().with_lease(lease)))
            .await
    }
}

async fn unlock(c: &mut Client, key: &str) {
    c.unlock(key)
        .await
        .unwrap_or_else(|e| panic!("unlock {key}: {e}"));
}

/// The remaining TTL of `lease`: -1 once it is gone.
async fn ttl(c: &mut Client, lease: i64) -> (i64, i64) {
    let r = c
        .lease_time_to_live(lease, None)
        .await
        .unwrap_or_else(|e| panic!("time to live of lease {lease:x}: {e}"));
    (r.ttl(), r.granted_ttl())
}

/// Scenario 1: a lock passes from A to the waiting B when A unlocks.
async fn lock_passes_on_unlock(c: &mut Client) -> Vec<String> {
    let mut leases = Leases::default();
    let a = leases.grant(c, "a", 30).await;
    let b = leases.grant(c, "b", 30).await;
    let key_a = lock(c, "L", a).await;
    assert_eq!(key_a, format!("L/{a:x}"), "A's lock key");
    let mut out = vec![format!("A locks L: {}", leases.key(key_a.as_bytes()))];
    let held = under(c, "L/", &leases).await;
    assert_eq!(held, [r#"L/<a>="" lease <a>"#], "A's lock");
    out.push(format!("A holds: {held:?}"));

    let b_locks = waiting("B's lock of L while A holds it", lock_call(c, "L", b)).await;
    // B waits with its own key queued behind A's.
    wait_under(
        c,
        "L/",
        &leases,
        &[r#"L/<a>="" lease <a>"#, r#"L/<b>="" lease <b>"#],
    )
    .await;
    out.push("B waits, queued behind A".into());
    unlock(c, &key_a).await;
    let answer = returns("B's lock of L after A's unlock", b_locks).await;
    let key_b = String::from_utf8_lossy(answer.key()).into_owned();
    assert_eq!(key_b, format!("L/{b:x}"), "B's lock key");
    let held = under(c, "L/", &leases).await;
    assert_eq!(held, [r#"L/<b>="" lease <b>"#], "B's lock");
    out.push(format!(
        "after A unlocks, B locks L: {}, holding {held:?}",
        leases.key(answer.key())
    ));
    unlock(c, &key_b).await;
    let left = under(c, "L/", &leases).await;
    assert!(left.is_empty(), "L/ after both unlocked: {left:?}");
    out.push(format!("after B unlocks: {left:?}"));
    out
}

/// Scenario 1b: three lockers; the middle one gives up while it waits (its
/// call dropped, as a client's deadline or cancel drops it), and its key
/// leaves the queue with it, so the third gets the lock when the first
/// unlocks.
async fn a_waiter_that_gives_up_leaves_the_queue(c: &mut Client) -> Vec<String> {
    let mut leases = Leases::default();
    let a = leases.grant(c, "a", 30).await;
    let b = leases.grant(c, "b", 30).await;
    let d = leases.grant(c, "d", 30).await;
    let key_a = lock(c, "Q", a).await;
    let b_locks = waiting("B's lock of Q while A holds it", lock_call(c, "Q", b)).await;
    wait_under(
        c,
        "Q/",
        &leases,
        &[r#"Q/<a>="" lease <a>"#, r#"Q/<b>="" lease <b>"#],
    )
    .await;
    let d_locks = waiting("D's lock of Q behind A and B", lock_call(c, "Q", d)).await;
    wait_under(
        c,
        "Q/",
        &leases,
        &[
            r#"Q/<a>="" lease <a>"#,
            r#"Q/<b>="" lease <b>"#,
            r#"Q/<d>="" lease <d>"#,
        ],
    )
    .await;
    b_locks.abort();
    // The server sees the call go and takes B's key back.
    wait_under(
        c,
        "Q/",
        &leases,
        &[r#"Q/<a>="" lease <a>"#, r#"Q/<d>="" lease <d>"#],
    )
    .await;
    let mut out = vec!["A holds Q, B and D wait; B gives up and its key goes".to_string()];
    unlock(c, &key_a).await;
    let answer = returns("D's lock of Q after A's unlock", d_locks).await;
    assert_eq!(answer.key(), format!("Q/{d:x}").as_bytes(), "D's lock key");
    out.push(format!(
        "after A unlocks, D locks Q: {}",
        leases.key(answer.key())
    ));
    unlock(c, &format!("Q/{d:x}")).await;
    out
}

/// Scenario 2: a lock is released when its holder's lease expires.
async fn lock_released_by_expiry(c: &mut Client) -> Vec<String> {
    let mut leases = Leases::default();
    let a = leases.grant(c, "a", 2).await;
    let b = leases.grant(c, "b", 30).await;
    let key_a = lock(c, "E", a).await;
    assert_eq!(key_a, format!("E/{a:x}"), "A's lock key");
    let b_locks = tokio::spawn(lock_call(c, "E", b));
    let answer = returns("B's lock of E once A's lease expires", b_locks).await;
    let key_b = String::from_utf8_lossy(answer.key()).into_owned();
    assert_eq!(key_b, format!("E/{b:x}"), "B's lock key");
    let (left, _) = ttl(c, a).await;
    assert_eq!(left, -1, "B got E while A's lease still lived");
    let held = under(c, "E/", &leases).await;
    assert_eq!(held, [r#"E/<b>="" lease <b>"#], "B's lock");
    let out = vec![
        format!("A locks E: {}", leases.key(key_a.as_bytes())),
        format!(
            "A's lease expires, B locks E: {}, holding {held:?}",
            leases.key(answer.key())
        ),
    ];
    unlock(c, &key_b).await;
    out
}

/// Scenario 3: a lock without a lease gets a 60 s lease of its own; one
/// with a lease that does not exist is refused.
async fn lock_leases(c: &mut Client) -> Vec<String> {
    let mut leases = Leases::default();
    let key = lock(c, "N", 0).await;
    let granted = key
        .strip_prefix("N/")
        .and_then(|hex| i64::from_str_radix(hex, 16).ok())
        .unwrap_or_else(|| panic!("lock of N without a lease: key {key:?}"));
    assert!(
        granted != 0 && key == format!("N/{granted:x}"),
        "key {key:?}"
    );
    leases.0.push((granted, "granted"));
    let held = under(c, "N/", &leases).await;
    assert_eq!(held, [r#"N/<granted>="" lease <granted>"#], "lock of N");
    let (left, granted_ttl) = ttl(c, granted).await;
    assert!(
        granted_ttl == 60 && (1..=60).contains(&left),
        "TTL {left} of {granted_ttl}"
    );
    let mut out = vec![format!(
        "lock N without a lease: {held:?}, granted TTL {granted_ttl}"
    )];
    unlock(c, &key).await;
    c.lease_revoke(granted)
        .await
        .expect("revoke the lock's own lease");

    let missing = 0x7e57_0000_0001;
    assert_eq!(ttl(c, missing).await.0, -1, "lease {missing:x} exists");
    let answer = c
        .lock("M", Some(LockOptions::new().with_lease(missing)))
        .await;
    out.push(refused(
        "lock M with a lease that does not exist",
        answer,
        "requested lease not found",
    ));
    let left = under(c, "M/", &leases).await;
    assert!(left.is_empty(), "M/ after the refused lock: {left:?}");
    out
}

/// Leader of `name`: its key-value as [`Leases::kv`] shows it, and its
/// creation revision.
async fn leader_of(c: &mut Client, name: &str, leases: &Leases) -> (String, i64) {
    let r = c
        .leader(name)
        .await
        .unwrap_or_else(|e| panic!("leader of {name}: {e}"));
    let kv = r
        .kv()
        .unwrap_or_else(|| panic!("leader of {name}: no kv in {r:?}"));
    (leases.kv(kv), kv.create_revision())
}

/// Campaigns on `name` with `value` and `lease`; the leader key, checked.
async fn campaign(c: &mut Client, name: &str, value: &str, lease: i64) -> LeaderKey {
    let mut r = c
        .campaign(name, value, lease)
        .await
        .unwrap_or_else(|e| panic!("campaign {name} {value}: {e}"));
    leader_key(r.take_leader(), name, lease)
}

fn leader_key(leader: Option<LeaderKey>, name: &str, lease: i64) -> LeaderKey {
    let l = leader.unwrap_or_else(|| panic!("campaign {name}: no leader key"));
    assert_eq!(l.name(), name.as_bytes(), "{l:?}");
    assert_eq!(l.key(), format!("{name}/{lease:x}").as_bytes(), "{l:?}");
    assert!(l.rev() > 0 && l.lease() == lease, "{l:?}");
    l
}

async fn proclaim(c: &mut Client, leader: &LeaderKey, value: &str) -> Answer<()> {
    let options = ProclaimOptions::new().with_leader(leader.clone());
    c.proclaim(value, Some(options)).await.map(drop)
}

async fn resign(c: &mut Client, leader: &LeaderKey) {
    c.resign(Some(ResignOptions::new().with_leader(leader.clone())))
        .await
        .unwrap_or_else(|e| panic!("resign {leader:?}: {e}"));
}

/// Scenario 4: Campaign, Leader, Proclaim, a second campaigner waiting for
/// the first to resign, and the refusals: no leader, not the leader.
async fn election(c: &mut Client) -> Vec<String> {
    let mut leases = Leases::default();
    let a = leases.grant(c, "a", 30).await;
    let b = leases.grant(c, "b", 30).await;
    let first = campaign(c, "El", "v1", a).await;
    let mut out = vec![format!("a campaigns with v1: {}", leases.leader(&first))];
    let (shown, created) = leader_of(c, "El", &leases).await;
    assert_eq!(shown, r#"El/<a>="v1" lease <a>"#);
    assert_eq!(created, first.rev(), "the leader key's rev is its creation");
    out.push(format!("leader: {shown}"));
    proclaim(c, &first, "v2").await.expect("proclaim v2");
    let (shown, _) = leader_of(c, "El", &leases).await;
    assert_eq!(shown, r#"El/<a>="v2" lease <a>"#);
    out.push(format!("a proclaims v2, leader: {shown}"));
    let stale = first.clone().with_rev(first.rev() + 1);
    let answer = proclaim(c, &stale, "v3").await;
    out.push(refused(
        "proclaim with a wrong rev",
        answer,
        "election: not leader",
    ));

    let mut c2 = c.clone();
    let call = async move { c2.campaign("El", "w1", b).await };
    let second = waiting("b's campaign while a leads", call).await;
    let queued = [r#"El/<a>="v2" lease <a>"#, r#"El/<b>="w1" lease <b>"#];
    wait_under(c, "El/", &leases, &queued).await;
    let (shown, _) = leader_of(c, "El", &leases).await;
    assert_eq!(shown, queued[0], "the leader while b waits");
    out.push(format!("b waits, queued: {queued:?}, leader: {shown}"));
    resign(c, &first).await;
    let mut answer = returns("b's campaign after a resigns", second).await;
    let second = leader_key(answer.take_leader(), "El", b);
    assert!(second.rev() > first.rev(), "{second:?} after {first:?}");
    let (shown, _) = leader_of(c, "El", &leases).await;
    assert_eq!(shown, r#"El/<b>="w1" lease <b>"#);
    out.push(format!(
        "a resigns, b leads: {}, leader: {shown}",
        leases.leader(&second)
    ));
    let answer = c.leader("Nobody").await;
    out.push(refused(
        "leader of an election nobody runs",
        answer,
        "election: no leader",
    ));
    resign(c, &second).await;
    let left = under(c, "El/", &leases).await;
    assert!(left.is_empty(), "El/ after both resigned: {left:?}");
    out
}

/// The next value the observer saw, within [`STEP`].
async fn observed(seen: &mut mpsc::UnboundedReceiver<Result<LeaderResponse, String>>) -> KeyValue {
    let next = tokio::time::timeout(STEP, seen.recv())
        .await
        .unwrap_or_else(|_| panic!("observe: nothing within {STEP:?}"))
        .unwrap_or_else(|| Err("the observer stopped".into()));
    let r = next.unwrap_or_else(|e| panic!("observe: {e}"));
    r.kv()
        .cloned()
        .unwrap_or_else(|| panic!("observe: no kv in {r:?}"))
}

/// Scenario 5: Observe, opened before anyone campaigns, follows the
/// leader's values.
async fn observe(c: &mut Client) -> Vec<String> {
    let mut leases = Leases::default();
    let x = leases.grant(c, "x", 30).await;
    let y = leases.grant(c, "y", 30).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let mut co = c.clone();
    // The call itself may not return before the first value (etcd sends the
    // stream's headers with it), so it runs in a task of its own.
    let observer = tokio::spawn(async move {
        let mut stream = match co.observe("Ob").await {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Err(format!("{e}")));
                return;
            }
        };
        loop {
            let next = match stream.message().await {
                Ok(Some(r)) => Ok(r),
                Ok(None) => Err("stream ended".to_string()),
                Err(e) => Err(format!("{e}")),
            };
            let end = next.is_err();
            if tx.send(next).is_err() || end {
                return;
            }
        }
    });
    let quiet = tokio::time::timeout(WAITS, seen.recv()).await;
    assert!(quiet.is_err(), "observe without a leader: {quiet:?}");

    let mut values = Vec::new();
    let first = campaign(c, "Ob", "x1", x).await;
    values.push(leases.kv(&observed(&mut seen).await));
    proclaim(c, &first, "x2").await.expect("proclaim x2");
    values.push(leases.kv(&observed(&mut seen).await));
    resign(c, &first).await;
    let second = campaign(c, "Ob", "y1", y).await;
    values.push(leases.kv(&observed(&mut seen).await));
    let want = [
        r#"Ob/<x>="x1" lease <x>"#,
        r#"Ob/<x>="x2" lease <x>"#,
        r#"Ob/<y>="y1" lease <y>"#,
    ];
    assert_eq!(values, want, "observed");
    observer.abort();
    resign(c, &second).await;
    vec![format!("observed: {values:?}")]
}

/// Every scenario against `endpoint`, one after the other; what each saw.
async fn recipes(endpoint: String) -> Vec<String> {
    let mut c = client(&endpoint).await;
    wait_writable(&mut c, "recipes-ready").await;
    let mut out = lock_passes_on_unlock(&mut c).await;
    out.extend(a_waiter_that_gives_up_leaves_the_queue(&mut c).await);
    out.extend(lock_released_by_expiry(&mut c).await);
    out.extend(lock_leases(&mut c).await);
    out.extend(election(&mut c).await);
    out.extend(observe(&mut c).await);
    out
}

/// [`recipes`] against one system, its logs added when a step fails.
async fn run(what: &str, endpoint: &str, logs: &dyn Fn() -> String) -> Vec<String> {
    match tokio::spawn(recipes(endpoint.to_string())).await {
        Ok(summary) => summary,
        Err(e) => panic!("{what}: {e}\n{}", logs()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_election_services_answer_as_etcd_does() {
    if !common::require_tool("etcd") {
        return;
    }
    let etcd = Etcd::start();
    let cluster = Cluster::start(1, &[]);
    let on_etcd = run("etcd", &etcd.endpoint, &|| etcd.log_text()).await;
    let on_cairn = run("Cairn", &cluster.members[0].endpoint(), &|| cluster.logs()).await;
    assert_eq!(
        on_etcd, on_cairn,
        "etcd's answers (left) against Cairn's (right)"
    );
}
