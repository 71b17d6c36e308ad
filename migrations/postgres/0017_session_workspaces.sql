-- Sessions' workspaces of the gateway's own (keep in step with
-- ../sqlite/0017_session_workspaces.sql): the folder each such session works in (`scratch`: an
-- empty folder of its own; `worktree`: a git worktree on a branch of its own, with the
-- repository and the base commit it was made from). Removed with the workspace.
CREATE TABLE session_workspaces (
    session_id TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    kind       TEXT COLLATE "C" NOT NULL,
    path       TEXT NOT NULL,
    repository TEXT,
    base       TEXT COLLATE "C",
    branch     TEXT
);
