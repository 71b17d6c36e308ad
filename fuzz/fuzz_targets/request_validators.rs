//! Fuzzes the validators every request passes before anything reaches the agent: session ids,
//! absolute paths, workspace confinement and list cursors. Whatever they accept must satisfy
//! the rule they stand for; nothing may panic.
#![no_main]

use acp_gateway::gateway::model::{
    SessionId, confine, decode_cursor, encode_cursor, validate_abs_path,
};
use acp_gateway::store::ListQuery;
use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };

    let id_ok = (1..=256).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic());
    assert_eq!(SessionId::parse(s).is_ok(), id_ok, "session id {s:?}");

    if validate_abs_path("cwd", s).is_ok() {
        assert!(s.starts_with('/') && !s.contains('\0'), "{s:?}");
        assert!(
            s == "/" || s[1..].split('/').all(|seg| !matches!(seg, "" | "." | "..")),
            "not normalised: {s:?}"
        );
        // Confined to /tmp: accepted paths lie under it once symlinks are resolved.
        let roots = [PathBuf::from("/tmp")];
        if confine("cwd", s, &roots).is_ok() {
            let resolved = Path::new(s)
                .ancestors()
                .find_map(|a| a.canonicalize().ok())
                .unwrap_or_default();
            assert!(resolved.starts_with("/tmp"), "{s:?} escapes /tmp");
        }
    }

    let query = ListQuery {
        tenant: Some("t".into()),
        cwd: None,
        agent: None,
        archived: None,
        after: None,
        limit: 50,
    };
    if let Ok(cursor) = decode_cursor(&query, s) {
        // An accepted cursor is one the gateway could have made, and means the same again.
        let again = decode_cursor(&query, &encode_cursor(&query, &cursor)).expect("round trip");
        assert_eq!(again.snapshot, cursor.snapshot);
        assert_eq!(again.updated_at, cursor.updated_at);
        assert_eq!(again.session_id, cursor.session_id);
        let other = ListQuery {
            tenant: Some("u".into()),
            ..query
        };
        assert!(decode_cursor(&other, s).is_err(), "cursor crossed tenants");
    }
});
