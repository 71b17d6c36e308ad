//! What can go wrong while reading the agent registry or installing an agent from it: one
//! kind per cause a user can act on, each message a sentence naming what failed.

/// Why an agent could not be found, chosen or installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallError {
    /// The registry could not be fetched, read or parsed.
    #[error("the agent registry could not be loaded: {0}")]
    Registry(String),
    /// The registry has no agent with this id.
    #[error("the registry has no agent `{0}`; list the registry to see the ids it offers")]
    NotFound(String),
    /// The version asked for is not one this distribution can install.
    #[error("{0}")]
    Version(String),
    /// The agent offers nothing that runs on this machine.
    #[error("{0}")]
    NoDistribution(String),
    /// The archive could not be downloaded.
    #[error("the download failed: {0}")]
    Download(String),
    /// The archive is not what was installed before.
    #[error(
        "the archive's sha256 is {actual}, not the {expected} it had when it was first \
         installed: the archive changed since; remove the agent and install it again if the \
         change is expected"
    )]
    Hash {
        /// What the archive hashed to when it was first installed.
        expected: String,
        /// What it hashes to now.
        actual: String,
    },
    /// The archive could not be read (corrupt, truncated or an unsupported compression).
    #[error("the archive could not be read: {0}")]
    Archive(String),
    /// The archive holds an entry that would write outside its folder, or the agent's program
    /// is not a plain file inside it.
    #[error("refused: {0}")]
    Unsafe(String),
    /// A download or an archive is larger than the limits allow.
    #[error("too large: {0}")]
    TooLarge(String),
    /// Something the install needs (the agent's program, a package's command) is not there.
    #[error("missing: {0}")]
    Missing(String),
    /// A tool the install needs (npm, uv or python3) is not installed on this machine.
    #[error("{0}")]
    Tool(String),
    /// A tool the install runs failed.
    #[error("{0}")]
    Command(String),
    /// A file or folder could not be read or written.
    #[error("a file operation failed: {0}")]
    Io(String),
}

impl InstallError {
    /// An I/O failure, with what was being done (`"creating /x"`) in front of the cause.
    pub fn io(doing: impl std::fmt::Display, cause: std::io::Error) -> Self {
        Self::Io(format!("{doing}: {cause}"))
    }
}
