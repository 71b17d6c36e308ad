//! Each session's prompt queue: order (an interrupt first), positions, the bound on waiting
//! prompts, one started prompt per session (also when many start at once), putting one back,
//! withdrawing only what has not started, and the sessions a sweep finds.

use super::*;
use acp_gateway::store::QueuedPrompt;

fn queued(session: &str, id: &str, interrupt: bool) -> QueuedPrompt {
    QueuedPrompt {
        queue_id: id.to_owned(),
        session_id: session.to_owned(),
        prompt: format!(r#"[{{"type":"text","text":"{id} ünï"}}]"#),
        author: r#"{"tenant":"acme","user":"ann"}"#.to_owned(),
        interrupt,
        created_at: 1_764_000_000_000_000,
        started_by: None,
    }
}

async fn order(store: &Arc<dyn Store>, session: &str) -> Vec<(String, bool)> {
    let all = store.queued_prompts(session).await.unwrap();
    all.into_iter()
        .map(|q| (q.queue_id, q.started_by.is_some()))
        .collect()
}

pub async fn check_prompt_queue(store: Arc<dyn Store>) {
    for (id, want) in [("a", 1), ("b", 2), ("c", 3)] {
        let at = store.enqueue_prompt(&queued("s1", id, false), 10).await;
        assert_eq!(at.unwrap(), Some(want), "{id}");
    }
    let at = store.enqueue_prompt(&queued("s1", "i", true), 10).await;
    assert_eq!(at.unwrap(), Some(1), "an interrupt goes first");
    let full = store.enqueue_prompt(&queued("s1", "d", false), 4).await;
    assert_eq!(full.unwrap(), None, "four wait already");
    let listed = store.queued_prompts("s1").await.unwrap();
    assert_eq!(listed[1], queued("s1", "a", false), "round trip");
    let names = |o: Vec<(String, bool)>| o.into_iter().map(|(q, _)| q).collect::<Vec<_>>();
    assert_eq!(names(order(&store, "s1").await), ["i", "a", "b", "c"]);

    // One started at a time; a started one is not withdrawn, and goes back in its place.
    let next = store.start_next_prompt("s1", "r1").await.unwrap().unwrap();
    assert_eq!(
        (next.queue_id.as_str(), next.started_by.as_deref()),
        ("i", Some("r1"))
    );
    assert!(store.start_next_prompt("s1", "r2").await.unwrap().is_none());
    assert!(!store.remove_prompt("s1", "i", true).await.unwrap());
    store.unstart_prompt("i").await.unwrap();
    assert_eq!(order(&store, "s1").await[0], ("i".to_owned(), false));
    let next = store.start_next_prompt("s1", "r1").await.unwrap().unwrap();
    assert_eq!(next.queue_id, "i");
    assert_eq!(order(&store, "s1").await[0], ("i".to_owned(), true));
    assert!(store.remove_prompt("s1", "i", false).await.unwrap());
    assert!(
        !store.remove_prompt("s2", "b", true).await.unwrap(),
        "another session's"
    );
    assert!(store.remove_prompt("s1", "b", true).await.unwrap());
    assert!(
        !store.remove_prompt("s1", "b", true).await.unwrap(),
        "gone already"
    );
    let next = store.start_next_prompt("s1", "r1").await.unwrap().unwrap();
    assert_eq!(next.queue_id, "a");

    store
        .enqueue_prompt(&queued("s2", "x", false), 10)
        .await
        .unwrap();
    let mut sessions = store.queued_sessions().await.unwrap();
    sessions.sort();
    let want = [
        ("s1".to_owned(), Some("r1".to_owned())),
        ("s2".to_owned(), None),
    ];
    assert_eq!(sessions, want);

    // Many replicas starting the session's next prompt at once: one does.
    store
        .enqueue_prompt(&queued("s3", "only", false), 10)
        .await
        .unwrap();
    let mut starts = JoinSet::new();
    for i in 0..8 {
        let store = store.clone();
        starts.spawn(async move { store.start_next_prompt("s3", &format!("r{i}")).await });
    }
    let mut started = 0;
    while let Some(done) = starts.join_next().await {
        started += usize::from(done.unwrap().unwrap().is_some());
    }
    assert_eq!(started, 1);
}
