//! What replicas forward to each other, on one PostgreSQL database: a keyed prompt sent to a
//! replica that forwards it to the session's holder, and is then SIGKILLed, is answered on retry
//! through the holder with the one turn that ran; a client's own forwarding mark is ignored (its
//! keyed prompt runs once, its DELETE sent to a replica that does not hold the session goes to
//! the one that does); a worktree session's files, diff, checkpoints, upload and revert asked of
//! a replica that does not hold it are answered by the one that does (a revert while its turn
//! runs there is 409). Ignored, with that reason, when built without `DATABASE_URL`.

use crate::support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::cluster::{beating, sessions_held, three_replicas};
use support::git::git;
use support::*;

/// `body` POSTed to `path` on `g` under Idempotency-Key `key`, with `headers`.
async fn keyed(
    g: &Gateway,
    path: &str,
    key: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (StatusCode, bool, Value) {
    let mut req = g
        .http
        .post(g.url(path))
        .header("idempotency-key", key)
        .json(body);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let res = req.send().await.unwrap();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    (res.status(), replayed, res.json().await.unwrap_or_default())
}

fn turns_ended(log: &[Value]) -> usize {
    log.iter().filter(|e| e["event"] == "turn_ended").count()
}

#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_keyed_prompt_outlives_the_replica_it_was_sent_to() {
    let (mut w, b, c) = three_replicas(beating()).await;
    let id = b.create_here("/tmp").await;
    assert_eq!(sessions_held(&[w.gw(), &b, &c]).await, [0, 1, 0]);
    let path = format!("/sessions/{id}/prompt");
    let prompt = json!({"text": "/chunks 20 /delay 150"});
    // Sent to `a`, which takes the key and forwards the prompt to `b`, the holder.
    let a = w.gw.take().unwrap();
    let first = {
        let (http, url) = (a.http.clone(), a.url(&path));
        let prompt = prompt.clone();
        tokio::spawn(async move {
            http.post(url)
                .header("idempotency-key", "survivor")
                .json(&prompt)
                .send()
                .await
        })
    };
    b.wait_until(|g| {
        let id = id.clone();
        async move { (g.history(&id).await.iter()).any(|e| e["event"] == "agent_message_chunk") }
    })
    .await;
    let mut a = a;
    a.kill().await;
    assert!(
        first.await.unwrap().is_err(),
        "the first client lost its replica"
    );
    // Retried through the holder while the dead replica's lease still runs: the turn's answer.
    let (status, replayed, answer) = keyed(&b, &path, "survivor", &prompt, &[]).await;
    assert_eq!((status, replayed), (StatusCode::OK, true), "{answer}");
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    // And through the third replica: the same answer; one turn in all.
    let (status, replayed, again) = keyed(&c, &path, "survivor", &prompt, &[]).await;
    assert_eq!((status, replayed, &again), (StatusCode::OK, true, &answer));
    assert_eq!(w.calls_about("session/prompt", &id), 1);
    assert_eq!(turns_ended(&b.history(&id).await), 1);
    w.gw = Some(b);
    drop(c);
    w.finish().await;
}

#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_forwarding_mark_sent_by_a_client_is_ignored() {
    let (w, b, c) = three_replicas(beating()).await;
    let a = w.gw();
    let id = b.create_here("/tmp").await;
    let path = format!("/sessions/{id}/prompt");
    let prompt = json!({"text": "once"});
    let forged = [("acp-gateway-forwarded", "1")];
    // A keyed prompt with a forged mark, twice: the second is the first's answer.
    let (status, replayed, first) = keyed(&b, &path, "forged", &prompt, &forged).await;
    assert_eq!((status, replayed), (StatusCode::OK, false), "{first}");
    let (status, replayed, again) = keyed(&b, &path, "forged", &prompt, &forged).await;
    assert_eq!((status, replayed, &again), (StatusCode::OK, true, &first));
    // The same through a replica that does not hold the session: forwarded, and a replay.
    let (status, replayed, _) = keyed(a, &path, "forged", &prompt, &forged).await;
    assert_eq!((status, replayed), (StatusCode::OK, true));
    assert_eq!(w.calls_about("session/prompt", &id), 1);

    // A DELETE with a forged mark sent to `c` goes to `b`, which closes the session.
    let res = c
        .http
        .delete(c.url(&format!("/sessions/{id}")))
        .header("acp-gateway-forwarded", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(sessions_held(&[a, &b, &c]).await, [0, 0, 0]);
    for g in [a, &b, &c] {
        let res = g.get(&format!("/sessions/{id}")).await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
        let (status, _) = g.prompt(&id, "after").await;
        assert_eq!(status, 404);
    }
    assert_eq!(w.calls_about("session/close", &id), 1);
    // A mark of the right shape signed with a guessed secret is no better.
    let id = b.create_here("/tmp").await;
    let guessed = format!(
        "{};{};AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        b.json("/agent").await["replicas"][0]["id"]
            .as_str()
            .unwrap(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let res = c
        .http
        .delete(c.url(&format!("/sessions/{id}")))
        .header("acp-gateway-forwarded", guessed)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(sessions_held(&[a, &b, &c]).await, [0, 0, 0]);
    drop((b, c));
    w.finish().await;
}

#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_workspaces_routes_go_to_the_replica_holding_the_session() {
    let (w, b, c) = three_replicas(beating()).await;
    let a = w.gw();
    let repo = w.dir().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("README.md"), "hello\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    let mark = b.forwarding_mark(&reqwest::Method::POST, "/sessions").await;
    let body = json!({"cwd": repo.to_str().unwrap(), "workspace": {"kind": "worktree"}});
    let r = b
        .http
        .post(b.url("/sessions"))
        .header("acp-gateway-forwarded", mark)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().await.unwrap()["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(sessions_held(&[a, &b, &c]).await, [0, 1, 0]);

    // Asked of `a`: the turn runs on `b`, whose checkpoint `a` then lists.
    assert_eq!(a.said(&id, "/write notes.txt").await, "wrote notes.txt");
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(b"up".to_vec()).file_name("up/one.txt"),
    );
    let r = a
        .http
        .post(a.url(&format!("/sessions/{id}/files")))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(a.changed_paths(&id).await, ["notes.txt", "up/one.txt"]);
    let listed = c.json(&format!("/sessions/{id}/checkpoints")).await;
    assert_eq!(
        listed["checkpoints"].as_array().unwrap().len(),
        1,
        "{listed}"
    );
    assert_eq!(
        sessions_held(&[a, &b, &c]).await,
        [0, 1, 0],
        "the session stays where it is"
    );

    // A revert asked of `a` while the turn runs on `b` is refused there.
    a.prompt_async(&id, "/hang").await;
    let status = format!("/sessions/{id}/status");
    b.wait_until(|g| {
        let status = status.clone();
        async move { g.json(&status).await["activity"] == "running" }
    })
    .await;
    let revert = a
        .post(&format!("/sessions/{id}/revert"), json!({"to": "base"}))
        .await;
    assert_eq!(revert.status(), 409);
    assert_eq!(a.session_action(&id, "cancel").await.status(), 204);
    let revert = a
        .post(&format!("/sessions/{id}/revert"), json!({"to": "base"}))
        .await;
    assert_eq!(revert.status(), 200);
    assert_eq!(
        a.get(&format!("/sessions/{id}/files/notes.txt"))
            .await
            .status(),
        404
    );
    w.finish().await;
    drop((b, c));
}
