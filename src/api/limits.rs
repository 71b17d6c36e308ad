//! Per-tenant limits: a request rate (token bucket), requests in flight, open SSE streams, and a
//! timeout on ordinary requests. Streams and prompts that wait for their turn are exempt from the
//! timeout: a turn has no hidden deadline (cancel it instead).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::error::{ApiError, Policy};
use crate::gateway::Caller;

/// The configured limits (0 / `None`: unlimited).
#[derive(Debug, Clone, Default)]
pub struct LimitConfig {
    pub rate_per_sec: u32,
    pub max_in_flight: usize,
    pub max_streams: usize,
    pub timeout: Option<Duration>,
}

#[derive(Debug)]
struct Usage {
    tokens: f64,
    refilled: Instant,
    in_flight: usize,
    streams: usize,
}

/// Limits and what each tenant currently uses.
pub struct Limits {
    config: LimitConfig,
    usage: Mutex<HashMap<String, Usage>>,
}

/// Gives back an in-flight or stream slot when dropped.
struct HeldSlot {
    limits: Arc<Limits>,
    tenant: String,
    stream: bool,
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        let mut usage = self.limits.usage.lock().expect("limits lock");
        if let Some(u) = usage.get_mut(&self.tenant) {
            if self.stream {
                u.streams = u.streams.saturating_sub(1);
            } else {
                u.in_flight = u.in_flight.saturating_sub(1);
            }
        }
    }
}

impl Limits {
    pub fn new(config: LimitConfig) -> Arc<Self> {
        Arc::new(Limits {
            config,
            usage: Mutex::default(),
        })
    }

    /// Takes a token and a slot, or says how long to wait.
    fn admit(self: &Arc<Self>, tenant: &str, stream: bool) -> Result<HeldSlot, ApiError> {
        let c = &self.config;
        let mut usage = self.usage.lock().expect("limits lock");
        let u = usage.entry(tenant.to_owned()).or_insert_with(|| Usage {
            tokens: f64::from(c.rate_per_sec),
            refilled: Instant::now(),
            in_flight: 0,
            streams: 0,
        });
        if c.rate_per_sec > 0 {
            let rate = f64::from(c.rate_per_sec);
            u.tokens = (u.tokens + u.refilled.elapsed().as_secs_f64() * rate).min(rate);
            u.refilled = Instant::now();
            if u.tokens < 1.0 {
                let wait = ((1.0 - u.tokens) / rate).ceil().max(1.0) as u64;
                let policy = Policy {
                    name: "requests",
                    quota: u64::from(c.rate_per_sec),
                    window_secs: Some(1),
                };
                return Err(too_many(
                    format!("more than {} requests per second", c.rate_per_sec),
                    wait,
                    policy,
                ));
            }
        }
        // A stream holds one of the streams, any other request one of the in-flight slots.
        let (held, max, name, what, retry_after_secs) = if stream {
            let (max, what) = (c.max_streams, "event streams already open");
            (&mut u.streams, max, "streams", what, 5)
        } else {
            let (max, what) = (c.max_in_flight, "requests already in flight");
            (&mut u.in_flight, max, "in-flight", what, 1)
        };
        if max > 0 && *held >= max {
            let policy = Policy {
                name,
                quota: max as u64,
                window_secs: None,
            };
            return Err(too_many(format!("{held} {what}"), retry_after_secs, policy));
        }
        *held += 1;
        if c.rate_per_sec > 0 {
            u.tokens -= 1.0;
        }
        Ok(HeldSlot {
            limits: self.clone(),
            tenant: tenant.to_owned(),
            stream,
        })
    }
}

fn too_many(what: String, retry_after_secs: u64, policy: Policy) -> ApiError {
    ApiError::TooManyRequests {
        message: format!("too many requests for this API key: {what}; retry later"),
        retry_after_secs,
        policy,
    }
}

fn is_stream(req: &Request) -> bool {
    let path = req.uri().path();
    req.method() == Method::GET
        && (path == "/events" || path.ends_with("/events") || path == super::acp_server::PATH)
}

fn waits_for_a_turn(req: &Request) -> bool {
    req.method() == Method::POST && req.uri().path().ends_with("/prompt")
}

/// Applies the limits to authenticated requests (public probes carry no caller and pass).
pub async fn limit(State(limits): State<Arc<Limits>>, req: Request, next: Next) -> Response {
    let Some(caller) = req.extensions().get::<Caller>().cloned() else {
        return next.run(req).await;
    };
    let stream = is_stream(&req);
    let slot = match limits.admit(&caller.tenant, stream) {
        Ok(slot) => slot,
        Err(e) => return e.into_response(),
    };
    if stream {
        // The slot lives as long as the stream's body.
        let res = next.run(req).await;
        let (parts, body) = res.into_parts();
        let body = body.into_data_stream().map(move |chunk| {
            let _held = &slot;
            chunk
        });
        return Response::from_parts(parts, axum::body::Body::from_stream(body));
    }
    let timeout = limits.config.timeout.filter(|_| !waits_for_a_turn(&req));
    let res = match timeout {
        Some(t) => match tokio::time::timeout(t, next.run(req)).await {
            Ok(res) => res,
            Err(_) => ApiError::RequestTimeout.into_response(),
        },
        None => next.run(req).await,
    };
    drop(slot);
    res
}

/// Documents the `RateLimit-Policy` and `RateLimit` headers of a 429 `response`.
pub(super) fn document_headers(response: &mut utoipa::openapi::Response) {
    use utoipa::openapi::{ObjectBuilder, Type, header::Header};
    for (name, description) in [
        (
            "RateLimit-Policy",
            "The limit reached (draft-ietf-httpapi-ratelimit-headers): `\"requests\";q=N;w=1`, \
             `\"in-flight\";q=N;qu=\"concurrent-requests\"` or `\"streams\";q=N;qu=\"concurrent-requests\"`",
        ),
        (
            "RateLimit",
            "What is left of it: `\"NAME\";r=0`, with `t=SECONDS` until a rate's quota returns",
        ),
    ] {
        let mut header = Header::new(ObjectBuilder::new().schema_type(Type::String).build());
        header.description = Some(description.into());
        response.headers.insert(name.into(), header);
    }
}
