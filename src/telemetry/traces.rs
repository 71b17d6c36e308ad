//! OpenTelemetry traces over OTLP (HTTP/protobuf), built on `tracing` (`tracing-opentelemetry`):
//! off unless `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `--otlp-endpoint` names a collector. The SDK reads the standard variables (`OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER[_ARG]`, `OTEL_BSP_*`, the exporter's headers
//! and timeout); `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off.
//!
//! Spans are exported in batches by the SDK's own thread, off the request path, through the
//! gateway's reqwest client run on its tokio runtime ([`OnRuntime`]). A collector that cannot be
//! reached costs a dropped batch, counted in `/metrics`
//! (`acp_gateway_otel_spans_total{result="exported"|"failed"}`). W3C trace context
//! (`traceparent`, `tracestate`, `baggage`) is read from and written to carriers with
//! [`extract`] and [`inject`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapCompositePropagator;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry::{Context, InstrumentationScope, global};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The exporter's HTTP client: reqwest's, each export run on the gateway's runtime, so that the
/// SDK's batch thread (which has no reactor of its own) can await it.
#[derive(Debug, Clone)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        let client = self.client.clone();
        self.runtime
            .spawn(
                async move { opentelemetry_http::HttpClient::send_bytes(&client, request).await },
            )
            .await?
    }
}

/// The OTLP exporter, counting what it exports and what it fails to (logged once per outage).
#[derive(Debug)]
struct Counting<E> {
    inner: E,
    failing: AtomicBool,
}

impl<E: SpanExporter> SpanExporter for Counting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.inner.export(batch).await;
        let outcome = if result.is_ok() { "exported" } else { "failed" };
        metrics::counter!("acp_gateway_otel_spans_total", "result" => outcome).increment(spans);
        match &result {
            Err(e) if !self.failing.swap(true, Ordering::Relaxed) => {
                tracing::warn!(error = %crate::redact::text(&e.to_string()), "spans could not be exported; dropping them until the collector answers")
            }
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                tracing::info!("spans are exported again")
            }
            _ => {}
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The tracer provider while traces are exported; flushed and stopped by [`Traces::shutdown`].
pub struct Traces {
    provider: SdkTracerProvider,
    pub tracer: SdkTracer,
}

/// Set once [`Traces::start`] has started an exporter.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (the process's traces are on).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Whether an environment variable is set to something.
fn set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty())
}

impl Traces {
    /// The exporter the environment (or `endpoint`, `--otlp-endpoint`) configures, if any.
    /// Runs inside the tokio runtime.
    pub fn start(endpoint: Option<&str>) -> anyhow::Result<Option<Traces>> {
        let off = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
            || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
        let configured = endpoint.is_some()
            || set("OTEL_EXPORTER_OTLP_ENDPOINT")
            || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        if off || !configured {
            return Ok(None);
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Ok(protocol) = std::env::var(name) {
                anyhow::ensure!(
                    protocol.is_empty() || protocol.eq_ignore_ascii_case("http/protobuf"),
                    "{name}={protocol}: this build exports OTLP over http/protobuf only"
                );
            }
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(OnRuntime {
                client,
                runtime: tokio::runtime::Handle::current(),
            });
        if let Some(endpoint) = endpoint {
            exporter =
                exporter.with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
        }
        let exporter = Counting {
            inner: exporter.build()?,
            failing: AtomicBool::new(false),
        };
        let mut resource = Resource::builder();
        if !set("OTEL_SERVICE_NAME") {
            resource = resource.with_service_name("acp-gateway");
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).build())
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer_with_scope(
            InstrumentationScope::builder("acp-gateway")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(BaggagePropagator::new()),
        ]));
        EXPORTING.store(true, Ordering::Relaxed);
        Ok(Some(Traces { provider, tracer }))
    }

    /// Exports what is left and stops (bounded), on the blocking pool: it waits for the batch
    /// thread, which waits for an export on this runtime.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let _ = tokio::task::spawn_blocking(move || {
            provider.shutdown_with_timeout(Duration::from_secs(5))
        })
        .await;
    }
}

