//! An ACP agent registry on loopback, as the official one is shaped (`registry.json`, with a
//! `binary` archive per platform): a folder served over HTTP by a server of the test's own,
//! whose files the test writes, replaces and removes; and the archives it serves, built with
//! the `tar` and `flate2` crates (the echo agent packed with a launcher, and archives that try
//! to write outside their folder). A file's download can be made to stall part way.

use std::collections::HashSet;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::echo_agent;

/// A folder served at `http://127.0.0.1:PORT/`, until dropped.
pub struct Registry {
    pub dir: PathBuf,
    pub base: String,
    /// Files whose download stalls after its first bytes (see [`Registry::stall`]).
    stalled: Arc<Mutex<HashSet<String>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Registry {
    /// Serves `dir` (created): `GET /NAME` is the file `dir/NAME`, 404 when there is none.
    pub async fn serve(dir: &Path) -> Registry {
        std::fs::create_dir_all(dir).unwrap();
        let root = dir.to_owned();
        let stalled: Arc<Mutex<HashSet<String>>> = Arc::default();
        let stalls = stalled.clone();
        let app = axum::Router::new().route(
            "/{file}",
            axum::routing::get(
                move |axum::extract::Path(file): axum::extract::Path<String>| {
                    let path = root.join(&file);
                    let stall = stalls.lock().unwrap().contains(&file);
                    async move {
                        let Ok(bytes) = std::fs::read(path) else {
                            return Err(axum::http::StatusCode::NOT_FOUND);
                        };
                        if !stall {
                            return Ok(axum::body::Body::from(bytes));
                        }
                        // Its first bytes, then nothing more, for as long as the client waits.
                        let first = bytes::Bytes::from(bytes[..bytes.len().min(64)].to_vec());
                        let head = futures::stream::once(async move { Ok::<_, Infallible>(first) });
                        let body = futures::StreamExt::chain(head, futures::stream::pending());
                        Ok(axum::body::Body::from_stream(body))
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Registry {
            dir: dir.to_owned(),
            base,
            stalled,
            server,
        }
    }

    /// Makes the download of `file` stall after its first bytes (`true`), or whole again.
    pub fn stall(&self, file: &str, stalls: bool) {
        let mut stalled = self.stalled.lock().unwrap();
        match stalls {
            true => stalled.insert(file.to_owned()),
            false => stalled.remove(file),
        };
    }

    /// The URL of `registry.json`.
    pub fn url(&self) -> String {
        format!("{}/registry.json", self.base)
    }

    /// Writes `registry.json` with `agents` (each `(id, archive file)`: a binary archive for
    /// this platform, run as `./bin/agent`), each at version 1.0.0.
    pub fn publish(&self, agents: &[(&str, &str)]) {
        self.publish_at("1.0.0", agents);
    }

    /// [`Registry::publish`], each agent at `version`.
    pub fn publish_at(&self, version: &str, agents: &[(&str, &str)]) {
        let platform = acp_gateway::install::registry::platform();
        let agents: Vec<Value> = (agents.iter())
            .map(|(id, file)| {
                json!({
                    "id": id, "name": format!("The {id}"), "version": version,
                    "description": "an agent for tests", "authors": ["acp-gateway tests"],
                    "license": "Apache-2.0", "repository": "https://example.com/echo",
                    "distribution": {"binary": {platform: {
                        "archive": format!("{}/{file}", self.base),
                        "cmd": "./bin/agent", "args": [], "env": {"ECHO_AGENT_PACKED": "yes"}
                    }}}
                })
            })
            .collect();
        let registry = json!({"version": "1.0.0", "agents": agents});
        std::fs::write(self.dir.join("registry.json"), registry.to_string()).unwrap();
    }

    /// Writes `file`: a `.tar.gz` whose `bin/agent` starts the echo agent (with `note` in a
    /// comment, so that two notes make two different archives).
    pub fn pack_echo(&self, file: &str, note: &str) {
        let launcher = format!(
            "#!/bin/sh\n# {note}\nexec {:?} \"$@\"\n",
            echo_agent().display().to_string()
        );
        self.pack(file, &[("bin/agent", launcher.as_bytes(), 0o755)], &[]);
    }

    /// Writes `file`, a `.tar.gz` of `files` (path, bytes, mode) and `links` (path, target:
    /// symbolic links), the paths written as given (`../x` included).
    pub fn pack(&self, file: &str, files: &[(&str, &[u8], u32)], links: &[(&str, &str)]) {
        let out = std::fs::File::create(self.dir.join(file)).unwrap();
        let gz = flate2::write::GzEncoder::new(out, flate2::Compression::fast());
        let mut tar = tar::Builder::new(gz);
        for (path, target) in links {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            header.set_mode(0o777);
            tar.append_link(&mut header, path, target).unwrap();
        }
        for (path, bytes, mode) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(*mode);
            header.set_entry_type(tar::EntryType::Regular);
            // Written by hand so that a `..` stays in the name, as a hostile archive has it.
            let name = header.as_old_mut();
            name.name[..path.len()].copy_from_slice(path.as_bytes());
            header.set_cksum();
            tar.append(&header, *bytes).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap();
    }

    /// The sha256 of `file`, in lowercase hex.
    pub fn sha256(&self, file: &str) -> String {
        use sha2::Digest;
        let bytes = std::fs::read(self.dir.join(file)).unwrap();
        sha2::Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}
