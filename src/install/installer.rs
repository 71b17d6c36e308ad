//! Installing a chosen distribution into `<root>/<name>/<version>`, all or nothing: everything
//! happens in a fresh staging folder under the root (`staging`), which becomes the version's
//! folder by one rename when complete and is removed on any failure (or when the install is
//! dropped). A failed install removes only its staging folder: an older folder of the same
//! version, moved aside for the new one, is put back, and the name's other versions are left
//! to the caller ([`Installer::remove`], [`Installer::remove_version`]). A marker file in the
//! version's folder records what was installed, so that an install of the same choice (a
//! restart) reuses it without downloading; it is written as a new file, never through a link
//! of that name the install left. The registry's `cmd` and package spec are checked before
//! anything is done, and the program after (`program`). An archive from a local file is
//! installed only when the installer allows it ([`Installer::allow_local_archives`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::install::archive::{UnpackLimits, unpack};
use crate::install::error::InstallError;
use crate::install::fetch::{DownloadOptions, download_with};
use crate::install::packages::{install_npm, install_python};
use crate::install::program::{check_choice, executable_inside, program_in};
use crate::install::registry::{Choice, DistKind};
use crate::install::staging::{Staging, off_runtime, read_no_follow, sweep, write_new};

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
    allow_local: bool,
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

impl Installer {
    /// An installer under `root` (made absolute), downloading with `client`, with the default
    /// bounds: archives of at most 1 GiB that unpack to at most [`UnpackLimits::default`],
    /// over HTTP(S) only. The staging folders that installs killed midway left under `root`
    /// are removed ([`Installer::sweep`]).
    pub fn new(root: PathBuf, client: reqwest::Client) -> Self {
        let root = std::path::absolute(&root).unwrap_or(root);
        let installer = Self {
            root,
            client,
            limits: UnpackLimits::default(),
            max_download: MAX_DOWNLOAD,
            allow_local: false,
        };
        installer.sweep();
        installer
    }

    /// The same installer, copying archives named as a `file://` URL or an absolute path when
    /// `allow` (for a registry read from this machine's files, whose author is trusted with
    /// them); refusing them otherwise, as it does by default.
    pub fn allow_local_archives(mut self, allow: bool) -> Self {
        self.allow_local = allow;
        self
    }

    /// Removes the staging folders under the root that no running install holds (in this
    /// process or another one); answers how many.
    pub fn sweep(&self) -> usize {
        off_runtime(|| sweep(&self.root))
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
        check_choice(choice)?;
        let expect = expect_sha256.map(|s| s.trim().to_ascii_lowercase());
        let agent_dir = self.root.join(name);
        let final_dir = agent_dir.join(&choice.version);
        if let Some(installed) = self.reuse(&final_dir, choice, expect.as_deref()).await {
            progress(&format!("already installed in {}", final_dir.display()));
            return Ok(installed);
        }
        tokio::fs::create_dir_all(&self.root)
            .await
            .map_err(|e| io("creating", &self.root, e))?;
        let staging = Staging::create(&self.root, name).await?;
        let made = self
            .install_in(
                staging.path(),
                &final_dir,
                choice,
                expect.as_deref(),
                progress,
            )
            .await;
        // Whatever is left in the staging folder (an older install moved aside, or all of a
        // failed one) goes with it.
        staging.finish().await;
        let (program, sha256) = made?;
        progress("installed");
        Ok(Installed {
            program: final_dir.join(program),
            args: choice.args.clone(),
            env: choice.env.clone(),
            dir: final_dir,
            sha256,
        })
    }

