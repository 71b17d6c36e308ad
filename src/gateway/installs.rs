//! Agents from an ACP registry (`Installs`): the registry listed with what is installed here
//! (`GET /registry`), an agent installed (`POST /agents`), moved to another version
//! (`POST /agents/{name}/upgrade`) and removed (`DELETE /agents/{name}`). Changing the agents
//! takes an admin; an install runs in the background, its progress shown by
//! `GET /agents/{name}`.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

use super::caller::Caller;
use super::error::Error;
use super::parts::installs::{InstallConfig, InstallView, Wanted, record_of, sign_in_of};
use super::parts::use_case;
use crate::agent_rpc::terminal::LoginTerminal;
use crate::install::error::InstallError;
use crate::install::registry::{DistKind, RegistryEntry, load, platform};
use crate::pool::AgentPool;
use crate::store::{InstallRecord, ListQuery};

use_case! {
    /// The use case of the agents installed from a registry.
    pub struct Installs {
        parts: [installs, placement, tasks],
    }
}

/// The registry, as this gateway reads it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"source": "https://cdn.agentclientprotocol.com/registry/v1/latest/registry.json", "platform": "linux-x86_64", "agents": [{"id": "claude-acp", "name": "Claude Agent", "version": "0.85.1", "description": "ACP wrapper for Anthropic's Claude", "repository": "https://github.com/agentclientprotocol/claude-agent-acp", "authors": ["Anthropic"], "license": "proprietary", "kinds": ["npx"], "installed": []}]}))]
pub struct RegistryView {
    /// Where it was read (`--registry`; credentials masked).
    pub source: String,
    /// This machine's platform, as the registry names binary archives'.
    pub platform: &'static str,
    pub agents: Vec<RegistryAgentView>,
}

/// One agent of the registry.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegistryAgentView {
    /// What `POST /agents {"registry"}` names it by.
    pub id: String,
    pub name: String,
    /// The version the registry offers.
    pub version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub website: Option<String>,
    pub authors: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icon: Option<String>,
    /// The distributions it offers that run here, the one an install takes first.
    pub kinds: Vec<DistKind>,
    /// The names it is installed as on this gateway.
    pub installed: Vec<String>,
}

/// An agent signed in.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"agent": "codex-acp", "methodId": "openai-api-key", "type": "env_var", "vars": ["OPENAI_API_KEY"]}))]
pub struct SignInView {
    pub agent: String,
    /// The auth method every member authenticates with from now on.
    pub method_id: String,
    /// The method's type: `agent` (the agent signs itself in) or `env_var`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The environment variables an `env_var` method reads.
    pub vars: Vec<String>,
}

impl Installs {
    fn admin(caller: &Caller, what: &str) -> Result<(), Error> {
        match caller.admin {
            true => Ok(()),
            false => Err(Error::Forbidden(format!(
                "{what} changes the agents every tenant uses: it needs an admin key"
            ))),
        }
    }

    /// `GET /registry`.
    pub async fn registry(&self) -> Result<RegistryView, Error> {
        let index = self
            .installs
            .registry(false)
            .await
            .map_err(registry_error)?;
        let rows = self.installs.rows().await?;
        let agents = (index.agents.iter())
            .map(|e| RegistryAgentView {
                id: e.id.clone(),
                name: e.name.clone(),
                version: e.version.clone(),
                description: e.description.clone(),
                repository: e.repository.clone(),
                website: e.website.clone(),
                authors: e.authors.clone(),
                license: e.license.clone(),
                icon: e.icon.clone(),
                kinds: e.kinds(),
                installed: (rows.iter())
                    .filter(|r| r.registry_id == e.id)
                    .map(|r| r.name.clone())
                    .collect(),
            })
            .collect();
        Ok(RegistryView {
            source: self.installs.source(),
            platform: platform(),
            agents,
        })
    }

