//! A session's files, in the workspace the gateway made it: `GET`, `PUT` and `DELETE
//! /sessions/{id}/files/{path}`. Paths are checked ([`WorkPath`]) and each access resolved
//! beneath the workspace's folder ([`WorkFiles`]), on a blocking thread.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::caller::Caller;
use super::error::Error;
use super::input::SessionId;
use super::parts::use_case;
use crate::pool::AgentHost;
use crate::workspace::files::{EntryKind, FileError, FileInfo, WorkFiles};
use crate::workspace::path::{PathRefused, WorkPath};

use_case! {
    /// The use case of a session's files, with the parts it needs.
    pub struct Files {
        parts: [records, workspaces, placement],
    }
}

/// A folder of a workspace, listed.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"path": "src", "uri": "file:///var/lib/acp-gateway/workspaces/9b2f0c1e/src", "entries": [{"name": "main.rs", "kind": "file", "size": 1024, "modified": "2026-11-29T10:00:00Z", "uri": "file:///var/lib/acp-gateway/workspaces/9b2f0c1e/src/main.rs"}]}))]
pub struct FolderView {
    /// Its path in the workspace (`""`: the workspace's folder).
    pub path: String,
    /// Its `file://` URI on the gateway's host (the agent's view of it).
    pub uri: String,
    /// Its names, sorted.
    pub entries: Vec<FileEntryView>,
}

/// One name of a folder.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileEntryView {
    pub name: String,
    /// `file`, `folder`, `symlink` (listed as a link, not followed) or `other`.
    pub kind: &'static str,
    /// Bytes.
    pub size: u64,
    /// ISO 8601.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified: Option<DateTime<Utc>>,
    /// Its `file://` URI, which a prompt's `resource_link` may name.
    pub uri: String,
}

/// A file of a workspace, as written.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"path": "notes/todo.md", "uri": "file:///var/lib/acp-gateway/workspaces/9b2f0c1e/notes/todo.md", "size": 12, "etag": "\"1a2b-c-17f0e1d2c3b4a596\"", "modified": "2026-11-29T10:00:00Z"}))]
pub struct FileView {
    pub path: String,
    pub uri: String,
    pub size: u64,
    /// The file's ETag (as the `ETag` header): a `PUT` with `If-Match` writes only over it.
    pub etag: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified: Option<DateTime<Utc>>,
}

/// A file found, open for reading.
#[derive(Debug)]
pub struct OpenFile {
    pub file: std::fs::File,
    /// Its last name (for the content type).
    pub name: String,
    pub size: u64,
    pub etag: String,
    pub modified: Option<DateTime<Utc>>,
}

/// What a path of a workspace leads to.
#[derive(Debug)]
pub enum Found {
    Folder(FolderView),
    File(OpenFile),
}

impl Files {
    /// `GET /sessions/{id}/files/{path}`: the folder's names, or the file open for reading.
    pub async fn find(&self, caller: &Caller, id: &SessionId, path: &str) -> Result<Found, Error> {
        let (at, path) = self.open(caller, id, path).await?;
        let Opened {
            files,
            root,
            worktree,
        } = at;
        // A worktree's `.git` is git's: not listed, as it is not served.
        let hidden = move |name: &str| worktree && name == ".git";
        blocking(move || {
            // Opened first: a folder is listed instead (one look at the path, not two).
            let (file, info) = match files.open_file(&path) {
                Err(FileError::IsAFolder(_)) => {
                    let entries = files.list(&path)?;
                    let entries = entries
                        .into_iter()
                        .filter(|e| !(path.as_str().is_empty() && hidden(&e.name)))
                        .map(|e| FileEntryView {
                            uri: uri_of(&root, &path.join(&e.name)),
                            kind: kind_name(e.kind),
                            size: e.size,
                            modified: e.modified.map(time),
                            name: e.name,
                        })
                        .collect();
                    let uri = uri_of(&root, &path);
                    let path = path.to_string();
                    return Ok(Found::Folder(FolderView { path, uri, entries }));
                }
                opened => opened?,
            };
            let name = path
                .split_last()
                .map(|(_, n)| n.to_owned())
                .unwrap_or_default();
            Ok(Found::File(OpenFile {
                file,
                name,
                size: info.size,
                etag: info.etag,
                modified: info.modified.map(time),
            }))
        })
        .await
    }

    /// The host of the session's agent, when it runs on another host (where its files are):
    /// `None` for a session of an agent this gateway runs.
    pub async fn host(&self, caller: &Caller, id: &SessionId) -> Result<Option<AgentHost>, Error> {
        if !self.placement.any_remote() {
            return Ok(None);
        }
        let record = self.records.get(caller, id).await?;
        Ok(self.placement.host_of(&record))
    }

    /// `PUT /sessions/{id}/files/{path}`: writes the file whole (folders made), over the ETag
    /// `if_match` names when it names one; `true` when the file is new.
    pub async fn write(
        &self,
        caller: &Caller,
        id: &SessionId,
        path: &str,
        bytes: Bytes,
        if_match: Option<String>,
    ) -> Result<(FileView, bool), Error> {
        let (Opened { files, root, .. }, path) = self.open(caller, id, path).await?;
        blocking(move || {
            let (info, created) = files.write(&path, &bytes, if_match.as_deref())?;
            Ok((file_view(&root, &path, info), created))
        })
        .await
    }

