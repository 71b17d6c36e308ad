//! What clients hand the service, checked: session ids, prompts, and the paths a session works
//! in (absolute, normalised, inside the workspace roots).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::error::Error;

/// A session id from a client: printable ASCII without spaces, 1–256 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionId(String);

/// Read from a path or a body, an id is checked as [`SessionId::parse`] checks it.
impl<'de> serde::Deserialize<'de> for SessionId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        SessionId::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl SessionId {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let ok = (1..=256).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(SessionId(s.to_owned()))
        } else {
            Err(Error::Malformed(
                "invalid session id: expected 1-256 printable ASCII characters without spaces"
                    .into(),
            ))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// An id the agent gave, whatever its form.
    pub(super) fn known(id: String) -> Self {
        SessionId(id)
    }
}

/// A prompt's ACP content blocks: at least one, each with a string `type`.
#[derive(Debug, Clone)]
pub struct Prompt(Vec<Value>);

impl Prompt {
    /// From a request's `prompt` blocks or its `text` shorthand: exactly one of them.
    pub fn new(blocks: Option<Vec<Value>>, text: Option<String>) -> Result<Self, Error> {
        let blocks = match (blocks, text) {
            (Some(p), None) if !p.is_empty() => p,
            (None, Some(t)) => vec![json!({"type": "text", "text": t})],
            _ => {
                return Err(Error::Invalid(
                    "give exactly one of `prompt` (non-empty ContentBlock[]) or `text`".into(),
                ));
            }
        };
        if blocks
            .iter()
            .any(|b| b.get("type").and_then(Value::as_str).is_none())
        {
            return Err(Error::Invalid(
                "every prompt block needs a string `type`".into(),
            ));
        }
        Ok(Prompt(blocks))
    }

    pub fn into_blocks(self) -> Vec<Value> {
        self.0
    }
}

/// Checks that `path` is absolute and normalised (no `.`/`..` segments, no empty segments, no
/// trailing slash, no NUL), as ACP requires for `cwd`.
pub fn validate_abs_path(field: &str, path: &str) -> Result<(), Error> {
    let bad = |why: &str| Err(Error::Invalid(format!("{field} {why}: {path:?}")));
    if !path.starts_with('/') {
        return bad("must be an absolute path");
    }
    if path.contains('\0') {
        return bad("must not contain NUL");
    }
    if path != "/"
        && path[1..]
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return bad("must be normalised (no empty, '.' or '..' segments, no trailing slash)");
    }
    Ok(())
}

/// With workspace roots configured, `path` (already absolute and normalised), with symlinks
/// resolved as far as it exists, must lie inside one of them.
pub fn confine(field: &str, path: &str, roots: &[PathBuf]) -> Result<(), Error> {
    if roots.is_empty()
        || roots
            .iter()
            .any(|r| resolve(Path::new(path)).starts_with(r))
    {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "{field} is outside the workspace roots this gateway allows: {path:?}"
    )))
}

/// The path with its deepest existing ancestor canonicalised (symlinks resolved) and the rest,
/// which does not exist yet, appended.
fn resolve(path: &Path) -> PathBuf {
    let mut missing = Vec::new();
    let mut existing = path;
    loop {
        if let Ok(mut real) = existing.canonicalize() {
            real.extend(missing.iter().rev());
            return real;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_owned());
                existing = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_paths() {
        assert!(SessionId::parse("sess_abc-123").is_ok());
        assert!(SessionId::parse("").is_err());
        assert!(SessionId::parse("has space").is_err());
        assert!(SessionId::parse(&"x".repeat(257)).is_err());
        assert!(SessionId::parse("é").is_err());
        assert!(validate_abs_path("cwd", "/home/u/p").is_ok());
        assert!(validate_abs_path("cwd", "/").is_ok());
        for bad in ["rel/p", "/a/../b", "/a/./b", "/a//b", "/a/", "/a\0b", ""] {
            assert!(validate_abs_path("cwd", bad).is_err(), "{bad:?}");
        }
    }
}
