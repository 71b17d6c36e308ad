//! A round-robin TCP balancer with no stickiness: each new connection goes to the next
//! backend, as a plain layer-4 load balancer sends it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};

/// The balancer, listening on a loopback port until dropped.
pub struct RoundRobin {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// How many connections it has taken.
    pub connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl RoundRobin {
    /// Balances over `backends` (each a gateway's `http://HOST:PORT`).
    pub async fn start(backends: &[&str]) -> RoundRobin {
        let backends: Vec<String> = backends
            .iter()
            .map(|b| b.trim_start_matches("http://").to_owned())
            .collect();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let taken = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let n = taken.fetch_add(1, Ordering::Relaxed);
                let backend = backends[n % backends.len()].clone();
                tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&backend).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        RoundRobin {
            base,
            connections,
            task,
        }
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}