    /// `POST /sessions/{id}/files`: several files written whole (their folders made), each
    /// over whatever was there. Every path is checked before any file is written.
    pub async fn upload(
        &self,
        caller: &Caller,
        id: &SessionId,
        uploaded: Vec<(String, Bytes)>,
    ) -> Result<Vec<FileView>, Error> {
        let (paths, bytes): (Vec<String>, Vec<Bytes>) = uploaded.into_iter().unzip();
        let (Opened { files, root, .. }, paths) = self
            .open_all(caller, id, paths.iter().map(String::as_str))
            .await?;
        blocking(move || {
            let mut written = Vec::with_capacity(paths.len());
            for (path, bytes) in paths.into_iter().zip(bytes) {
                let (info, _) = files.write(&path, &bytes, None)?;
                written.push(file_view(&root, &path, info));
            }
            Ok(written)
        })
        .await
    }

    /// `DELETE /sessions/{id}/files/{path}`: the file, or the folder and all it holds.
    pub async fn delete(&self, caller: &Caller, id: &SessionId, path: &str) -> Result<(), Error> {
        let (Opened { files, .. }, path) = self.open(caller, id, path).await?;
        blocking(move || Ok(files.delete(&path)?)).await
    }

    /// The caller's session's workspace, and `path` checked.
    async fn open(
        &self,
        caller: &Caller,
        id: &SessionId,
        path: &str,
    ) -> Result<(Opened, WorkPath), Error> {
        let (opened, mut paths) = self.open_all(caller, id, [path]).await?;
        Ok((opened, paths.remove(0)))
    }

    /// The caller's session's workspace files, its folder, and `paths` checked: each one
    /// inside it (400), and none in a worktree's `.git`, which is git's (403: written, it could
    /// lead the gateway's git to another repository).
    async fn open_all<'p>(
        &self,
        caller: &Caller,
        id: &SessionId,
        paths: impl IntoIterator<Item = &'p str>,
    ) -> Result<(Opened, Vec<WorkPath>), Error> {
        let record = self.records.get(caller, id).await?;
        self.placement.files_here(&record)?;
        let paths = paths
            .into_iter()
            .map(parse)
            .collect::<Result<Vec<_>, _>>()?;
        let (files, root, worktree) = self.workspaces.files(id.as_str()).await?;
        let in_git = |p: &&WorkPath| p.as_str().split('/').next() == Some(".git");
        if let Some(path) = paths.iter().find(in_git).filter(|_| worktree) {
            return Err(Error::Forbidden(format!(
                "{path}: a worktree's .git is git's, not served"
            )));
        }
        let opened = Opened {
            files,
            root,
            worktree,
        };
        Ok((opened, paths))
    }
}

/// A session's workspace, open for its files.
struct Opened {
    files: Arc<WorkFiles>,
    /// Its folder.
    root: String,
    /// Whether it is a git worktree.
    worktree: bool,
}

/// A client's path in a workspace, checked (400 when it could only mean somewhere else).
fn parse(path: &str) -> Result<WorkPath, Error> {
    WorkPath::parse(path).map_err(|e: PathRefused| Error::Malformed(format!("path {path:?}: {e}")))
}

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::FileSystem(format!("a file operation failed: {e}")))?
}

fn file_view(root: &str, path: &WorkPath, info: FileInfo) -> FileView {
    FileView {
        path: path.to_string(),
        uri: uri_of(root, path),
        size: info.size,
        etag: info.etag,
        modified: info.modified.map(time),
    }
}

fn time(t: SystemTime) -> DateTime<Utc> {
    t.into()
}

fn kind_name(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::File => "file",
        EntryKind::Folder => "folder",
        EntryKind::Symlink => "symlink",
        EntryKind::Other => "other",
    }
}

/// The `file://` URI of `path` in the workspace whose folder is `root`.
fn uri_of(root: &str, path: &WorkPath) -> String {
    let full = Path::new(root).join(path.as_str());
    url::Url::from_file_path(&full)
        .map_or_else(|()| format!("file://{}", full.display()), String::from)
}

impl From<FileError> for Error {
    fn from(e: FileError) -> Self {
        let message = e.to_string();
        match e {
            FileError::NotFound(_) | FileError::NotAFolder(_) => Error::NotFound(message),
            FileError::Escapes(_) => Error::Forbidden(message),
            FileError::IsAFolder(_) | FileError::Root => Error::Conflict(message),
            FileError::Stale { .. } | FileError::Gone { .. } => Error::PreconditionFailed(message),
            // A name longer than the file system takes.
            FileError::Io { source, .. }
                if source.kind() == std::io::ErrorKind::InvalidFilename =>
            {
                Error::Invalid(message)
            }
            FileError::Io { .. } => {
                tracing::error!(error = %message, "a workspace's file operation failed");
                Error::FileSystem(message)
            }
        }
    }
}
