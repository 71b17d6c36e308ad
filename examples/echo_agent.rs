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
//! | `ECHO_AGENT_CONTROLS` | Comma-separated from `modes,models,options` (default none): the session controls offered, their setters, `usage` in prompt results and the `/state` directive (see `echo_agent/controls.rs`). |
//! | `ECHO_AGENT_CRASH` | `start`: write "echo-agent: crashing at start" to stderr and exit with code 3 before answering `initialize`. `prompt`: like `/crash` on every prompt. |
//! | `ECHO_AGENT_CHUNKS` | Default for `/chunks N`. |
//! | `ECHO_AGENT_DELAY_MS` | Default for `/delay MS`. |
//! | `ECHO_AGENT_PERMISSION` | `1`: like `/permission` on every prompt. |
//! | `ECHO_AGENT_AUTH` | An auth method id: `initialize` advertises the agent-style method {id: this, name "Echo login", description "Accepts any client that asks"}, and sessions need `authenticate` with it first (see above). |
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
//! | `/delay MS` | Sleep MS milliseconds before each chunk. |
//! | `/permission` | First send `session/request_permission` (tool call `call_1`, options `allow`/`reject`) and wait. Selected: stream `"permission: <optionId>"` then the reply. Cancelled: stop with `cancelled`. |
//! | `/elicit` | Send `elicitation/create` (form mode, message "Tell echo about yourself", `requestedSchema`: `name` string minLength 2 and `age` integer 0–150, both required; `code` string pattern `^[A-Z]{3}$`; `subscribe` boolean; `color` enum red/green/blue) and wait; stream one chunk `"elicitation: accept <content as JSON>"`, `"elicitation: decline"`, `"elicitation: cancel"` or `"elicitation: error <code>"`, and end the turn (`cancelled` after a cancel, else `end_turn`). Without `clientCapabilities.elicitation.form` in `initialize`, stream `"elicitation: unsupported"` instead. |
//! | `/elicit-url` | Like `/elicit` in URL mode (message "Sign in to echo", `elicitationId` `echo-login`, url `https://example.org/echo-login`; needs `elicitation.url`); when accepted, first send the `elicitation/complete` notification {elicitationId}, then stream `"elicitation: accept"`. |
//! | `/crash` | Send one chunk "crashing", write "echo-agent: crashing mid-turn" to stderr and exit with code 3. |
//! | `/hang` | Never answer unless the turn is cancelled. |
//! | `/unknown` | First send a `session/update` of the unknown kind `future_variant_x`, then continue normally. |
//! | `/fs` | First call the client's `fs/read_text_file` (which a client without the fs capability must refuse) and stream one chunk `"fs: ok"` or `"fs: error <code>"`. |
//! | `/deaf` | Never answer, whatever happens: `session/cancel` (still written to the call log), `$/cancel_request` and closing or deleting the session are ignored; only the end of the process ends the turn. |
//! | `/garbage` | Before anything else of the turn, write four raw lines straight to stdout: `this is not json`, `{"foo":1}`, `{"jsonrpc":"2.0","id":987654321,"result":{}}` and an `echo/padding` notification `{"jsonrpc":"2.0","method":"echo/padding","params":{"pad":"xxx…"}}` padded to exactly `ECHO_AGENT_LONG_LINE_BYTES` bytes; then continue normally. |
//! | `/surrogate` | Stream one chunk `ab` + a lone U+D83D (`"ab\ud83d"` on the wire), then title the session `cut ` + a lone U+D83D with a `session_info_update` {title} (kept and listed like any title, so the turn's end gives it no other); then continue normally. |
//! | `/env NAME` | Stream one chunk `"NAME=<value>"` with the agent process's environment variable NAME, or `"NAME unset"`; then continue normally. May be repeated. |
//! | `/pwd` | Stream one chunk with the agent process's current working directory; then continue normally. |
//! | `/state` | First send an `available_commands_update`, a `plan`, a `usage_update` and, with the `options` control, a `config_option_update` turning `verbose` on (see `echo_agent/controls.rs`), and the extension notification `_echo/status` {sessionId, stated: true}; then continue normally. |
//!
//! A turn does its parts in this order: `/garbage`, `/state`, `/surrogate`, `/unknown`, `/fs`,
//! each `/env` in prompt order, `/pwd`, `/permission`, `/elicit` or `/elicit-url` (which end
//! the turn), `/crash`, `/deaf`, `/hang`, then the reply.
//!
//! `session/cancel` (or `$/cancel_request` for the prompt, or closing or
//! deleting the session) stops the turn at the next chunk boundary, and
//! interrupts a delay, a hang or a pending permission request or elicitation; the prompt then
//! answers `stopReason: "cancelled"` (except under `/deaf`). A second prompt
//! while a turn runs gets -32602 "turn already running".

#[path = "echo_agent/controls.rs"]
mod controls;

