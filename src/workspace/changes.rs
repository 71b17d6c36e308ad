//! What changed in a workspace, as git reports it: the files of a diff ([`FileChange`]) and the
//! checkpoints ([`Checkpoint`]), read from `git diff-tree --raw --numstat -z`, its `-p` patch
//! and `git log`.

use serde::Serialize;
use utoipa::ToSchema;

/// One file that differs.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"path": "src/main.rs", "status": "modified", "additions": 1, "deletions": 1, "binary": false, "patch": "diff --git a/src/main.rs b/src/main.rs\n--- a/src/main.rs\n+++ b/src/main.rs\n@@ -1 +1 @@\n-fn main() {}\n+fn main() { run() }\n"}))]
pub struct FileChange {
    /// The path in the workspace (after a rename, the new one).
    pub path: String,
    /// The path it had, for a rename or copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_path: Option<String>,
    /// `added`, `modified`, `deleted`, `renamed`, `copied` or `type_changed` (a file became a
    /// symlink or back).
    pub status: String,
    /// Lines added (0 for a binary file).
    pub additions: u64,
    /// Lines deleted (0 for a binary file).
    pub deletions: u64,
    /// Whether git sees the file as binary (its patch then says only that it differs).
    pub binary: bool,
    /// The file's unified patch, as `git diff` writes it.
    pub patch: String,
}

/// A checkpoint: the workspace's files as a turn left them (or as a revert made them).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"id": "1b2e8f4c5d6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c", "parent": "9fceb02d0ae598e95dc970b74767f19372d61af8", "createdAt": "2026-11-29T10:00:00+00:00", "reason": "revert to base"}))]
pub struct Checkpoint {
    /// Its id (a commit on a ref of the gateway's), as `revert` and `diff` take it.
    pub id: String,
    /// The checkpoint before it, or the workspace's base.
    pub parent: String,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// What made it: `turn` (the files a turn left) or `revert to <id>`.
    pub reason: String,
}

/// The changes listed by `git diff-tree -r -z --raw --numstat` (`listed`), each given its part
/// of the `-p` output (`patch`), which lists the same files in the same order.
pub(super) fn parse(listed: &str, patch: &str) -> Vec<FileChange> {
    let mut tokens = listed.split('\0').filter(|t| !t.is_empty()).peekable();
    let mut changes = Vec::new();
    while let Some(raw) = tokens.next_if(|t| t.starts_with(':')) {
        let letter = raw.rsplit(' ').next().and_then(|s| s.chars().next());
        let status = match letter {
            Some('A') => "added",
            Some('D') => "deleted",
            Some('R') => "renamed",
            Some('C') => "copied",
            Some('T') => "type_changed",
            _ => "modified",
        };
        let two = matches!(letter, Some('R' | 'C'));
        let first = tokens.next().unwrap_or_default().to_owned();
        let (old_path, path) = match two {
            true => (Some(first), tokens.next().unwrap_or_default().to_owned()),
            false => (None, first),
        };
        changes.push(FileChange {
            path,
            old_path,
            status: status.to_owned(),
            additions: 0,
            deletions: 0,
            binary: false,
            patch: String::new(),
        });
    }
    for change in &mut changes {
        let Some(counts) = tokens.next() else { break };
        let mut fields = counts.splitn(3, '\t');
        let (added, deleted) = (fields.next(), fields.next());
        if fields.next().is_some_and(str::is_empty) {
            // A rename or copy: its two paths follow.
            tokens.next();
            tokens.next();
        }
        change.binary = added == Some("-");
        change.additions = added.and_then(|n| n.parse().ok()).unwrap_or(0);
        change.deletions = deleted.and_then(|n| n.parse().ok()).unwrap_or(0);
    }
    for (change, part) in changes.iter_mut().zip(split_patch(patch)) {
        change.patch = part.to_owned();
    }
    changes
}

/// The patch of each file, in order: each starts at a `diff --git` line (which a file's own
/// lines cannot be: in a patch they start with ` `, `+` or `-`).
fn split_patch(patch: &str) -> Vec<&str> {
    let mut starts: Vec<usize> = patch
        .match_indices("diff --git ")
        .map(|(i, _)| i)
        .filter(|&i| i == 0 || patch.as_bytes()[i - 1] == b'\n')
        .collect();
    starts.push(patch.len());
    starts.windows(2).map(|w| &patch[w[0]..w[1]]).collect()
}

/// The checkpoints in `git log --format=%H%x1f%P%x1f%cI%x1f%s%x1e` output.
pub(super) fn parse_log(out: &str) -> Vec<Checkpoint> {
    out.split('\x1e')
        .filter_map(|record| {
            let mut f = record.trim_start_matches('\n').split('\x1f');
            let id = f.next().filter(|id| !id.is_empty())?.to_owned();
            let parent = f.next()?.split(' ').next()?.to_owned();
            let created_at = f.next()?.to_owned();
            let reason = f.next()?.trim_end().to_owned();
            Some(Checkpoint {
                id,
                parent,
                created_at,
                reason,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTED: &str = ":100644 100644 422c 6372 M\0a.txt\0:100644 100644 bdc9 8835 M\0bin\0\
        :100644 100644 587b 587b R100\0old.txt\0new.txt\0:000000 100644 0000 3e75 A\0untracked.txt\0\
        2\t1\ta.txt\0-\t-\tbin\0\x30\t0\t\0old.txt\0new.txt\0\x31\t0\tuntracked.txt\0";
    const PATCH: &str = "diff --git a/a.txt b/a.txt\nindex 422c..6372 100644\n--- a/a.txt\n+++ b/a.txt\n\
        @@ -1,2 +1,3 @@\n a\n-b\n+diff --git c\n+d\n\
        diff --git a/bin b/bin\nBinary files a/bin and b/bin differ\n\
        diff --git a/old.txt b/new.txt\nsimilarity index 100%\nrename from old.txt\nrename to new.txt\n\
        diff --git a/untracked.txt b/untracked.txt\nnew file mode 100644\n--- /dev/null\n+++ b/untracked.txt\n@@ -0,0 +1 @@\n+new\n";

    #[test]
    fn every_kind_of_change_is_read_with_its_counts_and_its_own_patch() {
        let changes = parse(LISTED, PATCH);
        let summary: Vec<_> = changes
            .iter()
            .map(|c| {
                (
                    c.path.as_str(),
                    c.old_path.as_deref(),
                    c.status.as_str(),
                    c.additions,
                    c.deletions,
                    c.binary,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("a.txt", None, "modified", 2, 1, false),
                ("bin", None, "modified", 0, 0, true),
                ("new.txt", Some("old.txt"), "renamed", 0, 0, false),
                ("untracked.txt", None, "added", 1, 0, false),
            ]
        );
        assert!(
            changes[0].patch.ends_with("+diff --git c\n+d\n"),
            "{}",
            changes[0].patch
        );
        assert!(changes[1].patch.starts_with("diff --git a/bin b/bin\n"));
        assert!(changes[3].patch.ends_with("+new\n"));
    }

    #[test]
    fn log_records_are_read_and_an_empty_log_is_no_checkpoint() {
        let out = "c2\x1fc1\x1f2026-11-29T05:00:00+00:00\x1fturn 2\x1e\nc1\x1fb0\x1f2026-11-29T04:00:00+00:00\x1fturn 1\x1e\n";
        let read = parse_log(out);
        assert_eq!(read.len(), 2);
        assert_eq!((read[0].id.as_str(), read[0].parent.as_str()), ("c2", "c1"));
        assert_eq!(read[1].reason, "turn 1");
        assert!(parse_log("").is_empty());
    }
}
