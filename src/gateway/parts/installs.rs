//! The agents installed from an ACP registry, on this replica (`AgentInstalls`): the registry
//! read (and kept a minute), each install's progress and outcome, and the store's rows made
//! true here. An install runs in the background: its files under `--agents-dir`, then its row
//! (the first replica to record a name wins it), then its pool. Every replica makes the rows
//! true by itself ([`AgentInstalls::apply_forever`]): a row not running here is installed
//! (a binary archive must hash as it did when first installed), a row whose version changed is
//! upgraded, and an installed agent whose row is gone is stopped and its files removed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use utoipa::ToSchema;

use super::placement::Placement;
use crate::agent_rpc::AgentCommand;
use crate::install::error::InstallError;
use crate::install::installer::{Installed, Installer};
use crate::install::registry::{Choice, RegistryIndex, load};
use crate::pool::AgentSetup;
use crate::store::{InstallRecord, InstalledAgents};

/// How an installed agent is started: its pools' settings (size, timeouts, the tenants'
/// pools) and its command's limits around the program, arguments and environment its install
/// gives, as the configured agents are.
pub type AgentTemplate = Arc<dyn Fn(&str, AgentCommand) -> AgentSetup + Send + Sync>;

/// Where agents are installed from (`--registry`) and to (`--agents-dir`, the installer's
/// root), the client that downloads, and how an installed agent is started.
#[derive(Clone)]
pub struct InstallConfig {
    pub registry: String,
    pub installer: crate::install::installer::Installer,
    pub client: reqwest::Client,
    pub template: AgentTemplate,
}

impl std::fmt::Debug for InstallConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (f.debug_struct("InstallConfig"))
            .field("registry", &crate::redact::url(&self.registry))
            .field("agents_dir", &self.installer.root())
            .finish_non_exhaustive()
    }
}

/// How long a registry read is kept.
const REGISTRY_TTL: Duration = Duration::from_secs(60);

/// How often a replica compares the rows with what it runs.
const APPLY_EVERY: Duration = Duration::from_secs(2);

/// How long a replica waits before trying again an install of a row that failed here.
const RETRY_FAILED: Duration = Duration::from_secs(30);

/// Progress lines kept per install.
const PROGRESS_LINES: usize = 50;

/// Where an install of an agent stands on this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum InstallPhase {
    Installing,
    Installed,
    Failed,
}

/// An agent installed from the registry, as this replica has it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"registryId": "echo-acp", "kind": "binary", "version": "1.0.0", "source": "https://example.com/echo-1.0.0-linux-x86_64.tar.gz", "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "phase": "installed", "progress": ["downloading https://example.com/echo-1.0.0-linux-x86_64.tar.gz", "installed"]}))]
pub struct InstallView {
    /// Its registry entry's id.
    pub registry_id: String,
    /// `binary`, `npx` or `uvx`.
    pub kind: String,
    pub version: String,
    /// The archive's URL, or the package with its version.
    pub source: String,
    /// A binary archive's sha256 as first installed: every later download must match it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    pub phase: InstallPhase,
    /// What the install did, in order (its last lines).
    pub progress: Vec<String>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One agent's install on this replica, and when it last failed.
struct Tracked {
    view: InstallView,
    failed_at: Option<Instant>,
    /// The auth method its members authenticate with here.
    auth_method: Option<String>,
}

/// The installed agents of this replica.
pub(in crate::gateway) struct AgentInstalls {
    rows: Arc<dyn InstalledAgents>,
    placement: Arc<Placement>,
    installer: Installer,
    /// Where the registry is read (`--registry`).
    source: String,
    client: reqwest::Client,
    template: AgentTemplate,
    /// The agents configured at start, which installs never touch.
    configured: Vec<String>,
    registry: tokio::sync::Mutex<Option<(Instant, Arc<RegistryIndex>)>>,
    tracked: Mutex<BTreeMap<String, Tracked>>,
}

/// What a new install, or an upgrade, is of.
pub(in crate::gateway) struct Wanted {
    pub name: String,
    pub registry_id: String,
    pub choice: Choice,
    /// The auth method its members authenticate with (an upgrade keeps the agent's).
    pub auth_method: Option<String>,
}

impl AgentInstalls {
    pub(in crate::gateway) fn new(
        rows: Arc<dyn InstalledAgents>,
        placement: Arc<Placement>,
        config: InstallConfig,
    ) -> Self {
        let configured = placement.agents().names();
        AgentInstalls {
            rows,
            placement,
            installer: config.installer,
            source: config.registry,
            client: config.client,
            template: config.template,
            configured,
            registry: tokio::sync::Mutex::default(),
            tracked: Mutex::default(),
        }
    }

