-- Sessions' workspaces of the gateway's own (keep in step with
-- ../postgres/0017_session_workspaces.sql): the folder each such session works in (`scratch`: an
-- empty folder of its own; `worktree`: a git worktree on a branch of its own, with the
-- repository and the base commit it was made from). Removed with the workspace.
CREATE TABLE session_workspaces (
    session_id TEXT NOT NULL PRIMARY KEY,
    kind       TEXT NOT NULL,
    path       TEXT NOT NULL,
    repository TEXT,
    base       TEXT,
    branch     TEXT
) STRICT;
