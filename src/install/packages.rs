//! Installing an agent's npm or Python package, pinned, into a folder it then runs from: npm
//! packages with `npm install --prefix`, Python packages into a virtual environment made by
//! `uv` (or, without it, `python3 -m venv` and pip). An agent installed so starts from its
//! folder, never fetched again at each start as `npx`/`uvx` would.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::install::error::InstallError;
use crate::install::registry::{split_npm, split_pip};

/// How long one install command may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);

/// How much of a failed command's error output a message keeps (its end, where the cause is).
const STDERR_TAIL: usize = 2000;

/// Installs the npm package `spec` (`name@version`) into `dir` and answers its program, relative
/// to `dir`: `node_modules/.bin/<cmd>`, where `cmd` is the given command or the package's own.
pub async fn install_npm(
    dir: &Path,
    spec: &str,
    cmd: Option<&str>,
) -> Result<PathBuf, InstallError> {
    check_spec(spec)?;
    let npm = which("npm").ok_or_else(|| {
        InstallError::Tool(
            "npm is not installed on this machine (on its PATH); install Node.js to install \
             npx agents"
                .to_owned(),
        )
    })?;
    let prefix = dir.as_os_str();
    run(
        &npm,
        &[
            OsStr::new("install"),
            OsStr::new("--prefix"),
            prefix,
            OsStr::new("--no-audit"),
            OsStr::new("--no-fund"),
            OsStr::new("--no-save"),
            OsStr::new("--loglevel=error"),
            OsStr::new(spec),
        ],
        dir,
    )
    .await?;
    let (name, _) = split_npm(spec);
    let cmd = match cmd {
        Some(cmd) => cmd.to_owned(),
        None => {
            let manifest = dir.join("node_modules").join(name).join("package.json");
            let text = tokio::fs::read_to_string(&manifest).await.map_err(|e| {
                InstallError::Missing(format!(
                    "npm installed `{spec}` without its package.json ({}: {e})",
                    manifest.display()
                ))
            })?;
            npm_bin(&text, name)?
        }
    };
    let program = Path::new("node_modules")
        .join(".bin")
        .join(command_name(&cmd)?);
    if !dir.join(&program).exists() {
        return Err(InstallError::Missing(format!(
            "the package `{spec}` installed no command `{cmd}`"
        )));
    }
    Ok(program)
}

/// The command a package's `package.json` offers (its `bin`): a string is the package's
/// unscoped name; a map of one entry is that entry; a map of several is the entry named as the
/// unscoped package, else an error listing them.
pub fn npm_bin(package_json: &str, package: &str) -> Result<String, InstallError> {
    let manifest: serde_json::Value = serde_json::from_str(package_json).map_err(|e| {
        InstallError::Missing(format!("the package.json of `{package}` is not JSON: {e}"))
    })?;
    let unscoped = package.rsplit('/').next().unwrap_or(package);
    match manifest.get("bin") {
        Some(serde_json::Value::String(_)) => Ok(unscoped.to_owned()),
        Some(serde_json::Value::Object(bins)) if bins.len() == 1 => {
            Ok(bins.keys().next().expect("one entry").clone())
        }
        Some(serde_json::Value::Object(bins)) if bins.contains_key(unscoped) => {
            Ok(unscoped.to_owned())
        }
        Some(serde_json::Value::Object(bins)) if !bins.is_empty() => {
            let names: Vec<_> = bins.keys().map(String::as_str).collect();
            Err(InstallError::Missing(format!(
                "the package `{package}` has several commands ({}) and none is named \
                 `{unscoped}`; the registry entry must name one as `cmd`",
                names.join(", ")
            )))
        }
        _ => Err(InstallError::Missing(format!(
            "the package `{package}` declares no command (no `bin` in its package.json)"
        ))),
    }
}

