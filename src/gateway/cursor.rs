//! List cursors: opaque, bound to the query (its filters and its caller) they came from.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::Error;
use crate::store::{ListCursor, ListQuery};

#[derive(Serialize, Deserialize)]
struct CursorData {
    /// [`ListCursor::snapshot`].
    n: i64,
    u: i64,
    s: String,
    /// Which query the cursor belongs to: [`query_fingerprint`].
    q: String,
}

/// A short digest of a list query's filters: a cursor is only valid for the query it came from.
fn query_fingerprint(query: &ListQuery) -> String {
    use sha2::{Digest, Sha256};
    let filters = json!([
        query.tenant,
        query.cwd,
        query.archived.unwrap_or(false),
        query.agent,
        query.owner
    ]);
    let digest = Sha256::digest(filters.to_string().as_bytes());
    URL_SAFE_NO_PAD.encode(&digest[..9])
}

/// The opaque list cursor for the page after `next` of `query`.
pub fn encode_cursor(query: &ListQuery, next: &ListCursor) -> String {
    let data = CursorData {
        n: next.snapshot,
        u: next.updated_at.timestamp_micros(),
        s: next.session_id.clone(),
        q: query_fingerprint(query),
    };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&data).expect("cursor serialises"))
}

/// Reads a cursor made by [`encode_cursor`] for the same query; anything else is a 400.
pub fn decode_cursor(query: &ListQuery, cursor: &str) -> Result<ListCursor, Error> {
    let bad = || {
        Error::Malformed("invalid cursor: pass nextCursor from a previous page unchanged".into())
    };
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    let data: CursorData = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    if data.q != query_fingerprint(query) {
        return Err(Error::Malformed(
            "invalid cursor: it belongs to a listing with other filters (cwd, archived) or \
             another caller"
                .into(),
        ));
    }
    let updated_at = DateTime::<Utc>::from_timestamp_micros(data.u).ok_or_else(bad)?;
    if data.n < 0 {
        return Err(bad());
    }
    Ok(ListCursor {
        snapshot: data.n,
        updated_at,
        session_id: data.s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_for_its_own_query_only() {
        let at = super::super::clock::now();
        let query = ListQuery {
            cwd: Some("/w".into()),
            ..ListQuery::default()
        };
        let next = ListCursor {
            snapshot: 7,
            updated_at: at,
            session_id: "sess_1".into(),
        };
        let c = encode_cursor(&query, &next);
        assert_eq!(decode_cursor(&query, &c).unwrap(), next);
        assert!(decode_cursor(&query, "garbage!").is_err());
        assert!(decode_cursor(&query, &URL_SAFE_NO_PAD.encode(b"{}")).is_err());
        let other_cwd = ListQuery {
            cwd: Some("/x".into()),
            ..ListQuery::default()
        };
        assert!(decode_cursor(&other_cwd, &c).is_err());
        let other_tenant = ListQuery {
            tenant: Some("bob".into()),
            ..query.clone()
        };
        assert!(decode_cursor(&other_tenant, &c).is_err());
    }
}
