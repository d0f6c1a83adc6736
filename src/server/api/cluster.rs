//! The etcd v3 Cluster service: the member list and membership changes.
//!
//! A member belongs to every shard's Raft group, so a membership change is one
//! conf change per shard, each carried out by that shard's leader: the member
//! a client asked does the shards it leads itself and carries the others to
//! their leaders over the peer port (`crate::server::member::peer_http`). Additions and
//! promotions go through the shards in order, removals in reverse order, so
//! shard 0, whose applies alone update the member table, is the first to add
//! and the last to remove. Each shard's step is idempotent (a shard already
//! changed answers at once), so a change that failed part way completes when
//! the client retries it; and a change runs to its end even if the client
//! that asked for it goes away.

use std::sync::Arc;
use std::time::Duration;

use cairn_proto::cairnpb::{MemberInfo, ShardConfChange};
use cairn_proto::etcdserverpb::cluster_server::Cluster;
use cairn_proto::etcdserverpb::{
    Member as PbMember, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use tonic::{Request, Response, Status};

use crate::raft::ConfChangeType;
use crate::server::api::kv::Identity;
use crate::server::errors::ApiError;
use crate::server::keyspace::router::Router;
use crate::server::members::{added_member_id, same_urls, Member, MemberRegistry};
use crate::server::peer_client;

/// How long one shard's step of a membership change may take, leader
/// elections and retries included.
pub const SHARD_CHANGE_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Clone)]
pub struct ClusterService {
    pub identity: Identity,
    pub router: Arc<Router>,
    pub members: Arc<MemberRegistry>,
    /// This core's keep-alive connections to the peers' HTTP sides.
    pub peers: peer_client::PeerClient,
    pub auth: Arc<crate::server::auth::AuthStore>,
}

fn pb_member(m: &Member) -> PbMember {
    PbMember {
        id: m.id,
        name: m.name.clone(),
        peer_ur_ls: m.peer_urls.clone(),
        client_ur_ls: m.client_urls.clone(),
        is_learner: m.is_learner,
    }
}

/// Peer URLs must be `http://host:port` with a port (etcd's check, in spirit).
/// Names are not looked up here (etcd does not either): the new member's name
/// may resolve only once it runs.
fn check_peer_urls(urls: &[String]) -> Result<(), ApiError> {
    if urls.is_empty() {
        return Err(ApiError::MemberBadUrls);
    }
    for u in urls {
        crate::config::url_host_port("peer-urls", u).map_err(|_| ApiError::MemberBadUrls)?;
    }
    Ok(())
}

impl ClusterService {
    fn members(&self) -> Vec<PbMember> {
        self.members
            .membership()
            .members
            .iter()
            .map(pb_member)
            .collect()
    }

    /// The members once `changed` is in the table: a change answered by
    /// another member's shard leader may not be applied here yet, and the
    /// answer lists the membership it made (etcdctl prints a new member's
    /// `ETCD_INITIAL_CLUSTER` from it).
    fn members_with(&self, changed: &MemberInfo) -> Vec<PbMember> {
        let changed = pb_member(&Member::from_info(changed));
        let mut list = self.members();
        match list.iter_mut().find(|m| m.id == changed.id) {
            Some(m) => *m = changed,
            None => list.push(changed),
        }
        list
    }

    /// The members once `removed` is out of the table (see `members_with`).
    fn members_without(&self, removed: u64) -> Vec<PbMember> {
        let mut list = self.members();
        list.retain(|m| m.id != removed);
        list
    }

    fn member(&self, id: u64) -> Result<Member, Status> {
        self.members
            .get(id)
            .ok_or_else(|| ApiError::MemberNotFound.into())
    }

    fn header(&self) -> Option<cairn_proto::etcdserverpb::ResponseHeader> {
        Some(self.identity.header_now(0))
    }

    /// Carries out `change` of `member` once every shard's leader has
    /// checked it (etcd's strict reconfiguration check; for a promotion,
    /// that the learner has caught up): a refusal leaves no shard changed,
    /// and no member a voter in some shards and a learner in others.
    async fn checked_change(
        &self,
        change: ConfChangeType,
        member: &MemberInfo,
    ) -> Result<(), Status> {
        self.change_shards(change, member, true).await?;
        self.change_shards(change, member, false).await
    }

