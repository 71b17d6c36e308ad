//! The files of one workspace, reached through a handle on its folder (`cap_std::fs::Dir`):
//! listed, described, opened, written and deleted by [`WorkPath`]. Each access resolves its
//! path beneath that handle (`openat2` with `RESOLVE_BENEATH` where the kernel has it, else
//! `cap-std`'s own walk), so a symlink that leads out, made by the agent at any time, is
//! refused when it is followed. These calls block: callers run them on a blocking thread.

use std::io::{self, Write as _};
use std::path::Path;
use std::time::SystemTime;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt as _, OpenOptions};

use super::path::WorkPath;

/// What a name in a folder is. A symlink is listed as one, not followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Folder,
    Symlink,
    Other,
}

/// One name of a folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    pub name: String,
    pub kind: EntryKind,
    /// Bytes (a folder's and a symlink's as the file system reports them).
    pub size: u64,
    pub modified: Option<SystemTime>,
}

/// What a path leads to (symlinks inside the workspace followed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    pub kind: EntryKind,
    pub size: u64,
    pub modified: Option<SystemTime>,
    /// A strong validator of the content (RFC 9110 §8.8.3), quoted: it changes whenever the
    /// file is written (its inode, size and modification time).
    pub etag: String,
}

/// Why a file operation could not be done.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("no such file or folder in the workspace: {0:?}")]
    NotFound(String),
    #[error("{0:?} leads outside the workspace (through a symlink)")]
    Escapes(String),
    #[error("{0:?} is a folder")]
    IsAFolder(String),
    #[error("{0:?} is not a folder")]
    NotAFolder(String),
    #[error("{path:?} has changed: its ETag is {current}, not the one the request names")]
    Stale { path: String, current: String },
    #[error("{path:?} does not exist, and the request names an ETag it should have")]
    Gone { path: String },
    #[error("the workspace's folder is itself neither written nor deleted")]
    Root,
    #[error("{path:?}: {source}")]
    Io { path: String, source: io::Error },
}

impl FileError {
    /// The error of an access to `path`, by what the file system said.
    fn of(path: &WorkPath, e: io::Error) -> FileError {
        let path = path.to_string();
        match e.kind() {
            io::ErrorKind::NotFound => FileError::NotFound(path),
            io::ErrorKind::IsADirectory => FileError::IsAFolder(path),
            io::ErrorKind::NotADirectory => FileError::NotAFolder(path),
            // How cap-std says a path (through a symlink, or `openat2`'s EXDEV) left the folder.
            io::ErrorKind::PermissionDenied
                if e.to_string().contains("outside of the filesystem") =>
            {
                FileError::Escapes(path)
            }
            _ => FileError::Io { path, source: e },
        }
    }
}

/// A workspace's files.
#[derive(Debug)]
pub struct WorkFiles {
    dir: Dir,
}

/// The prefix of the temporary file a write goes through before it is renamed into place.
const WRITING: &str = ".acp-gateway-write-";

impl WorkFiles {
    /// The files of the folder at `root`.
    pub fn open(root: &Path) -> io::Result<WorkFiles> {
        let dir = Dir::open_ambient_dir(root, ambient_authority())?;
        Ok(WorkFiles { dir })
    }

    /// What `path` is.
    pub fn info(&self, path: &WorkPath) -> Result<FileInfo, FileError> {
        let meta = self
            .dir
            .metadata(path.as_path())
            .map_err(|e| FileError::of(path, e))?;
        Ok(info_of(&meta))
    }

