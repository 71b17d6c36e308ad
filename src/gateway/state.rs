//! A session's state: what a coding-agent UI shows beside the transcript (modes, models, config
//! options, commands, usage, plan, prompt suggestions, the agent's `_meta`). It is a fold of the session's log, so
//! every replica computes the same one and a restart loses nothing: the agent's updates are in
//! the log as they came, and what the gateway learns otherwise (a `session/new` result, a
//! setter's answer) is logged as a `state_changed` event. The fold up to a log position is
//! stored as a snapshot, so a read folds only the log after it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::store::EventKind;

/// A session's state. Each part is the agent's JSON as it sent it; absent when it never sent one.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({
    "modes": {"currentModeId": "ask", "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]},
    "models": {"currentModelId": "echo-small", "availableModels": [{"modelId": "echo-small", "name": "Echo small"}]},
    "configOptions": [{"id": "mode", "name": "Mode", "category": "mode", "type": "select", "currentValue": "ask", "options": [{"value": "ask", "name": "Ask"}, {"value": "code", "name": "Code"}]}],
    "availableCommands": [{"name": "help", "description": "What echo can do", "input": null}],
    "usage": {"latest": {"used": 1200, "size": 200000}, "lastPrompt": {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15}},
    "plan": [{"content": "Echo the prompt", "priority": "medium", "status": "completed"}]
}))]
pub struct SessionState {
    /// `currentModeId` and `availableModes`, from `session/new` (or load, resume, fork), kept
    /// current by `current_mode_update`, `set_mode` and the `mode` config option.
    #[schema(value_type = Option<Object>)]
    pub modes: Option<Value>,
    /// `currentModelId` and `availableModels`, for agents that offer models this way.
    #[schema(value_type = Option<Object>)]
    pub models: Option<Value>,
    /// The whole list, replaced by each `config_option_update` and setter answer.
    #[schema(value_type = Option<Vec<Object>>)]
    pub config_options: Option<Value>,
    /// From the latest `available_commands_update`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub available_commands: Option<Value>,
    /// `latest`: the latest `usage_update` (`used`, `size`, `cost`); `lastPrompt`: the last
    /// prompt result's `usage`.
    #[schema(value_type = Option<Object>)]
    pub usage: Option<Value>,
    /// The entries of the latest `plan`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub plan: Option<Value>,
    /// The prompts the agent predicts the user will send next, from the latest
    /// `prompt_suggestions_update` (ACP, unstable): each a `prompt`, content blocks a client
    /// may send as a prompt unchanged. An empty list: the agent withdrew its suggestions.
    #[schema(value_type = Option<Vec<Object>>)]
    pub prompt_suggestions: Option<Value>,
    /// The agent's latest `_meta` from `session_info_update`.
    #[serde(rename = "_meta")]
    #[schema(value_type = Option<Object>)]
    pub meta: Option<Value>,
}

/// The state and the log position it holds at.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"seq": 12, "state": {
    "modes": {"currentModeId": "code", "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]},
    "configOptions": [{"id": "mode", "name": "Mode", "category": "mode", "type": "select", "currentValue": "code", "options": [{"value": "ask", "name": "Ask"}, {"value": "code", "name": "Code"}]}]
}}))]
pub struct StateAt {
    /// The last log event the state includes (a `Last-Event-ID` to continue from).
    pub seq: i64,
    pub state: SessionState,
}

impl SessionState {
    /// Applies one log event (of the kinds [`EventKind::STATE`]; others change nothing).
    pub(in crate::gateway) fn apply(&mut self, kind: EventKind, payload: &Value) {
        let update = payload.get("update").unwrap_or(&Value::Null);
        let field = |name: &str| update.get(name).cloned();
        match kind {
            EventKind::StateChanged => self.apply_change(payload),
            EventKind::CurrentModeUpdate => {
                if let Some(mode) = update.get("currentModeId").and_then(Value::as_str) {
                    self.set_current_mode(mode);
                }
            }
            EventKind::ConfigOptionUpdate => {
                if let Some(options) = field("configOptions") {
                    self.set_options(options);
                }
            }
            EventKind::AvailableCommandsUpdate => {
                self.available_commands = field("availableCommands");
            }
            EventKind::Plan => self.plan = field("entries"),
            EventKind::PromptSuggestionsUpdate => {
                self.prompt_suggestions = field("suggestions").filter(Value::is_array);
            }
            EventKind::UsageUpdate => {
                let mut latest = update.clone();
                if let Some(o) = latest.as_object_mut() {
                    o.remove("sessionUpdate");
                }
                self.usage_part("latest", latest);
            }
            EventKind::SessionInfoUpdate => {
                if let Some(meta) = update.get("_meta") {
                    self.meta = (!meta.is_null()).then(|| meta.clone());
                }
            }
            EventKind::TurnEnded => {
                if let Some(usage) = payload.get("usage").filter(|u| !u.is_null()) {
                    self.usage_part("lastPrompt", usage.clone());
                }
            }
            _ => {}
        }
    }

