//! Installing a chosen distribution into `<root>/<name>/<version>`, all or nothing: everything
//! happens in a fresh staging folder under the root, which becomes the version's folder by one
//! rename when complete and is removed on any failure (or when the install is dropped). A
//! marker file in the version's folder records what was installed, so that an install of the
//! same choice (a restart) reuses it without downloading.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::install::archive::{UnpackLimits, unpack};
use crate::install::error::InstallError;
use crate::install::fetch::download;
use crate::install::packages::{install_npm, install_python};
use crate::install::registry::{Choice, DistKind};

/// The file in a version's folder that says what was installed there.
const MARKER: &str = ".acp-gateway-installed.json";

/// The largest archive downloaded by default.
const MAX_DOWNLOAD: u64 = 1 << 30;

/// Installs agents under one root folder.
#[derive(Debug, Clone)]
pub struct Installer {
    root: PathBuf,
    client: reqwest::Client,
    limits: UnpackLimits,
    max_download: u64,
}

/// An installed agent: how to start it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The program, an absolute path.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables it is started with.
    pub env: BTreeMap<String, String>,
    /// The version's folder, an absolute path.
    pub dir: PathBuf,
    /// The archive's sha256 (binary distributions).
    pub sha256: Option<String>,
}

/// What the marker file holds.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InstallMarker {
    choice: Choice,
    sha256: Option<String>,
    /// The program, relative to the version's folder.
    program: PathBuf,
}

/// A staging folder, removed when dropped unless kept.
struct Staging {
    path: Option<PathBuf>,
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

impl Installer {
    /// An installer under `root` (made absolute), downloading with `client`, with the default
    /// bounds: archives of at most 1 GiB that unpack to at most [`UnpackLimits::default`].
    pub fn new(root: PathBuf, client: reqwest::Client) -> Self {
        let root = std::path::absolute(&root).unwrap_or(root);
        Self {
            root,
            client,
            limits: UnpackLimits::default(),
            max_download: MAX_DOWNLOAD,
        }
    }

    /// The same installer with other bounds.
    pub fn with_limits(mut self, limits: UnpackLimits, max_download: u64) -> Self {
        self.limits = limits;
        self.max_download = max_download;
        self
    }

