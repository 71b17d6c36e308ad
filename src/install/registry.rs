//! The ACP agent registry (agentclientprotocol/registry, FORMAT.md): the JSON document that
//! lists agents and how each is distributed — a binary archive per platform, an npm package run
//! with `npx`, a Python package run with `uvx` — read from a URL or a file, and the choice of
//! one distribution (and version) for this machine.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::install::error::InstallError;
use crate::install::fetch::local_path;

/// The largest registry document read (the official one is well under 1 MiB).
const MAX_REGISTRY_BYTES: u64 = 32 << 20;

/// How long fetching the registry may take.
const REGISTRY_TIMEOUT: Duration = Duration::from_secs(30);

/// The registry document: its format version and its agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"version": "1.0.0", "agents": [{"id": "example-agent", "name": "Example Agent", "version": "1.2.3", "description": "An agent that edits code.", "repository": "https://github.com/example/agent", "authors": ["Example"], "license": "MIT", "distribution": {"npx": {"package": "@example/agent@1.2.3", "args": ["--acp"]}}}]}))]
pub struct RegistryIndex {
    /// The registry format's version.
    pub version: String,
    /// Every agent the registry lists.
    pub agents: Vec<RegistryEntry>,
}

/// One agent of the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"id": "example-agent", "name": "Example Agent", "version": "1.2.3", "description": "An agent that edits code.", "repository": "https://github.com/example/agent", "website": "https://example.com/agent", "authors": ["Example"], "license": "MIT", "icon": "https://example.com/agent.svg", "distribution": {"binary": {"linux-x86_64": {"archive": "https://github.com/example/agent/releases/download/v1.2.3/agent-linux-x86_64.tar.gz", "cmd": "./agent", "args": ["acp"]}}, "npx": {"package": "@example/agent@1.2.3", "args": ["--acp"]}}}))]
pub struct RegistryEntry {
    /// The agent's id in the registry (`claude-acp`, `gemini`…).
    pub id: String,
    /// The agent's display name.
    pub name: String,
    /// The version the registry offers.
    pub version: String,
    /// What the agent is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Where its source lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// Its home page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub website: Option<String>,
    /// Who makes it.
    #[serde(default)]
    pub authors: Vec<String>,
    /// Its license (an SPDX id, or `proprietary`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    /// The URL of its icon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icon: Option<String>,
    /// How it is distributed.
    pub distribution: Distribution,
}

/// The ways an agent is distributed; an agent offers at least one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"binary": {"darwin-aarch64": {"archive": "https://example.com/agent-darwin-aarch64.zip", "cmd": "./agent"}}, "uvx": {"package": "example-agent==1.2.3", "args": ["serve"]}}))]
pub struct Distribution {
    /// A prebuilt archive per platform (`linux-x86_64`, `darwin-aarch64`, `windows-x86_64`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<BTreeMap<String, BinaryTarget>>,
    /// An npm package, run as `npx`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npx: Option<PackageTarget>,
    /// A Python package, run as `uvx`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uvx: Option<PackageTarget>,
}

/// A prebuilt archive for one platform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"archive": "https://example.com/agent-linux-x86_64.tar.gz", "cmd": "./bin/agent", "args": ["acp"], "env": {"AGENT_MODE": "acp"}}))]
pub struct BinaryTarget {
    /// The archive's URL (`.zip`, `.tar.gz`, `.tgz`, `.tar.bz2`, `.tbz2`, or the program itself).
    pub archive: String,
    /// The program, relative to the unpacked archive (`./agent`, `bin/agent`).
    pub cmd: String,
    /// The arguments that start it as an ACP agent.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables it is started with.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A package run by `npx` or `uvx`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"package": "@example/agent@1.2.3", "cmd": "example-agent", "args": ["--acp"], "env": {}}))]
pub struct PackageTarget {
    /// The package and its version (`@scope/name@1.2.3`, `name==1.2.3`).
    pub package: String,
    /// The package's command to run, when it is not the package's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    /// The arguments that start it as an ACP agent.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables it is started with.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A kind of distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DistKind {
    /// A prebuilt archive for this platform.
    Binary,
    /// An npm package.
    Npx,
    /// A Python package.
    Uvx,
}

impl DistKind {
    /// The kind as the registry names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Binary => "binary",
            Self::Npx => "npx",
            Self::Uvx => "uvx",
        }
    }
}

