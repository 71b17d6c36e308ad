//! `echo_agent`: a small, deterministic ACP agent used as the gateway's test
//! upstream and as the agent of the README quick start.
//!
//! It speaks ACP v1 (`protocolVersion` 1) as newline-delimited JSON-RPC over
//! stdin/stdout, built on the official `agent-client-protocol` SDK. Logs go to
//! stderr only. The process exits 0 when stdin closes.
//!
//! The SDK's messages go over its `Lines` transport, not its `Stdio`: one
//! thread writes each outgoing line whole, and flushes it, while it holds the
//! lock of the process's stdout (the SDK's `Stdio` hands lines to a helper
//! thread through an in-memory pipe, which may pass one line on in several
//! writes). That is what lets `/garbage` write raw lines that can never land
//! inside a message.
//!
//! The transport also lets the agent hold a lone UTF-16 surrogate, as a
//! JavaScript agent can (`JSON.stringify` of a string cut inside a surrogate
//! pair writes `"\ud83d"`), which a Rust string cannot: U+D83D alone is
//! held as the noncharacter U+FDD0, written `\ud83d` in every line it sends,
//! and a lone `\ud83d` in a line it receives is read as U+FDD0.
//!
//! ```text
//! cargo run --example echo_agent
//! ```
//!
//! The code: this file (its configuration, its state's types and the dispatch), and in
//! `echo_agent/`: `state.rs` (session files, open sessions, turns in progress, the checks every
//! method makes), `protocol.rs` (initialize, authenticate, new, fork, the controls' dispatch),
//! `controls.rs` (modes, models, options), `sessions.rs` (load, resume, close, list, status,
//! title, archive, delete), `turns.rs` (prompts and their directives) and `wire.rs` (stdio
//! lines, errors, helpers).
//!
//! # What it does
//!
//! A prompt is answered with the words of its text, one `agent_message_chunk`
//! per word ("hello big world" streams "hello ", "big ", "world"); an empty
//! prompt gets one chunk "(empty)". After the turn, an untitled session gets
//! the title "Echo: " + the first 40 characters of the prompt, announced with
//! a `session_info_update` {title, updatedAt}. Every prompt's answer carries
//! `_meta.echoAgent.stdoutWriteMicros`: the time this process has spent
//! writing to stdout so far, which grows when its client is slow to read (the
//! event benchmark uses it to see whether the gateway holds the agent up).
//!
//! Sessions are JSON files `<dir>/sessions/<sessionId>.json` ({sessionId, cwd,
//! additionalDirectories, title, updatedAt}), written atomically, beside their
//! history `<sessionId>.history.jsonl`; both are shared by every process using
//! the same directory, so a pool of agents sees the same sessions. The history
//! holds the raw `update` objects of the turns, one per line: the user's prompt
//! as one `user_message_chunk` (stored, never sent) and every
//! `agent_message_chunk` (appended when the turn ends). It is only appended to,
//! so a turn's cost stays linear in its own length, not in the session's. A session is *open* (in memory) in the process
//! that created, loaded or resumed it and has not closed or deleted it.
//!
//! For benchmarks of the gateway's list sync, which a listing read from a
//! million files would measure less than the agent: with a file
//! `<dir>/synthetic-sessions` holding a number N (read at every call, so it
//! may change while the agent runs), `session/list` also lists N synthetic
//! sessions, made up as they are listed, after the real ones: ids
//! `synthetic_000000000`, `synthetic_000000001`…, cwd `/synthetic`, titles
//! `Synthetic <i>`, `updatedAt` i milliseconds before 2000-01-01, never
//! archived. They are only listed: every other method takes them for unknown.
//!
//! | Method | Behaviour |
//! |---|---|
//! | `initialize` | protocolVersion 1, agentInfo `echo-agent`, capabilities per `ECHO_AGENT_CAPS`, authMethods per `ECHO_AGENT_AUTH` (else none). |
//! | `authenticate` | With `ECHO_AGENT_AUTH`: the advertised methodId authenticates this connection ({}), another one is -32602; with `ECHO_AGENT_AUTH_KEY` too, only when `_meta` carries that key (else -32000 "Authentication failed"). Without it: {} for any methodId. |
//! | `session/new` | cwd must be absolute (else -32602). Returns `sess_` + 32 hex digits (with `ECHO_AGENT_IDS=per-process`: `m1`, `m2`… numbered in this process). Its `_meta` is kept and listed as the session's `_meta`. |
//! | `session/load` | Replays the history as `session/update`s, then answers {}. |
//! | `session/resume` | Like `session/load`, without the replay. |
//! | `session/close` | Cancels the running turn, forgets the session here; {} even if unknown. |
//! | `session/list` | Newest `updatedAt` first (ties: higher sessionId first), optional exact `cwd` filter, `archived` filter (`exclude` by default, `include`, `only`), pages with an opaque `nextCursor`; a bad cursor is -32602. Each `SessionInfo` carries `archived` when the `archive` capability is on. |
//! | `session/archive`, `session/unarchive` | Sets the session's archived flag (archiving also closes it); -32002 for an unknown session. |
//! | `session/delete` | Closes the session and deletes its file; {} even if unknown. |
//! | `session/status` | `open` (here), `saved` (on disk), else -32002. |
//! | `session/set_title` | Stores the trimmed title, sends `session_info_update` {title}, answers {title}. |
//! | `session/prompt` | Needs an open session (else -32002, so clients must load or resume first). |
//! | `session/cancel` | Cancels the session's running turn. |
//! | `session/fork` | With the `fork` capability: a new session with the parent's settings and history (its title `Fork of <title>`), in the given `cwd`; -32002 for an unknown parent. |
//! | `session/set_mode`, `session/set_model`, `session/set_config_option` | See `ECHO_AGENT_CONTROLS` (in `echo_agent/controls.rs`); -32601 for a control not offered. |
//!
//! Load, resume, status and set_title answer -32002 (data {sessionId}) for an
//! unknown session. Any other request gets -32601 and other notifications are
//! ignored.
//!
//! With `ECHO_AGENT_AUTH` set, `session/new`, `session/load`,
//! `session/resume`, `session/list` and `session/prompt` answer -32000
//! "Authentication required" until `authenticate` has succeeded on this
//! connection (a method whose capability is off still answers -32601 first).
//!
//! # Environment variables
//!
//! | Variable | Meaning |
//! |---|---|
//! | `ECHO_AGENT_DIR` | State directory (default: `$TMPDIR/acp-echo-agent`), created if missing. |
//! | `ECHO_AGENT_CAPS` | Comma-separated capabilities from `load,list,delete,resume,close,status,title,archive,fork,image,audio,embeddedContext` (default when unset `load,list,delete,resume,close`; set but empty: none). `load` advertises `loadSession`, `image`, `audio` and `embeddedContext` the `promptCapabilities` of that name, the others `sessionCapabilities.<name>`. A method whose capability is off answers -32601. |
//! | `ECHO_AGENT_IDS` | `per-process`: session ids are `m1`, `m2`… counted in each process, as an agent that numbers its sessions would hand out (two processes give the same ids), and the session files are this process's own (`<dir>/sessions-<pid>`). |
//! | `ECHO_AGENT_PAGE_SIZE` | `session/list` page size (default 10). |
//! | `ECHO_AGENT_CALL_LOG` | File to which one line `<method> <sessionId or ->` is appended for every request received (`authenticate -` included) and every `session/cancel`. |
//! | `ECHO_AGENT_INIT_DELAY_MS` | Sleep this long before answering `initialize`. |
//! | `ECHO_AGENT_RESUME_DELAY_MS` | Sleep this long before answering `session/resume`. |
//! | `ECHO_AGENT_NEW_DELAY_MS` | Sleep this long in `session/new`, before the session is made. |
//! | `ECHO_AGENT_COST` | `AMOUNT CURRENCY` (`0.01 USD`): what a prompt's word costs. Each prompt's result then carries `usage` (a token per word in, a token per word echoed out), and a turn that ends well first sends a `usage_update` with the session's cost in this process so far (cumulative, as ACP says; a new process counts afresh). |
//! | `ECHO_AGENT_CONTROLS` | Comma-separated from `modes,models,options` (default none): the session controls offered, their setters, `usage` in prompt results and the `/state` directive (see `echo_agent/controls.rs`). |
//! | `ECHO_AGENT_CRASH` | `start`: write "echo-agent: crashing at start" to stderr and exit with code 3 before answering `initialize`. `prompt`: like `/crash` on every prompt. |
//! | `ECHO_AGENT_CHUNKS` | Default for `/chunks N`. |
//! | `ECHO_AGENT_DELAY_MS` | Default for `/delay MS`. |
//! | `ECHO_AGENT_PERMISSION` | `1`: like `/permission` on every prompt. |
//! | `ECHO_AGENT_AUTH` | An auth method id: `initialize` advertises the agent-style method {id: this, name "Echo login", description "Accepts any client that asks"}, and sessions need `authenticate` with it first (see above). |
//! | `ECHO_AGENT_TERMINAL_AUTH` | A terminal login's method id: `initialize` advertises {type "terminal", id: this, args ["--login"]} to a client whose `clientCapabilities.auth.terminal` is true, and `session/new` is -32000 "Authentication required" until the login has written `$ECHO_AGENT_DIR/credentials`. Run with `--login`, the agent is that login instead (`echo_agent/login.rs`). |
//! | `ECHO_AGENT_AUTH_KEY` | With `ECHO_AGENT_AUTH`: a key that `authenticate` must carry in its `_meta`, as Gemini's agent takes it (`{"api-key": "KEY"}`) or Codex's (`{"api-key": {"apiKey": "KEY"}}`); another key, or none, is -32000 "Authentication failed" (its message says whether a key was found, and the shapes accepted when none was; never the key). |
//! | `ECHO_AGENT_LONG_LINE_BYTES` | Length in bytes, newline excluded, of the long line of `/garbage` (default 100000; below the size of the empty envelope the pad is just empty). |
//! | `ECHO_AGENT_SPAWN_CHILD` | `1`: at start, spawn a child `sleep 3600` (same process group, stdin/stdout/stderr null, never waited for) and write "echo-agent: spawned child <pid>" to stderr. |
//! | `ECHO_AGENT_CHILD_PID_FILE` | With `ECHO_AGENT_SPAWN_CHILD`: file to which the child's pid and a newline are appended. |
//! | `ECHO_AGENT_IGNORE_TERM` | `1`: ignore SIGTERM (each one is logged as "echo-agent: ignoring SIGTERM" on stderr), so only SIGKILL stops the agent. |
//!
//! # Prompt directives
//!
//! Directives are recognised at the start of the prompt text (the text blocks
//! concatenated), in any order and combination (`/chunks 5 /delay 100 hello`);
//! the words after them are echoed. A directive overrides the matching
//! environment default. The title is still made from the whole text.
//!
//! | Directive | Effect |
//! |---|---|
//! | `/chunks N` | Reply with N chunks "c1 ", "c2 ", …, "cN" instead of the words. |
//! | `/bytes N` | Reply with one chunk of N `x`s instead of the words (a message larger than a transport's frame). |
//! | `/delay MS` | Sleep MS milliseconds before each chunk. |
//! | `/permission` | First send `session/request_permission` (tool call `call_1`, options `allow`/`reject`) and wait. Selected: stream `"permission: <optionId>"` then the reply. Cancelled: stop with `cancelled`. |
//! | `/permissions N` | After `/permission`, send N `session/request_permission`s at once (tool calls `call_1`…`call_N`, options `allow`/`reject`), without waiting for any; as each is answered, stream one chunk `"permission call_I: <optionId>"` (or `cancelled`) or `"permission call_I: error <code>"`; once all are answered, continue normally. A cancel stops with `cancelled`. |
//! | `/elicit` | Send `elicitation/create` (form mode, message "Tell echo about yourself", `requestedSchema`: `name` string minLength 2 and `age` integer 0–150, both required; `code` string pattern `^[A-Z]{3}$`; `subscribe` boolean; `color` enum red/green/blue) and wait; stream one chunk `"elicitation: accept <content as JSON>"`, `"elicitation: decline"`, `"elicitation: cancel"` or `"elicitation: error <code>"`, and end the turn (`cancelled` after a cancel, else `end_turn`). Without `clientCapabilities.elicitation.form` in `initialize`, stream `"elicitation: unsupported"` instead. |
//! | `/elicit-url` | Like `/elicit` in URL mode (message "Sign in to echo", `elicitationId` `echo-login`, url `https://example.org/echo-login`; needs `elicitation.url`); when accepted, first send the `elicitation/complete` notification {elicitationId}, then stream `"elicitation: accept"`. |
//! | `/crash` | Send one chunk "crashing", write "echo-agent: crashing mid-turn" to stderr and exit with code 3. |
//! | `/hang` | Never answer unless the turn is cancelled. |
//! | `/unknown` | First send a `session/update` of the unknown kind `future_variant_x` and one tagged `turn_ended` (a gateway event's name, `stopReason` `refusal`), then continue normally. |
//! | `/fs` | First call the client's `fs/read_text_file` (which a client without the fs capability must refuse) and stream one chunk `"fs: ok"` or `"fs: error <code>"`. |
//! | `/deaf` | Never answer, whatever happens: `session/cancel` (still written to the call log), `$/cancel_request` and closing or deleting the session are ignored; only the end of the process ends the turn. |
//! | `/garbage` | Before anything else of the turn, write four raw lines straight to stdout: `this is not json`, `{"foo":1}`, `{"jsonrpc":"2.0","id":987654321,"result":{}}` and an `echo/padding` notification `{"jsonrpc":"2.0","method":"echo/padding","params":{"pad":"xxx…"}}` padded to exactly `ECHO_AGENT_LONG_LINE_BYTES` bytes; then continue normally. |
//! | `/overflow` | After `/garbage`, write one raw line straight to stdout: a `session/update` `plan` {entries: [], `_meta`: {"echo": 1e999}}, whose number JSON's grammar allows and no f64 holds; then continue normally. |
//! | `/surrogate` | Stream one chunk `ab` + a lone U+D83D (`"ab\ud83d"` on the wire), then title the session `cut ` + a lone U+D83D with a `session_info_update` {title} (kept and listed like any title, so the turn's end gives it no other); then continue normally. |
//! | `/provider` | Stream one chunk `"provider ID BASEURL NAME=VALUE…"` with what the last `providers/set` set (its headers in name order), or `"provider none"`; then continue normally. |
//! | `/env NAME` | Stream one chunk `"NAME=<value>"` with the agent process's environment variable NAME, or `"NAME unset"`; then continue normally. May be repeated. |
//! | `/pwd` | Stream one chunk with the agent process's current working directory; then continue normally. |
//! | `/write NAME` | Write the file NAME (relative) of the session's `cwd`, its folders made, with the text `echo wrote NAME`, and stream one chunk `"wrote NAME"` (or `"write NAME: error <e>"`); then continue normally. May be repeated. |
//! | `/read NAME` | Stream one chunk `"read NAME: <its text>"` with the file NAME of the session's `cwd` (or `"read NAME: error <e>"`); then continue normally. May be repeated. |
//! | `/link NAME TARGET` | Make NAME in the session's `cwd` a symlink to TARGET (as given: relative or absolute) and stream one chunk `"linked NAME"` (or `"link NAME: error <e>"`); then continue normally. May be repeated. |
//! | `/tool NAME` | Send a `tool_call` `tool_I` (title "Edit NAME", kind `edit`, `in_progress`) whose content is a diff of NAME in the session's `cwd` (no old text, new text `echo wrote NAME`), then its `tool_call_update` `completed` with the text output `wrote NAME` (no file is written); then continue normally. May be repeated. |
//! | `/meta` | Stream one chunk `meta: <the session/prompt request's _meta as JSON>` (`null` without one); then continue normally. |
//! | `/state` | First send an `available_commands_update`, a `plan`, a `usage_update` and, with the `options` control, a `config_option_update` turning `verbose` on (see `echo_agent/controls.rs`), and the extension notification `_echo/status` {sessionId, stated: true}; then continue normally. |
//!
//! A turn does its parts in this order: `/garbage`, `/overflow`, `/state`, `/surrogate`, `/unknown`, each `/tool`, `/fs`,
//! `/meta`, each `/env` in prompt order, `/pwd`, each `/link`, `/write` and `/read` in turn, `/permission`, `/permissions`, `/elicit` or `/elicit-url` (which end
//! the turn), `/crash`, `/deaf`, `/hang`, then the reply.
//!
//! `session/cancel` (or `$/cancel_request` for the prompt, or closing or
//! deleting the session) stops the turn at the next chunk boundary, and
//! interrupts a delay, a hang or a pending permission request or elicitation; the prompt then
//! answers `stopReason: "cancelled"` (except under `/deaf`). A second prompt
//! while a turn runs gets -32602 "turn already running".

