//! `/sessions/{id}/files`: the files of a session's workspace (`"workspace": {"kind":
//! "scratch"}` or `{"kind": "worktree"}` at creation). A folder is listed as JSON; a file is
//! served as its bytes with `Content-Type` (by its name), `ETag`, `Last-Modified`,
//! `If-None-Match` (304) and one byte `Range` (206, 416); `PUT` writes a file whole (its folders
//! made; `If-Match` → 412 when it changed), `POST` uploads several in one multipart body,
//! `DELETE` removes a file or a folder. The bytes are streamed as they are: no JSON layer
//! rewrites them.

use axum::body::{Body, Bytes};
use axum::extract::multipart::{MultipartError, MultipartRejection};
use axum::extract::{FromRequestParts, Multipart, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};

use super::error::ApiError;
use super::extract::{AppState, Path, SessionPath};
use super::responses::{
    FilesElsewhere, NoWorkspace, PathOutside, SymlinkOutside, UnknownFile, UnknownSession,
};
use crate::gateway::{Caller, FileView, FolderView, Found, OpenFile, SessionId};

/// How much of a file one read takes while it is sent (`bench/workspace.sh` measures it).
const READ_CHUNK: usize = 256 * 1024;

/// A file's bytes, of any type (OpenAPI's binary string).
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)] // a schema only: the bytes travel as a body, never as this type
pub struct FileBytes(Vec<u8>);

/// The parameters of a path in a session's workspace.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // documented here, read by `FileRequest`
struct FilePath {
    /// Session id
    id: String,
    /// The path in the workspace: names separated by `/` (no `..`, not absolute)
    path: String,
}

/// What every files route takes: the caller, the session, the path in its workspace (empty:
/// the workspace's folder) and the request's headers.
pub struct FileRequest {
    caller: Caller,
    id: SessionId,
    path: String,
    headers: HeaderMap,
}

impl FromRequestParts<AppState> for FileRequest {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        /// The route's parameters (`path` is absent on the workspace's folder).
        #[derive(Deserialize)]
        struct At {
            id: SessionId,
            #[serde(default)]
            path: String,
        }
        let caller = Caller::from_request_parts(parts, state).await?;
        let Path(at) = Path::<At>::from_request_parts(parts, state).await?;
        let headers = parts.headers.clone();
        let (id, path) = (at.id, at.path);
        Ok(FileRequest {
            caller,
            id,
            path,
            headers,
        })
    }
}

/// A response whose body is passed on as it is (`restore_surrogates` leaves it alone): a file's
/// bytes, whatever their type says.
#[derive(Debug, Clone, Copy)]
pub struct Verbatim;

/// A file's bytes, or a folder's names.
#[utoipa::path(get, operation_id = "getFile", path = "/sessions/{id}/files/{path}", tag = "files",
    params(
        FilePath,
        ("Range" = Option<String>, Header, description = "One byte range, e.g. `bytes=0-1023` (several: the whole file)"),
        ("If-None-Match" = Option<String>, Header, description = "The ETag the client has: 304 when it is the file's"),
    ),
    responses(
        (status = 200, description = "The file's bytes (its type by its name), or a folder's names (JSON)", content(
            (FileBytes = "application/octet-stream"),
            (FolderView = "application/json"),
        ), headers(("ETag" = String, description = "The file's version"), ("Last-Modified" = String, description = "When it was written"))),
        (status = 206, description = "The range asked for", body = FileBytes, content_type = "application/octet-stream",
            headers(("Content-Range" = String, description = "`bytes FIRST-LAST/SIZE`"))),
        (status = 304, description = "The file is the version `If-None-Match` names"),
        PathOutside,
        SymlinkOutside,
        UnknownFile,
        NoWorkspace,
        FilesElsewhere,
        (status = 416, description = "The range is outside the file", body = crate::gateway::Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_file(State(s): State<AppState>, req: FileRequest) -> Result<Response, ApiError> {
    serve(&s, req).await
}

/// Write a file whole (the folders it is in made).
#[utoipa::path(put, operation_id = "putFile", path = "/sessions/{id}/files/{path}", tag = "files",
    params(
        FilePath,
        ("If-Match" = Option<String>, Header, description = "Write only over this version of the file (its ETag; `*`: any, but it must exist)"),
    ),
    request_body(content = FileBytes, content_type = "application/octet-stream", description = "The file's new bytes (any type)", example = json!("# Notes\n")),
    responses(
        (status = 200, description = "Written over the file", body = FileView, headers(("ETag" = String, description = "The new version"))),
        (status = 201, description = "A new file", body = FileView, headers(("ETag" = String, description = "Its version"))),
        PathOutside,
        SymlinkOutside,
        (status = 404, description = "Unknown session", body = crate::gateway::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The path is a folder, or the session has no workspace of the gateway's", body = crate::gateway::Problem, content_type = "application/problem+json"),
        FilesElsewhere,
        (status = 412, description = "The file is not the version `If-Match` names (or does not exist)", body = crate::gateway::Problem, content_type = "application/problem+json"),
    ))]
pub async fn put_file(
    State(s): State<AppState>,
    req: FileRequest,
    body: Bytes,
) -> Result<Response, ApiError> {
    let if_match = header_text(&req.headers, header::IF_MATCH).map(|v| v.trim().to_owned());
    let files = s.gateway.files();
    let (caller, id, path) = (&req.caller, &req.id, &req.path);
    let (view, created) = files.write(caller, id, path, body, if_match).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let etag = HeaderValue::from_str(&view.etag).ok();
    let mut res = (status, axum::Json::<FileView>(view)).into_response();
    if let Some(etag) = etag {
        res.headers_mut().insert(header::ETAG, etag);
    }
    Ok(res)
}

/// Delete a file, or a folder and all it holds (a symlink itself, not what it leads to).
#[utoipa::path(delete, operation_id = "deleteFile", path = "/sessions/{id}/files/{path}", tag = "files",
    params(FilePath),
    responses(
        (status = 204, description = "Deleted"),
        PathOutside,
        SymlinkOutside,
        (status = 404, description = "Unknown session, or no such file", body = crate::gateway::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The path is the workspace's folder, or the session has no workspace of the gateway's", body = crate::gateway::Problem, content_type = "application/problem+json"),
        FilesElsewhere,
    ))]