    /// The names in the folder `path`, sorted.
    pub fn list(&self, path: &WorkPath) -> Result<Vec<FileEntry>, FileError> {
        let at = |e| FileError::of(path, e);
        let mut entries = Vec::new();
        for entry in self.dir.read_dir(path.as_path()).map_err(at)? {
            let entry = entry.map_err(at)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(WRITING) {
                continue;
            }
            let meta = entry.metadata().map_err(at)?;
            entries.push(FileEntry {
                name,
                kind: kind_of(&meta),
                size: meta.len(),
                modified: meta.modified().ok().map(|t| t.into_std()),
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    /// The file at `path`, open for reading, and what it is.
    pub fn open_file(&self, path: &WorkPath) -> Result<(std::fs::File, FileInfo), FileError> {
        let at = |e| FileError::of(path, e);
        let file = self.dir.open(path.as_path()).map_err(at)?;
        let info = info_of(&file.metadata().map_err(at)?);
        if info.kind == EntryKind::Folder {
            return Err(FileError::IsAFolder(path.to_string()));
        }
        Ok((file.into_std(), info))
    }

    /// Writes `bytes` to the file at `path`, making the folders it is in (`true` with the file
    /// when it is new; a folder at `path` is not replaced). With `if_match`, only
    /// when the file's ETag is that one (`*`: when it exists). The file is replaced whole, by
    /// a rename, so a reader sees the old content or the new, never a part (a symlink at
    /// `path` that stays inside is replaced by the file; one that leads out is refused, as a
    /// read through it is). The check and the rename are not one step: a write by the agent
    /// between them is overwritten.
    pub fn write(
        &self,
        path: &WorkPath,
        bytes: &[u8],
        if_match: Option<&str>,
    ) -> Result<(FileInfo, bool), FileError> {
        let (folder, _) = path.split_last().ok_or(FileError::Root)?;
        let now = match self.info(path) {
            Ok(now) if now.kind == EntryKind::Folder => {
                return Err(FileError::IsAFolder(path.to_string()));
            }
            Ok(now) => Some(now),
            Err(FileError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        let created = now.is_none();
        match (if_match, now) {
            (None, _) => {}
            (Some(_), None) => {
                return Err(FileError::Gone {
                    path: path.to_string(),
                });
            }
            (Some(wanted), Some(now)) if wanted != "*" && now.etag != wanted => {
                let (path, current) = (path.to_string(), now.etag);
                return Err(FileError::Stale { path, current });
            }
            (Some(_), Some(_)) => {}
        }
        match self.info(&folder) {
            Ok(f) if f.kind == EntryKind::Folder => {}
            Ok(_) => return Err(FileError::NotAFolder(folder.to_string())),
            Err(FileError::NotFound(_)) => self
                .dir
                .create_dir_all(folder.as_path())
                .map_err(|e| FileError::of(&folder, e))?,
            Err(e) => return Err(e),
        }
        let temp = folder.join(&format!("{WRITING}{}", uuid::Uuid::new_v4().simple()));
        let written = (|| {
            let mut options = OpenOptions::new();
            options.write(true).create_new(true);
            let mut file = self.dir.open_with(temp.as_path(), &options)?;
            file.write_all(bytes)?;
            file.sync_data()
        })();
        let renamed =
            written.and_then(|()| self.dir.rename(temp.as_path(), &self.dir, path.as_path()));
        if let Err(e) = renamed {
            let _ = self.dir.remove_file(temp.as_path());
            return Err(FileError::of(path, e));
        }
        Ok((self.info(path)?, created))
    }

    /// Copies everything in the workspace into the empty folder `to`: folders and files, and
    /// symlinks as symlinks (never followed, so nothing outside is copied in). A fork's
    /// workspace starts from its parent's files this way.
    pub fn copy_into(&self, to: &Path) -> io::Result<()> {
        let target = Dir::open_ambient_dir(to, ambient_authority())?;
        copy_dir(&self.dir, &target)
    }

    /// Deletes the file at `path`, or the folder and all it holds; a symlink itself, not what
    /// it leads to.
    pub fn delete(&self, path: &WorkPath) -> Result<(), FileError> {
        if path.is_root() {
            return Err(FileError::Root);
        }
        let at = |e| FileError::of(path, e);
        let meta = self.dir.symlink_metadata(path.as_path()).map_err(at)?;
        if meta.is_dir() {
            self.dir.remove_dir_all(path.as_path()).map_err(at)
        } else {
            self.dir.remove_file(path.as_path()).map_err(at)
        }
    }
}

/// Copies what `from` holds into `to`, folder by folder, each opened beneath its parent.
fn copy_dir(from: &Dir, to: &Dir) -> io::Result<()> {
    for entry in from.entries()? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(WRITING) {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            to.symlink_contents(from.read_link_contents(&name)?, &name)?;
        } else if kind.is_dir() {
            to.create_dir(&name)?;
            copy_dir(&from.open_dir(&name)?, &to.open_dir(&name)?)?;
        } else if kind.is_file() {
            from.copy(&name, to, &name)?;
        }
    }
    Ok(())
}

fn kind_of(meta: &cap_std::fs::Metadata) -> EntryKind {
    let kind = meta.file_type();
    if kind.is_symlink() {
        EntryKind::Symlink
    } else if kind.is_dir() {
        EntryKind::Folder
    } else if kind.is_file() {
        EntryKind::File
    } else {
        EntryKind::Other
    }
}

fn info_of(meta: &cap_std::fs::Metadata) -> FileInfo {
    let modified = meta.modified().ok().map(|t| t.into_std());
    let nanos = modified
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    FileInfo {
        kind: kind_of(meta),
        size: meta.len(),
        modified,
        etag: format!("\"{:x}-{:x}-{nanos:x}\"", meta.ino(), meta.len()),
    }
}

#[cfg(test)]
#[path = "files_tests.rs"]
mod tests;
