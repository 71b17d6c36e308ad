//! The installer around the archive: the tools a package install runs (their environment,
//! their process group, their time), where archives may come from and how long a download
//! may take, the staging folders left by installs killed midway, removing one version,
//! failures that leave other installs alone, and the checks of the registry's command and
//! of the program a package install leaves.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::tests::{binary, good_entries, installer, listing, quiet, runs, tar_gz};
use crate::install::command::{package_env, run_with};
use crate::install::error::InstallError;
use crate::install::fetch::{DownloadOptions, download, download_with};
use crate::install::installer::{Installer, put_in_place};
use crate::install::packages::install_npm_with;
use crate::install::registry::{Choice, DistKind};

/// An environment for the tools run here: this one's PATH, and the variables given.
fn env_with(vars: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
    let mut env = vec![(
        OsString::from("PATH"),
        std::env::var_os("PATH").unwrap_or_default(),
    )];
    env.extend(
        vars.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    env
}

/// Whether the process `pid` has ended (gone, or a zombie no one reaped yet), waiting up to
/// five seconds for it.
async fn ended(pid: &str) -> bool {
    for _ in 0..50 {
        match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z') =>
            {
                return true;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    false
}

/// Runs `sh -c script` in `dir` as an install's tool, with `env` and `timeout`.
async fn sh(
    dir: &Path,
    script: &str,
    env: &[(OsString, OsString)],
    timeout: Duration,
) -> Result<(), InstallError> {
    let args = [OsStr::new("-c"), OsStr::new(script)];
    run_with(Path::new("/bin/sh"), &args, dir, env, timeout).await
}

#[tokio::test]
async fn the_tools_run_without_the_gateways_own_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    let gateway = env_with(&[
        ("ACP_GATEWAY_ADMIN_KEY", "admin-secret"),
        ("ACP_GATEWAY_DATABASE_URL", "postgres://u:secret@db/x"),
        ("DATABASE_URL", "postgres://u:secret@db/y"),
        ("HOME", "/home/gateway"),
        ("HTTPS_PROXY", "http://proxy:3128"),
        ("npm_config_registry", "https://npm.example.com"),
    ]);
    let env = package_env(gateway);
    sh(tmp.path(), "env > seen", &env, Duration::from_secs(60))
        .await
        .unwrap();
    let seen = std::fs::read_to_string(tmp.path().join("seen")).unwrap();
    assert!(!seen.contains("secret"), "{seen}");
    assert!(!seen.contains("ACP_GATEWAY_"), "{seen}");
    for kept in [
        "PATH=",
        "HOME=/home/gateway",
        "HTTPS_PROXY=http://proxy:3128",
        "npm_config_registry=",
    ] {
        assert!(seen.contains(kept), "{kept} is kept: {seen}");
    }
}

#[tokio::test]
async fn a_background_process_holding_the_output_neither_holds_the_install_nor_outlives_it() {
    let tmp = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let script = "sleep 300 & echo $! > pid; echo started >&2; exit 0";
    let done = tokio::time::timeout(
        Duration::from_secs(60),
        sh(tmp.path(), script, &env_with(&[]), Duration::from_secs(600)),
    )
    .await
    .expect("the install does not wait for the background process");
    done.unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    let pid = std::fs::read_to_string(tmp.path().join("pid")).unwrap();
    assert!(ended(&pid).await, "the background process {pid} was killed");
}

#[tokio::test]
async fn a_failed_tool_is_named_by_its_cause_not_its_last_line() {
    let tmp = tempfile::tempdir().unwrap();
    let script = "echo 'npm error code E404' >&2; \
        echo 'npm error 404 Not Found - GET https://registry.npmjs.org/nope' >&2; \
        echo 'npm error 404' >&2; \
        echo 'npm error A complete log of this run can be found in: /root/.npm/_logs/x.log' >&2; \
        exit 1";
    let error = sh(tmp.path(), script, &env_with(&[]), Duration::from_secs(60))
        .await
        .unwrap_err()
        .to_string();
    let cause =
        "npm error code E404; npm error 404 Not Found - GET https://registry.npmjs.org/nope";
    assert!(
        error.contains(&format!("(exit status: 1): {cause} (its output ends:")),
        "{error}"
    );
}

#[tokio::test]
async fn a_tool_past_its_time_is_killed_with_its_whole_group() {
    let tmp = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let script = "sleep 300 & echo $! > pid; wait";
    let error = sh(tmp.path(), script, &env_with(&[]), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, InstallError::Command(m) if m.contains("did not finish")),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let pid = std::fs::read_to_string(tmp.path().join("pid")).unwrap();
    assert!(ended(&pid).await, "the tool's child {pid} was killed");
}

#[tokio::test]
async fn a_local_archive_is_refused_unless_the_installer_allows_it() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.tar.gz");
    tar_gz(&archive, &good_entries());
    let root = tmp.path().join("root");
    let strict = Installer::new(root.clone(), reqwest::Client::new());
    let by_url = format!("file://{}", archive.display());
    for source in [archive.display().to_string(), by_url] {
        let mut choice = binary(&archive, "bin/agent");
        choice.source = source;
        let error = strict
            .install("agent", &choice, None, &quiet)
            .await
            .unwrap_err();
        assert!(matches!(error, InstallError::Unsafe(_)), "{error}");
        assert!(listing(&root.join("agent")).is_empty());
    }
    let client = reqwest::Client::new();
    let dest = tmp.path().join("copy");
    let error = download(&client, archive.to_str().unwrap(), &dest, 1 << 20)
        .await
        .unwrap_err();
    assert!(matches!(error, InstallError::Unsafe(_)), "{error}");
    let installed = strict
        .clone()
        .allow_local_archives(true)
        .install("agent", &binary(&archive, "bin/agent"), None, &quiet)
        .await
        .unwrap();
    runs(&installed.program);
}

/// An HTTP server on loopback that answers every request with the headers of a large body,
/// then sends one byte every `every`, or nothing more when None. Answers the URL of an
/// archive on it and the task that serves (to abort).
async fn slow_server(every: Option<Duration>) -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/agent.tar.gz", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = socket.read(&mut request).await;
                let head = "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n";
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                loop {
                    match every {
                        Some(every) => tokio::time::sleep(every).await,
                        None => std::future::pending().await,
                    }
                    if socket.write_all(b"x").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, server)
}