pub async fn delete_file(
    State(s): State<AppState>,
    req: FileRequest,
) -> Result<StatusCode, ApiError> {
    s.gateway
        .files()
        .delete(&req.caller, &req.id, &req.path)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The workspace's folder, listed.
#[utoipa::path(get, operation_id = "listFiles", path = "/sessions/{id}/files", tag = "files",
    params(SessionPath),
    responses(
        (status = 200, description = "The names in the workspace's folder", body = FolderView),
        UnknownSession,
        NoWorkspace,
        FilesElsewhere,
    ))]
pub async fn list_files(State(s): State<AppState>, req: FileRequest) -> Result<Response, ApiError> {
    serve(&s, req).await
}

/// A multipart upload: each part named `file`, whose filename is its path in the workspace.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the parts are read as they come
pub struct Upload {
    /// The files; each part's `filename` is the file's path (`notes/todo.md`).
    file: Vec<UploadPart>,
}

/// One uploaded file's bytes: a part of any content type (the request body's `encoding` says
/// `application/octet-stream`), whose `filename` is the file's path.
#[derive(utoipa::ToSchema)]
#[schema(value_type = String)]
#[allow(dead_code)] // a schema only
pub struct UploadPart(Vec<u8>);

/// The files an upload wrote.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(example = json!({"files": [{"path": "notes/todo.md", "uri": "file:///var/lib/acp-gateway/workspaces/9b2f0c1e/notes/todo.md", "size": 8, "etag": "\"1a2b-8-17f0e1d2c3b4a596\"", "modified": "2026-11-29T10:00:00Z"}]}))]
pub struct Uploaded {
    pub files: Vec<FileView>,
}

/// Upload several files at once.
///
/// A `multipart/form-data` body whose parts are named `file`, each part's `filename` the file's
/// path in the workspace (its folders made, whatever was there replaced). Every path is
/// checked before any file is written.
#[utoipa::path(post, operation_id = "uploadFiles", path = "/sessions/{id}/files", tag = "files",
    params(SessionPath),
    request_body(content(
        (Upload = "multipart/form-data", example = json!({"file": ["# Notes\n"]}),
            encoding(("file" = (content_type = "application/octet-stream")))),
    )),
    responses(
        (status = 201, description = "The files written, in the order sent", body = Uploaded),
        (status = 413, description = "The body is larger than --max-body-bytes", body = crate::gateway::Problem, content_type = "application/problem+json"),
        (status = 400, description = "Not multipart, a part that is not a named `file`, or a path that leaves the workspace", body = crate::gateway::Problem, content_type = "application/problem+json"),
        SymlinkOutside,
        UnknownSession,
        (status = 409, description = "A path is a folder, or the session has no workspace of the gateway's", body = crate::gateway::Problem, content_type = "application/problem+json"),
        FilesElsewhere,
    ))]
