//! Closed-loop load: `concurrency` clients, each sending its next request when its last
//! answer has arrived, counted over a window after a warm-up ([`closed_loop`]; at a fixed rate
//! instead, [`open_loop`]; and
//! [`load`] for HTTP GETs); and the gateway against a bare route measured alternately, best of
//! each.

use std::sync::Arc;
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

    /// The measuring window of a run starting now: `warmup` from now, `window` long.
    pub fn window_from_now(&self) -> Window {
        let start = Instant::now() + self.warmup;
        Window {
            start,
            end: start + self.window,
        }
    }
}

/// When a run's calls count: those that end in `start..end`.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub start: Instant,
    pub end: Instant,
}

impl Window {
    pub fn contains(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }

    pub fn secs(&self) -> f64 {
        (self.end - self.start).as_secs_f64()
    }
}

/// One client's calls in order, each as (started, ended).
pub type Calls = Vec<(Instant, Instant)>;

/// `clients` closed-loop clients: client `k` awaits `call(k)`, and again as soon as it has
/// returned, until `window.end` (a call started before then is finished); returns each
/// client's calls, the warm-up's included. A call panics on a wrong answer.
pub async fn closed_loop<F, Fut>(clients: usize, window: Window, call: F) -> Vec<Calls>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    each_client(clients, move |k| {
        let call = call.clone();
        async move {
            let mut calls = Calls::new();
            let mut started = Instant::now();
            while started < window.end {
                call(k).await;
                let ended = Instant::now();
                calls.push((started, ended));
                started = ended;
            }
            calls
        }
    })
    .await
}

/// Runs `client(k)` for each of `clients` clients, each a task of its own; their calls.
async fn each_client<C, Fut>(clients: usize, client: C) -> Vec<Calls>
where
    C: Fn(usize) -> Fut,
    Fut: Future<Output = Calls> + Send + 'static,
{
    let workers: Vec<_> = (0..clients).map(|k| tokio::spawn(client(k))).collect();
    let mut out = Vec::with_capacity(clients);
    for w in workers {
        out.push(w.await.unwrap());
    }
    out
}

/// `clients` clients, each sending its calls at a fixed `period` (an open loop, as a user
/// types, whatever the answers take), the clients' first calls spread evenly over one period;
/// a call still running when the next is due delays it (the ticks missed are skipped). Returns
/// as [`closed_loop`] does.
pub async fn open_loop<F, Fut>(
    clients: usize,
    period: Duration,
    window: Window,
    call: F,
) -> Vec<Calls>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let first = tokio::time::Instant::now();
    each_client(clients, move |k| {
        let call = call.clone();
        let offset = period * k as u32 / clients.max(1) as u32;
        async move {
            let mut ticks = tokio::time::interval_at(first + offset, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut calls = Calls::new();
            loop {
                let started = ticks.tick().await.into_std();
                if started >= window.end {
                    return calls;
                }
                call(k).await;
                calls.push((started, Instant::now()));
            }
        }
    })
    .await
}

/// [`closed_loop`] when `every` is `None`, else [`open_loop`] at that period.
pub async fn clients<F, Fut>(
    clients: usize,
    every: Option<Duration>,
    window: Window,
    call: F,
) -> Vec<Calls>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    match every {
        None => closed_loop(clients, window, call).await,
        Some(period) => open_loop(clients, period, window, call).await,
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
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(plan.concurrency)
        .build()
        .unwrap();
    let targets = Arc::new(targets.to_vec());
    let window = plan.window_from_now();
    let calls = closed_loop(plan.concurrency, window, move |k| {
        let (http, targets) = (http.clone(), targets.clone());
        async move {
            let (url, expected_len) = &targets[k % targets.len()];
            let mut req = http.get(url);
            if no_cache {
                req = req.header("cache-control", "no-cache");
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200, "GET {url}");
            assert_eq!(r.bytes().await.unwrap().len(), *expected_len, "GET {url}");
        }
    })
    .await;
    let done = calls
        .iter()
        .flatten()
        .filter(|(_, ended)| window.contains(*ended))
        .count();
    done as f64 / window.secs()
}