#[tokio::test]
async fn a_download_that_trickles_past_its_deadline_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let (url, server) = slow_server(Some(Duration::from_millis(100))).await;
    let dest = tmp.path().join("archive");
    let options = DownloadOptions {
        deadline: Duration::from_secs(1),
        ..DownloadOptions::new(1 << 20)
    };
    let started = Instant::now();
    let client = reqwest::Client::new();
    let downloading = download_with(&client, &url, &dest, &options);
    let error = tokio::time::timeout(Duration::from_secs(20), downloading)
        .await
        .expect("the download ends at its deadline")
        .unwrap_err();
    server.abort();
    assert!(
        matches!(&error, InstallError::Download(m) if m.contains("within")),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(!dest.exists(), "no partial file is left");
}

#[tokio::test]
async fn a_dropped_install_leaves_no_staging_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let (url, server) = slow_server(None).await;
    let root = tmp.path().join("root");
    let mut choice = binary(Path::new("agent.tar.gz"), "bin/agent");
    choice.source = url;
    let install = installer(&root);
    let dropped = tokio::time::timeout(
        Duration::from_millis(500),
        install.install("agent", &choice, None, &quiet),
    )
    .await;
    assert!(dropped.is_err(), "the install was still downloading");
    server.abort();
    for _ in 0..50 {
        if listing(&root).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("staging left: {:?}", listing(&root));
}