#[path = "echo_agent/controls.rs"]
mod controls;
#[path = "echo_agent/login.rs"]
mod login;
#[path = "echo_agent/protocol.rs"]
mod protocol;
#[path = "echo_agent/sessions.rs"]
mod sessions;
#[path = "echo_agent/state.rs"]
mod state;
#[path = "echo_agent/turns.rs"]
mod turns;
#[path = "echo_agent/wire.rs"]
mod wire;

use std::collections::{BTreeSet, HashMap};
use std::io::{self, BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    self, AgentAuthCapabilities, AgentCapabilities, ArchiveSessionRequest, ArchiveSessionResponse,
    AuthMethod, AuthMethodAgent, AuthMethodTerminal, AuthenticateRequest, AuthenticateResponse,
    CancelNotification, CloseSessionRequest, CloseSessionResponse, ContentBlock, ContentChunk,
    DeleteSessionRequest, DeleteSessionResponse, Implementation, InitializeRequest,
    InitializeResponse, ListSessionsRequest, ListSessionsResponse, LoadSessionRequest,
    LoadSessionResponse, LogoutCapabilities, LogoutRequest, LogoutResponse, NewSessionRequest,
    NewSessionResponse, PermissionOption, PermissionOptionKind, PromptCapabilities, PromptRequest,
    PromptResponse, ProvidersCapabilities, RequestPermissionOutcome, RequestPermissionRequest,
    ResumeSessionRequest, ResumeSessionResponse, SessionArchiveCapabilities, SessionArchiveFilter,
    SessionCapabilities, SessionCloseCapabilities, SessionDeleteCapabilities,
    SessionForkCapabilities, SessionId, SessionInfo, SessionInfoUpdate, SessionListCapabilities,
    SessionNotification, SessionResumeCapabilities, SessionStatus, SessionStatusCapabilities,
    SessionStatusRequest, SessionStatusResponse, SessionTitleCapabilities, SessionUpdate,
    SetSessionTitleRequest, SetSessionTitleResponse, StopReason, ToolCallStatus, ToolCallUpdate,
    ToolCallUpdateFields, ToolKind, UnarchiveSessionRequest, UnarchiveSessionResponse, Usage,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{
    Agent, Client, Error, ErrorCode, Handled, Lines, RequestCancellation, UntypedMessage,
    on_receive_notification, on_receive_request,
};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot, watch};

