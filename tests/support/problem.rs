//! Checks on the gateway's problem documents (RFC 9457), shared by the tests that expect a
//! refusal.

use serde_json::Value;

/// Asserts that an answer has status `want_status` and that its problem document's `detail`
/// contains `detail_contains`; `what` (the request, the case) leads the failure messages.
#[track_caller]
pub fn assert_problem(
    what: &str,
    status: u16,
    body: &Value,
    want_status: u16,
    detail_contains: &str,
) {
    assert_eq!(status, want_status, "{what}: {body}");
    let detail = body["detail"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no detail: {body}"));
    assert!(
        detail.contains(detail_contains),
        "{what}: the detail does not contain {detail_contains:?}: {body}"
    );
}

/// Asserts that an answer has status `want_status` and that its problem document is of the
/// kind `kind` (the end of its `type`).
#[track_caller]
pub fn assert_kind(status: u16, body: &Value, want_status: u16, kind: &str) {
    assert_eq!(status, want_status, "{body}");
    let type_ = body["type"].as_str().unwrap_or_default();
    assert!(type_.ends_with(kind), "not a {kind} problem: {body}");
}
