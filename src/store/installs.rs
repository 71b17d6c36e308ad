//! The agents installed from an ACP registry: a row per agent, by the name its sessions use,
//! with what was chosen of its registry entry (JSON text another replica installs the same
//! from), the sha256 of its archive as first downloaded, and how an admin last signed it in
//! or out. Every replica runs the agents of
//! these rows. The SQL both backends run alike, and [`impl_installs!`] that implements
//! [`InstalledAgents`] for each.

use async_trait::async_trait;

use super::error::StoreResult;

/// One installed agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallRecord {
    /// What sessions name it by.
    pub name: String,
    /// Its registry entry's id.
    pub registry_id: String,
    /// `binary`, `npx` or `uvx`.
    pub kind: String,
    pub version: String,
    /// What was chosen of the registry entry, as JSON text.
    pub choice: String,
    /// The sha256 of a binary archive as first downloaded.
    pub sha256: Option<String>,
    /// Unix microseconds.
    pub installed_at: i64,
    /// The replica that installed it.
    pub installed_by: String,
    /// The auth method an admin signed it in with, which every member authenticates with.
    pub auth_method: Option<String>,
    /// An admin logged it out: no member authenticates (`auth_method` is then `None`).
    pub logged_out: bool,
}

/// The installed agents.
#[async_trait]
pub trait InstalledAgents: Send + Sync + 'static {
    /// Records an installed agent; `false` (nothing changed) when one of that name is.
    async fn add_install(&self, record: &InstallRecord) -> StoreResult<bool>;

    /// Replaces the row of `record.name` (another version); `false` when there is none.
    async fn replace_install(&self, record: &InstallRecord) -> StoreResult<bool>;

    /// Every installed agent, by name.
    async fn installs(&self) -> StoreResult<Vec<InstallRecord>>;

    /// Records that `name` was signed in with `method`, or logged out (`None`); `false` when
    /// there is no row of `name`.
    async fn set_install_auth(&self, name: &str, method: Option<&str>) -> StoreResult<bool>;

    /// Removes the row of `name`; `false` when there was none.
    async fn remove_install(&self, name: &str) -> StoreResult<bool>;
}

pub const ADD: &str = "INSERT INTO installed_agents \
     (name, registry_id, kind, version, choice, sha256, installed_at, installed_by, auth_method, \
     logged_out) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (name) DO NOTHING";
pub const REPLACE: &str = "UPDATE installed_agents SET registry_id = $2, kind = $3, version = $4, \
     choice = $5, sha256 = $6, installed_at = $7, installed_by = $8, auth_method = $9, \
     logged_out = $10 WHERE name = $1";
pub const ALL: &str = "SELECT name, registry_id, kind, version, choice, sha256, installed_at, \
     installed_by, auth_method, logged_out FROM installed_agents ORDER BY name";
pub const SET_AUTH: &str =
    "UPDATE installed_agents SET auth_method = $2, logged_out = $3 WHERE name = $1";
pub const REMOVE: &str = "DELETE FROM installed_agents WHERE name = $1";

/// `impl_installs!(Backend { reads, writes })` implements [`InstalledAgents`] for `Backend`,
/// from the parameters of the same names of [`impl_store!`](crate::store::common).
macro_rules! impl_installs {
    ($backend:ty { reads: $reads:ident, writes: $writes:ident $(,)? }) => {
        #[async_trait::async_trait]
        impl $crate::store::installs::InstalledAgents for $backend {
            async fn add_install(
                &self,
                r: &$crate::store::installs::InstallRecord,
            ) -> $crate::store::error::StoreResult<bool> {
                let done =
                    $crate::store::installs::bind(sqlx::query($crate::store::installs::ADD), r)
                        .execute(&self.$writes)
                        .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn replace_install(
                &self,
                r: &$crate::store::installs::InstallRecord,
            ) -> $crate::store::error::StoreResult<bool> {
                let done =
                    $crate::store::installs::bind(sqlx::query($crate::store::installs::REPLACE), r)
                        .execute(&self.$writes)
                        .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn installs(
                &self,
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::installs::InstallRecord>>
            {
                use sqlx::Row as _;
                let rows = sqlx::query($crate::store::installs::ALL)
                    .fetch_all(&self.$reads)
                    .await?;
                rows.iter()
                    .map(|r| {
                        Ok($crate::store::installs::InstallRecord {
                            name: r.try_get("name")?,
                            registry_id: r.try_get("registry_id")?,
                            kind: r.try_get("kind")?,
                            version: r.try_get("version")?,
                            choice: r.try_get("choice")?,
                            sha256: r.try_get("sha256")?,
                            installed_at: r.try_get("installed_at")?,
                            installed_by: r.try_get("installed_by")?,
                            auth_method: r.try_get("auth_method")?,
                            logged_out: r.try_get("logged_out")?,
                        })
                    })
                    .collect()
            }

            async fn set_install_auth(
                &self,
                name: &str,
                method: Option<&str>,
            ) -> $crate::store::error::StoreResult<bool> {
                let done = sqlx::query($crate::store::installs::SET_AUTH)
                    .bind(name)
                    .bind(method)
                    .bind(method.is_none())
                    .execute(&self.$writes)
                    .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn remove_install(&self, name: &str) -> $crate::store::error::StoreResult<bool> {
                let done = sqlx::query($crate::store::installs::REMOVE)
                    .bind(name)
                    .execute(&self.$writes)
                    .await?;
                Ok(done.rows_affected() == 1)
            }
        }
    };
}

/// `record`'s columns bound in the order of [`ADD`] and [`REPLACE`].
pub fn bind<'q, DB: sqlx::Database>(
    query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    r: &'q InstallRecord,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>
where
    String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<String>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    bool: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    query
        .bind(&r.name)
        .bind(&r.registry_id)
        .bind(&r.kind)
        .bind(&r.version)
        .bind(&r.choice)
        .bind(&r.sha256)
        .bind(r.installed_at)
        .bind(&r.installed_by)
        .bind(&r.auth_method)
        .bind(r.logged_out)
}