use wire::*;

/// The `elicitationId` of `/elicit-url`.
const ECHO_ELICITATION_ID: &str = "echo-login";

/// The connection to the client, as handlers and spawned tasks see it.
type Cx = ConnectionTo<Client>;

/// Capability names accepted in `ECHO_AGENT_CAPS`.
const ALL_CAPS: [&str; 14] = [
    "load",
    "list",
    "delete",
    "resume",
    "close",
    "status",
    "title",
    "archive",
    "fork",
    "image",
    "audio",
    "embeddedContext",
    "providers",
    "logout",
];
/// Capabilities enabled when `ECHO_AGENT_CAPS` is unset.
const DEFAULT_CAPS: &str = "load,list,delete,resume,close";

/// Behaviour switches of one prompt turn, from directives or the environment.
#[derive(Clone, Debug, Default)]
struct Directives {
    /// `/chunks N`: reply with N numbered chunks instead of the words.
    chunks: Option<usize>,
    /// `/bytes N`: reply with one chunk of N `x`s instead of the words.
    bytes: Option<usize>,
    /// `/delay MS`: sleep before each chunk.
    delay_ms: u64,
    /// `/permission`: ask the client for permission first.
    permission: bool,
    /// `/permission-for MS`: ask for permission, and withdraw the request (`$/cancel_request`)
    /// when it is not answered within MS milliseconds.
    permission_for: Option<u64>,
    /// `/permissions N`: ask N permissions at once and report each answer.
    permissions: Option<usize>,
    /// `/elicit`: ask the client for a form, report the answer and end the turn.
    elicit: bool,
    /// `/elicit-url`: the same with a URL to visit.
    elicit_url: bool,
    /// `/crash`: send one chunk, then exit with code 3.
    crash: bool,
    /// `/hang`: wait until cancelled.
    hang: bool,
    /// `/unknown`: send a `session/update` of a kind no schema knows.
    unknown: bool,
    /// `/fs`: call the client's `fs/read_text_file` and report the outcome.
    fs: bool,
    /// `/deaf`: never answer, ignoring every kind of cancellation.
    deaf: bool,
    /// `/garbage`: write non-protocol lines straight to stdout first.
    garbage: bool,
    /// `/overflow`: send a `plan` update holding a number past f64's range.
    overflow: bool,
    /// `/surrogate`: send a lone surrogate in a chunk and in the title.
    surrogate: bool,
    /// `/suggest TEXT`: suggest these prompts (`prompt_suggestions_update`), in order; `/suggest -`
    /// withdraws the suggestions (an empty list).
    suggest: Vec<String>,
    /// `/env NAME`: report these environment variables, in order.
    env: Vec<String>,
    /// `/provider`: report the LLM provider `providers/set` set.
    provider: bool,
    /// `/spoof SESSION`: send an update, ask a permission and elicit naming this session
    /// (another's).
    spoof: Vec<String>,
    /// `/pwd`: report the current working directory.
    pwd: bool,
    /// `/write NAME`: write a file in the session's cwd.
    write: Vec<String>,
    /// `/tool NAME`: report an edit of a file as a tool call with its diff.
    tool: Vec<String>,
    /// `/read NAME`: report a file of the session's cwd.
    read: Vec<String>,
    /// `/link NAME TARGET`: make a symlink in the session's cwd.
    link: Vec<(String, String)>,
    /// `/meta`: report the prompt request's `_meta`.
    meta: bool,
    /// `/state`: send the state updates of `controls::state_updates` first.
    state: bool,
}

