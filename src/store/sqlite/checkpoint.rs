//! The WAL's checkpoints, on a thread of their own beside the log writer's.
//!
//! A checkpoint copies the WAL's pages back into the database file and syncs both, which takes
//! milliseconds on a small VM's disk. Run by the log writer between two commits, that sync held
//! back every event of the next commit from its subscribers: one commit in [`CHECKPOINT_EVERY`]
//! was delivered late, which is what a stream's p99 showed. Here a thread with a connection of
//! its own runs a passive checkpoint when the writer asks for one (it never blocks the writer,
//! and the writer never waits for it), so the writer's commits go on while the pages are copied.
//!
//! While the writer keeps writing, a checkpoint may end with pages still to copy, and the WAL
//! only starts over once one has copied everything between two commits, which a steady stream of
//! commits rarely allows. So that it cannot grow without bound, the writer looks at the WAL
//! file's size itself every [`CHECKPOINT_EVERY`] appends (the thread's last result may be
//! seconds old on a loaded machine) and, past [`WAL_BYTES_MAX`], checkpoints inline with
//! `TRUNCATE`: as the only writer it copies everything and empties the file. Should the thread
//! hold the checkpoint lock just then, it tries again after the next appends, and asks the
//! thread for nothing until the file is small again.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;

use crate::store::error::StoreResult;

/// Appends between two checkpoints.
///
/// What a checkpoint has to copy and sync grows with the appends since the last one; a few
/// appends' pages are a dozen or so.
pub(super) const CHECKPOINT_EVERY: u32 = 8;

/// The WAL file's size beyond which the log writer checkpoints inline: 16 MiB.
const WAL_BYTES_MAX: u64 = 16 << 20;

/// The checkpointing thread, stopped (and joined) when dropped.
pub(super) struct Checkpointer {
    wake: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
    /// The database's WAL file.
    wal: PathBuf,
}

impl Checkpointer {
    /// Starts the thread on a connection of its own (`open` makes it).
    pub(super) fn start(
        path: &Path,
        open: impl Fn(&Path) -> StoreResult<rusqlite::Connection>,
    ) -> StoreResult<Checkpointer> {
        let conn = open(path)?;
        // One request waits at most: more asked while one runs would copy nothing new.
        let (wake, asked) = sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || {
                while asked.recv().is_ok() {
                    if let Err(e) = checkpoint(&conn, "PASSIVE") {
                        tracing::warn!(error = %e, "WAL checkpoint failed");
                    }
                }
            })
            .map_err(|e| {
                crate::store::error::StoreError::Corrupt(format!("checkpoint thread: {e}"))
            })?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        Ok(Checkpointer {
            wake: Some(wake),
            thread: Some(thread),
            wal: wal.into(),
        })
    }

    /// After [`CHECKPOINT_EVERY`] appends on `writer` (between two of its transactions): asks
    /// the thread for a checkpoint, or, when the WAL file has grown past [`WAL_BYTES_MAX`],
    /// checkpoints and empties it on `writer` itself.
    pub(super) fn after_appends(&self, writer: &rusqlite::Connection) {
        let size = std::fs::metadata(&self.wal).map_or(0, |m| m.len());
        if size > WAL_BYTES_MAX {
            match checkpoint(writer, "TRUNCATE") {
                Ok(true) => tracing::debug!(size, "the WAL was checkpointed inline"),
                // The thread holds the checkpoint lock: again after the next appends.
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "WAL checkpoint failed"),
            }
            return;
        }
        if let Some(wake) = &self.wake
            && let Err(TrySendError::Disconnected(())) = wake.try_send(())
        {
            tracing::warn!("the WAL checkpoint thread has stopped");
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.wake = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A checkpoint of `mode` on `conn`; whether it ran (false: another connection was
/// checkpointing, or a reader held it back).
fn checkpoint(conn: &rusqlite::Connection, mode: &str) -> rusqlite::Result<bool> {
    let busy: i64 = conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        row.get(0)
    })?;
    Ok(busy == 0)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::store::event::NewEvent;

    /// The log writer's appends reach the database file without the writer checkpointing (the
    /// WAL stays far below the size at which it would): the thread copies them there, and the
    /// file grows past what the migrations left. (That the WAL stays bounded however fast the
    /// appends come is the store contract's `log_writer_keeps_the_wal_bounded`.)
    #[tokio::test]
    async fn the_thread_copies_the_writers_appends_into_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        let url = format!("sqlite:{}", path.display());
        let store = crate::store::database::connect(&url, "test-replica")
            .await
            .unwrap()
            .store;
        let size = |name: &str| std::fs::metadata(dir.path().join(name)).map_or(0, |m| m.len());
        let empty = size("log.db");
        let mut writer = store.log_writer();
        let event = NewEvent {
            kind: "agent_message_chunk".into(),
            payload: serde_json::json!({"text": "x".repeat(2000)}).into(),
        };
        let events = vec![event; 50];
        for round in 0..40 {
            let session = format!("s{}", round % 4);
            writer
                .append_all(&[(session.as_str(), &events[..], None)])
                .await
                .unwrap()
                .unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while size("log.db") < empty + 40 * 50 * 2000 {
            assert!(
                Instant::now() < deadline,
                "the appends never reached the database file ({} bytes, {empty} at first)",
                size("log.db")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(store.read_events("s0", 0, 1000).await.unwrap().len(), 500);
    }
}
