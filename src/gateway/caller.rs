//! Who is calling a use case: the tenant that new sessions belong to, whether it sees every
//! tenant's sessions, and the person calling when the key or token names one. The API builds a
//! [`Caller`] from the request's key (`api::auth`) or token (`api::oidc`); the service asks it
//! what it may see and records it as the [`Author`] of what it does.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::store::SessionRecord;

/// The tenant every session belongs to while the gateway is single-tenant (no API keys).
pub const DEFAULT_TENANT: &str = "default";

/// The tenant of sessions created with an admin key, and of sessions discovered in the agent's
/// own list when the gateway has keys.
pub const ADMIN_TENANT: &str = "admin";

/// The tenant names the gateway uses for itself, which no key, keys-file line or token may
/// name: a tenant called `admin` would see the admin's sessions and those found in the agent's
/// own list, replay the admin's idempotent responses and change its all-tenant webhooks.
pub const RESERVED_TENANTS: [&str; 2] = [ADMIN_TENANT, DEFAULT_TENANT];

/// Who is calling: the tenant new sessions belong to, whether it sees every tenant, and the
/// person, when the key or token names one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    pub tenant: String,
    pub admin: bool,
    pub user: Option<User>,
}

/// A person of a tenant: a key's `USER` (`TENANT/USER:KEY`) or a token's `sub`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    pub id: String,
    /// How to show them: a token's `name`, else its `email`.
    pub name: Option<String>,
}

/// Who did something in a session: a prompt's author, who answered a request, a session's
/// owner. `user` is absent when the key names no user (the tenant acted as a whole).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Author {
    pub tenant: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The user's display name, when the token gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Caller {
    /// The only caller of a gateway without keys.
    pub fn single_tenant() -> Self {
        Caller::of_tenant(DEFAULT_TENANT, true)
    }

    /// A caller of `tenant` naming no user.
    pub fn of_tenant(tenant: &str, admin: bool) -> Self {
        Caller {
            tenant: tenant.to_owned(),
            admin,
            user: None,
        }
    }

    /// The caller as the author of what it does.
    pub fn author(&self) -> Author {
        Author {
            tenant: self.tenant.clone(),
            user: self.user.as_ref().map(|u| u.id.clone()),
            name: self.user.as_ref().and_then(|u| u.name.clone()),
        }
    }

    /// Whether this caller is `author` (same tenant and user; a caller naming no user is only
    /// an author naming none).
    pub fn is(&self, author: &Author) -> bool {
        self.tenant == author.tenant && self.user.as_ref().map(|u| &u.id) == author.user.as_ref()
    }

    /// Whether `name` may name a user: 1-128 printable characters without `:` or whitespace.
    pub fn valid_user(name: &str) -> bool {
        (1..=128).contains(&name.len()) && name.chars().all(|c| c.is_ascii_graphic() && c != ':')
    }

    /// Whether `name` may name a tenant: 1-64 of `A-Z a-z 0-9 - _ .`, and not one of the
    /// [`RESERVED_TENANTS`] (compared without case, as a tenant named `Admin` is no clearer).
    pub fn valid_tenant(name: &str) -> bool {
        Self::tenant_refused(name).is_none()
    }

    /// Why `name` may not name a tenant, for the message that refuses it.
    pub fn tenant_refused(name: &str) -> Option<String> {
        let chars = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !chars {
            return Some(format!(
                "{name:?} is not a tenant name: 1-64 of A-Z a-z 0-9 - _ ."
            ));
        }
        RESERVED_TENANTS
            .iter()
            .any(|r| r.eq_ignore_ascii_case(name))
            .then(|| {
                format!(
                    "{name:?} is reserved: the gateway's own tenants ({}) cannot be given to a key or a token",
                    RESERVED_TENANTS.join(", ")
                )
            })
    }

    /// Whether sessions of `tenant` exist for this caller.
    pub fn sees(&self, tenant: &str) -> bool {
        self.admin || self.tenant == tenant
    }

    /// The tenant filter for lists: `None` = every tenant.
    pub fn scope(&self) -> Option<&str> {
        (!self.admin).then_some(self.tenant.as_str())
    }
}

/// Who owns the session of `record`: the user who created it, or its tenant as a whole when
/// the key that did named no user.
pub fn owner_of(record: &SessionRecord) -> Author {
    Author {
        tenant: record.tenant.clone(),
        user: record.people.owner.clone(),
        name: record.people.owner_name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_sees_its_own_sessions_and_the_admin_all() {
        let alice = Caller::of_tenant("alice", false);
        assert!(alice.sees("alice") && !alice.sees("bob"));
        assert_eq!(alice.scope(), Some("alice"));
        assert!(Caller::single_tenant().sees("bob"));
        assert_eq!(Caller::single_tenant().scope(), None);
    }

    #[test]
    fn the_gateways_own_tenants_are_no_ones_name() {
        assert!(Caller::valid_tenant("alice.dev-1_x"));
        for name in ["admin", "ADMIN", "default", "Default", "", "a b", "a:b"] {
            assert!(!Caller::valid_tenant(name), "{name:?}");
        }
        assert!(
            Caller::tenant_refused("admin")
                .unwrap()
                .contains("reserved")
        );
    }
}