impl Directives {
    /// Splits the leading directives off `text`, starting from `self` (the
    /// environment defaults); returns them and the remaining text.
    fn parse<'a>(&self, text: &'a str) -> (Directives, &'a str) {
        let mut d = self.clone();
        let mut rest = text.trim_start();
        loop {
            let (word, after) = split_word(rest);
            let (arg, after_arg) = split_word(after);
            let number = arg.parse::<u64>().ok();
            match (word, number) {
                ("/permission", _) => d.permission = true,
                ("/elicit", _) => d.elicit = true,
                ("/elicit-url", _) => d.elicit_url = true,
                ("/crash", _) => d.crash = true,
                ("/hang", _) => d.hang = true,
                ("/unknown", _) => d.unknown = true,
                ("/fs", _) => d.fs = true,
                ("/deaf", _) => d.deaf = true,
                ("/garbage", _) => d.garbage = true,
                ("/overflow", _) => d.overflow = true,
                ("/surrogate", _) => d.surrogate = true,
                ("/pwd", _) => d.pwd = true,
                ("/meta", _) => d.meta = true,
                ("/state", _) => d.state = true,
                ("/provider", _) => d.provider = true,
                ("/env", _) if !arg.is_empty() => d.env.push(arg.to_string()),
                ("/suggest", _) if !arg.is_empty() => d.suggest.push(arg.to_string()),
                ("/spoof", _) if !arg.is_empty() => d.spoof.push(arg.to_string()),
                ("/write", _) if !arg.is_empty() => d.write.push(arg.to_string()),
                ("/tool", _) if !arg.is_empty() => d.tool.push(arg.to_string()),
                ("/read", _) if !arg.is_empty() => d.read.push(arg.to_string()),
                ("/link", _) if !arg.is_empty() && !split_word(after_arg).0.is_empty() => {
                    let (target, after_target) = split_word(after_arg);
                    d.link.push((arg.to_string(), target.to_string()));
                    rest = after_target;
                    continue;
                }
                ("/chunks", Some(n)) => d.chunks = usize::try_from(n).ok(),
                ("/bytes", Some(n)) => d.bytes = usize::try_from(n).ok(),
                ("/permissions", Some(n)) => d.permissions = usize::try_from(n).ok(),
                ("/permission-for", Some(ms)) => d.permission_for = Some(ms),
                ("/delay", Some(ms)) => d.delay_ms = ms,
                _ => return (d, rest),
            }
            rest = if matches!(
                word,
                "/env" | "/suggest" | "/spoof" | "/write" | "/tool" | "/read"
            ) || (number.is_some()
                && matches!(
                    word,
                    "/chunks" | "/bytes" | "/delay" | "/permissions" | "/permission-for"
                )) {
                after_arg
            } else {
                after
            };
        }
    }
}

