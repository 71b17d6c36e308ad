//! What the agent writes, line by line, as [`Inbound`] messages: a borrowed parse of the
//! JSON-RPC envelope, in which a notification's params stay the agent's own text (checked as
//! serde_json would parse them into a value, without building one, reading on the way the
//! session and kind the gateway routes them by).

use serde_json::Value;
use serde_json::value::RawValue;

use super::errors::RpcError;

/// One message from the agent, in the order it was written.
#[derive(Debug)]
pub enum Inbound {
    Response {
        id: u64,
        /// A result as the agent wrote it: the caller reads what it needs of it.
        result: Result<Box<RawValue>, RpcError>,
    },
    Notification {
        method: String,
        /// As the agent wrote it (the log keeps this text).
        params: Box<RawValue>,
        /// What the gateway reads of it, found while checking it.
        head: NotificationHead,
    },
    Request {
        id: Value,
        method: String,
        params: Value,
    },
}

/// A JSON-RPC message's members, borrowed from its line: nothing is built for what is passed
/// on whole (a notification's params).
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// Parses one line from the agent. `Err` carries a description for the log. Lone UTF-16
/// surrogates in its strings are kept (see [`crate::surrogates`]). A notification's params stay
/// the line's own text.
pub fn parse_line(line: &str) -> Result<Inbound, String> {
    let line = crate::surrogates::escape(line);
    // A struct also deserializes from an array, which is no JSON-RPC message.
    if !line
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return Err(match serde_json::from_str::<serde::de::IgnoredAny>(&line) {
            Ok(_) => "not a JSON object".into(),
            Err(e) => format!("not JSON: {e}"),
        });
    }
    // Pieces kept as text are skipped without recursion, to any depth.
    let msg: Envelope<'_> = match serde_json::from_str(&line) {
        Ok(msg) => msg,
        Err(e) if e.is_data() => return Err(format!("not a JSON-RPC object: {e}")),
        Err(e) => return Err(format!("not JSON: {e}")),
    };
    if msg.jsonrpc.as_deref() != Some("2.0") {
        return Err("missing jsonrpc: \"2.0\"".into());
    }
    // What the gateway keeps or wraps is held to serde_json's depth as a whole line, so that
    // any piece of it can later be read as a value. A result is its caller's to read, which
    // fails as a call when it cannot (see `PendingCall::wait`): a page of a thousand listed
    // sessions is not scanned twice more for it.
    let answer = msg.result.is_some() && msg.method.is_none();
    if !answer && nested_deeper_than(&line, MAX_DEPTH) {
        return Err("not JSON: recursion limit exceeded".into());
    }
    let value = |raw: Option<&RawValue>| {
        raw.map_or(Ok(Value::Null), |r| serde_json::from_str(r.get()))
            .map_err(|e| format!("not JSON: {e}"))
    };
    let id = value(msg.id)?;
    let id = (!id.is_null()).then_some(id);
    let method = match value(msg.method)? {
        Value::String(m) => Some(m),
        _ => None,
    };
    match (method, id) {
        (Some(method), None) => {
            let (params, head) = match msg.params {
                Some(params) => {
                    let head = NotificationHead::read(params.get())
                        .map_err(|e| format!("not JSON: {e}"))?;
                    (params.to_owned(), head)
                }
                None => (null(), NotificationHead::default()),
            };
            Ok(Inbound::Notification {
                method,
                params,
                head,
            })
        }
        (Some(method), Some(id)) => Ok(Inbound::Request {
            id,
            method,
            params: value(msg.params)?,
        }),
        (None, Some(id)) => {
            let id = id.as_u64().ok_or("response id is not one of ours")?;
            let result = match msg.error {
                Some(err) => Err(serde_json::from_str::<RpcError>(err.get())
                    .map_err(|e| format!("invalid error object: {e}"))?),
                None => Ok(msg.result.map_or_else(null, RawValue::to_owned)),
            };
            Ok(Inbound::Response { id, result })
        }
        (None, None) => Err("neither a request, a response nor a notification".into()),
    }
}

