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
use crate::pool::{AgentPool, AgentSetup, SignIn};
use crate::store::{InstallRecord, InstalledAgents};
use tokio_util::sync::CancellationToken;

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

/// One agent's install on this replica.
struct Tracked {
    /// Its latest install here (an upgrade that failed shows here, its version beside the one
    /// running).
    view: InstallView,
    /// The version running here, if one does.
    running: Option<String>,
    failed_at: Option<Instant>,
    /// How its members sign in here, as an admin last said (`None`: as installed).
    sign_in: Option<SignIn>,
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
    /// Held while the agents running here are made to agree with the rows (a row written or
    /// removed, a pool started or taken out), so that an install, an upgrade, a removal and
    /// the replica's own pass over the rows never interleave.
    changes: tokio::sync::Mutex<()>,
    /// The gateway's stop: nothing starts once it is cancelled.
    stop: CancellationToken,
}

/// What a new install, or an upgrade, is of.
pub(in crate::gateway) struct Wanted {
    pub name: String,
    pub registry_id: String,
    pub choice: Choice,
    /// How its members sign in, as an admin last said (`None`: as installed; an upgrade keeps
    /// the agent's).
    pub sign_in: Option<SignIn>,
}

/// How the members of the agent of `row` sign in, as an admin last said.
pub(in crate::gateway) fn sign_in_of(row: &InstallRecord) -> Option<SignIn> {
    match (&row.auth_method, row.logged_out) {
        (Some(method), _) => Some(SignIn::With(method.clone())),
        (None, true) => Some(SignIn::Out),
        (None, false) => None,
    }
}

/// The row of `wanted`, installed by this replica now.
pub(in crate::gateway) fn record_of(
    wanted: &Wanted,
    sha256: Option<String>,
) -> Result<InstallRecord, String> {
    Ok(InstallRecord {
        name: wanted.name.clone(),
        registry_id: wanted.registry_id.clone(),
        kind: wanted.choice.kind.as_str().to_owned(),
        version: wanted.choice.version.clone(),
        choice: serde_json::to_string(&wanted.choice).map_err(|e| e.to_string())?,
        sha256,
        installed_at: chrono::Utc::now().timestamp_micros(),
        installed_by: crate::cluster::replica_id().to_owned(),
        auth_method: match &wanted.sign_in {
            Some(SignIn::With(method)) => Some(method.clone()),
            _ => None,
        },
        logged_out: wanted.sign_in == Some(SignIn::Out),
    })
}

/// How a row is written once its files are in.
enum Commit {
    /// A new agent: its row inserted (another replica may have won the name).
    New,
    /// Another version of an installed agent: its row replaced.
    Upgrade,
    /// A row another replica wrote: it must still say what was installed.
    Apply,
}

impl AgentInstalls {
    pub(in crate::gateway) fn new(
        rows: Arc<dyn InstalledAgents>,
        placement: Arc<Placement>,
        config: InstallConfig,
        stop: CancellationToken,
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
            changes: tokio::sync::Mutex::default(),
            stop,
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
        let now = tracked.get(&wanted.name);
        if now.is_some_and(|t| t.view.phase == InstallPhase::Installing) {
            return false;
        }
        let running = now.and_then(|t| t.running.clone());
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
        let entry = Tracked {
            view,
            running,
            failed_at: None,
            sign_in: wanted.sign_in.clone(),
        };
        tracked.insert(wanted.name.clone(), entry);
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
        let Some(t) = tracked.get_mut(name) else {
            return;
        };
        match outcome {
            Ok(sha256) => {
                t.view.phase = InstallPhase::Installed;
                t.view.sha256 = sha256.or(t.view.sha256.take());
                t.view.error = None;
                t.failed_at = None;
            }
            Err(why) => {
                tracing::warn!(agent = %name, error = %why, "installing the agent failed");
                t.view.phase = InstallPhase::Failed;
                t.view.error = Some(why);
                t.failed_at = Some(Instant::now());
            }
        }
    }

    /// The version of `name` running here.
    fn running(&self, name: &str) -> Option<String> {
        let tracked = self.tracked.lock().expect("installs lock");
        tracked.get(name).and_then(|t| t.running.clone())
    }

    /// Installs `wanted` here (its files checked against `sha256` when given), then, holding
    /// [`changes`](Self::changes), writes its row as `commit` says and starts it; records the
    /// outcome. On a failure the version running (if any) goes on and the files this install
    /// made are removed.
    async fn install(&self, wanted: Wanted, sha256: Option<String>, commit: Commit) {
        let outcome = self.install_inner(&wanted, sha256.as_deref(), commit).await;
        if outcome.is_err() && self.running(&wanted.name).as_ref() != Some(&wanted.choice.version) {
            let removed = (self.installer).remove_version(&wanted.name, &wanted.choice.version);
            if let Err(e) = removed {
                tracing::warn!(agent = %wanted.name, error = %e, "removing a failed install's files");
            }
        }
        self.finish(&wanted.name, outcome);
    }