    /// The registry, read again when the copy kept is older than a minute (or `fresh`).
    pub(in crate::gateway) async fn registry(
        &self,
        fresh: bool,
    ) -> Result<Arc<RegistryIndex>, InstallError> {
        let mut kept = self.registry.lock().await;
        if let Some((at, index)) = kept.as_ref()
            && !fresh
            && at.elapsed() < REGISTRY_TTL
        {
            return Ok(index.clone());
        }
        let index = Arc::new(load(&self.source, &self.client).await?);
        *kept = Some((Instant::now(), index.clone()));
        Ok(index)
    }

    /// Where the registry is read, credentials masked.
    pub(in crate::gateway) fn source(&self) -> String {
        crate::redact::url(&self.source)
    }

    /// Whether `name` is an agent configured at start.
    pub(in crate::gateway) fn is_configured(&self, name: &str) -> bool {
        self.configured.iter().any(|c| c == name)
    }

    /// This replica's install of `name`, if it has one (running, under way or failed).
    pub(in crate::gateway) fn view(&self, name: &str) -> Option<InstallView> {
        let tracked = self.tracked.lock().expect("installs lock");
        tracked.get(name).map(|t| t.view.clone())
    }

    /// The installs this replica has, by name.
    pub(in crate::gateway) fn views(&self) -> BTreeMap<String, InstallView> {
        let tracked = self.tracked.lock().expect("installs lock");
        (tracked.iter())
            .map(|(n, t)| (n.clone(), t.view.clone()))
            .collect()
    }

    /// The rows of the store.
    pub(in crate::gateway) async fn rows(&self) -> crate::store::StoreResult<Vec<InstallRecord>> {
        self.rows.installs().await
    }

    /// Marks `wanted` as being installed here; `false` when an install of that name is under
    /// way already.
    pub(in crate::gateway) fn begin(&self, wanted: &Wanted, sha256: Option<String>) -> bool {
        let mut tracked = self.tracked.lock().expect("installs lock");
        if (tracked.get(&wanted.name)).is_some_and(|t| t.view.phase == InstallPhase::Installing) {
            return false;
        }
        let view = InstallView {
            registry_id: wanted.registry_id.clone(),
            kind: wanted.choice.kind.as_str().to_owned(),
            version: wanted.choice.version.clone(),
            source: wanted.choice.source.clone(),
            sha256,
            phase: InstallPhase::Installing,
            progress: Vec::new(),
            error: None,
        };
        tracked.insert(
            wanted.name.clone(),
            Tracked {
                view,
                failed_at: None,
                auth_method: wanted.auth_method.clone(),
            },
        );
        true
    }

    fn note(&self, name: &str, line: &str) {
        let mut tracked = self.tracked.lock().expect("installs lock");
        if let Some(t) = tracked.get_mut(name) {
            if t.view.progress.len() == PROGRESS_LINES {
                t.view.progress.remove(0);
            }
            t.view.progress.push(line.to_owned());
        }
    }

    fn finish(&self, name: &str, outcome: Result<Option<String>, String>) {
        let mut tracked = self.tracked.lock().expect("installs lock");
        if let Some(t) = tracked.get_mut(name) {
            match outcome {
                Ok(sha256) => {
                    t.view.phase = InstallPhase::Installed;
                    t.view.sha256 = sha256.or(t.view.sha256.take());
                    t.view.error = None;
                    t.failed_at = None;
                }
                Err(why) => {
                    tracing::warn!(agent = %name, error = %why, "installing the agent failed");
                    // Its folder, when no version is left in it.
                    let _ = std::fs::remove_dir(self.installer.root().join(name));
                    t.view.phase = InstallPhase::Failed;
                    t.view.error = Some(why);
                    t.failed_at = Some(Instant::now());
                }
            }
        }
    }

