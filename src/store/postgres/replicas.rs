//! What crosses replicas: the [`ReplicaRegistry`] (heartbeats and session ownership, as
//! leases on them), and the stream of the other replicas' appends, from the notifications
//! every append sends.

use std::time::Duration;

use async_trait::async_trait;
use chrono::SubsecRound;
use futures::stream::BoxStream;
use sqlx::postgres::{PgListener, PgNotification};

use super::store::PgStore;
use crate::store::common::release_session;
use crate::store::contract::Appended;
use crate::store::error::StoreResult;
use crate::store::replicas::{Claimed, Heartbeat, Replica, ReplicaRegistry};
use crate::store::rows::Columns;

/// Where appends to session logs are announced (see the append in `events.rs`).
pub(super) const EVENTS_CHANNEL: &str = "acp_gateway_events";
/// Where appends to the lifecycle log are announced: "REPLICA SEQ".
pub(super) const LIFECYCLE_CHANNEL: &str = "acp_gateway_lifecycle";

/// A duration in whole microseconds, for `$n * interval '1 microsecond'`.
fn micros_of(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// An append announced by another replica; `None` for this replica's own, and for anything
/// malformed.
fn parse_notification(me: &str, n: &PgNotification) -> Option<Appended> {
    let mut parts = n.payload().splitn(3, ' ');
    let (replica, seq) = (parts.next()?, parts.next()?.parse().ok()?);
    if replica == me {
        return None;
    }
    match (n.channel(), parts.next()) {
        (EVENTS_CHANNEL, Some(session_id)) => Some(Appended::Session {
            session_id: session_id.to_owned(),
            seq,
        }),
        (LIFECYCLE_CHANNEL, None) => Some(Appended::Lifecycle { seq }),
        _ => None,
    }
}

impl PgStore {
    pub(super) async fn appended_elsewhere(
        &self,
    ) -> StoreResult<Option<BoxStream<'static, Appended>>> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener
            .listen_all([EVENTS_CHANNEL, LIFECYCLE_CHANNEL])
            .await?;
        let me = self.replica.clone();
        let stream = futures::stream::unfold((listener, me), |(mut listener, me)| {
            async move {
                loop {
                    // `Ok(None)`: the connection was lost (the listener reconnects on the next
                    // call); an error: reconnecting failed, so pause before trying again.
                    let notification = match listener.try_recv().await {
                        Ok(Some(n)) => n,
                        Ok(None) => return Some((Appended::Lost, (listener, me))),
                        Err(e) => {
                            tracing::warn!(error = %e, "listening for other replicas' appends failed; retrying");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            return Some((Appended::Lost, (listener, me)));
                        }
                    };
                    if let Some(appended) = parse_notification(&me, &notification) {
                        return Some((appended, (listener, me)));
                    }
                }
            }
        });
        Ok(Some(Box::pin(stream)))
    }
}

#[async_trait]
impl ReplicaRegistry for PgStore {
    async fn heartbeat_replica(&self, beat: &Heartbeat, forget_after: Duration) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO replicas (id, address, started_at, heartbeat_at, sessions_live, agents) \
             VALUES ($1, $2, $3, now(), $4, $5) ON CONFLICT (id) DO UPDATE SET \
             address = excluded.address, heartbeat_at = now(), \
             sessions_live = excluded.sessions_live, agents = excluded.agents",
        )
        .bind(&beat.id)
        .bind(&beat.address)
        .bind(beat.started_at.trunc_subsecs(6))
        .bind(beat.sessions_live)
        .bind(&beat.agents)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "DELETE FROM replicas WHERE heartbeat_at < now() - $1 * interval '1 microsecond'",
        )
        .bind(micros_of(forget_after))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn replicas(&self) -> StoreResult<Vec<Replica>> {
        let rows = sqlx::query(
            "SELECT id, address, started_at, heartbeat_at, sessions_live, agents, \
             GREATEST(0, (EXTRACT(EPOCH FROM clock_timestamp() - heartbeat_at) * 1000000)::BIGINT) AS silent \
             FROM replicas ORDER BY started_at, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let silent: i64 = r.get("silent")?;
                let beat = Heartbeat {
                    id: r.get("id")?,
                    address: r.get("address")?,
                    started_at: r.time("started_at")?,
                    sessions_live: r.get("sessions_live")?,
                    // An array of text, which only this backend has (not a `Columns` type).
                    agents: sqlx::Row::try_get(r, "agents")?,
                };
                Ok(Replica {
                    beat,
                    heartbeat_at: r.time("heartbeat_at")?,
                    silent_for: Duration::from_micros(silent.max(0) as u64),
                })
            })
            .collect()
    }

    async fn remove_replica(&self, id: &str) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM session_owners WHERE replica_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let removed = sqlx::query("DELETE FROM replicas WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(removed > 0)
    }

    async fn claim_session(
        &self,
        session_id: &str,
        replica: &str,
        lease: Duration,
    ) -> StoreResult<Claimed> {
        // The owner as it was, its row locked: a concurrent claim waits, then finds it taken.
        let mut tx = self.pool.begin().await?;
        let before: Option<String> = sqlx::query_scalar(
            "SELECT replica_id FROM session_owners WHERE session_id = $1 FOR UPDATE",
        )
        .bind(session_id)
        .fetch_optional(&mut *tx)
        .await?;
        let claimed: Option<String> = sqlx::query_scalar(
            "INSERT INTO session_owners (session_id, replica_id) VALUES ($1, $2) \
             ON CONFLICT (session_id) DO UPDATE SET replica_id = excluded.replica_id \
             WHERE session_owners.replica_id = excluded.replica_id OR NOT EXISTS (\
             SELECT 1 FROM replicas r WHERE r.id = session_owners.replica_id \
             AND r.heartbeat_at >= now() - $3 * interval '1 microsecond') \
             RETURNING replica_id",
        )
        .bind(session_id)
        .bind(replica)
        .bind(micros_of(lease))
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(match (claimed, before) {
            (None, _) => Claimed::Refused,
            (Some(_), Some(before)) if before != replica => Claimed::Orphan,
            (Some(_), _) => Claimed::Taken,
        })
    }

    async fn release_session(&self, session_id: &str, replica: &str) -> StoreResult<()> {
        release_session(&self.pool, session_id, replica).await
    }

    async fn session_owner(
        &self,
        session_id: &str,
        lease: Duration,
    ) -> StoreResult<Option<(String, String)>> {
        Ok(sqlx::query_as(
            "SELECT o.replica_id, r.address FROM session_owners o \
             JOIN replicas r ON r.id = o.replica_id WHERE o.session_id = $1 \
             AND r.heartbeat_at >= now() - $2 * interval '1 microsecond'",
        )
        .bind(session_id)
        .bind(micros_of(lease))
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn owned_among(&self, session_ids: &[&str], lease: Duration) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT o.session_id FROM session_owners o JOIN replicas r ON r.id = o.replica_id \
             WHERE o.session_id = ANY($1) \
             AND r.heartbeat_at >= now() - $2 * interval '1 microsecond'",
        )
        .bind(session_ids)
        .bind(micros_of(lease))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn sessions_held_by(&self, replica: &str) -> StoreResult<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT session_id FROM session_owners WHERE replica_id = $1")
                .bind(replica)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn orphans(&self, lease: Duration) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT o.session_id FROM session_owners o WHERE NOT EXISTS (SELECT 1 FROM replicas r \
             WHERE r.id = o.replica_id AND r.heartbeat_at >= now() - $1 * interval '1 microsecond')",
        )
        .bind(micros_of(lease))
        .fetch_all(&self.pool)
        .await?)
    }
}
