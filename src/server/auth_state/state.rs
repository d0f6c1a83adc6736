//! The auth state as a pure state machine: users, roles and permissions, and
//! what each change does to them, with etcd's rules and errors. Every member
//! applies the same changes in shard 0's log order and so holds the same state.

use std::collections::HashMap;

use cairn_proto::authpb::{permission::Type as PermType, Permission, Role, User};
use cairn_proto::cairnpb::{auth_change::Change, AuthState};

use super::perms::UserPerms;
use crate::server::errors::ApiError;

/// The user that may enable auth, and the role that grants everything.
pub const ROOT: &str = "root";

/// The replicated state plus what is derived from it for fast checks.
#[derive(Debug, Default, Clone)]
pub struct AuthData {
    state: AuthState,
    /// Each user's merged permissions, rebuilt after every change.
    perms: HashMap<String, UserPerms>,
}

impl AuthData {
    pub fn new(state: AuthState) -> AuthData {
        let mut data = AuthData {
            state,
            perms: HashMap::new(),
        };
        data.rebuild();
        data
    }

    pub fn state(&self) -> &AuthState {
        &self.state
    }

    pub fn enabled(&self) -> bool {
        self.state.enabled
    }

    pub fn revision(&self) -> u64 {
        self.state.revision
    }

    pub fn applied_index(&self) -> u64 {
        self.state.applied_index
    }

    pub fn perms(&self, user: &str) -> Option<&UserPerms> {
        self.perms.get(user)
    }

    fn user_pos(&self, name: &str) -> Result<usize, usize> {
        self.state
            .users
            .binary_search_by(|u| u.name[..].cmp(name.as_bytes()))
    }

    fn role_pos(&self, name: &str) -> Result<usize, usize> {
        self.state
            .roles
            .binary_search_by(|r| r.name[..].cmp(name.as_bytes()))
    }

    pub fn user(&self, name: &str) -> Option<&User> {
        self.user_pos(name).ok().map(|i| &self.state.users[i])
    }

    pub fn role(&self, name: &str) -> Option<&Role> {
        self.role_pos(name).ok().map(|i| &self.state.roles[i])
    }

    pub fn user_names(&self) -> Vec<String> {
        self.state.users.iter().map(|u| name_of(&u.name)).collect()
    }

    pub fn role_names(&self) -> Vec<String> {
        self.state.roles.iter().map(|r| name_of(&r.name)).collect()
    }

    /// A role's permissions as RoleGet answers them: the root role's is
    /// everything.
    pub fn role_perms(&self, name: &str) -> Result<Vec<Permission>, ApiError> {
        let role = self.role(name).ok_or(ApiError::RoleNotFound)?;
        if name == ROOT {
            return Ok(vec![Permission {
                perm_type: PermType::Readwrite as i32,
                key: Vec::new().into(),
                range_end: vec![0].into(),
            }]);
        }
        Ok(role.key_permission.clone())
    }

    /// Applies one change at shard 0's log `index`. A change that alters the
    /// state bumps the auth revision, as etcd's does; an error leaves the
    /// state as it was.
    pub fn apply(&mut self, index: u64, change: &Change) -> Result<(), ApiError> {
        let changed = self.change(change)?;
        self.state.applied_index = index;
        if changed {
            self.state.revision += 1;
            self.rebuild();
        }
        Ok(())
    }

