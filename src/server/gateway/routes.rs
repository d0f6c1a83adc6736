//! Which gRPC method answers which gateway path: etcd 3.4's `google.api.http`
//! bindings, each served under `/v3/` and `/v3beta/`. The request and response
//! types and whether either side streams come from the compiled descriptors, so
//! this table holds names only.

use std::collections::HashMap;

use prost_reflect::MessageDescriptor;

use super::json::pool;

/// Path (after the version prefix), gRPC service, method: as etcd 3.4.
/// `HashKV` and `Downgrade` have no path in etcd 3.4's gateway, so none here.
/// The services of `etcdserverpb`; etcd 3.4 serves them under every prefix.
const BINDINGS: &[(&str, &str, &str)] = &[
    ("kv/range", "KV", "Range"),
    ("kv/put", "KV", "Put"),
    ("kv/deleterange", "KV", "DeleteRange"),
    ("kv/txn", "KV", "Txn"),
    ("kv/compaction", "KV", "Compact"),
    ("watch", "Watch", "Watch"),
    ("lease/grant", "Lease", "LeaseGrant"),
    ("lease/revoke", "Lease", "LeaseRevoke"),
    ("kv/lease/revoke", "Lease", "LeaseRevoke"),
    ("lease/keepalive", "Lease", "LeaseKeepAlive"),
    ("lease/timetolive", "Lease", "LeaseTimeToLive"),
    ("kv/lease/timetolive", "Lease", "LeaseTimeToLive"),
    ("lease/leases", "Lease", "LeaseLeases"),
    ("kv/lease/leases", "Lease", "LeaseLeases"),
    ("cluster/member/add", "Cluster", "MemberAdd"),
    ("cluster/member/remove", "Cluster", "MemberRemove"),
    ("cluster/member/update", "Cluster", "MemberUpdate"),
    ("cluster/member/list", "Cluster", "MemberList"),
    ("cluster/member/promote", "Cluster", "MemberPromote"),
    ("maintenance/alarm", "Maintenance", "Alarm"),
    ("maintenance/status", "Maintenance", "Status"),
    ("maintenance/defragment", "Maintenance", "Defragment"),
    ("maintenance/hash", "Maintenance", "Hash"),
    ("maintenance/snapshot", "Maintenance", "Snapshot"),
    (
        "maintenance/transfer-leadership",
        "Maintenance",
        "MoveLeader",
    ),
    ("auth/enable", "Auth", "AuthEnable"),
    ("auth/disable", "Auth", "AuthDisable"),
    ("auth/status", "Auth", "AuthStatus"),
    ("auth/authenticate", "Auth", "Authenticate"),
    ("auth/user/add", "Auth", "UserAdd"),
    ("auth/user/get", "Auth", "UserGet"),
    ("auth/user/list", "Auth", "UserList"),
    ("auth/user/delete", "Auth", "UserDelete"),
    ("auth/user/changepw", "Auth", "UserChangePassword"),
    ("auth/user/grant", "Auth", "UserGrantRole"),
    ("auth/user/revoke", "Auth", "UserRevokeRole"),
    ("auth/role/add", "Auth", "RoleAdd"),
    ("auth/role/get", "Auth", "RoleGet"),
    ("auth/role/list", "Auth", "RoleList"),
    ("auth/role/delete", "Auth", "RoleDelete"),
    ("auth/role/grant", "Auth", "RoleGrantPermission"),
    ("auth/role/revoke", "Auth", "RoleRevokePermission"),
];

/// Path (after the version prefix), gRPC service by its full name, method:
/// etcd 3.4's Lock and Election services (etcd 3.4 takes `/v3beta/` for
/// `/v3/` on every path, these too).
const RECIPE_BINDINGS: &[(&str, &str, &str)] = &[
    ("lock/lock", "v3lockpb.Lock", "Lock"),
    ("lock/unlock", "v3lockpb.Lock", "Unlock"),
    ("election/campaign", "v3electionpb.Election", "Campaign"),
    ("election/proclaim", "v3electionpb.Election", "Proclaim"),
    ("election/leader", "v3electionpb.Election", "Leader"),
    ("election/observe", "v3electionpb.Election", "Observe"),
    ("election/resign", "v3electionpb.Election", "Resign"),
];

