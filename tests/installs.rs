//! Agents installed from an ACP registry served on loopback in the official format: the echo
//! agent packed with a launcher as a binary archive is listed, installed by an admin (a
//! tenant's key gets 403), runs sessions, comes back after a restart, is refused removal while
//! a session of it is live, and is removed with its files; archives that are missing, corrupt,
//! that write outside their folder, or that changed after their first install are refused
//! with their cause and nothing left behind; on PostgreSQL, an agent installed through one
//! replica runs on the other and leaves it when removed; and two real agents from the npm
//! registry, pinned: the Claude adapter runs sessions, the Codex adapter answers
//! `auth_required` with its methods until an admin signs it in with a key from the gateway's
//! environment, which holds across a restart.

use crate::support;

use std::path::Path;

use reqwest::Method;
use serde_json::{Value, json};
use support::registry::Registry;
use support::*;

const ADMIN: &str = "admin-key-0123456789";
const ANN: &str = "ann-key-0123456789ab";

both_backends!(a_registry_agent_is_installed_run_kept_and_removed);

/// The registry: `echo-acp` (the echo agent), and three archives that must be refused.
async fn registry(dir: &Path) -> Registry {
    let registry = Registry::serve(&dir.join("registry")).await;
    registry.pack_echo("echo.tar.gz", "first");
    registry.pack(
        "escape.tar.gz",
        &[
            ("../../escaped", b"outside\n", 0o644),
            ("../../../escaped", b"outside\n", 0o644),
            ("bin/agent", b"#!/bin/sh\n", 0o755),
        ],
        &[],
    );
    registry.pack("link.tar.gz", &[], &[("bin", "/tmp")]);
    std::fs::write(
        registry.dir.join("corrupt.tar.gz"),
        b"\x1f\x8b not gzip at all",
    )
    .unwrap();
    registry.publish(&[
        ("echo-acp", "echo.tar.gz"),
        ("escape-acp", "escape.tar.gz"),
        ("link-acp", "link.tar.gz"),
        ("corrupt-acp", "corrupt.tar.gz"),
        ("missing-acp", "missing.tar.gz"),
    ]);
    registry
}

fn options(registry: &Registry, agents_dir: &Path) -> Options {
    Options::default().args(&[
        "--admin-api-key",
        ADMIN,
        "--api-key",
        &format!("acme:{ANN}"),
        "--registry",
        &registry.url(),
        "--agents-dir",
        agents_dir.to_str().unwrap(),
    ])
}

/// `GET /agents/{name}` once its install is no longer under way.
async fn installed(gw: &Gateway, name: &str) -> Value {
    installed_within(gw, name, PATIENCE).await
}

