//! The flags of sign-in with an OpenID Connect provider (`--oidc-*`): whose access tokens the
//! gateway takes beside its API keys, and which claims name the caller's tenant and make an
//! admin; flattened into [`super::Config`].

use clap::Args;

/// OpenID Connect access tokens.
#[derive(Debug, Clone, Args)]
pub struct OidcFlags {
    /// The provider whose JWT access tokens are accepted as `Authorization: Bearer` (its
    /// `iss`): its keys are found through `ISSUER/.well-known/openid-configuration`. Needs
    /// `--oidc-audience`.
    #[arg(long, env = "ACP_GATEWAY_OIDC_ISSUER", global = true)]
    pub oidc_issuer: Option<String>,

    /// The `aud` a token must be issued for (the gateway's resource or API identifier at the
    /// provider).
    #[arg(long, env = "ACP_GATEWAY_OIDC_AUDIENCE", global = true)]
    pub oidc_audience: Option<String>,

    /// The claim whose value is the caller's tenant (a dotted path reaches into objects:
    /// `org.id`). A token without it is refused (403) unless it makes an admin.
    #[arg(
        long,
        env = "ACP_GATEWAY_OIDC_TENANT_CLAIM",
        default_value = "tenant",
        global = true
    )]
    pub oidc_tenant_claim: String,

    /// The claim listing the caller's roles (an array, or a space-separated string; a dotted
    /// path reaches into objects: `realm_access.roles`).
    #[arg(
        long,
        env = "ACP_GATEWAY_OIDC_ROLES_CLAIM",
        default_value = "roles",
        global = true
    )]
    pub oidc_roles_claim: String,

    /// The role that makes a caller an admin (sees and manages every tenant's sessions). None:
    /// no token makes an admin.
    #[arg(long, env = "ACP_GATEWAY_OIDC_ADMIN_ROLE", global = true)]
    pub oidc_admin_role: Option<String>,

    /// The provider's client id of the web console (a public client: authorization code with
    /// PKCE, redirect URI this gateway's `/`): the console then offers to sign in with the
    /// provider. None: the console asks for an API key.
    #[arg(long, env = "ACP_GATEWAY_OIDC_CONSOLE_CLIENT_ID", global = true)]
    pub oidc_console_client_id: Option<String>,

    /// The scopes the console asks the provider for.
    #[arg(
        long,
        env = "ACP_GATEWAY_OIDC_CONSOLE_SCOPE",
        default_value = "openid",
        global = true
    )]
    pub oidc_console_scope: String,

    /// Seconds of clock difference with the provider allowed when checking `exp` and `nbf`.
    #[arg(
        long,
        env = "ACP_GATEWAY_OIDC_CLOCK_SKEW",
        default_value_t = 60,
        global = true
    )]
    pub oidc_clock_skew: u64,
}
