//! Sending webhook deliveries from the outbox: each replica claims due deliveries with a lease
//! (one replica at a time per delivery; a session's go out one at a time, in log order), signs
//! each as Standard Webhooks says, and records how the attempt ended. A failed attempt is
//! retried with exponential backoff and jitter until `--webhook-max-age` has passed since the
//! first; then the delivery fails and its subscription is disabled (`webhook_disabled`). A
//! replica killed mid-attempt loses nothing: its lease runs out and another takes it. A
//! replica stopping gracefully first lets the attempts under way end and records them.
//!
//! Safety: the URL's host is resolved at every attempt and only the addresses `reach` allows
//! are used (public ones, unless `--webhook-allow-private` or `--webhook-allow-link-local`),
//! redirects are not followed, the body is bounded, only the
//! first 1 KiB of an answer is kept, and the secret is never logged.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use chrono::Utc;
use futures::StreamExt;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tracing::Instrument as _;

use super::subscriptions::{WebhookConfig, Webhooks, body};
use crate::gateway::event::{GatewayLifecycleEvent, WebhookDisabled};
use crate::store::{Attempt, DeliveryRecord, WebhookRecord};

/// Deliveries claimed at once.
const BATCH: i64 = 32;
/// How long a stopping replica waits for the attempts under way.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// What is kept of an answer's body.
const KEPT_BODY: usize = 1024;

impl Webhooks {
    /// Sends deliveries until shutdown.
    pub(in crate::gateway) async fn deliver_forever(self: std::sync::Arc<Self>) {
        let config = self.config().clone();
        let mut tick = tokio::time::interval(config.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.stopping().cancelled() => return,
                _ = tick.tick() => {}
            }
            // A batch at a time, until nothing is due.
            loop {
                let now = Utc::now();
                let lease = now + config.timeout + Duration::from_secs(30);
                let owner = crate::cluster::replica_id();
                let claimed = match self
                    .outbox()
                    .claim_deliveries(owner, now, lease, BATCH)
                    .await
                {
                    Ok(claimed) => claimed,
                    Err(e) => {
                        tracing::warn!(error = %e, "webhook deliveries cannot be claimed now");
                        break;
                    }
                };
                let full = claimed.len() as i64 == BATCH;
                let attempts = claimed
                    .into_iter()
                    .map(|(d, w)| self.attempt(&config, d, w));
                let batch = futures::future::join_all(attempts);
                tokio::pin!(batch);
                tokio::select! {
                    () = self.stopping().cancelled() => {
                        // Attempts under way are recorded if they end soon, rather than left
                        // to their lease (which would hold them from every replica for 40 s).
                        let _ = tokio::time::timeout(STOP_GRACE, batch).await;
                        return;
                    }
                    _ = &mut batch => {}
                }
                if !full {
                    break;
                }
            }
        }
    }

    /// One attempt of one delivery, recorded.
    async fn attempt(&self, config: &WebhookConfig, d: DeliveryRecord, w: WebhookRecord) {
        // Each attempt a trace of its own (made by the outbox, not by a request).
        let span = tracing::info_span!(
            "webhook attempt",
            "otel.kind" = "client",
            webhook = w.id.as_str(),
            delivery = d.id,
            attempt = d.attempts + 1,
            "http.response.status_code" = tracing::field::Empty,
            error = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
        );
        let sent = send(config, &d, &w).instrument(span.clone()).await;
        match &sent {
            Ok((status, _)) => {
                span.record("http.response.status_code", status);
                if !(200..300).contains(status) {
                    span.record("otel.status_code", "ERROR");
                }
            }
            Err(error) => {
                span.record("error", error.as_str());
                span.record("otel.status_code", "ERROR");
            }
        }
        let now = Utc::now();
        let attempt = match sent {
            Ok((status, body)) if (200..300).contains(&status) => {
                Attempt::Delivered { status, body }
            }
            failed => {
                let (status, body, error) = match failed {
                    Ok((status, body)) => (Some(status), Some(body), format!("answered {status}")),
                    Err(error) => (None, None, error),
                };
                let delay = backoff(config, d.attempts + 1);
                let deadline = d.retry_from + config.max_age;
                let next = (now + delay <= deadline).then_some(now + delay);
                Attempt::Failed {
                    status,
                    body,
                    error,
                    next,
                }
            }
        };
        match self
            .outbox()
            .finish_delivery(d.id, crate::cluster::replica_id(), &attempt, now)
            .await
        {
            Ok(true) => {}
            Ok(false) => tracing::info!(
                delivery = d.id,
                "a webhook delivery's lease ran out before its attempt was recorded"
            ),
            Err(e) => {
                tracing::warn!(delivery = d.id, error = %e, "a webhook attempt could not be recorded; it will be made again")
            }
        }
        if let Attempt::Failed {
            next: None, error, ..
        } = &attempt
        {
            self.disable_webhook(w, &d, error).await;
        }
    }

    /// A delivery failed for `--webhook-max-age`: its subscription is disabled, and that is
    /// announced on the lifecycle stream.
    async fn disable_webhook(&self, mut w: WebhookRecord, d: &DeliveryRecord, error: &str) {
        let reason = format!(
            "delivery {} ({}) failed for {} s; last error: {error}",
            d.id,
            d.message_id,
            self.config().max_age.as_secs()
        );
        tracing::warn!(webhook = w.id, url = %crate::redact::url(&w.url), %reason, "webhook disabled");
        w.enabled = false;
        w.disabled_reason = Some(reason.clone());
        w.updated_at = Utc::now();
        if let Err(e) = self.outbox().update_webhook(&w).await {
            tracing::warn!(webhook = w.id, error = %e, "a failing webhook could not be disabled");
            return;
        }
        let disabled = GatewayLifecycleEvent::WebhookDisabled(WebhookDisabled {
            session_id: d.session_id.clone(),
            webhook_id: w.id.clone(),
            reason,
        });
        self.hub().lifecycle(disabled.stored(&w.tenant)).await;
    }
}

