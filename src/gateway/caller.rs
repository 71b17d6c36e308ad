//! Who is calling a use case: the tenant that new sessions belong to, and whether it sees every
//! tenant's sessions. The API builds a [`Caller`] from the request's key (`api::auth`); the
//! service only asks it what it may see.

/// The tenant every session belongs to while the gateway is single-tenant (no API keys).
pub const DEFAULT_TENANT: &str = "default";

/// The tenant of sessions created with an admin key, and of sessions discovered in the agent's
/// own list when the gateway has keys.
pub const ADMIN_TENANT: &str = "admin";

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

    /// Whether `name` may name a tenant: 1-64 of `A-Z a-z 0-9 - _ .`.
    pub fn valid_tenant(name: &str) -> bool {
        (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
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
}
