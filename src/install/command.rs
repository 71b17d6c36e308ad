//! Running the tools a package install needs (npm, uv, pip): with no input, the output kept
//! only for its error's end, bounded in time. A tool runs with the gateway's environment less
//! the gateway's own secrets (every `ACP_GATEWAY_*` variable and `DATABASE_URL`), so that the
//! PATH, the home folder, proxies and npm's or pip's settings still apply while a package's
//! scripts cannot read the admin keys or the database's password. It runs in a process group
//! of its own, killed whole when the tool exits, when it times out and when its install is
//! dropped: a script's background process that holds the output pipe neither keeps the
//! install waiting nor outlives it.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;

use crate::install::error::InstallError;

/// How long one install command may run.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);

/// How long the error output is still read once the tool has exited and its group is killed
/// (a process that left the group may hold the pipe).
const DRAIN: Duration = Duration::from_secs(5);

/// How much of a failed command's error output a message keeps (its end, where the cause is).
const STDERR_TAIL: usize = 2000;

/// The error output kept while a command runs, in bytes (its end).
const STDERR_KEPT: usize = 16 << 10;

/// Whether a variable of the gateway's environment is one of its own secrets, which the
/// tools it runs are not given.
pub fn is_gateway_secret(name: &OsStr) -> bool {
    let name = name.as_encoded_bytes();
    name.starts_with(b"ACP_GATEWAY_") || name == b"DATABASE_URL"
}

/// The environment a tool runs with: `vars` (the gateway's) less its secrets.
pub fn package_env(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    vars.into_iter()
        .filter(|(name, _)| !is_gateway_secret(name))
        .collect()
}

/// A program on the PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|folder| folder.join(program))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A running tool's process group, killed when dropped (unless it was killed already).
struct ProcessGroup(Option<Pid>);

impl ProcessGroup {
    /// Kills every process of the group, once.
    fn kill(&mut self) {
        if let Some(group) = self.0.take() {
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `program args` in `cwd` as the module's documentation says, with the gateway's
/// environment less its secrets, for at most [`COMMAND_TIMEOUT`]; a failure names the command
/// and the end of its error output.
pub async fn run(program: &Path, args: &[&OsStr], cwd: &Path) -> Result<(), InstallError> {
    let env = package_env(std::env::vars_os());
    run_with(program, args, cwd, &env, COMMAND_TIMEOUT).await
}

/// [`run`] with the environment `env` (the only one the tool sees) and a time bound.
pub async fn run_with(
    program: &Path,
    args: &[&OsStr],
    cwd: &Path,
    env: &[(OsString, OsString)],
    timeout: Duration,
) -> Result<(), InstallError> {
    let line = std::iter::once(program.as_os_str())
        .chain(args.iter().copied())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| {
        InstallError::Tool(format!("`{}` could not be started: {e}", program.display()))
    })?;
    let mut group = ProcessGroup(
        (child.id())
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw),
    );
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let mut kept: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 8 << 10];
    let mut status = None;
    let mut open = true;
    let mut until = tokio::time::Instant::now() + timeout;
    while status.is_none() || open {
        tokio::select! {
            exited = child.wait(), if status.is_none() => {
                let exited = exited
                    .map_err(|e| InstallError::Command(format!("`{line}` failed: {e}")))?;
                // What it left running goes now, and with it the pipe's other copies.
                group.kill();
                status = Some(exited);
                until = until.min(tokio::time::Instant::now() + DRAIN);
            }
            read = stderr.read(&mut buf), if open => match read {
                Ok(0) | Err(_) => open = false,
                Ok(n) => {
                    kept.extend_from_slice(&buf[..n]);
                    if kept.len() > STDERR_KEPT {
                        kept.drain(..kept.len() - STDERR_KEPT);
                    }
                }
            },
            () = tokio::time::sleep_until(until) => {
                if status.is_none() {
                    let within = match timeout.as_secs() {
                        secs if secs >= 60 && secs % 60 == 0 => format!("{} minutes", secs / 60),
                        secs => format!("{secs} seconds"),
                    };
                    return Err(InstallError::Command(format!(
                        "`{line}` did not finish within {within}"
                    )));
                }
                break;
            }
        }
    }
    let status = status.expect("the loop ends once the command has exited");
    if status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&kept);
    let stderr = stderr.trim();
    let tail = match stderr.char_indices().rev().nth(STDERR_TAIL) {
        Some((at, _)) => &stderr[at..],
        None => stderr,
    };
    let said = match cause(tail) {
        Some(cause) => format!("{cause} (its output ends: {tail})"),
        None => tail.to_owned(),
    };
    Err(InstallError::Command(format!(
        "`{line}` failed ({status}): {}",
        crate::redact::text(&said)
    )))
}

/// The first lines of a tool's output that say what went wrong (npm's `npm error …`, pip's and
/// uv's `ERROR: …`/`error: …`), without npm's pointer to its log: the cause, which the end of
/// the output may not show.
fn cause(output: &str) -> Option<String> {
    let said: Vec<&str> = (output.lines().map(str::trim))
        .filter(|l| {
            let lower = l.to_ascii_lowercase();
            lower.starts_with("npm error") || lower.starts_with("error")
        })
        .filter(|l| !l.contains("A complete log of this run"))
        .filter(|l| l.len() > "npm error 404".len())
        .take(2)
        .collect();
    (!said.is_empty()).then(|| said.join("; "))
}