    /// Installs `wanted`'s files here (checked against `sha256` when given), noting progress.
    async fn files(&self, wanted: &Wanted, sha256: Option<&str>) -> Result<Installed, String> {
        let name = wanted.name.clone();
        let progress = move |line: &str| self.note(&name, line);
        (self.installer)
            .install(&wanted.name, &wanted.choice, sha256, &progress)
            .await
            .map_err(|e| e.to_string())
    }

    /// Starts the installed agent's pools (after the others), replacing a running one of its
    /// name, and tells the other replicas this one runs it.
    async fn start(&self, name: &str, installed: Installed, auth_method: Option<&str>) {
        let command = AgentCommand {
            program: installed.program.to_string_lossy().into_owned(),
            args: installed.args,
            env: installed.env.into_iter().collect(),
            ..AgentCommand::default()
        };
        let agents = self.placement.agents();
        if let Some(old) = agents.remove(name) {
            old.shutdown().await;
        }
        let mut setup = (self.template)(name, command);
        if let Some(method) = auth_method {
            let configs =
                std::iter::once(&mut setup.config).chain(setup.tenants.iter_mut().map(|(_, c)| c));
            for config in configs {
                config.auth_method = Some(method.to_owned());
                config.auth_meta = None;
            }
        }
        agents.add(setup);
        self.placement.cluster().set_agents(agents.names());
    }

    /// Installs a new agent here and records it: `Ok` once it runs; on any failure nothing of
    /// it is left (its files removed, no row).
    pub(in crate::gateway) async fn install_new(&self, wanted: Wanted) {
        let outcome = self.install_new_inner(&wanted).await;
        if outcome.is_err() {
            let _ = self.installer.remove(&wanted.name);
        }
        self.finish(&wanted.name, outcome);
    }

    async fn install_new_inner(&self, wanted: &Wanted) -> Result<Option<String>, String> {
        let installed = self.files(wanted, None).await?;
        let sha256 = installed.sha256.clone();
        let record = record_of(wanted, sha256.clone())?;
        match self.rows.add_install(&record).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "another replica installed an agent named {:?} meanwhile",
                    wanted.name
                ));
            }
            Err(e) => return Err(format!("recording the install failed: {e}")),
        }
        self.start(&wanted.name, installed, wanted.auth_method.as_deref())
            .await;
        self.note(&wanted.name, "running");
        Ok(sha256)
    }

    /// Upgrades (or downgrades) an installed agent here and records the new version; on a
    /// failure the version running goes on.
    pub(in crate::gateway) async fn upgrade(&self, wanted: Wanted) {
        let outcome = async {
            let installed = self.files(&wanted, None).await?;
            let sha256 = installed.sha256.clone();
            let record = record_of(&wanted, sha256.clone())?;
            match self.rows.replace_install(&record).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(format!("the agent {:?} was removed meanwhile", wanted.name));
                }
                Err(e) => return Err(format!("recording the upgrade failed: {e}")),
            }
            self.start(&wanted.name, installed, wanted.auth_method.as_deref())
                .await;
            self.note(&wanted.name, "running");
            Ok(sha256)
        }
        .await;
        self.finish(&wanted.name, outcome);
    }
}

/// The row of `wanted`, installed by this replica now.
pub(in crate::gateway) fn record_of(
    wanted: &Wanted,
    sha256: Option<String>,
) -> Result<InstallRecord, String> {
    {
        Ok(InstallRecord {
            name: wanted.name.clone(),
            registry_id: wanted.registry_id.clone(),
            kind: wanted.choice.kind.as_str().to_owned(),
            version: wanted.choice.version.clone(),
            choice: serde_json::to_string(&wanted.choice).map_err(|e| e.to_string())?,
            sha256,
            installed_at: chrono::Utc::now().timestamp_micros(),
            installed_by: crate::cluster::replica_id().to_owned(),
            auth_method: wanted.auth_method.clone(),
        })
    }
}

impl AgentInstalls {
    /// Removes an installed agent here: its row (so that every replica removes it), its pools
    /// and its files. `false` when it had no row.
    pub(in crate::gateway) async fn remove(&self, name: &str) -> crate::store::StoreResult<bool> {
        let had = self.rows.remove_install(name).await?;
        self.stop(name).await;
        Ok(had)
    }

