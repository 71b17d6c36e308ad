//! Problem responses that several operations document alike, as types for their
//! `#[utoipa::path(responses(...))]` lists: an operation names the ones it shares next to its own
//! `(status = …)` tuples. Each stands for one `application/problem+json` response of the schema
//! `Problem`, documented exactly as a tuple with `body = Problem` would be.

use std::collections::BTreeMap;

use utoipa::IntoResponses;
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};

/// A response with a `Problem` body and this description.
pub fn problem(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/problem+json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
        .build()
}

/// Declares each `Name(status, description)` as a type whose `IntoResponses` is that one problem
/// response.
macro_rules! problems {
    ($($(#[$doc:meta])* $name:ident($status:literal, $description:literal);)+) => {$(
        $(#[$doc])*
        pub enum $name {}

        impl IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                BTreeMap::from([($status.to_string(), problem($description).into())])
            }
        }
    )+};
}

problems! {
    /// 404: the id names no session.
    UnknownSession(404, "Unknown session");
    /// 404: the id names no session, or a deleted one.
    UnknownOrDeletedSession(404, "Unknown or deleted session");
    /// 409: the session cannot change while a turn runs or while it is being resumed.
    SessionBusy(409, "A turn is running or the session is being resumed");
    /// 422: the parameters of a new session (created or forked) are invalid.
    InvalidSessionParams(422, "Invalid cwd or parameters");
    /// 502: the agent's call failed.
    AgentFailed(502, "The agent failed");
    /// 502: the agent refused a session control.
    AgentRefused(502, "The agent refused it (its error `data` in the detail)");
    /// 503: no pool member can take the session now, or the agent is not signed in.
    NoReadyMember(503, "No ready pool member, or the agent is not signed in (`agent-auth-required`, with its `authMethods`)");
    /// 409: a permission request or elicitation that was answered already.
    AlreadyResolved(409, "Already resolved");
    /// 400: a query parameter that is not valid.
    MalformedParams(400, "Malformed parameters");
    /// 404: the id names no webhook subscription the caller can see.
    UnknownWebhook(404, "Unknown webhook");
    /// 422: a subscription's URL or event kinds are not valid.
    InvalidWebhook(422, "Invalid URL or event kind");
    /// 400: a workspace path that could only mean somewhere else.
    PathOutside(400, "A path that leaves the workspace (`..`, absolute, NUL)");
    /// 403: a workspace path that leads out through a symlink.
    SymlinkOutside(403, "The path leads outside the workspace through a symlink");
    /// 404: no such session, or no such file in its workspace.
    UnknownFile(404, "Unknown session, or no such file");
    /// 409: the session has no workspace of the gateway's.
    NoWorkspace(409, "The session has no workspace of the gateway's");
    /// 409: the session is archived; it takes no prompt or setting until it is unarchived.
    ArchivedSession(409, "The session is archived (unarchive it first)");
    /// 501: what changed in a workspace needs git, which the gateway's host lacks; or the
    /// session's agent runs on another host, where its files are.
    NoGit(501, "The gateway has no git (or made the workspace without it), or the session's agent runs on a host that is no gateway");
    /// 501: the session's agent runs on a host that is no gateway, where its files are.
    FilesElsewhere(501, "The session's agent runs on a host that is no gateway, where its files are out of reach");
}
