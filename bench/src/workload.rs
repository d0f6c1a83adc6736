//! The request generators: what one requester sends for each workload, and the
//! per-requester state it needs (key generator, cached revisions, lease stream).

use std::time::Duration;

use crate::grpc::{self, Method};
use crate::security::Conn;
use bytes::Bytes;
use cairn_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cairn_proto::etcdserverpb::kv_client::KvClient;
use cairn_proto::etcdserverpb::lease_client::LeaseClient;
use cairn_proto::etcdserverpb::request_op::Request;
use cairn_proto::etcdserverpb::{
    Compare, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest,
    PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, TxnRequest, TxnResponse,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tonic::Streaming;

use crate::config::{Consistency, KeyOpts, LeaseOpts, MixedOpts, RangeOpts, TxnMultiOpts};
use crate::placement::{CROSS_PREFIXES, ONE_PREFIX};
use crate::stats::Recorder;

/// Keep-alive requests buffered per lease stream; one is in flight at a time.
const LEASE_STREAM_QUEUE: usize = 4;

/// A workload and its options, shared by all requesters of a run.
#[derive(Debug, Clone)]
pub enum Spec {
    Put(KeyOpts),
    Range(RangeOpts),
    TxnPut(KeyOpts),
    TxnMulti(TxnMultiOpts, Spread),
    Mixed(MixedOpts),
    LeaseKeepalive(LeaseOpts),
}

/// The routing prefixes the keys of one `txn-one` or `txn-cross` txn are
/// under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Every key under [`ONE_PREFIX`] (`/bench/one/<j>/<key>`): one shard.
    OnePrefix,
    /// Key j under `CROSS_PREFIXES[j]` (`/bench/x<i>/<key>`): as many
    /// shards as there are keys, or as there are shards.
    CrossPrefixes,
}

impl Spread {
    /// The prefix of each key of a txn of `keys` keys.
    pub fn prefixes(self, keys: usize) -> Vec<Bytes> {
        assert!(
            keys <= CROSS_PREFIXES.len(),
            "{keys} keys per txn: TxnMultiOpts::validate admits at most {}",
            CROSS_PREFIXES.len()
        );
        match self {
            Spread::OnePrefix => (0..keys)
                .map(|j| Bytes::from(format!("{ONE_PREFIX}{j}/")))
                .collect(),
            Spread::CrossPrefixes => CROSS_PREFIXES[..keys]
                .iter()
                .map(|p| Bytes::from_static(p.as_bytes()))
                .collect(),
        }
    }
}

impl Spec {
    /// Whether the workload makes only unary KV calls (Range, Put, Txn),
    /// which the load generator's own client can carry.
    pub fn unary_kv(&self) -> bool {
        !matches!(self, Spec::LeaseKeepalive(_))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Spec::Put(_) => "put",
            Spec::Range(_) => "range",
            Spec::TxnPut(_) => "txn-put",
            Spec::TxnMulti(_, Spread::OnePrefix) => "txn-one",
            Spec::TxnMulti(_, Spread::CrossPrefixes) => "txn-cross",
            Spec::Mixed(_) => "mixed",
            Spec::LeaseKeepalive(_) => "lease-keepalive",
        }
    }
}

pub fn decimal_digits(mut n: u64) -> usize {
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}

/// Keys are the key index in decimal, left-padded with '0' to the key size, so
/// every key has the same size and sorts in index order.
#[derive(Debug)]
pub struct KeyGen {
    key_size_bytes: usize,
    space: u64,
    sequential: bool,
    next_index: u64,
    stride: u64,
    rng: SmallRng,
}

impl KeyGen {
    /// Requester `client` of `clients` walks its own interleaved slice of the key
    /// space in sequential mode, so together they cover it in order.
    pub fn new(opts: &KeyOpts, client: usize, clients: usize) -> Self {
        KeyGen {
            key_size_bytes: opts.key_size,
            space: opts.key_space_size,
            sequential: opts.sequential_keys,
            next_index: client as u64 % opts.key_space_size,
            stride: clients as u64,
            rng: SmallRng::seed_from_u64(0x6361_6972_6e00 ^ client as u64),
        }
    }