/// [`installed`], waiting up to `patience`.
async fn installed_within(gw: &Gateway, name: &str, patience: std::time::Duration) -> Value {
    let deadline = std::time::Instant::now() + patience;
    loop {
        let (_, view) = gw
            .with_key(Some(ADMIN))
            .get(&format!("/agents/{name}"))
            .await;
        match view["installed"]["phase"].as_str() {
            Some("failed") => return view,
            Some("installed") if view["ready"] == true => return view,
            _ => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} not installed: {view}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Asks for an install (`body`) with `keyed`'s key: 202, and the install as it begins.
async fn begin_install(keyed: &support::gateway::Keyed<'_>, body: Value) -> Value {
    keyed
        .send_expecting(Method::POST, "/agents", Some(body), 202)
        .await
}

/// A new session of `agent`, made with `keyed`'s key: its id.
async fn session_on(keyed: &support::gateway::Keyed<'_>, agent: &str) -> String {
    let body = json!({"cwd": "/tmp", "agent": agent});
    let made = keyed
        .send_expecting(Method::POST, "/sessions", Some(body), 201)
        .await;
    made["sessionId"].as_str().unwrap().to_owned()
}

/// Whether a tenant's new session of `echo-acp` on `gw` is answered `status`.
async fn creates(gw: &Gateway, status: u16) -> bool {
    let body = json!({"cwd": "/tmp", "agent": "echo-acp"});
    gw.with_key(Some(ANN)).post("/sessions", body).await.0 == status
}

/// Deletes every session `keyed` sees.
async fn delete_all(keyed: &support::gateway::Keyed<'_>) {
    let listed = keyed
        .send_expecting(Method::GET, "/sessions", None, 200)
        .await;
    for made in listed["sessions"].as_array().unwrap() {
        let path = format!("/sessions/{}", made["sessionId"].as_str().unwrap());
        keyed.send_expecting(Method::DELETE, &path, None, 204).await;
    }
}

/// What is left under the agents' folder (staging folders included).
fn left(agents_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(agents_dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

async fn a_registry_agent_is_installed_run_kept_and_removed(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry(dir.path()).await;
    let agents_dir = dir.path().join("agents");
    let mut w = World::start(backend, options(&registry, &agents_dir)).await;
    let (admin, ann) = (w.gw().with_key(Some(ADMIN)), w.gw().with_key(Some(ANN)));

    // Listed in the official shape, with what runs on this machine; nothing installed yet.
    let listed = ann
        .send_expecting(Method::GET, "/registry", None, 200)
        .await;
    let echo = &listed["agents"].as_array().unwrap()[0];
    assert_eq!(listed["agents"].as_array().unwrap().len(), 5, "{listed}");
    assert_eq!(echo["id"], "echo-acp");
    assert_eq!(echo["kinds"], json!(["binary"]));
    assert_eq!(echo["installed"], json!([]));

    // Only an admin installs.
    let body = json!({"registry": "echo-acp", "name": "echo2"});
    let (status, problem) = ann.post("/agents", body.clone()).await;
    assert_eq!(status, 403, "{problem}");
    let (status, problem) = admin.post("/agents", json!({"registry": "nope"})).await;
    assert_eq!(status, 404, "{problem}");
    let begun = begin_install(&admin, body.clone()).await;
    assert_eq!(begun["phase"], "installing", "{begun}");
    let view = installed(w.gw(), "echo2").await;
    assert_eq!(view["installed"]["phase"], "installed", "{view}");
    assert_eq!(view["installed"]["sha256"], registry.sha256("echo.tar.gz"));
    assert_eq!(view["installed"]["kind"], "binary");
    let (status, _) = admin.post("/agents", body.clone()).await;
    assert_eq!(status, 409, "a name is installed once");

    // It runs sessions, as the packed echo agent with the registry's environment.
    let id = session_on(&ann, "echo2").await;
    assert_eq!(
        ann.said(&id, "/env ECHO_AGENT_PACKED").await,
        "ECHO_AGENT_PACKED=yes"
    );
    let listed = ann
        .send_expecting(Method::GET, "/registry", None, 200)
        .await;
    assert_eq!(listed["agents"][0]["installed"], json!(["echo2"]));

    // Every refused archive says why and leaves nothing behind.
    for (agent, why) in [
        ("escape-acp", "refused"),
        ("link-acp", "refused"),
        ("corrupt-acp", "archive"),
        ("missing-acp", "404"),
    ] {
        begin_install(&admin, json!({"registry": agent})).await;
        let view = installed(w.gw(), agent).await;
        assert_eq!(view["installed"]["phase"], "failed", "{view}");
        let error = view["installed"]["error"].as_str().unwrap();
        assert!(error.contains(why), "{agent}: {error}");
        assert_eq!(left(&agents_dir), ["echo2"], "{agent} left something");
    }
    assert!(!dir.path().join("escaped").exists() && !agents_dir.join("escaped").exists());

    // Upgraded to the registry's next version: the new files run, the old ones are gone.
    registry.pack_echo("echo-2.tar.gz", "second");
    registry.publish_at("2.0.0", &[("echo-acp", "echo-2.tar.gz")]);
    let (status, _) = ann.post("/agents/echo2/upgrade", json!({})).await;
    assert_eq!(status, 403);
    let begun = admin
        .send_expecting(Method::POST, "/agents/echo2/upgrade", Some(json!({})), 202)
        .await;
    assert_eq!(begun["version"], "2.0.0", "{begun}");
    w.gw()
        .wait_until(|g| async move {
            let (_, v) = g.with_key(Some(ADMIN)).get("/agents/echo2").await;
            v["installed"]["version"] == "2.0.0"
                && v["installed"]["phase"] == "installed"
                && v["ready"] == true
        })
        .await;
    let (status, _) = admin.post("/agents/echo2/upgrade", json!({})).await;
    assert_eq!(status, 409, "at that version already");
    assert_eq!(ann.said(&id, "upgraded").await, "upgraded");
    assert_eq!(left(&agents_dir.join("echo2")), ["2.0.0"]);

    // Kept across a restart: the same files, started again without a download (the archive
    // is gone from the registry).
    std::fs::remove_file(registry.dir.join("echo-2.tar.gz")).unwrap();
    w.restart().await;
    let view = installed(w.gw(), "echo2").await;
    assert_eq!(view["installed"]["phase"], "installed", "{view}");
    assert_eq!(view["installed"]["version"], "2.0.0", "{view}");
    registry.publish(&[("echo-acp", "echo.tar.gz")]);
    let ann = w.gw().with_key(Some(ANN));
    assert_eq!(ann.said(&id, "again").await, "again");

    // Not removed while a session of it is live; then removed with its files.
    let admin = w.gw().with_key(Some(ADMIN));
    let (status, problem) = admin.send(Method::DELETE, "/agents/echo2", None).await;
    assert_eq!(status, 409, "{problem}");
    ann.send_expecting(Method::DELETE, &format!("/sessions/{id}"), None, 204)
        .await;
    let (status, problem) = ann.send(Method::DELETE, "/agents/echo2", None).await;
    assert_eq!(status, 403, "{problem}");
    admin
        .send_expecting(Method::DELETE, "/agents/echo2", None, 204)
        .await;
    admin
        .send_expecting(Method::GET, "/agents/echo2", None, 404)
        .await;
    assert!(left(&agents_dir).is_empty(), "{:?}", left(&agents_dir));
    let (status, _) = admin.send(Method::DELETE, "/agents/echo2", None).await;
    assert_eq!(status, 404);
    let (status, _) = admin.send(Method::DELETE, "/agents/default", None).await;
    assert_eq!(status, 409, "a configured agent is not removed");

    // An archive that changed after its first install is refused where it is installed again
    // (here: its files gone, as on a new replica), and the agent does not run.
    begin_install(&admin, json!({"registry": "echo-acp"})).await;
    assert_eq!(
        installed(w.gw(), "echo-acp").await["installed"]["phase"],
        "installed"
    );
    let first = registry.sha256("echo.tar.gz");
    registry.pack_echo("echo.tar.gz", "changed");
    w.gw.take().unwrap().stop().await;
    std::fs::remove_dir_all(&agents_dir).unwrap();
    w.restart().await;
    let view = installed(w.gw(), "echo-acp").await;
    assert_eq!(view["installed"]["phase"], "failed", "{view}");
    let error = view["installed"]["error"].as_str().unwrap();
    assert!(
        error.contains(&first) && error.contains("changed"),
        "{error}"
    );
    assert_eq!(view["ready"], false);
    assert!(left(&agents_dir).is_empty(), "{:?}", left(&agents_dir));
    w.finish().await;
}

/// Installed through one replica, the agent runs on the other too (its own download, checked
/// against the first's sha256, into its own folder); removed through one, it leaves both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn an_agent_installed_through_one_replica_runs_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry(dir.path()).await;
    let (a_dir, b_dir) = (dir.path().join("agents-a"), dir.path().join("agents-b"));
    // Agents that need a sign-in, and can log out; the gateways sign every agent in with the
    // method it needs, installed ones included, unless an admin says otherwise.
    let signing = |dir: &Path| {
        options(&registry, dir)
            .args(&["--agent-auth-method", "echo-auth"])
            .env("ECHO_AGENT_AUTH", "echo-auth")
            .env("ECHO_AGENT_CAPS", "load,list,delete,resume,close,logout")
    };
    let w = World::start(Backend::Postgres, signing(&a_dir)).await;
    let b_home = w.dir.path().join("b");
    let mut b = Gateway::spawn(&w.db.url, &b_home, &signing(&b_dir)).await;
    let admin = w.gw().with_key(Some(ADMIN));
    begin_install(&admin, json!({"registry": "echo-acp"})).await;
    let on_b = installed(&b, "echo-acp").await;
    assert_eq!(on_b["installed"]["phase"], "installed", "{on_b}");
    assert_eq!(on_b["installed"]["sha256"], registry.sha256("echo.tar.gz"));
    assert!(!on_b["members"].as_array().unwrap().is_empty(), "{on_b}");
    assert_eq!(left(&b_dir), ["echo-acp"]);

    // A session made through B runs.
    let ann = b.with_key(Some(ANN));
    let id = session_on(&ann, "echo-acp").await;
    assert_eq!(ann.said(&id, "hello").await, "hello");
    // Not removed through A while B holds a session of it.
    let problem = admin
        .send_expecting(Method::DELETE, "/agents/echo-acp", None, 409)
        .await;
    assert!(
        problem["detail"].as_str().unwrap().contains("live session"),
        "{problem}"
    );
    delete_all(&ann).await;

    // Logged out through A: out on B too, and still out once B restarts (its new members do
    // not sign in with the gateway's method).
    admin
        .send_expecting(
            Method::POST,
            "/agents/echo-acp/logout",
            Some(json!({})),
            204,
        )
        .await;
    b.wait_until(|g| creates(g, 503)).await;
    b.stop().await;
    b = Gateway::spawn(&w.db.url, &b_home, &signing(&b_dir)).await;
    installed(&b, "echo-acp").await;
    assert!(creates(&b, 503).await, "logged out across a restart");

    // Signed in through A: in on B too.
    let sign_in = json!({"methodId": "echo-auth"});
    admin
        .send_expecting(
            Method::POST,
            "/agents/echo-acp/authenticate",
            Some(sign_in),
            200,
        )
        .await;
    b.wait_until(|g| creates(g, 201)).await;
    let ann = b.with_key(Some(ANN));
    delete_all(&ann).await;

    // Removed through A (once B has closed the session): gone from B, then its files (once
    // its processes have stopped).
    admin
        .send_expecting(Method::DELETE, "/agents/echo-acp", None, 204)
        .await;
    let b_dir = &b_dir;
    b.wait_until(|g| async move {
        let (status, _) = g.with_key(Some(ADMIN)).get("/agents/echo-acp").await;
        status == 404 && left(b_dir).is_empty()
    })
    .await;
    drop(b);
    w.finish().await;
}

/// The Claude and Codex ACP adapters, pinned, from the npm registry.
const CLAUDE: &str = "@agentclientprotocol/claude-agent-acp@0.101.0";
const CODEX: &str = "@zed-industries/codex-acp@0.16.0";
const CODEX_KEY: &str = "sk-test-not-a-real-key-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npm_agents_run_or_say_how_to_sign_in() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::serve(&dir.path().join("registry")).await;
    let npx = |id: &str, package: &str| {
        json!({"id": id, "name": id, "version": package.rsplit('@').next().unwrap(),
               "authors": ["acp-gateway tests"], "distribution": {"npx": {"package": package}}})
    };
    let index =
        json!({"version": "1.0.0", "agents": [npx("claude-acp", CLAUDE), npx("codex-acp", CODEX)]});
    std::fs::write(registry.dir.join("registry.json"), index.to_string()).unwrap();
    support::secrets::secret(CODEX_KEY);
    // The agents keep their sign-in under HOME: one of the test's own. The Claude adapter
    // refuses to run as root outside a sandbox it is told about.
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let opts = options(&registry, &dir.path().join("agents"))
        .args(&["--agent-env", "IS_SANDBOX=1"])
        .env("HOME", home.to_str().unwrap())
        .env("CODEX_API_KEY", CODEX_KEY);
    let mut w = World::start(Backend::Sqlite, opts).await;
    let admin = w.gw().with_key(Some(ADMIN));
    for id in ["claude-acp", "codex-acp"] {
        begin_install(&admin, json!({"registry": id})).await;
    }
    let npm = std::time::Duration::from_secs(600);
    for id in ["claude-acp", "codex-acp"] {
        let view = installed_within(w.gw(), id, npm).await;
        assert_eq!(view["installed"]["phase"], "installed", "{view}");
        assert_eq!(view["installed"]["kind"], "npx");
    }

    // The Claude adapter runs sessions (without a key, until a prompt needs one).
    let ann = w.gw().with_key(Some(ANN));
    let id = session_on(&ann, "claude-acp").await;
    ann.send_expecting(Method::DELETE, &format!("/sessions/{id}"), None, 204)
        .await;

    // The Codex adapter wants a sign-in, and says which.
    let codex = json!({"cwd": "/tmp", "agent": "codex-acp"});
    let (status, problem) = ann.post("/sessions", codex.clone()).await;
    assert_eq!(status, 503, "{problem}");
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("agent-auth-required"),
        "{problem}"
    );
    let methods = problem["authMethods"].as_array().unwrap();
    assert!(methods.contains(&json!("codex-api-key")), "{problem}");
    let (_, view) = admin.get("/agents/codex-acp").await;
    let offered: Vec<&str> = (view["authMethods"].as_array().unwrap().iter())
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(offered.contains(&"codex-api-key"), "{view}");

    // Only an admin signs it in, with a method it offers; one whose variable the environment
    // lacks is refused, naming the variable; the key the gateway's environment holds works.
    let sign_in = |method: &str| json!({"methodId": method});
    let (status, _) = ann
        .post("/agents/codex-acp/authenticate", sign_in("codex-api-key"))
        .await;
    assert_eq!(status, 403);
    let (status, problem) = admin
        .post("/agents/codex-acp/authenticate", sign_in("nope"))
        .await;
    assert_eq!(status, 422, "{problem}");
    let (status, problem) = admin
        .post("/agents/codex-acp/authenticate", sign_in("openai-api-key"))
        .await;
    assert_eq!(status, 503, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("OPENAI_API_KEY"),
        "{problem}"
    );
    let signed = admin
        .send_expecting(
            Method::POST,
            "/agents/codex-acp/authenticate",
            Some(sign_in("codex-api-key")),
            200,
        )
        .await;
    assert_eq!(signed["type"], "env_var", "{signed}");
    assert_eq!(signed["vars"], json!(["CODEX_API_KEY"]));
    ann.send_expecting(Method::POST, "/sessions", Some(codex.clone()), 201)
        .await;

    // Still signed in after a restart, with what the agent kept of it gone: its members
    // authenticate as they start.
    w.gw.take().unwrap().stop().await;
    std::fs::remove_dir_all(home.join(".codex")).unwrap();
    w.restart().await;
    let view = installed_within(w.gw(), "codex-acp", npm).await;
    assert_eq!(view["installed"]["phase"], "installed", "{view}");
    let ann = w.gw().with_key(Some(ANN));
    ann.send_expecting(Method::POST, "/sessions", Some(codex), 201)
        .await;
    w.finish().await;
}

/// `acp-gateway agents add ID` installs without a running gateway; the gateway started on the
/// same database runs the agent from the files it left, and `agents list` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_installs_an_agent_a_gateway_then_runs() {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry(dir.path()).await;
    let agents_dir = dir.path().join("agents");
    let db = format!("sqlite:{}", dir.path().join("gateway.db").display());
    let cli = |args: &[&str]| {
        let registry_url = registry.url();
        let agents = agents_dir.to_str().unwrap().to_owned();
        let db = db.clone();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
                .args([
                    "--registry",
                    &registry_url,
                    "--agents-dir",
                    &agents,
                    "--database-url",
                    &db,
                ])
                .args(&args)
                .output()
                .await
                .unwrap()
        }
    };
    let out = cli(&["agents", "add", "echo-acp@1.0.0", "--name", "packed"]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("installed packed"),
        "{out:?}"
    );
    let out = cli(&["agents", "add", "escape-acp"]).await;
    assert!(
        !out.status.success(),
        "an escaping archive is refused: {out:?}"
    );
    assert_eq!(left(&agents_dir), ["packed"]);
    let out = cli(&["agents", "list"]).await;
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        listed.starts_with("packed\techo-acp\tbinary\t1.0.0"),
        "{listed}"
    );

    // Its archive gone: the gateway runs it from the files the command left.
    std::fs::remove_file(registry.dir.join("echo.tar.gz")).unwrap();
    let gw = Gateway::spawn(&db, dir.path(), &options(&registry, &agents_dir)).await;
    let view = installed(&gw, "packed").await;
    assert_eq!(view["installed"]["phase"], "installed", "{view}");
    let ann = gw.with_key(Some(ANN));
    let id = session_on(&ann, "packed").await;
    assert_eq!(
        ann.said(&id, "from the command line").await,
        "from the command line"
    );
}

