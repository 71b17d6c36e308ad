//! A PostgreSQL cluster of a test's own (`initdb` + `pg_ctl` on a free port, in a temp dir),
//! which the test may stop and start at will: the shared server of `DATABASE_URL` is untouched.
//!
//! A test that starts one is declared ignored, with the reason [`NEEDS_INITDB`], where `build.rs`
//! found no `initdb` (`cfg(initdb)`), so cargo's summary counts it instead of a pass.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::PATIENCE;

/// The reason a test that starts a cluster is ignored without `initdb`; every such test's
/// `ignore` says this (an attribute takes a literal, not this constant).
pub const NEEDS_INITDB: &str = "needs PostgreSQL's initdb: /usr/lib/postgresql";

/// A PostgreSQL cluster in a temp dir, on a port of its own; stopped (immediately) when
/// dropped, also when the test panics.
pub struct PgCluster {
    bin: PathBuf,
    data: PathBuf,
    options: String,
    /// As root, the cluster's commands run as `postgres` (initdb refuses root).
    run_as: Option<String>,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PgCluster {
    /// The newest `/usr/lib/postgresql/*/bin` with an `initdb`.
    fn bin_dir() -> Option<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin"))
            .filter(|bin| bin.join("initdb").is_file())
            .collect();
        dirs.sort_by_key(|d| {
            d.parent()
                .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
                .unwrap_or(0)
        });
        dirs.pop()
    }

    /// Creates and starts a cluster; panics, saying why, without `initdb` on this machine (a
    /// test ignored for that reason and run anyway with `--ignored`).
    pub fn start() -> PgCluster {
        let bin = Self::bin_dir().unwrap_or_else(|| panic!("{NEEDS_INITDB}/*/bin has none"));
        let dir = tempfile::tempdir().unwrap();
        let uid = Command::new("id").arg("-u").output().unwrap().stdout;
        let run_as = (String::from_utf8_lossy(&uid).trim() == "0").then(|| "postgres".to_owned());
        if let Some(user) = &run_as {
            let id = |flag: &str| -> u32 {
                let out = Command::new("id").args([flag, user]).output().unwrap();
                String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
            };
            std::os::unix::fs::chown(dir.path(), Some(id("-u")), Some(id("-g"))).unwrap();
        }
        let data = dir.path().join("data");
        let mut cluster = PgCluster {
            bin,
            data,
            options: String::new(),
            run_as,
            port: 0,
            _dir: dir,
        };
        let data = cluster.data.display().to_string();
        cluster.run(
            "initdb",
            &["-D", &data, "-U", "postgres", "-A", "trust", "--no-sync"],
        );
        // PostgreSQL takes a port number, not 0: it is offered a free one, and another when
        // some other process took that one first (its start fails so, and only so).
        let deadline = Instant::now() + PATIENCE;
        loop {
            cluster.port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            cluster.options = format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
                cluster.port,
                cluster._dir.path().display()
            );
            match cluster.try_pg_ctl("start") {
                Ok(()) => return cluster,
                Err(said) => assert!(
                    in_use(&said) && Instant::now() < deadline,
                    "pg_ctl start: {said}"
                ),
            }
        }
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs one of the cluster's programs; panics unless it succeeds.
    fn run(&self, program: &str, args: &[&str]) {
        let out = self.command(program, args).output().unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn command(&self, program: &str, args: &[&str]) -> Command {
        let path = self.bin.join(program);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(path);
                c
            }
            None => Command::new(path),
        };
        cmd.args(args);
        cmd
    }

    /// `pg_ctl start|stop|restart`, waiting until it is done; fast shutdown. A start on the
    /// cluster's port while another process holds it for a moment (as a connection's ephemeral
    /// port) is tried again, on that error only, within [`PATIENCE`].
    pub fn pg_ctl(&self, action: &str) {
        let deadline = Instant::now() + PATIENCE;
        while let Err(said) = self.try_pg_ctl(action) {
            assert!(
                action != "stop" && in_use(&said) && Instant::now() < deadline,
                "pg_ctl {action}: {said}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `pg_ctl action`, or what it and the server's log said when it failed.
    fn try_pg_ctl(&self, action: &str) -> Result<(), String> {
        let data = self.data.display().to_string();
        let log = self.data.with_file_name("server.log");
        let logged = std::fs::metadata(&log).map_or(0, |m| m.len()) as usize;
        let out = self
            .command(
                "pg_ctl",
                &[
                    action,
                    "-D",
                    &data,
                    "-l",
                    &log.display().to_string(),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    &self.options,
                ],
            )
            .output()
            .unwrap();
        if out.status.success() {
            return Ok(());
        }
        let server = std::fs::read(&log).unwrap_or_default();
        Err(format!(
            "{}{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(server.get(logged..).unwrap_or_default())
        ))
    }
}

/// Whether PostgreSQL said it could not listen because its address is in use.
fn in_use(said: &str) -> bool {
    said.contains("Address already in use")
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.data.display().to_string();
        let _ = self
            .command("pg_ctl", &["stop", "-D", &data, "-m", "immediate", "-w"])
            .output();
    }
}