    /// `POST /agents`: installs the registry's agent `id` (at `version`, else the registry's)
    /// as `name` (else its id), in the background. Answers with the install as it begins.
    pub async fn install(
        &self,
        caller: &Caller,
        id: &str,
        version: Option<&str>,
        name: Option<&str>,
    ) -> Result<(String, InstallView), Error> {
        Self::admin(caller, "installing an agent")?;
        let entry = self.entry(id).await?;
        let name = name.unwrap_or(&entry.id).to_owned();
        if !crate::config::valid_agent_name(&name) {
            return Err(Error::Invalid(format!(
                "{name:?} cannot name an agent: 1 to 63 lowercase letters, digits, `-` and `_`, \
                 starting with a letter or digit; give `name`"
            )));
        }
        let cluster = self.placement.cluster();
        let taken = self.placement.agents().get(&name).is_some()
            || cluster.agents_elsewhere().contains(&name)
            || self.installs.rows().await?.iter().any(|r| r.name == name);
        if taken {
            return Err(Error::Conflict(format!(
                "an agent named {name:?} exists; remove it first, or give another `name`"
            )));
        }
        let choice = entry.choose(version).map_err(choice_error)?;
        let wanted = Wanted {
            name: name.clone(),
            registry_id: entry.id.clone(),
            choice,
            sign_in: None,
        };
        if !self.installs.begin(&wanted, None) {
            return Err(Error::Conflict(format!(
                "the agent {name:?} is being installed already"
            )));
        }
        let installs = self.installs.clone();
        self.tasks
            .spawn(async move { installs.install_new(wanted).await });
        let view = self.installs.view(&name).expect("just begun");
        Ok((name, view))
    }

    /// `POST /agents/{name}/upgrade`: moves an installed agent to `version` (else the
    /// registry's), in the background; the version running goes on until the new one is in.
    pub async fn upgrade(
        &self,
        caller: &Caller,
        name: &str,
        version: Option<&str>,
    ) -> Result<InstallView, Error> {
        Self::admin(caller, "upgrading an agent")?;
        let row = self.installed_row(name).await?;
        let entry = self.entry(&row.registry_id).await?;
        let choice = entry.choose(version).map_err(choice_error)?;
        if choice.version == row.version {
            return Err(Error::Conflict(format!(
                "the agent {name:?} is at version {} already",
                row.version
            )));
        }
        let wanted = Wanted {
            name: name.to_owned(),
            sign_in: sign_in_of(&row),
            registry_id: row.registry_id,
            choice,
        };
        if !self.installs.begin(&wanted, None) {
            return Err(Error::Conflict(format!(
                "the agent {name:?} is being installed already"
            )));
        }
        let installs = self.installs.clone();
        self.tasks
            .spawn(async move { installs.upgrade(wanted).await });
        Ok(self.installs.view(name).expect("just begun"))
    }

    /// `DELETE /agents/{name}`: removes an installed agent from every replica. 409 while a
    /// session of it is live on any live replica (by the registry of session owners as it is
    /// now).
    pub async fn remove(&self, caller: &Caller, name: &str) -> Result<(), Error> {
        Self::admin(caller, "removing an agent")?;
        self.installed_row(name).await?;
        let here = (self.placement.agents().get(name)).map_or(0, |a| a.live_sessions());
        let live = self
            .held_anywhere(name)
            .await?
            .map_or(here, |held| held.max(here));
        if live > 0 {
            return Err(Error::Conflict(format!(
                "the agent {name:?} has {live} live session(s); close or delete them first"
            )));
        }
        self.installs.remove(name).await?;
        Ok(())
    }

    /// How many sessions of the agent `name` the live replicas hold, this one included;
    /// `None` alone on its database.
    async fn held_anywhere(&self, name: &str) -> Result<Option<usize>, Error> {
        let rows = self.placement.records().rows();
        let mut ids = Vec::new();
        // Archived ones too: an agent that cannot close a session keeps it live archived.
        for archived in [None, Some(true)] {
            let mut query = ListQuery {
                agent: Some(name.to_owned()),
                archived,
                limit: 500,
                ..ListQuery::default()
            };
            loop {
                let page = rows.list_sessions(&query).await?;
                ids.extend(page.sessions.into_iter().map(|s| s.session_id));
                match page.next {
                    Some(next) => query.after = Some(next),
                    None => break,
                }
            }
        }
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let held = self.placement.cluster().held_among(&ids).await?;
        Ok(held.map(|h| h.len()))
    }

