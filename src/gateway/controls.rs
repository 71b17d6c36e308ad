//! Session controls: `PUT /sessions/{id}/mode`, `/model` and `/config/{configId}`, and the same
//! settings given to `POST /sessions`. A mode or a model goes through the config option of its
//! category when the agent offers one (the stable way), else through `session/set_mode` or
//! `session/set_model` where the agent offered `modes` or `models`; anything else is 501. A
//! value the agent did not offer is 422 before the agent is asked. What the agent answers is
//! logged (`state_changed`), so the state moves even when the agent sends no update.

use agent_client_protocol_schema::v1::AGENT_METHOD_NAMES;
use serde_json::{Value, json};

use super::caller::Caller;
use super::error::Error;
use super::event::StateChanged;
use super::input::SessionId;
use super::parts::live::Busy;
use super::parts::use_case;
use super::state::{StateAt, select_values};
use crate::pool::client::{AgentClient, SESSION_SET_MODEL};

/// What `POST /sessions` sets before it answers, in this order: mode, model, then each option.
#[derive(Debug, Default)]
pub struct InitialSettings {
    pub mode: Option<String>,
    pub model: Option<String>,
    pub config: Vec<(String, Value)>,
}

/// One control.
#[derive(Debug, Clone, Copy)]
enum Control<'a> {
    Mode(&'a str),
    Model(&'a str),
    Option(&'a str, &'a Value),
}

use_case! {
    /// The use case of a session's mode, model and config options, with the parts it needs.
    pub struct Controls {
        parts: [placement, records, states, log],
    }
}

impl Controls {
    /// `PUT /sessions/{id}/mode`.
    pub async fn set_mode(
        &self,
        caller: &Caller,
        id: &SessionId,
        mode_id: &str,
    ) -> Result<StateAt, Error> {
        self.control_session(caller, id, Control::Mode(mode_id))
            .await
    }

    /// `PUT /sessions/{id}/model`.
    pub async fn set_model(
        &self,
        caller: &Caller,
        id: &SessionId,
        model_id: &str,
    ) -> Result<StateAt, Error> {
        self.control_session(caller, id, Control::Model(model_id))
            .await
    }

    /// `PUT /sessions/{id}/config/{configId}`.
    pub async fn set_config(
        &self,
        caller: &Caller,
        id: &SessionId,
        config_id: &str,
        value: &Value,
    ) -> Result<StateAt, Error> {
        self.control_session(caller, id, Control::Option(config_id, value))
            .await
    }

    /// Applies `settings` to a session just created (live on this replica).
    pub(super) async fn apply_settings(
        &self,
        session_id: &str,
        agent_name: &str,
        settings: &InitialSettings,
    ) -> Result<(), Error> {
        let controls = settings
            .mode
            .as_deref()
            .map(Control::Mode)
            .into_iter()
            .chain(settings.model.as_deref().map(Control::Model))
            .chain(settings.config.iter().map(|(k, v)| Control::Option(k, v)));
        for control in controls {
            let agent = self
                .placement
                .client_if_live(session_id)
                .ok_or_else(|| self.placement.no_member(agent_name))?;
            self.control(&agent, session_id, control).await?;
        }
        Ok(())
    }

    /// A control on a session, made live first if it is saved; answers the new state.
    async fn control_session(
        &self,
        caller: &Caller,
        id: &SessionId,
        control: Control<'_>,
    ) -> Result<StateAt, Error> {
        let record = self.records.get(caller, id).await?;
        let agent = match self.placement.client_if_live(id.as_str()) {
            Some(agent) => agent,
            None => {
                let _claim = self
                    .placement
                    .claim_waiting(id.as_str(), Busy::Attaching)
                    .await?;
                let member = self.placement.ensure_live(&record).await?;
                self.placement
                    .client(member)
                    .ok_or_else(|| self.placement.no_member(&record.agent))?
            }
        };
        self.control(&agent, id.as_str(), control).await?;
        self.states.state_of(id.as_str()).await
    }

    async fn control(
        &self,
        agent: &AgentClient,
        session_id: &str,
        control: Control<'_>,
    ) -> Result<(), Error> {
        self.log.flush().await;
        let state = self.states.state_of(session_id).await?.state;
        let (category, wanted) = match control {
            Control::Mode(mode) => ("mode", mode),
            Control::Model(model) => ("model", model),
            Control::Option(config_id, value) => {
                let Some(option) = state.option(config_id) else {
                    return Err(match state.config_options {
                        None => Error::NotSupported("the agent offers no config options".into()),
                        Some(_) => Error::Invalid(format!("no config option {config_id:?}")),
                    });
                };
                check_value(option, value)?;
                return self.set_option(agent, session_id, config_id, value).await;
            }
        };
        if let Some(option) = state.option_of(category) {
            let config_id = option.get("id").and_then(Value::as_str).unwrap_or_default();
            let value = Value::String(wanted.to_owned());
            check_value(option, &value)?;
            return self.set_option(agent, session_id, config_id, &value).await;
        }
        let (part, list, key, current) = match category {
            "mode" => (&state.modes, "availableModes", "id", "currentModeId"),
            _ => (
                &state.models,
                "availableModels",
                "modelId",
                "currentModelId",
            ),
        };
        let Some(part) = part else {
            return Err(Error::NotSupported(format!(
                "the agent offers no {category} for this session"
            )));
        };
        let offered: Vec<&str> = part
            .get(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.get(key).and_then(Value::as_str))
            .collect();
        if !offered.contains(&wanted) {
            return Err(Error::Invalid(format!(
                "the agent offers no {category} {wanted:?} (it offers {offered:?})"
            )));
        }
        let (source, result) = match category {
            "mode" => (
                AGENT_METHOD_NAMES.session_set_mode,
                agent.set_mode(session_id, wanted).await?,
            ),
            _ => (
                SESSION_SET_MODEL,
                agent.set_model(session_id, wanted).await?,
            ),
        };
        // The agent's `{}` says it is done: what is set is what was asked.
        let set = Some(json!({ current: wanted }));
        let change = if category == "mode" {
            StateChanged {
                modes: set,
                ..StateChanged::default()
            }
        } else {
            StateChanged {
                models: set,
                ..StateChanged::default()
            }
        };
        self.states
            .note_change(session_id, source, &result, change)
            .await
    }

    async fn set_option(
        &self,
        agent: &AgentClient,
        session_id: &str,
        config_id: &str,
        value: &Value,
    ) -> Result<(), Error> {
        let result = agent
            .set_config_option(session_id, config_id, value)
            .await?;
        let change = StateChanged {
            config_id: Some(config_id.to_owned()),
            value: Some(value.clone()),
            ..StateChanged::default()
        };
        let result = json!({"configOptions": result.get("configOptions").filter(|o| o.is_array())});
        self.states
            .note_change(
                session_id,
                AGENT_METHOD_NAMES.session_set_config_option,
                &result,
                change,
            )
            .await
    }
}

/// 422 unless `value` is one the option takes: one of a select's values, a boolean's boolean.
/// Options of a type the gateway does not know take any value (the agent decides).
fn check_value(option: &Value, value: &Value) -> Result<(), Error> {
    let id = option.get("id").and_then(Value::as_str).unwrap_or_default();
    match option.get("type").and_then(Value::as_str) {
        Some("select") => {
            let values = select_values(option);
            match value.as_str() {
                Some(v) if values.contains(&v) => Ok(()),
                _ => Err(Error::Invalid(format!(
                    "config option {id:?} takes one of {values:?}, not {value}"
                ))),
            }
        }
        Some("boolean") if !value.is_boolean() => Err(Error::Invalid(format!(
            "config option {id:?} takes true or false, not {value}"
        ))),
        _ => Ok(()),
    }
}