use std::collections::{BTreeSet, HashMap};
use std::io::{self, BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    self, AgentCapabilities, ArchiveSessionRequest, ArchiveSessionResponse, AuthMethod,
    AuthMethodAgent, AuthenticateRequest, AuthenticateResponse, CancelNotification,
    CloseSessionRequest, CloseSessionResponse, ContentBlock, ContentChunk, DeleteSessionRequest,
    DeleteSessionResponse, Implementation, InitializeRequest, InitializeResponse,
    ListSessionsRequest, ListSessionsResponse, LoadSessionRequest, LoadSessionResponse,
    NewSessionRequest, NewSessionResponse, PermissionOption, PermissionOptionKind,
    PromptCapabilities, PromptRequest, PromptResponse, RequestPermissionOutcome,
    RequestPermissionRequest, ResumeSessionRequest, ResumeSessionResponse,
    SessionArchiveCapabilities, SessionArchiveFilter, SessionCapabilities,
    SessionCloseCapabilities, SessionDeleteCapabilities, SessionForkCapabilities, SessionId,
    SessionInfo, SessionInfoUpdate, SessionListCapabilities, SessionNotification,
    SessionResumeCapabilities, SessionStatus, SessionStatusCapabilities, SessionStatusRequest,
    SessionStatusResponse, SessionTitleCapabilities, SessionUpdate, SetSessionTitleRequest,
    SetSessionTitleResponse, StopReason, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields,
    ToolKind, UnarchiveSessionRequest, UnarchiveSessionResponse, Usage,
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

/// The `elicitationId` of `/elicit-url`.
const ECHO_ELICITATION_ID: &str = "echo-login";

/// The connection to the client, as handlers and spawned tasks see it.
type Cx = ConnectionTo<Client>;

/// Capability names accepted in `ECHO_AGENT_CAPS`.
const ALL_CAPS: [&str; 12] = [
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
];
/// Capabilities enabled when `ECHO_AGENT_CAPS` is unset.
const DEFAULT_CAPS: &str = "load,list,delete,resume,close";

/// Behaviour switches of one prompt turn, from directives or the environment.
#[derive(Clone, Debug, Default)]
struct Directives {
    /// `/chunks N`: reply with N numbered chunks instead of the words.
    chunks: Option<usize>,
    /// `/delay MS`: sleep before each chunk.
    delay_ms: u64,
    /// `/permission`: ask the client for permission first.
    permission: bool,
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
    /// `/surrogate`: send a lone surrogate in a chunk and in the title.
    surrogate: bool,
    /// `/env NAME`: report these environment variables, in order.
    env: Vec<String>,
    /// `/pwd`: report the current working directory.
    pwd: bool,
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
                ("/surrogate", _) => d.surrogate = true,
                ("/pwd", _) => d.pwd = true,
                ("/state", _) => d.state = true,
                ("/env", _) if !arg.is_empty() => d.env.push(arg.to_string()),
                ("/chunks", Some(n)) => d.chunks = usize::try_from(n).ok(),
                ("/delay", Some(ms)) => d.delay_ms = ms,
                _ => return (d, rest),
            }
            rest = if word == "/env" || (number.is_some() && matches!(word, "/chunks" | "/delay")) {
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
    /// `ECHO_AGENT_CONTROLS`.
    controls: controls::Controls,
    /// `ECHO_AGENT_CRASH=start`.
    crash_at_start: bool,
    /// `ECHO_AGENT_AUTH`: the one auth method, which sessions then require.
    auth_method: Option<String>,
    /// `ECHO_AGENT_AUTH_KEY`: the key `authenticate` must carry in its `_meta`.
    auth_key: Option<String>,
    /// `ECHO_AGENT_LONG_LINE_BYTES`: length of the long line of `/garbage`.
    long_line_bytes: usize,
    /// `ECHO_AGENT_SPAWN_CHILD=1`.
    spawn_child: bool,
    /// `ECHO_AGENT_CHILD_PID_FILE`.
    child_pid_file: Option<PathBuf>,
    /// `ECHO_AGENT_IGNORE_TERM=1`.
    ignore_term: bool,
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
            controls: controls::Controls::from_env(env("ECHO_AGENT_CONTROLS").as_deref()),
            crash_at_start: crash.trim() == "start",
            auth_method: env("ECHO_AGENT_AUTH").map(|v| v.trim().to_string()),
            auth_key: env("ECHO_AGENT_AUTH_KEY"),
            long_line_bytes: env_num("ECHO_AGENT_LONG_LINE_BYTES").unwrap_or(100_000),
            spawn_child: env_flag("ECHO_AGENT_SPAWN_CHILD"),
            child_pid_file: env("ECHO_AGENT_CHILD_PID_FILE").map(PathBuf::from),
            ignore_term: env_flag("ECHO_AGENT_IGNORE_TERM"),
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
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The cwd of every synthetic session.
const SYNTHETIC_CWD: &str = "/synthetic";

/// Synthetic session `i`, made up as it is listed (no file): `synthetic_` + `i` in 9 digits,
/// in [`SYNTHETIC_CWD`], titled `Synthetic i`, updated `i` milliseconds before 2000-01-01.
fn synthetic_session(i: usize) -> SessionInfo {
    let updated = DateTime::<Utc>::from_timestamp_millis(946_684_800_000 - i as i64)
        .expect("a timestamp in range");
    SessionInfo::new(format!("synthetic_{i:09}"), PathBuf::from(SYNTHETIC_CWD))
        .title(Some(format!("Synthetic {i}")))
        .updated_at(timestamp(updated))
}

/// `-32602` with `message` as the error message.
fn invalid(message: &str) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, message)
}

fn internal(e: impl std::fmt::Display) -> Error {
    Error::internal_error().data(e.to_string())
}

fn not_found(id: &SessionId) -> Error {
    schema::Error::session_not_found(id.clone()).into()
}

fn to_json(value: &impl Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Appends `line` to the file at `path`, creating it if needed.
fn append_line(path: &Path, line: &str) -> io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(line.as_bytes())?;
    file.flush()
}

/// Nanoseconds spent in [`write_stdout`] since the start: mostly waiting for
/// the client to read, once the pipe is full. Every prompt answer carries it.
static STDOUT_WRITE_NANOS: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to stdout in one go while holding the stdout lock, then
/// flushes. All output to stdout goes through here.
fn write_stdout(bytes: &[u8]) -> io::Result<()> {
    let started = std::time::Instant::now();
    let mut out = io::stdout().lock();
    let written = out.write_all(bytes).and_then(|()| out.flush());
    let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    STDOUT_WRITE_NANOS.fetch_add(took, Ordering::Relaxed);
    written
}

/// A prompt's answer: the stop reason, and in `_meta.echoAgent.stdoutWriteMicros`
/// the time this process has spent writing to stdout so far (see
/// [`STDOUT_WRITE_NANOS`]).
fn prompt_response(stop: StopReason) -> PromptResponse {
    let micros = STDOUT_WRITE_NANOS.load(Ordering::Relaxed) / 1_000;
    let meta = json!({ "echoAgent": { "stdoutWriteMicros": micros } });
    PromptResponse::new(stop).meta(meta.as_object().cloned())
}

/// The four lines of `/garbage`, each ending in a newline. The last is an
/// `echo/padding` notification of exactly `long_line_bytes` bytes, newline
/// excluded (or of the empty envelope's size, if that is more).
fn garbage(long_line_bytes: usize) -> String {
    const HEAD: &str = r#"{"jsonrpc":"2.0","method":"echo/padding","params":{"pad":""#;
    const TAIL: &str = r#""}}"#;
    let pad = "x".repeat(long_line_bytes.saturating_sub(HEAD.len() + TAIL.len()));
    let lines = [
        "this is not json",
        r#"{"foo":1}"#,
        r#"{"jsonrpc":"2.0","id":987654321,"result":{}}"#,
        &format!("{HEAD}{pad}{TAIL}"),
    ];
    lines.iter().map(|line| format!("{line}\n")).collect()
}