    pub fn next_index(&mut self) -> u64 {
        if self.sequential {
            let index = self.next_index;
            self.next_index = (self.next_index + self.stride) % self.space;
            index
        } else {
            self.rng.gen_range(0..self.space)
        }
    }

    pub fn key(&self, index: u64) -> Bytes {
        let digits = index.to_string();
        assert!(
            digits.len() <= self.key_size_bytes,
            "key index {index} does not fit {} bytes: KeyOpts::validate admits no such space",
            self.key_size_bytes
        );
        let mut key = Vec::with_capacity(self.key_size_bytes);
        key.resize(self.key_size_bytes - digits.len(), b'0');
        key.extend_from_slice(digits.as_bytes());
        Bytes::from(key)
    }

    pub fn next_key(&mut self) -> (u64, Bytes) {
        let index = self.next_index();
        (index, self.key(index))
    }

    fn coin(&mut self) -> f64 {
        self.rng.gen()
    }
}

pub fn value_of_size(size_bytes: usize) -> Bytes {
    Bytes::from(vec![b'v'; size_bytes])
}

/// The end of the range holding every key with `prefix` (etcd's convention).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Only 0xff bytes: every key from `prefix` on.
    vec![0]
}

/// The connection a requester sends over: tonic's, or the load generator's
/// own client's (unary KV calls only).
#[derive(Clone)]
pub enum Transport {
    Tonic(Conn),
    Cairn(grpc::Channel),
}

/// A requester's KV calls, through either client.
pub enum Kv {
    Tonic(KvClient<Conn>),
    Cairn(grpc::Channel),
}

impl Kv {
    fn new(transport: Transport) -> Kv {
        match transport {
            Transport::Tonic(conn) => Kv::Tonic(KvClient::new(conn)),
            Transport::Cairn(channel) => Kv::Cairn(channel),
        }
    }

    pub async fn range(&mut self, request: RangeRequest) -> Result<RangeResponse, tonic::Status> {
        match self {
            Kv::Tonic(kv) => Ok(kv.range(request).await?.into_inner()),
            Kv::Cairn(channel) => channel.call(Method::Range, &request).await,
        }
    }

    pub async fn put(&mut self, request: PutRequest) -> Result<PutResponse, tonic::Status> {
        match self {
            Kv::Tonic(kv) => Ok(kv.put(request).await?.into_inner()),
            Kv::Cairn(channel) => channel.call(Method::Put, &request).await,
        }
    }

    pub async fn txn(&mut self, request: TxnRequest) -> Result<TxnResponse, tonic::Status> {
        match self {
            Kv::Tonic(kv) => Ok(kv.txn(request).await?.into_inner()),
            Kv::Cairn(channel) => channel.call(Method::Txn, &request).await,
        }
    }
}

/// An open LeaseKeepAlive stream of one requester.
pub struct LeaseStream {
    tx: mpsc::Sender<LeaseKeepAliveRequest>,
    rx: Streaming<LeaseKeepAliveResponse>,
}

/// A requester's first view of the store (not measured): the revision of a
/// count-only range's header.
async fn first_view(kv: &mut Kv) -> Result<i64, tonic::Status> {
    let probe = RangeRequest {
        key: Bytes::from_static(b"\0"),
        count_only: true,
        ..Default::default()
    };
    Ok(kv.range(probe).await?.header.map_or(0, |h| h.revision))
}

/// Optimistic concurrency over `keys`: put `value` to every one if nobody
/// modified any of them after `revision_seen`, the newest revision the
/// requester has seen; otherwise read each back.
pub fn cas_txn(keys: Vec<Bytes>, value: &Bytes, revision_seen: i64) -> TxnRequest {
    TxnRequest {
        compare: keys
            .iter()
            .map(|key| Compare {
                result: CompareResult::Less as i32,
                target: CompareTarget::Mod as i32,
                key: key.clone(),
                target_union: Some(TargetUnion::ModRevision(revision_seen + 1)),
                ..Default::default()
            })
            .collect(),
        success: keys
            .iter()
            .map(|key| RequestOp {
                request: Some(Request::RequestPut(PutRequest {
                    key: key.clone(),
                    value: value.clone(),
                    ..Default::default()
                })),
            })
            .collect(),
        failure: keys
            .into_iter()
            .map(|key| RequestOp {
                request: Some(Request::RequestRange(RangeRequest {
                    key,
                    ..Default::default()
                })),
            })
            .collect(),
    }
}

