//! A whole gateway moved between stores with `acp-gateway migrate --from … --to …`: from
//! SQLite to PostgreSQL and back, with two tenants, a webhook and its outbox, an idempotent
//! create, usage and a bulk of events, every row and event id kept and a client's
//! `Last-Event-ID` resuming across the move; a used target, a served source and a second run
//! refused; a run killed half-way finished by running it again; and `backup` of a SQLite store
//! under load, restored whole.

use crate::support;

use std::process::Stdio;

use reqwest::Method;
use serde_json::{Value, json};
use support::seen::{ACME, GLOBEX, assert_same, seen, two_tenants};
use support::sse::Sse;
use support::*;
use tokio::io::AsyncBufReadExt as _;

/// `acp-gateway ARGS` to its end: its exit code, stdout and stderr.
async fn command(args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokio::process::Command::new(Options::default().binary)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PATIENCE * 5, out)
        .await
        .unwrap()
        .unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code(), text(out.stdout), text(out.stderr))
}

/// Globex's create with the `Idempotency-Key` `moved-1`: its answer (201 each time).
async fn keyed_create(gw: &Gateway) -> Value {
    let r = (gw.http.post(gw.url("/sessions")).bearer_auth(GLOBEX))
        .header("idempotency-key", "moved-1")
        .json(&json!({"cwd": "/tmp"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    r.json().await.unwrap()
}

/// An SQLite store in `dir` holding one session of acme's with `events` events, and an empty
/// PostgreSQL database labelled `label`.
async fn stores(dir: &std::path::Path, events: usize, label: &str) -> (Database, Database) {
    let sqlite = Database::create(Backend::Sqlite, dir, "from").await;
    bulk(&sqlite.url, "acme", 1, events).await;
    let pg = Database::create(Backend::Postgres, &dir.join("pg"), label).await;
    (sqlite, pg)
}

async fn backup(url: &str, to: &std::path::Path) -> (Option<i32>, String, String) {
    command(&[
        "backup",
        "--database-url",
        url,
        "--to",
        to.to_str().unwrap(),
    ])
    .await
}

async fn migrate(from: &str, to: &str) -> (Option<i32>, String, String) {
    command(&["migrate", "--from", from, "--to", to]).await
}

/// Writes `count` sessions of `tenant` with `events` events each straight into the store at
/// `url`, a thousand at a time; their ids.
async fn bulk(url: &str, tenant: &str, count: usize, events: usize) -> Vec<String> {
    use acp_gateway::store::{NewEvent, Origin, SessionRecord};
    let db = acp_gateway::store::connect(url, "bulk").await.unwrap();
    let mut ids = Vec::new();
    for s in 0..count {
        let id = format!("bulk_{tenant}_{s}");
        let record = SessionRecord::new(
            id.clone(),
            tenant.into(),
            "/tmp".into(),
            "default".into(),
            Origin::Gateway,
            chrono::Utc::now(),
        );
        assert!(db.store.put_session(&record).await.unwrap());
        for start in (0..events).step_by(1000) {
            let batch: Vec<NewEvent> = (start..(start + 1000).min(events))
                .map(|n| NewEvent {
                    kind: "agent_message_chunk".into(),
                    payload: json!({"sessionId": id, "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": format!("w{n} ")}}}).into(),
                })
                .collect();
            db.store.append_events(&id, &batch).await.unwrap();
        }
        ids.push(id);
    }
    ids
}

/// The ids of `stream`'s next `n` events.
async fn ids(stream: &mut Sse, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    while ids.len() < n {
        ids.push(stream.next().await.expect("the stream goes on").id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_gateway_moves_from_sqlite_to_postgres_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Database::create(Backend::Sqlite, dir.path(), "from").await;
    let bulked = bulk(&sqlite.url, "acme", 2, 20_000).await;
    let a = Gateway::spawn(&sqlite.url, dir.path(), &two_tenants()).await;
    let acme = a.with_key(Some(ACME));
    let hook = json!({"url": "http://127.0.0.1:9/hook", "events": ["turn_ended"]});
    acme.send_expecting(Method::POST, "/webhooks", Some(hook), 201)
        .await;
    let mut sessions = Vec::new();
    for (key, text) in [
        (ACME, "one two"),
        (ACME, "three"),
        (GLOBEX, "four five six"),
    ] {
        let k = a.with_key(Some(key));
        let made = k
            .send_expecting(Method::POST, "/sessions", Some(json!({"cwd": "/tmp"})), 201)
            .await;
        let id = made["sessionId"].as_str().unwrap().to_owned();
        let prompt = format!("/sessions/{id}/prompt");
        k.send_expecting(Method::POST, &prompt, Some(json!({"text": text})), 200)
            .await;
        sessions.push((key, id));
    }
    let idem = keyed_create(&a).await;
    // A client reads part of a session's log before the move.
    let (_, followed) = &sessions[0];
    let url = a.url(&format!("/sessions/{followed}/events"));
    let mut follow = Sse::from_response(
        Sse::request(&a.http, &url, Some(0))
            .bearer_auth(ACME)
            .send()
            .await
            .unwrap(),
    );
    let read = ids(&mut follow, 3).await;
    drop(follow);
    let before = (seen(&a, ACME).await, seen(&a, GLOBEX).await);
    assert_eq!(
        before.0["sessions"].as_array().unwrap().len(),
        4,
        "two made, two bulked"
    );
    assert_eq!(
        before.0["deliveries"][0].as_array().map(Vec::len),
        Some(2),
        "{}",
        before.0
    );

    // The served source is refused; once stopped it moves.
    let pg = Database::create(Backend::Postgres, &dir.path().join("pg"), "to").await;
    let (code, _, said) = migrate(&sqlite.url, &pg.url).await;
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("stop that gateway first"), "{said}");
    a.stop().await;
    let (code, out, said) = migrate(&sqlite.url, &pg.url).await;
    assert_eq!(code, Some(0), "{out}{said}");
    assert!(out.contains("sessions: 6 rows"), "{out}");
    assert!(out.contains("both hold the same rows, digest "), "{out}");
    assert!(
        said.contains("session_events: "),
        "progress on stderr: {said}"
    );

    let b = Gateway::spawn(&pg.url, dir.path(), &two_tenants()).await;
    assert_same(&before, &(seen(&b, ACME).await, seen(&b, GLOBEX).await));
    // The client resumes exactly after what it read.
    let url = b.url(&format!("/sessions/{followed}/events"));
    let last = *read.last().unwrap();
    let mut follow = Sse::from_response(
        Sse::request(&b.http, &url, Some(last))
            .bearer_auth(ACME)
            .send()
            .await
            .unwrap(),
    );
    assert_eq!(ids(&mut follow, 2).await, vec![last + 1, last + 2]);
    // The idempotent create answers as it did; sessions go on, numbered after their log.
    assert_eq!(keyed_create(&b).await["sessionId"], idem["sessionId"]);
    let (_, id) = &sessions[2];
    let g = b.with_key(Some(GLOBEX));
    let logged = before.1["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session"]["sessionId"] == id.as_str())
        .unwrap()["events"]
        .as_array()
        .unwrap()
        .len() as i64;
    g.send_expecting(
        Method::POST,
        &format!("/sessions/{id}/prompt"),
        Some(json!({"text": "seven"})),
        200,
    )
    .await;
    let history = g
        .send_expecting(
            Method::GET,
            &format!("/sessions/{id}/history?after={logged}"),
            None,
            200,
        )
        .await;
    assert_eq!(history["events"][0]["seq"], logged + 1, "{history}");
    assert!(
        bulked
            .iter()
            .all(|b| before.0.to_string().contains(b.as_str()))
    );

    // A second run into the target is refused, served or not.
    let (code, _, said) = migrate(&sqlite.url, &pg.url).await;
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("the target is being served"), "{said}");
    let moved = (seen(&b, ACME).await, seen(&b, GLOBEX).await);
    b.stop().await;
    let (code, _, said) = migrate(&sqlite.url, &pg.url).await;
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("finished copy"), "{said}");

    // And back to a new SQLite file.
    let back = format!("sqlite:{}", dir.path().join("back.db").display());
    let (code, out, said) = migrate(&pg.url, &back).await;
    assert_eq!(code, Some(0), "{out}{said}");
    let c = Gateway::spawn(&back, dir.path(), &two_tenants()).await;
    assert_same(&moved, &(seen(&c, ACME).await, seen(&c, GLOBEX).await));
    c.stop().await;
    let mut pg = pg;
    pg.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_move_cut_short_is_finished_by_running_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let (sqlite, mut pg) = stores(dir.path(), 150_000, "to").await;
    let mut run = tokio::process::Command::new(Options::default().binary)
        .args(["migrate", "--from", &sqlite.url, "--to", &pg.url])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(run.stderr.take().unwrap()).lines();
    loop {
        let line = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .unwrap()
            .unwrap();
        let line = line.expect("the copy said how far it was before it ended");
        if let Some(rest) = line.strip_prefix("session_events: ") {
            let copied: u64 = rest.split(' ').next().unwrap().parse().unwrap();
            if copied > 0 {
                assert!(copied < 150_000, "{line}");
                break;
            }
        }
    }
    run.kill().await.unwrap();
    let (code, out, said) = migrate(&sqlite.url, &pg.url).await;
    assert_eq!(code, Some(0), "{out}{said}");
    assert!(out.contains("(finishing an earlier run)"), "{out}");
    assert!(out.contains("session_events: 150000 rows"), "{out}");
    let db = acp_gateway::store::connect(&pg.url, "check").await.unwrap();
    assert_eq!(
        db.store.last_event_seq("bulk_acme_0").await.unwrap(),
        150_000
    );
    let tail = db
        .store
        .read_events("bulk_acme_0", 149_998, 10)
        .await
        .unwrap();
    assert_eq!(
        tail.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![149_999, 150_000]
    );
    drop(db);
    pg.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_target_in_use_or_the_source_itself_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (sqlite, mut pg) = stores(dir.path(), 10, "used").await;
    let used = Gateway::spawn(&pg.url, &dir.path().join("used"), &Options::default()).await;
    used.create("/tmp").await;
    used.stop().await;
    let (code, _, said) = migrate(&sqlite.url, &pg.url).await;
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("the target is in use: its sessions holds 1 rows"),
        "{said}"
    );
    let file = sqlite.url.strip_prefix("sqlite:").unwrap();
    let (code, _, said) = migrate(&sqlite.url, file).await;
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("the same database"), "{said}");
    // A mistyped source makes nothing, and leaves the target as it was.
    let typo = format!("{}.typo", sqlite.url);
    let (code, _, said) = migrate(&typo, &pg.url).await;
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("there is no SQLite store at"), "{said}");
    assert!(!std::path::Path::new(&format!("{file}.typo")).exists());
    pg.remove().await;
}