    /// Stops the agent `name` here and removes its files.
    async fn stop(&self, name: &str) {
        let agents = self.placement.agents();
        if let Some(old) = agents.remove(name) {
            self.placement.cluster().set_agents(agents.names());
            old.shutdown().await;
        }
        self.tracked.lock().expect("installs lock").remove(name);
        if let Err(e) = self.installer.remove(name) {
            tracing::warn!(agent = %name, error = %e, "removing the agent's files failed");
        }
    }

    /// Makes the rows true here until `stop`: see the module's documentation.
    pub(in crate::gateway) async fn apply_forever(
        self: Arc<Self>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        loop {
            if let Err(e) = self.apply_once().await {
                tracing::warn!(error = %e, "reading the installed agents failed; trying again");
            }
            tokio::select! {
                _ = tokio::time::sleep(APPLY_EVERY) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Signs the agent of `row`, running here, in with the row's auth method when an admin
    /// signed it in through another replica since it started here.
    async fn sign_in_as(&self, row: &InstallRecord) {
        let (Some(method), Some(agent)) =
            (&row.auth_method, self.placement.agents().get(&row.name))
        else {
            return;
        };
        let applied = {
            let tracked = self.tracked.lock().expect("installs lock");
            tracked.get(&row.name).and_then(|t| t.auth_method.clone())
        };
        if applied.as_ref() == Some(method) {
            return;
        }
        let timeout = Duration::from_secs(60);
        if let Err(e) = agent.sign_in(method, timeout).await {
            tracing::warn!(agent = %row.name, error = %e, "signing the installed agent in failed");
        }
        self.signed_in(&row.name, method);
    }

    /// Notes that the agent `name` runs signed in with `method` here.
    pub(in crate::gateway) fn signed_in(&self, name: &str, method: &str) {
        let mut tracked = self.tracked.lock().expect("installs lock");
        if let Some(t) = tracked.get_mut(name) {
            t.auth_method = Some(method.to_owned());
        }
    }

    /// Records that an admin signed the installed agent `name` in with `method`, for every
    /// replica; `false` when it is not installed.
    pub(in crate::gateway) async fn record_sign_in(
        &self,
        name: &str,
        method: &str,
    ) -> crate::store::StoreResult<bool> {
        let recorded = self.rows.set_install_auth(name, Some(method)).await?;
        if recorded {
            self.signed_in(name, method);
        }
        Ok(recorded)
    }

    /// Compares the rows with what runs here, once.
    pub(in crate::gateway) async fn apply_once(&self) -> crate::store::StoreResult<()> {
        let rows = self.rows.installs().await?;
        for row in &rows {
            if self.is_configured(&row.name) {
                continue;
            }
            let here = self.view(&row.name);
            let current = here
                .as_ref()
                .is_some_and(|v| v.version == row.version && v.phase != InstallPhase::Failed);
            let resting = {
                let tracked = self.tracked.lock().expect("installs lock");
                (tracked.get(&row.name))
                    .and_then(|t| t.failed_at)
                    .is_some_and(|at| at.elapsed() < RETRY_FAILED)
            };
            if resting {
                continue;
            }
            if current {
                self.sign_in_as(row).await;
                continue;
            }
            let choice: Choice = match serde_json::from_str(&row.choice) {
                Ok(choice) => choice,
                Err(e) => {
                    tracing::warn!(agent = %row.name, error = %e, "an installed agent's row cannot be read");
                    continue;
                }
            };
            let wanted = Wanted {
                name: row.name.clone(),
                registry_id: row.registry_id.clone(),
                choice,
                auth_method: row.auth_method.clone(),
            };
            if !self.begin(&wanted, row.sha256.clone()) {
                continue;
            }
            let outcome = match self.files(&wanted, row.sha256.as_deref()).await {
                Ok(installed) => {
                    self.start(&row.name, installed, row.auth_method.as_deref())
                        .await;
                    self.note(&row.name, "running");
                    Ok(row.sha256.clone())
                }
                Err(why) => Err(why),
            };
            self.finish(&row.name, outcome);
        }
        // Running here, with no row: removed through another replica.
        let gone: Vec<String> = (self.views().into_iter())
            .filter(|(n, v)| {
                v.phase == InstallPhase::Installed && rows.iter().all(|r| &r.name != n)
            })
            .map(|(n, _)| n)
            .collect();
        for name in gone {
            self.stop(&name).await;
        }
        Ok(())
    }
}