    /// A `state_changed` payload: `modes` and `models` merged into what is known (a setter
    /// names only the current one), `configOptions` replacing the list.
    fn apply_change(&mut self, change: &Value) {
        for (part, name) in [(&mut self.modes, "modes"), (&mut self.models, "models")] {
            if let Some(Value::Object(new)) = change.get(name) {
                match part {
                    Some(Value::Object(old)) => old.extend(new.clone()),
                    _ => *part = Some(Value::Object(new.clone())),
                }
            }
        }
        if let Some(mode) = change
            .pointer("/modes/currentModeId")
            .and_then(Value::as_str)
        {
            self.set_current_mode(mode);
        }
        if let Some(model) = change
            .pointer("/models/currentModelId")
            .and_then(Value::as_str)
        {
            self.move_option("model", model);
        }
        match change.get("configOptions").filter(|o| !o.is_null()) {
            Some(options) => self.set_options(options.clone()),
            // A `set_config_option` answered without the list: the value set is all it says.
            None => {
                let id = change.get("configId").and_then(Value::as_str);
                if let (Some(id), Some(value)) = (id, change.get("value")) {
                    self.set_option_value(id, value.clone());
                }
            }
        }
    }

    fn set_option_value(&mut self, id: &str, value: Value) {
        let Some(Value::Array(options)) = &self.config_options else {
            return;
        };
        let mut options = options.clone();
        for o in &mut options {
            if o.get("id").and_then(Value::as_str) == Some(id)
                && let Value::Object(o) = o
            {
                o.insert("currentValue".into(), value.clone());
            }
        }
        self.set_options(Value::Array(options));
    }

    /// The session's current model: its config option of category `model`, else `models`'
    /// `currentModelId`.
    pub fn model(&self) -> Option<String> {
        let option = self
            .config_options
            .as_ref()
            .and_then(Value::as_array)
            .and_then(|options| {
                options
                    .iter()
                    .find(|o| o.get("category").and_then(Value::as_str) == Some("model"))
                    .and_then(|o| o.get("currentValue"))
            });
        let current = self.models.as_ref().and_then(|m| m.get("currentModelId"));
        option
            .or(current)
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    fn usage_part(&mut self, name: &str, value: Value) {
        let usage = self.usage.get_or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(usage) = usage {
            usage.insert(name.to_owned(), value);
        }
    }

    /// The current mode, on both sides: `modes` and the option of category `mode`.
    fn set_current_mode(&mut self, mode: &str) {
        set_current(&mut self.modes, "currentModeId", mode);
        self.move_option("mode", mode);
    }

    /// A whole new option list; `modes` and `models` follow the options of their category.
    fn set_options(&mut self, options: Value) {
        self.config_options = Some(options);
        if let Some(mode) = self.option_value("mode") {
            set_current(&mut self.modes, "currentModeId", &mode);
        }
        if let Some(model) = self.option_value("model") {
            set_current(&mut self.models, "currentModelId", &model);
        }
    }

    /// The option of `category`, if the agent offers one.
    pub(in crate::gateway) fn option_of(&self, category: &str) -> Option<&Value> {
        self.config_options
            .as_ref()?
            .as_array()?
            .iter()
            .find(|o| o.get("category").and_then(Value::as_str) == Some(category))
    }

    /// The option with id `id`.
    pub(in crate::gateway) fn option(&self, id: &str) -> Option<&Value> {
        self.config_options
            .as_ref()?
            .as_array()?
            .iter()
            .find(|o| o.get("id").and_then(Value::as_str) == Some(id))
    }

    fn option_value(&self, category: &str) -> Option<String> {
        let value = self.option_of(category)?.get("currentValue")?.as_str()?;
        Some(value.to_owned())
    }

    fn move_option(&mut self, category: &str, value: &str) {
        let Some(Value::Array(options)) = &mut self.config_options else {
            return;
        };
        for o in options {
            if o.get("category").and_then(Value::as_str) == Some(category)
                && let Value::Object(o) = o
            {
                o.insert("currentValue".into(), Value::String(value.to_owned()));
            }
        }
    }
}

/// Sets `key` in `part`, which exists only if the agent offered it.
fn set_current(part: &mut Option<Value>, key: &str, value: &str) {
    if let Some(Value::Object(part)) = part {
        part.insert(key.to_owned(), Value::String(value.to_owned()));
    }
}

/// The values a select option accepts (its `options`, flat or in groups).
pub(in crate::gateway) fn select_values(option: &Value) -> Vec<&str> {
    let mut values = Vec::new();
    for entry in option
        .get("options")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(v) = entry.get("value").and_then(Value::as_str) {
            values.push(v);
        }
        for inner in entry
            .get("options")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(v) = inner.get("value").and_then(Value::as_str) {
                values.push(v);
            }
        }
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const STATE_CHANGED: EventKind = EventKind::StateChanged;