/// Returns the first whitespace-separated word of `s` and the rest (trimmed).
fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    let end = s.find(char::is_whitespace).unwrap_or(s.len());
    (&s[..end], s[end..].trim_start())
}

/// Settings read once from the environment.
#[derive(Debug)]
struct Config {
    /// `<ECHO_AGENT_DIR>/sessions` (`sessions-<pid>` with per-process ids).
    sessions_dir: PathBuf,
    /// `ECHO_AGENT_IDS=per-process`: ids `m1`, `m2`… of this process.
    per_process_ids: bool,
    /// Enabled capability names.
    caps: BTreeSet<String>,
    /// `session/list` page size.
    page_size: usize,
    /// `ECHO_AGENT_CALL_LOG`.
    call_log: Option<PathBuf>,
    /// `ECHO_AGENT_INIT_DELAY_MS`.
    init_delay_ms: u64,
    /// `ECHO_AGENT_RESUME_DELAY_MS`.
    resume_delay_ms: u64,
    /// `ECHO_AGENT_NEW_DELAY_MS`.
    new_delay_ms: u64,
    /// `ECHO_AGENT_CONTROLS`.
    controls: controls::Controls,
    /// `ECHO_AGENT_CRASH=start`.
    crash_at_start: bool,
    /// `ECHO_AGENT_AUTH`: the one auth method, which sessions then require.
    auth_method: Option<String>,
    /// `ECHO_AGENT_AUTH_KEY`: the key `authenticate` must carry in its `_meta`.
    auth_key: Option<String>,
    /// `ECHO_AGENT_TERMINAL_AUTH`: a terminal login's method id; sessions then need the
    /// credentials file it writes (`login.rs`).
    terminal_auth: Option<String>,
    credentials: PathBuf,
    /// `ECHO_AGENT_LONG_LINE_BYTES`: length of the long line of `/garbage`.
    long_line_bytes: usize,
    /// `ECHO_AGENT_SPAWN_CHILD=1`.
    spawn_child: bool,
    /// `ECHO_AGENT_CHILD_PID_FILE`.
    child_pid_file: Option<PathBuf>,
    /// `ECHO_AGENT_IGNORE_TERM=1`.
    ignore_term: bool,
    /// `ECHO_AGENT_COST`: the cost of a word, and its currency.
    cost: Option<(f64, String)>,
    /// Directive defaults from the environment.
    defaults: Directives,
}

