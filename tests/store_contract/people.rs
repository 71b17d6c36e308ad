//! Who a session is of: its owner and who answers, written when it is inserted and by an
//! update, never by a list sync's upsert, and the list's `owner` filter.

use super::*;
use acp_gateway::store::People;

pub async fn check_session_people(store: Arc<dyn Store>) {
    let people = People {
        owner: Some("ann@example.com".into()),
        owner_name: Some("Ann Ö'Neil \"the first\"".into()),
        who_answers: Some("author".into()),
    };
    let anns = SessionRecord {
        people: people.clone(),
        ..record("people-ann", "acme")
    };
    assert!(store.insert_session(&anns).await.unwrap());
    assert_eq!(
        store.get_session("people-ann").await.unwrap(),
        Some(anns.clone())
    );
    let cys = SessionRecord {
        people: People {
            owner: Some("cy".into()),
            ..People::default()
        },
        ..record("people-cy", "acme")
    };
    let nobodys = record("people-none", "acme");
    let globex = SessionRecord {
        people: people.clone(),
        ..record("people-globex", "globex")
    };
    for r in [&cys, &nobodys, &globex] {
        assert!(store.insert_session(r).await.unwrap());
    }

    // A sync's upsert of the row (which knows no people) changes the rest, not them.
    let synced = SessionRecord {
        title: Some("from the agent's list".into()),
        ..record("people-ann", "acme")
    };
    assert_eq!(store.put_sessions(&[synced]).await.unwrap(), ["people-ann"]);
    let row = store.get_session("people-ann").await.unwrap().unwrap();
    assert_eq!(row.title.as_deref(), Some("from the agent's list"));
    assert_eq!(row.people, people);

    // An update writes who answers.
    let updated = store
        .update_session("people-ann", &|r: &mut SessionRecord| {
            r.people.who_answers = Some("owner".into());
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(updated.people.who_answers.as_deref(), Some("owner"));
    let row = store.get_session("people-ann").await.unwrap().unwrap();
    assert_eq!(row.people.who_answers.as_deref(), Some("owner"));
    assert_eq!(row.people.owner, people.owner);

    // The owner filter, within the tenant's scope.
    let owned_by = |tenant: Option<&str>, owner: &str| ListQuery {
        tenant: tenant.map(str::to_owned),
        owner: Some(owner.to_owned()),
        limit: 10,
        ..ListQuery::default()
    };
    let ids = async |tenant: Option<&str>, owner: &str| {
        let list = store.list_sessions(&owned_by(tenant, owner)).await.unwrap();
        let mut ids: Vec<String> = list.sessions.into_iter().map(|r| r.session_id).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(Some("acme"), "ann@example.com").await, ["people-ann"]);
    let anyones = ids(None, "ann@example.com").await;
    assert_eq!(anyones, ["people-ann", "people-globex"]);
    assert_eq!(ids(Some("acme"), "cy").await, ["people-cy"]);
    assert!(ids(Some("acme"), "dee").await.is_empty());
}
