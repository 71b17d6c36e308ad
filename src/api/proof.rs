//! The mark of a request one replica forwards to another ([`FORWARDED`]): the sending replica's
//! id, the time and an HMAC-SHA256 of both with the method and target, keyed with the secret the
//! replicas sharing a database keep there ([`Gateway::cluster_secret`]). A forwarded request is
//! served where it arrives, not forwarded again, and runs under the idempotency key the sender
//! took; so the mark is only believed when proven: [`admit`], outside those layers, takes it off
//! every request and puts a [`Forwarded`] in its place when the signature holds and the time is
//! within [`SKEW`] of this replica's clock. A client cannot make one.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::gateway::Gateway;

/// Marks a request one replica forwarded to another: `REPLICA;UNIX_MS;SIGNATURE`.
pub const FORWARDED: HeaderName = HeaderName::from_static("acp-gateway-forwarded");

/// How far a mark's time may be from this replica's clock (replicas' clocks differ; a mark is
/// sent at once).
pub const SKEW: Duration = Duration::from_secs(60);

/// A request another replica forwarded here, proven: the replica that sent it.
#[derive(Debug, Clone)]
pub struct Forwarded {
    pub by: String,
}

/// Signs and checks marks with the replicas' shared secret.
#[derive(Clone)]
pub struct Proof {
    secret: Arc<[u8]>,
    /// This replica's id, which its marks carry.
    replica: &'static str,
}

impl Proof {
    pub fn new(gateway: &Gateway) -> Self {
        Proof::with_secret(gateway.cluster_secret(), gateway.replica_id())
    }

    /// Marks of replica `replica` with `secret` (the database's, as [`Proof::new`] reads it).
    pub fn with_secret(secret: Arc<[u8]>, replica: &'static str) -> Self {
        Proof { secret, replica }
    }

    fn signature(&self, replica: &str, at_ms: u128, method: &Method, target: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("any key length");
        for part in [replica, &at_ms.to_string(), method.as_str(), target] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }

    /// The mark of a request this replica sends with `method` to `target` (its path and query).
    pub fn mark(&self, method: &Method, target: &str) -> HeaderValue {
        let at_ms = unix_ms();
        let signature = self.signature(self.replica, at_ms, method, target);
        let signature = URL_SAFE_NO_PAD.encode(signature.finalize().into_bytes());
        HeaderValue::from_str(&format!("{};{at_ms};{signature}", self.replica))
            .expect("an id, digits and base64")
    }

    /// The replica that sent a request with `mark`, if the mark proves it.
    fn check(&self, mark: &HeaderValue, method: &Method, target: &str) -> Option<String> {
        let mut parts = mark.to_str().ok()?.split(';');
        let (replica, at_ms, signature) = (parts.next()?, parts.next()?, parts.next()?);
        let at_ms: u128 = at_ms.parse().ok()?;
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        let now = unix_ms();
        let skew = SKEW.as_millis();
        let timely = at_ms.abs_diff(now) <= skew;
        let mac = self.signature(replica, at_ms, method, target);
        (parts.next().is_none() && timely && mac.verify_slice(&signature).is_ok())
            .then(|| replica.to_owned())
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

/// Middleware (see the module): the [`FORWARDED`] header off, a [`Forwarded`] on when proven.
pub async fn admit(State(proof): State<Proof>, mut req: Request, next: Next) -> Response {
    req.extensions_mut().remove::<Forwarded>();
    if let Some(mark) = req.headers_mut().remove(&FORWARDED) {
        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        match proof.check(&mark, req.method(), target) {
            Some(by) => {
                req.extensions_mut().insert(Forwarded { by });
            }
            None => tracing::warn!(
                "a request carried a forwarding mark no replica made (or too old): served as a \
                 client's"
            ),
        }
    }
    next.run(req).await
}

/// Whether `req` was forwarded here by another replica (see [`admit`]).
pub fn forwarded(req: &Request) -> bool {
    req.extensions().get::<Forwarded>().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proof(secret: &[u8], replica: &'static str) -> Proof {
        Proof {
            secret: secret.into(),
            replica,
        }
    }

    #[test]
    fn a_mark_proves_its_sender_method_and_target_with_the_secret() {
        let a = proof(b"shared", "replica-a");
        let b = proof(b"shared", "replica-b");
        let mark = a.mark(&Method::DELETE, "/sessions/s1");
        assert_eq!(
            b.check(&mark, &Method::DELETE, "/sessions/s1").as_deref(),
            Some("replica-a")
        );
        assert_eq!(b.check(&mark, &Method::POST, "/sessions/s1"), None);
        assert_eq!(b.check(&mark, &Method::DELETE, "/sessions/s2"), None);
        let stranger = proof(b"guessed", "replica-a");
        assert_eq!(stranger.check(&mark, &Method::DELETE, "/sessions/s1"), None);
        for forged in ["1", "replica-a;0;AAAA", "", "replica-a;x;y;z"] {
            let forged = HeaderValue::from_str(forged).unwrap();
            assert_eq!(b.check(&forged, &Method::DELETE, "/sessions/s1"), None);
        }
        // A mark of long ago is not believed, though signed.
        let at_ms = unix_ms() - 2 * SKEW.as_millis();
        let old = a.signature("replica-a", at_ms, &Method::DELETE, "/sessions/s1");
        let old = URL_SAFE_NO_PAD.encode(old.finalize().into_bytes());
        let old = HeaderValue::from_str(&format!("replica-a;{at_ms};{old}")).unwrap();
        assert_eq!(b.check(&old, &Method::DELETE, "/sessions/s1"), None);
    }
}
