//! Sessions' workspaces: stored, read back, replaced and removed, each session's its own.

use super::*;
use acp_gateway::store::WorkspaceRecord;

fn worktree(session: &str, path: &str) -> WorkspaceRecord {
    WorkspaceRecord {
        session_id: session.into(),
        kind: "worktree".into(),
        path: path.into(),
        repository: Some("/repos/app".into()),
        base: Some("0123456789abcdef0123456789abcdef01234567".into()),
        branch: Some(format!("acp/{session}")),
    }
}

pub async fn check_workspaces(store: Arc<dyn Store>) {
    assert_eq!(store.workspace_of("s1").await.unwrap(), None);
    let first = worktree("s1", "/work/s1 with spaces/é");
    store.put_workspace(&first).await.unwrap();
    let scratch = WorkspaceRecord {
        session_id: "s2".into(),
        kind: "scratch".into(),
        path: "/work/s2".into(),
        repository: None,
        base: None,
        branch: None,
    };
    store.put_workspace(&scratch).await.unwrap();
    assert_eq!(store.workspace_of("s1").await.unwrap(), Some(first));
    assert_eq!(
        store.workspace_of("s2").await.unwrap(),
        Some(scratch.clone())
    );

    // Put again: replaced, not doubled.
    let moved = worktree("s1", "/work/elsewhere");
    store.put_workspace(&moved).await.unwrap();
    assert_eq!(store.workspace_of("s1").await.unwrap(), Some(moved));

    store.remove_workspace("s1").await.unwrap();
    store.remove_workspace("s1").await.unwrap();
    assert_eq!(store.workspace_of("s1").await.unwrap(), None);
    assert_eq!(store.workspace_of("s2").await.unwrap(), Some(scratch));
}
