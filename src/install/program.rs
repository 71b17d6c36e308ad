//! An installed agent's program, and what a registry entry may say about it. The registry's
//! `cmd` and a package's spec reach a path and a command line: a `cmd` is a relative path
//! with no `..` (a binary's program inside its archive, a package's command's name), neither
//! starts with `-` (a command line would take it for an option). The program found after an
//! install, links followed, must be a regular executable file inside the install's folder
//! (an npm `.bin` entry is a link into its package, which is fine while it stays inside).

use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use crate::install::error::InstallError;
use crate::install::registry::{Choice, DistKind};

/// Refuses a choice whose `cmd` or package spec could name a path outside the install's
/// folder or be taken for a command line's option.
pub fn check_choice(choice: &Choice) -> Result<(), InstallError> {
    if let Some(cmd) = &choice.cmd {
        check_cmd(cmd)?;
    }
    let package = matches!(choice.kind, DistKind::Npx | DistKind::Uvx);
    if package && choice.source.trim_start().starts_with('-') {
        return Err(InstallError::Unsafe(format!(
            "the package `{}` starts with `-`, which npm, uv or pip would take for an option",
            choice.source
        )));
    }
    Ok(())
}

/// A registry `cmd`: a relative path without `..` that does not start with `-`.
fn check_cmd(cmd: &str) -> Result<(), InstallError> {
    let refused = |why: &str| {
        Err(InstallError::Unsafe(format!(
            "the registry's command `{cmd}` {why}"
        )))
    };
    if cmd.trim().is_empty() {
        return refused("is empty");
    }
    if cmd.starts_with('-') {
        return refused("starts with `-`, which a command line would take for an option");
    }
    if cmd.contains('\0') {
        return refused("has a NUL in it");
    }
    for component in Path::new(cmd).components() {
        match component {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return refused("has a `..` in its path"),
            Component::RootDir | Component::Prefix(_) => {
                return refused("is an absolute path; it must be relative to the agent's folder");
            }
        }
    }
    Ok(())
}

/// Why a program is not one to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramFault {
    /// Nothing is there (or a link there leads nowhere).
    Missing,
    /// It leads, links followed, outside the folder.
    Outside,
    /// It is not a regular file.
    NotAFile,
    /// It is a file without an executable bit.
    NotExecutable,
}

/// The program `cmd` (`./bin/agent`, `node_modules/.bin/agent`) inside `tree`: a relative
/// path, with no `..`, to a regular executable file that, links followed, is inside `tree`.
/// Answered relative to `tree`, as given (its links kept).
pub fn executable_inside(tree: &Path, cmd: &Path) -> Result<PathBuf, ProgramFault> {
    let mut rel = PathBuf::new();
    for component in cmd.components() {
        match component {
            Component::Normal(part) => rel.push(part),
            Component::CurDir => {}
            _ => return Err(ProgramFault::Outside),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(ProgramFault::Missing);
    }
    let resolved = std::fs::canonicalize(tree.join(&rel)).map_err(|_| ProgramFault::Missing)?;
    let inside = std::fs::canonicalize(tree).is_ok_and(|tree| resolved.starts_with(tree));
    if !inside {
        return Err(ProgramFault::Outside);
    }
    let meta = std::fs::metadata(&resolved).map_err(|_| ProgramFault::Missing)?;
    if !meta.is_file() {
        return Err(ProgramFault::NotAFile);
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(ProgramFault::NotExecutable);
    }
    Ok(rel)
}

/// [`executable_inside`], its fault said as an error; `missing` is the message when nothing
/// is there.
pub fn program_in(tree: &Path, cmd: &str, missing: &str) -> Result<PathBuf, InstallError> {
    executable_inside(tree, Path::new(cmd)).map_err(|fault| match fault {
        ProgramFault::Missing => InstallError::Missing(missing.to_owned()),
        ProgramFault::Outside => InstallError::Unsafe(format!(
            "the program `{cmd}` leads outside the agent's folder"
        )),
        ProgramFault::NotAFile => {
            InstallError::Unsafe(format!("the program `{cmd}` is not a regular file"))
        }
        ProgramFault::NotExecutable => InstallError::Unsafe(format!(
            "the program `{cmd}` is not executable (it is not marked so)"
        )),
    })
}
