//! A session's workspace on the gateway's host: the folder its agent works in, and what the
//! HTTP API may do to the files in it. A leaf: it imports nothing of the crate.
//!
//! Every access is confined to the workspace's folder: a client's path is checked before it is
//! used ([`path::WorkPath`]: relative, no `..`, no NUL), and each access then resolves it
//! beneath the folder's own handle ([`files::WorkFiles`], on `cap-std`), so that a symlink
//! leading out, which the agent can make at any time, is refused when it is followed, not only
//! when it was first seen.
//!
//! What changed in a workspace is git's to say ([`git`]), through the host's `git` command.

pub mod changes;
pub mod files;
pub mod git;
pub mod path;
