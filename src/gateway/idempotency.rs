//! Idempotency keys (`Idempotency-Key`, as the IETF httpapi draft and Stripe use it): per
//! tenant, the first request under a key runs and its response is kept in the store for
//! `ttl`, so that a repeat of the same request gets that response again on any replica and
//! after a restart, and a repeat while it runs waits for it. A key is held by the replica
//! running its request: the one that took it, or the one it was forwarded to, which
//! [adopts](Idempotency::adopt) it; while that replica is live the key is not taken again, and
//! once it is gone (its lease ran out; on SQLite, an earlier gateway on the file) a repeat takes
//! the key over and runs. Expired responses are pruned.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::caller::Caller;
use super::clock::now;
use super::error::Error;
use super::parts::use_case;
pub use crate::store::StoredResponse;
use crate::store::{IdempotencyKeys, KeyClaim, KeyRequest};

/// How often expired keys are deleted, at most (a shorter time to live prunes as often).
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// What a request's key says to do.
#[derive(Debug)]
pub enum Keyed {
    /// The key is this request's now: run it, then [`Idempotency::finish`] (or
    /// [`Idempotency::release`]) it.
    Run,
    /// The same request answered before: send this again.
    Replay(StoredResponse),
    /// The same request is still running (here or on another replica).
    Running,
    /// The key was used for another request.
    Mismatch,
}

use_case! {
    /// The use case of idempotency keys, with the parts it needs.
    pub struct Idempotency {
        parts: [placement, tasks, stop],
        /// Where keys are taken, handed and kept.
        keys: Arc<dyn IdempotencyKeys>,
        /// How long a key is kept.
        ttl: Duration,
    }
}

impl Idempotency {
    /// The digest a key is bound to: method, path (with its query) and body.
    pub fn fingerprint(method: &str, path: &str, body: &[u8]) -> String {
        let mut digest = Sha256::new();
        for part in [method.as_bytes(), path.as_bytes()] {
            digest.update((part.len() as u64).to_be_bytes());
            digest.update(part);
        }
        digest.update(body);
        format!("{:x}", digest.finalize())
    }

    /// Takes `key` for the request with `fingerprint`, or says what holds it; a key whose
    /// runner is gone is taken over.
    pub async fn take(
        &self,
        caller: &Caller,
        key: &str,
        fingerprint: &str,
    ) -> Result<Keyed, Error> {
        let store = &self.keys;
        let here = crate::cluster::replica_id();
        let request = KeyRequest {
            tenant: &caller.tenant,
            key,
            fingerprint,
            runner: here,
        };
        // A key taken over by another repeat at the same moment is read again, once.
        for _ in 0..2 {
            let held = match store.take_idempotency_key(request, self.term()).await? {
                KeyClaim::Taken => return Ok(Keyed::Run),
                KeyClaim::Held(held) => held,
            };
            if held.fingerprint != fingerprint {
                return Ok(Keyed::Mismatch);
            }
            if let Some(response) = held.response {
                return Ok(Keyed::Replay(response));
            }
            if !self.placement.cluster().gone(&held.runner).await? {
                return Ok(Keyed::Running);
            }
            let from = (Some(held.runner.as_str()), here);
            if store
                .hand_idempotency_key(&caller.tenant, key, from, self.term())
                .await?
            {
                tracing::warn!(
                    gone = held.runner,
                    "the replica running the request of an Idempotency-Key is gone: it runs again here"
                );
                return Ok(Keyed::Run);
            }
        }
        Ok(Keyed::Running)
    }

    /// Makes this replica the runner of `key`, taken by the replica that forwarded its request
    /// here: the key then lives and dies with this replica, not that one. `false` when the key
    /// runs nothing (answered or freed meanwhile).
    pub async fn adopt(&self, caller: &Caller, key: &str) -> Result<bool, Error> {
        let to = (None, crate::cluster::replica_id());
        let store = &self.keys;
        Ok(store
            .hand_idempotency_key(&caller.tenant, key, to, self.term())
            .await?)
    }

    /// From now until the time to live has passed.
    fn term(&self) -> crate::store::KeyTerm {
        let at = now();
        (
            at,
            at + chrono::Duration::from_std(self.ttl).unwrap_or(chrono::Duration::MAX),
        )
    }

    /// Keeps the response of the request holding `key`.
    pub async fn finish(
        &self,
        caller: &Caller,
        key: &str,
        response: &StoredResponse,
    ) -> Result<(), Error> {
        let store = &self.keys;
        Ok(store
            .finish_idempotency_key(&caller.tenant, key, response, self.term().1)
            .await?)
    }

    /// Frees `key` if this replica runs it: its request failed in a way a repeat may not (the
    /// store, an agent or a replica unavailable), so a repeat runs again.
    pub async fn release(&self, caller: &Caller, key: &str) -> Result<(), Error> {
        let store = &self.keys;
        let here = crate::cluster::replica_id();
        Ok(store
            .release_idempotency_key(&caller.tenant, key, here)
            .await?)
    }

    /// Runs `work` (a keyed request) in a task of the gateway's own, to its end whether or not
    /// its client waits for it.
    pub fn run_to_end<F>(&self, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(work)
    }

    /// Deletes expired keys every [`PRUNE_EVERY`] (or time to live, if shorter) until the
    /// gateway stops.
    pub async fn prune_forever(self) {
        loop {
            match (self.keys)
                .prune_idempotency_keys(now(), crate::cluster::replica_id())
                .await
            {
                Ok(0) => {}
                Ok(pruned) => tracing::debug!(pruned, "expired idempotency keys deleted"),
                Err(e) => tracing::warn!(error = %e, "expired idempotency keys not deleted"),
            }
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep(self.ttl.clamp(Duration::from_secs(1), PRUNE_EVERY)) => {}
            }
        }
    }
}
