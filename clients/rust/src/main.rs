//! Smoke test of the Rust client that openapi-generator makes from openapi/openapi.json. Run by
//! scripts/clients.sh against a live gateway in front of the echo agent (modes and models on,
//! webhooks to loopback allowed, with a max age of about a second):
//!     acp-gateway-client-smoke http://127.0.0.1:PORT
//! It drives a session through the generated API, then checks that the generated types decode
//! every event into its own variant: each event of the session's history page (compared with the
//! same page read as plain JSON), and each event of `GET /events` (read as SSE). Exits non-zero
//! on the first mismatch.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use acp_gateway_client::apis::configuration::Configuration;
use acp_gateway_client::apis::{events_api, sessions_api, turns_api, webhooks_api};
use acp_gateway_client::models::{
    CreateSession, CreateWebhook, ElicitationAnswer, ElicitationReply, KnownSessionEvent,
    LifecycleEvent, PatchSession, PermissionAnswer, PromptBody, SessionEvent, SetMode, Status,
};
use serde_json::{Value, json};

/// The session's prompts, in order.
const PROMPTS: [&str; 3] = ["/state /unknown hi", "/permission go", "/elicit"];

fn main() {
    let base = std::env::args()
        .nth(1)
        .expect("usage: acp-gateway-client-smoke URL");
    let mut config = Configuration::new();
    config.base_path = base.trim_end_matches('/').to_owned();

    // A subscription that can never be delivered: it is disabled once its first delivery is
    // older than the gateway's --webhook-max-age, which logs `webhook_disabled`.
    let hook = webhooks_api::create_webhook(
        &config,
        CreateWebhook::new(
            vec!["turn_started".into()],
            "http://127.0.0.1:9/hook".into(),
        ),
        None,
    )
    .expect("create a webhook");

    let cwd = std::env::temp_dir().to_string_lossy().into_owned();
    let new = CreateSession {
        cwd: Some(Some(cwd)),
        ..CreateSession::new()
    };
    let session = sessions_api::create_session(&config, new, None).expect("create a session");
    let id = session.session_id.clone();
    sessions_api::set_session_mode(&config, &id, SetMode::new("code".into()))
        .expect("set the mode");
    assert_eq!(prompt(&config, &id, PROMPTS[0]), "end_turn");
    // Turns that ask the client, answered through the generated API while the prompt waits.
    let asked = std::thread::scope(|scope| {
        let turn = scope.spawn(|| prompt(&config, &id, PROMPTS[1]));
        let request = pending(|| turns_api::list_permissions(&config, &id).ok()?.pop());
        let mut answer = PermissionAnswer::new();
        answer.option_id = Some(Some("allow".into()));
        turns_api::answer_permission(&config, &id, &request.request_id, answer, None)
            .expect("answer the permission");
        turn.join().unwrap()
    });
    assert_eq!(asked, "end_turn");
    let asked = std::thread::scope(|scope| {
        let turn = scope.spawn(|| prompt(&config, &id, PROMPTS[2]));
        let request = pending(|| turns_api::list_elicitations(&config, &id).ok()?.pop());
        let mut answer = ElicitationAnswer::new(ElicitationReply::Accept);
        answer.content = Some(Some(json!({"name": "Ada", "age": 36})));
        turns_api::answer_elicitation(&config, &id, &request.request_id, answer, None)
            .expect("answer the elicitation");
        turn.join().unwrap()
    });
    assert_eq!(asked, "end_turn");
    let mut patch = PatchSession::new();
    patch.title = Some(Some("typed".into()));
    sessions_api::update_session(&config, &id, patch).expect("set the title");

    let history = history_events(&config, &base, &id);

    sessions_api::close_session(&config, &id, None).expect("close the session");
    sessions_api::delete_session(&config, &id).expect("delete the session");
    let lifecycle = lifecycle_events(&base, &id, &hook.id);
    println!(
        "rust client: {} history events and {} lifecycle events decoded into their own variants",
        history, lifecycle
    );
}

/// Prompts the session with `text` and returns the turn's stop reason.
fn prompt(config: &Configuration, id: &str, text: &str) -> String {
    let mut body = PromptBody::new();
    body.text = Some(Some(text.into()));
    turns_api::prompt_session(config, id, body, None, None)
        .unwrap_or_else(|e| panic!("prompt {text:?}: {e}"))
        .stop_reason
}

