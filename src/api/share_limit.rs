//! How fast one client address may ask `/shared/…` ([`ShareLimit`]): a token bucket per
//! address, so that a share link's token cannot be guessed by trying many.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

use super::error::{ApiError, Policy};

/// Requests to `/shared/…` a client address may make at once, and per second after that.
const BURST: f64 = 60.0;
const PER_SEC: f64 = 2.0;
/// Addresses remembered at most; beyond, those full again are forgotten.
const ADDRESSES: usize = 10_000;

/// The token buckets of `/shared/…`, one per client address.
#[derive(Default)]
pub struct ShareLimit(Mutex<HashMap<IpAddr, (f64, Instant)>>);

impl ShareLimit {
    pub(super) fn admit(&self, peer: Option<IpAddr>) -> Result<(), ApiError> {
        let Some(peer) = peer else { return Ok(()) };
        let mut buckets = self.0.lock().expect("share limit lock");
        let now = Instant::now();
        if buckets.len() >= ADDRESSES {
            buckets
                .retain(|_, (tokens, at)| *tokens + at.elapsed().as_secs_f64() * PER_SEC < BURST);
        }
        let (tokens, at) = buckets.entry(peer).or_insert((BURST, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * PER_SEC).min(BURST);
        *at = now;
        if *tokens < 1.0 {
            return Err(ApiError::TooManyRequests {
                message: format!(
                    "more than {BURST} requests to shared links at once from this address"
                ),
                retry_after_secs: 1,
                policy: Policy {
                    name: "shared",
                    quota: PER_SEC as u64,
                    window_secs: Some(1),
                },
            });
        }
        *tokens -= 1.0;
        Ok(())
    }
}
