//! A session's log as a Markdown transcript (`GET /sessions/{id}/export` with
//! `Accept: text/markdown`): the prompts with their authors, the agent's answers and thoughts,
//! its tool calls with their diffs and output, the plan, the permission requests and who
//! answered them, the ends of turns and the agent's exits. Written event by event, so a log of
//! any length is rendered holding one event and the kind of the paragraph it continues.

use std::fmt::Write as _;

use serde_json::Value;

use super::output::SessionView;
use crate::store::{EventKind, StoredEvent};

/// The paragraph the last event left open: consecutive chunks of one kind join into one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Nothing,
    Answer,
    Thought,
    User,
}

/// A transcript being written.
pub struct Markdown {
    open: Open,
}

impl Markdown {
    /// The transcript's title and what it is of; its events follow.
    pub fn start(session: &SessionView) -> (Markdown, String) {
        let mut out = String::new();
        let title = session.title.as_deref().unwrap_or("Untitled session");
        let _ = writeln!(out, "# {}\n", one_line(title));
        let _ = writeln!(out, "- Session: `{}`", session.session_id);
        let _ = writeln!(out, "- Agent: {}", session.agent);
        let _ = writeln!(out, "- Folder: `{}`", session.cwd);
        let _ = writeln!(out, "- Created: {}", session.created_at.to_rfc3339());
        if let Some(owner) = &session.owner {
            let _ = writeln!(out, "- Owner: {}", who(&serde_json::json!(owner)));
        }
        (
            Markdown {
                open: Open::Nothing,
            },
            out,
        )
    }

    /// `event`'s part of the transcript (often empty: what a reader does not follow).
    pub fn event(&mut self, event: &StoredEvent) -> String {
        let Some(kind) = EventKind::parse(&event.kind) else {
            return String::new();
        };
        let data = event.payload.to_value();
        let update = &data["update"];
        let mut out = String::new();
        match kind {
            EventKind::AgentMessageChunk => self.chunk(&mut out, Open::Answer, update),
            EventKind::AgentThoughtChunk => self.chunk(&mut out, Open::Thought, update),
            EventKind::UserMessageChunk => self.chunk(&mut out, Open::User, update),
            _ => {
                out.push_str(&self.close());
                block(&mut out, kind, &data, event);
            }
        }
        out
    }

    /// Whatever the last event left open, closed.
    pub fn close(&mut self) -> String {
        let was = std::mem::replace(&mut self.open, Open::Nothing);
        match was {
            Open::Nothing => String::new(),
            Open::Thought => "\n\n</details>\n\n".into(),
            Open::Answer | Open::User => "\n\n".into(),
        }
    }

    fn chunk(&mut self, out: &mut String, open: Open, update: &Value) {
        if self.open != open {
            out.push_str(&self.close());
            out.push_str(match open {
                Open::Answer => "**Agent:**\n\n",
                Open::Thought => "<details><summary>Thinking</summary>\n\n",
                _ => "**User:**\n\n",
            });
            self.open = open;
        }
        out.push_str(&content_text(&update["content"]));
    }
}

/// The part of an event that stands on its own.
fn block(out: &mut String, kind: EventKind, data: &Value, event: &StoredEvent) {
    let update = &data["update"];
    let at = event.created_at.format("%Y-%m-%d %H:%M:%S UTC");
    match kind {
        EventKind::TurnStarted => {
            let _ = writeln!(out, "---\n\n## Prompt by {} · {at}\n", who(&data["author"]));
            for item in data["prompt"].as_array().into_iter().flatten() {
                let _ = writeln!(out, "{}\n", content_text(item));
            }
        }
        EventKind::TurnEnded => match data.get("error").filter(|e| !e.is_null()) {
            Some(e) => {
                let title = e["title"].as_str().unwrap_or("error");
                let detail = e["detail"].as_str().unwrap_or("");
                let _ = writeln!(out, "*The turn failed: {title}. {}*\n", one_line(detail));
            }
            None => {
                let reason = data["stopReason"].as_str().unwrap_or("end_turn");
                let _ = writeln!(out, "*Turn ended: {reason}.*\n");
            }
        },
        EventKind::ToolCall | EventKind::ToolCallUpdate => tool_call(out, kind, update),
        EventKind::Plan => {
            out.push_str("**Plan:**\n\n");
            for entry in update["entries"].as_array().into_iter().flatten() {
                let done = if entry["status"] == "completed" {
                    "x"
                } else {
                    " "
                };
                let content = entry["content"].as_str().unwrap_or("");
                let _ = writeln!(out, "- [{done}] {}", one_line(content));
            }
            out.push('\n');
        }
        EventKind::PermissionRequested => {
            let call = &data["request"]["toolCall"];
            let title = call["title"].as_str().unwrap_or("a tool call");
            let options: Vec<&str> = data["request"]["options"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| o["name"].as_str())
                .collect();
            let _ = writeln!(
                out,
                "**Permission asked** for {}: {}\n",
                one_line(title),
                options.join(" / ")
            );
        }
        EventKind::PermissionResolved => {
            let outcome = &data["outcome"];
            let chose = outcome["optionId"]
                .as_str()
                .or(outcome["outcome"].as_str())
                .unwrap_or("no answer");
            let reason = data["reason"].as_str().unwrap_or("");
            let by = match data.get("answeredBy").filter(|a| !a.is_null()) {
                Some(author) => format!(" by {}", who(author)),
                None => String::new(),
            };
            let _ = writeln!(out, "**Permission answered**{by}: `{chose}` ({reason})\n");
        }
        EventKind::ElicitationRequested => {
            let message = data["request"]["message"].as_str().unwrap_or("");
            let _ = writeln!(out, "**The agent asked:** {}\n", one_line(message));
        }
        EventKind::ElicitationResolved => {
            let action = data["action"].as_str().unwrap_or("answered");
            let _ = writeln!(out, "**Answered:** {action}\n");
        }
        EventKind::AgentExited => {
            let how = match (data["code"].as_i64(), data["signal"].as_i64()) {
                (_, Some(signal)) => format!("killed by signal {signal}"),
                (Some(code), None) => format!("exit code {code}"),
                _ => "no exit status".into(),
            };
            let _ = writeln!(out, "**The agent exited** ({how}) · {at}\n");
        }
        EventKind::Forked => {
            let parent = data["parentSessionId"].as_str().unwrap_or("");
            let seq = data["parentSeq"].as_i64().unwrap_or(0);
            let _ = writeln!(out, "*Forked from `{parent}` after its event {seq}.*\n");
        }
        EventKind::SessionDeleted => {
            let _ = writeln!(out, "*The session was deleted · {at}.*\n");
        }
        _ => {}
    }
}

