//! `Idempotency-Key` on every POST but `/acp` (whose JSON-RPC ids are per connection): the
//! first request under a key runs to its end even if its client goes away, and its response
//! is kept ([`gateway::Idempotency`]); the same request again gets that response, marked
//! `Idempotent-Replayed: true`, on any replica and after a restart. While the first runs, a
//! repeat waits for it (up to `--idempotency-wait`), then answers 409 with `Retry-After`; the key with
//! another method, path or body is 422; a malformed key is 400. Only final answers are kept: a
//! request answered in a way a repeat may change (5xx, 408, 409, 425, 429) leaves the key free,
//! as does an event stream (which cannot be replayed). A request forwarded by another replica
//! was keyed there; here the key is adopted: this replica runs it and keeps its answer, so a
//! repeat is answered even if the replica it was first sent to is gone. A key whose replica is
//! gone before its request answered is taken over by the next repeat.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::error::ApiError;
use super::proof::forwarded;
use crate::gateway::{self, Caller, Gateway, Idempotency, Keyed, StoredResponse};

/// The request header.
pub const KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set on a response that is a replay.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// How often a waiting repeat looks again.
const POLL: Duration = Duration::from_millis(100);
/// The longest key.
const KEY_MAX: usize = 255;
/// The response headers kept and replayed (the rest describe the connection or the moment).
const KEPT: [HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::LOCATION,
    header::CONTENT_LOCATION,
    HeaderName::from_static("preference-applied"),
];

/// What the layer needs: the service, and the largest request body it reads.
#[derive(Clone)]
pub struct IdempotencyLayer {
    pub gateway: Gateway,
    pub max_body_bytes: usize,
    /// How long a repeat waits for the request still running under its key.
    pub wait: Duration,
}

/// The layer (see the module).
pub async fn idempotent(
    State(keys): State<IdempotencyLayer>,
    req: Request,
    next: Next,
) -> Response {
    let keyed = req.method() == Method::POST && req.uri().path() != super::acp_server::PATH;
    let (Some(raw), true) = (req.headers().get(&KEY), keyed) else {
        return next.run(req).await;
    };
    let key = match parse(raw) {
        Ok(key) => key,
        Err(e) => return e.into_response(),
    };
    let Some(caller) = req.extensions().get::<Caller>().cloned() else {
        return next.run(req).await;
    };
    let idempotency = keys.gateway.idempotency();
    if forwarded(&req) {
        // Taken by the replica that sent it here: this one runs it now.
        return match idempotency.adopt(&caller, &key).await {
            Ok(true) => run_to_end(&keys.gateway, caller, key, req, next).await,
            Ok(false) => next.run(req).await,
            Err(e) => ApiError::from(e).into_response(),
        };
    }
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, keys.max_body_bytes).await {
        Ok(body) => body,
        Err(_) => {
            let limit = keys.max_body_bytes;
            return ApiError::PayloadTooLarge(format!("the body is larger than {limit} bytes"))
                .into_response();
        }
    };
    let target = parts.uri.path_and_query().map_or("", |p| p.as_str());
    let fingerprint = Idempotency::fingerprint(parts.method.as_str(), target, &body);
    let waited = tokio::time::Instant::now() + keys.wait;
    loop {
        match idempotency.take(&caller, &key, &fingerprint).await {
            Err(e) => return ApiError::from(e).into_response(),
            Ok(Keyed::Run) => break,
            Ok(Keyed::Replay(kept)) => return replay(kept),
            Ok(Keyed::Mismatch) => {
                return ApiError::Validation(
                    "this Idempotency-Key was used for another request (method, path or body)"
                        .into(),
                )
                .into_response();
            }
            Ok(Keyed::Running) if tokio::time::Instant::now() >= waited => {
                let mut res = ApiError::from(gateway::Error::Conflict(
                    "the request first sent with this Idempotency-Key is still running".into(),
                ))
                .into_response();
                res.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(1));
                return res;
            }
            Ok(Keyed::Running) => tokio::time::sleep(POLL).await,
        }
    }
    let req = Request::from_parts(parts, Body::from(body));
    run_to_end(&keys.gateway, caller, key, req, next).await
}

/// Runs `req`, whose key this replica holds, to its end (keeping the response) even if its
/// client goes away.
async fn run_to_end(
    gateway: &Gateway,
    caller: Caller,
    key: String,
    req: Request,
    next: Next,
) -> Response {
    let keeper = gateway.clone();
    let run = gateway.idempotency().run_to_end(
        async move {
            let res = next.run(req).await;
            keep(keeper.idempotency(), &caller, &key, res).await
        }
        .instrument(tracing::Span::current()),
    );
    run.await.unwrap_or_else(|e| {
        tracing::error!(error = %e, "a request with an Idempotency-Key failed");
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    })
}