/// etcd's read-only txn of one range: a compare on the range's first key
/// (modified at some revision), and the range on either branch, as a
/// client reading under a guard sends it.
pub fn read_only_txn(range: RangeRequest) -> TxnRequest {
    let op = RequestOp {
        request: Some(Request::RequestRange(range.clone())),
    };
    TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Greater as i32,
            target: CompareTarget::Mod as i32,
            key: range.key,
            target_union: Some(TargetUnion::ModRevision(0)),
            ..Default::default()
        }],
        success: vec![op.clone()],
        failure: vec![op],
    }
}

/// Sends a [`cas_txn`], counts whether it won, and moves the requester's
/// view forward to the response's revision either way, so a conflict is
/// retried against fresh state.
async fn swap(
    kv: &mut Kv,
    txn: TxnRequest,
    revision_seen: &mut i64,
    rec: &mut Recorder,
) -> Result<(), tonic::Status> {
    let resp = kv.txn(txn).await?;
    if resp.succeeded {
        rec.count("txn_cas_won");
    } else {
        rec.count("txn_cas_conflicts");
    }
    if let Some(h) = resp.header {
        *revision_seen = (*revision_seen).max(h.revision);
    }
    Ok(())
}

/// What one requester needs between requests.
pub enum OpClient {
    Put {
        kv: Kv,
        keys: KeyGen,
        value: Bytes,
    },
    Range {
        kv: Kv,
        request: RangeRequest,
    },
    /// A range sent as etcd's read-only txn ([`read_only_txn`]).
    ReadTxn {
        kv: Kv,
        request: TxnRequest,
    },
    TxnPut {
        kv: Kv,
        keys: KeyGen,
        value: Bytes,
        /// Newest store revision this requester has seen in a response: its view
        /// of the store, against which it swaps.
        revision_seen: i64,
    },
    TxnMulti {
        kv: Kv,
        keys: KeyGen,
        /// The prefix of each key of a txn; the key generator gives the rest.
        prefixes: Vec<Bytes>,
        value: Bytes,
        /// As for `TxnPut`.
        revision_seen: i64,
    },
    Mixed {
        kv: Kv,
        keys: KeyGen,
        value: Bytes,
        read_ratio: f64,
        serializable: bool,
    },
    LeaseKeepalive {
        lease: LeaseClient<Conn>,
        id: i64,
        stream: Option<LeaseStream>,
        timeout: Duration,
    },
}

