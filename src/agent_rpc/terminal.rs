//! An agent's terminal login (ACP's `terminal` auth method): the agent's own program, with the
//! method's arguments and environment, in a pseudo-terminal of its own, driven through two
//! bounded channels (what a user types in, what the program writes out) until it exits; exit
//! status 0 means signed in.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::process::AgentCommand;

/// What a user does at the terminal.
#[derive(Debug)]
pub enum TerminalInput {
    /// Keys typed (bytes, as a terminal sends them).
    Keys(Vec<u8>),
    /// The window's new size.
    Resize { rows: u16, cols: u16 },
}

/// A login program running in a pseudo-terminal; killed when dropped.
pub struct LoginTerminal {
    pty: pty_process::Pty,
    child: tokio::process::Child,
}

impl LoginTerminal {
    /// Starts `command` (the agent as configured: its program, arguments, environment and
    /// folder) with `args` appended and `env` added, in a new 80x24 pseudo-terminal.
    pub fn spawn(
        command: &AgentCommand,
        args: &[String],
        env: &BTreeMap<String, String>,
    ) -> io::Result<LoginTerminal> {
        let (pty, pts) = pty_process::open().map_err(io::Error::other)?;
        pty.resize(pty_process::Size::new(24, 80))
            .map_err(io::Error::other)?;
        let mut cmd = pty_process::Command::new(&command.program)
            .args(&command.args)
            .args(args)
            .env("TERM", "xterm-256color")
            .kill_on_drop(true);
        for name in &command.env_remove {
            cmd = cmd.env_remove(name);
        }
        cmd = cmd.envs(command.env.iter().map(|(k, v)| (k, v)));
        cmd = cmd.envs(env);
        if let Some(dir) = &command.cwd {
            cmd = cmd.current_dir(dir);
        }
        let child = cmd.spawn(pts).map_err(io::Error::other)?;
        Ok(LoginTerminal { pty, child })
    }

    /// Runs the login to its end: `input` typed in, everything the program writes sent to
    /// `output`. Returns its exit code (`None`: ended by a signal, or killed because `input`
    /// closed, `output` went away, or `limit` passed).
    pub async fn run(
        mut self,
        mut input: mpsc::Receiver<TerminalInput>,
        output: mpsc::Sender<Vec<u8>>,
        limit: Duration,
    ) -> io::Result<Option<i32>> {
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        let mut buf = vec![0u8; 16 * 1024];
        let mut open = true;
        loop {
            tokio::select! {
                read = self.pty.read(&mut buf), if open => match read {
                    Ok(0) => open = false,
                    Ok(n) => {
                        if output.send(buf[..n].to_vec()).await.is_err() {
                            return self.kill().await;
                        }
                    }
                    // Every process holding the terminal has gone.
                    Err(e) if e.raw_os_error() == Some(nix::libc::EIO) => open = false,
                    Err(e) => return Err(e),
                },
                typed = input.recv() => match typed {
                    Some(TerminalInput::Keys(keys)) => self.pty.write_all(&keys).await?,
                    Some(TerminalInput::Resize { rows, cols }) => {
                        let size = pty_process::Size::new(rows.max(1), cols.max(1));
                        self.pty.resize(size).map_err(io::Error::other)?;
                    }
                    None => return self.kill().await,
                },
                status = self.child.wait() => {
                    let code = status?.code();
                    // What it wrote last, if the terminal still holds it.
                    while open {
                        let more = tokio::time::timeout(Duration::from_millis(100), self.pty.read(&mut buf));
                        match more.await {
                            Ok(Ok(n)) if n > 0 => {
                                let _ = output.send(buf[..n].to_vec()).await;
                            }
                            _ => open = false,
                        }
                    }
                    return Ok(code);
                }
                _ = &mut deadline => return self.kill().await,
            }
        }
    }

    async fn kill(mut self) -> io::Result<Option<i32>> {
        let _ = self.child.start_kill();
        self.child.wait().await?;
        Ok(None)
    }
}
