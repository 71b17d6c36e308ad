//! Who is calling a use case: the tenant that new sessions belong to, and whether it sees every
//! tenant's sessions. The API builds a [`Caller`] from the request's key (`api::auth`); the
//! service only asks it what it may see.

/// The tenant every session belongs to while the gateway is single-tenant (no API keys).
pub const DEFAULT_TENANT: &str = "default";

/// The tenant of sessions created with an admin key, and of sessions discovered in the agent's
/// own list when the gateway has keys.
pub const ADMIN_TENANT: &str = "admin";

/// The tenant names the gateway uses for itself, which no key, keys-file line or token may
/// name: a tenant called `admin` would see the admin's sessions and those found in the agent's
/// own list, replay the admin's idempotent responses and change its all-tenant webhooks.
pub const RESERVED_TENANTS: [&str; 2] = [ADMIN_TENANT, DEFAULT_TENANT];

/// Who is calling: the tenant new sessions belong to, and whether it sees every tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    pub tenant: String,
    pub admin: bool,
}

impl Caller {
    /// The only caller of a gateway without keys.
    pub fn single_tenant() -> Self {
        Caller {
            tenant: DEFAULT_TENANT.into(),
            admin: true,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_sees_its_own_sessions_and_the_admin_all() {
        let alice = Caller {
            tenant: "alice".into(),
            admin: false,
        };
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