    /// The folder agents are installed under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Installs `choice` as `<root>/<name>/<version>`, or reuses what an earlier install of
    /// the same choice left there (for a binary, only when its sha256 is `expect_sha256`,
    /// when given). A binary's archive must hash to `expect_sha256` when given. `progress` is
    /// told each step in a short line.
    pub async fn install(
        &self,
        name: &str,
        choice: &Choice,
        expect_sha256: Option<&str>,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<Installed, InstallError> {
        folder_name(name, "an agent's name")?;
        folder_name(&choice.version, "a version")?;
        let expect = expect_sha256.map(|s| s.trim().to_ascii_lowercase());
        let agent_dir = self.root.join(name);
        let final_dir = agent_dir.join(&choice.version);
        if let Some(installed) = self.reuse(&final_dir, choice, expect.as_deref()).await {
            progress(&format!("already installed in {}", final_dir.display()));
            return Ok(installed);
        }
        let io = |doing: &str, path: &Path, e| {
            InstallError::io(format!("{doing} {}", path.display()), e)
        };
        tokio::fs::create_dir_all(&agent_dir)
            .await
            .map_err(|e| io("creating", &agent_dir, e))?;
        let staging_path = self
            .root
            .join(format!(".staging-{name}-{}", uuid::Uuid::new_v4().simple()));
        tokio::fs::create_dir(&staging_path)
            .await
            .map_err(|e| io("creating", &staging_path, e))?;
        let staging = Staging {
            path: Some(staging_path.clone()),
        };
        let tree = staging_path.join("tree");
        tokio::fs::create_dir(&tree)
            .await
            .map_err(|e| io("creating", &tree, e))?;

        let (program, sha256) = match choice.kind {
            DistKind::Binary => {
                let (program, sha) = self
                    .binary(&staging_path, &tree, choice, expect.as_deref(), progress)
                    .await?;
                (program, Some(sha))
            }
            DistKind::Npx => {
                progress(&format!("npm install {}", choice.source));
                let program = install_npm(&tree, &choice.source, choice.cmd.as_deref()).await?;
                (program, None)
            }
            DistKind::Uvx => {
                progress(&format!("pip install {}", choice.source));
                let program =
                    install_python(&tree, &final_dir, &choice.source, choice.cmd.as_deref())
                        .await?;
                (program, None)
            }
        };

        let marker = InstallMarker {
            choice: choice.clone(),
            sha256: sha256.clone(),
            program: program.clone(),
        };
        let marker_path = tree.join(MARKER);
        let json = serde_json::to_vec_pretty(&marker).expect("a marker serialises");
        tokio::fs::write(&marker_path, json)
            .await
            .map_err(|e| io("writing", &marker_path, e))?;
        // An older install of this version (another choice, or one that no longer checks
        // out) is moved into the staging folder, which is removed with it.
        if tokio::fs::symlink_metadata(&final_dir).await.is_ok() {
            let old = staging_path.join("replaced");
            tokio::fs::rename(&final_dir, &old)
                .await
                .map_err(|e| io("moving aside", &final_dir, e))?;
        }
        tokio::fs::rename(&tree, &final_dir)
            .await
            .map_err(|e| io("moving into place", &final_dir, e))?;
        // What is left in the staging folder (an older install moved aside) goes with it.
        drop(staging);
        progress("installed");
        Ok(Installed {
            program: final_dir.join(program),
            args: choice.args.clone(),
            env: choice.env.clone(),
            dir: final_dir,
            sha256,
        })
    }

    /// Downloads, checks and unpacks a binary distribution into `tree`; answers the program
    /// (relative to `tree`) and the archive's sha256.
    async fn binary(
        &self,
        staging: &Path,
        tree: &Path,
        choice: &Choice,
        expect: Option<&str>,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<(PathBuf, String), InstallError> {
        let archive = staging.join("archive");
        progress(&format!(
            "downloading {}",
            crate::redact::url(&choice.source)
        ));
        let sha = download(&self.client, &choice.source, &archive, self.max_download).await?;
        let size = tokio::fs::metadata(&archive)
            .await
            .map(|m| m.len())
            .unwrap_or(0);
        progress(&format!(
            "downloaded {:.1} MB, sha256 {sha}",
            size as f64 / 1_000_000.0
        ));
        if let Some(expected) = expect
            && expected != sha
        {
            return Err(InstallError::Hash {
                expected: expected.to_owned(),
                actual: sha,
            });
        }
        progress("unpacking");
        let (source, dest, limits) = (choice.source.clone(), tree.to_path_buf(), self.limits);
        let archive_path = archive.clone();
        tokio::task::spawn_blocking(move || unpack(&archive_path, &source, &dest, &limits))
            .await
            .map_err(|e| InstallError::Io(e.to_string()))??;
        let _ = tokio::fs::remove_file(&archive).await;
        let cmd = choice.cmd.as_deref().ok_or_else(|| {
            InstallError::Missing("the binary distribution names no program (`cmd`)".to_owned())
        })?;
        let program = program_in(tree, cmd)?;
        Ok((program, sha))
    }

    /// The install at `final_dir`, when its marker says it is `choice` (and, when given, of
    /// the archive `expect`) and its program is still there.
    async fn reuse(
        &self,
        final_dir: &Path,
        choice: &Choice,
        expect: Option<&str>,
    ) -> Option<Installed> {
        let text = tokio::fs::read(final_dir.join(MARKER)).await.ok()?;
        let marker: InstallMarker = serde_json::from_slice(&text).ok()?;
        if marker.choice != *choice {
            return None;
        }
        if let Some(expected) = expect
            && marker.sha256.as_deref() != Some(expected)
        {
            return None;
        }
        let program = final_dir.join(&marker.program);
        let meta = tokio::fs::metadata(&program).await.ok()?;
        if !meta.is_file() {
            return None;
        }
        Some(Installed {
            program,
            args: choice.args.clone(),
            env: choice.env.clone(),
            dir: final_dir.to_path_buf(),
            sha256: marker.sha256,
        })
    }

    /// Removes everything installed for `name` (nothing there is fine).
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        if folder_name(name, "an agent's name").is_err() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("`{name}` is not an agent's name"),
            ));
        }
        match std::fs::remove_dir_all(self.root.join(name)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            done => done,
        }
    }
}

/// `value` as one folder's name: not empty, no `/`, not starting with `.`.
fn folder_name(value: &str, what: &str) -> Result<(), InstallError> {
    let fine = !value.is_empty()
        && !value.starts_with('.')
        && !value.contains(['/', '\\', '\0'])
        && value.len() <= 200;
    if fine {
        Ok(())
    } else {
        Err(InstallError::Unsafe(format!(
            "`{value}` cannot be {what}: it must be a plain folder name"
        )))
    }
}

/// The program `cmd` (`./bin/agent`, `agent`) inside the unpacked `tree`: a relative path to
/// an executable file that, symlinks followed, is inside `tree`. Answered relative to `tree`.
fn program_in(tree: &Path, cmd: &str) -> Result<PathBuf, InstallError> {
    let mut rel = PathBuf::new();
    for component in Path::new(cmd).components() {
        match component {
            Component::Normal(part) => rel.push(part),
            Component::CurDir => {}
            _ => {
                return Err(InstallError::Unsafe(format!(
                    "the program `{cmd}` is not a path inside the agent's folder"
                )));
            }
        }
    }
    let missing = || {
        InstallError::Missing(format!(
            "the archive has no program `{cmd}`; the registry entry and the archive disagree"
        ))
    };
    if rel.as_os_str().is_empty() {
        return Err(missing());
    }
    let path = tree.join(&rel);
    let resolved = std::fs::canonicalize(&path).map_err(|_| missing())?;
    let inside = std::fs::canonicalize(tree).is_ok_and(|tree| resolved.starts_with(tree));
    if !inside {
        return Err(InstallError::Unsafe(format!(
            "the program `{cmd}` leads outside the agent's folder"
        )));
    }
    let meta = std::fs::metadata(&resolved).map_err(|_| missing())?;
    if !meta.is_file() {
        return Err(missing());
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(InstallError::Unsafe(format!(
            "the program `{cmd}` is not executable (the archive does not mark it so)"
        )));
    }
    Ok(rel)
}