    /// `POST /agents/{name}/authenticate`: signs every pool of the agent in with the auth
    /// method `method_id` it offers (`authenticate` on every member now, and on every member
    /// that starts later; an installed agent's on every replica). A method that reads a key
    /// from the environment finds it in the agent's: the gateway's, the agent's `env`, or a
    /// tenant's for that tenant's pool. A terminal method is run over `GET
    /// /agents/{name}/login` instead.
    pub async fn authenticate(
        &self,
        caller: &Caller,
        name: &str,
        method_id: &str,
    ) -> Result<SignInView, Error> {
        let (agent, methods) = self.signing_in(caller, name)?;
        let ids: Vec<String> = (methods.iter())
            .filter_map(|m| m["id"].as_str().map(str::to_owned))
            .collect();
        let method = (methods.iter().find(|m| m["id"] == method_id)).ok_or_else(|| {
            Error::Invalid(format!(
                "the agent {name:?} offers no auth method {method_id:?}; it offers {ids:?}"
            ))
        })?;
        let kind = method["type"].as_str().unwrap_or("agent").to_owned();
        if kind == "terminal" {
            return Err(Error::Conflict(format!(
                "{method_id:?} is a terminal login: run it over the WebSocket GET /agents/{name}/login?methodId={method_id}"
            )));
        }
        let vars: Vec<String> = (method["vars"].as_array().into_iter().flatten())
            .filter_map(|v| v["name"].as_str().map(str::to_owned))
            .chain(method["varName"].as_str().map(str::to_owned))
            .collect();
        let timeout = std::time::Duration::from_secs(60);
        if let Err(why) = agent.sign_in(method_id, timeout).await {
            let hint = match vars.is_empty() {
                true => String::new(),
                false => format!(
                    " (the method reads {} from the agent's environment: set it in the gateway's environment, the agent's env, or a tenant's [tenants.NAME.env])",
                    vars.join(", ")
                ),
            };
            return Err(Error::AgentAuthRequired {
                message: format!("signing the agent {name:?} in failed: {why}{hint}"),
                methods: ids,
            });
        }
        if !self.installs.is_configured(name) {
            self.installs.record_sign_in(name, Some(method_id)).await?;
        }
        Ok(SignInView {
            agent: name.to_owned(),
            method_id: method_id.to_owned(),
            kind,
            vars,
        })
    }

    /// `POST /agents/{name}/logout`: ACP `logout` on every member of the agent (its tenants'
    /// pools included); members that start from now on do not authenticate. An installed
    /// agent's recorded sign-in is forgotten, so every replica logs it out too.
    pub async fn logout(&self, caller: &Caller, name: &str) -> Result<(), Error> {
        let (agent, _) = self.signing_in(caller, name)?;
        if !agent.pool().init().is_some_and(|i| i.capabilities.logout) {
            return Err(Error::NotSupported(format!(
                "the agent {name:?} does not advertise ACP logout (agentCapabilities.auth.logout)"
            )));
        }
        agent.sign_out(std::time::Duration::from_secs(60)).await?;
        if !self.installs.is_configured(name) {
            self.installs.record_sign_in(name, None).await?;
        }
        Ok(())
    }