/// How this agent holds a lone U+D83D in a Rust string (see the module
/// documentation): a noncharacter, which no test sends for itself.
const LONE_D83D: char = '\u{FDD0}';

/// A line to send: [`LONE_D83D`] written as the lone surrogate it stands for.
fn surrogates_out(line: String) -> String {
    if line.contains(LONE_D83D) {
        line.replace(LONE_D83D, "\\ud83d")
    } else {
        line
    }
}

/// A received line: each lone `\ud83d` escape (not preceded by an escaping
/// backslash, nor followed by a low surrogate's escape) read as [`LONE_D83D`].
fn surrogates_in(line: String) -> String {
    const ESCAPE: &str = "\\ud83d";
    if !line.contains(ESCAPE) {
        return line;
    }
    let mut out = String::with_capacity(line.len());
    let mut rest = line.as_str();
    while let Some(at) = rest.find(ESCAPE) {
        let backslashes = rest[..at].bytes().rev().take_while(|b| *b == b'\\').count();
        let after = &rest[at + ESCAPE.len()..];
        let paired = after.get(..4).is_some_and(|next| {
            ["\\udc", "\\udd", "\\ude", "\\udf"]
                .iter()
                .any(|low| next.eq_ignore_ascii_case(low))
        });
        out.push_str(&rest[..at]);
        if backslashes % 2 == 0 && !paired {
            out.push(LONE_D83D);
        } else {
            out.push_str(ESCAPE);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Newline-delimited JSON-RPC over stdin/stdout for the SDK.
///
/// A thread reads stdin lines into a channel. Another thread writes each
/// outgoing line, newline included, with one `write_stdout` call: whole and
/// flushed under the stdout lock. A line handed to the sink counts as sent only
/// once that is done, so (as with the SDK's `Stdio`) a flushed sink means the
/// bytes are out. Lone surrogates go through [`surrogates_in`] and
/// [`surrogates_out`].
fn stdio_transport() -> Lines<
    impl futures::Sink<String, Error = io::Error> + Send + 'static,
    impl futures::Stream<Item = io::Result<String>> + Send + 'static,
> {
    let (line_tx, line_rx) = mpsc::channel::<io::Result<String>>(64);
    std::thread::spawn(move || {
        for line in io::stdin().lock().lines() {
            let failed = line.is_err();
            if line_tx.blocking_send(line.map(surrogates_in)).is_err() || failed {
                break;
            }
        }
    });
    let incoming = futures::stream::unfold(line_rx, |mut rx| async move {
        let line = rx.recv().await?;
        Some((line, rx))
    });

    type Written = oneshot::Sender<io::Result<()>>;
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<(String, Written)>();
    std::thread::spawn(move || {
        while let Some((line, done)) = out_rx.blocking_recv() {
            let mut line = surrogates_out(line);
            line.push('\n');
            // The sender may have given up waiting; nothing to tell then.
            let _ = done.send(write_stdout(line.as_bytes()));
        }
    });
    let outgoing = futures::sink::unfold(out_tx, |out_tx, line: String| async move {
        let gone = || io::Error::from(io::ErrorKind::BrokenPipe);
        let (done, written) = oneshot::channel();
        out_tx.send((line, done)).map_err(|_| gone())?;
        written.await.map_err(|_| gone())??;
        Ok(out_tx)
    });
    Lines::new(outgoing, incoming)
}

/// `ECHO_AGENT_SPAWN_CHILD`: starts `sleep 3600` in the agent's process group
/// and leaves it running. The handle is returned only to be kept, never waited
/// for.
fn spawn_child(pid_file: Option<&Path>) -> Option<std::process::Child> {
    let null = std::process::Stdio::null;
    let spawned = std::process::Command::new("sleep")
        .arg("3600")
        .stdin(null())
        .stdout(null())
        .stderr(null())
        .spawn();
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            eprintln!("echo-agent: cannot spawn child: {e}");
            return None;
        }
    };
    let pid = child.id();
    eprintln!("echo-agent: spawned child {pid}");
    if let Some(path) = pid_file
        && let Err(e) = append_line(path, &format!("{pid}\n"))
    {
        eprintln!("echo-agent: cannot write {}: {e}", path.display());
    }
    Some(child)
}

/// `ECHO_AGENT_IGNORE_TERM`: replaces SIGTERM's default action (exit) with a
/// log line, for as long as the process lives.
fn ignore_sigterm() {
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::spawn(async move {
                while term.recv().await.is_some() {
                    eprintln!("echo-agent: ignoring SIGTERM");
                }
            });
        }
        Err(e) => eprintln!("echo-agent: cannot handle SIGTERM: {e}"),
    }
}

impl EchoAgent {
    /// Appends `<method> <sessionId or ->` to `ECHO_AGENT_CALL_LOG`.
    fn log_call(&self, method: &str, session: Option<&SessionId>) {
        let Some(path) = &self.cfg.call_log else {
            return;
        };
        let line = format!(
            "{method} {}\n",
            session.map_or("-".into(), ToString::to_string)
        );
        if let Err(e) = append_line(path, &line) {
            eprintln!("echo-agent: cannot write call log {}: {e}", path.display());
        }
    }

    fn capabilities(&self) -> AgentCapabilities {
        let on = |cap: &str| self.cfg.caps.contains(cap);
        let session = SessionCapabilities::new()
            .list(on("list").then(SessionListCapabilities::new))
            .delete(on("delete").then(SessionDeleteCapabilities::new))
            .resume(on("resume").then(SessionResumeCapabilities::new))
            .close(on("close").then(SessionCloseCapabilities::new))
            .status(on("status").then(SessionStatusCapabilities::new))
            .title(on("title").then(SessionTitleCapabilities::new))
            .archive(on("archive").then(SessionArchiveCapabilities::new))
            .fork(on("fork").then(SessionForkCapabilities::new));
        let prompt = PromptCapabilities::new()
            .image(on("image"))
            .audio(on("audio"))
            .embedded_context(on("embeddedContext"));
        AgentCapabilities::new()
            .load_session(on("load"))
            .prompt_capabilities(prompt)
            .session_capabilities(session)
    }

