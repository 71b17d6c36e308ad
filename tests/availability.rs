//! No error while a healthy path exists: a member whose process died leaves placement at once
//! (a create that hit its broken pipe goes to another member), a request that arrives while the
//! pool starts waits for a member instead of answering 503, and a pool that cannot start says
//! so within the acquire timeout, with a `Retry-After` taken from the restart backoff.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// Waits until a SIGKILLed process has closed its files: every thread of it has exited (a
/// multi-threaded process's leader shows as a zombie while other threads still hold its file
/// table, and so its pipes). A request written into the pipe of a process still dying has
/// reached it as far as the gateway can tell; this is about the process that is gone.
async fn wait_torn_down(pid: u32) {
    let deadline = Instant::now() + PATIENCE;
    let running = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks.flatten().any(|t| {
                    std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                        !stat.rsplit(')').next().is_some_and(|rest| {
                            matches!(rest.trim_start().chars().next(), Some('Z' | 'X'))
                        })
                    })
                })
            })
            .unwrap_or(false)
    };
    while running() {
        assert!(
            Instant::now() < deadline,
            "SIGKILL did not end process {pid}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

both_backends!(
    killed_member_leaves_placement_at_once,
    creates_in_flight_on_a_killed_member_start_elsewhere,
    create_right_after_the_port_opens_waits_for_a_member,
);

/// Pool of 2; one member SIGKILLed from outside, then at once 6 concurrent creates: every one
/// lands on the surviving member (or on the restarted one), none answers 502.
async fn killed_member_leaves_placement_at_once(backend: Backend) {
    let w = World::start(backend, Options::default().pool(2)).await;
    let gw = w.gw();
    gw.wait_members_ready().await;
    let agent = gw.json("/agent").await;
    let pid = agent["members"][0]["pid"].as_u64().expect("member 0's pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_torn_down(pid as u32).await;
    let creates = (0..6).map(|_| gw.post("/sessions", json!({"cwd": "/tmp"})));
    let answers = futures::future::join_all(creates).await;
    let mut statuses = Vec::new();
    for r in answers {
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        statuses.push((status, body["detail"].clone()));
    }
    assert!(
        statuses.iter().all(|(s, _)| *s == 201),
        "every create succeeds while a member is ready: {statuses:?}"
    );
    w.finish().await;
}

/// Pool of 2, the agent slow to make a session: one member is SIGKILLed while 20 creates are in
/// flight on both, five times over. Every create answers 201 with a session that can be
/// prompted: those the dead member had taken are started again on the other one (the agent was
/// asked for more than 20 sessions, so some did die with their member).
async fn creates_in_flight_on_a_killed_member_start_elsewhere(backend: Backend) {
    let opts = Options::default()
        .pool(2)
        .env("ECHO_AGENT_NEW_DELAY_MS", "300");
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    for round in 0..5 {
        gw.wait_members_ready().await;
        let asked_before = w.calls("session/new");
        let pid = gw.json("/agent").await["members"][0]["pid"]
            .as_u64()
            .expect("member 0's pid") as i32;
        let creates = futures::future::join_all(
            (0..20).map(|_| gw.post("/sessions", json!({"cwd": "/tmp"}))),
        );
        let kill = async {
            // Both members are inside a `session/new` (it logs the call, then waits).
            let deadline = Instant::now() + PATIENCE;
            while w.calls("session/new") < asked_before + 2 {
                assert!(Instant::now() < deadline, "no create reached the agent");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
        };
        let (answers, ()) = tokio::join!(creates, kill);
        let mut ids = Vec::new();
        for r in answers {
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            assert_eq!(status, 201, "round {round}: {body}");
            ids.push(body["sessionId"].as_str().unwrap().to_owned());
        }
        let asked = w.calls("session/new") - asked_before;
        assert!(
            asked > 20,
            "round {round}: no create died with the member ({asked} asked)"
        );
        for id in &ids {
            let (status, body) = gw.prompt(id, "still here").await;
            assert_eq!(status, 200, "round {round}: {body}");
        }
    }
    w.finish().await;
}

/// The first create, sent the moment the port answers, waits for the starting member: 201.
async fn create_right_after_the_port_opens_waits_for_a_member(backend: Backend) {
    let w = World::start(backend, Options::default().no_wait()).await;
    let gw = w.gw();
    let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
    let status = r.status().as_u16();
    let retry_after = r.headers().get("retry-after").cloned();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 201, "Retry-After {retry_after:?}: {body}");
    assert!(
        !w.log().contains("ERROR"),
        "nothing is logged as an error while the pool starts:\n{}",
        w.log()
    );
    w.finish().await;
}

/// An agent that exits at once: a create waits at most --acquire-timeout, then answers 503 with
/// a Retry-After that reflects the restart backoff (at this point at most 3.2 s, so never the
/// fixed 5 s of old); once the member is crash-looping a create answers 503 without waiting.
#[tokio::test]
async fn a_pool_that_cannot_start_answers_503_within_the_acquire_timeout() {
    let opts = Options::default()
        .env("ECHO_AGENT_CRASH", "start")
        .args(&["--acquire-timeout", "2"])
        .no_wait();
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let sent = Instant::now();
    let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
    let took = sent.elapsed();
    assert_eq!(r.status(), 503);
    let retry_after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=4).contains(&retry_after),
        "Retry-After {retry_after} is the time to the next restart attempt"
    );
    assert!(
        took < Duration::from_secs(4),
        "bounded by the acquire timeout: {took:?}"
    );

    gw.wait_member_state("crash_loop").await;
    let sent = Instant::now();
    let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(r.status(), 503);
    // Not waited for: well under the 2 s it would wait for a starting member.
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "a crash-looping pool is not waited for: {:?}",
        sent.elapsed()
    );
    let retry_after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "Retry-After {retry_after}");
    let p: Value = r.json().await.unwrap();
    assert!(
        p["detail"].as_str().unwrap().contains("crash-looping"),
        "{p}"
    );
    w.finish().await;
}

/// Pool of 1: a create sent right after the only member was SIGKILLed waits for its restart
/// (about 200 ms of backoff) instead of failing.
#[tokio::test]
async fn a_create_while_the_only_member_restarts_waits_for_it() {
    let w = World::start(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let pid = gw.agent_pid().await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_torn_down(pid).await;
    let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 201, "{body}");
    assert_ne!(gw.agent_pid().await, pid);
    w.finish().await;
}