/// Reads an environment variable, `None` when unset or empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Whether an environment variable is `1`.
fn env_flag(name: &str) -> bool {
    env(name).is_some_and(|v| v.trim() == "1")
}

/// Reads a numeric environment variable, warning about unparsable values.
fn env_num<T: std::str::FromStr>(name: &str) -> Option<T> {
    let value = env(name)?;
    let parsed = value.trim().parse().ok();
    if parsed.is_none() {
        eprintln!("echo-agent: ignoring {name}={value:?}: not a number");
    }
    parsed
}

impl Config {
    fn from_env() -> Self {
        let dir = env("ECHO_AGENT_DIR").map_or_else(
            || std::env::temp_dir().join("acp-echo-agent"),
            PathBuf::from,
        );
        let mut caps = BTreeSet::new();
        // Set but empty means "nothing optional", unlike the other variables.
        for cap in std::env::var("ECHO_AGENT_CAPS")
            .as_deref()
            .unwrap_or(DEFAULT_CAPS)
            .split(',')
        {
            let cap = cap.trim();
            if ALL_CAPS.contains(&cap) {
                caps.insert(cap.to_string());
            } else if !cap.is_empty() {
                eprintln!("echo-agent: ignoring unknown capability {cap:?} in ECHO_AGENT_CAPS");
            }
        }
        let crash = env("ECHO_AGENT_CRASH").unwrap_or_default();
        let per_process_ids = env("ECHO_AGENT_IDS").is_some_and(|v| v.trim() == "per-process");
        Config {
            sessions_dir: if per_process_ids {
                dir.join(format!("sessions-{}", std::process::id()))
            } else {
                dir.join("sessions")
            },
            per_process_ids,
            caps,
            page_size: env_num("ECHO_AGENT_PAGE_SIZE").unwrap_or(10).max(1),
            call_log: env("ECHO_AGENT_CALL_LOG").map(PathBuf::from),
            init_delay_ms: env_num("ECHO_AGENT_INIT_DELAY_MS").unwrap_or(0),
            resume_delay_ms: env_num("ECHO_AGENT_RESUME_DELAY_MS").unwrap_or(0),
            new_delay_ms: env_num("ECHO_AGENT_NEW_DELAY_MS").unwrap_or(0),
            controls: controls::Controls::from_env(env("ECHO_AGENT_CONTROLS").as_deref()),
            crash_at_start: crash.trim() == "start",
            auth_method: env("ECHO_AGENT_AUTH").map(|v| v.trim().to_string()),
            auth_key: env("ECHO_AGENT_AUTH_KEY"),
            terminal_auth: env("ECHO_AGENT_TERMINAL_AUTH").map(|v| v.trim().to_string()),
            credentials: dir.join("credentials"),
            long_line_bytes: env_num("ECHO_AGENT_LONG_LINE_BYTES").unwrap_or(100_000),
            spawn_child: env_flag("ECHO_AGENT_SPAWN_CHILD"),
            child_pid_file: env("ECHO_AGENT_CHILD_PID_FILE").map(PathBuf::from),
            ignore_term: env_flag("ECHO_AGENT_IGNORE_TERM"),
            cost: env("ECHO_AGENT_COST").and_then(|v| {
                let (amount, currency) = v.trim().split_once(' ')?;
                Some((amount.parse().ok()?, currency.trim().to_string()))
            }),
            defaults: Directives {
                chunks: env_num("ECHO_AGENT_CHUNKS"),
                delay_ms: env_num("ECHO_AGENT_DELAY_MS").unwrap_or(0),
                permission: env_flag("ECHO_AGENT_PERMISSION"),
                crash: crash.trim() == "prompt",
                ..Directives::default()
            },
        }
    }
}

