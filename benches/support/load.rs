//! Closed-loop HTTP load: `concurrency` clients, each sending its next request when its last
//! answer has arrived, counted over a window after a warm-up; and the gateway against a bare
//! route measured alternately, best of each.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a bench applies closed-loop load: `concurrency` clients, requests counted over `window`
/// after `warmup`; where sides are compared, each is measured `rounds` times, alternated, and
/// the best kept.
#[derive(Debug, Clone, Copy)]
pub struct LoadPlan {
    pub concurrency: usize,
    pub warmup: Duration,
    pub window: Duration,
    pub rounds: usize,
}

impl LoadPlan {
    /// What the benches use unless they say otherwise: 32 clients, 1 s warm-up, 3 s windows,
    /// best of 3.
    pub const STANDARD: LoadPlan = LoadPlan {
        concurrency: 32,
        warmup: Duration::from_secs(1),
        window: Duration::from_secs(3),
        rounds: 3,
    };

    /// The plan in words, for the reports.
    pub fn describe(&self) -> String {
        format!(
            "{} closed-loop clients, {} s windows after {} s warm-up",
            self.concurrency,
            self.window.as_secs(),
            self.warmup.as_secs()
        )
    }
}

/// Requests per second of `gateway` and of `bare` (both answering `expected_len` bytes), each
/// measured `plan.rounds` times with [`load`], the two alternated and the one going first
/// switched every round; the best of each.
pub async fn best_alternated(
    (gateway, bare): (&str, &str),
    expected_len: usize,
    plan: LoadPlan,
) -> (f64, f64) {
    let (mut gateway_best, mut bare_best) = (0.0f64, 0.0f64);
    for round in 0..plan.rounds {
        let mut sides = [(gateway, &mut gateway_best), (bare, &mut bare_best)];
        if round % 2 == 1 {
            sides.reverse();
        }
        for (url, best) in sides {
            *best = best.max(load(url, expected_len, plan, false).await);
        }
    }
    (gateway_best, bare_best)
}

/// Requests per second of `GET url` from `plan.concurrency` closed-loop clients over
/// `plan.window`, after `plan.warmup` (one run: `plan.rounds` is not used); every answer must
/// be 200 with a body of `expected_len` bytes. `no_cache` sends `Cache-Control: no-cache` (the
/// gateway then reads its store, not its page cache).
pub async fn load(url: &str, expected_len: usize, plan: LoadPlan, no_cache: bool) -> f64 {
    load_spread(&[(url.to_owned(), expected_len)], plan, no_cache).await
}

/// [`load`] over several `(url, expected_len)` targets: client `k` asks `targets[k % n]`.
pub async fn load_spread(targets: &[(String, usize)], plan: LoadPlan, no_cache: bool) -> f64 {
    let LoadPlan {
        concurrency,
        warmup,
        window,
        ..
    } = plan;
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
