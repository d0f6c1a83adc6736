//! A running member: the cores, their WALs and shards, the peer transport,
//! and the client API listeners, started on a data directory that
//! [`crate::server::member::data_dir`] has prepared.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::etcdserverpb::auth_server::AuthServer;
use cairn_proto::etcdserverpb::cluster_server::ClusterServer;
use cairn_proto::etcdserverpb::kv_server::KvServer;
use cairn_proto::etcdserverpb::lease_server::LeaseServer;
use cairn_proto::etcdserverpb::maintenance_server::MaintenanceServer;
use cairn_proto::etcdserverpb::watch_server::WatchServer;
use cairn_proto::grpc_health_v1::health_server::HealthServer;
use cairn_proto::v3electionpb::election_server::ElectionServer;
use cairn_proto::v3lockpb::lock_server::LockServer;
use tokio::sync::{mpsc, watch};

use crate::config::Config;
use crate::routing::{RoutingTable, ShardId};
use crate::runtime::{CoreContext, Cores};
use crate::server::api::call_gate::CallGate;
use crate::server::api::cluster::ClusterService;
use crate::server::api::kv::{Identity, KvService, Limits};
use crate::server::api::maintenance::MaintenanceService;
use crate::server::api::require_leader::{self, LeaderLoss};
use crate::server::keyspace::router::{command_channels, Router};
use crate::server::keyspace::Keyspace;
use crate::server::members::MemberRegistry;
use crate::server::revisions::RevisionCounter;
use crate::server::shard::{Shard, ShardInbound, ShardSetup};
use crate::server::shard_inbox::CommandInbox;

/// Raft messages queued for one shard from the network before the reader waits
/// (and TCP pushes back on the peer).
pub const SHARD_INBOUND_MESSAGES: usize = 8_192;

use crate::server::member::data_dir::{log_sharding, prepare_data_dir};
use crate::server::member::peer_links::{forward_inbound, CorePeers};
use crate::server::member::setup::{bind_reuseport, check_port_free, start_tls, wal_config};
pub use crate::server::member::start_error::StartError;

/// Everything shared by the cores, built before they start.
struct Shared {
    config: Config,
    members: Arc<MemberRegistry>,
    routing: RoutingTable,
    /// Each core's router: its own channel to every shard.
    routers: Vec<Arc<Router>>,
    identity: Identity,
    net: cairn_net::Config,
    /// Every shard's command inbox, taken by the owning core.
    commands: Vec<std::sync::Mutex<Option<CommandInbox>>>,
    inbound_tx: Arc<Vec<mpsc::Sender<ShardInbound>>>,
    inbound_rx: Vec<std::sync::Mutex<Option<mpsc::Receiver<ShardInbound>>>>,
    client_listeners: Vec<std::sync::Mutex<Vec<std::net::TcpListener>>>,
    peer_listener: std::sync::Mutex<Option<std::net::TcpListener>>,
    shutdown: watch::Receiver<bool>,
    ready_cores: std::sync::atomic::AtomicUsize,
    recorders: Vec<crate::ops::server_metrics::CoreRecorder>,
    readiness: Arc<crate::ops::readiness::Readiness>,
    /// Ends the client streams that require a leader when the member has
    /// none; its monitor is taken and run by core 0.
    leader_loss: LeaderLoss,
    leader_monitor: std::sync::Mutex<Option<require_leader::Monitor>>,
    endpoints: crate::ops::http::OpsEndpoints,
    watchdog: Arc<crate::ops::watchdog::Watchdog>,
    /// Watch stream ids, unique across the member's cores.
    next_watch_stream: Arc<std::sync::atomic::AtomicU64>,
    /// Lease ids this member generates, unique across its cores.
    lease_ids: Arc<crate::server::api::lease::LeaseIds>,
    /// The certificates of the https:// client URLs.
    client_tls: Option<Arc<crate::tls::CertSource>>,
    /// The peer certificates: the peer port's when its URL is https://, and
    /// this member's when it reaches https:// peers.
    peer_tls: Option<cairn_net::PeerTls>,
    /// Users, roles and permissions; changed by shard 0's log.
    auth: Arc<crate::server::auth::AuthStore>,
    /// The revision counter of the member's shards and what its txns over
    /// several shards share, with several shards.
    keyspace: Option<Arc<Keyspace>>,
}

