//! Read-only links to sessions (`POST /sessions/{id}/shares`): a row per link, found by the
//! SHA-256 of its token (the token itself is never stored), listed by session, revoked in
//! place. The SQL both backends run alike, and [`impl_shares!`] that implements
//! [`SessionShares`] for each.

use async_trait::async_trait;

use super::error::StoreResult;

/// One link. Times are unix microseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareRecord {
    /// What the session's owners name it by (to list and revoke it).
    pub id: String,
    /// The hex SHA-256 of its token.
    pub token_hash: String,
    pub session_id: String,
    pub tenant: String,
    /// Whether it follows the session's stream, or only reads its transcript.
    pub live: bool,
    pub created_at: i64,
    pub expires_at: i64,
    pub revoked_at: Option<i64>,
    /// The user who made it, when the key named one.
    pub created_by: Option<String>,
}

/// The links.
#[async_trait]
pub trait SessionShares: Send + Sync + 'static {
    async fn add_share(&self, share: &ShareRecord) -> StoreResult<()>;

    /// The links of `session_id`, newest first.
    async fn shares_of(&self, session_id: &str) -> StoreResult<Vec<ShareRecord>>;

    /// The link whose token hashes to `token_hash`, revoked or expired ones too.
    async fn share_by_hash(&self, token_hash: &str) -> StoreResult<Option<ShareRecord>>;

    /// Revokes link `id` of `session_id` at `at`; `false` when there is no such link (a revoked
    /// one stays revoked when it was).
    async fn revoke_share(&self, session_id: &str, id: &str, at: i64) -> StoreResult<bool>;
}

pub const ADD: &str = "INSERT INTO session_shares (id, token_hash, session_id, tenant, live, \
     created_at, expires_at, revoked_at, created_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
pub const OF_SESSION: &str = "SELECT id, token_hash, session_id, tenant, live, created_at, \
     expires_at, revoked_at, created_by FROM session_shares WHERE session_id = $1 \
     ORDER BY created_at DESC, id";
pub const BY_HASH: &str = "SELECT id, token_hash, session_id, tenant, live, created_at, \
     expires_at, revoked_at, created_by FROM session_shares WHERE token_hash = $1";
pub const REVOKE: &str = "UPDATE session_shares SET revoked_at = COALESCE(revoked_at, $3) \
     WHERE session_id = $1 AND id = $2";

/// A row of [`OF_SESSION`] or [`BY_HASH`], on either backend.
macro_rules! share_from {
    ($r:expr) => {{
        use sqlx::Row as _;
        let r = $r;
        Ok::<_, $crate::store::error::StoreError>($crate::store::shares::ShareRecord {
            id: r.try_get("id")?,
            token_hash: r.try_get("token_hash")?,
            session_id: r.try_get("session_id")?,
            tenant: r.try_get("tenant")?,
            live: r.try_get("live")?,
            created_at: r.try_get("created_at")?,
            expires_at: r.try_get("expires_at")?,
            revoked_at: r.try_get("revoked_at")?,
            created_by: r.try_get("created_by")?,
        })
    }};
}

/// `impl_shares!(Backend { reads, writes })` implements [`SessionShares`] for `Backend`, from
/// the parameters of the same names of [`impl_store!`](crate::store::common).
macro_rules! impl_shares {
    ($backend:ty { reads: $reads:ident, writes: $writes:ident $(,)? }) => {
        #[async_trait::async_trait]
        impl $crate::store::shares::SessionShares for $backend {
            async fn add_share(
                &self,
                s: &$crate::store::shares::ShareRecord,
            ) -> $crate::store::error::StoreResult<()> {
                sqlx::query($crate::store::shares::ADD)
                    .bind(&s.id)
                    .bind(&s.token_hash)
                    .bind(&s.session_id)
                    .bind(&s.tenant)
                    .bind(s.live)
                    .bind(s.created_at)
                    .bind(s.expires_at)
                    .bind(s.revoked_at)
                    .bind(&s.created_by)
                    .execute(&self.$writes)
                    .await?;
                Ok(())
            }

            async fn shares_of(
                &self,
                session_id: &str,
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::shares::ShareRecord>> {
                let rows = sqlx::query($crate::store::shares::OF_SESSION)
                    .bind(session_id)
                    .fetch_all(&self.$reads)
                    .await?;
                rows.iter().map(|r| share_from!(r)).collect()
            }

            async fn share_by_hash(
                &self,
                token_hash: &str,
            ) -> $crate::store::error::StoreResult<Option<$crate::store::shares::ShareRecord>> {
                let row = sqlx::query($crate::store::shares::BY_HASH)
                    .bind(token_hash)
                    .fetch_optional(&self.$reads)
                    .await?;
                row.as_ref().map(|r| share_from!(r)).transpose()
            }

            async fn revoke_share(
                &self,
                session_id: &str,
                id: &str,
                at: i64,
            ) -> $crate::store::error::StoreResult<bool> {
                let done = sqlx::query($crate::store::shares::REVOKE)
                    .bind(session_id)
                    .bind(id)
                    .bind(at)
                    .execute(&self.$writes)
                    .await?;
                Ok(done.rows_affected() == 1)
            }
        }
    };
}
