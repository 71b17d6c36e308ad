//! No input gets a 500, on either store: every operation of the committed spec is sent its own
//! request example with each string in turn replaced by one holding U+0000, by a lone UTF-16
//! surrogate and by an empty string, and every query parameter a NUL, against real sessions
//! and webhooks. Every answer is below 500, valid UTF-8 JSON where it is JSON, and the log
//! holds no ERROR line. A title holding U+0000 that the agent sends back is kept as it came.

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::*;

both_backends!(no_input_gets_a_500);

/// The committed spec.
fn spec() -> Value {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
            .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The request example of an operation (its body schema's `example`), if it takes a body.
fn body_example(spec: &Value, op: &Value) -> Option<Value> {
    let schema = op.pointer("/requestBody/content/application~1json/schema")?;
    let schema = match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => spec.pointer(&r[1..]).unwrap(),
        None => schema,
    };
    schema.get("example").cloned().or(Some(json!({})))
}

/// The JSON pointers of every string in `v`.
fn strings(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::String(_) => out.push(at),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                strings(item, format!("{at}/{i}"), out);
            }
        }
        Value::Object(fields) => {
            for (k, item) in fields {
                strings(
                    item,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        _ => {}
    }
}

/// `example` as JSON text with the string at `pointer` replaced by `text` (JSON, quoted).
fn with_string(example: &Value, pointer: &str, text: &str) -> String {
    const MARK: &str = "\u{E000}hostile\u{E000}";
    let mut v = example.clone();
    *v.pointer_mut(pointer).unwrap() = Value::String(MARK.into());
    v.to_string().replace(&format!("\"{MARK}\""), text)
}

async fn send(
    gw: &Gateway,
    method: &str,
    path: &str,
    body: Option<String>,
) -> (u16, Vec<u8>, String) {
    let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
    let mut req = gw.http.request(method, gw.url(path));
    if let Some(body) = body {
        req = req.header("content-type", "application/json").body(body);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let kind = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, r.bytes().await.unwrap().to_vec(), kind)
}

async fn no_input_gets_a_500(backend: Backend) {
    // A registry of the test's own, empty: nothing is fetched from the official one.
    let registry = tempfile::tempdir().unwrap();
    let index = registry.path().join("registry.json");
    std::fs::write(&index, r#"{"version": "1.0.0", "agents": []}"#).unwrap();
    let opts = Options::default()
        .args(&["--registry", index.to_str().unwrap()])
        .env(
            "ECHO_AGENT_CAPS",
            "load,list,delete,resume,close,status,title,archive,fork,logout",
        )
        .env("ECHO_AGENT_CONTROLS", "modes,models,options");
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let session = gw.create("/tmp").await;
    let hook = json!({"url": "https://hooks.example/acp", "events": ["*"]});
    let made = gw
        .send_expecting(Method::POST, "/webhooks", hook, 201)
        .await;
    let webhook = made["id"].as_str().unwrap().to_owned();

    let spec = spec();
    let mut sent = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let streams = path.ends_with("/events");
            let concrete = path
                .replace("/sessions/{id}", &format!("/sessions/{session}"))
                .replace("/webhooks/{id}", &format!("/webhooks/{webhook}"))
                .replace("{requestId}", "perm_0123")
                .replace("{configId}", "effort")
                .replace("{deliveryId}", "1")
                .replace("{name}", "default")
                .replace("{file}", "app.js");
            let mut requests: Vec<(String, Option<String>)> = Vec::new();
            for param in op["parameters"].as_array().into_iter().flatten() {
                if param["in"] == "query" {
                    let name = param["name"].as_str().unwrap();
                    requests.push((format!("{concrete}?{name}=a%00b"), None));
                    requests.push((format!("{concrete}?{name}=%ED%A0%80"), None));
                }
            }
            if !streams {
                match body_example(&spec, op) {
                    Some(example) => {
                        let mut pointers = Vec::new();
                        strings(&example, String::new(), &mut pointers);
                        for pointer in &pointers {
                            for text in [r#""x\u0000y""#, r#""x\ud800y""#, r#""""#] {
                                requests.push((
                                    concrete.clone(),
                                    Some(with_string(&example, pointer, text)),
                                ));
                            }
                        }
                        requests.push((concrete.clone(), Some(example.to_string())));
                    }
                    None => requests.push((concrete.clone(), None)),
                }
            }
            for (url, body) in requests {
                let (status, answer, kind) = send(gw, method, &url, body.clone()).await;
                sent += 1;
                assert!(
                    status < 500,
                    "{method} {url} {body:?} answered {status}: {}",
                    String::from_utf8_lossy(&answer)
                );
                let text = std::str::from_utf8(&answer)
                    .unwrap_or_else(|e| panic!("{method} {url}: not UTF-8: {e}"));
                if kind.contains("json") && !text.is_empty() {
                    let parsed: Result<Value, _> = serde_json::from_str(text);
                    assert!(
                        parsed.is_ok(),
                        "{method} {url} {body:?}: not JSON a strict parser takes: {text}"
                    );
                }
            }
        }
    }
    assert!(sent > 100, "only {sent} requests");

    // A title with U+0000 goes to the agent (`session/set_title`), which sends it back in a
    // `session_info_update`: what is stored and served is what it sent.
    let fresh = gw.create("/tmp").await;
    let path = format!("/sessions/{fresh}");
    let title = json!({"title": "nul\u{0}title"});
    gw.send_expecting(Method::PATCH, &path, title, 200).await;
    w.gw()
        .wait_until(|g| {
            let path = format!("/sessions/{fresh}");
            async move { g.json(&path).await["title"] == "nul\u{0}title" }
        })
        .await;
    let listed = gw.json("/sessions?limit=100").await;
    assert!(
        listed.to_string().contains(r#""nul\u0000title""#),
        "{listed}"
    );
    let log = w.log();
    assert!(!log.contains(" ERROR "), "{log}");
    w.finish().await;
}
