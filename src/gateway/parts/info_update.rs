//! `session_info_update` as the cache applies it: an absent field unchanged, `null` clearing it,
//! `_meta` merged recursively.

use chrono::{DateTime, SubsecRound, Utc};
use serde_json::{Map, Value};

use crate::store::SessionRecord;

/// Applies a `session_info_update` to a cached row: an absent field is unchanged, `null`
/// clears it, `_meta` merges recursively with `null` deleting a key. `updatedAt` is taken from
/// the update when valid, else set to `now` (the update itself is activity).
pub fn apply_info_update(record: &mut SessionRecord, update: &Value, now: DateTime<Utc>) {
    if let Some(title) = update.get("title") {
        record.title = title.as_str().map(str::to_owned);
    }
    record.updated_at = update
        .get("updatedAt")
        .and_then(Value::as_str)
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc).trunc_subsecs(6))
        .unwrap_or(now);
    match update.get("_meta") {
        None => {}
        Some(Value::Null) => record.meta = None,
        Some(patch) => {
            let mut base = record.meta.take().unwrap_or(Value::Object(Map::new()));
            merge(&mut base, patch);
            record.meta = Some(base);
        }
    }
}

/// Recursive JSON merge: objects merge key by key, `null` deletes, anything else replaces.
fn merge(base: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *base = patch.clone();
        return;
    };
    if !base.is_object() {
        // A patch object never stores its nulls: it merges into an empty object.
        *base = Value::Object(Map::new());
    }
    let Value::Object(b) = base else {
        unreachable!()
    };
    for (k, v) in p {
        if v.is_null() {
            b.remove(k);
        } else {
            merge(b.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// A session of the gateway's, recorded at `at` (for tests).
#[cfg(test)]
pub(in crate::gateway) fn recorded(tenant: &str, cwd: &str, at: DateTime<Utc>) -> SessionRecord {
    let (id, agent) = ("s".into(), "default".into());
    let origin = crate::store::Origin::Gateway;
    SessionRecord::new(id, tenant.into(), cwd.into(), agent, origin, at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record() -> SessionRecord {
        let t = DateTime::<Utc>::from_timestamp(1_700_000_000, 0).unwrap();
        SessionRecord {
            title: Some("old".into()),
            meta: Some(json!({"a": 1, "n": {"x": 1, "y": 2}})),
            ..recorded("default", "/w", t)
        }
    }

    #[test]
    fn info_update_semantics() {
        let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        let cases: Vec<(Value, Option<&str>, Option<Value>)> = vec![
            (
                json!({}),
                Some("old"),
                Some(json!({"a": 1, "n": {"x": 1, "y": 2}})),
            ),
            (
                json!({"title": "new"}),
                Some("new"),
                Some(json!({"a": 1, "n": {"x": 1, "y": 2}})),
            ),
            (
                json!({"title": null}),
                None,
                Some(json!({"a": 1, "n": {"x": 1, "y": 2}})),
            ),
            (json!({"_meta": null}), Some("old"), None),
            (
                json!({"_meta": {"b": 2}}),
                Some("old"),
                Some(json!({"a": 1, "b": 2, "n": {"x": 1, "y": 2}})),
            ),
            (
                json!({"_meta": {"a": null}}),
                Some("old"),
                Some(json!({"n": {"x": 1, "y": 2}})),
            ),
            (
                json!({"_meta": {"n": {"y": null, "z": 3}}}),
                Some("old"),
                Some(json!({"a": 1, "n": {"x": 1, "z": 3}})),
            ),
            (
                json!({"_meta": {"n": 5}}),
                Some("old"),
                Some(json!({"a": 1, "n": 5})),
            ),
        ];
        for (update, title, meta) in cases {
            let mut r = record();
            apply_info_update(&mut r, &update, now);
            assert_eq!(r.title.as_deref(), title, "{update}");
            assert_eq!(r.meta, meta, "{update}");
            assert_eq!(r.updated_at, now, "{update}");
        }
        let mut r = record();
        apply_info_update(&mut r, &json!({"updatedAt": "2025-10-29T14:22:15Z"}), now);
        assert_eq!(r.updated_at.to_rfc3339(), "2025-10-29T14:22:15+00:00");
        let mut r = record();
        r.meta = None;
        apply_info_update(&mut r, &json!({"_meta": {"k": {"d": null, "e": 1}}}), now);
        assert_eq!(r.meta, Some(json!({"k": {"e": 1}})));
    }
}
