//! Spawning an agent process in its own process group: its stdin is an [`AgentStdin`], a task
//! drains its stderr and keeps a tail, and its stdout is handed back as [`AgentStdout`], the
//! ordered source of parsed messages, which the caller reads and dispatches in one task (see
//! `pool`), so that a response reaches its waiter on the same worker thread, without another
//! wake-up (each costs tens of microseconds on a VM).

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};
use tokio::net::unix::pipe;
use tokio::process::{Child, Command};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::connection::Connection;
use super::inbound::{Inbound, parse_line};
use super::stdin::AgentStdin;

/// Longest line accepted from an agent: base64 images make lines large.
pub const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// Lines from agents that were not valid JSON-RPC, over all members (for `/metrics`).
pub static GARBAGE_LINES: AtomicU64 = AtomicU64::new(0);

/// Counts one line or message from an agent that the gateway had to ignore.
pub fn count_garbage() {
    GARBAGE_LINES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Lines or messages from agents that were ignored, over all members.
pub fn garbage_count() -> u64 {
    GARBAGE_LINES.load(std::sync::atomic::Ordering::Relaxed)
}

const STDERR_TAIL_LINES: usize = 20;

/// The agent command line, split like a POSIX shell would (no shell is run), with the extra
/// environment and working directory it runs in.
#[derive(Debug, Clone, Default)]
pub struct AgentCommand {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Variables of the gateway's environment not passed on.
    pub env_remove: Vec<String>,
    pub cwd: Option<std::path::PathBuf>,
    /// Longest accepted stdout line.
    pub max_line_bytes: usize,
}

impl AgentCommand {
    /// Parses `"CMD ARGS"`.
    pub fn parse(line: &str) -> anyhow::Result<Self> {
        let mut words = shell_words::split(line)?;
        anyhow::ensure!(!words.is_empty(), "the agent command is empty");
        let program = words.remove(0);
        Ok(AgentCommand {
            program,
            args: words,
            max_line_bytes: MAX_LINE_BYTES,
            ..Default::default()
        })
    }
}

/// How a member's process ended.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExitInfo {
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Signal number, when it was killed by one.
    pub signal: Option<i32>,
    /// The last lines it wrote to stderr.
    pub stderr_tail: Vec<String>,
}

/// A running agent process and the tasks serving its pipes.
pub struct AgentProcess {
    pub pid: u32,
    child: Child,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// The stdin writer: it ends only when the connection is dropped, so nobody waits for it.
    tasks: JoinSet<()>,
    /// The stderr reader: it ends at EOF, once the process group's writers are gone.
    stderr: JoinSet<()>,
}

impl AgentProcess {
    /// Starts the agent. Returns the process, the connection to call it, and the ordered stream
    /// of everything it writes to stdout.
    pub fn spawn(
        cmd: &AgentCommand,
        label: &str,
    ) -> std::io::Result<(Self, Arc<Connection>, AgentStdout)> {
        let mut command = Command::new(&cmd.program);
        if let Some(dir) = &cmd.cwd {
            command.current_dir(dir);
        }
        // Our ends of both pipes become non-blocking (see `AgentStdin`, and the stdout reader
        // registers with the runtime); the agent's ends stay as they were.
        let (stdout, stdout_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let (stdin_r, stdin) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        for name in &cmd.env_remove {
            command.env_remove(name);
        }
        let mut child = command
            .args(&cmd.args)
            .envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::from(stdin_r))
            .stdout(Stdio::from(stdout_w))
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        // The command holds our copies of the agent's pipe ends: without dropping them the
        // reader would never see EOF (nor the agent, on stdin).
        drop(command);
        let pid = child.id().unwrap_or_default();
        let stderr = child.stderr.take().expect("piped stderr");
        let mut tasks = JoinSet::new();

        let gone = CancellationToken::new();
        let stdin = AgentStdin::new(stdin, &mut tasks, gone.clone())?;

        let stdout = AgentStdout {
            reader: BufReader::with_capacity(64 * 1024, pipe::Receiver::from_owned_fd(stdout)?),
            buf: Vec::new(),
            max_line: cmd.max_line_bytes,
            member: label.to_owned(),
            stop: CancellationToken::new(),
        };

        let tail: Arc<Mutex<VecDeque<String>>> = Arc::default();
        let tail_w = tail.clone();
        let who = label.to_owned();
        let mut stderr_reader = JoinSet::new();
        stderr_reader.spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(target: "agent_stderr", member = %who, "{}", crate::redact::text(&line));
                let mut t = tail_w.lock().expect("tail lock");
                if t.len() == STDERR_TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(line);
            }
        });

        let conn = Arc::new(Connection::new(stdin, gone, label));
        Ok((
            AgentProcess {
                pid,
                child,
                tail,
                tasks,
                stderr: stderr_reader,
            },
            conn,
            stdout,
        ))
    }

    /// Waits for the process to exit and for its stderr to drain.
    pub async fn wait(&mut self) -> ExitInfo {
        let status = self.child.wait().await;
        // stderr reaches EOF once the process group's writers are gone; do not wait forever.
        // (Waiting for the stdin writer too cost every exit a whole second: it only ends when
        // the connection is dropped.)
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while self.stderr.join_next().await.is_some() {}
        })
        .await;
        self.stderr.abort_all();
        self.tasks.abort_all();
        use std::os::unix::process::ExitStatusExt;
        let (code, signal) = match status {
            Ok(s) => (s.code(), s.signal()),
            Err(_) => (None, None),
        };
        ExitInfo {
            code,
            signal,
            stderr_tail: self
                .tail
                .lock()
                .expect("tail lock")
                .iter()
                .cloned()
                .collect(),
        }
    }

    /// Terminates the whole process group: SIGTERM, then SIGKILL after `grace`; reaps it.
    pub async fn terminate(&mut self, grace: Duration) -> ExitInfo {
        let pgid = Pid::from_raw(self.pid as i32);
        let _ = killpg(pgid, Signal::SIGTERM);
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        let info = self.wait().await;
        // Anything left in the group (grandchildren) goes too.
        let _ = killpg(pgid, Signal::SIGKILL);
        info
    }
}

