//! Event payloads as the log keeps them: any JSON round-trips byte for byte, NUL characters
//! included (escaped or inside text).

use super::*;

pub async fn check_payload_round_trip(store: Arc<dyn Store>) {
    let mut deep = json!({"leaf": "bottom"});
    for level in 0..60 {
        deep = json!({"level": level, "child": deep, "siblings": [level, [level], {"k": level}]});
    }
    let large: String = "αβγ 🦀 ascii \"q\" \\ \n".repeat(60_000); // ~1.3 MB
    let payloads = vec![
        deep,
        json!({
            "text": "héllo wörld — 日本語 — עברית — العربية — 🦀🚀👩‍💻 — e\u{301} — \u{feff}bom",
            "escapes": "quote \" backslash \\ slash / newline \n cr \r tab \t ctrl \u{1}\u{1f} del \u{7f}",
            "keys": {"": "empty key", "ключ": "ünïcode key", "a\"b": "quoted key"},
        }),
        json!({"large": large}),
        json!({
            "u64_max": u64::MAX,
            "i64_min": i64::MIN,
            "zero": 0,
            "neg": -1,
            "fractions": [0.1, -2.5, 1e-7, 6.02e23, 1.2345678901234567, 1.0],
        }),
        json!(null),
        json!(true),
        json!("a bare string"),
        json!(42),
        json!([]),
        json!({}),
        json!([1, "two", [3], {"four": 4}, null]),
    ];
    let events: Vec<NewEvent> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| event(&format!("kind-{i}-ünïcode"), p.clone()))
        .collect();
    let stored = store.append_events("payload-1", &events).await.unwrap();
    let back = store.read_events("payload-1", 0, 100).await.unwrap();
    assert_eq!(back.len(), payloads.len());
    for (i, (e, p)) in back.iter().zip(&payloads).enumerate() {
        assert_eq!(&e.payload, p, "payload {i} changed");
        assert_eq!(e.kind, events[i].kind);
    }
    assert_eq!(back, stored);

    // Session meta and lifecycle payloads go through the same JSON columns.
    let meta = SessionRecord {
        meta: Some(payloads[1].clone()),
        ..record("payload-meta", "tenant-payload")
    };
    assert!(store.put_session(&meta).await.unwrap());
    assert_eq!(store.get_session("payload-meta").await.unwrap(), Some(meta));
}

/// U+0000, which PostgreSQL's `jsonb` refuses, round-trips in events, lifecycle payloads and
/// session meta, as does a text that merely spells its escape.
pub async fn check_nul_round_trip(store: Arc<dyn Store>) {
    let payloads = [
        json!({"sessionId": "nul-1", "update": {"content": {"text": "a\u{0}b"}}}),
        json!(["\u{0}", {"k\u{0}": "\u{0}\u{0}"}]),
        json!({"spelled": "a \\u0000 is not a NUL"}),
        json!({"acp-gateway:json-with-nul": 1}),
    ];
    let events: Vec<NewEvent> = payloads.iter().map(|p| event("x", p.clone())).collect();
    let stored = store.append_events("nul-1", &events).await.unwrap();
    let back = store.read_events("nul-1", 0, 10).await.unwrap();
    let read: Vec<Value> = back.iter().map(|e| e.payload.to_value()).collect();
    assert_eq!(read, payloads);
    assert_eq!(back, stored);

    let lifecycle = NewLifecycleEvent {
        session_id: "nul-1".into(),
        tenant: "t".into(),
        kind: "session_updated".into(),
        payload: payloads[0].clone(),
    };
    let appended = store
        .append_lifecycle(&[lifecycle])
        .await
        .unwrap()
        .remove(0);
    let listed = store
        .read_lifecycle(None, appended.seq - 1, 1)
        .await
        .unwrap();
    assert_eq!(listed[0].payload, payloads[0]);

    let meta = SessionRecord {
        meta: Some(payloads[1].clone()),
        ..record("nul-meta", "t")
    };
    assert!(store.put_session(&meta).await.unwrap());
    assert_eq!(store.get_session("nul-meta").await.unwrap(), Some(meta));
}

/// U+0000, which PostgreSQL's `text` refuses, round-trips in a session's title and extra
/// directories (written by insert and by update, read by id and by the list) and in an event's
/// kind, as does U+10FFFF, the character the PostgreSQL store escapes U+0000 with, whatever
/// follows it.
pub async fn check_nul_in_text_round_trip(store: Arc<dyn Store>) {
    let texts = [
        "a\u{0}b",
        "\u{0}",
        "\u{0}\u{0}",
        "\u{10FFFF}",
        "\u{10FFFF}0",
        "\u{10FFFF}\u{10FFFF}\u{0}\u{10FFFF}",
        "x\u{10FFFF}\u{10F03D}y",
        "a \\u0000 is not a NUL",
    ];
    let mut expected = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let id = format!("text-{i}");
        let inserted = SessionRecord {
            title: Some((*text).to_owned()),
            additional_directories: vec![format!("/d/{text}"), "/plain".to_owned()],
            ..record(&id, "text")
        };
        assert!(store.put_session(&inserted).await.unwrap());
        assert_eq!(
            store.get_session(&id).await.unwrap().as_ref(),
            Some(&inserted)
        );
        let doubled = format!("{text}|{text}");
        let updated = store
            .update_session(&id, &|r: &mut SessionRecord| {
                r.title = Some(doubled.clone())
            })
            .await
            .unwrap()
            .expect("a live row");
        assert_eq!(updated.title.as_deref(), Some(doubled.as_str()));
        assert_eq!(
            store.get_session(&id).await.unwrap().as_ref(),
            Some(&updated)
        );
        expected.push(updated);

        let stored = store
            .append_events(&id, &[event(text, json!({"text": text}))])
            .await
            .unwrap();
        let written = store
            .log_writer()
            .append(&id, &[event(text, json!(null))], None)
            .await
            .unwrap();
        let back = store.read_events(&id, 0, 10).await.unwrap();
        assert_eq!(back, [stored, written].concat());
        assert!(back.iter().all(|e| e.kind == *text), "{back:?}");
    }
    assert_eq!(listed(store.as_ref(), "text").await, list_order(expected));
}
