//! The usage ledger: turns recorded and read back per session (only a tenant's, when asked),
//! the latest cumulative cost, sums by any keys over a time range with unreported figures
//! staying unknown and currencies kept apart, a tenant's day, and a budget alert claimed once
//! when many claim it at once.

use super::*;
use acp_gateway::store::{Cost, Tokens, TurnUsage, UsageKey, UsageQuery};

fn usd(amount: f64) -> Option<Cost> {
    Some(Cost {
        amount,
        currency: "USD".into(),
    })
}

fn turn(
    session: &str,
    tenant: &str,
    ended_at: i64,
    total: Option<i64>,
    cost: Option<Cost>,
) -> TurnUsage {
    TurnUsage {
        session_id: session.to_owned(),
        tenant: tenant.to_owned(),
        user: Some("ann ö".into()),
        agent: "echo".into(),
        model: None,
        ended_at,
        day: if ended_at < 2_000 {
            "2026-11-28"
        } else {
            "2026-11-29"
        }
        .into(),
        tokens: Tokens {
            input: total.map(|t| t / 2),
            output: total.map(|t| t - t / 2),
            total,
            ..Tokens::default()
        },
        cumulative: cost.clone(),
        cost,
    }
}

pub async fn check_usage_ledger(store: Arc<dyn Store>) {
    let mut first = turn("s1", "acme", 1_000, Some(10), usd(0.5));
    first.model = Some("echo-large".into());
    let second = turn("s1", "acme", 2_000, None, usd(0.25));
    let credits = TurnUsage {
        cost: Some(Cost {
            amount: 3.0,
            currency: "credits".into(),
        }),
        cumulative: None,
        ..turn("s2", "acme", 2_500, Some(4), None)
    };
    let globex = turn("s3", "globex", 3_000, Some(7), None);
    for t in [&first, &second, &credits, &globex] {
        store.record_usage(t).await.unwrap();
    }
    assert_eq!(
        store.session_usage("s1", None).await.unwrap(),
        [first.clone(), second.clone()],
        "round trip, in order"
    );
    assert!(
        store
            .session_usage("s1", Some("globex"))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.last_session_cost("s1").await.unwrap(), usd(0.25));
    assert_eq!(store.last_session_cost("s2").await.unwrap(), None);

    let sums = |tenant: Option<&str>, from, to, keys: Vec<UsageKey>| {
        let store = store.clone();
        let query = UsageQuery {
            tenant: tenant.map(str::to_owned),
            from,
            to,
            group_by: keys,
        };
        async move { store.usage_groups(&query).await.unwrap() }
    };
    let by_tenant = sums(None, i64::MIN, i64::MAX, vec![UsageKey::Tenant]).await;
    let keys: Vec<_> = by_tenant.iter().map(|g| g.key.clone()).collect();
    assert_eq!(
        keys,
        [vec![Some("acme".into())], vec![Some("globex".into())]]
    );
    let acme = &by_tenant[0].sums;
    assert_eq!(acme.turns, 3, "its currencies' rows merged");
    assert_eq!(
        acme.tokens.total,
        Some(14),
        "an unreported figure adds nothing"
    );
    assert_eq!(acme.tokens.cache_read, None, "never reported: unknown");
    let costs: Vec<(&str, f64)> = acme
        .costs
        .iter()
        .map(|c| (c.currency.as_str(), c.amount))
        .collect();
    assert_eq!(costs, [("USD", 0.75), ("credits", 3.0)]);
    assert!(by_tenant[1].sums.costs.is_empty());

    // Only acme's, in [1500, 3000), by session and model.
    let ranged = sums(
        Some("acme"),
        1_500,
        3_000,
        vec![UsageKey::Session, UsageKey::Model],
    )
    .await;
    let keys: Vec<_> = ranged.iter().map(|g| g.key.clone()).collect();
    assert_eq!(
        keys,
        [vec![Some("s1".into()), None], vec![Some("s2".into()), None]]
    );
    assert_eq!(
        ranged[0].sums.tokens.total, None,
        "its one turn reported no tokens"
    );
    let by_day = sums(
        None,
        i64::MIN,
        i64::MAX,
        vec![UsageKey::Day, UsageKey::User],
    )
    .await;
    let days: Vec<_> = by_day
        .iter()
        .map(|g| (g.key[0].clone().unwrap(), g.sums.turns))
        .collect();
    assert_eq!(
        days,
        [("2026-11-28".to_owned(), 1), ("2026-11-29".to_owned(), 3)]
    );

    let day = store.tenant_day_usage("acme", "2026-11-29").await.unwrap();
    assert_eq!((day.turns, day.tokens.total), (2, Some(4)));
    let nothing = store
        .tenant_day_usage("initech", "2026-11-29")
        .await
        .unwrap();
    assert_eq!((nothing.turns, nothing.tokens.total), (0, None));

    // Eight claims of one alert at once: one wins; another threshold is its own.
    let claims = (0..8).map(|_| {
        let store = store.clone();
        async move {
            store
                .claim_usage_alert("acme", "2026-11-29", "cost-per-day:USD", 80)
                .await
                .unwrap()
        }
    });
    let won = futures::future::join_all(claims).await;
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    assert!(
        store
            .claim_usage_alert("acme", "2026-11-29", "cost-per-day:USD", 100)
            .await
            .unwrap()
    );
}
