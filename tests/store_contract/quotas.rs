//! Per-tenant quotas: slots taken up to a quota per tenant and kind, freed when released; a
//! session's slot counted with the tenant's live sessions, for two minutes at most; only live
//! replicas' slots counted; exactly the quota taken by many at once; prompts counted per
//! minute up to a quota, and pruned.

use super::*;
use acp_gateway::store::{SlotKind, TenantSlot};

const LEASE: std::time::Duration = std::time::Duration::from_secs(15);

/// Makes `replica` a live one: on a shared database it beats; on SQLite the one gateway is.
async fn alive(db: &Database, replica: &str) {
    if let Replicas::Shared(registry) = &db.replicas {
        registry
            .heartbeat_replica(
                &replicas::beat(replica, "http://127.0.0.1:1", ts(T0), 0, &[]),
                LEASE * 10,
            )
            .await
            .unwrap();
    }
}

/// Records that `replica` holds session `id` live.
async fn hold(db: &Database, id: &str, replica: &str) {
    match &db.replicas {
        Replicas::Shared(registry) => {
            let claimed = registry.claim_session(id, replica, LEASE).await.unwrap();
            assert_eq!(claimed, Claimed::Taken);
        }
        Replicas::Alone(held) => {
            held.hold(id, replica).await.unwrap();
        }
    }
}

fn slot<'a>(kind: SlotKind, holder: &'a str, tenant: &'a str, replica: &'a str) -> TenantSlot<'a> {
    TenantSlot {
        kind,
        holder,
        tenant,
        replica,
        lease: LEASE,
        now: Utc::now(),
    }
}

pub async fn check_tenant_slots(db: Database) {
    alive(&db, "r1").await;
    let store = db.store.clone();
    let take = |kind, holder: &'static str, tenant: &'static str, quota| {
        let store = store.clone();
        async move {
            store
                .take_tenant_slot(&slot(kind, holder, tenant, "r1"), quota)
                .await
                .unwrap()
        }
    };
    // Turns: two of t1's at once, a third refused; t2 has its own; the same holder again is
    // the same slot.
    assert!(take(SlotKind::Turn, "s1", "t1", 2).await);
    assert!(take(SlotKind::Turn, "s2", "t1", 2).await);
    assert!(
        !take(SlotKind::Turn, "s3", "t1", 2).await,
        "t1 is at its quota"
    );
    assert!(
        take(SlotKind::Turn, "s2", "t1", 2).await,
        "s2 holds one already"
    );
    assert!(take(SlotKind::Turn, "s4", "t2", 2).await, "per tenant");
    assert!(
        take(SlotKind::Session, "new-1", "t1", 1).await,
        "per kind: sessions are not turns"
    );
    store
        .release_tenant_slot(SlotKind::Turn, "s1")
        .await
        .unwrap();
    assert!(
        take(SlotKind::Turn, "s3", "t1", 2).await,
        "a released slot is free"
    );
    store
        .release_tenant_slot(SlotKind::Turn, "nobody")
        .await
        .unwrap();

    // Sessions: the tenant's live sessions count with its slots.
    store.put_session(&record("live-1", "t3")).await.unwrap();
    hold(&db, "live-1", "r1").await;
    assert!(take(SlotKind::Session, "new-2", "t3", 2).await);
    assert!(
        !take(SlotKind::Session, "new-3", "t3", 2).await,
        "one live session and one being made"
    );
    // Once the session being made is live, its slot goes and the session counts instead.
    assert!(
        take(SlotKind::Session, "live-1", "t3", 2).await,
        "a live session making itself live again is not counted twice"
    );
    store
        .release_tenant_slot(SlotKind::Session, "new-2")
        .await
        .unwrap();
    store
        .release_tenant_slot(SlotKind::Session, "live-1")
        .await
        .unwrap();
    assert!(take(SlotKind::Session, "new-3", "t3", 2).await);
    // A session's slot counts for two minutes at most.
    let old = TenantSlot {
        now: Utc::now() - Duration::seconds(200),
        ..slot(SlotKind::Session, "stale", "t4", "r1")
    };
    assert!(store.take_tenant_slot(&old, 1).await.unwrap());
    assert!(
        take(SlotKind::Session, "fresh", "t4", 1).await,
        "the stale one has expired"
    );
    assert!(!take(SlotKind::Session, "fresher", "t4", 1).await);

    // Another replica's slots count only while it is alive (on SQLite, the gateway taking the
    // slot is the only live one).
    let other = slot(SlotKind::Turn, "s9", "t5", "r-dead");
    assert!(store.take_tenant_slot(&other, 1).await.unwrap());
    assert!(
        take(SlotKind::Turn, "s10", "t5", 1).await,
        "a replica that does not beat holds nothing"
    );
}

/// Many take a slot of one tenant at once: exactly the quota get one.
pub async fn check_concurrent_tenant_slots(db: Database) {
    alive(&db, "r1").await;
    let mut tasks = JoinSet::new();
    for i in 0..12 {
        let store = db.store.clone();
        tasks.spawn(async move {
            let holder = format!("s{i}");
            store
                .take_tenant_slot(&slot(SlotKind::Turn, &holder, "t1", "r1"), 3)
                .await
                .unwrap()
        });
    }
    let taken = tasks.join_all().await.into_iter().filter(|t| *t).count();
    assert_eq!(taken, 3);
}

pub async fn check_tenant_prompts(store: Arc<dyn Store>) {
    for _ in 0..3 {
        assert!(store.count_tenant_prompt("t1", 100, 3).await.unwrap());
    }
    assert!(!store.count_tenant_prompt("t1", 100, 3).await.unwrap());
    assert!(
        store.count_tenant_prompt("t2", 100, 3).await.unwrap(),
        "per tenant"
    );
    assert!(
        store.count_tenant_prompt("t1", 101, 3).await.unwrap(),
        "per minute"
    );
    assert_eq!(store.prune_tenant_prompts(101).await.unwrap(), 2);
    assert!(store.count_tenant_prompt("t1", 101, 2).await.unwrap());
    assert!(!store.count_tenant_prompt("t1", 101, 2).await.unwrap());
}