/// A gateway killed (SIGKILL) while it downloads an agent leaves nothing half-installed: the
/// install was not recorded, its staging folder is swept when the gateway starts again, and
/// the agent then installs whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_install_leaves_nothing_half_installed() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::serve(&dir.path().join("registry")).await;
    registry.pack_echo("echo.tar.gz", "first");
    registry.publish(&[("echo-acp", "echo.tar.gz")]);
    registry.stall("echo.tar.gz", true);
    let agents_dir = dir.path().join("agents");
    let mut w = World::start(Backend::Sqlite, options(&registry, &agents_dir)).await;
    begin_install(
        &w.gw().with_key(Some(ADMIN)),
        json!({"registry": "echo-acp"}),
    )
    .await;
    let staging = |d: &Path| left(d).iter().any(|n| n.starts_with(".staging-"));
    let agents = &agents_dir;
    w.gw().wait_until(|_| async move { staging(agents) }).await;
    let (_, view) = w.gw().with_key(Some(ADMIN)).get("/agents/echo-acp").await;
    assert_eq!(view["installed"]["phase"], "installing", "{view}");

    w.kill_gateway().await;
    assert!(
        staging(&agents_dir),
        "killed mid-download: {:?}",
        left(&agents_dir)
    );
    registry.stall("echo.tar.gz", false);
    w.restart().await;
    assert!(
        left(&agents_dir).is_empty(),
        "swept at start: {:?}",
        left(&agents_dir)
    );
    let admin = w.gw().with_key(Some(ADMIN));
    let (status, view) = admin.get("/agents/echo-acp").await;
    assert_eq!(
        status, 404,
        "an install that did not finish is not there: {view}"
    );

    begin_install(&admin, json!({"registry": "echo-acp"})).await;
    let view = installed(w.gw(), "echo-acp").await;
    assert_eq!(view["installed"]["phase"], "installed", "{view}");
    assert_eq!(left(&agents_dir), ["echo-acp"]);
    let ann = w.gw().with_key(Some(ANN));
    let id = session_on(&ann, "echo-acp").await;
    assert_eq!(ann.said(&id, "whole").await, "whole");
    w.finish().await;
}
