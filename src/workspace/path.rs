//! A client's path to a file of a workspace: relative to the workspace's folder, made of plain
//! names. Checked before it touches the file system, so that a path that could only mean
//! somewhere else is refused with a reason, whatever is on disk.

use std::fmt;
use std::path::{Component, Path};

/// A path inside a workspace: `/`-separated names, none `..`, none holding NUL; `.` and empty
/// names (`a//b`, a trailing `/`) are dropped. The empty path is the workspace's folder itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct WorkPath(String);

/// Why a path is no path inside a workspace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRefused {
    #[error("the path is absolute; a workspace's paths are relative to its folder")]
    Absolute,
    #[error("the path climbs out with `..`")]
    Climbs,
    #[error("the path holds a NUL character")]
    Nul,
}

impl WorkPath {
    /// `text` (already percent-decoded) as a path inside a workspace.
    pub fn parse(text: &str) -> Result<WorkPath, PathRefused> {
        if text.contains('\0') {
            return Err(PathRefused::Nul);
        }
        if text.starts_with('/') {
            return Err(PathRefused::Absolute);
        }
        let mut names = Vec::new();
        for name in text.split('/') {
            match name {
                "" | "." => {}
                ".." => return Err(PathRefused::Climbs),
                name => names.push(name),
            }
        }
        let path = names.join("/");
        // Whatever `Path` would read into it, only plain names remain (checked, not assumed).
        debug_assert!(
            Path::new(&path)
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
        );
        Ok(WorkPath(path))
    }

    /// The path as `/`-separated names (empty for the workspace's folder).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the workspace's folder itself.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The path of `name` inside this folder.
    pub fn join(&self, name: &str) -> WorkPath {
        if self.is_root() {
            WorkPath(name.to_owned())
        } else {
            WorkPath(format!("{}/{name}", self.0))
        }
    }

    /// The folder holding this path and the last name (`None` for the root).
    pub fn split_last(&self) -> Option<(WorkPath, &str)> {
        match self.0.rsplit_once('/') {
            Some((parent, name)) => Some((WorkPath(parent.to_owned()), name)),
            None if self.is_root() => None,
            None => Some((WorkPath::default(), &self.0)),
        }
    }

    /// As a relative `Path` (`.` for the root, which the file system calls take).
    pub fn as_path(&self) -> &Path {
        Path::new(if self.is_root() { "." } else { &self.0 })
    }
}

impl fmt::Display for WorkPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass_and_are_normalised() {
        for (text, want) in [
            ("", ""),
            (".", ""),
            ("a", "a"),
            ("a/b.txt", "a/b.txt"),
            ("./a//b/", "a/b"),
            ("a/./b", "a/b"),
            ("...", "..."),
            ("a..b/..c", "a..b/..c"),
            ("dir\\..\\x", "dir\\..\\x"), // a backslash is part of a Unix name
        ] {
            assert_eq!(WorkPath::parse(text).unwrap().as_str(), want, "{text:?}");
        }
    }

    #[test]
    fn paths_that_could_mean_elsewhere_are_refused() {
        for (text, why) in [
            ("/etc/passwd", PathRefused::Absolute),
            ("//etc", PathRefused::Absolute),
            ("..", PathRefused::Climbs),
            ("a/../../b", PathRefused::Climbs),
            ("a/..", PathRefused::Climbs),
            ("a\0b", PathRefused::Nul),
        ] {
            assert_eq!(WorkPath::parse(text), Err(why), "{text:?}");
        }
    }

    #[test]
    fn joined_and_split() {
        let p = WorkPath::parse("a/b").unwrap();
        assert_eq!(p.join("c").as_str(), "a/b/c");
        let (parent, name) = p.split_last().unwrap();
        assert_eq!((parent.as_str(), name), ("a", "b"));
        let top = WorkPath::parse("x").unwrap();
        assert_eq!(top.split_last().unwrap().0, WorkPath::default());
        assert!(WorkPath::default().split_last().is_none());
        assert_eq!(WorkPath::default().join("x"), top);
        assert_eq!(WorkPath::default().as_path(), Path::new("."));
    }
}