    /// Carries out `change` of `member` on every shard, in a task of its own:
    /// a client that gives up does not leave it half done. Shard 0, whose
    /// applies the member table follows, goes first for every change but a
    /// removal, which it records last.
    async fn change_shards(
        &self,
        change: ConfChangeType,
        member: &MemberInfo,
        check_only: bool,
    ) -> Result<(), Status> {
        let router = self.router.clone();
        let members = self.members.clone();
        let peers = self.peers.clone();
        let member = member.clone();
        let mut shards: Vec<u32> = self.router.routing.shard_ids().collect();
        if change == ConfChangeType::ConfChangeRemoveNode {
            shards.reverse();
        }
        let task = tokio::spawn(async move {
            for shard in shards {
                change_shard(
                    &router, &members, &peers, shard, change, &member, check_only,
                )
                .await?;
            }
            Ok(())
        });
        task.await
            .unwrap_or_else(|e| Err(Status::internal(format!("membership change task: {e}"))))
    }
}

/// One shard's step of a membership change: here if this member leads the
/// shard, else at its leader; retried through leader changes.
pub async fn change_shard(
    router: &Router,
    members: &MemberRegistry,
    peers: &peer_client::PeerClient,
    shard: u32,
    change: ConfChangeType,
    member: &MemberInfo,
    check_only: bool,
) -> Result<(), Status> {
    let request = ShardConfChange {
        shard,
        change_type: change as i32,
        member: Some(member.clone()),
        check_only,
    };
    let cluster_id = members.cluster_id();
    peer_client::at_shard_leader(
        members,
        SHARD_CHANGE_TIMEOUT,
        || async {
            router
                .conf_change(shard, change, member.clone(), check_only)
                .await
                .map(|_| ())
        },
        |url| {
            let request = &request;
            async move { peers.forward_conf_change(&url, cluster_id, request).await }
        },
    )
    .await
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        crate::server::auth::require_admin(&self.auth, &request)?;
        let _one_at_a_time = self.members.change_lock().await;
        let req = request.into_inner();
        check_peer_urls(&req.peer_ur_ls)?;
        let now = self.members.membership();
        if now.members.iter().any(|m| {
            m.peer_urls
                .iter()
                .any(|u| req.peer_ur_ls.iter().any(|r| r == u))
        }) {
            return Err(ApiError::PeerUrlExist.into());
        }
        let id = added_member_id(
            &req.peer_ur_ls,
            now.cluster_id,
            crate::server::clock::now_ms(),
        );
        if now.get(id).is_some() {
            return Err(ApiError::MemberExist.into());
        }
        // etcd's limit: one learner at a time.
        if req.is_learner && now.members.iter().any(|m| m.is_learner) {
            return Err(ApiError::TooManyLearners.into());
        }
        let info = MemberInfo {
            id,
            name: String::new(),
            peer_urls: req.peer_ur_ls.clone(),
            client_urls: Vec::new(),
            is_learner: req.is_learner,
        };
        let change = if req.is_learner {
            ConfChangeType::ConfChangeAddLearnerNode
        } else {
            ConfChangeType::ConfChangeAddNode
        };
        tracing::info!(member = format_args!("{id:x}"), peer_urls = ?req.peer_ur_ls, learner = req.is_learner, "adding member");
        self.checked_change(change, &info).await?;
        Ok(Response::new(MemberAddResponse {
            header: self.header(),
            member: Some(pb_member(&Member::from_info(&info))),
            members: self.members_with(&info),
        }))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        crate::server::auth::require_admin(&self.auth, &request)?;
        let _one_at_a_time = self.members.change_lock().await;
        let id = request.into_inner().id;
        let member = self.member(id)?;
        tracing::info!(member = format_args!("{id:x}"), "removing member");
        self.checked_change(ConfChangeType::ConfChangeRemoveNode, &member.to_info())
            .await?;
        // The removed member may not learn of its removal from Raft (the
        // leader stops replicating to it once the change applies): tell it.
        if id == self.members.local_id() {
            self.members.mark_removed();
        } else if let Some(url) = member.peer_urls.first() {
            if let Err(e) = self
                .peers
                .tell_removed(url, self.members.cluster_id(), id)
                .await
            {
                tracing::warn!(member = format_args!("{id:x}"), error = %e, "could not tell the removed member; it stops when it next starts");
            }
        }
        Ok(Response::new(MemberRemoveResponse {
            header: self.header(),
            members: self.members_without(id),
        }))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        crate::server::auth::require_admin(&self.auth, &request)?;
        let _one_at_a_time = self.members.change_lock().await;
        let req = request.into_inner();
        check_peer_urls(&req.peer_ur_ls)?;
        let member = self.member(req.id)?;
        let now = self.members.membership();
        if now.members.iter().any(|m| {
            m.id != req.id
                && m.peer_urls
                    .iter()
                    .any(|u| req.peer_ur_ls.iter().any(|r| r == u))
        }) {
            return Err(ApiError::PeerUrlExist.into());
        }
        let mut info = member.to_info();
        if !same_urls(&member.peer_urls, &req.peer_ur_ls) {
            info.peer_urls = req.peer_ur_ls;
            self.change_shards(ConfChangeType::ConfChangeUpdateNode, &info, false)
                .await?;
        }
        Ok(Response::new(MemberUpdateResponse {
            header: self.header(),
            members: self.members_with(&info),
        }))
    }

    async fn member_list(
        &self,
        _: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        Ok(Response::new(MemberListResponse {
            header: self.header(),
            members: self.members(),
        }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        crate::server::auth::require_admin(&self.auth, &request)?;
        let _one_at_a_time = self.members.change_lock().await;
        let id = request.into_inner().id;
        let member = self.member(id)?;
        // A learner in any shard still needs promoting there (a promotion
        // that stopped part way is finished by asking again).
        let statuses = self.router.all_status().await?;
        if !statuses.iter().any(|s| s.learners.contains(&id)) {
            return Err(ApiError::MemberNotLearner.into());
        }
        let mut info = member.to_info();
        info.is_learner = false;
        tracing::info!(member = format_args!("{id:x}"), "promoting learner");
        self.checked_change(ConfChangeType::ConfChangeAddNode, &info)
            .await?;
        Ok(Response::new(MemberPromoteResponse {
            header: self.header(),
            members: self.members_with(&info),
        }))
    }
}

/// Publishes this member's name and client URLs to the cluster (through shard
/// 0's log, which every member applies) once they differ from what the table
/// holds: a member added with `member add` is nameless until it starts, and
/// members of a new cluster learn each other's client URLs this way.
pub async fn publish_attributes(
    router: Arc<Router>,
    members: Arc<MemberRegistry>,
    peers: peer_client::PeerClient,
    name: String,
    client_urls: Vec<String>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let local = members.local_id();
    loop {
        let Some(current) = members.get(local) else {
            return;
        };
        let published = current.name == name && same_urls(&current.client_urls, &client_urls);
        if published {
            return;
        }
        let mut info = current.to_info();
        info.name = name.clone();
        info.client_urls = client_urls.clone();
        let attempt = change_shard(
            &router,
            &members,
            &peers,
            0,
            ConfChangeType::ConfChangeUpdateNode,
            &info,
            false,
        );
        tokio::select! {
            _ = stop.changed() => return,
            result = attempt => match result {
                Ok(()) => {
                    tracing::info!(name, client_urls = ?client_urls, "published this member's attributes");
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "publishing this member's attributes failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            },
        }
    }
}

/// How often a member checks that the cluster still counts it in.
pub const MEMBERSHIP_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// Consecutive checks that must find this member missing before it stops.
pub const MEMBERSHIP_CHECK_STRIKES: u32 = 3;

/// Stops a member the cluster removed while it could not be told (it was down
/// or cut off): when a majority of the members answer with tables that lack
/// it, several times in a row, it marks itself removed, as if told.
pub async fn watch_for_removal(
    members: Arc<MemberRegistry>,
    client: peer_client::PeerClient,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut strikes = 0;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(MEMBERSHIP_CHECK_INTERVAL) => {}
        }
        let table = members.membership();
        let me = table.local_id;
        let peers: Vec<String> = table
            .members
            .iter()
            .filter(|m| m.id != me)
            .filter_map(|m| m.peer_urls.first().cloned())
            .collect();
        let mut answered = 0usize;
        let mut knows_me = false;
        for url in &peers {
            if let Ok(t) = client.fetch_members(url).await {
                if t.cluster_id == table.cluster_id {
                    answered += 1;
                    knows_me |= t.members.iter().any(|m| m.id == me);
                }
            }
        }
        // With this member, `answered + 1` of `peers + 1` members: a majority.
        let majority = 2 * (answered + 1) > peers.len() + 1;
        if knows_me || !majority || answered == 0 {
            strikes = 0;
            continue;
        }
        strikes += 1;
        tracing::warn!(
            strikes,
            of = MEMBERSHIP_CHECK_STRIKES,
            "the members that answered do not count this member in"
        );
        if strikes >= MEMBERSHIP_CHECK_STRIKES {
            members.mark_removed();
            return;
        }
    }
}