/// The key in `raw`: an sf-string (`"…"`, as the IETF draft writes it) or the bare token
/// clients such as Stripe's send; 1 to [`KEY_MAX`] visible ASCII characters.
fn parse(raw: &HeaderValue) -> Result<String, ApiError> {
    let bad = || {
        ApiError::BadRequest(format!(
            "Idempotency-Key must be 1 to {KEY_MAX} visible ASCII characters, quoted or not"
        ))
    };
    let text = raw.to_str().map_err(|_| bad())?.trim();
    let key = match text.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"').ok_or_else(bad)?,
        None => text,
    };
    let visible = key
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
    if key.is_empty() || key.len() > KEY_MAX || !visible {
        return Err(bad());
    }
    Ok(key.to_owned())
}

/// Keeps `res` under `key` (or frees the key when a repeat may run again) and passes it on.
async fn keep(idempotency: &Idempotency, caller: &Caller, key: &str, res: Response) -> Response {
    let status = res.status();
    let stream = super::sse::is_event_stream(&res);
    let again = status.is_server_error()
        || [
            StatusCode::REQUEST_TIMEOUT,
            StatusCode::CONFLICT,
            StatusCode::TOO_EARLY,
            StatusCode::TOO_MANY_REQUESTS,
        ]
        .contains(&status);
    if again || stream {
        if let Err(e) = idempotency.release(caller, key).await {
            tracing::warn!(error = %e, "an Idempotency-Key was not freed");
        }
        return res;
    }
    let (parts, body) = res.into_parts();
    let body = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(body) => body,
        Err(e) => {
            tracing::error!(error = %e, "a response body failed");
            let _ = idempotency.release(caller, key).await;
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    let kept = StoredResponse {
        status: status.as_u16(),
        headers: (KEPT.iter())
            .filter_map(|name| {
                let value = parts.headers.get(name)?.to_str().ok()?;
                Some((name.as_str().to_owned(), value.to_owned()))
            })
            .collect(),
        body: body.to_vec(),
    };
    if let Err(e) = idempotency.finish(caller, key, &kept).await {
        tracing::warn!(error = %e, "the response to an Idempotency-Key was not kept");
    }
    Response::from_parts(parts, Body::from(body))
}

/// The kept response, marked a replay.
fn replay(kept: StoredResponse) -> Response {
    let status = StatusCode::from_u16(kept.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut res = Response::new(Body::from(kept.body));
    *res.status_mut() = status;
    for (name, value) in kept.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            res.headers_mut().insert(name, value);
        }
    }
    res.headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    res
}

/// Documents the header on every POST of `doc`: the parameter, the replay mark on its 2xx
/// answers, and its 409, 422 and 400.
pub fn document(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::{ObjectBuilder, RefOr, Required, Type, header::Header};
    let string = || ObjectBuilder::new().schema_type(Type::String).build();
    // What [`parse`] takes: visible ASCII but `"` and `\`, 1 to 255, quoted or not.
    let key = ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(r#"^("[!#-\[\]-~]{1,255}"|[!#-\[\]-~]{1,255})$"#))
        .examples(["8e03978e-40d5-43e8-bc93-6894a57f9324"])
        .build();
    for item in doc.paths.paths.values_mut() {
        let Some(op) = item.post.as_mut() else {
            continue;
        };
        let parameter = ParameterBuilder::new()
            .name("Idempotency-Key")
            .parameter_in(ParameterIn::Header)
            .required(Required::False)
            .description(Some(
                "Makes a retry safe: the first request under a key (per tenant) runs, and the \
                 same request again gets its response (marked Idempotent-Replayed), on any \
                 replica, for --idempotency-ttl (default 24 h). 1 to 255 visible ASCII \
                 characters, quoted or not.",
            ))
            .schema(Some(key.clone()))
            .build();
        op.parameters.get_or_insert_with(Vec::new).push(parameter);
        let responses = &mut op.responses.responses;
        for (status, response) in responses.iter_mut() {
            if let (true, RefOr::T(response)) = (status.starts_with('2'), response) {
                let mut mark = Header::new(string());
                mark.description = Some(
                    "`true` when this is the response kept under the request's Idempotency-Key"
                        .into(),
                );
                response.headers.insert("Idempotent-Replayed".into(), mark);
            }
        }
        for (status, description) in [
            ("400", "Malformed Idempotency-Key"),
            (
                "409",
                "The request first sent with this Idempotency-Key is still running (see Retry-After)",
            ),
            ("422", "This Idempotency-Key was used for another request"),
        ] {
            if !responses.contains_key(status) {
                responses.insert(
                    status.to_owned(),
                    super::responses::problem(description).into(),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_quoted_or_bare_visible_ascii() {
        let key = |s: &str| parse(&HeaderValue::from_str(s).unwrap());
        assert_eq!(key("\"8e03978e-40d5\"").unwrap(), "8e03978e-40d5");
        assert_eq!(key("abc_123").unwrap(), "abc_123");
        for bad in [
            "",
            "\"\"",
            "a b",
            "\"open",
            "x\"y",
            "a\\b",
            &"k".repeat(256),
        ] {
            assert!(key(bad).is_err(), "{bad:?}");
        }
    }
}