    async fn install_inner(
        &self,
        wanted: &Wanted,
        sha256: Option<&str>,
        commit: Commit,
    ) -> Result<Option<String>, String> {
        let name = wanted.name.clone();
        let progress = move |line: &str| self.note(&name, line);
        let installed = (self.installer)
            .install(&wanted.name, &wanted.choice, sha256, &progress)
            .await
            .map_err(|e| e.to_string())?;
        let sha256 = installed.sha256.clone();
        let record = record_of(wanted, sha256.clone())?;
        let changes = self.changes.lock().await;
        if self.stop.is_cancelled() {
            return Err("the gateway is stopping".to_owned());
        }
        let stored = |e: crate::store::StoreError| format!("recording the install failed: {e}");
        let taken = match commit {
            Commit::New => !self.rows.add_install(&record).await.map_err(stored)?,
            Commit::Upgrade => !self.rows.replace_install(&record).await.map_err(stored)?,
            Commit::Apply => {
                let rows = self.rows.installs().await.map_err(stored)?;
                !rows
                    .iter()
                    .any(|r| r.name == record.name && r.choice == record.choice)
            }
        };
        if taken {
            return Err(match commit {
                Commit::New => format!(
                    "another replica installed an agent named {:?} meanwhile",
                    wanted.name
                ),
                _ => format!(
                    "the agent {:?} was removed or changed meanwhile",
                    wanted.name
                ),
            });
        }
        let before = self.running(&wanted.name);
        let old = self.start(wanted, installed);
        drop(changes);
        if let Some(old) = old {
            old.retire().await;
        }
        if let Some(before) = before.filter(|v| v != &wanted.choice.version) {
            let _ = self.installer.remove_version(&wanted.name, &before);
        }
        self.note(&wanted.name, "running");
        Ok(sha256)
    }

    /// Starts the installed agent's pools, in place of a running one of its name (returned,
    /// for the caller to stop), and tells the other replicas this one runs it.
    fn start(&self, wanted: &Wanted, installed: Installed) -> Option<Arc<AgentPool>> {
        let command = AgentCommand {
            program: installed.program.to_string_lossy().into_owned(),
            args: installed.args,
            env: installed.env.into_iter().collect(),
            ..AgentCommand::default()
        };
        let mut setup = (self.template)(&wanted.name, command);
        if let Some(sign_in) = &wanted.sign_in {
            let method = match sign_in {
                SignIn::With(method) => Some(method.clone()),
                SignIn::Out => None,
            };
            let configs =
                std::iter::once(&mut setup.config).chain(setup.tenants.iter_mut().map(|(_, c)| c));
            for config in configs {
                config.auth_method = method.clone();
                config.auth_meta = None;
            }
        }
        let agents = self.placement.agents();
        let old = agents.put(setup);
        self.placement.cluster().set_agents(agents.names());
        let mut tracked = self.tracked.lock().expect("installs lock");
        if let Some(t) = tracked.get_mut(&wanted.name) {
            t.running = Some(wanted.choice.version.clone());
            t.sign_in = wanted.sign_in.clone();
        }
        old
    }

    /// Installs a new agent here and records it (see [`install`](Self::install)).
    pub(in crate::gateway) async fn install_new(&self, wanted: Wanted) {
        self.install(wanted, None, Commit::New).await;
    }

    /// Moves an installed agent here to another version and records it; on a failure the
    /// version running goes on.
    pub(in crate::gateway) async fn upgrade(&self, wanted: Wanted) {
        self.install(wanted, None, Commit::Upgrade).await;
    }

    /// Removes an installed agent: its row (so that every replica removes it), then its pools
    /// and files here. `false` when it had no row.
    pub(in crate::gateway) async fn remove(&self, name: &str) -> crate::store::StoreResult<bool> {
        let changes = self.changes.lock().await;
        let had = self.rows.remove_install(name).await?;
        let old = self.take_out(name);
        drop(changes);
        self.stop_files(name, old).await;
        Ok(had)
    }

    /// Takes the agent `name` out of those running here (returned, for the caller to stop).
    fn take_out(&self, name: &str) -> Option<Arc<AgentPool>> {
        let agents = self.placement.agents();
        let old = agents.remove(name);
        self.placement.cluster().set_agents(agents.names());
        self.tracked.lock().expect("installs lock").remove(name);
        old
    }