/// A session as stored in `<dir>/sessions/<sessionId>.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    session_id: String,
    cwd: PathBuf,
    #[serde(default)]
    additional_directories: Vec<PathBuf>,
    title: Option<String>,
    updated_at: DateTime<Utc>,
    #[serde(default)]
    archived: bool,
    /// Mode, model and options (see `controls`).
    #[serde(default)]
    settings: controls::Settings,
    /// The `_meta` of the `session/new` that made it, listed as the session's `_meta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    meta: Option<schema::Meta>,
}

/// The running turn of an open session: who to tell when it is cancelled.
#[derive(Debug)]
struct TurnSlot {
    id: u64,
    cancel: watch::Sender<bool>,
}

/// What a running turn watches to notice cancellation.
struct Turn {
    id: u64,
    /// Set by `session/cancel`; closed when the session is closed or deleted.
    cancel: watch::Receiver<bool>,
    /// `$/cancel_request` for the prompt request itself.
    request: RequestCancellation,
}

impl Turn {
    fn is_cancelled(&self) -> bool {
        *self.cancel.borrow() || self.cancel.has_changed().is_err() || self.request.is_cancelled()
    }

    /// Resolves once the turn is cancelled.
    async fn cancelled(&mut self) {
        tokio::select! {
            _ = self.cancel.wait_for(|cancelled| *cancelled) => {}
            () = self.request.cancelled() => {}
        }
    }
}