/// Continues the trace a carrier names (`traceparent`, `tracestate`, `baggage`) in `span`,
/// which must not have been entered yet. Nothing when traces are off or the carrier names none.
pub fn continue_in(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    if !headers.contains_key("traceparent") {
        return;
    }
    let parent = global::get_text_map_propagator(|p| {
        p.extract(&opentelemetry_http::HeaderExtractor(headers))
    });
    let _ = span.set_parent(parent);
}

/// Continues in `span` (not entered yet) the trace that JSON-RPC `params._meta` names
/// (`traceparent`, `tracestate`, `baggage`: ACP's convention), if any.
pub fn continue_from_meta(span: &tracing::Span, params: &serde_json::Value) {
    let Some(meta) = params.get("_meta").and_then(serde_json::Value::as_object) else {
        return;
    };
    if !meta.contains_key("traceparent") {
        return;
    }
    let carrier: HashMap<String, String> = ["traceparent", "tracestate", "baggage"]
        .into_iter()
        .filter_map(|k| Some((k.to_owned(), meta.get(k)?.as_str()?.to_owned())))
        .collect();
    let parent = global::get_text_map_propagator(|p| p.extract(&carrier));
    let _ = span.set_parent(parent);
}

/// The session a request is about: the path's segment where its route has `/sessions/{id}`.
pub fn session_in<'a>(route: &str, path: &'a str) -> Option<&'a str> {
    let at = route
        .split('/')
        .zip(route.split('/').skip(1))
        .position(|(parent, this)| parent == "sessions" && this == "{id}")?;
    path.split('/').nth(at + 1)
}

/// Whether `span` is in a trace that is sampled (exported).
pub fn sampled(span: &tracing::Span) -> bool {
    sampled_in(&span.context())
}

fn sampled_in(cx: &Context) -> bool {
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid() && sc.is_sampled()
}

/// The W3C trace context of `span` (`traceparent`, `tracestate`, `baggage`), to send along with
/// a request it makes; `None` when it is not traced or not sampled (then nothing is added to
/// the request: what an unsampled trace would tell the next hop is not worth its bytes on
/// every call).
pub fn context_of(span: &tracing::Span) -> Option<HashMap<String, String>> {
    let cx: Context = span.context();
    if !sampled_in(&cx) {
        return None;
    }
    let mut carrier = HashMap::new();
    global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier.retain(|_, v| !v.is_empty());
    Some(carrier)
}

/// The subscriber, for [`WithTraceIds`] (a dispatcher looked up inside an event's dispatch
/// would be none while a scoped one is set).
static DISPATCH: std::sync::OnceLock<tracing::dispatcher::WeakDispatch> =
    std::sync::OnceLock::new();

/// After the subscriber is installed: remembers it for [`WithTraceIds`].
pub fn remember_dispatch() {
    let _ = DISPATCH.set(tracing::dispatcher::get_default(|d| d.downgrade()));
}

/// A JSON log line format that adds the `trace_id` and `span_id` of the event's span, when it
/// is traced, to the line `F` writes.
pub struct WithTraceIds<F>(pub F);

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for WithTraceIds<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let traced = ctx
            .parent_span()
            .map(|span| span.id())
            .zip(DISPATCH.get().and_then(|d| d.upgrade()))
            .and_then(|(id, dispatch)| tracing_opentelemetry::get_otel_context(&id, &dispatch))
            .map(|cx| cx.span().span_context().clone())
            .filter(|sc| sc.is_valid());
        let Some(sc) = traced else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::with_capacity(256);
        self.0.format_event(
            ctx,
            tracing_subscriber::fmt::format::Writer::new(&mut line),
            event,
        )?;
        match line.strip_prefix('{') {
            Some(rest) => write!(
                writer,
                "{{\"trace_id\":\"{}\",\"span_id\":\"{}\",{rest}",
                sc.trace_id(),
                sc.span_id()
            ),
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::session_in;

    #[test]
    fn the_session_is_read_where_the_route_names_it() {
        let route = "/sessions/{id}/permissions/{requestId}";
        let path = "/sessions/sess_1/permissions/perm_2";
        assert_eq!(session_in(route, path), Some("sess_1"));
        assert_eq!(session_in("/sessions/{id}", "/sessions/s"), Some("s"));
        assert_eq!(session_in("/sessions", "/sessions"), None);
        assert_eq!(session_in("/webhooks/{id}", "/webhooks/w"), None);
        assert_eq!(session_in("-", "/nowhere"), None);
    }
}
