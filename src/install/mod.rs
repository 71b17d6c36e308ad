//! Agents installed from the ACP agent registry: the registry's document and the choice of a
//! distribution for this machine (`registry`), downloading an archive (`fetch`), unpacking it
//! safely (`archive`), installing an npm or Python package pinned into a folder (`packages`),
//! and the all-or-nothing install under one root folder (`installer`). A leaf: it knows
//! nothing of the gateway's agents or sessions; callers decide what to install and run it.

pub mod archive;
pub mod error;
pub mod fetch;
pub mod installer;
pub mod packages;
pub mod registry;

pub use error::InstallError;

#[cfg(test)]
mod tests;