/// What the gateway reads of a notification's params, in the one pass that checks them (see
/// [`NotificationHead::read`]): the session it is about and the kind of update, when they are
/// strings. For a key given twice the last counts, as in a parse into a value.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NotificationHead {
    /// `sessionId`.
    pub session_id: Option<String>,
    /// `update.sessionUpdate`.
    pub kind: Option<String>,
}

impl NotificationHead {
    /// Checks, without building a value, that serde_json would parse `params` into one (the
    /// envelope's scan let through what no value can hold, such as the number `1e400`), and
    /// reads its head on the way.
    pub fn read(params: &str) -> serde_json::Result<Self> {
        let mut head = NotificationHead::default();
        let mut de = serde_json::Deserializer::from_str(params);
        serde::de::DeserializeSeed::deserialize(Any(Level::Params(&mut head)), &mut de)?;
        de.end()?;
        Ok(head)
    }
}

/// What is kept of a value, by where it sits.
enum Level<'h> {
    /// The params: `sessionId` and `update` are read.
    Params(&'h mut NotificationHead),
    /// `update`: its `sessionUpdate` is read.
    Update(&'h mut Option<String>),
    /// A string is kept.
    Text,
    /// Nothing: only checked.
    Other,
}

/// Any JSON value, checked; a string is returned at [`Level::Text`].
struct Any<'h>(Level<'h>);

/// The keys [`Any`] looks for.
enum Field {
    SessionId,
    Update,
    SessionUpdate,
    Other,
}

impl<'de> serde::de::DeserializeSeed<'de> for Any<'_> {
    type Value = Option<String>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Any<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(matches!(self.0, Level::Text).then(|| v.to_owned()))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element_seed(Any(Level::Other))?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut level = self.0;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match (&mut level, key) {
                (Level::Params(head), Field::SessionId) => {
                    head.session_id = map.next_value_seed(Any(Level::Text))?;
                }
                (Level::Params(head), Field::Update) => {
                    head.kind = None;
                    map.next_value_seed(Any(Level::Update(&mut head.kind)))?;
                }
                (Level::Update(kind), Field::SessionUpdate) => {
                    **kind = map.next_value_seed(Any(Level::Text))?;
                }
                _ => {
                    map.next_value_seed(Any(Level::Other))?;
                }
            }
        }
        Ok(None)
    }
}

/// A key of an object, as far as [`Any`] cares.
struct KeySeed;

impl<'de> serde::de::DeserializeSeed<'de> for KeySeed {
    type Value = Field;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Field, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeySeed {
    type Value = Field;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object key")
    }
    fn visit_str<E>(self, v: &str) -> Result<Field, E> {
        Ok(match v {
            "sessionId" => Field::SessionId,
            "update" => Field::Update,
            "sessionUpdate" => Field::SessionUpdate,
            _ => Field::Other,
        })
    }
}
/// The deepest nesting of arrays and objects serde_json parses into a value.
const MAX_DEPTH: usize = 127;