/// A started member.
pub struct Node {
    cores: Cores,
    shutdown: watch::Sender<bool>,
    /// Recovered, every shard led, caught up: what `/readyz` and systemd's
    /// `READY=1` wait for.
    pub readiness: Arc<crate::ops::readiness::Readiness>,
    pub member_id: u64,
    pub cluster_id: u64,
    pub client_addrs: Vec<SocketAddr>,
    pub peer_addr: SocketAddr,
    /// The member table; says when this member has been removed.
    pub members: Arc<MemberRegistry>,
}

impl Node {
    /// Opens the data directory, binds every port, and starts the cores.
    /// `watchdog` collects the cores' check-ins for systemd's watchdog.
    pub fn start(
        config: Config,
        watchdog: Arc<crate::ops::watchdog::Watchdog>,
    ) -> Result<Node, StartError> {
        let mut config = config;
        crate::server::clock::follow(config.test_clock_file.clone());
        let (client_tls, peer_tls) = start_tls(&config)?;
        let file = prepare_data_dir(&mut config, peer_tls.clone())?;
        log_sharding(config.shards);
        let members = Arc::new(MemberRegistry::new(
            &config.data_dir,
            file.clone(),
            crate::server::members::WriterThread::Own,
        ));
        let auth = crate::server::auth::AuthStore::open(&config.data_dir, config.auth.clone())?;
        let routing = RoutingTable::new(config.shards, config.cores);
        let keyspace = (config.shards > 1)
            .then(|| Arc::new(Keyspace::new(Arc::new(RevisionCounter::new(config.shards)))));
        let placement: Vec<(u32, usize)> = routing
            .shard_ids()
            .map(|s| (s, routing.core_for_shard(s)))
            .collect();
        let (registry, recorders) =
            crate::ops::server_metrics::server_metrics(config.cores, &placement)?;
        let channels = command_channels(&routing, config.cores, keyspace.clone(), &recorders);
        let routers = channels.routers;
        let commands = channels
            .inboxes
            .into_iter()
            .map(|inbox| std::sync::Mutex::new(Some(inbox)))
            .collect();
        let mut inbound_tx = Vec::new();
        let mut inbound_rx = Vec::new();
        for _ in 0..config.shards {
            let (tx, rx) = mpsc::channel(SHARD_INBOUND_MESSAGES);
            inbound_tx.push(tx);
            inbound_rx.push(std::sync::Mutex::new(Some(rx)));
        }
        let identity = Identity::new(file.cluster_id, file.member_id);

        // Bind everything before any core starts, so a port in use fails the
        // start with a clear error instead of a half-started member.
        let mut client_listeners: Vec<Vec<std::net::TcpListener>> =
            (0..config.cores).map(|_| Vec::new()).collect();
        let mut client_addrs = Vec::new();
        for &addr in &config.listen_client_addrs {
            let first = check_port_free(addr)
                .and_then(|()| bind_reuseport(addr))
                .map_err(|source| StartError::Bind {
                    what: "the client port",
                    addr,
                    source,
                })?;
            let bound = first
                .local_addr()
                .map_err(StartError::io("the client port's address"))?;
            client_addrs.push(bound);
            client_listeners[0].push(first);
            for listeners in client_listeners.iter_mut().skip(1) {
                listeners.push(bind_reuseport(bound).map_err(|source| StartError::Bind {
                    what: "the client port",
                    addr: bound,
                    source,
                })?);
            }
        }
        let peer_addr = config.listen_peer_addrs[0];
        let peer_listener =
            std::net::TcpListener::bind(peer_addr).map_err(|source| StartError::Bind {
                what: "the peer port",
                addr: peer_addr,
                source,
            })?;
        peer_listener
            .set_nonblocking(true)
            .map_err(StartError::io("the peer port"))?;
        let peer_addr = peer_listener
            .local_addr()
            .map_err(StartError::io("the peer port's address"))?;

        let net = cairn_net::Config {
            cluster_id: file.cluster_id,
            member_id: file.member_id,
            tls: peer_tls.clone(),
            ..cairn_net::Config::default()
        };
        let shard_ids: Vec<u32> = routing.shard_ids().collect();
        let readiness = crate::ops::readiness::Readiness::new(&shard_ids);
        let endpoints = crate::ops::http::OpsEndpoints::new(
            Arc::new(registry),
            readiness.clone(),
            Some(watchdog.clone()),
        );
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let (leader_loss, leader_monitor) = LeaderLoss::new(
            readiness.clone(),
            std::time::Duration::from_millis(config.election_timeout_ms),
        );
        let shared = Arc::new(Shared {
            recorders,
            readiness: readiness.clone(),
            leader_loss,
            leader_monitor: std::sync::Mutex::new(Some(leader_monitor)),
            endpoints,
            watchdog,
            next_watch_stream: Arc::new(std::sync::atomic::AtomicU64::new(1)),
            lease_ids: Arc::new(crate::server::api::lease::LeaseIds::new(file.member_id)),
            client_tls,
            peer_tls,
            auth,
            keyspace,
            members: members.clone(),
            routing,
            routers,
            identity,
            net,
            commands,
            inbound_tx: Arc::new(inbound_tx),
            inbound_rx,
            client_listeners: client_listeners
                .into_iter()
                .map(std::sync::Mutex::new)
                .collect(),
            peer_listener: std::sync::Mutex::new(Some(peer_listener)),
            shutdown: shutdown_rx,
            config: config.clone(),
            ready_cores: std::sync::atomic::AtomicUsize::new(0),
        });
        let first_cpu = config.host_share.first_cpu(config.cores);
        let cores = Cores::start(
            config.cores,
            Some(first_cpu),
            config.idle_poll,
            move |ctx| {
                let shared = shared.clone();
                async move {
                    if let Err(e) = run_core(ctx, shared).await {
                        tracing::error!(error = %e, "core failed to start; stopping");
                        std::process::exit(1);
                    }
                }
            },
        )
        .map_err(StartError::io("starting core threads"))?;
        Ok(Node {
            cores,
            shutdown: shutdown_tx,
            readiness,
            member_id: file.member_id,
            cluster_id: file.cluster_id,
            client_addrs,
            peer_addr,
            members,
        })
    }

