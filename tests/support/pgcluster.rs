//! A PostgreSQL cluster of a test's own (`initdb` + `pg_ctl` on a free port, in a temp dir),
//! which the test may stop and start at will: the shared server of `DATABASE_URL` is untouched.
//!
//! A test that starts one is declared ignored, with the reason [`NEEDS_INITDB`], where `build.rs`
//! found no `initdb` (`cfg(initdb)`), so cargo's summary counts it instead of a pass.

use std::path::PathBuf;
use std::process::Command;

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
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            dir.path().display()
        );
        let cluster = PgCluster {
            bin,
            data,
            options,
            run_as,
            port,
            _dir: dir,
        };
        let data = cluster.data.display().to_string();
        cluster.run(
            "initdb",
            &["-D", &data, "-U", "postgres", "-A", "trust", "--no-sync"],
        );
        cluster.pg_ctl("start");
        cluster
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

    /// `pg_ctl start|stop|restart`, waiting until it is done; fast shutdown.
    pub fn pg_ctl(&self, action: &str) {
        let data = self.data.display().to_string();
        let log = self.data.with_file_name("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                action,
                "-D",
                &data,
                "-l",
                &log,
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
                "-o",
                &self.options,
            ],
        );
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.data.display().to_string();
        let _ = self
            .command("pg_ctl", &["stop", "-D", &data, "-m", "immediate", "-w"])
            .output();
    }
}