/// Everything the agent writes to stdout, in order, as parsed messages. Lines that are not
/// JSON-RPC, or longer than the limit, are counted, logged and skipped.
pub struct AgentStdout {
    reader: BufReader<pipe::Receiver>,
    buf: Vec<u8>,
    max_line: usize,
    member: String,
    stop: CancellationToken,
}

impl AgentStdout {
    /// Ends the messages once `stop` is cancelled, so that a stray grandchild holding the pipe
    /// open cannot keep the reader going after its process ended.
    pub fn until(mut self, stop: CancellationToken) -> Self {
        self.stop = stop;
        self
    }

    /// The next message; `None` at end of file, on a read error, or once stopped.
    pub async fn next(&mut self) -> Option<Inbound> {
        loop {
            // The token is checked before each line, and waited on only while the pipe is
            // empty: registering a waiter for every line would cost two lock round trips each.
            if self.stop.is_cancelled() {
                return None;
            }
            let read = tokio::select! {
                biased;
                read = read_bounded_line(&mut self.reader, &mut self.buf, self.max_line) => read,
                _ = self.stop.cancelled() => return None,
            };
            match read {
                Ok(None) => return None,
                Ok(Some(false)) => {
                    count_garbage();
                    tracing::warn!(member = %self.member, limit = self.max_line, "agent wrote an over-long line; dropped");
                }
                Ok(Some(true)) => {
                    // `from_utf8` checks ASCII a word at a time; `from_utf8_lossy` a byte.
                    let line = match std::str::from_utf8(&self.buf) {
                        Ok(line) => std::borrow::Cow::Borrowed(line),
                        Err(_) => String::from_utf8_lossy(&self.buf),
                    };
                    let line = line.trim();
                    if line.is_empty() {
                        continue;
                    }
                    match parse_line(line) {
                        Ok(msg) => return Some(msg),
                        Err(why) => {
                            count_garbage();
                            let shown: String = line.chars().take(200).collect();
                            tracing::warn!(member = %self.member, why, line = shown, "agent wrote a line that is not JSON-RPC; ignored");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(member = %self.member, error = %e, "reading the agent's stdout failed");
                    return None;
                }
            }
        }
    }
}

/// Reads one `\n`-terminated line into `buf` without ever holding more than `max` bytes.
/// `Ok(None)` at EOF, `Ok(Some(false))` when the line was too long (and was skipped).
async fn read_bounded_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    buf.clear();
    let mut too_long = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(if buf.is_empty() && !too_long {
                None
            } else {
                Some(!too_long)
            });
        }
        let (chunk, done) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (&available[..i], Some(i + 1)),
            None => (available, None),
        };
        if !too_long {
            if buf.len() + chunk.len() > max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = done.unwrap_or(available.len());
        reader.consume(used);
        if done.is_some() {
            return Ok(Some(!too_long));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_lines_skip_overlong_and_keep_going() {
        let data = b"short\nthis line is far too long\nok\nlast".to_vec();
        let mut r = BufReader::with_capacity(4, &data[..]);
        let mut buf = Vec::new();
        // Each read's answer, and what it leaves in `buf` (nothing of a skipped line, nor at
        // the end).
        for (answer, line) in [
            (Some(true), &b"short"[..]),
            (Some(false), b""),
            (Some(true), b"ok"),
            (Some(true), b"last"),
            (None, b""),
        ] {
            assert_eq!(
                read_bounded_line(&mut r, &mut buf, 10).await.unwrap(),
                answer
            );
            assert_eq!(buf, line);
        }
    }
}
