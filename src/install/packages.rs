//! Installing an agent's npm or Python package, pinned, into a folder it then runs from: npm
//! packages with `npm install --prefix`, Python packages into a virtual environment made by
//! `uv` (or, without it, `python3 -m venv` and pip). An agent installed so starts from its
//! folder, never fetched again at each start as `npx`/`uvx` would. The packages' install
//! scripts run (agents that ship a native binary need them), with the gateway's environment
//! less its own secrets, in a process group killed once the tool is done (`command`). The
//! program found is checked as a binary's is: links followed, a regular executable file
//! inside the install's folder (`program`).

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::install::command::{run, which};
use crate::install::error::InstallError;
use crate::install::program::program_in;
use crate::install::registry::{split_npm, split_pip};

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
    install_npm_with(&npm, dir, spec, cmd).await
}

/// [`install_npm`] with the program `npm`.
pub async fn install_npm_with(
    npm: &Path,
    dir: &Path,
    spec: &str,
    cmd: Option<&str>,
) -> Result<PathBuf, InstallError> {
    check_spec(spec)?;
    let prefix = dir.as_os_str();
    run(
        npm,
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
    let missing = format!("the package `{spec}` installed no command `{cmd}`");
    program_in(dir, &program.to_string_lossy(), &missing)
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
    let (from, to) = (venv, final_dir.join("venv"));
    tokio::task::spawn_blocking(move || relocate_scripts(&from, &to))
        .await
        .map_err(|e| InstallError::Io(e.to_string()))??;
    let missing = format!("the package `{spec}` installed no command `{cmd}`");
    program_in(dir, &program.to_string_lossy(), &missing)
}

/// A package spec that a command line cannot take for an option.
fn check_spec(spec: &str) -> Result<(), InstallError> {
    if spec.starts_with('-') {
        return Err(InstallError::Unsafe(format!(
            "the package `{spec}` starts with `-`, which npm, uv or pip would take for an option"
        )));
    }
    if spec.is_empty() || spec.chars().any(char::is_whitespace) {
        return Err(InstallError::Registry(format!(
            "`{spec}` is not a package name and version"
        )));
    }
    Ok(())
}

/// A command's name, which must be a plain file name that is not an option.
fn command_name(cmd: &str) -> Result<&str, InstallError> {
    let plain = Path::new(cmd).components().count() == 1
        && !cmd.contains('/')
        && !cmd.starts_with('-')
        && cmd != "."
        && cmd != "..";
    if plain {
        Ok(cmd)
    } else {
        Err(InstallError::Unsafe(format!(
            "`{cmd}` is not a command's name"
        )))
    }
}

/// Rewrites the environment's scripts (small text files starting `#!`) that name the
/// environment at `from` to name it at `to`, in place, never through a symlink.
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
            let written = |e| InstallError::io(format!("writing {}", path.display()), e);
            std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
                .open(&path)
                .and_then(|mut file| file.write_all(text.replace(from_s, to_s).as_bytes()))
                .map_err(written)?;
        }
    }
    Ok(())
}
