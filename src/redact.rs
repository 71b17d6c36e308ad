//! Credentials kept out of what the gateway writes to its log and shows back: a URL's userinfo
//! (a user name and password, or a token as the user name) becomes `***`, and so does the value
//! of an `access_token` query parameter (how a browser's event stream carries its key). One
//! helper for every URL the gateway names — webhook and remote agent URLs, the database URL,
//! the OpenID issuer, the OTLP endpoint — whether the URL stands alone ([`url`]) or inside a
//! message, such as a client library's error that names the URL it failed on ([`text`]).

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

/// What stands in for a credential.
pub const MASK: &str = "***";

/// A URL's userinfo: the scheme and `//`, then anything up to an `@` that comes before the
/// path, query, fragment or the end of the word.
static USERINFO: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/?#]*@").expect("the userinfo pattern")
});

/// An `access_token` query parameter's value.
static ACCESS_TOKEN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)([?&]access_token=)[^&#\s]*").expect("the access_token pattern")
});

/// `url` with its userinfo and any `access_token` replaced by `***` (anything else as it is).
pub fn url(url: &str) -> String {
    text(url).into_owned()
}

/// `text` with the userinfo of every URL in it, and every `access_token` query value, replaced
/// by `***`; borrowed when there is none.
pub fn text(text: &str) -> Cow<'_, str> {
    let text = USERINFO.replace_all(text, format!("${{1}}{MASK}@"));
    match ACCESS_TOKEN.replace_all(&text, format!("${{1}}{MASK}")) {
        Cow::Borrowed(_) => text,
        Cow::Owned(done) => Cow::Owned(done),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_and_access_tokens_are_masked() {
        assert_eq!(
            url("https://user:pa55@hooks.example/a?x=1"),
            "https://***@hooks.example/a?x=1"
        );
        assert_eq!(
            url("postgres://postgres:hunter2@127.0.0.1:5432/db"),
            "postgres://***@127.0.0.1:5432/db"
        );
        assert_eq!(
            url("wss://tok3n@agents.example/acp"),
            "wss://***@agents.example/acp"
        );
        assert_eq!(
            url("http://127.0.0.1:8080/events?after=3&access_token=k3y&x=1"),
            "http://127.0.0.1:8080/events?after=3&access_token=***&x=1"
        );
        assert_eq!(
            text("error sending request for url (http://u:p@h:1/v1/traces): refused"),
            "error sending request for url (http://***@h:1/v1/traces): refused"
        );
        assert_eq!(
            text("two: http://a:b@x/ and ws://c@y/?q=a@b"),
            "two: http://***@x/ and ws://***@y/?q=a@b"
        );
        for plain in [
            "http://example.com/a@b",
            "mail me at someone@example.com",
            "sqlite:/tmp/gw.db",
            "http://[::1]:8080/x",
        ] {
            assert!(matches!(text(plain), Cow::Borrowed(_)), "{plain}");
        }
    }
}
