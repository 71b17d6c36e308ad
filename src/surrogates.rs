//! Lone UTF-16 surrogates in JSON text, carried through the gateway's Rust strings and given
//! back as they came.
//!
//! JSON allows a string escape `\ud83d` that is half of a surrogate pair (JavaScript's
//! `JSON.stringify` writes one for a string cut inside a pair), but a Rust string cannot hold
//! it. So [`escape`] rewrites such JSON text before it is parsed: a lone surrogate S becomes
//! [`MARK`] (U+10FFFF, a noncharacter, which Unicode reserves for such internal use) followed by
//! the private-use character U+10F000 + (S − 0xD800); a genuine U+10FFFF becomes two, so that
//! nothing is ambiguous. [`restore`] turns serialized JSON back: `MARK, U+10F000 + n` into the
//! escape `\udXXX` (lowercase hex, as serde_json writes escapes) and `MARK, MARK` into one.
//!
//! Text comes in through [`escape`] (the agent's lines, clients' JSON bodies) and goes out
//! through [`restore`] (lines to the agent, JSON responses, SSE frames), each exactly once:
//! restoring twice would read a genuine U+10FFFF as a mark.

use std::borrow::Cow;
use std::sync::LazyLock;

use memchr::memmem::Finder;

/// U+10FFFF: the escape mark.
pub const MARK: char = '\u{10FFFF}';
/// [`MARK`] in UTF-8.
const MARK_UTF8: &[u8] = "\u{10FFFF}".as_bytes();
/// The character a mark puts before the surrogate 0xD800 + n is `FIRST + n`.
const FIRST: u32 = 0x10F000;
/// How many surrogates there are (0xD800..=0xDFFF).
const SURROGATES: u32 = 0x800;

static FIND_MARK: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(MARK_UTF8));
static FIND_UNICODE_ESCAPE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\\u"));

/// `json` (JSON text, valid or not) with every lone surrogate escape and every U+10FFFF written
/// as the module documentation says, ready for a JSON parser; borrowed when it has neither.
///
/// Costs two scans of `json` for what needs a look, `\u` followed by `d`/`D` (an escape in
/// 0xD000..=0xDFFF) or a raw U+10FFFF; only then is it rewritten.
pub fn escape(json: &str) -> Cow<'_, str> {
    let bytes = json.as_bytes();
    let surrogate_escape = FIND_UNICODE_ESCAPE
        .find_iter(bytes)
        .any(|at| matches!(bytes.get(at + 2), Some(b'd' | b'D')));
    if !surrogate_escape && FIND_MARK.find(bytes).is_none() {
        return Cow::Borrowed(json);
    }
    match escape_all(json) {
        Some(escaped) => Cow::Owned(escaped),
        None => Cow::Borrowed(json),
    }
}

/// [`escape`]'s rewrite; `None` when there was nothing to rewrite after all (a valid pair).
fn escape_all(json: &str) -> Option<String> {
    let bytes = json.as_bytes();
    let mut out = String::new();
    // `json[copied..at]` is copied as it is before each rewrite; `at` is then always on a
    // character boundary (a backslash, or the first byte of a mark).
    let mut copied = 0;
    let mut at = 0;
    while at < bytes.len() {
        let (len, replacement) = match bytes[at] {
            b'\\' if bytes.get(at + 1) == Some(&b'u') => {
                let Some(unit) = hex4(bytes, at + 2) else {
                    at += 2; // not an escape: left for the parser to refuse
                    continue;
                };
                match unit {
                    0xD800..=0xDBFF => match low_after(bytes, at + 6) {
                        Some(low)
                            if 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                                == u32::from(MARK) =>
                        {
                            (12, [MARK, MARK])
                        }
                        Some(_) => {
                            at += 12; // a pair, for the parser
                            continue;
                        }
                        None => (6, lone(unit)),
                    },
                    0xDC00..=0xDFFF => (6, lone(unit)),
                    _ => {
                        at += 6;
                        continue;
                    }
                }
            }
            // Any other escape: its second character does not start one.
            b'\\' => {
                at += if bytes.get(at + 1).is_some_and(u8::is_ascii) {
                    2
                } else {
                    1
                };
                continue;
            }
            _ if bytes[at..].starts_with(MARK_UTF8) => (MARK_UTF8.len(), [MARK, MARK]),
            _ => {
                at += 1;
                continue;
            }
        };
        out.reserve(json.len() - copied + 8);
        out.push_str(&json[copied..at]);
        out.extend(replacement);
        at += len;
        copied = at;
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&json[copied..]);
    Some(out)
}