impl OpClient {
    /// Prepares requester `client` of `clients`; lease-keepalive grants its lease here
    /// (not measured).
    pub async fn setup(
        spec: &Spec,
        transport: Transport,
        client: usize,
        clients: usize,
        timeout: Duration,
    ) -> Result<Self, tonic::Status> {
        Ok(match spec {
            Spec::Put(o) => OpClient::Put {
                kv: Kv::new(transport),
                keys: KeyGen::new(o, client, clients),
                value: value_of_size(o.val_size),
            },
            Spec::Range(o) => {
                let key = o.key.as_bytes().to_vec();
                let range_end = match (&o.end, o.prefix) {
                    (Some(end), _) => end.as_bytes().to_vec(),
                    (None, true) => prefix_end(&key),
                    (None, false) => Vec::new(),
                };
                let request = RangeRequest {
                    key: key.into(),
                    range_end: range_end.into(),
                    limit: o.limit,
                    serializable: o.consistency == Consistency::S,
                    ..Default::default()
                };
                let kv = Kv::new(transport);
                if o.in_txn {
                    OpClient::ReadTxn {
                        kv,
                        request: read_only_txn(request),
                    }
                } else {
                    OpClient::Range { kv, request }
                }
            }
            Spec::TxnPut(o) => {
                let mut kv = Kv::new(transport);
                let revision_seen = first_view(&mut kv).await?;
                OpClient::TxnPut {
                    kv,
                    keys: KeyGen::new(o, client, clients),
                    value: value_of_size(o.val_size),
                    revision_seen,
                }
            }
            Spec::TxnMulti(o, spread) => {
                let mut kv = Kv::new(transport);
                let revision_seen = first_view(&mut kv).await?;
                OpClient::TxnMulti {
                    kv,
                    keys: KeyGen::new(&o.keys, client, clients),
                    prefixes: spread.prefixes(o.keys_per_txn),
                    value: value_of_size(o.keys.val_size),
                    revision_seen,
                }
            }
            Spec::Mixed(o) => OpClient::Mixed {
                kv: Kv::new(transport),
                keys: KeyGen::new(&o.keys, client, clients),
                value: value_of_size(o.keys.val_size),
                read_ratio: o.read_ratio,
                serializable: o.consistency == Consistency::S,
            },
            Spec::LeaseKeepalive(o) => {
                let Transport::Tonic(channel) = transport else {
                    return Err(tonic::Status::failed_precondition(
                        "lease-keepalive streams go through tonic's client",
                    ));
                };
                let mut lease = LeaseClient::new(channel);
                let granted = lease
                    .lease_grant(LeaseGrantRequest {
                        ttl: o.ttl_secs,
                        id: 0,
                    })
                    .await?
                    .into_inner();
                if !granted.error.is_empty() {
                    return Err(tonic::Status::unknown(format!(
                        "lease grant refused: {}",
                        granted.error
                    )));
                }
                OpClient::LeaseKeepalive {
                    lease,
                    id: granted.id,
                    stream: None,
                    timeout,
                }
            }
        })
    }