impl std::fmt::Display for DistKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DistKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "binary" => Ok(Self::Binary),
            "npx" => Ok(Self::Npx),
            "uvx" => Ok(Self::Uvx),
            other => Err(format!(
                "`{other}` is not a distribution kind: use binary, npx or uvx"
            )),
        }
    }
}

/// One distribution of one version, chosen for this machine: everything an install needs, so
/// that it can be kept as JSON and installed again elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"kind": "npx", "version": "1.2.3", "source": "@example/agent@1.2.3", "cmd": null, "args": ["--acp"], "env": {}}))]
pub struct Choice {
    /// The kind of distribution.
    pub kind: DistKind,
    /// The version installed.
    pub version: String,
    /// The archive's URL (binary), or the package with its version (npx, uvx).
    pub source: String,
    /// The program: relative to the unpacked archive (binary), or the package's command when it
    /// is not the package's own (npx, uvx).
    pub cmd: Option<String>,
    /// The arguments that start it as an ACP agent.
    pub args: Vec<String>,
    /// Environment variables it is started with.
    pub env: BTreeMap<String, String>,
}

/// This machine's platform id as the registry spells it (`linux-x86_64`, `darwin-aarch64`…).
pub fn platform() -> &'static str {
    static PLATFORM: OnceLock<String> = OnceLock::new();
    PLATFORM.get_or_init(|| {
        let os = match std::env::consts::OS {
            "macos" => "darwin",
            os => os,
        };
        format!("{os}-{}", std::env::consts::ARCH)
    })
}

impl RegistryEntry {
    /// The kinds of distribution this agent offers on this machine (a binary only when there
    /// is one for [`platform`]), in the order [`choose`](Self::choose) prefers them.
    pub fn kinds(&self) -> Vec<DistKind> {
        let d = &self.distribution;
        let mut kinds = Vec::new();
        if d.binary
            .as_ref()
            .is_some_and(|b| b.contains_key(platform()))
        {
            kinds.push(DistKind::Binary);
        }
        if d.npx.is_some() {
            kinds.push(DistKind::Npx);
        }
        if d.uvx.is_some() {
            kinds.push(DistKind::Uvx);
        }
        kinds
    }

    /// The distribution to install on this machine: the binary for [`platform`] when there is
    /// one, else the npm package, else the Python package. `version` None is the registry's.
    pub fn choose(&self, version: Option<&str>) -> Result<Choice, InstallError> {
        self.choose_kind(None, version)
    }

    /// As [`choose`](Self::choose), of the given kind when `kind` is set.
    pub fn choose_kind(
        &self,
        kind: Option<DistKind>,
        version: Option<&str>,
    ) -> Result<Choice, InstallError> {
        let kinds = self.kinds();
        let kind = match kind {
            Some(kind) if kinds.contains(&kind) => kind,
            Some(kind) => {
                return Err(InstallError::NoDistribution(format!(
                    "the agent `{}` offers no {kind} distribution for {}; it offers: {}",
                    self.id,
                    platform(),
                    offered(&kinds)
                )));
            }
            None => *kinds.first().ok_or_else(|| {
                InstallError::NoDistribution(format!(
                    "the agent `{}` offers nothing that runs on {}: no binary for this \
                     platform, no npx or uvx package",
                    self.id,
                    platform()
                ))
            })?,
        };
        let d = &self.distribution;
        let wanted = version.unwrap_or(&self.version);
        match kind {
            DistKind::Binary => {
                let target = &d.binary.as_ref().expect("kinds() saw it")[platform()];
                if wanted != self.version {
                    return Err(InstallError::Version(format!(
                        "the agent `{}` offers its {} binary only in version {}, not {wanted}",
                        self.id,
                        platform(),
                        self.version
                    )));
                }
                Ok(Choice {
                    kind,
                    version: self.version.clone(),
                    source: target.archive.clone(),
                    cmd: Some(target.cmd.clone()),
                    args: target.args.clone(),
                    env: target.env.clone(),
                })
            }
            DistKind::Npx | DistKind::Uvx => {
                let target = if kind == DistKind::Npx {
                    &d.npx
                } else {
                    &d.uvx
                };
                let target = target.as_ref().expect("kinds() saw it");
                let (name, pinned) = if kind == DistKind::Npx {
                    split_npm(&target.package)
                } else {
                    split_pip(&target.package)
                };
                // The registry's own version installs the package as it is pinned there.
                let version = if version.is_none() || wanted == self.version {
                    pinned.unwrap_or(&self.version)
                } else {
                    wanted
                };
                check_version(version)?;
                let source = if kind == DistKind::Npx {
                    format!("{name}@{version}")
                } else {
                    format!("{name}=={version}")
                };
                Ok(Choice {
                    kind,
                    version: version.to_owned(),
                    source,
                    cmd: target.cmd.clone(),
                    args: target.args.clone(),
                    env: target.env.clone(),
                })
            }
        }
    }
}