/// What a lone surrogate `unit` becomes: the mark and its character.
fn lone(unit: u32) -> [char; 2] {
    let c = char::from_u32(FIRST + unit - 0xD800).expect("a private-use character");
    [MARK, c]
}

/// The four hex digits at `bytes[at..at + 4]`, as a number.
fn hex4(bytes: &[u8], at: usize) -> Option<u32> {
    let digits = std::str::from_utf8(bytes.get(at..at + 4)?).ok()?;
    if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

/// The low surrogate escaped at `bytes[at..]` (`\uDC00`…`\uDFFF`), if there is one.
fn low_after(bytes: &[u8], at: usize) -> Option<u32> {
    if bytes.get(at..at + 2)? != b"\\u" {
        return None;
    }
    hex4(bytes, at + 2).filter(|u| (0xDC00..=0xDFFF).contains(u))
}

/// Serialized JSON (or any text made of it, such as SSE frames) with the marks of [`escape`]
/// turned back into what was escaped; borrowed when it holds no mark (one scan). A mark followed
/// by neither a mark nor a surrogate's character is left as it is.
pub fn restore(json: &[u8]) -> Cow<'_, [u8]> {
    let Some(first) = FIND_MARK.find(json) else {
        return Cow::Borrowed(json);
    };
    let mut out = Vec::with_capacity(json.len());
    let mut copied = 0;
    let mut at = first;
    loop {
        out.extend_from_slice(&json[copied..at]);
        let after = &json[at + MARK_UTF8.len()..];
        copied = at + MARK_UTF8.len();
        if after.starts_with(MARK_UTF8) {
            out.extend_from_slice(MARK_UTF8);
            copied += MARK_UTF8.len();
        } else if let Some(unit) = surrogate_at(after) {
            out.extend_from_slice(format!("\\u{unit:04x}").as_bytes());
            copied += 4;
        } else {
            out.extend_from_slice(MARK_UTF8);
        }
        match FIND_MARK.find(&json[copied..]) {
            Some(next) => at = copied + next,
            None => break,
        }
    }
    out.extend_from_slice(&json[copied..]);
    Cow::Owned(out)
}

/// The surrogate whose character (see [`escape`]) starts `bytes`, if one does.
fn surrogate_at(bytes: &[u8]) -> Option<u32> {
    let c = std::str::from_utf8(bytes.get(..4)?).ok()?.chars().next()?;
    let n = u32::from(c).checked_sub(FIRST)?;
    (n < SURROGATES).then_some(0xD800 + n)
}

/// The first lone surrogate [`escape`] marked in `escaped`, if any (a genuine U+10FFFF, written
/// as two marks, is none).
pub fn first_lone(escaped: &str) -> Option<u32> {
    let bytes = escaped.as_bytes();
    let mut from = 0;
    while let Some(at) = FIND_MARK.find(&bytes[from..]) {
        let after = &bytes[from + at + MARK_UTF8.len()..];
        if after.starts_with(MARK_UTF8) {
            from += at + 2 * MARK_UTF8.len();
            continue;
        }
        if let Some(unit) = surrogate_at(after) {
            return Some(unit);
        }
        from += at + MARK_UTF8.len();
    }
    None
}