    /// Makes the change; says whether anything changed.
    fn change(&mut self, change: &Change) -> Result<bool, ApiError> {
        let enabled = self.state.enabled;
        match change {
            Change::Enable(_) => {
                if enabled {
                    return Ok(false);
                }
                let root = self.user(ROOT).ok_or(ApiError::RootUserNotExist)?;
                if !has_root_role(root) {
                    return Err(ApiError::RootRoleNotExist);
                }
                self.state.enabled = true;
            }
            Change::Disable(_) => {
                if !enabled {
                    return Ok(false);
                }
                self.state.enabled = false;
            }
            Change::Token(_) => return Ok(false),
            Change::UserAdd(r) => {
                if r.name.is_empty() {
                    return Err(ApiError::UserEmpty);
                }
                let at = match self.user_pos(&r.name) {
                    Ok(_) => return Err(ApiError::UserAlreadyExist),
                    Err(at) => at,
                };
                let options = r.options.unwrap_or_default();
                let password = if options.no_password {
                    Vec::new()
                } else {
                    r.hashed_password.clone().into_bytes()
                };
                self.state.users.insert(
                    at,
                    User {
                        name: r.name.clone().into_bytes().into(),
                        password: password.into(),
                        roles: Vec::new(),
                        options: Some(options),
                    },
                );
            }
            Change::UserDelete(r) => {
                if enabled && r.name == ROOT {
                    return Err(ApiError::InvalidAuthMgmt);
                }
                let at = self.user_pos(&r.name).map_err(|_| ApiError::UserNotFound)?;
                self.state.users.remove(at);
            }
            Change::UserChangePassword(r) => {
                let at = self.user_pos(&r.name).map_err(|_| ApiError::UserNotFound)?;
                let user = &mut self.state.users[at];
                if !user.options.unwrap_or_default().no_password {
                    user.password = r.hashed_password.clone().into_bytes().into();
                }
            }
            Change::UserGrantRole(r) => {
                let at = self.user_pos(&r.user).map_err(|_| ApiError::UserNotFound)?;
                if r.role != ROOT && self.role(&r.role).is_none() {
                    return Err(ApiError::RoleNotFound);
                }
                let roles = &mut self.state.users[at].roles;
                match roles.binary_search(&r.role) {
                    Ok(_) => return Ok(false),
                    Err(i) => roles.insert(i, r.role.clone()),
                }
            }
            Change::UserRevokeRole(r) => {
                if enabled && r.name == ROOT && r.role == ROOT {
                    return Err(ApiError::InvalidAuthMgmt);
                }
                let at = self.user_pos(&r.name).map_err(|_| ApiError::UserNotFound)?;
                let roles = &mut self.state.users[at].roles;
                let before = roles.len();
                roles.retain(|role| role != &r.role);
                if roles.len() == before {
                    return Err(ApiError::RoleNotGranted);
                }
            }
            Change::RoleAdd(r) => {
                if r.name.is_empty() {
                    return Err(ApiError::RoleEmpty);
                }
                let at = match self.role_pos(&r.name) {
                    Ok(_) => return Err(ApiError::RoleAlreadyExist),
                    Err(at) => at,
                };
                self.state.roles.insert(
                    at,
                    Role {
                        name: r.name.clone().into_bytes().into(),
                        key_permission: Vec::new(),
                    },
                );
            }
            Change::RoleDelete(r) => {
                if enabled && r.role == ROOT {
                    return Err(ApiError::InvalidAuthMgmt);
                }
                let at = self.role_pos(&r.role).map_err(|_| ApiError::RoleNotFound)?;
                self.state.roles.remove(at);
                for user in &mut self.state.users {
                    user.roles.retain(|role| role != &r.role);
                }
            }
            Change::RoleGrantPermission(r) => {
                let perm = r.perm.as_ref().ok_or(ApiError::PermissionNotGiven)?;
                if !valid_permission_range(&perm.key, &perm.range_end) {
                    return Err(ApiError::InvalidAuthMgmt);
                }
                let at = self.role_pos(&r.name).map_err(|_| ApiError::RoleNotFound)?;
                let perms = &mut self.state.roles[at].key_permission;
                match perms
                    .iter_mut()
                    .find(|p| p.key == perm.key && p.range_end == perm.range_end)
                {
                    Some(p) => p.perm_type = perm.perm_type,
                    None => {
                        let i = perms.partition_point(|p| p.key <= perm.key);
                        perms.insert(i, perm.clone());
                    }
                }
            }
            Change::RoleRevokePermission(r) => {
                let at = self.role_pos(&r.role).map_err(|_| ApiError::RoleNotFound)?;
                let perms = &mut self.state.roles[at].key_permission;
                let before = perms.len();
                perms.retain(|p| !(p.key == r.key && p.range_end == r.range_end));
                if perms.len() == before {
                    return Err(ApiError::PermissionNotGranted);
                }
            }
        }
        Ok(true)
    }

    fn rebuild(&mut self) {
        let mut perms = HashMap::with_capacity(self.state.users.len());
        for user in &self.state.users {
            let root = has_root_role(user);
            let granted = user
                .roles
                .iter()
                .filter_map(|name| self.role(name))
                .flat_map(|role| role.key_permission.iter());
            perms.insert(name_of(&user.name), UserPerms::merge(root, granted));
        }
        self.perms = perms;
    }
}

pub fn has_root_role(user: &User) -> bool {
    user.roles.iter().any(|r| r == ROOT)
}