    /// Stops accepting, lets in-flight work finish, syncs, and waits for every
    /// core to stop.
    pub fn stop(self) {
        let _ = self.shutdown.send(true);
        self.cores.join();
    }
}

async fn run_core(ctx: CoreContext, shared: Arc<Shared>) -> Result<(), StartError> {
    let config = &shared.config;
    let core = ctx.id;
    let my_shards: Vec<ShardId> = shared
        .routing
        .shard_ids()
        .filter(|&s| shared.routing.core_for_shard(s) == core)
        .collect();

    let (wal, mut recovered) = cairn_wal::Wal::open(wal_config(config, core))
        .await
        .map_err(|source| StartError::Wal { core, source })?;
    if let Some((file, offset, reason)) = &recovered.torn_tail {
        tracing::warn!(core, file = %file.display(), offset, reason = %reason, "WAL torn tail cut");
    }
    let recorder = shared.recorders[core].clone();
    let idle_polling = {
        let recorder = recorder.clone();
        crate::runtime::observe_idle_polls(Box::new(move |hit, polled| {
            recorder.idle_poll(hit, polled)
        }))
    };
    tracing::info!(
        core,
        cpu = %ctx.cpu.map_or_else(|| "unpinned".to_string(), |c| c.to_string()),
        backend = %wal.backend(),
        shards = ?my_shards,
        idle_polling,
        "core started"
    );
    // Without idle polling (turned off, or the runtime's epoll not found), the
    // host's halt polling is what keeps a wake-up cheap: say so if it is off.
    if core == 0 && !idle_polling {
        if !config.idle_poll.is_zero() {
            tracing::warn!(
                "idle polling is unavailable (the runtime's epoll instance was not found \
                 in /proc/self/fdinfo); cores sleep without polling"
            );
        }
        if let Some(advice) = crate::ops::host::halt_polling_advice(std::path::Path::new("/sys")) {
            tracing::warn!("{advice}");
        }
    }
    recorder.set_wal_backend(if wal.backend().starts_with("uring") {
        crate::ops::server_metrics::WalBackendKind::IoUring
    } else {
        crate::ops::server_metrics::WalBackendKind::Sync
    });
    {
        let recorder = recorder.clone();
        wal.set_flush_observer(Box::new(move |ev: &cairn_wal::FlushEvent| {
            recorder.wal_fsync(ev.latency);
            recorder.wal_group_commit(u64::from(ev.appends), ev.bytes as u64);
        }));
    }
    tokio::task::spawn_local(shared.watchdog.clone().run_check_ins(core));
    let wal = Rc::new(wal);

    // Outbound links for this core's shards to every other member.
    let membership = shared.members.membership();
    let peers = Rc::new(CorePeers {
        links: RefCell::new(HashMap::new()),
        net: shared.net.clone(),
        inbound: shared.inbound_tx.clone(),
        data_dir: config.data_dir.clone(),
    });
    for &shard in &my_shards {
        for m in &membership.members {
            if m.id == membership.local_id {
                continue;
            }
            peers
                .dial(shard, m.id, &m.peer_urls)
                .map_err(|reason| StartError::Peer {
                    member: m.id,
                    reason,
                })?;
        }
    }

    let tick = Duration::from_millis(config.heartbeat_interval_ms);
    let election_ticks = (config.election_timeout_ms / config.heartbeat_interval_ms).max(2);
    for &shard in &my_shards {
        let commands = shared.commands[shard as usize]
            .lock()
            .expect("commands")
            .take()
            .expect("each shard's commands are taken once");
        let inbound = shared.inbound_rx[shard as usize]
            .lock()
            .expect("inbound")
            .take()
            .expect("each shard's inbound is taken once");
        let mut setup = ShardSetup {
            shard,
            member_id: membership.local_id,
            initial_voters: shared.members.bootstrap_voters(),
            dir: crate::server::member::data_dir::shard_dir(&config.data_dir, shard),
            wal: wal.clone(),
            recovered: recovered
                .shards
                .remove(&u64::from(shard))
                .unwrap_or_default(),
            peers: peers.clone(),
            commands,
            inbound,
            tick,
            election_ticks,
            quota_backend_bytes: config.quota_backend_bytes,
            snapshot_count: config.snapshot_count,
            shutdown: shared.shutdown.clone(),
            metrics: recorder.shard(shard),
            readiness: Some(shared.readiness.clone()),
            members: shared.members.clone(),
            auth: Some(shared.auth.replica().clone()),
            disk_faults: config.test_disk_faults.clone(),
            store_sync_thread: true,
            term_out: (shard == 0).then(|| shared.identity.raft_term.clone()),
            revision_out: Some(shared.identity.revision.clone()),
            keyspace: shared.keyspace.as_ref().map(|k| k.counter.clone()),
            seed: None,
            max_append_bytes: None,
            strict_reconfig: config.strict_reconfig_check,
            off_core: Default::default(),
            timer_faults: None,
            #[cfg(feature = "raft-mutations")]
            mutation: None,
        };
        let driver = Shard::open(&mut setup)?;
        tokio::task::spawn_local(driver.run(setup));
    }
    if core == 0 && shared.keyspace.is_some() {
        // Before the counter opens here, the txns over several shards an
        // earlier keyspace leader left half-proposed are finished.
        tokio::task::spawn_local(crate::server::keyspace::cross_txn::finish_at_every_opening(
            shared.routers[core].clone(),
        ));
        tokio::task::spawn_local(crate::server::keyspace::cross_txn::revoke_expired_leases(
            shared.routers[core].clone(),
        ));
    }

    // Core 0 accepts peer connections and hands each to the core of its lane.
    if core == 0 {
        let listener = shared
            .peer_listener
            .lock()
            .expect("peer listener")
            .take()
            .expect("taken once");
        let listener =
            tokio::net::TcpListener::from_std(listener).map_err(StartError::io("peer listener"))?;
        // The peer port speaks TLS when its URL is https://.
        let accept_tls = config
            .listen_peer_https
            .first()
            .copied()
            .unwrap_or(false)
            .then(|| shared.peer_tls.clone())
            .flatten();
        let policy = cairn_net::AcceptPolicy {
            config: cairn_net::Config {
                tls: accept_tls,
                ..shared.net.clone()
            },
            members: shared.members.accepted(),
            lane_count: config.shards as u32,
        };
        // The peer port also answers the peer HTTP requests (membership).
        let mut peer_listener = cairn_net::PeerListener::from_listener(listener, policy)
            .with_other_protocol(crate::server::member::peer_http::is_http);
        let peer_http = crate::server::member::peer_http::PeerHttp {
            router: shared.routers[core].clone(),
            members: shared.members.clone(),
        };
        let cores = ctx.cores.clone();
        let shared2 = shared.clone();
        let mut stop = shared.shutdown.clone();
        tokio::task::spawn_local(async move {
            loop {
                let incoming = tokio::select! {
                    _ = stop.changed() => return,
                    a = peer_listener.accept_any() => a,
                };
                let accepted = match incoming {
                    cairn_net::Incoming::Peer(a) => a,
                    cairn_net::Incoming::Other { stream, peer_addr } => {
                        tokio::task::spawn_local(
                            peer_http.clone().serve(stream, peer_addr.to_string()),
                        );
                        continue;
                    }
                };
                let lane = accepted.hello.lane;
                let target = shared2.routing.core_for_shard(lane);
                let shared3 = shared2.clone();
                let job: crate::runtime::CoreJob = Box::new(move || {
                    let peer = accepted.hello.member_id;
                    match cairn_net::serve_accepted(accepted, &shared3.net) {
                        Ok((link, rx)) => {
                            tokio::task::spawn_local(forward_inbound(
                                rx,
                                shared3.inbound_tx.clone(),
                                shared3.config.data_dir.clone(),
                                peer,
                                Some(link),
                            ));
                        }
                        Err(e) => tracing::warn!(error = %e, "could not serve a peer connection"),
                    }
                });
                if cores[target].send(job).await.is_err() {
                    return;
                }
            }
        });
    }

    // The client API on this core's SO_REUSEPORT listeners.
    let listeners = std::mem::take(&mut *shared.client_listeners[core].lock().expect("listeners"));
    let limits = Limits {
        max_request_bytes: config.max_request_bytes,
        max_txn_ops: config.max_txn_ops,
    };
    // gRPC's own cap sits above etcd's request limit (as etcd's does) so an
    // oversize request gets etcd's "request is too large" error, not a transport error.
    let max_message_bytes = config.max_request_bytes + 512 * 1024;
    // This core's keep-alive connections to peers' HTTP sides, for lease
    // renewals and membership changes.
    let peers = crate::server::peer_client::PeerClient::new(shared.peer_tls.clone());
    let min_lease_ttl_secs = crate::server::api::lease::min_lease_ttl_secs(
        config.heartbeat_interval_ms,
        config.election_timeout_ms,
    );
    for (index, listener) in listeners.into_iter().enumerate() {
        // Each listen URL's own scheme says whether it speaks TLS.
        let tls = config
            .listen_client_https
            .get(index)
            .copied()
            .unwrap_or(false)
            .then(|| {
                shared
                    .client_tls
                    .clone()
                    .map(crate::tls::ClientPortTls::new)
            })
            .flatten();
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(StartError::io("client listener"))?;
        let kv = KvService {
            router: shared.routers[core].clone(),
            identity: shared.identity.clone(),
            limits,
            auth: shared.auth.clone(),
            members: shared.members.clone(),
            peers: peers.clone(),
            readiness: shared.readiness.clone(),
        };
        let maintenance = MaintenanceService {
            router: shared.routers[core].clone(),
            identity: shared.identity.clone(),
            members: shared.members.clone(),
            auth: shared.auth.clone(),
        };
        let watch = crate::server::api::watch::WatchService {
            router: shared.routers[core].clone(),
            members: shared.members.clone(),
            identity: shared.identity.clone(),
            next_stream: shared.next_watch_stream.clone(),
            auth: shared.auth.clone(),
            metrics: Some(recorder.clone()),
            leader_loss: shared.leader_loss.clone(),
            progress_interval: config.watch_progress_notify_interval,
        };
        let cluster = ClusterService {
            identity: shared.identity.clone(),
            router: shared.routers[core].clone(),
            members: shared.members.clone(),
            peers: peers.clone(),
            auth: shared.auth.clone(),
        };
        let lease = crate::server::api::lease::LeaseService {
            router: shared.routers[core].clone(),
            members: shared.members.clone(),
            identity: shared.identity.clone(),
            min_ttl_secs: min_lease_ttl_secs,
            ids: shared.lease_ids.clone(),
            peers: peers.clone(),
            renewals: crate::server::api::lease_renewals::Renewals::new(
                peers.clone(),
                shared.members.cluster_id(),
                crate::server::api::lease::PEER_LEASE_TIMEOUT,
            ),
            auth: shared.auth.clone(),
            leader_loss: shared.leader_loss.clone(),
        };
        let auth = crate::server::auth::service::AuthService {
            auth: shared.auth.clone(),
            router: shared.routers[core].clone(),
            identity: shared.identity.clone(),
            metrics: Some(recorder.clone()),
        };
        let mut stop = shared.shutdown.clone();
        let mut stop_http = shared.shutdown.clone();
        // etcd serves /metrics and health on the client port beside gRPC: each
        // connection is sniffed; HTTP/2 goes to tonic, HTTP/1 to the ops endpoints.
        let (grpc_tx, grpc_rx) = mpsc::channel(1024);
        // Cairn's own gRPC server calls the KV service directly.
        let kv_direct = kv.clone();
        // Every service has etcd's message cap (answers are not capped).
        macro_rules! capped {
            ($server:expr) => {
                $server
                    .max_decoding_message_size(max_message_bytes)
                    .max_encoding_message_size(usize::MAX)
            };
        }
        let etcd_services = tonic::service::Routes::new(capped!(KvServer::new(kv)))
            .add_service(capped!(MaintenanceServer::new(maintenance)))
            .add_service(capped!(ClusterServer::new(cluster)))
            .add_service(capped!(WatchServer::new(watch)))
            .add_service(capped!(LeaseServer::new(lease)))
            .add_service(capped!(AuthServer::new(auth)));
        // etcd's Lock and Election services call the others on their
        // client's behalf.
        let lock = crate::server::api::lock::LockService {
            routes: etcd_services.clone(),
        };
        let election = crate::server::api::election::ElectionService {
            routes: etcd_services.clone(),
            leader_loss: shared.leader_loss.clone(),
        };
        if core == 0 && index == 0 {
            // etcd's automatic compaction calls Compact as a client would.
            let compactor = crate::server::api::auto_compaction::AutoCompactor {
                policy: config.auto_compaction,
                revision_interval: config.revision_compaction_interval,
                routes: etcd_services.clone(),
                router: shared.routers[core].clone(),
                identity: shared.identity.clone(),
            };
            tokio::task::spawn_local(compactor.run(shared.shutdown.clone()));
        }
        let services = etcd_services
            .add_service(capped!(LockServer::new(lock)))
            .add_service(capped!(ElectionServer::new(election)))
            .add_service(capped!(HealthServer::new(
                crate::server::api::health::HealthService {
                    leader_loss: shared.leader_loss.clone(),
                }
            )));
        let gate = CallGate::new(shared.members.clone(), shared.leader_loss.clone());
        // HTTP/1 requests that are not operator endpoints go to the HTTP/JSON
        // gateway, which calls the same services in-process.
        let endpoints = shared
            .endpoints
            .with_fallback(crate::server::gateway::fallback(
                services.clone(),
                max_message_bytes,
                gate.clone(),
            ));
        tokio::task::spawn_local(async move {
            let shutdown = async move {
                let _ = stop_http.changed().await;
            };
            if let Err(e) =
                crate::ops::http::serve_client_port(listener, endpoints, tls, grpc_tx, shutdown)
                    .await
            {
                tracing::error!(error = %e, "client port failed");
            }
        });
        match config.grpc_server {
            crate::config::GrpcServer::Cairn => {
                let handler = crate::grpc::Handler {
                    kv: kv_direct,
                    routes: services,
                    max_message: max_message_bytes,
                    gate,
                    recorder: recorder.clone(),
                    max_streams: config.stream_limit(),
                };
                tokio::task::spawn_local(crate::grpc::serve_incoming(
                    grpc_rx,
                    Rc::new(handler),
                    stop,
                ));
            }
            crate::config::GrpcServer::Tonic => {
                use tokio_stream::StreamExt;
                let incoming = tokio_stream::wrappers::ReceiverStream::new(grpc_rx)
                    .map(|conn| Ok::<_, std::io::Error>(crate::ops::http::GrpcConn::from(conn)));
                let server = tonic::transport::Server::builder()
                    .max_concurrent_streams(config.stream_limit())
                    .add_routes(services)
                    .serve_with_incoming_shutdown(incoming, async move {
                        let _ = stop.changed().await;
                    });
                tokio::task::spawn_local(async move {
                    if let Err(e) = server.await {
                        tracing::error!(error = %e, "client API server failed");
                    }
                });
            }
        }
    }
    if core == 0 {
        let monitor = shared
            .leader_monitor
            .lock()
            .expect("leader monitor")
            .take()
            .expect("taken once");
        tokio::task::spawn_local(monitor.run(shared.shutdown.clone()));
        tokio::task::spawn_local(crate::server::api::cluster::watch_for_removal(
            shared.members.clone(),
            peers.clone(),
            shared.shutdown.clone(),
        ));
        tokio::task::spawn_local(crate::server::api::cluster::publish_attributes(
            shared.routers[core].clone(),
            shared.members.clone(),
            peers.clone(),
            config.name.clone(),
            config.advertise_client_urls.clone(),
            shared.shutdown.clone(),
        ));
        for &addr in &config.listen_metrics_addrs {
            let listener = crate::ops::http::bind(addr)
                .await
                .map_err(StartError::MetricsListener)?;
            let endpoints = shared.endpoints.clone();
            let mut stop = shared.shutdown.clone();
            tokio::task::spawn_local(async move {
                let shutdown = async move {
                    let _ = stop.changed().await;
                };
                if let Err(e) =
                    crate::ops::http::serve_listener(listener, endpoints, shutdown).await
                {
                    tracing::error!(error = %e, "metrics listener failed");
                }
            });
        }
    }
    let started = shared
        .ready_cores
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        + 1;
    if started == config.cores {
        // Every core has opened its WAL and stores and replayed: recovered.
        shared.readiness.set_recovered(true);
    }

    let mut stop = shared.shutdown.clone();
    let _ = stop.changed().await;
    // Let the shard drivers see the signal and write their last commit.
    tokio::time::sleep(Duration::from_millis(50)).await;
    match Rc::try_unwrap(wal) {
        Ok(wal) => wal.close().await,
        Err(wal) => wal.settle().await,
    }
    drop(peers);
    Ok(())
}
