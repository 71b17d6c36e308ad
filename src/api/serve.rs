//! Serving the router over HTTP/1.1, and HTTP/2 to clients that open with its preface
//! (cleartext, "prior knowledge": a proxy in front, or `curl --http2-prior-knowledge`), with
//! small per-connection state, for many open streams.
//!
//! `axum::serve` would do, but costs about 47 KiB per idle SSE connection, measured: it turns
//! the shared `Router` into a per-connection service by deep-cloning every route (≈ 24 KB), and
//! its protocol-sniffing builder reads a 24-byte HTTP/2 preface probe first, after which hyper's
//! read buffer doubles from 8 to 16 KiB on the next read. Here the router is shared (an `Arc`
//! clone), the protocol is told by peeking at the first bytes (nothing read, no buffer), and
//! hyper's HTTP/1 and HTTP/2 builders are used directly. Over HTTP/2 many streams share one
//! connection's buffers and writes, gathered into one write per poll of the connection
//! ([`gather`]; `bench/watchers.sh`).
//!
//! A client that reads slower than its streams are written holds at most [`MAX_BUFFERED`]
//! of the gateway's memory per connection (HTTP/1.1) or stream (HTTP/2): past it, the
//! response is not polled, and a live stream that falls behind the event hub reads the log
//! where it is when it is polled again. A client that reads nothing at all for the stall
//! timeout (`--stall-timeout`) while a write waits is cut; it resumes where it was with
//! `Last-Event-ID`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_io_timeout::TimeoutStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

mod gather;

/// Serves `app` on `listener` until `shutdown` resolves; then stops accepting, asks every open
/// connection to close after its current response (streams end on their own shutdown signal)
/// and returns once all have. A connection whose pending write the client leaves unread for
/// `stall` is closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
    stall: Option<Duration>,
) -> std::io::Result<()> {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1.max_buf_size(MAX_BUFFERED);
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http2
        .max_concurrent_streams(MAX_STREAMS)
        .max_send_buf_size(MAX_BUFFERED);
    let closing = CancellationToken::new();
    let connections = TaskTracker::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::error!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Frames are written whole: nothing gains from Nagle's delay, and an SSE frame must
        // not wait for the client's (delayed) acknowledgement of the previous one.
        let (stream, peer) = stream;
        let _ = stream.set_nodelay(true);
        // Built here rather than in the task: measured, it keeps the RSS lower over many
        // connections coming and going.
        // With upgrades: `/acp` takes WebSockets.
        // Each request knows its peer (what `/shared/…` limits by), without a copy of the router.
        let app = app
            .clone()
            .map_request(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                req
            });
        let service = TowerToHyperService::new(app);
        let (http1, http2) = (http1.clone(), http2.clone());
        let closing = closing.clone();
        connections.spawn(async move {
            // A connection that has sent nothing when the shutdown comes ends here.
            let http2_preface = tokio::select! {
                is = opens_with_http2_preface(&stream) => is,
                () = closing.cancelled() => return,
            };
            let mut timed = TimeoutStream::new(stream);
            timed.set_write_timeout(stall);
            if http2_preface {
                let conn = gather::gather(timed, |io| {
                    http2.serve_connection(TokioIo::new(io), service)
                });
                until_closed(conn, closing, |c| c.get_mut().conn().graceful_shutdown()).await;
            } else {
                let io = TokioIo::new(Box::pin(timed));
                let conn = http1.serve_connection(io, service).with_upgrades();
                until_closed(conn, closing, |c| c.graceful_shutdown()).await;
            }
        });
    }
    drop(listener);
    closing.cancel();
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Streams one HTTP/2 connection may have open at once: enough for a dashboard's proxy to carry a
/// thousand watchers on one connection (hyper's default is 200; beyond the limit a client's new
/// streams wait).
const MAX_STREAMS: u32 = 4096;
/// The most a connection (HTTP/1.1: its write buffer) or an HTTP/2 stream (its send buffer)
/// holds for a client that reads slower than it is written to; past it the response is not
/// polled until the client reads (one piece larger than this, such as a large event, is held
/// whole). hyper's defaults are about 400 KiB. It caps HTTP/1.1's read buffer too: a request
/// head past about twice this (measured: 100 KB passes, 200 KB does not) is refused with 431.
const MAX_BUFFERED: usize = 64 * 1024;
/// The start of HTTP/2's connection preface (RFC 9113, 3.4), which no HTTP/1 request line has.
const PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// Whether the client's first bytes are HTTP/2's preface: peeked (left for hyper to read), a
/// few times while what has come is a prefix of it.
async fn opens_with_http2_preface(stream: &TcpStream) -> bool {
    let mut head = [0u8; PREFACE.len()];
    for _ in 0..50 {
        match stream.peek(&mut head).await {
            Ok(n) if n == head.len() => return head == PREFACE,
            Ok(n) if n > 0 && PREFACE.starts_with(&head[..n]) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            _ => return false,
        }
    }
    false
}

/// Runs `conn` until it ends; once `closing` is cancelled, asks it to close after its current
/// responses (`graceful`) and waits for that.
async fn until_closed<C: Future>(conn: C, closing: CancellationToken, graceful: fn(Pin<&mut C>)) {
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        () = closing.cancelled() => graceful(conn.as_mut()),
    }
    let _ = conn.await;
}

/// Errors of one incoming connection, not of the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}
