//! Downloading an agent's archive to a file, hashing it on the way: over HTTP(S) streamed and
//! bounded, each wait for the next bytes bounded by [`STALL`] and the whole by a deadline; or
//! copied from a `file://` URL or an absolute path (an install without a network), which only
//! a caller that trusts the source's author with the machine's files allows: an archive's URL
//! comes from the registry, and a remote registry must not make the gateway copy (and then
//! unpack and run) files of the machine it runs on. A download that fails leaves no partial
//! file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::install::error::InstallError;

/// How long a download may wait for the server's answer or for its next bytes: a stalled
/// connection fails instead of holding the install forever.
pub const STALL: Duration = Duration::from_secs(60);

/// How long a whole download may take by default: a server that trickles bytes, each within
/// [`STALL`] of the last, fails too.
pub const DOWNLOAD_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// How a download is bounded, and whether it may copy a local file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownloadOptions {
    /// The most bytes downloaded.
    pub max_bytes: u64,
    /// How long the whole download may take.
    pub deadline: Duration,
    /// Whether a `file://` URL or an absolute path is copied (else it is refused).
    pub allow_local: bool,
}

impl DownloadOptions {
    /// At most `max_bytes`, within [`DOWNLOAD_DEADLINE`], over HTTP(S) only.
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            deadline: DOWNLOAD_DEADLINE,
            allow_local: false,
        }
    }
}

/// Whether `source` names a file of this machine (a `file:` URL or a path) rather than an
/// HTTP(S) URL.
pub fn is_local(source: &str) -> bool {
    !(source.starts_with("http://") || source.starts_with("https://"))
}

/// A `file://` URL's path, or `source` itself taken as a path; None for a `file:` URL that names
/// no local path.
pub fn local_path(source: &str) -> Option<PathBuf> {
    if source.starts_with("file:") {
        url::Url::parse(source).ok()?.to_file_path().ok()
    } else {
        Some(PathBuf::from(source))
    }
}

/// Downloads the `http(s)://` URL `url` into the file `dest` (created or replaced), at most
/// `max_bytes` within [`DOWNLOAD_DEADLINE`], and answers its sha256 in lowercase hex; a local
/// source is refused ([`download_with`] may allow it). On any failure `dest` is removed.
pub async fn download(
    client: &reqwest::Client,
    url: &str,
    dest: &Path,
    max_bytes: u64,
) -> Result<String, InstallError> {
    download_with(client, url, dest, &DownloadOptions::new(max_bytes)).await
}

/// Downloads `url` into the file `dest` (created or replaced) as `options` bound it, and
/// answers its sha256 in lowercase hex. An `http(s)://` URL is fetched with `client`; a
/// `file://` URL or an absolute path is copied when `options` allow it, else refused as
/// [`InstallError::Unsafe`]. On any failure `dest` is removed.
pub async fn download_with(
    client: &reqwest::Client,
    url: &str,
    dest: &Path,
    options: &DownloadOptions,
) -> Result<String, InstallError> {
    let shown = crate::redact::url(url);
    if is_local(url) && !options.allow_local {
        return Err(InstallError::Unsafe(format!(
            "the archive `{shown}` is a file of this machine, which only an agent registry \
             read from this machine's files may name; a registry fetched over the network \
             must name http(s):// archives"
        )));
    }
    let max_bytes = options.max_bytes;
    let mut file = tokio::fs::File::create(dest)
        .await
        .map_err(|e| InstallError::io(format!("creating {}", dest.display()), e))?;
    let mut sink = Sink {
        file: &mut file,
        hash: Sha256::new(),
        written: 0,
        max_bytes,
        shown: &shown,
    };
    let copying = async {
        if !is_local(url) {
            from_http(client, url, &shown, &mut sink).await
        } else if url.starts_with("file:") || Path::new(url).is_absolute() {
            from_file(url, &shown, &mut sink).await
        } else {
            Err(InstallError::Download(format!(
                "`{shown}` is neither an http(s):// nor a file:// URL nor an absolute path"
            )))
        }
    };
    let copied = match tokio::time::timeout(options.deadline, copying).await {
        Ok(copied) => copied,
        Err(_) => Err(InstallError::Download(format!(
            "{shown} did not finish downloading within {:?}",
            options.deadline
        ))),
    };
    let hash = sink.hash;
    let done = match copied {
        Ok(()) => file
            .flush()
            .await
            .map_err(|e| InstallError::io(format!("writing {}", dest.display()), e)),
        Err(e) => Err(e),
    };
    drop(file);
    match done {
        Ok(()) => Ok(format!("{:x}", hash.finalize())),
        Err(e) => {
            let _ = tokio::fs::remove_file(dest).await;
            Err(e)
        }
    }
}

/// Where the downloaded bytes go: the file, the running hash, and the bound.
struct Sink<'a> {
    file: &'a mut tokio::fs::File,
    hash: Sha256,
    written: u64,
    max_bytes: u64,
    shown: &'a str,
}

impl Sink<'_> {
    /// Writes `bytes`, failing once the total would pass the bound.
    async fn write(&mut self, bytes: &[u8]) -> Result<(), InstallError> {
        self.written += bytes.len() as u64;
        if self.written > self.max_bytes {
            return Err(self.too_large());
        }
        self.hash.update(bytes);
        self.file
            .write_all(bytes)
            .await
            .map_err(|e| InstallError::io("writing the download", e))
    }

    fn too_large(&self) -> InstallError {
        InstallError::TooLarge(format!(
            "{} is larger than the {} bytes a download may be",
            self.shown, self.max_bytes
        ))
    }
}

/// Streams an HTTP(S) response's body into `sink`.
async fn from_http(
    client: &reqwest::Client,
    url: &str,
    shown: &str,
    sink: &mut Sink<'_>,
) -> Result<(), InstallError> {
    let failed = |e: reqwest::Error| {
        InstallError::Download(crate::redact::text(&format!("{shown}: {e}")).into_owned())
    };
    let stalled = || InstallError::Download(format!("{shown} sent nothing for {STALL:?}"));
    let response = tokio::time::timeout(STALL, client.get(url).send())
        .await
        .map_err(|_| stalled())?
        .map_err(failed)?;
    let status = response.status();
    if !status.is_success() {
        return Err(InstallError::Download(format!("{shown} answered {status}")));
    }
    if response
        .content_length()
        .is_some_and(|n| n > sink.max_bytes)
    {
        return Err(sink.too_large());
    }
    let mut body = response.bytes_stream();
    while let Some(chunk) = tokio::time::timeout(STALL, body.next())
        .await
        .map_err(|_| stalled())?
    {
        sink.write(&chunk.map_err(failed)?).await?;
    }
    Ok(())
}

/// Copies a local file into `sink`.
async fn from_file(url: &str, shown: &str, sink: &mut Sink<'_>) -> Result<(), InstallError> {
    let path = local_path(url)
        .ok_or_else(|| InstallError::Download(format!("`{shown}` names no local file")))?;
    let mut source = tokio::fs::File::open(&path)
        .await
        .map_err(|e| InstallError::Download(format!("{}: {e}", path.display())))?;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = source
            .read(&mut buf)
            .await
            .map_err(|e| InstallError::Download(format!("{}: {e}", path.display())))?;
        if n == 0 {
            return Ok(());
        }
        sink.write(&buf[..n]).await?;
    }
}
