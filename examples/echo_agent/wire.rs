//! The echo agent's plumbing: its stdio lines (lone surrogates in and out, `/garbage`), the
//! errors it answers, time stamps, synthetic sessions, a spawned child and SIGTERM.

use super::*;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(super) fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The cwd of every synthetic session.
pub(super) const SYNTHETIC_CWD: &str = "/synthetic";

/// Synthetic session `i`, made up as it is listed (no file): `synthetic_` + `i` in 9 digits,
/// in [`SYNTHETIC_CWD`], titled `Synthetic i`, updated `i` milliseconds before 2000-01-01.
pub(super) fn synthetic_session(i: usize) -> SessionInfo {
    let updated = DateTime::<Utc>::from_timestamp_millis(946_684_800_000 - i as i64)
        .expect("a timestamp in range");
    SessionInfo::new(format!("synthetic_{i:09}"), PathBuf::from(SYNTHETIC_CWD))
        .title(Some(format!("Synthetic {i}")))
        .updated_at(timestamp(updated))
}

/// `-32602` with `message` as the error message.
pub(super) fn invalid(message: &str) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, message)
}

pub(super) fn internal(e: impl std::fmt::Display) -> Error {
    Error::internal_error().data(e.to_string())
}

pub(super) fn not_found(id: &SessionId) -> Error {
    schema::Error::session_not_found(id.clone()).into()
}

pub(super) fn to_json(value: &impl Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Appends `line` to the file at `path`, creating it if needed.
pub(super) fn append_line(path: &Path, line: &str) -> io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(line.as_bytes())?;
    file.flush()
}

/// Nanoseconds spent in [`write_stdout`] since the start: mostly waiting for
/// the client to read, once the pipe is full. Every prompt answer carries it.
pub(super) static STDOUT_WRITE_NANOS: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to stdout in one go while holding the stdout lock, then
/// flushes. All output to stdout goes through here.
pub(super) fn write_stdout(bytes: &[u8]) -> io::Result<()> {
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
pub(super) fn prompt_response(stop: StopReason) -> PromptResponse {
    let micros = STDOUT_WRITE_NANOS.load(Ordering::Relaxed) / 1_000;
    let meta = json!({ "echoAgent": { "stdoutWriteMicros": micros } });
    PromptResponse::new(stop).meta(meta.as_object().cloned())
}

/// The four lines of `/garbage`, each ending in a newline. The last is an
/// `echo/padding` notification of exactly `long_line_bytes` bytes, newline
/// excluded (or of the empty envelope's size, if that is more).
pub(super) fn garbage(long_line_bytes: usize) -> String {
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

/// The line of `/overflow`, newline included: a `plan` update of session `id` whose `_meta`
/// holds `1e999`, a number JSON's grammar allows and no f64 holds (the SDK could not send it).
pub(super) fn overflow(id: &str) -> String {
    let id = serde_json::to_string(id).expect("a string serialises");
    format!(
        r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{id},"update":{{"sessionUpdate":"plan","entries":[],"_meta":{{"echo":1e999}}}}}}}}"#
    ) + "\n"
}

/// How this agent holds a lone U+D83D in a Rust string (see the module
/// documentation): a noncharacter, which no test sends for itself.
pub(super) const LONE_D83D: char = '\u{FDD0}';

/// A line to send: [`LONE_D83D`] written as the lone surrogate it stands for.
pub(super) fn surrogates_out(line: String) -> String {
    if line.contains(LONE_D83D) {
        line.replace(LONE_D83D, "\\ud83d")
    } else {
        line
    }
}

/// A received line: each lone `\ud83d` escape (not preceded by an escaping
/// backslash, nor followed by a low surrogate's escape) read as [`LONE_D83D`].
pub(super) fn surrogates_in(line: String) -> String {
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
pub(super) fn stdio_transport() -> Lines<
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
pub(super) fn spawn_child(pid_file: Option<&Path>) -> Option<std::process::Child> {
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
pub(super) fn ignore_sigterm() {
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
