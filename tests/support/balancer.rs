//! A round-robin TCP balancer with no stickiness: each new connection goes to the next
//! backend, as a plain layer-4 load balancer sends it, and to the one after when that one
//! refuses it (as nginx's `proxy_next_upstream error` or HAProxy's `redispatch`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};

/// The balancer, listening on a loopback port until dropped.
pub struct RoundRobin {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// How many connections it has taken.
    pub connections: Arc<AtomicUsize>,
    /// Where it sends them (`HOST:PORT`), as an orchestrator updates it.
    backends: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RoundRobin {
    /// Balances over `backends` (each a gateway's `http://HOST:PORT`).
    pub async fn start(backends: &[&str]) -> RoundRobin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(Mutex::new(Vec::new()));
        let (taken, to) = (connections.clone(), shared.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let n = taken.fetch_add(1, Ordering::Relaxed);
                let backends = to.lock().unwrap().clone();
                tokio::spawn(async move {
                    for i in 0..backends.len() {
                        let backend = &backends[(n + i) % backends.len()];
                        if let Ok(mut server) = TcpStream::connect(backend).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                            return;
                        }
                    }
                });
            }
        });
        let balancer = RoundRobin {
            base,
            connections,
            backends: shared,
            task,
        };
        balancer.set_backends(backends);
        balancer
    }

    /// From now on, balances over `backends` (connections already made stay where they are).
    pub fn set_backends(&self, backends: &[&str]) {
        *self.backends.lock().unwrap() = backends
            .iter()
            .map(|b| b.trim_start_matches("http://").to_owned())
            .collect();
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}