/// Whether arrays and objects in JSON text `text` nest deeper than `limit` (strings skipped).
fn nested_deeper_than(text: &str, limit: usize) -> bool {
    let bytes = text.as_bytes();
    if bytes.iter().filter(|&&b| b == b'[' || b == b'{').count() <= limit {
        return false;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// JSON `null`, as a raw value.
fn null() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).expect("null is JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_kind_and_rejects_garbage() {
        assert!(matches!(
            parse_line(r#"{"jsonrpc":"2.0","method":"session/update","params":{"x":1}}"#),
            Ok(Inbound::Notification { method, .. }) if method == "session/update"
        ));
        assert!(matches!(
            parse_line(r#"{"jsonrpc":"2.0","id":"a","method":"fs/read_text_file","params":{}}"#),
            Ok(Inbound::Request { .. })
        ));
        assert!(matches!(
            parse_line(r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32002,"message":"nope"}}"#),
            Ok(Inbound::Response {
                id: 7,
                result: Err(RpcError { code: -32002, .. })
            })
        ));
        assert!(parse_line("hello").is_err());
        assert!(parse_line(r#"{"id":1,"result":{}}"#).is_err());
        assert!(parse_line(r#"[1,2]"#).is_err());
    }

    /// A notification's head is what a parse into a value finds: the last of a key given
    /// twice, nothing for a non-string, keys compared after their escapes are read.
    #[test]
    fn a_notification_head_is_what_a_value_holds() {
        let head = |params: &str| {
            let line =
                format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{params}}}"#);
            let Ok(Inbound::Notification { head, .. }) = parse_line(&line) else {
                panic!("not parsed: {line}");
            };
            (head.session_id, head.kind)
        };
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(
            head(
                r#"{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"sessionId":"no"}}}"#
            ),
            (some("s1"), some("agent_message_chunk"))
        );
        assert_eq!(
            head(r#"{"sessionId":"a","sessionId":"b","update":{"sessionUpdate":"x"},"update":{}}"#),
            (some("b"), None)
        );
        assert_eq!(head(r#"{"sessionId":7,"update":"plan"}"#), (None, None));
        assert_eq!(
            head(r#"{"session\u0049d":"s\u00e9","update":{"sessionUpdate":"plan"}}"#),
            (some("s\u{e9}"), some("plan"))
        );
        assert_eq!(head(r#"[{"sessionId":"s1"}]"#), (None, None));
        assert_eq!(head(r#"{"update":{"sessionId":"s1"}}"#), (None, None));
    }

    /// An answer is its caller's to read: kept as the agent's text whatever it holds; what no
    /// value can hold fails the call, not the line (which would leave the call unanswered).
    #[test]
    fn an_answer_is_kept_as_text_and_read_by_its_caller() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for result in ["1e400", &deep, r#"{"sessions":[],"nextCursor":null}"#] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":3,"result":{result}}}"#);
            let Ok(Inbound::Response {
                id: 3,
                result: Ok(raw),
            }) = parse_line(&line)
            else {
                panic!("{result}");
            };
            assert_eq!(raw.get(), result);
            assert_eq!(
                super::super::answer_value(&raw).is_ok(),
                serde_json::from_str::<Value>(result).is_ok(),
                "{result}"
            );
        }
    }

    /// A line parses exactly when it is a JSON object a parser to values accepts: an array of
    /// the right members, or nesting past the parser's depth limit, is garbage either way.
    #[test]
    fn a_line_is_a_message_only_if_it_is_a_json_object() {
        assert!(parse_line(r#"["2.0", 1, "session/update"]"#).is_err());
        assert!(parse_line(r#"  {"jsonrpc":"2.0","method":"m"}"#).is_ok());
        let brackets_in_a_string = format!(
            r#"{{"jsonrpc":"2.0","method":"m","params":"{}"}}"#,
            "[{".repeat(300)
        );
        assert!(parse_line(&brackets_in_a_string).is_ok());
        for params in [
            "1e400",
            "[-1e999]",
            r#"{"a":1.5e308}"#,
            "123456789012345678901234567890",
        ] {
            let line = format!(r#"{{"jsonrpc":"2.0","method":"m","params":{params}}}"#);
            assert_eq!(
                parse_line(&line).is_ok(),
                serde_json::from_str::<Value>(&line).is_ok(),
                "{params}"
            );
        }
        for depth in [100, 125, 126, 127, 128, 200, 5000] {
            let params = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let line = format!(r#"{{"jsonrpc":"2.0","method":"m","params":{params}}}"#);
            assert_eq!(
                parse_line(&line).is_ok(),
                serde_json::from_str::<Value>(&line).is_ok(),
                "depth {depth}"
            );
        }
    }
}
