//! The agent's stdin: a line is written by the task that sends it, when the pipe takes it whole
//! at once (the usual case: a pipe holds 64 KiB), and only otherwise queued for a writer task
//! that waits for the pipe to drain. Handing every line to a writer task cost the prompt a task
//! switch, 20–30 µs on a VM, before the agent saw it.
//!
//! Order is kept: a line goes straight to the pipe only when nothing is queued, and the rest of
//! a partly written line is queued first. The queue is bounded; a sender waits for room.
//!
//! A broken pipe (EPIPE: the agent exited or closed its stdin) is reported through the
//! [`CancellationToken`] the stdin is made with, the moment a write finds it: the pool takes the
//! member out of placement then, without waiting to hear of the exit.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, Weak};

use tokio::net::unix::pipe;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Lines queued behind a pipe that is full before a sender waits.
const QUEUED_LINES: usize = 256;

/// See the module documentation. Dropping it closes the pipe (the agent reads end of file).
#[derive(Debug)]
pub struct AgentStdin {
    pipe: pipe::Sender,
    state: Mutex<Queue>,
    /// Shared with the writer task, which must hear of the drop.
    wake: Arc<Wake>,
    /// Cancelled when the pipe breaks; cancelled by others (the connection is gone), it makes
    /// every send fail, waiting ones included.
    broken: CancellationToken,
}

#[derive(Debug, Default)]
struct Wake {
    /// Something was queued, or the stdin was dropped.
    queued: Notify,
    /// A queued line was written, or the pipe broke.
    room: Notify,
}

#[derive(Debug, Default)]
struct Queue {
    /// Lines (with their newline) not yet written; the front one from `written` on.
    lines: VecDeque<Vec<u8>>,
    written: usize,
}

/// The agent's stdin is closed (the agent exited or closed it).
#[derive(Debug)]
pub struct Closed;

impl AgentStdin {
    /// Takes the write end of the agent's stdin pipe (made non-blocking here) and spawns, on the
    /// current runtime into `tasks`, the writer task for what the pipe cannot take at once.
    /// `broken` is cancelled when a write finds the pipe broken.
    pub fn new(
        fd: OwnedFd,
        tasks: &mut tokio::task::JoinSet<()>,
        broken: CancellationToken,
    ) -> std::io::Result<Arc<Self>> {
        let stdin = Arc::new(AgentStdin {
            pipe: pipe::Sender::from_owned_fd(fd)?,
            state: Mutex::default(),
            wake: Arc::default(),
            broken,
        });
        tasks.spawn(write_queued(Arc::downgrade(&stdin), stdin.wake.clone()));
        Ok(stdin)
    }

    /// Sends one line (a newline is added). Once this returns, the line is ahead of anything
    /// sent later. `Err(Closed)`: no byte of the line was written.
    pub async fn send(&self, line: String) -> Result<(), Closed> {
        let mut line = line.into_bytes();
        line.push(b'\n');
        loop {
            let room = self.wake.room.notified();
            {
                let mut q = self.state.lock().expect("stdin lock");
                if self.broken.is_cancelled() {
                    return Err(Closed);
                }
                if q.lines.is_empty() {
                    let written = match self.pipe.try_write(&line) {
                        Ok(n) if n == line.len() => return Ok(()),
                        Ok(n) => n,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => 0,
                        Err(_) => {
                            self.broken.cancel();
                            return Err(Closed);
                        }
                    };
                    q.lines.push_back(line);
                    q.written = written;
                    self.wake.queued.notify_one();
                    return Ok(());
                }
                if q.lines.len() < QUEUED_LINES {
                    q.lines.push_back(line);
                    return Ok(());
                }
            }
            tokio::select! {
                _ = room => {}
                _ = self.broken.cancelled() => return Err(Closed),
            }
        }
    }

    /// Writes from the queue until it is empty or the pipe is full (`WouldBlock`).
    fn write_queue(&self) -> std::io::Result<()> {
        let mut guard = self.state.lock().expect("stdin lock");
        let q = &mut *guard;
        while let Some(front) = q.lines.front() {
            q.written += self.pipe.try_write(&front[q.written..])?;
            if q.written == front.len() {
                q.lines.pop_front();
                q.written = 0;
                self.wake.room.notify_waiters();
            }
        }
        Ok(())
    }

    fn close(&self) {
        let mut q = self.state.lock().expect("stdin lock");
        q.lines.clear();
        self.broken.cancel();
        self.wake.room.notify_waiters();
    }
}

impl Drop for AgentStdin {
    fn drop(&mut self) {
        self.wake.queued.notify_one();
    }
}

/// The writer task: waits for something queued, then for the pipe to take it. Ends when the
/// stdin is dropped or the pipe breaks.
async fn write_queued(stdin: Weak<AgentStdin>, wake: Arc<Wake>) {
    loop {
        wake.queued.notified().await;
        loop {
            let Some(stdin) = stdin.upgrade() else { return };
            match stdin.write_queue() {
                Ok(()) => break,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => {
                    stdin.close();
                    return;
                }
            }
            if stdin.pipe.writable().await.is_err() {
                stdin.close();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};

    use super::*;

    /// Lines longer than the pipe holds, sent by several tasks while the reader is slow, arrive
    /// whole and in each sender's order; once the reader is gone, sending fails.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_lines_arrive_whole_and_in_order() {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        let broken = CancellationToken::new();
        let stdin = AgentStdin::new(write, &mut tasks, broken.clone()).unwrap();
        const SENDERS: usize = 4;
        const LINES: usize = 50;
        let reader = std::thread::spawn(move || {
            let mut lines = BufReader::new(std::fs::File::from(read)).lines();
            let mut got = Vec::new();
            for _ in 0..SENDERS * LINES {
                got.push(lines.next().unwrap().unwrap());
                // Slower than the senders: the pipe fills and lines queue up.
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            got
        });
        let mut senders = tokio::task::JoinSet::new();
        for s in 0..SENDERS {
            let stdin = stdin.clone();
            senders.spawn(async move {
                for i in 0..LINES {
                    // Every fifth line is bigger than a pipe's 64 KiB.
                    let pad = if i.is_multiple_of(5) { 100_000 } else { 10 };
                    let line = format!("{s} {i} {}", "x".repeat(pad));
                    stdin.send(line).await.unwrap();
                }
            });
        }
        while let Some(done) = senders.join_next().await {
            done.unwrap();
        }
        let got = tokio::task::spawn_blocking(move || reader.join().unwrap())
            .await
            .unwrap();
        let mut next = [0; SENDERS];
        for line in got {
            let mut words = line.split(' ');
            let s: usize = words.next().unwrap().parse().unwrap();
            let i: usize = words.next().unwrap().parse().unwrap();
            assert_eq!(i, next[s], "sender {s}'s lines out of order");
            let pad = if i.is_multiple_of(5) { 100_000 } else { 10 };
            assert_eq!(words.next().unwrap().len(), pad, "line {s} {i} not whole");
            next[s] += 1;
        }
        assert_eq!(next, [LINES; SENDERS]);
        // The reader has closed its end: the pipe is broken. A send fails at once, or is queued
        // until the writer task finds the pipe broken, or waits for room in a full queue,
        // which that finding ends too.
        let failed = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while stdin.send("late".into()).await.is_ok() {}
        })
        .await;
        assert!(failed.is_ok(), "sending to a closed pipe kept succeeding");
        assert!(broken.is_cancelled(), "the broken pipe is reported");
    }
}