    /// The agent `name` an admin signs in, and the auth methods it offers.
    fn signing_in(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<(std::sync::Arc<AgentPool>, Vec<serde_json::Value>), Error> {
        Self::admin(caller, "signing an agent in")?;
        let agent = (self.placement.agents().get(name)).ok_or_else(|| {
            Error::NotFound(format!("this gateway replica runs no agent {name:?}"))
        })?;
        let init = (agent.pool().init()).ok_or_else(|| Error::NoMember {
            reason: format!("no member of the agent {name:?} has started yet"),
            retry_after: std::time::Duration::from_secs(2),
        })?;
        let methods = init.auth_methods.as_array().cloned().unwrap_or_default();
        Ok((agent, methods))
    }

    /// `GET /agents/{name}/login`: starts the agent's terminal login `method_id` (its own
    /// program, with the method's arguments and environment) in a pseudo-terminal for the
    /// caller to drive; [`Installs::logged_in`] once it exits 0.
    pub fn terminal_login(
        &self,
        caller: &Caller,
        name: &str,
        method_id: &str,
    ) -> Result<LoginTerminal, Error> {
        let (agent, methods) = self.signing_in(caller, name)?;
        let method = (methods.iter())
            .find(|m| m["id"] == method_id && m["type"] == "terminal")
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "the agent {name:?} offers no terminal login {method_id:?}"
                ))
            })?;
        let command = agent.command().ok_or_else(|| {
            Error::NotSupported(format!(
                "the agent {name:?} runs on another host: sign it in there"
            ))
        })?;
        let args: Vec<String> = (method["args"].as_array().into_iter().flatten())
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect();
        let env: BTreeMap<String, String> = (method["env"].as_object().into_iter().flatten())
            .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
            .collect();
        LoginTerminal::spawn(command, &args, &env)
            .map_err(|e| Error::NotSupported(format!("the terminal login could not start: {e}")))
    }

    /// A terminal login of the agent `name` ended signed in: its members start again, each
    /// signed in by what the login left.
    pub fn logged_in(&self, name: &str) {
        if let Some(agent) = self.placement.agents().get(name) {
            agent.restart_all("signed in through a terminal login");
        }
    }

    /// The row of the installed agent `name`: 409 for an agent configured at start, 404 for
    /// none.
    async fn installed_row(&self, name: &str) -> Result<InstallRecord, Error> {
        if self.installs.is_configured(name) {
            return Err(Error::Conflict(format!(
                "the agent {name:?} is configured with the gateway's flags or file, not \
                 installed from the registry: change its configuration instead"
            )));
        }
        let rows = self.installs.rows().await?;
        (rows.into_iter().find(|r| r.name == name))
            .ok_or_else(|| Error::NotFound(format!("no agent {name:?} is installed")))
    }

    async fn entry(&self, id: &str) -> Result<RegistryEntry, Error> {
        let index = self.installs.registry(true).await.map_err(registry_error)?;
        (index.agents.iter().find(|e| e.id == id).cloned())
            .ok_or_else(|| Error::NotFound(InstallError::NotFound(id.to_owned()).to_string()))
    }
}

/// `acp-gateway agents add`: installs the registry's agent `id` (at `version`, else the
/// registry's) as `name` (else its id) under the installer's root and records it, without a
/// running gateway; the gateways on the database start it within seconds.
pub async fn install_offline(
    store: std::sync::Arc<dyn crate::store::Store>,
    config: &InstallConfig,
    (id, version, name): (&str, Option<&str>, Option<&str>),
    progress: &(dyn Fn(&str) + Send + Sync),
) -> anyhow::Result<InstallRecord> {
    let index = load(&config.registry, &config.client).await?;
    let entry = (index.agents.iter().find(|e| e.id == id))
        .ok_or_else(|| InstallError::NotFound(id.to_owned()))?;
    let name = name.unwrap_or(&entry.id);
    anyhow::ensure!(
        crate::config::valid_agent_name(name),
        "{name:?} cannot name an agent: give --name"
    );
    anyhow::ensure!(
        store.installs().await?.iter().all(|r| r.name != name),
        "an agent named {name:?} is installed already"
    );
    let wanted = Wanted {
        name: name.to_owned(),
        registry_id: entry.id.clone(),
        choice: entry.choose(version)?,
        sign_in: None,
    };
    let installed = config
        .installer
        .install(name, &wanted.choice, None, progress)
        .await
        .inspect_err(|_| {
            // Its folder, when the failed install made it and left it empty.
            let _ = std::fs::remove_dir(config.installer.root().join(name));
        })?;
    let record = record_of(&wanted, installed.sha256).map_err(anyhow::Error::msg)?;
    if !store.add_install(&record).await? {
        let _ = config.installer.remove(name);
        anyhow::bail!("another gateway installed an agent named {name:?} meanwhile");
    }
    Ok(record)
}

/// A registry that cannot be read: 502, the gateway is fine and its upstream is not.
fn registry_error(e: InstallError) -> Error {
    Error::Registry(e.to_string())
}

/// A version or distribution the registry cannot give: 422.
fn choice_error(e: InstallError) -> Error {
    Error::Invalid(e.to_string())
}