/// Installs the Python package `spec` (`name==version`) into a virtual environment at
/// `dir/venv` and answers its program, relative to `dir`: `venv/bin/<cmd or the package's
/// name>`. `final_dir` is where `dir` will be moved once complete: the scripts' `#!` lines,
/// which name the environment's Python by its absolute path, are written for it.
pub async fn install_python(
    dir: &Path,
    final_dir: &Path,
    spec: &str,
    cmd: Option<&str>,
) -> Result<PathBuf, InstallError> {
    check_spec(spec)?;
    let venv = dir.join("venv");
    let python = venv.join("bin").join("python");
    if let Some(uv) = which("uv") {
        run(&uv, &[OsStr::new("venv"), venv.as_os_str()], dir).await?;
        let args = [
            OsStr::new("pip"),
            OsStr::new("install"),
            OsStr::new("--python"),
            python.as_os_str(),
            OsStr::new(spec),
        ];
        run(&uv, &args, dir).await?;
    } else if let Some(python3) = which("python3") {
        let args = [OsStr::new("-m"), OsStr::new("venv"), venv.as_os_str()];
        run(&python3, &args, dir).await?;
        let pip = venv.join("bin").join("pip");
        let args = [
            OsStr::new("install"),
            OsStr::new("--disable-pip-version-check"),
            OsStr::new(spec),
        ];
        run(&pip, &args, dir).await?;
    } else {
        return Err(InstallError::Tool(
            "neither uv nor python3 is installed on this machine (on its PATH); install uv \
             (or Python 3) to install uvx agents"
                .to_owned(),
        ));
    }
    let (name, _) = split_pip(spec);
    let name = name.split('[').next().unwrap_or(name).trim();
    let cmd = cmd.unwrap_or(name);
    let program = Path::new("venv").join("bin").join(command_name(cmd)?);
    if !dir.join(&program).exists() {
        return Err(InstallError::Missing(format!(
            "the package `{spec}` installed no command `{cmd}`"
        )));
    }
    let (from, to) = (venv, final_dir.join("venv"));
    tokio::task::spawn_blocking(move || relocate_scripts(&from, &to))
        .await
        .map_err(|e| InstallError::Io(e.to_string()))??;
    Ok(program)
}

/// A package spec that a command line cannot take for an option.
fn check_spec(spec: &str) -> Result<(), InstallError> {
    if spec.is_empty() || spec.starts_with('-') || spec.chars().any(char::is_whitespace) {
        return Err(InstallError::Registry(format!(
            "`{spec}` is not a package name and version"
        )));
    }
    Ok(())
}

/// A command's name, which must be a plain file name.
fn command_name(cmd: &str) -> Result<&str, InstallError> {
    let plain =
        Path::new(cmd).components().count() == 1 && !cmd.contains('/') && cmd != "." && cmd != "..";
    if plain {
        Ok(cmd)
    } else {
        Err(InstallError::Unsafe(format!(
            "`{cmd}` is not a command's name"
        )))
    }
}

/// Rewrites the environment's scripts (small text files starting `#!`) that name the
/// environment at `from` to name it at `to`.
fn relocate_scripts(from: &Path, to: &Path) -> Result<(), InstallError> {
    let (Some(from_s), Some(to_s)) = (from.to_str(), to.to_str()) else {
        return Ok(());
    };
    let bin = from.join("bin");
    let listed = std::fs::read_dir(&bin)
        .map_err(|e| InstallError::io(format!("reading {}", bin.display()), e))?;
    for item in listed.flatten() {
        let path = item.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() || meta.len() > 64 << 10 {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if text.starts_with("#!") && text.contains(from_s) {
            std::fs::write(&path, text.replace(from_s, to_s))
                .map_err(|e| InstallError::io(format!("writing {}", path.display()), e))?;
        }
    }
    Ok(())
}

/// A program on the PATH.
fn which(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|folder| folder.join(program))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Runs `program args` in `cwd` with no input, its output kept; a failure names the command
/// and the end of its error output.
async fn run(program: &Path, args: &[&OsStr], cwd: &Path) -> Result<(), InstallError> {
    let line = std::iter::once(program.as_os_str())
        .chain(args.iter().copied())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = command.spawn().map_err(|e| {
        InstallError::Tool(format!("`{}` could not be started: {e}", program.display()))
    })?;
    let output = tokio::time::timeout(COMMAND_TIMEOUT, output.wait_with_output())
        .await
        .map_err(|_| {
            InstallError::Command(format!(
                "`{line}` did not finish within {} minutes",
                COMMAND_TIMEOUT.as_secs() / 60
            ))
        })?
        .map_err(|e| InstallError::Command(format!("`{line}` failed: {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stderr = stderr.trim();
    let tail = match stderr.char_indices().rev().nth(STDERR_TAIL) {
        Some((at, _)) => &stderr[at..],
        None => stderr,
    };
    Err(InstallError::Command(format!(
        "`{line}` failed ({}): {}",
        output.status,
        crate::redact::text(tail)
    )))
}
