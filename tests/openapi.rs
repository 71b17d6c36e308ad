//! The committed `openapi/openapi.json` is the document the router generates.
//! Regenerate with `UPDATE_OPENAPI=1 cargo test --test integration openapi::`.

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
        "openapi/openapi.json is stale: run `UPDATE_OPENAPI=1 cargo test --test integration openapi::` and commit it"
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
            assert!(
                responses.keys().any(|k| k.starts_with('4')),
                "{method} {route} documents no 4xx"
            );
        }
    }
}

/// Lint rules for clients generated from the spec: stable camelCase operationIds, a tag and a
/// one-line summary on every operation, an example on every request and JSON response body,
/// and every error answered as problem+json with the `Problem` schema.
#[test]
fn spec_lint() {
    let doc = serde_json::to_value(acp_gateway::api::openapi()).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let mut ids = std::collections::HashSet::new();
    for (route, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let at = format!("{method} {route}");
            let id = op["operationId"].as_str().unwrap_or_default();
            assert!(
                id.len() > 2
                    && id.chars().next().unwrap().is_ascii_lowercase()
                    && id.chars().all(|c| c.is_ascii_alphanumeric()),
                "{at}: operationId {id:?} is not camelCase"
            );
            assert!(ids.insert(id.to_owned()), "{at}: operationId {id} repeated");
            assert!(
                op["tags"].as_array().is_some_and(|t| !t.is_empty()),
                "{at}: no tag"
            );
            let summary = op["summary"].as_str().unwrap_or_default();
            assert!(
                !summary.is_empty() && summary.len() <= 100 && !summary.contains('\n'),
                "{at}: summary must be one short line: {summary:?}"
            );
            if let Some(body) = op.get("requestBody") {
                let content = body["content"].as_object().unwrap();
                let media = content.get("application/json").unwrap_or_else(|| {
                    let (_, media) = content.iter().next().unwrap();
                    media
                });
                let schema = media["schema"]["$ref"].as_str().unwrap_or_default();
                let name = schema.rsplit('/').next().unwrap();
                assert!(
                    media.get("example").is_some()
                        || doc["components"]["schemas"][name].get("example").is_some(),
                    "{at}: request body has no example"
                );
            }
            for (status, response) in op["responses"].as_object().unwrap() {
                for media in response["content"].as_object().into_iter().flatten() {
                    let schema = media.1["schema"]["$ref"].as_str().unwrap_or_default();
                    if media.0.ends_with("json") && !schema.is_empty() {
                        let name = schema.rsplit('/').next().unwrap();
                        assert!(
                            doc["components"]["schemas"][name].get("example").is_some(),
                            "{at} {status}: response schema {name} has no example"
                        );
                    }
                }
                if status.starts_with('4') || status.starts_with('5') {
                    let problem = &response["content"]["application/problem+json"]["schema"];
                    assert_eq!(
                        problem["$ref"], "#/components/schemas/Problem",
                        "{at} {status}: not a problem+json Problem"
                    );
                }
            }
        }
    }
}

/// Every example in the document is valid against the schema it illustrates (JSON Schema
/// 2020-12, with the document's `$ref`s): a schema's `example` and `examples`, and a media
/// type's or a parameter's `example` and `examples` against its `schema`. Generators and mock
/// servers serve examples as truth.
#[test]
fn every_example_matches_its_schema() {
    let doc = serde_json::to_value(acp_gateway::api::openapi()).unwrap();
    let mut examples = Vec::new();
    collect_examples(&doc, String::new(), &mut examples);
    // Every request and JSON response body has one (spec_lint), so a walk that finds few is
    // broken.
    assert!(
        examples.len() >= 20,
        "only {} examples found: is the walk broken?",
        examples.len()
    );
    let mut invalid = Vec::new();
    for (pointer, example) in &examples {
        // The whole document is the schema root (its own keys are unknown keywords, ignored), so
        // every `#/components/schemas/…` resolves; `$ref` picks the schema to check.
        let mut root = doc.clone();
        root["$ref"] = format!("#{pointer}").into();
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&root)
            .unwrap_or_else(|e| panic!("#{pointer}: not a schema: {e}"));
        for error in validator.iter_errors(example) {
            invalid.push(format!(
                "#{pointer}: {error} (at {})",
                error.instance_path()
            ));
        }
    }
    assert!(
        invalid.is_empty(),
        "invalid examples:\n{}",
        invalid.join("\n")
    );
}

/// The examples under `node` (at JSON pointer `at`, URI-fragment encoded), each with the pointer
/// of the schema it illustrates.
fn collect_examples(
    node: &serde_json::Value,
    at: String,
    out: &mut Vec<(String, serde_json::Value)>,
) {
    let Some(object) = node.as_object() else {
        if let Some(items) = node.as_array() {
            for (i, item) in items.iter().enumerate() {
                collect_examples(item, format!("{at}/{i}"), out);
            }
        }
        return;
    };
    // A media type or a parameter names its schema; a schema illustrates itself.
    let schema = if object.contains_key("schema") {
        format!("{at}/schema")
    } else {
        at.clone()
    };
    if let Some(example) = object.get("example") {
        out.push((schema.clone(), example.clone()));
    }
    match object.get("examples") {
        Some(serde_json::Value::Array(list)) => {
            out.extend(list.iter().map(|e| (schema.clone(), e.clone())));
        }
        Some(serde_json::Value::Object(named)) => {
            out.extend(named.values().map(|e| (schema.clone(), e["value"].clone())));
        }
        _ => {}
    }
    for (key, value) in object {
        if key != "example" && key != "examples" {
            collect_examples(value, format!("{at}/{}", fragment(key)), out);
        }
    }
}

/// `key` as a JSON pointer token inside a URI fragment.
fn fragment(key: &str) -> String {
    key.replace('~', "~0")
        .replace('/', "~1")
        .replace('{', "%7B")
        .replace('}', "%7D")
}