pub async fn upload_files(
    State(s): State<AppState>,
    req: FileRequest,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<(StatusCode, axum::Json<Uploaded>), ApiError> {
    let mut multipart = multipart.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let mut uploaded = Vec::new();
    while let Some(part) = multipart.next_field().await.map_err(bad)? {
        let path = match (part.name(), part.file_name()) {
            (Some("file"), Some(path)) => path.to_owned(),
            (name, _) => {
                let name = name.unwrap_or_default();
                return Err(ApiError::BadRequest(format!(
                    "part {name:?}: each part is a `file` with a filename, its path"
                )));
            }
        };
        let bytes = part.bytes().await.map_err(bad)?;
        uploaded.push((path, bytes));
    }
    let files = s.gateway.files();
    let written = files.upload(&req.caller, &req.id, uploaded).await?;
    Ok((StatusCode::CREATED, axum::Json(Uploaded { files: written })))
}

/// A multipart body that cannot be read: too large (413, `--max-body-bytes`) or malformed (400).
fn bad(e: MultipartError) -> ApiError {
    let text = format!("multipart body: {}", e.body_text());
    match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(text),
        _ => ApiError::BadRequest(text),
    }
}

/// `GET` of a path: a folder's JSON, or the file's bytes as the request's headers ask.
async fn serve(s: &AppState, req: FileRequest) -> Result<Response, ApiError> {
    match s
        .gateway
        .files()
        .find(&req.caller, &req.id, &req.path)
        .await?
    {
        Found::Folder(folder) => Ok(axum::Json(folder).into_response()),
        Found::File(file) => file_response(file, &req.headers).await,
    }
}

/// A header's value, if it is text.
fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn file_response(found: OpenFile, headers: &HeaderMap) -> Result<Response, ApiError> {
    let OpenFile {
        file,
        name,
        size,
        etag,
        modified,
    } = found;
    let header_text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let mut res = Response::builder()
        .header(header::ETAG, &etag)
        .header(header::ACCEPT_RANGES, "bytes");
    if let Some(modified) = modified {
        let http_date = modified.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
        res = res.header(header::LAST_MODIFIED, http_date);
    }
    res = res.extension(Verbatim);
    if header_text(header::IF_NONE_MATCH).is_some_and(|tags| matches_etag(tags, &etag)) {
        return Ok(res
            .status(StatusCode::NOT_MODIFIED)
            .body(Body::empty())
            .expect("a valid response"));
    }
    // A range applies to this version only (`If-Range`); one range, or the whole file.
    let fresh = header_text(header::IF_RANGE).is_none_or(|tag| tag == etag);
    let range = match header_text(header::RANGE).filter(|_| fresh) {
        Some(text) => match http_range_header::parse_range_header(text) {
            Ok(ranges) => match ranges.validate(size) {
                Ok(ranges) if ranges.len() == 1 => Some(ranges[0].clone()),
                Ok(_) => None,
                Err(_) => return Err(ApiError::RangeNotSatisfiable { size }),
            },
            Err(_) => None, // not a range this server reads: ignored (RFC 9110 §14.2)
        },
        None => None,
    };
    let content_type = mime_guess::from_path(&name).first_or_octet_stream();
    res = res.header(header::CONTENT_TYPE, content_type.as_ref());
    let mut file = tokio::fs::File::from_std(file);
    let (status, first, len) = match range {
        Some(r) => {
            let (first, last) = (*r.start(), *r.end());
            let content_range = format!("bytes {first}-{last}/{size}");
            res = res.header(header::CONTENT_RANGE, content_range);
            (StatusCode::PARTIAL_CONTENT, first, last - first + 1)
        }
        None => (StatusCode::OK, 0, size),
    };
    if first > 0 {
        file.seek(std::io::SeekFrom::Start(first))
            .await
            .map_err(|e| ApiError::Service(crate::gateway::Error::FileSystem(e.to_string())))?;
    }
    // Read in large chunks: each read of a `tokio::fs::File` is a hop to a blocking thread.
    let chunks = tokio_util::io::ReaderStream::with_capacity(file.take(len), READ_CHUNK);
    let body = Body::from_stream(chunks);
    Ok(res
        .status(status)
        .header(header::CONTENT_LENGTH, len)
        .body(body)
        .expect("a valid response"))
}

/// Whether an `If-None-Match` list names `etag` (weakly, as RFC 9110 §13.1.2 compares).
fn matches_etag(tags: &str, etag: &str) -> bool {
    let bare = |t: &str| t.trim().trim_start_matches("W/").to_owned();
    tags.trim() == "*" || tags.split(',').any(|t| bare(t) == bare(etag))
}