    fn kind(name: &str) -> EventKind {
        EventKind::parse(name).unwrap()
    }

    fn update(kind: &str, fields: Value) -> Value {
        let mut u = json!({"sessionUpdate": kind});
        u.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        json!({"sessionId": "s", "update": u})
    }

    fn options(mode: &str) -> Value {
        json!([
            {"id": "mode", "category": "mode", "type": "select", "currentValue": mode,
             "options": [{"value": "ask", "name": "Ask"}, {"value": "code", "name": "Code"}]},
            {"id": "effort", "category": "thought_level", "type": "select", "currentValue": "low",
             "options": [{"group": "g", "name": "G", "options": [{"value": "low", "name": "Low"}]}]}
        ])
    }

    fn created() -> SessionState {
        let mut s = SessionState::default();
        s.apply(
            STATE_CHANGED,
            &json!({"sessionId": "s", "modes": {"currentModeId": "ask", "availableModes": []},
                     "configOptions": options("ask")}),
        );
        s
    }

    #[test]
    fn a_mode_update_moves_the_mode_option_and_the_reverse() {
        let mut s = created();
        s.apply(
            kind("current_mode_update"),
            &update("current_mode_update", json!({"currentModeId": "code"})),
        );
        assert_eq!(s.option_of("mode").unwrap()["currentValue"], "code");
        assert_eq!(s.modes.as_ref().unwrap()["currentModeId"], "code");
        s.apply(
            kind("config_option_update"),
            &update(
                "config_option_update",
                json!({"configOptions": options("ask")}),
            ),
        );
        assert_eq!(s.modes.as_ref().unwrap()["currentModeId"], "ask");
        // A set_mode the agent answered with `{}` alone.
        s.apply(STATE_CHANGED, &json!({"modes": {"currentModeId": "code"}}));
        assert_eq!(s.option_of("mode").unwrap()["currentValue"], "code");
        assert_eq!(s.modes.as_ref().unwrap()["availableModes"], json!([]));
    }

    #[test]
    fn options_are_replaced_whole_and_parts_kept_apart() {
        let mut s = created();
        s.apply(
            kind("config_option_update"),
            &update("config_option_update", json!({"configOptions": []})),
        );
        assert_eq!(s.config_options, Some(json!([])));
        s.apply(
            kind("usage_update"),
            &update("usage_update", json!({"used": 5, "size": 10})),
        );
        s.apply(
            kind("turn_ended"),
            &json!({"sessionId": "s", "stopReason": "end_turn", "usage": {"totalTokens": 3}}),
        );
        s.apply(
            kind("turn_ended"),
            &json!({"sessionId": "s", "usage": null}),
        );
        assert_eq!(
            s.usage,
            Some(json!({"latest": {"used": 5, "size": 10}, "lastPrompt": {"totalTokens": 3}}))
        );
        s.apply(
            kind("plan"),
            &update("plan", json!({"entries": [{"content": "a"}]})),
        );
        s.apply(
            kind("available_commands_update"),
            &update(
                "available_commands_update",
                json!({"availableCommands": []}),
            ),
        );
        assert_eq!(s.plan, Some(json!([{"content": "a"}])));
        assert_eq!(s.available_commands, Some(json!([])));
        s.apply(
            kind("session_info_update"),
            &update("session_info_update", json!({"_meta": {"k": 1}})),
        );
        s.apply(
            kind("session_info_update"),
            &update("session_info_update", json!({"title": "t"})),
        );
        assert_eq!(s.meta, Some(json!({"k": 1})), "absent means unchanged");
        s.apply(
            kind("session_info_update"),
            &update("session_info_update", json!({"_meta": null})),
        );
        assert_eq!(s.meta, None, "null clears");
        s.apply(
            kind("agent_message_chunk"),
            &update("agent_message_chunk", json!({})),
        );
        assert_eq!(s.modes.as_ref().unwrap()["currentModeId"], "ask");
    }

    #[test]
    fn select_values_include_grouped_ones() {
        let s = created();
        assert_eq!(select_values(s.option("mode").unwrap()), ["ask", "code"]);
        assert_eq!(select_values(s.option("effort").unwrap()), ["low"]);
    }
}
