//! Fuzzes the decoder of the agent's stdout lines (`acp::parse_line`): any bytes an agent
//! writes must give a message or a reason, never a panic, and a message must be what the
//! line says — as the gateway holds it: a lone surrogate escape, and a U+10FFFF, in the
//! gateway's own escape (`surrogates::escape`); a notification's head (its `sessionId` and
//! `update.sessionUpdate`) what a parse into a value finds there.
#![no_main]

use acp_gateway::agent_rpc::{Inbound, parse_line};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = parse_line(line);
    let held = acp_gateway::surrogates::escape(line);
    // JSON by its grammar; a number past f64's range (`1e999`) is JSON too, which serde_json
    // reads as such only when it skips it, not into a `Value`.
    if serde_json::from_str::<&serde_json::value::RawValue>(&held).is_err() {
        assert!(parsed.is_err(), "not JSON, yet parsed: {line:?}");
        return;
    }
    let Ok(json) = serde_json::from_str::<Value>(&held) else {
        return;
    };
    let Ok(inbound) = parsed else {
        return;
    };
    assert_eq!(json["jsonrpc"], "2.0", "{line:?}");
    match inbound {
        Inbound::Response { id, .. } => {
            assert_eq!(json["id"].as_u64(), Some(id));
            assert!(json.get("method").and_then(Value::as_str).is_none());
        }
        Inbound::Notification { method, head, .. } => {
            assert_eq!(json["method"].as_str(), Some(method.as_str()));
            assert!(json.get("id").is_none_or(Value::is_null));
            let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
            assert_eq!(head.session_id, text(json["params"].get("sessionId")), "{line:?}");
            assert_eq!(head.kind, text(json["params"].pointer("/update/sessionUpdate")), "{line:?}");
        }
        Inbound::Request { id, method, .. } => {
            assert_eq!(json["method"].as_str(), Some(method.as_str()));
            assert_eq!(json["id"], id);
        }
    }
});
