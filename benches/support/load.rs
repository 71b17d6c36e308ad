//! Closed-loop HTTP load: `concurrency` clients, each sending its next request when its last
//! answer has arrived, counted over a window after a warm-up; and the gateway against a bare
//! route measured alternately, best of each.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Requests per second of `gateway` and of `bare` (both answering `expected_len` bytes), each
/// measured `rounds` times with [`load`], the two alternated and the one going first switched
/// every round; the best of each.
pub async fn best_alternated(
    (gateway, bare): (&str, &str),
    expected_len: usize,
    concurrency: usize,
    times: (Duration, Duration),
    rounds: usize,
) -> (f64, f64) {
    let (mut gateway_best, mut bare_best) = (0.0f64, 0.0f64);
    for round in 0..rounds {
        let mut sides = [(gateway, &mut gateway_best), (bare, &mut bare_best)];
        if round % 2 == 1 {
            sides.reverse();
        }
        for (url, best) in sides {
            *best = best.max(load(url, expected_len, concurrency, times, false).await);
        }
    }
    (gateway_best, bare_best)
}

/// Requests per second of `GET url` from `concurrency` closed-loop clients over `window`,
/// after `warmup`; every answer must be 200 with a body of `expected_len` bytes. `no_cache`
/// sends `Cache-Control: no-cache` (the gateway then reads its store, not its page cache).
pub async fn load(
    url: &str,
    expected_len: usize,
    concurrency: usize,
    times: (Duration, Duration),
    no_cache: bool,
) -> f64 {
    load_spread(
        &[(url.to_owned(), expected_len)],
        concurrency,
        times,
        no_cache,
    )
    .await
}

/// [`load`] over several `(url, expected_len)` targets: client `k` asks `targets[k % n]`.
pub async fn load_spread(
    targets: &[(String, usize)],
    concurrency: usize,
    (warmup, window): (Duration, Duration),
    no_cache: bool,
) -> f64 {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap();
    let window_start = Instant::now() + warmup;
    let window_end = window_start + window;
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..concurrency)
        .map(|k| {
            let (url, expected_len) = targets[k % targets.len()].clone();
            let (http, done) = (http.clone(), done.clone());
            tokio::spawn(async move {
                while Instant::now() < window_end {
                    let mut req = http.get(&url);
                    if no_cache {
                        req = req.header("cache-control", "no-cache");
                    }
                    let r = req.send().await.unwrap();
                    assert_eq!(r.status(), 200, "GET {url}");
                    assert_eq!(r.bytes().await.unwrap().len(), expected_len, "GET {url}");
                    let now = Instant::now();
                    if now >= window_start && now < window_end {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / window.as_secs_f64()
}
