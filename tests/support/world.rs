//! A test's [`World`]: a temp dir, a [`Database`] of its own and one gateway started with
//! [`Options`] (the tests' defaults record the gateway's log and the agent's calls in files,
//! [`Options::bench`] records nothing).

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::gateway::Gateway;
use super::postgres::{Collation, FreshDatabase};
use super::{Backend, PATIENCE, echo_agent};

/// A gateway's store: an SQLite file, or a fresh PostgreSQL database.
pub struct Database {
    pub url: String,
    postgres: Option<FreshDatabase>,
}

impl Database {
    /// SQLite: `dir/gateway.db` (`dir` is created). PostgreSQL: `acpgw_<label>_<random>` on the
    /// server of `DATABASE_URL` (which must be set).
    pub async fn create(backend: Backend, dir: &Path, label: &str) -> Database {
        match backend {
            Backend::Sqlite => {
                std::fs::create_dir_all(dir).unwrap();
                Database {
                    url: format!("sqlite:{}", dir.join("gateway.db").display()),
                    postgres: None,
                }
            }
            Backend::Postgres => {
                let db = FreshDatabase::create(label, Collation::ServerDefault).await;
                Database {
                    url: db.url.clone(),
                    postgres: Some(db),
                }
            }
        }
    }

    /// Drops a PostgreSQL database (an SQLite file goes with its directory).
    pub async fn remove(&mut self) {
        if let Some(db) = self.postgres.take() {
            db.remove().await;
        }
    }
}

/// How to start a gateway. The default is a test's: the debug build, one agent, the gateway's
/// log in `DIR/gateway.log` and the agent's calls in `DIR/calls.log`.
#[derive(Clone)]
pub struct Options {
    pub binary: PathBuf,
    /// The agent it runs: the echo agent unless a bench picks the bench agent.
    pub agent: PathBuf,
    pub pool_size: usize,
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    pub wait_ready: bool,
    pub rust_log: String,
    /// Whether the gateway's stderr goes to `DIR/gateway.log` and the agent logs its calls to
    /// `DIR/calls.log` (what tests read), or stderr stays this process's and nothing is logged.
    pub record: bool,
    /// How often readiness is polled.
    pub ready_poll: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            binary: PathBuf::from(env!("CARGO_BIN_EXE_acp-gateway")),
            agent: echo_agent(),
            pool_size: 1,
            env: vec![],
            args: vec![],
            wait_ready: true,
            rust_log: "info,acp_gateway=debug".into(),
            record: true,
            ready_poll: Duration::from_millis(50),
        }
    }
}

impl Options {
    /// A bench's gateway (the release build): warnings only, on this process's stderr, no call
    /// log in the agent's way, and readiness polled every millisecond, so that
    /// [`Gateway::ready_after`] is a start-up figure.
    pub fn bench() -> Self {
        Options {
            // No per-request lines in the measurements' way.
            rust_log: "warn,tower_http=off".into(),
            record: false,
            ready_poll: Duration::from_millis(1),
            ..Options::default()
        }
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.into());
        self
    }
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }
    /// Listens on `address` (`127.0.0.1:PORT`) instead of a port of its own choosing: to start
    /// again where a gateway was ([`Gateway::address`]).
    pub fn listen(mut self, address: &str) -> Self {
        if let Some(at) = self.args.iter().position(|a| a == "--listen") {
            self.args.drain(at..(at + 2).min(self.args.len()));
        }
        self.args
            .extend(["--listen".to_owned(), address.to_owned()]);
        self
    }
    /// The address `--listen` names, if any.
    pub fn listening(&self) -> Option<&str> {
        let at = self.args.iter().position(|a| a == "--listen")?;
        self.args.get(at + 1).map(String::as_str)
    }
    pub fn pool(mut self, n: usize) -> Self {
        self.pool_size = n;
        self
    }
    pub fn no_wait(mut self) -> Self {
        self.wait_ready = false;
        self
    }
    /// Another build of the gateway.
    pub fn binary(mut self, binary: &Path) -> Self {
        self.binary = binary.to_owned();
        self
    }
}

/// A test's world: temp dir (agent state, call log, SQLite file), database, one gateway.
pub struct World {
    // Dropped in this order: the gateway before its database, the database before the dir.
    pub gw: Option<Gateway>,
    pub db: Database,
    pub dir: tempfile::TempDir,
    pub opts: Options,
}

impl World {
    pub async fn start(backend: Backend, opts: Options) -> World {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(backend, dir.path(), "it").await;
        let gw = Gateway::spawn(&db.url, dir.path(), &opts).await;
        World {
            gw: Some(gw),
            db,
            dir,
            opts,
        }
    }

    /// Starts a world and creates one session in `/tmp`; returns the world and the session.
    pub async fn with_session(backend: Backend, opts: Options) -> (World, String) {
        let w = World::start(backend, opts).await;
        let id = w.gw().create("/tmp").await;
        (w, id)
    }

    pub fn gw(&self) -> &Gateway {
        self.gw.as_ref().unwrap()
    }

    /// The world's own folder (its database, its agent's state, its workspaces).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The echo agent's state directory, shared by every gateway of this world.
    pub fn agent_dir(&self) -> PathBuf {
        self.dir.path().join("agent")
    }

    /// Stops the gateway (SIGTERM) and starts it again on the same database and agent state.
    pub async fn restart(&mut self) {
        if let Some(gw) = self.gw.take() {
            gw.stop().await;
        }
        self.gw = Some(Gateway::spawn(&self.db.url, self.dir.path(), &self.opts).await);
    }

    /// As [`World::restart`], where the gateway listened: its clients find it again.
    pub async fn restart_in_place(&mut self) {
        let address = self.gw().address().to_owned();
        self.opts = self.opts.clone().listen(&address);
        self.restart().await;
    }

    /// SIGKILLs the gateway: no shutdown of its own. [`World::restart`] starts it again.
    pub async fn kill_gateway(&mut self) {
        if let Some(mut gw) = self.gw.take() {
            gw.kill().await;
        }
    }

    /// Lines of the agent's call log that start with `method`.
    pub fn calls(&self, method: &str) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("calls.log")).unwrap_or_default();
        log.lines()
            .filter(|l| l.split(' ').next() == Some(method))
            .count()
    }

    /// Lines of the agent's call log of `method` about session `id`.
    pub fn calls_about(&self, method: &str, id: &str) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("calls.log")).unwrap_or_default();
        log.lines()
            .filter(|l| l.split_once(' ') == Some((method, id)))
            .count()
    }

    /// The gateway's log (stderr) so far, over all restarts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    pub async fn finish(mut self) {
        if let Some(gw) = self.gw.take() {
            gw.stop().await;
        }
        self.db.remove().await;
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- gateway log -----\n{}----- end of gateway log -----",
                self.log()
            );
        }
    }
}
