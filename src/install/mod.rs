//! Agents installed from the ACP agent registry: the registry's document and the choice of a
//! distribution for this machine (`registry`), downloading an archive (`fetch`), unpacking it
//! safely (`archive`, with `bounded` for what a tar stream may decompress to and `links` for
//! where its symlinks lead), installing an npm or Python package pinned into a folder
//! (`packages`, running its tools through `command`), the checks of an agent's program
//! (`program`), and the all-or-nothing install under one root folder (`installer`, in the
//! staging folders of `staging`). A leaf: it knows nothing of the gateway's agents or
//! sessions; callers decide what to install and run it.

pub mod archive;
pub mod bounded;
pub mod command;
pub mod error;
pub mod fetch;
pub mod installer;
pub mod links;
pub mod packages;
pub mod program;
pub mod registry;
pub mod staging;

pub use error::InstallError;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_installs;
#[cfg(test)]
mod tests_unsafe;