    /// Installs `choice` in the staging folder `staging` and moves it to `final_dir`; answers
    /// the program (relative to the folder) and the archive's sha256 (binary distributions).
    async fn install_in(
        &self,
        staging: &Path,
        final_dir: &Path,
        choice: &Choice,
        expect: Option<&str>,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<(PathBuf, Option<String>), InstallError> {
        let tree = staging.join("tree");
        tokio::fs::create_dir(&tree)
            .await
            .map_err(|e| io("creating", &tree, e))?;
        let (program, sha256) = match choice.kind {
            DistKind::Binary => {
                let (program, sha) = self
                    .binary(staging, &tree, choice, expect, progress)
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
                    install_python(&tree, final_dir, &choice.source, choice.cmd.as_deref()).await?;
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
        write_new(&marker_path, &json)
            .await
            .map_err(|e| io("writing", &marker_path, e))?;
        put_in_place(&tree, final_dir, &staging.join("replaced")).await?;
        Ok((program, sha256))
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
        let options = DownloadOptions {
            allow_local: self.allow_local,
            ..DownloadOptions::new(self.max_download)
        };
        let sha = download_with(&self.client, &choice.source, &archive, &options).await?;
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
        let missing = format!(
            "the archive has no program `{cmd}`; the registry entry and the archive disagree"
        );
        let program = program_in(tree, cmd, &missing)?;
        Ok((program, sha))
    }

    /// The install at `final_dir`, when its marker says it is `choice` (and, when given, of
    /// the archive `expect`) and its program is still there, an executable file inside.
    async fn reuse(
        &self,
        final_dir: &Path,
        choice: &Choice,
        expect: Option<&str>,
    ) -> Option<Installed> {
        let text = read_no_follow(&final_dir.join(MARKER)).await.ok()?;
        let marker: InstallMarker = serde_json::from_slice(&text).ok()?;
        if marker.choice != *choice {
            return None;
        }
        if let Some(expected) = expect
            && marker.sha256.as_deref() != Some(expected)
        {
            return None;
        }
        let (dir, rel) = (final_dir.to_path_buf(), marker.program.clone());
        let checked = tokio::task::spawn_blocking(move || executable_inside(&dir, &rel));
        let program = final_dir.join(checked.await.ok()?.ok()?);
        Some(Installed {
            program,
            args: choice.args.clone(),
            env: choice.env.clone(),
            dir: final_dir.to_path_buf(),
            sha256: marker.sha256,
        })
    }

    /// Removes everything installed for `name` (nothing there is fine). The files are removed
    /// without holding up the runtime's other tasks (see [`off_runtime`]).
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        plain_name(name, "an agent's name")?;
        let dir = self.root.join(name);
        off_runtime(|| not_found_is_fine(std::fs::remove_dir_all(dir)))
    }

    /// Removes the version `version` of `name` (nothing there is fine), and the name's folder
    /// when no other version is left in it.
    pub fn remove_version(&self, name: &str, version: &str) -> std::io::Result<()> {
        plain_name(name, "an agent's name")?;
        plain_name(version, "a version")?;
        let dir = self.root.join(name);
        off_runtime(|| {
            not_found_is_fine(std::fs::remove_dir_all(dir.join(version)))?;
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => Ok(()),
                done => not_found_is_fine(done),
            }
        })
    }
}

/// An I/O failure while `doing` something to `path`.
fn io(doing: &str, path: &Path, e: std::io::Error) -> InstallError {
    InstallError::io(format!("{doing} {}", path.display()), e)
}

/// `done`, a missing file or folder taken as done.
fn not_found_is_fine(done: std::io::Result<()>) -> std::io::Result<()> {
    match done {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        done => done,
    }
}

/// [`folder_name`] as an I/O error.
fn plain_name(value: &str, what: &str) -> std::io::Result<()> {
    folder_name(value, what).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("`{value}` is not {what}"),
        )
    })
}

/// Moves the complete `tree` to `final_dir`. An older folder there is first moved to `aside`
/// (inside the staging folder, removed with it); when the tree cannot take its place, the
/// older folder is put back, so that a failure removes nothing it did not make.
pub(super) async fn put_in_place(
    tree: &Path,
    final_dir: &Path,
    aside: &Path,
) -> Result<(), InstallError> {
    // The agent's folder is made only now, so that an install cut short (a crash) leaves
    // nothing but its staging folder, which the next start sweeps.
    if let Some(agent_dir) = final_dir.parent() {
        (tokio::fs::create_dir_all(agent_dir).await).map_err(|e| io("creating", agent_dir, e))?;
    }
    let moved_aside = match tokio::fs::rename(final_dir, aside).await {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(io("moving aside", final_dir, e)),
    };
    if let Err(e) = tokio::fs::rename(tree, final_dir).await {
        if moved_aside {
            let _ = tokio::fs::rename(aside, final_dir).await;
        }
        return Err(io("moving into place", final_dir, e));
    }
    Ok(())
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
