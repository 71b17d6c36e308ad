//! The echo agent's session controls, with `ECHO_AGENT_CONTROLS` (a comma-separated subset of
//! `modes,models,options`; none when unset): what `session/new`, load, resume and fork answer,
//! and the setters. Each session's settings are kept in its file, so a resume in a new process
//! reports what was set.
//!
//! - `modes`: `ask` (current at start), `code`, `architect`. `session/set_mode` answers `{}`
//!   and sends nothing (as Gemini CLI); `architect` is refused with -32603 and
//!   `data.details` (as Gemini CLI refuses some modes).
//! - `models`: `echo-small` (current at start), `echo-large`, in the older `models` field;
//!   `session/set_model` answers `{}` and sends nothing. Without `models` it is -32601.
//! - `options`: config options `mode` (category `mode`, the modes above), `model` (category
//!   `model`, the models above), `effort` (category `thought_level`, `low`/`high`; offered
//!   only while the model is `echo-large`, as OpenCode's appears with some models) and
//!   `verbose` (boolean, category `_echo_style`, which no client knows).
//!   `session/set_config_option` answers the whole list; on `mode` it also sends a
//!   `current_mode_update` (as the Claude adapter). Without `options` it is -32601.
//!
//! With any of them, a prompt's result carries `usage` (tokens: its words in, the words
//! echoed out), and the directive `/state` makes the turn first send an
//! `available_commands_update`, a `plan`, a `usage_update` and, with `options`, a
//! `config_option_update` in which the agent turned `verbose` on by itself.

use agent_client_protocol::{Error, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Which controls the agent offers.
#[derive(Debug, Default, Clone, Copy)]
pub struct Controls {
    pub modes: bool,
    pub models: bool,
    pub options: bool,
}

/// One session's settings, as kept in its file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    pub mode: String,
    pub model: String,
    pub effort: String,
    pub verbose: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mode: "ask".into(),
            model: "echo-small".into(),
            effort: "low".into(),
            verbose: false,
        }
    }
}

const MODES: [(&str, &str); 3] = [("ask", "Ask"), ("code", "Code"), ("architect", "Architect")];
const MODELS: [(&str, &str); 2] = [("echo-small", "Echo small"), ("echo-large", "Echo large")];

fn invalid(message: String) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, message)
}

fn select(values: &[(&str, &str)]) -> Value {
    values
        .iter()
        .map(|(value, name)| json!({"value": value, "name": name}))
        .collect()
}

impl Controls {
    pub fn from_env(value: Option<&str>) -> Self {
        let mut c = Controls::default();
        for part in value.unwrap_or_default().split(',') {
            match part.trim() {
                "modes" => c.modes = true,
                "models" => c.models = true,
                "options" => c.options = true,
                "" => {}
                other => eprintln!("echo-agent: ignoring unknown control {other:?}"),
            }
        }
        c
    }

    pub fn any(self) -> bool {
        self.modes || self.models || self.options
    }

    /// What a session result carries besides its own fields.
    pub fn result(self, s: &Settings) -> serde_json::Map<String, Value> {
        let mut out = serde_json::Map::new();
        if self.modes {
            let available: Vec<Value> = MODES
                .iter()
                .map(|(id, name)| json!({"id": id, "name": name}))
                .collect();
            out.insert(
                "modes".into(),
                json!({"currentModeId": s.mode, "availableModes": available}),
            );
        }
        if self.models {
            let available: Vec<Value> = MODELS
                .iter()
                .map(|(id, name)| json!({"modelId": id, "name": name}))
                .collect();
            out.insert(
                "models".into(),
                json!({"currentModelId": s.model, "availableModels": available}),
            );
        }
        if self.options {
            out.insert("configOptions".into(), Self::options(s));
        }
        out
    }

    /// The whole option list for `s`.
    pub fn options(s: &Settings) -> Value {
        let mut options = vec![
            json!({"id": "mode", "name": "Mode", "category": "mode", "type": "select",
                   "currentValue": s.mode, "options": select(&MODES)}),
            json!({"id": "model", "name": "Model", "category": "model", "type": "select",
                   "currentValue": s.model, "options": select(&MODELS)}),
        ];
        if s.model == "echo-large" {
            options.push(
                json!({"id": "effort", "name": "Effort", "category": "thought_level",
                "type": "select", "currentValue": s.effort,
                "options": select(&[("low", "Low"), ("high", "High")])}),
            );
        }
        options.push(
            json!({"id": "verbose", "name": "Verbose", "category": "_echo_style",
            "type": "boolean", "currentValue": s.verbose}),
        );
        Value::Array(options)
    }

    /// `session/set_mode`.
    pub fn set_mode(self, s: &mut Settings, mode: &str) -> Result<(), Error> {
        if !self.modes {
            return Err(Error::method_not_found());
        }
        check_mode(mode)?;
        s.mode = mode.to_owned();
        Ok(())
    }

    /// `session/set_model`.
    pub fn set_model(self, s: &mut Settings, model: &str) -> Result<(), Error> {
        if !self.models {
            return Err(Error::method_not_found());
        }
        if !MODELS.iter().any(|(id, _)| *id == model) {
            return Err(invalid(format!("unknown model {model:?}")));
        }
        s.model = model.to_owned();
        Ok(())
    }

    /// `session/set_config_option`; the whole list after it.
    pub fn set_option(self, s: &mut Settings, id: &str, value: &Value) -> Result<Value, Error> {
        if !self.options {
            return Err(Error::method_not_found());
        }
        let text = value.as_str().unwrap_or_default();
        match id {
            "mode" => {
                check_mode(text)?;
                s.mode = text.to_owned();
            }
            "model" if MODELS.iter().any(|(m, _)| *m == text) => s.model = text.to_owned(),
            "effort" if s.model == "echo-large" && ["low", "high"].contains(&text) => {
                s.effort = text.to_owned();
            }
            "verbose" if value.is_boolean() => s.verbose = value.as_bool() == Some(true),
            _ => return Err(invalid(format!("no option {id:?} takes {value}"))),
        }
        Ok(Self::options(s))
    }
}

fn check_mode(mode: &str) -> Result<(), Error> {
    match mode {
        "architect" => {
            Err(Error::internal_error()
                .data(json!({"details": "architect mode needs a plan first"})))
        }
        m if MODES.iter().any(|(id, _)| *id == m) => Ok(()),
        m => Err(invalid(format!("unknown mode {m:?}"))),
    }
}

/// The updates `/state` sends, in order.
pub fn state_updates(c: Controls, s: &Settings) -> Vec<Value> {
    let mut updates = vec![
        json!({"sessionUpdate": "available_commands_update", "availableCommands": [
            {"name": "help", "description": "What echo can do", "input": null},
            {"name": "shout", "description": "Echo in capitals", "input": {"hint": "text to shout"}},
        ]}),
        json!({"sessionUpdate": "plan", "entries": [
            {"content": "Read the prompt", "priority": "high", "status": "completed"},
            {"content": "Echo it", "priority": "medium", "status": "in_progress"},
        ]}),
        json!({"sessionUpdate": "usage_update", "used": 1200, "size": 200000,
               "cost": {"amount": 0.01, "currency": "USD"}}),
    ];
    if c.options {
        let turned_on = Settings {
            verbose: true,
            ..s.clone()
        };
        updates.push(json!({"sessionUpdate": "config_option_update",
                            "configOptions": Controls::options(&turned_on)}));
    }
    updates
}
