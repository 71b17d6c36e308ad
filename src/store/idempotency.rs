//! Idempotency keys: per tenant, a request's key, a digest of the request, the replica running it
//! and, once it has answered, its response ([`KeyRecord`]), so that a repeat on any replica, or
//! after a restart, gets that response again; and the secret with which replicas prove the
//! requests they forward to each other (carrying such keys among them). The SQL runs alike on both backends and is written once here,
//! with [`impl_idempotency!`], which writes a backend's
//! [`IdempotencyKeys`] impl.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::error::StoreResult;

/// When a key was taken and until when it is kept.
pub type KeyTerm = (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>);

/// A request taking a key: `tenant`'s `key`, with the digest of the request (`fingerprint`) and
/// the replica that runs it (`runner`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRequest<'a> {
    pub tenant: &'a str,
    pub key: &'a str,
    pub fingerprint: &'a str,
    pub runner: &'a str,
}

/// A response kept under its key: status, the headers a replay repeats, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// What a key holds: the digest of the request that took it, the replica running that request
/// (`""`: unknown) and, once it has answered, its response (`None`: still running).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub fingerprint: String,
    pub runner: String,
    pub response: Option<StoredResponse>,
}

/// The outcome of taking a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyClaim {
    /// The key was free (or its response expired): this request runs, and records its response.
    Taken,
    /// An earlier request holds it.
    Held(KeyRecord),
}

/// The idempotency keys of requests: which request holds each, on which replica, and the
/// response it answered.
#[async_trait]
pub trait IdempotencyKeys: Send + Sync + 'static {
    /// Takes the key of `request`, kept for the [`KeyTerm`] given, unless another request holds
    /// it: [`KeyClaim::Held`] with that request's fingerprint, runner and, once it has answered,
    /// its response. A key whose response expired is taken again; one still running never is
    /// (see [`IdempotencyKeys::hand_idempotency_key`]).
    async fn take_idempotency_key(
        &self,
        request: KeyRequest<'_>,
        term: KeyTerm,
    ) -> StoreResult<KeyClaim>;

    /// Hands a running `key` (no response yet) to runner `to`, from runner `from` (`None`: from
    /// whichever runs it), kept for `term` from now; `true` when it did.
    async fn hand_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
        from_to: (Option<&str>, &str),
        term: KeyTerm,
    ) -> StoreResult<bool>;

    /// Records the response of the request holding `key`, kept until `expires_at` (once: the
    /// first response stays).
    async fn finish_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
        response: &StoredResponse,
        expires_at: DateTime<Utc>,
    ) -> StoreResult<()>;

    /// Frees `key` while `runner` runs its request and it has no response (it failed in a way a
    /// repeat may not).
    async fn release_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
        runner: &str,
    ) -> StoreResult<()>;

    /// Deletes the keys whose response expired at `now`, and the expired ones still running on
    /// a replica that is neither `here` nor registered; returns how many.
    async fn prune_idempotency_keys(&self, now: DateTime<Utc>, here: &str) -> StoreResult<u64>;
}

/// Takes the key for runner `$6`: inserts it, or replaces it when its response expired (`$4`:
/// now); no row changed when another request holds it, or is still running however old.
pub const TAKE: &str = "INSERT INTO idempotency_keys (tenant, key, fingerprint, created_at, \
     expires_at, replica) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, key) DO UPDATE SET \
     fingerprint = excluded.fingerprint, status = NULL, headers = NULL, body = NULL, \
     created_at = excluded.created_at, expires_at = excluded.expires_at, \
     replica = excluded.replica \
     WHERE idempotency_keys.expires_at <= excluded.created_at \
     AND idempotency_keys.status IS NOT NULL";
pub const READ: &str = "SELECT fingerprint, replica, status, headers, body FROM idempotency_keys \
     WHERE tenant = $1 AND key = $2";
/// Keeps a response, until `$6` (its time to live counts from the answer).
pub const FINISH: &str = "UPDATE idempotency_keys SET status = $3, headers = $4, body = $5, \
     expires_at = $6 WHERE tenant = $1 AND key = $2 AND status IS NULL";
/// Hands a running key to runner `$3` (from runner `$6`, when bound), for `$4`..`$5` again.
pub const HAND: &str = "UPDATE idempotency_keys SET replica = $3, created_at = $4, \
     expires_at = $5 WHERE tenant = $1 AND key = $2 AND status IS NULL AND replica = $6";
pub const ADOPT: &str = "UPDATE idempotency_keys SET replica = $3, created_at = $4, \
     expires_at = $5 WHERE tenant = $1 AND key = $2 AND status IS NULL";
pub const RELEASE: &str = "DELETE FROM idempotency_keys WHERE tenant = $1 AND key = $2 \
     AND status IS NULL AND replica = $3";
/// Expired answers, and expired keys still running on a replica neither `$2` (this one) nor in
/// the registry (gone for good: forgotten, or, on SQLite, an earlier gateway on the file).
pub const PRUNE: &str = "DELETE FROM idempotency_keys WHERE expires_at <= $1 AND \
     (status IS NOT NULL OR (replica <> $2 AND replica NOT IN (SELECT id FROM replicas)))";
/// The cluster's secret: the one stored, written now (`$1`) if there was none.
pub const PUT_SECRET: &str =
    "INSERT INTO cluster_secret (id, secret) VALUES (1, $1) ON CONFLICT (id) DO NOTHING";