/// The kinds, for a message.
fn offered(kinds: &[DistKind]) -> String {
    if kinds.is_empty() {
        return "nothing for this platform".to_owned();
    }
    let names: Vec<_> = kinds.iter().map(|k| k.as_str()).collect();
    names.join(", ")
}

/// A version that can be a folder's name and a package's pin: not empty, no path separators,
/// no spaces or shell-ish characters, not `.` or `..`.
fn check_version(version: &str) -> Result<(), InstallError> {
    let fine = !version.is_empty()
        && version != "."
        && version != ".."
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'));
    if fine {
        Ok(())
    } else {
        Err(InstallError::Version(format!(
            "`{version}` is not a version: use letters, digits and . - _ + only"
        )))
    }
}

/// An npm package spec's name and version: the version follows the last `@` that does not
/// start the name (`@scope/name@1.2.3` → `@scope/name`, `1.2.3`).
pub fn split_npm(spec: &str) -> (&str, Option<&str>) {
    match spec.rfind('@') {
        Some(at) if at > 0 => (&spec[..at], Some(&spec[at + 1..])),
        _ => (spec, None),
    }
}

/// A Python package spec's name and version (`name==1.0` or `name@1.0`).
pub fn split_pip(spec: &str) -> (&str, Option<&str>) {
    if let Some((name, version)) = spec.split_once("==") {
        return (name.trim(), Some(version.trim()));
    }
    split_npm(spec)
}

/// The registry at `source`: an `http(s)://` URL fetched with `client`, or a `file://` URL or a
/// path read from disk.
pub async fn load(source: &str, client: &reqwest::Client) -> Result<RegistryIndex, InstallError> {
    let shown = crate::redact::url(source);
    let bytes = if source.starts_with("http://") || source.starts_with("https://") {
        fetch(source, &shown, client).await?
    } else {
        let path = local_path(source)
            .ok_or_else(|| InstallError::Registry(format!("`{shown}` is not a file path")))?;
        read_file(&path, &shown).await?
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| InstallError::Registry(format!("{shown} is not a registry document: {e}")))
}

/// The document at an HTTP URL, at most [`MAX_REGISTRY_BYTES`].
async fn fetch(url: &str, shown: &str, client: &reqwest::Client) -> Result<Vec<u8>, InstallError> {
    let failed = |e: reqwest::Error| {
        InstallError::Registry(crate::redact::text(&e.to_string()).into_owned())
    };
    let response = client
        .get(url)
        .timeout(REGISTRY_TIMEOUT)
        .send()
        .await
        .map_err(failed)?;
    let status = response.status();
    if !status.is_success() {
        return Err(InstallError::Registry(format!("{shown} answered {status}")));
    }
    let too_large = || {
        InstallError::Registry(format!(
            "{shown} is larger than {} MiB",
            MAX_REGISTRY_BYTES >> 20
        ))
    };
    if response
        .content_length()
        .is_some_and(|n| n > MAX_REGISTRY_BYTES)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(failed)?;
        if (body.len() + chunk.len()) as u64 > MAX_REGISTRY_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The document in a file, at most [`MAX_REGISTRY_BYTES`].
async fn read_file(path: &std::path::Path, shown: &str) -> Result<Vec<u8>, InstallError> {
    let unreadable = |e: std::io::Error| InstallError::Registry(format!("{shown}: {e}"));
    let len = tokio::fs::metadata(path).await.map_err(unreadable)?.len();
    if len > MAX_REGISTRY_BYTES {
        return Err(InstallError::Registry(format!(
            "{shown} is larger than {} MiB",
            MAX_REGISTRY_BYTES >> 20
        )));
    }
    tokio::fs::read(path).await.map_err(unreadable)
}