    /// Stops `old` (the agent `name` taken out) and removes its files.
    async fn stop_files(&self, name: &str, old: Option<Arc<AgentPool>>) {
        if let Some(old) = old {
            old.retire().await;
        }
        if let Err(e) = self.installer.remove(name) {
            tracing::warn!(agent = %name, error = %e, "removing the agent's files failed");
        }
    }

    /// Records that an admin signed the installed agent `name` in with `method`, for every
    /// replica; `false` when it is not installed.
    pub(in crate::gateway) async fn record_sign_in(
        &self,
        name: &str,
        method: Option<&str>,
    ) -> crate::store::StoreResult<bool> {
        let recorded = self.rows.set_install_auth(name, method).await?;
        if recorded {
            let how = method.map_or(SignIn::Out, |m| SignIn::With(m.to_owned()));
            self.signed_in(name, Some(how));
        }
        Ok(recorded)
    }

    /// Notes how the agent `name` runs signed in here.
    fn signed_in(&self, name: &str, how: Option<SignIn>) {
        let mut tracked = self.tracked.lock().expect("installs lock");
        if let Some(t) = tracked.get_mut(name) {
            t.sign_in = how;
        }
    }

    /// Signs the agent of `row`, running here, in with the row's auth method, or out, when an
    /// admin signed it in or out through another replica since it started here.
    async fn sign_in_as(&self, row: &InstallRecord) {
        let Some(agent) = self.placement.agents().get(&row.name) else {
            return;
        };
        let wanted = sign_in_of(row);
        let applied = {
            let tracked = self.tracked.lock().expect("installs lock");
            tracked.get(&row.name).and_then(|t| t.sign_in.clone())
        };
        if applied == wanted {
            return;
        }
        let timeout = Duration::from_secs(60);
        let done = match &wanted {
            Some(SignIn::With(method)) => agent.sign_in(method, timeout).await,
            Some(SignIn::Out) => (agent.sign_out(timeout).await).map_err(|e| e.to_string()),
            None => Ok(()),
        };
        if let Err(e) = done {
            tracing::warn!(agent = %row.name, error = %e, "signing the installed agent in or out failed");
        }
        self.signed_in(&row.name, wanted);
    }

    /// Makes the rows true here until the gateway stops: see the module's documentation.
    pub(in crate::gateway) async fn apply_forever(self: Arc<Self>) {
        let stop = self.stop.clone();
        loop {
            tokio::select! {
                applied = self.apply_once() => if let Err(e) = applied {
                    tracing::warn!(error = %e, "reading the installed agents failed; trying again");
                },
                _ = stop.cancelled() => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(APPLY_EVERY) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Compares the rows with what runs here, once: first takes out what no row holds any
    /// more, then installs, upgrades or signs in what the rows say.
    pub(in crate::gateway) async fn apply_once(&self) -> crate::store::StoreResult<()> {
        for row in self.take_out_removed().await? {
            if self.is_configured(&row.name) {
                continue;
            }
            let (running, resting) = {
                let tracked = self.tracked.lock().expect("installs lock");
                let t = tracked.get(&row.name);
                (
                    t.and_then(|t| t.running.clone()),
                    t.is_some_and(|t| {
                        t.view.phase == InstallPhase::Installing
                            || t.failed_at.is_some_and(|at| at.elapsed() < RETRY_FAILED)
                    }),
                )
            };
            if running.as_ref() == Some(&row.version) {
                self.sign_in_as(&row).await;
                continue;
            }
            if resting {
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
                sign_in: sign_in_of(&row),
            };
            if self.begin(&wanted, row.sha256.clone()) {
                self.install(wanted, row.sha256.clone(), Commit::Apply)
                    .await;
            }
        }
        Ok(())
    }

    /// Stops here every installed agent no row holds any more (removed through another
    /// replica, or started here by an install whose row was removed meanwhile); answers the
    /// rows it read.
    async fn take_out_removed(&self) -> crate::store::StoreResult<Vec<InstallRecord>> {
        let changes = self.changes.lock().await;
        let rows = self.rows.installs().await?;
        let gone: Vec<String> = (self.placement.agents().names().into_iter())
            .filter(|n| !self.is_configured(n) && rows.iter().all(|r| &r.name != n))
            .collect();
        let old: Vec<_> = gone.iter().map(|n| (n.clone(), self.take_out(n))).collect();
        drop(changes);
        for (name, old) in old {
            self.stop_files(&name, old).await;
        }
        Ok(rows)
    }
}