pub const SECRET: &str = "SELECT secret FROM cluster_secret WHERE id = 1";

/// Reads a [`KeyRecord`] from a row of [`READ`].
pub(crate) fn record_from(row: &impl super::rows::Columns) -> super::error::StoreResult<KeyRecord> {
    let status: Option<i32> = row.get("status")?;
    let response = match status {
        None => None,
        Some(status) => {
            let headers: Option<String> = row.get("headers")?;
            let headers = match headers {
                Some(h) => serde_json::from_str(&h).map_err(|e| {
                    super::error::StoreError::Corrupt(format!("an idempotency key's headers: {e}"))
                })?,
                None => Vec::new(),
            };
            let body: Option<Vec<u8>> = row.get("body")?;
            Some(StoredResponse {
                status: u16::try_from(status).unwrap_or(500),
                headers,
                body: body.unwrap_or_default(),
            })
        }
    };
    Ok(KeyRecord {
        fingerprint: row.get("fingerprint")?,
        runner: row.get("replica")?,
        response,
    })
}

/// `impl_idempotency!(Backend { reads, writes, time })` implements
/// [`IdempotencyKeys`] for `Backend`, from the
/// parameters of the same names of [`impl_store!`](crate::store::common), which invokes it (and
/// which stores the cluster secret with [`PUT_SECRET`] and [`SECRET`]).
macro_rules! impl_idempotency {
    ($backend:ty { reads: $reads:ident, writes: $writes:ident, time: $time:path $(,)? }) => {
        #[async_trait::async_trait]
        impl $crate::store::idempotency::IdempotencyKeys for $backend {
            async fn take_idempotency_key(
                &self,
                request: $crate::store::idempotency::KeyRequest<'_>,
                (now, expires_at): $crate::store::idempotency::KeyTerm,
            ) -> $crate::store::error::StoreResult<$crate::store::idempotency::KeyClaim> {
                use $crate::store::idempotency as sql;
                let $crate::store::idempotency::KeyRequest {
                    tenant,
                    key,
                    fingerprint,
                    runner,
                } = request;
                // A request released between the insert and the read leaves no row: take again.
                for _ in 0..3 {
                    let taken = sqlx::query(sql::TAKE)
                        .bind(tenant)
                        .bind(key)
                        .bind(fingerprint)
                        .bind($time(now))
                        .bind($time(expires_at))
                        .bind(runner)
                        .execute(&self.$writes)
                        .await?;
                    if taken.rows_affected() == 1 {
                        return Ok($crate::store::idempotency::KeyClaim::Taken);
                    }
                    let row = sqlx::query(sql::READ)
                        .bind(tenant)
                        .bind(key)
                        .fetch_optional(&self.$writes)
                        .await?;
                    if let Some(row) = row {
                        return Ok($crate::store::idempotency::KeyClaim::Held(
                            sql::record_from(&row)?,
                        ));
                    }
                }
                // Taken and released again and again: as good as still running.
                Ok($crate::store::idempotency::KeyClaim::Held(
                    $crate::store::idempotency::KeyRecord {
                        fingerprint: fingerprint.to_owned(),
                        runner: runner.to_owned(),
                        response: None,
                    },
                ))
            }

            async fn finish_idempotency_key(
                &self,
                tenant: &str,
                key: &str,
                response: &$crate::store::idempotency::StoredResponse,
                expires_at: chrono::DateTime<chrono::Utc>,
            ) -> $crate::store::error::StoreResult<()> {
                let headers =
                    serde_json::to_string(&response.headers).expect("pairs of strings serialise");
                sqlx::query($crate::store::idempotency::FINISH)
                    .bind(tenant)
                    .bind(key)
                    .bind(i32::from(response.status))
                    .bind(headers)
                    .bind(&response.body)
                    .bind($time(expires_at))
                    .execute(&self.$writes)
                    .await?;
                Ok(())
            }

            async fn hand_idempotency_key(
                &self,
                tenant: &str,
                key: &str,
                (from, to): (Option<&str>, &str),
                (now, expires_at): $crate::store::idempotency::KeyTerm,
            ) -> $crate::store::error::StoreResult<bool> {
                use $crate::store::idempotency as sql;
                let query = sqlx::query(if from.is_some() {
                    sql::HAND
                } else {
                    sql::ADOPT
                })
                .bind(tenant)
                .bind(key)
                .bind(to)
                .bind($time(now))
                .bind($time(expires_at));
                let query = match from {
                    Some(from) => query.bind(from),
                    None => query,
                };
                Ok(query.execute(&self.$writes).await?.rows_affected() == 1)
            }

            async fn release_idempotency_key(
                &self,
                tenant: &str,
                key: &str,
                runner: &str,
            ) -> $crate::store::error::StoreResult<()> {
                sqlx::query($crate::store::idempotency::RELEASE)
                    .bind(tenant)
                    .bind(key)
                    .bind(runner)
                    .execute(&self.$writes)
                    .await?;
                Ok(())
            }

            async fn prune_idempotency_keys(
                &self,
                now: chrono::DateTime<chrono::Utc>,
                here: &str,
            ) -> $crate::store::error::StoreResult<u64> {
                let pruned = sqlx::query($crate::store::idempotency::PRUNE)
                    .bind($time(now))
                    .bind(here)
                    .execute(&self.$writes)
                    .await?;
                Ok(pruned.rows_affected())
            }
        }
    };
}
