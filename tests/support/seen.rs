//! Two tenants' keys and what each reads of a gateway, to compare two gateways' stores: its
//! sessions (without what moves by itself), each one's whole history, its webhooks with what
//! their outbox holds, and its usage; where two such readings first differ; and one `GET` as
//! it came (status, media type, body).

use reqwest::Method;
use serde_json::{Value, json};

use super::gateway::Gateway;
use super::world::Options;

/// Ann of tenant acme's key, and Dee of tenant globex's.
pub const ACME: &str = "acme-key-0123456789a";
pub const GLOBEX: &str = "globex-key-012345678";

/// A gateway with [`ACME`] and [`GLOBEX`], webhooks to loopback allowed, and an echo agent
/// that reports what its turns cost.
pub fn two_tenants() -> Options {
    Options::default()
        .args(&[
            "--api-key",
            &format!("acme/ann:{ACME}"),
            "--api-key",
            &format!("globex/dee:{GLOBEX}"),
            "--webhook-allow-private",
        ])
        .env("ECHO_AGENT_COST", "0.01 USD")
}

/// `GET path` with `key` (none: no `Authorization`) and `accept`: the status, the content type
/// and the body's text.
pub async fn get_as(
    gw: &Gateway,
    key: Option<&str>,
    path: &str,
    accept: &str,
) -> (u16, String, String) {
    let mut req = gw.http.get(gw.url(path)).header("accept", accept);
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let media = r
        .headers()
        .get("content-type")
        .map_or("", |v| v.to_str().unwrap())
        .to_owned();
    (status, media, r.text().await.unwrap())
}

/// Everything a tenant's key reads of the gateway: its sessions, each one's whole history,
/// its webhooks with their deliveries, and its usage.
pub async fn seen(gw: &Gateway, key: &str) -> Value {
    let k = gw.with_key(Some(key));
    let list = k
        .send_expecting(Method::GET, "/sessions?limit=200", None, 200)
        .await;
    let mut sessions = Vec::new();
    for s in list["sessions"].as_array().unwrap() {
        let id = s["sessionId"].as_str().unwrap();
        let mut events = Vec::new();
        let mut after = 0;
        loop {
            let path = format!("/sessions/{id}/history?after={after}&limit=1000");
            let page = k.send_expecting(Method::GET, &path, None, 200).await;
            events.extend(page["events"].as_array().unwrap().iter().cloned());
            match page["nextAfter"].as_i64() {
                Some(next) => after = next,
                None => break,
            }
        }
        let mut session = s.clone();
        // Live, and what a list sync of the gateway started on the store may move.
        for volatile in ["status", "activity", "updatedAt"] {
            session.as_object_mut().unwrap().remove(volatile);
        }
        sessions.push(json!({"session": session, "events": events}));
    }
    let hooks = k.send_expecting(Method::GET, "/webhooks", None, 200).await;
    let mut deliveries = Vec::new();
    for hook in hooks.as_array().unwrap() {
        let path = format!(
            "/webhooks/{}/deliveries?limit=200",
            hook["id"].as_str().unwrap()
        );
        let page = k.send_expecting(Method::GET, &path, None, 200).await;
        // What was to be delivered; the attempts go on after the move.
        let mut listed: Vec<Value> = page["deliveries"].as_array().unwrap().clone();
        for d in &mut listed {
            d.as_object_mut().unwrap().retain(|k, _| {
                ["id", "messageId", "sessionId", "seq", "event", "createdAt"].contains(&k.as_str())
            });
        }
        deliveries.push(Value::Array(listed));
    }
    let usage = k
        .send_expecting(Method::GET, "/usage?groupBy=session", None, 200)
        .await;
    json!({"sessions": sessions, "webhooks": hooks, "deliveries": deliveries, "usage": usage})
}

/// Where `a` and `b` first differ (`None`: nowhere), to say it in a line.
pub fn differ(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys = x.keys().chain(y.keys());
            keys.filter_map(|k| {
                differ(
                    &x.get(k).cloned().unwrap_or(Value::Null),
                    &y.get(k).cloned().unwrap_or(Value::Null),
                    &format!("{at}.{k}"),
                )
            })
            .next()
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => (x.iter().zip(y))
            .enumerate()
            .find_map(|(i, (x, y))| differ(x, y, &format!("{at}[{i}]"))),
        (Value::Array(x), Value::Array(y)) => {
            Some(format!("{at}: {} items, then {}", x.len(), y.len()))
        }
        (x, y) if x == y => None,
        (x, y) => Some(format!("{at}: {x} then {y}")),
    }
}

/// Asserts that the stores show the same.
pub fn assert_same(before: &(Value, Value), after: &(Value, Value)) {
    let (a, b) = (json!([before.0, before.1]), json!([after.0, after.1]));
    if let Some(difference) = differ(&a, &b, "") {
        panic!("not the same: {difference}");
    }
}