/// A backup taken while sessions stream is a consistent store: restored by `migrate` into a
/// new file and served, each of its sessions' logs is whole (numbered without a gap up to its
/// counter) and holds what was there before the backup began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_whole() {
    let w = World::start(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let mut ids = Vec::new();
    for _ in 0..4 {
        let id = gw.create("/tmp").await;
        assert_eq!(gw.prompt(&id, "before the backup").await.0, 200);
        ids.push(id);
    }
    let before: Vec<usize> =
        futures::future::join_all(ids.iter().map(|id| gw.history_len(id))).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = ids
        .iter()
        .map(|id| {
            let (http, url, stop) = (gw.http.clone(), gw.prompt_url(id), stop.clone());
            tokio::spawn(async move {
                let mut turns = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = http
                        .post(&url)
                        .json(&json!({"text": "/chunks 40 load"}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200);
                    turns += 1;
                }
                turns
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let file = w.dir().join("backup.db");
    let (code, out, said) = backup(&w.db.url, &file).await;
    assert_eq!(code, Some(0), "{out}{said}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let turns: Vec<i32> = futures::future::join_all(load)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(turns.iter().all(|t| *t > 0), "the load ran: {turns:?}");
    let (code, _, said) = backup(&w.db.url, &file).await;
    assert_eq!(code, Some(1), "a backup never overwrites: {said}");

    let restored = format!("sqlite:{}", w.dir().join("restored.db").display());
    let (code, out, said) = migrate(&format!("sqlite:{}", file.display()), &restored).await;
    assert_eq!(code, Some(0), "{out}{said}");
    let db = acp_gateway::store::connect(&restored, "check")
        .await
        .unwrap();
    for (id, before) in ids.iter().zip(before) {
        let last = db.store.last_event_seq(id).await.unwrap();
        let events = db.store.read_events(id, 0, 100_000).await.unwrap();
        let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(
            seqs,
            (1..=last).collect::<Vec<_>>(),
            "{id}: whole up to its counter"
        );
        assert!(
            events.len() >= before,
            "{id}: what was there before the backup is in it"
        );
    }
}

/// `migrate` copies every table of the schema or leaves it on purpose: a table a new migration
/// adds must be put in one list or the other, on both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_table_is_copied_or_left_on_purpose() {
    use acp_gateway::store::{COPIED, LEFT};
    let dir = tempfile::tempdir().unwrap();
    let mut urls = vec![format!("sqlite:{}", dir.path().join("t.db").display())];
    let mut pg = None;
    if postgres::admin_url().is_some() {
        let db = Database::create(Backend::Postgres, &dir.path().join("pg"), "tables").await;
        urls.push(db.url.clone());
        pg = Some(db);
    }
    for url in &urls {
        acp_gateway::store::connect(url, "t").await.unwrap();
        let tables: Vec<String> = if url.starts_with("sqlite:") {
            let pool = sqlx::SqlitePool::connect(url).await.unwrap();
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table'")
                .fetch_all(&pool)
                .await
                .unwrap()
        } else {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            sqlx::query_scalar(
                "SELECT table_name::text FROM information_schema.tables \
                 WHERE table_schema = current_schema()",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
        };
        for table in &tables {
            let listed = COPIED.contains(&table.as_str()) || LEFT.contains(&table.as_str());
            assert!(
                listed,
                "{url}: table {table} is neither copied nor left by migrate"
            );
        }
        for table in COPIED {
            assert!(tables.iter().any(|t| t == table), "{url}: no table {table}");
        }
    }
    if let Some(mut db) = pg {
        db.remove().await;
    }
}
