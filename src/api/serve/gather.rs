//! An HTTP/2 connection's writes gathered into one write per poll of the connection.
//!
//! h2 writes a DATA frame of more than 256 bytes with a system call of its own: it keeps one such
//! frame aside and flushes its socket before taking the next. A commit seen by a thousand
//! watchers on one connection would be a thousand `writev` calls. Here the connection's socket is
//! behind a [`BufWriter`] whose flush is deferred: h2's writes and flushes fill the buffer (one
//! that would overflow it writes it out first), and when a poll of the connection returns, what
//! it gathered goes to the socket. The connection task is the only one that writes, so nothing is
//! left in the buffer while the task sleeps, except what the socket cannot take yet, and then the
//! task sleeps until it can.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, BufWriter, ReadBuf};

/// The most gathered before it is written out: a write of this size is one system call, and it
/// is what an HTTP/2 connection holds for a client slower than its streams besides h2's own
/// send buffers.
const GATHER: usize = 64 * 1024;

/// The shared socket: the connection reads and writes it through [`GatheredIo`], and
/// [`Gathered`] writes what was gathered when a poll of the connection returns.
type SharedSocket<T> = Arc<Mutex<Pin<Box<BufWriter<T>>>>>;

/// `io` for a connection, and the connection's future maker: `serve(io)` gives the connection,
/// wrapped so that each of its polls ends by writing what it gathered.
pub fn gather<T, C>(io: T, serve: impl FnOnce(GatheredIo<T>) -> C) -> Gathered<T, C>
where
    T: AsyncRead + AsyncWrite,
{
    let shared: SharedSocket<T> =
        Arc::new(Mutex::new(Box::pin(BufWriter::with_capacity(GATHER, io))));
    Gathered {
        conn: Box::pin(serve(GatheredIo {
            shared: shared.clone(),
        })),
        shared,
    }
}

/// The socket as the connection sees it: reads and writes pass through; its flush is left to
/// [`Gathered`], and shutting it down flushes.
pub struct GatheredIo<T> {
    shared: SharedSocket<T>,
}

fn lock<T>(shared: &SharedSocket<T>) -> MutexGuard<'_, Pin<Box<BufWriter<T>>>> {
    // A poll that panicked under the lock left the buffer as it was: still a valid buffer.
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T: AsyncRead + AsyncWrite> AsyncRead for GatheredIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        lock(&self.shared).as_mut().poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite> AsyncWrite for GatheredIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        lock(&self.shared).as_mut().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        lock(&self.shared).as_mut().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Deferred to the end of the connection's poll ([`Gathered`]).
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.shared).as_mut().poll_shutdown(cx)
    }
}

/// A connection whose polls each end by writing what they gathered. It ends with the connection,
/// or (giving `None`) when the socket fails under a gathered write: the connection, which has
/// handed its bytes over, would not learn of it.
pub struct Gathered<T, C> {
    conn: Pin<Box<C>>,
    shared: SharedSocket<T>,
}

impl<T, C> Gathered<T, C> {
    /// The connection itself (to ask it to close gracefully).
    pub fn conn(&mut self) -> Pin<&mut C> {
        self.conn.as_mut()
    }
}

impl<T: AsyncRead + AsyncWrite, C: Future> Future for Gathered<T, C> {
    type Output = Option<C::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(out) = self.conn.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        match lock(&self.shared).as_mut().poll_flush(cx) {
            Poll::Ready(Err(e)) => {
                tracing::debug!(error = %e, "an HTTP/2 connection's write failed");
                Poll::Ready(None)
            }
            // Written, or the socket wakes this task once it can take more.
            _ => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    /// One end of a pipe that counts the writes made to it.
    struct Counted(DuplexStream, Arc<AtomicUsize>);

    impl AsyncRead for Counted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Counted {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.1.fetch_add(1, Ordering::Relaxed);
            Pin::new(&mut self.0).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }

    /// A thousand pieces of 2 KB, each written and flushed as h2 writes a watcher's DATA frame
    /// during one poll, reach the peer whole and in order in about 32 writes, not a thousand;
    /// and all of it has left once the poll returns, though the connection goes on.
    #[tokio::test]
    async fn a_polls_writes_leave_together_when_the_poll_returns() {
        let (near, mut far) = tokio::io::duplex(4 << 20);
        let writes = Arc::new(AtomicUsize::new(0));
        let (more, mut told) = tokio::sync::mpsc::channel::<()>(1);
        let conn = gather(Counted(near, writes.clone()), |mut io| async move {
            for n in 0..1000u32 {
                let piece = [(n % 251) as u8; 2048];
                io.write_all(&piece).await.unwrap();
                io.flush().await.unwrap();
            }
            // Asleep until told: what was written must not wait for the next poll.
            told.recv().await;
            io.shutdown().await.unwrap();
        });
        let conn = tokio::spawn(conn);
        let mut got = vec![0u8; 1000 * 2048];
        far.read_exact(&mut got).await.unwrap();
        for (n, piece) in got.chunks(2048).enumerate() {
            assert!(piece.iter().all(|&b| b == (n % 251) as u8), "piece {n}");
        }
        let written = writes.load(Ordering::Relaxed);
        assert!((32..=33).contains(&written), "{written} writes");
        more.send(()).await.unwrap();
        assert!(
            conn.await.unwrap().is_some(),
            "the connection ended on its own"
        );
        let mut rest = Vec::new();
        far.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    /// A gathered write that fails ends the connection, which would not learn of it otherwise.
    #[tokio::test]
    async fn a_failed_gathered_write_ends_the_connection() {
        let (near, far) = tokio::io::duplex(1024);
        drop(far);
        let conn = gather(near, |mut io| async move {
            io.write_all(b"to no one").await.unwrap();
            io.flush().await.unwrap();
            std::future::pending::<()>().await;
        });
        let ended = tokio::time::timeout(std::time::Duration::from_secs(30), conn).await;
        assert!(ended.expect("the connection ended").is_none());
    }
}
