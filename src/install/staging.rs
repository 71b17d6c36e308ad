//! The staging folders installs are made in, `<root>/.staging-<name>-<id>`, and what removes
//! them. Each is locked while its install runs: an exclusive `flock` on the file beside it,
//! `<root>/.staging-<name>-<id>.lock`, taken before the folder is made and let go after it is
//! removed, so that a process that dies lets go of it too. [`sweep`] removes the staging
//! folders no one holds (what an install killed midway left), whichever process looks, while
//! those of running installs, in this process or another one sharing the root, stay. A
//! staging folder is removed off the runtime's threads: awaited when its install ends, in
//! the background when the install is dropped.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::install::error::InstallError;

/// What every staging folder's name starts with.
pub const PREFIX: &str = ".staging-";

/// What a staging folder's lock file's name ends with.
const LOCK_SUFFIX: &str = ".lock";

/// A staging folder, held locked, removed when finished or dropped.
#[derive(Debug)]
pub struct Staging {
    held: Option<LockedFolder>,
}

/// A staging folder and the lock that holds it.
#[derive(Debug)]
struct LockedFolder {
    path: PathBuf,
    lock_path: PathBuf,
    lock: Flock<File>,
}

impl LockedFolder {
    /// Removes the folder, then its lock file, then lets go of the lock.
    fn clear(self) {
        let _ = std::fs::remove_dir_all(&self.path);
        let _ = std::fs::remove_file(&self.lock_path);
        drop(self.lock);
    }
}

impl Staging {
    /// Makes and locks a new staging folder for `name` under `root`.
    pub async fn create(root: &Path, name: &str) -> Result<Self, InstallError> {
        let (root, name) = (root.to_path_buf(), name.to_owned());
        tokio::task::spawn_blocking(move || Self::create_now(&root, &name))
            .await
            .map_err(|e| InstallError::Io(e.to_string()))?
    }

    fn create_now(root: &Path, name: &str) -> Result<Self, InstallError> {
        let id = uuid::Uuid::new_v4().simple();
        let path = root.join(format!("{PREFIX}{name}-{id}"));
        let lock_path = root.join(format!("{PREFIX}{name}-{id}{LOCK_SUFFIX}"));
        let io = |doing: &str, path: &Path, e| {
            InstallError::io(format!("{doing} {}", path.display()), e)
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock_path)
            .map_err(|e| io("creating", &lock_path, e))?;
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((_, errno)) => {
                let _ = std::fs::remove_file(&lock_path);
                return Err(io("locking", &lock_path, errno.into()));
            }
        };
        // A sweep that took the lock file for an orphan between its creation and the lock
        // removed it: the lock then holds nothing, and the install stops here.
        let same = std::fs::metadata(&lock_path)
            .and_then(|on_disk| Ok(on_disk.ino() == lock.metadata()?.ino()))
            .unwrap_or(false);
        if !same {
            return Err(InstallError::Io(format!(
                "the staging lock {} was removed as it was taken; try again",
                lock_path.display()
            )));
        }
        let held = LockedFolder {
            path,
            lock_path,
            lock,
        };
        if let Err(e) = std::fs::create_dir(&held.path) {
            let error = io("creating", &held.path, e);
            held.clear();
            return Err(error);
        }
        Ok(Self { held: Some(held) })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.held.as_ref().expect("held until finished").path
    }

    /// Removes the folder and what is left in it, off the runtime's threads.
    pub async fn finish(mut self) {
        if let Some(held) = self.held.take() {
            let _ = tokio::task::spawn_blocking(move || held.clear()).await;
        }
    }
}

impl Drop for Staging {
    /// An install dropped midway: its folder is removed in the background when a runtime
    /// runs, else here.
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || held.clear())),
                Err(_) => held.clear(),
            }
        }
    }
}

/// Removes the staging folders under `root` that no install holds, and the lock files left
/// without a folder. Answers how many folders it removed.
pub fn sweep(root: &Path) -> usize {
    let Ok(listed) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    for item in listed.flatten() {
        let name = item.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if !name.starts_with(PREFIX) {
            continue;
        }
        if item.file_type().is_ok_and(|t| t.is_dir()) {
            let lock_path = root.join(format!("{name}{LOCK_SUFFIX}"));
            if sweep_one(&item.path(), &lock_path) {
                removed += 1;
            }
        } else if let Some(folder) = name.strip_suffix(LOCK_SUFFIX) {
            let folder = root.join(folder);
            if std::fs::symlink_metadata(&folder).is_err() {
                sweep_one(&folder, &item.path());
            }
        }
    }
    removed
}

/// Removes one staging folder (if any) and its lock file when no one holds the lock.
fn sweep_one(folder: &Path, lock_path: &Path) -> bool {
    let Ok(file) = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(lock_path)
    else {
        return false;
    };
    let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
        return false;
    };
    let is_dir = std::fs::symlink_metadata(folder).is_ok_and(|m| m.is_dir());
    let cleared = !is_dir || std::fs::remove_dir_all(folder).is_ok();
    if cleared {
        let _ = std::fs::remove_file(lock_path);
    }
    drop(lock);
    is_dir && cleared
}

/// Runs blocking file work from sync code without holding up a runtime's other tasks: on a
/// multi-threaded runtime's worker the worker is handed over for the time of it; elsewhere
/// (no runtime, a current-thread one) it runs as it is.
pub fn off_runtime<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// Writes `bytes` as the new file `path`, never through a link: what has that name (a file or
/// a link the install left there) is removed first, and the file is created anew, refusing
/// to follow a link. A folder of that name is an error.
pub async fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use tokio::io::AsyncWriteExt;
    match tokio::fs::symlink_metadata(path).await {
        Ok(meta) if meta.is_dir() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a folder has the file's name",
            ));
        }
        Ok(_) => tokio::fs::remove_file(path).await?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .mode(0o644)
        .open(path)
        .await?;
    file.write_all(bytes).await?;
    file.flush().await
}

/// Reads the file `path`, refusing to follow a link there.
pub async fn read_no_follow(path: &Path) -> io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut file = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .await?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).await?;
    Ok(bytes)
}