/// [`restore`] for text the gateway builds (an SSE frame): a `String` stays one.
pub fn restore_string(text: String) -> String {
    match restore(text.as_bytes()) {
        Cow::Borrowed(_) => text,
        // Only whole marks and whole characters were replaced, by ASCII or by a mark.
        Cow::Owned(bytes) => String::from_utf8(bytes).expect("restored text stays UTF-8"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lone_surrogates_are_found_and_marks_are_not_taken_for_them() {
        assert_eq!(first_lone(&escape(r#"{"a":"x\ud83dy"}"#)), Some(0xD83D));
        assert_eq!(first_lone(&escape(r#"{"a":"\udc00"}"#)), Some(0xDC00));
        assert_eq!(first_lone(&escape(r#"{"a":"\ud83d\ude00"}"#)), None);
        assert_eq!(
            first_lone(&escape("{\"a\":\"\u{10FFFF}\u{10F000}\"}")),
            None
        );
        assert_eq!(
            first_lone(&escape("{\"a\":\"\u{10FFFF}\u{10FFFF}\\ud800\"}")),
            Some(0xD800)
        );
    }

    /// Escaped, parsed and serialized again: what goes out is what came in, escapes included.
    fn round_trip(json: &str) -> String {
        let value: serde_json::Value = serde_json::from_str(&escape(json)).unwrap();
        restore_string(value.to_string())
    }

    #[test]
    fn lone_surrogates_come_back_as_the_escapes_they_were() {
        for (sent, served) in [
            (r#""ab\ud83d""#, r#""ab\ud83d""#),
            (r#""\udc00x""#, r#""\udc00x""#),
            (r#""\uDBFF\uD83D""#, r#""\udbff\ud83d""#),
            (r#""\ud83d\ud83d\ude00""#, "\"\\ud83d\u{1F600}\""),
            (r#""\udfff\ud800""#, r#""\udfff\ud800""#),
            (r#"{"\ud83d":["\ud83d",1]}"#, r#"{"\ud83d":["\ud83d",1]}"#),
            (r#""a\\ud83d""#, r#""a\\ud83d""#),
            (r#""a\\\ud83d""#, r#""a\\\ud83d""#),
            (r#""\ud7ff\ue000""#, "\"\u{D7FF}\u{E000}\""),
        ] {
            assert_eq!(round_trip(sent), served, "{sent}");
        }
    }

    #[test]
    fn the_mark_and_its_characters_sent_for_themselves_stay_themselves() {
        let genuine = "\"\u{10FFFF}\u{10F03D} \u{10FFFF}\u{10FFFF} \u{10FFFF}\"";
        assert_eq!(round_trip(genuine), genuine);
        // U+10FFFF escaped as a pair, followed by the character that stands for 0xD83D.
        assert_eq!(
            round_trip(r#""\udbff\udfff\udbfc\udc3d""#),
            "\"\u{10FFFF}\u{10F03D}\""
        );
        let escaped = escape("\"\u{10FFFF}\\ud83d\"");
        assert_eq!(escaped, "\"\u{10FFFF}\u{10FFFF}\u{10FFFF}\u{10F03D}\"");
    }

    #[test]
    fn text_without_either_is_not_copied() {
        let plain = r#"{"text":"caf\u00e9 \"\\u\" \ud83d\ude00 \uD83D\uDE00 ü"}"#;
        assert!(matches!(escape(plain), Cow::Borrowed(_)));
        assert!(matches!(escape(r#"{"a":"\n\u001b"}"#), Cow::Borrowed(_)));
        assert!(matches!(restore(b"{\"a\":\"\xc3\xbc\"}"), Cow::Borrowed(_)));
    }

    #[test]
    fn broken_escapes_are_left_to_the_parser() {
        for broken in [
            r#""\ud8"#,
            r#""\u"#,
            r#""\"#,
            "\"\\\u{10FFFF}\"",
            r#""\uzzzz\ud83d""#,
        ] {
            let escaped = escape(broken);
            assert!(
                serde_json::from_str::<serde_json::Value>(&escaped).is_err(),
                "{broken}"
            );
        }
    }
}