    /// Sends one request and waits for its response. Success or the gRPC status;
    /// the caller times it.
    pub async fn issue(&mut self, rec: &mut Recorder) -> Result<(), tonic::Status> {
        match self {
            OpClient::Put { kv, keys, value } => {
                let (_, key) = keys.next_key();
                kv.put(PutRequest {
                    key,
                    value: value.clone(),
                    ..Default::default()
                })
                .await?;
            }
            OpClient::Range { kv, request } => {
                kv.range(request.clone()).await?;
            }
            OpClient::ReadTxn { kv, request } => {
                kv.txn(request.clone()).await?;
            }
            OpClient::TxnPut {
                kv,
                keys,
                value,
                revision_seen,
            } => {
                let (_, key) = keys.next_key();
                let txn = cas_txn(vec![key], value, *revision_seen);
                swap(kv, txn, revision_seen, rec).await?;
            }
            OpClient::TxnMulti {
                kv,
                keys,
                prefixes,
                value,
                revision_seen,
            } => {
                let (_, suffix) = keys.next_key();
                let keys = prefixes
                    .iter()
                    .map(|p| {
                        let mut key = Vec::with_capacity(p.len() + suffix.len());
                        key.extend_from_slice(p);
                        key.extend_from_slice(&suffix);
                        Bytes::from(key)
                    })
                    .collect();
                let txn = cas_txn(keys, value, *revision_seen);
                swap(kv, txn, revision_seen, rec).await?;
            }
            OpClient::Mixed {
                kv,
                keys,
                value,
                read_ratio,
                serializable,
            } => {
                let read = keys.coin() < *read_ratio;
                let (_, key) = keys.next_key();
                if read {
                    rec.count("reads");
                    kv.range(RangeRequest {
                        key,
                        serializable: *serializable,
                        ..Default::default()
                    })
                    .await?;
                } else {
                    rec.count("writes");
                    kv.put(PutRequest {
                        key,
                        value: value.clone(),
                        ..Default::default()
                    })
                    .await?;
                }
            }
            OpClient::LeaseKeepalive {
                lease,
                id,
                stream,
                timeout,
            } => {
                let request = LeaseKeepAliveRequest { id: *id };
                let outcome = tokio::time::timeout(*timeout, async {
                    let closed = || tonic::Status::unavailable("lease keep-alive stream closed");
                    let s = match stream {
                        Some(s) => {
                            s.tx.send(request).await.map_err(|_| closed())?;
                            s
                        }
                        None => {
                            // The server answers the call only once it has a message
                            // to send, so the first request goes in before the call.
                            let (tx, rx) = mpsc::channel(LEASE_STREAM_QUEUE);
                            tx.send(request).await.map_err(|_| closed())?;
                            let responses = lease
                                .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
                                .await?
                                .into_inner();
                            stream.insert(LeaseStream { tx, rx: responses })
                        }
                    };
                    match s.rx.message().await? {
                        Some(resp) if resp.ttl > 0 => Ok(()),
                        Some(_) => Err(tonic::Status::not_found(format!("lease {id:x} expired"))),
                        None => Err(tonic::Status::unavailable("lease keep-alive stream ended")),
                    }
                })
                .await
                .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("keep-alive timed out")));
                if outcome.is_err() {
                    // Reopen on the next request rather than reading a stale reply.
                    *stream = None;
                }
                outcome?;
            }
        }
        Ok(())
    }

    /// Releases what setup took (the lease); failures here are not measured.
    pub async fn teardown(self) {
        if let OpClient::LeaseKeepalive {
            mut lease,
            id,
            stream,
            ..
        } = self
        {
            drop(stream);
            let _ = lease.lease_revoke(LeaseRevokeRequest { id }).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(space: u64, sequential: bool) -> KeyOpts {
        KeyOpts {
            key_size: 8,
            val_size: 4,
            key_space_size: space,
            sequential_keys: sequential,
        }
    }

    #[test]
    fn keys_are_padded_decimal_of_fixed_size() {
        let g = KeyGen::new(&opts(100, true), 0, 1);
        assert_eq!(g.key(0).as_ref(), b"00000000");
        assert_eq!(g.key(42).as_ref(), b"00000042");
    }

    #[test]
    fn sequential_clients_interleave_over_the_space() {
        let mut a = KeyGen::new(&opts(5, true), 0, 2);
        let mut b = KeyGen::new(&opts(5, true), 1, 2);
        let seen: Vec<u64> = (0..3)
            .flat_map(|_| [a.next_index(), b.next_index()])
            .collect();
        assert_eq!(seen, [0, 1, 2, 3, 4, 0]);
    }

    #[test]
    fn random_keys_stay_in_the_space() {
        let mut g = KeyGen::new(&opts(7, false), 3, 4);
        assert!((0..1000).all(|_| g.next_index() < 7));
    }

    #[test]
    fn txn_one_shares_a_prefix_and_txn_cross_spreads_over_shards() {
        use crate::placement::{routing_prefix, shard_for_key};
        let suffix = b"00000042";
        let keys = |spread: Spread, n: usize| -> Vec<Vec<u8>> {
            spread
                .prefixes(n)
                .iter()
                .map(|p| [p.as_ref(), suffix].concat())
                .collect()
        };
        let one = keys(Spread::OnePrefix, 4);
        assert!(one
            .iter()
            .all(|k| routing_prefix(k) == ONE_PREFIX.as_bytes()));
        let distinct: std::collections::BTreeSet<&Vec<u8>> = one.iter().collect();
        assert_eq!(distinct.len(), 4, "distinct keys");
        let cross = keys(Spread::CrossPrefixes, 2);
        for shards in 2..=16 {
            assert_ne!(
                shard_for_key(&cross[0], shards),
                shard_for_key(&cross[1], shards),
                "txn-cross's two keys at {shards} shards"
            );
        }
        let txn = cas_txn(
            cross.into_iter().map(Bytes::from).collect(),
            &value_of_size(1),
            7,
        );
        assert_eq!(
            (txn.compare.len(), txn.success.len(), txn.failure.len()),
            (2, 2, 2)
        );
        assert!(txn
            .compare
            .iter()
            .all(|c| c.target_union == Some(TargetUnion::ModRevision(8))));
    }

    #[test]
    fn prefix_end_follows_etcd_convention() {
        assert_eq!(prefix_end(b"abc"), b"abd");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), [0]);
    }
}