/// What `next` gives once it gives something, within 30 s.
fn pending<T>(next: impl Fn() -> Option<T>) -> T {
    for _ in 0..600 {
        if let Some(found) = next() {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing pending after 30 s");
}

/// Reads the session's history page through the generated client and as plain JSON, checks that
/// each event decoded into the variant of its `event`, and returns how many there were.
fn history_events(config: &Configuration, base: &str, id: &str) -> usize {
    let page = events_api::get_session_history(config, id, None, Some(1000)).expect("history");
    let raw: Value = reqwest::blocking::get(format!("{base}/sessions/{id}/history?limit=1000"))
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.json())
        .expect("the history as JSON");
    let raw = raw["events"].as_array().expect("events");
    assert_eq!(page.events.len(), raw.len(), "the typed page lost events");
    let mut seen = Vec::new();
    for (typed, raw) in page.events.iter().zip(raw) {
        let (event, seq, known) = session_kind(typed);
        assert_eq!(json!(event), raw["event"], "seq {seq}: wrong variant");
        assert_eq!(json!(seq), raw["seq"]);
        // A listed kind that fails to decode as its own type would land in the fallback.
        assert_eq!(
            known,
            KNOWN.contains(&event),
            "seq {seq}: {event} decoded as {}",
            if known {
                "a listed kind"
            } else {
                "OtherSessionEvent"
            }
        );
        seen.push(event);
    }
    // Every kind this session's turn logs, and the agent's kinds the document does not list.
    for kind in [
        "state_changed",
        "turn_started",
        "permission_requested",
        "permission_resolved",
        "elicitation_requested",
        "elicitation_resolved",
        "available_commands_update",
        "plan",
        "usage_update",
        "_echo/status",
        "future_variant_x",
        "agent_message_chunk",
        "turn_ended",
    ] {
        assert!(seen.contains(&kind), "no {kind} in the history: {seen:?}");
    }
    // The typed payloads, not only the variants.
    for event in &page.events {
        match event {
            SessionEvent::KnownSessionEvent(known) => match known.as_ref() {
                KnownSessionEvent::TurnStarted(e) => {
                    assert_eq!(e.data.session_id, id);
                    let text = e.data.prompt[0]["text"].as_str().unwrap_or_default();
                    assert!(PROMPTS.contains(&text), "turn_started with {text:?}");
                    assert!(e.created_at.is_some(), "a history event has its createdAt");
                }
                KnownSessionEvent::TurnEnded(e) => {
                    assert_eq!(e.data.stop_reason, Some(Some("end_turn".into())));
                }
                KnownSessionEvent::AgentMessageChunk(e) => {
                    assert_eq!(e.data.update["sessionUpdate"], "agent_message_chunk");
                }
                KnownSessionEvent::PermissionResolved(e) => {
                    assert_eq!(e.data.reason, "answered");
                    assert_eq!(e.data.outcome["optionId"], "allow");
                }
                KnownSessionEvent::ElicitationResolved(e) => {
                    assert_eq!(e.data.action, "accept");
                    assert_eq!(
                        e.data.content,
                        Some(Some(json!({"name": "Ada", "age": 36})))
                    );
                }
                _ => {}
            },
            SessionEvent::OtherSessionEvent(e) => {
                assert!(e.data.is_some(), "{}: no data", e.event);
            }
        }
    }
    page.events.len()
}

/// `KNOWN`, the kinds `KnownSessionEvent` has a variant for, and `session_kind`: the `event` name
/// a decoded session event's variant stands for, its `seq`, and whether it is a listed kind.
macro_rules! known_kinds {
    ($($variant:ident => $name:literal),* $(,)?) => {
        const KNOWN: &[&str] = &[$($name),*];

        fn session_kind(event: &SessionEvent) -> (&str, i64, bool) {
            match event {
                SessionEvent::OtherSessionEvent(e) => (e.event.as_str(), e.seq, false),
                SessionEvent::KnownSessionEvent(k) => match k.as_ref() {
                    $(KnownSessionEvent::$variant(x) => ($name, x.seq, true),)*
                },
            }
        }
    };
}

known_kinds!(
    TurnStarted => "turn_started",
    TurnEnded => "turn_ended",
    PermissionRequested => "permission_requested",
    PermissionResolved => "permission_resolved",
    ElicitationRequested => "elicitation_requested",
    ElicitationResolved => "elicitation_resolved",
    ElicitationCompleted => "elicitation_completed",
    SessionDeleted => "session_deleted",
    AgentExited => "agent_exited",
    StateChanged => "state_changed",
    Forked => "forked",
    WorkspaceChanged => "workspace_changed",
    PromptQueued => "prompt_queued",
    PromptWithdrawn => "prompt_withdrawn",
    Gap => "gap",
    State => "state",
    UserMessageChunk => "user_message_chunk",
    AgentMessageChunk => "agent_message_chunk",
    AgentThoughtChunk => "agent_thought_chunk",
    ToolCall => "tool_call",
    ToolCallUpdate => "tool_call_update",
    Plan => "plan",
    AvailableCommandsUpdate => "available_commands_update",
    CurrentModeUpdate => "current_mode_update",
    ConfigOptionUpdate => "config_option_update",
    SessionInfoUpdate => "session_info_update",
    UsageUpdate => "usage_update",
    PromptSuggestionsUpdate => "prompt_suggestions_update",
);

/// Reads `GET /events` from the start until the session is deleted and the webhook disabled,
/// decodes each SSE event (`id`, `event`, `data`) with the generated `LifecycleEvent`, checks
/// its variant, and returns how many there were.
fn lifecycle_events(base: &str, id: &str, webhook: &str) -> usize {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let response = client
        .get(format!("{base}/events?after=0"))
        .send()
        .and_then(|r| r.error_for_status())
        .expect("GET /events");
    let mut lines = BufReader::new(response).lines();
    let (mut count, mut seen) = (0, Vec::new());
    let (mut deleted, mut disabled) = (false, false);
    while !(deleted && disabled) {
        let mut fields = json!({});
        for line in lines.by_ref() {
            let line = line.expect("the stream ended before the session was deleted");
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                fields[name] = value.strip_prefix(' ').unwrap_or(value).into();
            }
        }
        let Some(event) = fields["event"].as_str().map(str::to_owned) else {
            continue; // a comment (keep-alive)
        };
        let decoded = json!({
            "seq": fields["id"].as_str().expect("an id").parse::<i64>().unwrap(),
            "event": event,
            "data": serde_json::from_str::<Value>(fields["data"].as_str().unwrap()).unwrap(),
        });
        let typed: LifecycleEvent = serde_json::from_value(decoded.clone())
            .unwrap_or_else(|e| panic!("{event}: does not decode: {e}: {decoded}"));
        let (name, session) = match &typed {
            LifecycleEvent::SessionCreated(e) => {
                assert_eq!(e.data.session.session_id, e.data.session_id);
                ("session_created", e.data.session_id.as_str())
            }
            LifecycleEvent::SessionUpdated(e) => ("session_updated", e.data.session_id.as_str()),
            LifecycleEvent::SessionStatus(e) => {
                if e.data.session_id == id && e.data.status == Status::Saved {
                    seen.push("session_status saved");
                }
                ("session_status", e.data.session_id.as_str())
            }
            LifecycleEvent::SessionDeleted(e) => ("session_deleted", e.data.session_id.as_str()),
            LifecycleEvent::WebhookDisabled(e) => {
                disabled |= e.data.webhook_id == webhook;
                ("webhook_disabled", e.data.session_id.as_str())
            }
            LifecycleEvent::WatchersChanged(e) => {
                let streams: i32 = e.data.watchers.iter().map(|w| w.streams).sum();
                assert!(streams >= 0, "{decoded}");
                ("watchers_changed", e.data.session_id.as_str())
            }
            LifecycleEvent::UsageBudget(e) => {
                assert!(e.data.percent == 80 || e.data.percent == 100, "{decoded}");
                ("usage_budget", e.data.session_id.as_str())
            }
        };
        assert_eq!(name, event, "wrong variant for {decoded}");
        if session == id {
            seen.push(name);
            deleted |= name == "session_deleted";
        }
        count += 1;
    }
    for kind in [
        "session_created",
        "session_updated",
        "session_status saved",
        "webhook_disabled",
        "session_deleted",
    ] {
        assert!(seen.contains(&kind), "no {kind} for the session: {seen:?}");
    }
    count
}
