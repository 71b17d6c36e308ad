//! Where the symlinks of an unpacked folder lead, followed on disk as the system would follow
//! them, and refused when any leads out. Each link was checked alone when it was made; made of
//! links, a path can still lead out together (`a/up -> ..`, then `x -> a/up/../..`), and a
//! dangling link can lead out once something is written through it. So every link is followed
//! link by link from the folder: a `..` that climbs above the folder, an absolute target or a
//! chain of more than [`MAX_HOPS`] links is refused, whether or not the link's last part
//! exists (what does not exist is resolved by its name, as a write through it would).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::install::error::InstallError;

/// The longest chain of links followed (Linux's own bound).
const MAX_HOPS: usize = 40;

/// Why a link is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// It leads above the folder or to an absolute path.
    Outside,
    /// It is a chain of too many links, or a loop.
    TooManyLinks,
}

/// Checks every symlink under `dest`: each must lead, followed link by link, to a path inside
/// it (see the module's documentation).
pub fn check_links(dest: &Path) -> Result<(), InstallError> {
    let mut folders = vec![PathBuf::new()];
    let listing = |e| InstallError::io("reading the unpacked folder", e);
    while let Some(folder) = folders.pop() {
        for item in fs::read_dir(dest.join(&folder)).map_err(listing)? {
            let item = item.map_err(listing)?;
            let kind = item.file_type().map_err(listing)?;
            let rel = folder.join(item.file_name());
            if kind.is_dir() {
                folders.push(rel);
            } else if kind.is_symlink() {
                match resolve_beneath(dest, &rel) {
                    Ok(_) => {}
                    Err(Escape::Outside) => {
                        return Err(InstallError::Unsafe(format!(
                            "the symlink `{}` leads outside the archive's folder",
                            rel.display()
                        )));
                    }
                    Err(Escape::TooManyLinks) => {
                        return Err(InstallError::Unsafe(format!(
                            "the symlink `{}` is a chain of more than {MAX_HOPS} links, or a \
                             loop",
                            rel.display()
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The path, relative to `root`, that the symlink `root/link` leads to, following on disk
/// every link on the way; its parts that do not exist are taken by name.
pub fn resolve_beneath(root: &Path, link: &Path) -> Result<PathBuf, Escape> {
    let mut at: Vec<OsString> = Vec::new();
    let mut pending: VecDeque<OsString> = VecDeque::new();
    for component in link.components() {
        match component {
            Component::Normal(part) => pending.push_back(part.to_owned()),
            Component::CurDir => {}
            _ => return Err(Escape::Outside),
        }
    }
    let mut hops = 0;
    while let Some(part) = pending.pop_front() {
        match Path::new(&part).components().next() {
            Some(Component::ParentDir) => {
                at.pop().ok_or(Escape::Outside)?;
                continue;
            }
            Some(Component::Normal(_)) => {}
            Some(Component::CurDir) | None => continue,
            Some(_) => return Err(Escape::Outside),
        }
        at.push(part);
        let path: PathBuf = std::iter::once(root.as_os_str())
            .chain(at.iter().map(|p| p.as_os_str()))
            .collect();
        let is_link = fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            continue;
        }
        hops += 1;
        if hops > MAX_HOPS {
            return Err(Escape::TooManyLinks);
        }
        let target = fs::read_link(&path).map_err(|_| Escape::Outside)?;
        at.pop();
        let mut parts = Vec::new();
        for component in target.components() {
            match component {
                Component::Normal(p) => parts.push(p.to_owned()),
                Component::ParentDir => parts.push(OsString::from("..")),
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => return Err(Escape::Outside),
            }
        }
        if parts.is_empty() && target.as_os_str().is_empty() {
            return Err(Escape::Outside);
        }
        for part in parts.into_iter().rev() {
            pending.push_front(part);
        }
    }
    Ok(at.iter().collect())
}