#[tokio::test]
async fn stale_staging_folders_are_swept_and_those_held_are_kept() {
    use nix::fcntl::{Flock, FlockArg};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join(".staging-agent-old/tree/bin")).unwrap();
    std::fs::write(root.join(".staging-agent-old/tree/bin/x"), b"x").unwrap();
    std::fs::write(root.join(".staging-agent-orphan.lock"), b"").unwrap();
    std::fs::create_dir_all(root.join(".staging-agent-live/tree")).unwrap();
    let live_lock = std::fs::File::create(root.join(".staging-agent-live.lock")).unwrap();
    let held = Flock::lock(live_lock, FlockArg::LockExclusiveNonblock).unwrap();
    std::fs::create_dir_all(root.join("agent/1.0.0")).unwrap();

    let installer = Installer::new(root.clone(), reqwest::Client::new());
    assert_eq!(
        listing(&root),
        vec![
            ".staging-agent-live".to_owned(),
            ".staging-agent-live.lock".to_owned(),
            "agent".to_owned()
        ]
    );
    drop(held);
    assert_eq!(installer.sweep(), 1);
    assert_eq!(listing(&root), vec!["agent".to_owned()]);
}

/// A binary choice of `archive` at `version`.
fn at_version(archive: &Path, version: &str) -> Choice {
    Choice {
        version: version.to_owned(),
        ..binary(archive, "bin/agent")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_version_removes_one_version_then_the_names_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.tar.gz");
    tar_gz(&archive, &good_entries());
    let root = tmp.path().join("root");
    let installer = installer(&root);
    for version in ["1.0.0", "2.0.0"] {
        let choice = at_version(&archive, version);
        installer
            .install("agent", &choice, None, &quiet)
            .await
            .unwrap();
    }
    installer.remove_version("agent", "1.0.0").unwrap();
    assert_eq!(listing(&root.join("agent")), vec!["2.0.0".to_owned()]);
    installer.remove_version("agent", "1.0.0").unwrap();
    installer.remove_version("agent", "2.0.0").unwrap();
    assert!(listing(&root).is_empty());
    installer.remove_version("agent", "2.0.0").unwrap();
    for (name, version) in [("agent", "../x"), ("..", "1.0.0"), ("agent", "")] {
        let error = installer.remove_version(name, version).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    }
    installer.remove("agent").unwrap();
}

#[tokio::test]
async fn a_failed_move_into_place_puts_the_older_folder_back() {
    let tmp = tempfile::tempdir().unwrap();
    let final_dir = tmp.path().join("1.0.0");
    std::fs::create_dir(&final_dir).unwrap();
    std::fs::write(final_dir.join("older"), b"older").unwrap();
    let aside = tmp.path().join("aside");
    let missing_tree = tmp.path().join("tree");
    let error = put_in_place(&missing_tree, &final_dir, &aside)
        .await
        .unwrap_err();
    assert!(matches!(error, InstallError::Io(_)), "{error}");
    assert_eq!(std::fs::read(final_dir.join("older")).unwrap(), b"older");
    assert!(!aside.exists());
}

#[tokio::test]
async fn a_failed_install_leaves_the_other_installs_of_its_name_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good.tar.gz");
    tar_gz(&good, &good_entries());
    let bad = tmp.path().join("bad.tar.gz");
    let mut hostile = good_entries();
    hostile.push(("../evil", tar::EntryType::Regular, 0o644, b"x"));
    tar_gz(&bad, &hostile);
    let root = tmp.path().join("root");
    let installer = installer(&root);
    let first = installer
        .install("agent", &at_version(&good, "1.0.0"), None, &quiet)
        .await
        .unwrap();
    let (two, three) = (at_version(&good, "2.0.0"), at_version(&bad, "3.0.0"));
    let (second, failed) = tokio::join!(
        installer.install("agent", &two, None, &quiet),
        installer.install("agent", &three, None, &quiet),
    );
    assert!(matches!(failed, Err(InstallError::Unsafe(_))), "{failed:?}");
    runs(&first.program);
    runs(&second.unwrap().program);
    assert_eq!(
        listing(&root.join("agent")),
        vec!["1.0.0".to_owned(), "2.0.0".to_owned()]
    );
    assert_eq!(listing(&root), vec!["agent".to_owned()]);
}