/// The delay before attempt `attempt + 1`: `retry_base · 2^(attempt-1)`, at most `retry_max`,
/// between 75 % and 125 % of that at random (so that a receiver coming back is not hit by
/// every retry at once).
fn backoff(config: &WebhookConfig, attempt: i32) -> Duration {
    let exp = config
        .retry_base
        .saturating_mul(1u32 << (attempt - 1).clamp(0, 20));
    let capped = exp.min(config.retry_max);
    let jitter = 0.75 + (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 2000.0;
    capped.mul_f64(jitter)
}

/// The addresses of `url`'s host that may be used, resolved now.
async fn addresses(config: &WebhookConfig, url: &reqwest::Url) -> Result<Vec<SocketAddr>, String> {
    let host = url.host_str().ok_or("the URL has no host")?;
    let port = url.port_or_known_default().ok_or("the URL has no port")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    let mut refused = None;
    let allowed: Vec<SocketAddr> = resolved
        .iter()
        .copied()
        .filter(|a| match config.allowed.check(a.ip()) {
            Ok(()) => true,
            Err(why) => {
                refused.get_or_insert(why);
                false
            }
        })
        .collect();
    match refused {
        _ if !allowed.is_empty() => Ok(allowed),
        Some(why) => Err(format!("refused: {host} resolves to {why}")),
        None => Err(format!("cannot resolve {host}: no address")),
    }
}

/// `v1,` + base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")), the key being the secret's
/// base64 after `whsec_`.
fn signature(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> String {
    let key = STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .unwrap_or_else(|_| secret.as_bytes().to_vec());
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// Sends one attempt: the answer's status and the first 1 KiB of its body, or why there is none.
async fn send(
    config: &WebhookConfig,
    d: &DeliveryRecord,
    w: &WebhookRecord,
) -> Result<(i32, String), String> {
    let url = reqwest::Url::parse(&w.url).map_err(|e| format!("invalid URL: {e}"))?;
    let addrs = addresses(config, &url).await?;
    let host = url.host_str().unwrap_or_default().to_owned();
    // Connected only to the addresses checked above: no second lookup that could answer
    // differently, no redirect, no pooled connection from an earlier attempt.
    let client = reqwest::Client::builder()
        .resolve_to_addrs(&host, &addrs)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(config.timeout)
        .pool_max_idle_per_host(0)
        .user_agent(concat!("acp-gateway/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("HTTP client: {e}"))?;
    let body = body(d, config.max_body);
    let timestamp = Utc::now().timestamp();
    let answer = client
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", &d.message_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header(
            "webhook-signature",
            signature(&w.secret, &d.message_id, timestamp, &body),
        )
        .body(body)
        .send()
        .await
        .map_err(describe)?;
    let status = i32::from(answer.status().as_u16());
    let mut kept = Vec::new();
    let mut chunks = answer.bytes_stream();
    while kept.len() < KEPT_BODY {
        match tokio::time::timeout(config.timeout, chunks.next()).await {
            Ok(Some(Ok(chunk))) => {
                kept.extend_from_slice(&chunk[..chunk.len().min(KEPT_BODY - kept.len())])
            }
            _ => break,
        }
    }
    Ok((status, String::from_utf8_lossy(&kept).into_owned()))
}

/// Why an attempt failed, without the URL (its userinfo may hold a password).
fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        format!("cannot connect: {e}")
    } else {
        format!("request failed: {e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_standard_webhooks() {
        // The example of the Standard Webhooks specification.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        let sig = signature(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let config = WebhookConfig {
            allowed: super::super::reach::Allowed::default(),
            timeout: Duration::from_secs(1),
            retry_base: Duration::from_secs(10),
            retry_max: Duration::from_secs(60),
            max_age: Duration::from_secs(3600),
            poll: Duration::from_secs(1),
            max_body: 1024,
        };
        let first = backoff(&config, 1);
        assert!((7.5..=12.5).contains(&first.as_secs_f64()), "{first:?}");
        let third = backoff(&config, 3);
        assert!((30.0..=50.0).contains(&third.as_secs_f64()), "{third:?}");
        let late = backoff(&config, 30);
        assert!(late.as_secs_f64() <= 75.0, "{late:?}");
    }
}