/// The agent: configuration, open sessions and their running turns.
#[derive(Debug)]
struct EchoAgent {
    cfg: Config,
    /// Open sessions of this process, with their running turn if any.
    open: Mutex<HashMap<String, Option<TurnSlot>>>,
    /// Serialises read-modify-write of session files within this process.
    files: Mutex<()>,
    next_turn: AtomicU64,
    /// The number of the next session with per-process ids.
    next_session: AtomicU64,
    /// Whether `authenticate` succeeded (the process has one connection).
    authenticated: AtomicBool,
    /// Whether the client declared `elicitation.form` in `initialize`.
    elicitation_form: AtomicBool,
    /// Whether the client declared `elicitation.url` in `initialize`.
    elicitation_url: AtomicBool,
    /// Chunks streamed by running turns, written to the session file when the turn ends (one
    /// write per turn, so that long turns stay linear).
    unsaved: Mutex<HashMap<String, Vec<serde_json::Value>>>,
    /// With `ECHO_AGENT_COST`: each session's cost in this process so far.
    spent: Mutex<HashMap<String, f64>>,
    /// With the `providers` capability: the params of the last `providers/set`.
    provider: Mutex<Option<serde_json::Value>>,
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--login") {
        std::process::exit(login::run(&Config::from_env().credentials));
    }
    let agent = Arc::new(EchoAgent {
        cfg: Config::from_env(),
        open: Mutex::new(HashMap::new()),
        files: Mutex::new(()),
        spent: Mutex::new(HashMap::new()),
        provider: Mutex::new(None),
        next_turn: AtomicU64::new(1),
        next_session: AtomicU64::new(1),
        authenticated: AtomicBool::new(false),
        elicitation_form: AtomicBool::new(false),
        elicitation_url: AtomicBool::new(false),
        unsaved: Mutex::new(HashMap::new()),
    });
    if agent.cfg.ignore_term {
        ignore_sigterm();
    }
    // Kept (not waited for) until the process ends.
    let _child = if agent.cfg.spawn_child {
        spawn_child(agent.cfg.child_pid_file.as_deref())
    } else {
        None
    };
    if let Err(e) = std::fs::create_dir_all(&agent.cfg.sessions_dir) {
        eprintln!(
            "echo-agent: cannot create {}: {e}",
            agent.cfg.sessions_dir.display()
        );
        std::process::exit(1);
    }
    eprintln!(
        "echo-agent: state in {}, capabilities {:?}",
        agent.cfg.sessions_dir.display(),
        agent.cfg.caps
    );

    // Every handler below runs inside the SDK's dispatch loop, so they only do
    // quick work; a prompt turn runs in a spawned task.
    let s = &agent;
    let result = Agent
        .v1()
        .name("echo-agent")
        .on_receive_request(
            // First: the methods with controls, as JSON; every other request goes on.
            async move |msg: UntypedMessage, responder: Responder<Value>, cx| match s
                .controlled(&cx, &msg, responder.cancellation())
                .await
            {
                Some(answer) => responder.respond_with_result(answer).map(|()| Handled::Yes),
                None => Ok(Handled::No {
                    message: (msg, responder),
                    retry: false,
                }),
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: InitializeRequest, responder, _cx| {
                responder.respond_with_result(s.initialize(&req).await)
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: AuthenticateRequest, responder, _cx| {
                responder.respond_with_result(s.authenticate(req))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |_: LogoutRequest, responder, _cx| responder.respond_with_result(s.logout()),
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: NewSessionRequest, responder, cx| {
                // In a task of its own, so that a slow one (`ECHO_AGENT_NEW_DELAY_MS`) leaves
                // the dispatch loop free for `$/cancel_request`.
                let (agent, cancel) = (Arc::clone(s), responder.cancellation());
                cx.spawn(async move {
                    responder.respond_with_result(agent.new_session(req, cancel).await)
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: LoadSessionRequest, responder, cx| {
                responder.respond_with_result(s.load(&cx, req))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: ResumeSessionRequest, responder, _cx| {
                responder.respond_with_result(s.resume(req).await)
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: CloseSessionRequest, responder, _cx| {
                responder.respond_with_result(s.close(req))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: ListSessionsRequest, responder, _cx| {
                responder.respond_with_result(s.list(req))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: SessionStatusRequest, responder, _cx| {
                responder.respond_with_result(s.status(req))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: SetSessionTitleRequest, responder, cx| {
                responder.respond_with_result(s.set_title(&cx, req))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: ArchiveSessionRequest, responder, _cx| {
                let done = s.set_archived(&req.session_id, "session/archive", true);
                responder.respond_with_result(done.map(|()| ArchiveSessionResponse::new()))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: UnarchiveSessionRequest, responder, _cx| {
                let done = s.set_archived(&req.session_id, "session/unarchive", false);
                responder.respond_with_result(done.map(|()| UnarchiveSessionResponse::new()))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: DeleteSessionRequest, responder, _cx| {
                responder.respond_with_result(s.delete(req))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            // Errors returned here are sent as the error response.
            async move |req: PromptRequest, responder, cx| s.prompt(&cx, req, responder),
            on_receive_request!(),
        )
        .on_receive_notification(
            async move |notif: CancelNotification, _cx| {
                s.cancel(notif);
                Ok(())
            },
            on_receive_notification!(),
        )
        .connect_to(stdio_transport())
        .await;
    if let Err(err) = result {
        eprintln!("echo-agent: connection failed: {err}");
        std::process::exit(1);
    }
}