#[tokio::test]
async fn a_registry_command_or_package_that_leads_out_or_is_an_option_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let archive = tmp.path().join("agent.tar.gz");
    let package = |kind, source: &str, cmd: Option<&str>| Choice {
        kind,
        version: "1.0.0".to_owned(),
        source: source.to_owned(),
        cmd: cmd.map(str::to_owned),
        args: Vec::new(),
        env: Default::default(),
    };
    let mut choices = Vec::new();
    for cmd in ["/bin/sh", "../agent", "bin/../../agent", "-agent", "--help"] {
        choices.push(binary(&archive, cmd));
        choices.push(package(DistKind::Npx, "pkg@1.0.0", Some(cmd)));
        choices.push(package(DistKind::Uvx, "pkg==1.0.0", Some(cmd)));
    }
    for source in ["--registry=https://evil.example@1.0.0", "-e==1.0.0"] {
        choices.push(package(DistKind::Npx, source, None));
        choices.push(package(DistKind::Uvx, source, None));
    }
    for choice in choices {
        let error = installer(&root)
            .install("agent", &choice, None, &quiet)
            .await
            .unwrap_err();
        assert!(
            matches!(error, InstallError::Unsafe(_)),
            "{choice:?}: {error}"
        );
        assert!(!root.join("agent").exists(), "{choice:?}");
    }
}

/// A stand-in for npm that installs the package `pkg` whose command `pkg` is a link to
/// `target` (relative to `node_modules/.bin`), and puts a file `cli.js` of mode `mode` in it.
fn fake_npm(dir: &Path, target: &str, mode: u32) -> std::path::PathBuf {
    let npm = dir.join("npm");
    let script = format!(
        "#!/bin/sh\nset -e\nprefix=\"$3\"\nmkdir -p \"$prefix/node_modules/.bin\" \
         \"$prefix/node_modules/pkg\"\n\
         echo '{{\"name\": \"pkg\", \"bin\": \"cli.js\"}}' > \"$prefix/node_modules/pkg/package.json\"\n\
         printf '#!/bin/sh\\necho agent-ran \"$@\"\\n' > \"$prefix/node_modules/pkg/cli.js\"\n\
         chmod {mode:o} \"$prefix/node_modules/pkg/cli.js\"\n\
         ln -s '{target}' \"$prefix/node_modules/.bin/pkg\"\n"
    );
    std::fs::write(&npm, script).unwrap();
    std::fs::set_permissions(&npm, std::fs::Permissions::from_mode(0o755)).unwrap();
    npm
}

#[tokio::test]
async fn an_npm_command_must_be_an_executable_file_inside_the_install() {
    let cases = [
        ("../pkg/cli.js", 0o755, None),
        ("/bin/sh", 0o755, Some("outside")),
        ("../pkg/cli.js", 0o644, Some("not executable")),
        ("../pkg", 0o755, Some("not a regular file")),
        ("../pkg/nothing.js", 0o755, Some("no command")),
    ];
    for (target, mode, refusal) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let npm = fake_npm(tmp.path(), target, mode);
        let dir = tmp.path().join("tree");
        std::fs::create_dir(&dir).unwrap();
        let done = install_npm_with(&npm, &dir, "pkg@1.0.0", None).await;
        match refusal {
            None => {
                let program = done.unwrap();
                assert_eq!(program, Path::new("node_modules/.bin/pkg"));
                runs(&dir.join(program));
            }
            Some(why) => {
                let error = done.unwrap_err();
                assert!(error.to_string().contains(why), "{target}: {error}");
                let kind_ok = match why {
                    "no command" => matches!(error, InstallError::Missing(_)),
                    _ => matches!(error, InstallError::Unsafe(_)),
                };
                assert!(kind_ok, "{target}: {error}");
            }
        }
    }
}