fn name_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// etcd's rule for a permission's range: a key, and an end that is empty (one
/// key), `\0` (every key from `key` on) or after `key`.
fn valid_permission_range(key: &[u8], range_end: &[u8]) -> bool {
    if key.is_empty() {
        return false;
    }
    range_end.is_empty() || range_end == [0] || key < range_end
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::authpb::UserAddOptions;
    use cairn_proto::etcdserverpb as pb;

    fn user_add(name: &str) -> Change {
        Change::UserAdd(pb::AuthUserAddRequest {
            name: name.into(),
            hashed_password: "$2b$04$hash".into(),
            ..Default::default()
        })
    }

    fn grant(user: &str, role: &str) -> Change {
        Change::UserGrantRole(pb::AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        })
    }

    #[test]
    fn enable_needs_a_root_user_with_the_root_role() {
        let mut d = AuthData::default();
        let enable = Change::Enable(pb::AuthEnableRequest {});
        assert_eq!(d.apply(1, &enable), Err(ApiError::RootUserNotExist));
        d.apply(2, &user_add(ROOT)).unwrap();
        assert_eq!(d.apply(3, &enable), Err(ApiError::RootRoleNotExist));
        d.apply(4, &grant(ROOT, ROOT)).unwrap();
        d.apply(5, &enable).unwrap();
        assert!(d.enabled());
        assert_eq!(d.revision(), 3, "user add, grant, enable");
        assert_eq!(d.applied_index(), 5);
        // Root can neither be deleted nor lose the root role while enabled.
        let del = Change::UserDelete(pb::AuthUserDeleteRequest { name: ROOT.into() });
        assert_eq!(d.apply(6, &del), Err(ApiError::InvalidAuthMgmt));
        let revoke = Change::UserRevokeRole(pb::AuthUserRevokeRoleRequest {
            name: ROOT.into(),
            role: ROOT.into(),
        });
        assert_eq!(d.apply(7, &revoke), Err(ApiError::InvalidAuthMgmt));
    }

    #[test]
    fn users_roles_and_permissions_follow_etcds_rules() {
        let mut d = AuthData::default();
        d.apply(1, &user_add("bob")).unwrap();
        assert_eq!(
            d.apply(2, &user_add("bob")),
            Err(ApiError::UserAlreadyExist)
        );
        assert_eq!(d.apply(2, &user_add("")), Err(ApiError::UserEmpty));
        assert_eq!(d.apply(2, &grant("bob", "r")), Err(ApiError::RoleNotFound));
        assert_eq!(d.apply(2, &grant("eve", "r")), Err(ApiError::UserNotFound));
        let role_add = Change::RoleAdd(pb::AuthRoleAddRequest { name: "r".into() });
        d.apply(2, &role_add).unwrap();
        assert_eq!(d.apply(3, &role_add), Err(ApiError::RoleAlreadyExist));
        d.apply(3, &grant("bob", "r")).unwrap();
        let rev = d.revision();
        d.apply(4, &grant("bob", "r")).unwrap();
        assert_eq!(d.revision(), rev, "granting a held role changes nothing");
        let perm = |key: &str, end: &str, t: PermType| {
            Change::RoleGrantPermission(pb::AuthRoleGrantPermissionRequest {
                name: "r".into(),
                perm: Some(Permission {
                    perm_type: t as i32,
                    key: key.as_bytes().to_vec().into(),
                    range_end: end.as_bytes().to_vec().into(),
                }),
            })
        };
        d.apply(5, &perm("b", "d", PermType::Read)).unwrap();
        d.apply(6, &perm("a", "", PermType::Write)).unwrap();
        d.apply(7, &perm("b", "d", PermType::Readwrite)).unwrap();
        let perms = d.role_perms("r").unwrap();
        assert_eq!(perms.len(), 2, "same key and end updates the type");
        assert_eq!(perms[0].key.as_ref(), b"a");
        assert_eq!(perms[1].perm_type, PermType::Readwrite as i32);
        assert_eq!(
            d.apply(8, &perm("d", "b", PermType::Read)),
            Err(ApiError::InvalidAuthMgmt)
        );
        let p = d.perms("bob").unwrap();
        assert!(p.permits(b"c", b"", PermType::Write));
        assert!(!p.permits(b"e", b"", PermType::Read));
        let revoke = Change::RoleRevokePermission(pb::AuthRoleRevokePermissionRequest {
            role: "r".into(),
            key: b"zz".to_vec().into(),
            range_end: Default::default(),
        });
        assert_eq!(d.apply(9, &revoke), Err(ApiError::PermissionNotGranted));
        d.apply(
            10,
            &Change::RoleDelete(pb::AuthRoleDeleteRequest { role: "r".into() }),
        )
        .unwrap();
        assert!(d.user("bob").unwrap().roles.is_empty());
        assert!(!d.perms("bob").unwrap().permits(b"c", b"", PermType::Read));
    }

    #[test]
    fn a_no_password_user_keeps_no_password() {
        let mut d = AuthData::default();
        d.apply(
            1,
            &Change::UserAdd(pb::AuthUserAddRequest {
                name: "svc".into(),
                hashed_password: "$2b$04$hash".into(),
                options: Some(UserAddOptions { no_password: true }),
                ..Default::default()
            }),
        )
        .unwrap();
        assert!(d.user("svc").unwrap().password.is_empty());
    }
}