/// A tool call or its update: its title, kind and status, then what it carries (diffs, text
/// output; a terminal by its id).
fn tool_call(out: &mut String, kind: EventKind, update: &Value) {
    let id = update["toolCallId"].as_str().unwrap_or("");
    let status = update["status"].as_str();
    match (kind, update["title"].as_str()) {
        (EventKind::ToolCall, title) => {
            let title = title.unwrap_or(id);
            let tool = update["kind"].as_str().unwrap_or("other");
            let status = status.unwrap_or("pending");
            let _ = writeln!(
                out,
                "**Tool call:** {} ({tool}, {status})\n",
                one_line(title)
            );
        }
        (_, Some(title)) => {
            let status = status.map(|s| format!(", {s}")).unwrap_or_default();
            let _ = writeln!(out, "**Tool call** `{id}`: {}{status}\n", one_line(title));
        }
        (_, None) => {
            if let Some(status) = status {
                let _ = writeln!(out, "**Tool call** `{id}`: {status}\n");
            }
        }
    }
    for item in update["content"].as_array().into_iter().flatten() {
        match item["type"].as_str() {
            Some("diff") => {
                let path = item["path"].as_str().unwrap_or("");
                let mut diff = format!("--- {path}\n+++ {path}\n");
                for line in item["oldText"].as_str().unwrap_or("").lines() {
                    let _ = writeln!(diff, "-{line}");
                }
                for line in item["newText"].as_str().unwrap_or("").lines() {
                    let _ = writeln!(diff, "+{line}");
                }
                fenced(out, "diff", &diff);
            }
            Some("content") => fenced(out, "", &content_text(&item["content"])),
            Some("terminal") => {
                let terminal = item["terminalId"].as_str().unwrap_or("");
                let _ = writeln!(out, "(terminal `{terminal}`)\n");
            }
            _ => {}
        }
    }
}

/// `text` in a code fence longer than any run of backticks inside it.
fn fenced(out: &mut String, lang: &str, text: &str) {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    let text = text.strip_suffix('\n').unwrap_or(text);
    let _ = writeln!(out, "{fence}{lang}\n{text}\n{fence}\n");
}

/// A content block as text: its text, or what it is when it is not text.
fn content_text(block: &Value) -> String {
    match block["type"].as_str() {
        Some("text") => block["text"].as_str().unwrap_or("").to_owned(),
        Some("resource_link") => {
            let name = block["name"].as_str().unwrap_or("");
            let uri = block["uri"].as_str().unwrap_or("");
            format!("[{name}]({uri})")
        }
        Some("resource") => {
            let resource = &block["resource"];
            let uri = resource["uri"].as_str().unwrap_or("");
            match resource["text"].as_str() {
                Some(text) => {
                    let mut out = format!("`{uri}`:\n\n");
                    fenced(&mut out, "", text);
                    out
                }
                None => format!("(a file: `{uri}`)"),
            }
        }
        Some(other) => format!("({other})"),
        None => String::new(),
    }
}

/// An author as a reader knows them: their name, else their user id, else their tenant.
fn who(author: &Value) -> String {
    let tenant = author["tenant"].as_str();
    match (author["name"].as_str(), author["user"].as_str(), tenant) {
        (Some(name), ..) => name.to_owned(),
        (None, Some(user), _) => user.to_owned(),
        (None, None, Some(tenant)) => format!("tenant {tenant}"),
        _ => "someone".into(),
    }
}

/// `text` on one line (a title or a message inside a sentence).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
