//! The committed `openapi/openapi.json` is the document the router generates.
//! Regenerate with `UPDATE_OPENAPI=1 cargo test --test openapi`.

use std::path::PathBuf;

#[test]
fn committed_openapi_is_current() {
    let generated = serde_json::to_string_pretty(&acp_gateway::api::openapi()).unwrap() + "\n";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("openapi/openapi.json");
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/openapi.json is stale: run `UPDATE_OPENAPI=1 cargo test --test openapi` and commit it"
    );
}

#[test]
fn every_route_documents_its_errors() {
    let doc = serde_json::to_value(acp_gateway::api::openapi()).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for route in [
        "/sessions",
        "/sessions/{id}",
        "/sessions/{id}/status",
        "/sessions/{id}/prompt",
        "/sessions/{id}/cancel",
        "/sessions/{id}/resume",
        "/sessions/{id}/close",
        "/sessions/{id}/permissions",
        "/sessions/{id}/permissions/{requestId}",
        "/sessions/{id}/events",
        "/sessions/{id}/history",
        "/events",
        "/agent",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/docs",
    ] {
        assert!(
            paths.contains_key(route),
            "{route} is missing from the spec"
        );
    }
    for (route, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            assert!(!responses.is_empty(), "{method} {route} has no responses");
            if route.contains("{id}") {
                assert!(
                    responses.keys().any(|k| k.starts_with('4')),
                    "{method} {route} documents no 4xx"
                );
            }
        }
    }
}