/// The version prefixes etcd 3.4 serves the gateway under.
pub const PREFIXES: &[&str] = &["/v3/", "/v3beta/"];

/// One gRPC method reachable from the gateway.
#[derive(Debug, Clone)]
pub struct Route {
    /// The gRPC request path, `/etcdserverpb.KV/Range`.
    pub grpc_path: String,
    pub input: MessageDescriptor,
    pub output: MessageDescriptor,
    pub client_streaming: bool,
    pub server_streaming: bool,
}

/// Every gateway path with its method.
#[derive(Debug)]
pub struct RouteTable {
    routes: HashMap<String, Route>,
}

impl RouteTable {
    /// Builds the table from the compiled descriptors. A binding naming a method
    /// the schema lacks is a build mistake, caught by this module's test.
    pub fn build() -> RouteTable {
        let mut routes = HashMap::new();
        let etcd = BINDINGS
            .iter()
            .map(|&(path, service, method)| (path, format!("etcdserverpb.{service}"), method));
        let recipes = RECIPE_BINDINGS
            .iter()
            .map(|&(path, service, method)| (path, service.to_string(), method));
        for (path, service, method) in etcd.chain(recipes) {
            let Some(route) = route_for(&service, method) else {
                tracing::error!(service, method, "gateway binding names no compiled method");
                continue;
            };
            for prefix in PREFIXES {
                routes.insert(format!("{prefix}{path}"), route.clone());
            }
        }
        RouteTable { routes }
    }

    pub fn get(&self, path: &str) -> Option<&Route> {
        self.routes.get(path)
    }

    /// Whether `path` is under a gateway prefix (an unknown path there gets the
    /// gateway's own 404 body).
    pub fn is_gateway_path(path: &str) -> bool {
        PREFIXES.iter().any(|p| path.starts_with(p))
    }
}

fn route_for(service: &str, method: &str) -> Option<Route> {
    let service = pool().get_service_by_name(service)?;
    let method = service.methods().find(|m| m.name() == method)?;
    Some(Route {
        grpc_path: format!("/{}/{}", service.full_name(), method.name()),
        input: method.input(),
        output: method.output(),
        client_streaming: method.is_client_streaming(),
        server_streaming: method.is_server_streaming(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_binding_names_a_compiled_method() {
        for &(path, service, method) in BINDINGS {
            assert!(
                route_for(&format!("etcdserverpb.{service}"), method).is_some(),
                "{path}: etcdserverpb.{service}/{method} is not in the schema"
            );
        }
        for &(path, service, method) in RECIPE_BINDINGS {
            assert!(
                route_for(service, method).is_some(),
                "{path}: {service}/{method} is not in the schema"
            );
        }
        let table = RouteTable::build();
        let watch = table.get("/v3beta/watch").expect("watch bound");
        assert!(watch.client_streaming && watch.server_streaming);
        assert_eq!(watch.grpc_path, "/etcdserverpb.Watch/Watch");
        let put = table.get("/v3/kv/put").expect("put bound");
        assert_eq!(put.input.full_name(), "etcdserverpb.PutRequest");
        assert!(!put.client_streaming && !put.server_streaming);
        assert!(table.get("/v3alpha/kv/put").is_none());
        assert!(table.get("/v3/maintenance/hashkv").is_none());
        let observe = table.get("/v3/election/observe").expect("observe bound");
        assert_eq!(observe.grpc_path, "/v3electionpb.Election/Observe");
        assert!(!observe.client_streaming && observe.server_streaming);
        assert!(table.get("/v3/lock/lock").is_some());
        assert!(table.get("/v3beta/lock/lock").is_some());
    }
}
