//! Prometheus metrics through the `metrics` facade and `metrics-exporter-prometheus`: the
//! recorder (installed once per process), the HTTP middleware that counts and times every
//! request by route and status, and the names shared by the places that record. OpenTelemetry
//! traces are `traces.rs`'s.

pub mod traces;

use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics::Label;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Latency buckets in seconds, for HTTP requests and upstream calls.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

/// The process's recorder; the first call installs it.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets(&BUCKETS)
            .expect("static buckets are valid")
            .install_recorder()
            .expect("the metrics recorder is installed once, here");
        describe();
        handle
    })
}

fn describe() {
    metrics::describe_counter!(
        "acp_gateway_http_requests_total",
        "HTTP requests answered, by method, route and status."
    );
    metrics::describe_histogram!(
        "acp_gateway_http_request_duration_seconds",
        metrics::Unit::Seconds,
        "Time to the response head, by method and route (streams: until they start)."
    );
    metrics::describe_histogram!(
        "acp_gateway_upstream_call_duration_seconds",
        metrics::Unit::Seconds,
        "JSON-RPC calls to the agents, by method and outcome (ok, error, timeout, closed)."
    );
}

/// Counts and times a request by method, matched route (`unmatched` for unknown paths) and
/// status. Outermost but for CORS, so 401 and 429 answers are counted too.
pub async fn http_metrics(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let mut labels = vec![
        Label::new("method", req.method().as_str().to_owned()),
        Label::new("route", route),
    ];
    let response = next.run(req).await;
    metrics::histogram!("acp_gateway_http_request_duration_seconds", labels.clone())
        .record(started.elapsed());
    labels.push(Label::new("status", response.status().as_u16().to_string()));
    metrics::counter!("acp_gateway_http_requests_total", labels).increment(1);
    response
}

/// Records one upstream call's latency.
pub fn upstream_call(method: &str, outcome: &'static str, elapsed: std::time::Duration) {
    metrics::histogram!(
        "acp_gateway_upstream_call_duration_seconds",
        "method" => method.to_owned(),
        "outcome" => outcome
    )
    .record(elapsed);
}
