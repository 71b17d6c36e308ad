//! Serving the router over HTTP/1.1 with small per-connection state, for many open streams.
//!
//! `axum::serve` would do, but costs about 47 KiB per idle SSE connection, measured: it turns
//! the shared `Router` into a per-connection service by deep-cloning every route (≈ 24 KB), and
//! its protocol-sniffing builder reads a 24-byte HTTP/2 preface probe first, after which hyper's
//! read buffer doubles from 8 to 16 KiB on the next read. Here the router is shared (an `Arc`
//! clone) and hyper's HTTP/1 builder is used directly: about 14 KiB per idle connection.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

/// Serves `app` on `listener` until `shutdown` resolves; then stops accepting, asks every open
/// connection to close after its current response (streams end on their own shutdown signal)
/// and returns once all have.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let builder = hyper::server::conn::http1::Builder::new();
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
        let conn = builder
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app))
            .with_upgrades();
        let closing = closing.clone();
        connections.spawn(async move {
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                () = closing.cancelled() => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
    }
    drop(listener);
    closing.cancel();
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Errors of one incoming connection, not of the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}