    /// A new session's id: random, or the next of this process (`ECHO_AGENT_IDS`).
    fn new_id(&self) -> SessionId {
        if self.cfg.per_process_ids {
            let n = self.next_session.fetch_add(1, Ordering::SeqCst);
            return SessionId::new(format!("m{n}"));
        }
        SessionId::new(format!("sess_{}", uuid::Uuid::new_v4().simple()))
    }

    // ---- session files -------------------------------------------------

    /// The file of session `id`, or `None` for ids that cannot be ours.
    fn path(&self, id: &str) -> Option<PathBuf> {
        let safe = !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        safe.then(|| self.cfg.sessions_dir.join(format!("{id}.json")))
    }

    /// The history file of session `id` (appended to, one update per line).
    fn history_path(&self, id: &str) -> Option<PathBuf> {
        self.path(id).map(|p| p.with_extension("history.jsonl"))
    }

    /// The session's updates, in order (none when it has no history yet).
    fn history(&self, id: &str) -> Vec<Value> {
        let text = self
            .history_path(id)
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Appends `updates` to the history of session `id`, in one write, if it still exists.
    fn append_history(
        &self,
        id: &str,
        updates: impl IntoIterator<Item = Value>,
    ) -> Result<(), Error> {
        let (Some(record), Some(path)) = (self.path(id), self.history_path(id)) else {
            return Err(internal("bad session id"));
        };
        let _guard = lock(&self.files);
        if !record.exists() {
            return Ok(());
        }
        let mut lines = String::new();
        for update in updates {
            lines.push_str(&update.to_string());
            lines.push('\n');
        }
        if lines.is_empty() {
            return Ok(());
        }
        append_line(&path, &lines)
            .map_err(|e| internal(format!("cannot write {}: {e}", path.display())))
    }

    fn read(&self, id: &str) -> Option<Record> {
        let text = std::fs::read_to_string(self.path(id)?).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Writes `record` atomically: a temporary file in the same directory,
    /// then a rename over the real one.
    fn write(&self, record: &Record) -> Result<(), Error> {
        let path = self
            .path(&record.session_id)
            .ok_or_else(|| internal("bad session id"))?;
        let tmp = self.cfg.sessions_dir.join(format!(
            ".{}.{}.{}.tmp",
            record.session_id,
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let body = serde_json::to_vec_pretty(record).map_err(internal)?;
        std::fs::write(&tmp, body)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                internal(format!("cannot write {}: {e}", path.display()))
            })
    }

    /// Applies `change` to the stored session; `None` if it does not exist.
    fn update(&self, id: &str, change: impl FnOnce(&mut Record)) -> Result<Option<Record>, Error> {
        let _guard = lock(&self.files);
        let Some(mut record) = self.read(id) else {
            return Ok(None);
        };
        change(&mut record);
        self.write(&record)?;
        Ok(Some(record))
    }

    /// Every readable session file.
    /// How many synthetic sessions to list: the number in `<dir>/synthetic-sessions`, read at
    /// every call so that it can change while the agent runs; 0 without the file.
    fn synthetic_sessions(&self) -> usize {
        let Some(dir) = self.cfg.sessions_dir.parent() else {
            return 0;
        };
        std::fs::read_to_string(dir.join("synthetic-sessions"))
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    fn all(&self) -> Vec<Record> {
        let Ok(entries) = std::fs::read_dir(&self.cfg.sessions_dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let id = name
                    .strip_suffix(".json")
                    .filter(|_| !name.starts_with('.'))?;
                self.read(id)
            })
            .collect()
    }

    // ---- open sessions and turns ---------------------------------------

    fn open_session(&self, id: &SessionId) {
        lock(&self.open).entry(id.to_string()).or_insert(None);
    }

    fn is_open(&self, id: &str) -> bool {
        lock(&self.open).contains_key(id)
    }

    /// Forgets an open session; dropping its turn slot cancels the turn.
    fn close_session(&self, id: &str) {
        if let Some(Some(turn)) = lock(&self.open).remove(id) {
            turn.cancel.send_replace(true);
        }
    }

    /// Registers a new turn for an open session that has none running.
    fn begin_turn(&self, id: &SessionId, request: RequestCancellation) -> Result<Turn, Error> {
        let mut open = lock(&self.open);
        let slot = open.get_mut(&*id.0).ok_or_else(|| not_found(id))?;
        if slot.is_some() {
            return Err(invalid("turn already running"));
        }
        let turn_id = self.next_turn.fetch_add(1, Ordering::Relaxed);
        let (cancel, rx) = watch::channel(false);
        *slot = Some(TurnSlot {
            id: turn_id,
            cancel,
        });
        Ok(Turn {
            id: turn_id,
            cancel: rx,
            request,
        })
    }

    fn end_turn(&self, id: &str, turn_id: u64) {
        if let Some(slot) = lock(&self.open).get_mut(id)
            && slot.as_ref().is_some_and(|t| t.id == turn_id)
        {
            *slot = None;
        }
    }

    // ---- methods -------------------------------------------------------
    //
    // Each starts with `self.enter`, which logs the call and, for optional
    // methods, answers -32601 when the capability is off.

    /// Logs a call to `method`, then checks capability `cap` if any.
    fn enter(&self, method: &str, id: Option<&SessionId>, cap: Option<&str>) -> Result<(), Error> {
        self.log_call(method, id);
        match cap {
            Some(cap) if !self.cfg.caps.contains(cap) => {
                Err(Error::method_not_found()
                    .data(format!("{method}: capability {cap:?} is disabled")))
            }
            _ => Ok(()),
        }
    }

    /// -32000 "Authentication required" while `ECHO_AGENT_AUTH` is set and
    /// `authenticate` has not succeeded yet.
    fn require_auth(&self) -> Result<(), Error> {
        if self.cfg.auth_method.is_some() && !self.authenticated.load(Ordering::SeqCst) {
            return Err(Error::auth_required());
        }
        Ok(())
    }

    async fn initialize(&self, req: &InitializeRequest) -> Result<InitializeResponse, Error> {
        self.enter("initialize", None, None)?;
        let elicitation = req.client_capabilities.elicitation.as_ref();
        let form = elicitation.is_some_and(|e| e.form.is_some());
        self.elicitation_form.store(form, Ordering::SeqCst);
        let url = elicitation.is_some_and(|e| e.url.is_some());
        self.elicitation_url.store(url, Ordering::SeqCst);
        if self.cfg.crash_at_start {
            eprintln!("echo-agent: crashing at start");
            std::process::exit(3);
        }
        if self.cfg.init_delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.cfg.init_delay_ms)).await;
        }
        let info = Implementation::new("echo-agent", env!("CARGO_PKG_VERSION"));
        let auth_methods = self.cfg.auth_method.iter().map(|id| {
            let method = AuthMethodAgent::new(id.clone(), "Echo login")
                .description("Accepts any client that asks".to_string());
            AuthMethod::Agent(method)
        });
        Ok(InitializeResponse::new(ProtocolVersion::V1)
            .agent_capabilities(self.capabilities())
            .auth_methods(auth_methods.collect())
            .agent_info(info))
    }

    /// Accepts the advertised method (any method when none is advertised), with the key of
    /// `ECHO_AGENT_AUTH_KEY` in `_meta` when that is set.
    fn authenticate(&self, req: AuthenticateRequest) -> Result<AuthenticateResponse, Error> {
        self.enter("authenticate", None, None)?;
        if let Some(method) = &self.cfg.auth_method {
            if *req.method_id.0 != **method {
                return Err(invalid("unknown authentication method"));
            }
            if let Some(key) = &self.cfg.auth_key {
                // Gemini's shape, {"api-key": KEY}, or Codex's, {"api-key": {"apiKey": KEY}}.
                let given = req.meta.as_ref().and_then(|m| m.get("api-key"));
                let given = given.and_then(|v| v.as_str().or_else(|| v["apiKey"].as_str()));
                if given != Some(key.as_str()) {
                    let why = if given.is_some() {
                        "Authentication failed: wrong API key in _meta"
                    } else {
                        "Authentication failed: no API key in _meta (expected {\"api-key\": KEY} or {\"api-key\": {\"apiKey\": KEY}})"
                    };
                    return Err(Error::new(ErrorCode::AUTH_REQUIRED, why));
                }
            }
            self.authenticated.store(true, Ordering::SeqCst);
        }
        Ok(AuthenticateResponse::new())
    }

    fn new_session(&self, req: NewSessionRequest) -> Result<NewSessionResponse, Error> {
        self.enter("session/new", None, None)?;
        self.require_auth()?;
        if !req.cwd.is_absolute() {
            return Err(invalid("cwd must be an absolute path"));
        }
        std::fs::create_dir_all(&self.cfg.sessions_dir).map_err(internal)?;
        let id = self.new_id();
        self.write(&Record {
            session_id: id.to_string(),
            cwd: req.cwd,
            additional_directories: req.additional_directories,
            title: None,
            updated_at: Utc::now(),
            archived: false,
            settings: controls::Settings::default(),
            meta: req.meta,
        })?;
        self.open_session(&id);
        Ok(NewSessionResponse::new(id))
    }

    /// `session/fork`: a new session with the parent's settings and history, in `cwd`.
    fn fork(&self, req: &Value) -> Result<Value, Error> {
        let parent = SessionId::new(req["sessionId"].as_str().unwrap_or_default());
        self.enter("session/fork", Some(&parent), Some("fork"))?;
        self.require_auth()?;
        let from = self.read(&parent.0).ok_or_else(|| not_found(&parent))?;
        let cwd = req["cwd"].as_str().map_or(from.cwd.clone(), PathBuf::from);
        if !cwd.is_absolute() {
            return Err(invalid("cwd must be an absolute path"));
        }
        let id = self.new_id();
        self.write(&Record {
            session_id: id.to_string(),
            cwd,
            title: from.title.as_ref().map(|t| format!("Fork of {t}")),
            updated_at: Utc::now(),
            archived: false,
            ..from
        })?;
        self.append_history(&id.0, self.history(&parent.0))?;
        self.open_session(&id);
        Ok(json!({ "sessionId": id }))
    }

    /// The session methods that carry or change controls, answered as JSON (the schema
    /// crate's types have no `models`): `None` for another method, which the typed handlers
    /// answer.
    async fn controlled(&self, cx: &Cx, msg: &UntypedMessage) -> Option<Result<Value, Error>> {
        let c = self.cfg.controls;
        let params = &msg.params;
        let id = params["sessionId"].as_str().unwrap_or_default().to_owned();
        let typed = |e: serde_json::Error| invalid(&e.to_string());
        let answer = match msg.method.as_str() {
            "session/new" if c.any() => serde_json::from_value(params.clone())
                .map_err(typed)
                .and_then(|req| self.new_session(req))
                .map(|r| to_json(&r)),
            "session/load" if c.any() => match serde_json::from_value(params.clone()) {
                Ok(req) => self.load(cx, req).map(|r| to_json(&r)),
                Err(e) => Err(typed(e)),
            },
            "session/resume" if c.any() => match serde_json::from_value(params.clone()) {
                Ok(req) => self.resume(req).await.map(|r| to_json(&r)),
                Err(e) => Err(typed(e)),
            },
            "session/fork" => self.fork(params),
            "session/set_mode" | "session/set_model" | "session/set_config_option" => {
                self.log_call(&msg.method, Some(&SessionId::new(id.clone())));
                let answer = self.set_control(&id, &msg.method, params);
                if answer.is_ok() && params["configId"] == "mode" {
                    let update = json!({"sessionUpdate": "current_mode_update",
                                        "currentModeId": params["value"]});
                    let note = json!({ "sessionId": id, "update": update });
                    if let Err(e) = UntypedMessage::new("session/update", note)
                        .and_then(|n| cx.send_notification(n))
                    {
                        return Some(Err(e));
                    }
                }
                return Some(answer.map(|list| {
                    list.map_or_else(|| json!({}), |l| json!({ "configOptions": l }))
                }));
            }
            _ => return None,
        };
        Some(answer.map(|mut result| {
            let sid = result["sessionId"].as_str().map_or(id, str::to_owned);
            let settings = self.read(&sid).map(|r| r.settings).unwrap_or_default();
            if let Value::Object(fields) = &mut result {
                fields.extend(c.result(&settings));
            }
            result
        }))
    }

    /// A setter; the whole option list for `session/set_config_option`.
    fn set_control(&self, id: &str, method: &str, params: &Value) -> Result<Option<Value>, Error> {
        let c = self.cfg.controls;
        let mut settings = self
            .read(id)
            .ok_or_else(|| not_found(&SessionId::new(id)))?
            .settings;
        let text = |key: &str| params[key].as_str().unwrap_or_default().to_owned();
        let list = match method {
            "session/set_mode" => c.set_mode(&mut settings, &text("modeId")).map(|()| None),
            "session/set_model" => c.set_model(&mut settings, &text("modelId")).map(|()| None),
            _ => c
                .set_option(&mut settings, &text("configId"), &params["value"])
                .map(Some),
        }?;
        self.update(id, |r| r.settings = settings)?;
        Ok(list)
    }

    /// Replays the history as `session/update`s (before the response, which
    /// the caller sends), then opens the session.
    fn load(&self, cx: &Cx, req: LoadSessionRequest) -> Result<LoadSessionResponse, Error> {
        let id = &req.session_id;
        self.enter("session/load", Some(id), Some("load"))?;
        self.require_auth()?;
        self.read(&id.0).ok_or_else(|| not_found(id))?;
        for update in self.history(&id.0) {
            let params = json!({ "sessionId": id, "update": update });
            cx.send_notification(UntypedMessage::new("session/update", params)?)?;
        }
        self.open_session(id);
        Ok(LoadSessionResponse::new())
    }

    async fn resume(&self, req: ResumeSessionRequest) -> Result<ResumeSessionResponse, Error> {
        let id = &req.session_id;
        self.enter("session/resume", Some(id), Some("resume"))?;
        tokio::time::sleep(Duration::from_millis(self.cfg.resume_delay_ms)).await;
        self.require_auth()?;
        self.read(&id.0).ok_or_else(|| not_found(id))?;
        self.open_session(id);
        Ok(ResumeSessionResponse::new())
    }

    fn close(&self, req: CloseSessionRequest) -> Result<CloseSessionResponse, Error> {
        self.enter("session/close", Some(&req.session_id), Some("close"))?;
        self.close_session(&req.session_id.0);
        Ok(CloseSessionResponse::new())
    }

    fn list(&self, req: ListSessionsRequest) -> Result<ListSessionsResponse, Error> {
        self.enter("session/list", None, Some("list"))?;
        self.require_auth()?;
        let offset = match &req.cursor {
            None => 0,
            Some(cursor) => URL_SAFE_NO_PAD
                .decode(cursor)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok()?.parse::<usize>().ok())
                .ok_or_else(|| invalid("invalid cursor"))?,
        };
        let mut records = self.all();
        records.retain(|r| req.cwd.as_ref().is_none_or(|cwd| &r.cwd == cwd));
        let archive = self.cfg.caps.contains("archive");
        match (archive, req.archived.as_ref()) {
            (true, Some(SessionArchiveFilter::Include)) => {}
            (true, Some(SessionArchiveFilter::Only)) => records.retain(|r| r.archived),
            (true, Some(SessionArchiveFilter::Other(other))) => {
                return Err(invalid(&format!("unknown archived filter {other:?}")));
            }
            _ => records.retain(|r| !r.archived),
        }
        records.sort_by(|a, b| (b.updated_at, &b.session_id).cmp(&(a.updated_at, &a.session_id)));
        // Synthetic sessions are older than any real one: they come after them.
        let only_archived = archive && matches!(req.archived, Some(SessionArchiveFilter::Only));
        let synthetic = match &req.cwd {
            _ if only_archived => 0,
            Some(cwd) if cwd != Path::new(SYNTHETIC_CWD) => 0,
            _ => self.synthetic_sessions(),
        };
        let total = records.len() + synthetic;
        let end = offset.saturating_add(self.cfg.page_size).min(total);
        let page = (offset.min(end)..end).map(|i| match records.get(i) {
            Some(r) => SessionInfo::new(r.session_id.clone(), r.cwd.clone())
                .additional_directories(r.additional_directories.clone())
                .title(r.title.clone())
                .updated_at(timestamp(r.updated_at))
                .archived(archive.then_some(r.archived))
                .meta(r.meta.clone()),
            None => synthetic_session(i - records.len()).archived(archive.then_some(false)),
        });
        let next = (end < total).then(|| URL_SAFE_NO_PAD.encode(end.to_string()));
        Ok(ListSessionsResponse::new(page.collect()).next_cursor(next))
    }

    fn status(&self, req: SessionStatusRequest) -> Result<SessionStatusResponse, Error> {
        let id = &req.session_id;
        self.enter("session/status", Some(id), Some("status"))?;
        let status = if self.is_open(&id.0) {
            SessionStatus::Open
        } else if self.path(&id.0).is_some_and(|p| p.exists()) {
            SessionStatus::Saved
        } else {
            return Err(not_found(id));
        };
        Ok(SessionStatusResponse::new(status))
    }

    fn set_title(
        &self,
        cx: &Cx,
        req: SetSessionTitleRequest,
    ) -> Result<SetSessionTitleResponse, Error> {
        let id = req.session_id;
        self.enter("session/set_title", Some(&id), Some("title"))?;
        let title = req.title.trim().to_string();
        if title.is_empty() {
            return Err(invalid("title must not be empty"));
        }
        self.update(&id.0, |r| r.title = Some(title.clone()))?
            .ok_or_else(|| not_found(&id))?;
        let update =
            SessionUpdate::SessionInfoUpdate(SessionInfoUpdate::new().title(title.clone()));
        cx.send_notification(SessionNotification::new(id, update))?;
        Ok(SetSessionTitleResponse::new(title))
    }

    /// Closes the session here and removes its file; unknown ids are fine.
    fn set_archived(&self, id: &SessionId, method: &str, archived: bool) -> Result<(), Error> {
        self.enter(method, Some(id), Some("archive"))?;
        if archived {
            self.close_session(&id.0);
        }
        self.update(&id.0, |r| r.archived = archived)?
            .ok_or_else(|| not_found(id))?;
        Ok(())
    }

    fn delete(&self, req: DeleteSessionRequest) -> Result<DeleteSessionResponse, Error> {
        let id = &req.session_id;
        self.enter("session/delete", Some(id), Some("delete"))?;
        self.close_session(&id.0);
        let _guard = lock(&self.files);
        let files = [self.path(&id.0), self.history_path(&id.0)];
        for path in files.into_iter().flatten() {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(internal(e)),
                _ => {}
            }
        }
        Ok(DeleteSessionResponse::new())
    }

    /// Starts a turn in a spawned task, which answers the request when the
    /// turn ends, so that the dispatch loop stays free for `session/cancel`
    /// and the permission answer.
    fn prompt(
        self: &Arc<Self>,
        cx: &Cx,
        req: PromptRequest,
        responder: Responder<PromptResponse>,
    ) -> Result<(), Error> {
        let id = req.session_id.clone();
        self.enter("session/prompt", Some(&id), None)?;
        self.require_auth()?;
        let mut turn = self.begin_turn(&id, responder.cancellation())?;
        // With controls, the result counts a token per word, in and echoed out.
        let words: u64 = req
            .prompt
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text(t) => Some(t.text.split_whitespace().count() as u64),
                _ => None,
            })
            .sum();
        let usage = self
            .cfg
            .controls
            .any()
            .then(|| Usage::new(2 * words, words, words));
        let (agent, task_cx) = (Arc::clone(self), cx.clone());
        cx.spawn(async move {
            let result = agent.run_turn(&task_cx, req, &mut turn).await;
            agent.end_turn(&id.0, turn.id);
            let answer = result.map(|stop| prompt_response(stop).usage(usage));
            if let Err(err) = responder.respond_with_result(answer) {
                eprintln!("echo-agent: cannot answer session/prompt: {err}");
            }
            Ok(())
        })
    }

    fn cancel(&self, notif: CancelNotification) {
        self.log_call("session/cancel", Some(&notif.session_id));
        if let Some(Some(turn)) = lock(&self.open).get(&*notif.session_id.0) {
            turn.cancel.send_replace(true);
        }
    }

    // ---- prompt turns --------------------------------------------------

    /// Streams an agent chunk and keeps it for the history (saved when the turn ends).
    fn chunk(&self, cx: &Cx, id: &SessionId, text: impl Into<String>) -> Result<(), Error> {
        let text: String = text.into();
        let update = SessionUpdate::AgentMessageChunk(ContentChunk::new(text.into()));
        lock(&self.unsaved)
            .entry(id.0.to_string())
            .or_default()
            .push(to_json(&update));
        cx.send_notification(SessionNotification::new(id.clone(), update))
    }

    /// Runs one prompt turn (see the module documentation) and returns its
    /// stop reason.
    async fn run_turn(
        &self,
        cx: &Cx,
        req: PromptRequest,
        turn: &mut Turn,
    ) -> Result<StopReason, Error> {
        let id = req.session_id;
        let text: String = req
            .prompt
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text(t) => Some(t.text.as_str()),
                _ => None,
            })
            .collect();
        let user = SessionUpdate::UserMessageChunk(ContentChunk::new(text.clone().into()));
        self.update(&id.0, |r| r.updated_at = Utc::now())?;
        self.append_history(&id.0, [to_json(&user)])?;
        let (directives, rest) = self.cfg.defaults.parse(&text);
        let stop = self.stream(cx, &id, &directives, rest, turn).await?;
        self.finish(cx, &id, &text)?;
        Ok(stop)
    }

    /// The streaming part of a turn, as the directives `d` ask.
    async fn stream(
        &self,
        cx: &Cx,
        id: &SessionId,
        d: &Directives,
        rest: &str,
        turn: &mut Turn,
    ) -> Result<StopReason, Error> {
        if d.garbage {
            // Nothing of this turn has been sent yet, and the transport
            // writes every SDK line whole under the stdout lock (see
            // `stdio_transport`), so holding that lock for the four lines
            // keeps them apart from any message, of this session or another.
            let bytes = self.cfg.long_line_bytes;
            tokio::task::spawn_blocking(move || write_stdout(garbage(bytes).as_bytes()))
                .await
                .map_err(internal)?
                .map_err(internal)?;
        }

        if d.state {
            let c = self.cfg.controls;
            let settings = self.read(&id.0).map(|r| r.settings).unwrap_or_default();
            for update in controls::state_updates(c, &settings) {
                let params = json!({ "sessionId": id, "update": update });
                cx.send_notification(UntypedMessage::new("session/update", params)?)?;
            }
            if c.options {
                self.update(&id.0, |r| r.settings.verbose = true)?;
            }
            let status = json!({ "sessionId": id, "stated": true });
            cx.send_notification(UntypedMessage::new("_echo/status", status)?)?;
        }

        if d.surrogate {
            self.chunk(cx, id, format!("ab{LONE_D83D}"))?;
            let title = format!("cut {LONE_D83D}");
            self.update(&id.0, |r| r.title = Some(title.clone()))?;
            let update = SessionUpdate::SessionInfoUpdate(SessionInfoUpdate::new().title(title));
            cx.send_notification(SessionNotification::new(id.clone(), update))?;
        }

        if d.unknown {
            let update = json!({ "sessionUpdate": "future_variant_x", "payload": { "n": 1 } });
            let params = json!({ "sessionId": id, "update": update });
            cx.send_notification(UntypedMessage::new("session/update", params)?)?;
        }

        if d.fs {
            let params = json!({ "sessionId": id, "path": "/etc/hostname" });
            let request = UntypedMessage::new("fs/read_text_file", params)?;
            let outcome = match cx.send_request(request).block_task().await {
                Ok(_) => "fs: ok ".to_string(),
                Err(e) => format!("fs: error {} ", i32::from(e.code)),
            };
            self.chunk(cx, id, outcome)?;
        }

        for name in &d.env {
            let text = match std::env::var_os(name) {
                Some(value) => format!("{name}={}", value.to_string_lossy()),
                None => format!("{name} unset"),
            };
            self.chunk(cx, id, text)?;
        }

        if d.pwd {
            let text = match std::env::current_dir() {
                Ok(dir) => dir.display().to_string(),
                Err(e) => format!("pwd: error {e}"),
            };
            self.chunk(cx, id, text)?;
        }

        if d.permission {
            let fields = ToolCallUpdateFields::new()
                .title("echo wants to write a file".to_string())
                .kind(ToolKind::Edit)
                .status(ToolCallStatus::Pending);
            let options = vec![
                PermissionOption::new("allow", "Allow", PermissionOptionKind::AllowOnce),
                PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
            ];
            let tool_call = ToolCallUpdate::new("call_1", fields);
            let request = RequestPermissionRequest::new(id.clone(), tool_call, options);
            // On cancel the pending request is dropped, which makes the SDK
            // send `$/cancel_request` for it.
            let answer = tokio::select! {
                answer = cx.send_request(request).block_task() => answer?,
                () = turn.cancelled() => return Ok(StopReason::Cancelled),
            };
            let RequestPermissionOutcome::Selected(selected) = answer.outcome else {
                return Ok(StopReason::Cancelled);
            };
            self.chunk(cx, id, format!("permission: {}", selected.option_id))?;
        }

        if d.elicit || d.elicit_url {
            return self.elicit(cx, id, turn, d.elicit_url).await;
        }

        if d.crash {
            self.chunk(cx, id, "crashing")?;
            eprintln!("echo-agent: crashing mid-turn");
            // Give the SDK's writer a moment to put the chunk on stdout.
            tokio::time::sleep(Duration::from_millis(200)).await;
            std::process::exit(3);
        }

        if d.deaf {
            // Holds the responder forever and never looks at `turn`: neither
            // `session/cancel`, `$/cancel_request` nor closing the session
            // (which drops the turn's cancel sender) can end this.
            return std::future::pending().await;
        }

        if d.hang {
            turn.cancelled().await;
            return Ok(StopReason::Cancelled);
        }

        let mut parts: Vec<String> = match d.chunks {
            Some(n) => (1..=n).map(|i| format!("c{i}")).collect(),
            None => rest.split_whitespace().map(str::to_string).collect(),
        };
        if parts.is_empty() && d.chunks.is_none() {
            parts.push("(empty)".into());
        }
        let last = parts.len().saturating_sub(1);
        for (i, part) in parts.into_iter().enumerate() {
            if d.delay_ms > 0 {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(d.delay_ms)) => {}
                    () = turn.cancelled() => return Ok(StopReason::Cancelled),
                }
            }
            if turn.is_cancelled() {
                return Ok(StopReason::Cancelled);
            }
            self.chunk(cx, id, if i < last { part + " " } else { part })?;
        }
        Ok(StopReason::EndTurn)
    }

    /// `/elicit` (a form) or `/elicit-url` (`url`): asks the client, when it declared that
    /// mode of elicitation, streams what it answered and ends the turn.
    async fn elicit(
        &self,
        cx: &Cx,
        id: &SessionId,
        turn: &mut Turn,
        url: bool,
    ) -> Result<StopReason, Error> {
        let declared = if url {
            &self.elicitation_url
        } else {
            &self.elicitation_form
        };
        if !declared.load(Ordering::SeqCst) {
            self.chunk(cx, id, "elicitation: unsupported")?;
            return Ok(StopReason::EndTurn);
        }
        let params = if url {
            json!({
                "mode": "url",
                "sessionId": id,
                "message": "Sign in to echo",
                "elicitationId": ECHO_ELICITATION_ID,
                "url": "https://example.org/echo-login",
            })
        } else {
            json!({
                "mode": "form",
                "sessionId": id,
                "message": "Tell echo about yourself",
                "requestedSchema": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "title": "Name", "minLength": 2},
                        "age": {"type": "integer", "minimum": 0, "maximum": 150},
                        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                        "subscribe": {"type": "boolean"},
                        "color": {"type": "string", "enum": ["red", "green", "blue"]},
                    },
                    "required": ["name", "age"],
                },
            })
        };
        let request = UntypedMessage::new("elicitation/create", params)?;
        // On cancel the pending request is dropped, which makes the SDK
        // send `$/cancel_request` for it.
        let answer = tokio::select! {
            answer = cx.send_request(request).block_task() => answer,
            () = turn.cancelled() => return Ok(StopReason::Cancelled),
        };
        let (text, stop) = match answer {
            Ok(answer) => match (answer["action"].as_str(), &answer["content"]) {
                (Some("accept"), Value::Null) => {
                    ("elicitation: accept".into(), StopReason::EndTurn)
                }
                (Some("accept"), content) => (
                    format!("elicitation: accept {content}"),
                    StopReason::EndTurn,
                ),
                (Some("cancel"), _) => ("elicitation: cancel".into(), StopReason::Cancelled),
                (Some(action), _) => (format!("elicitation: {action}"), StopReason::EndTurn),
                (None, _) => (format!("elicitation: {answer}"), StopReason::EndTurn),
            },
            Err(e) => (
                format!("elicitation: error {}", i32::from(e.code)),
                StopReason::EndTurn,
            ),
        };
        if url && text == "elicitation: accept" {
            // The user went to the URL: the interaction there is over at once.
            let done = json!({ "elicitationId": ECHO_ELICITATION_ID });
            cx.send_notification(UntypedMessage::new("elicitation/complete", done)?)?;
        }
        self.chunk(cx, id, text)?;
        Ok(stop)
    }

    /// Ends a turn: bumps `updatedAt` and gives an untitled session its title.
    fn finish(&self, cx: &Cx, id: &SessionId, text: &str) -> Result<(), Error> {
        let now = Utc::now();
        let mut new_title = None;
        let chunks = lock(&self.unsaved).remove(&*id.0).unwrap_or_default();
        self.append_history(&id.0, chunks)?;
        self.update(&id.0, |r| {
            r.updated_at = now;
            if r.title.is_none() {
                let head: String = text.trim().chars().take(40).collect();
                let title = format!("Echo: {}", head.trim_end());
                r.title = Some(title.clone());
                new_title = Some(title);
            }
        })?;
        if let Some(title) = new_title
            && self.is_open(&id.0)
        {
            let update = SessionInfoUpdate::new()
                .title(title)
                .updated_at(timestamp(now));
            let update = SessionUpdate::SessionInfoUpdate(update);
            cx.send_notification(SessionNotification::new(id.clone(), update))?;
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    let agent = Arc::new(EchoAgent {
        cfg: Config::from_env(),
        open: Mutex::new(HashMap::new()),
        files: Mutex::new(()),
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
                .controlled(&cx, &msg)
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
            async move |req: NewSessionRequest, responder, _cx| {
                responder.respond_with_result(s.new_session(req))
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
