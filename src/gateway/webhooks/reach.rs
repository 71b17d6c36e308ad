//! Which addresses a webhook may be sent to. Public addresses always; loopback, private and
//! other non-public ones with `--webhook-allow-private`; link-local addresses and the cloud
//! instance-metadata endpoints, the classic prize of a server-side request forgery, only with
//! `--webhook-allow-link-local`. An IPv6 address that embeds an IPv4 one (mapped, compatible,
//! NAT64, 6to4) is judged by the IPv4 address it carries.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The kinds of address, from the most to the least reachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    Public,
    /// Loopback, private, shared, reserved, documentation, multicast…
    Private,
    /// Link-local, and the instance-metadata endpoints of the clouds.
    LinkLocal,
}

/// What the webhook flags allow.
#[derive(Debug, Clone, Copy, Default)]
pub struct Allowed {
    pub private: bool,
    pub link_local: bool,
}

impl Allowed {
    /// `Err` with the reason when `ip` may not be reached.
    pub fn check(self, ip: IpAddr) -> Result<(), String> {
        match classify(ip) {
            Reach::Public => Ok(()),
            Reach::Private if self.private => Ok(()),
            Reach::LinkLocal if self.link_local => Ok(()),
            Reach::Private => Err(format!(
                "{ip} is a loopback, private or otherwise non-public address; --webhook-allow-private allows it"
            )),
            Reach::LinkLocal => Err(format!(
                "{ip} is a link-local or cloud instance-metadata address; --webhook-allow-link-local allows it"
            )),
        }
    }
}

/// A webhook URL: `http(s)://` and a host written out (the URL parser reads `http:///x` as
/// `http://x/`), at most 2048 characters, no space or control character; a host written as an
/// address must be one `allowed` lets through (a name is checked at each attempt, as it
/// resolves then). `Err` says why not.
pub fn check_url(url: &str, allowed: Allowed) -> Result<(), String> {
    let invalid = || "url must be an http(s) URL with a host, at most 2048 characters".to_owned();
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("url is not a valid URL: {e}"))?;
    let after_scheme = |scheme: &str| {
        url.get(..scheme.len())
            .filter(|head| head.eq_ignore_ascii_case(scheme))
            .map(|_| &url[scheme.len()..])
    };
    let written_host = after_scheme("http://")
        .or_else(|| after_scheme("https://"))
        .is_some_and(|rest| !rest.starts_with(['/', '\\']));
    // The parser drops spaces and control characters around and inside a URL: what is
    // stored must be what is used.
    let clean = !url.chars().any(|c| c.is_control() || c.is_whitespace());
    if !matches!(parsed.scheme(), "http" | "https") || !written_host || !clean || url.len() > 2048 {
        return Err(invalid());
    }
    let host = parsed.host_str().ok_or_else(invalid)?;
    match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        Ok(ip) => allowed
            .check(ip)
            .map_err(|why| format!("url is refused: {why}")),
        Err(_) => Ok(()),
    }
}

/// The kind of `ip`.
pub fn classify(ip: IpAddr) -> Reach {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Reach {
    let [a, b, c, _] = ip.octets();
    if ip.is_link_local() || ip == Ipv4Addr::new(100, 100, 100, 200) {
        return Reach::LinkLocal;
    }
    let non_public = ip.is_loopback()
        || ip.is_private()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (b & 0xc0) == 64) // shared address space (carrier-grade NAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b & 0xfe) == 18) // benchmarking
        || a >= 240; // reserved
    if non_public {
        Reach::Private
    } else {
        Reach::Public
    }
}

fn classify_v6(ip: Ipv6Addr) -> Reach {
    let s = ip.segments();
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    if (s[0] & 0xffc0) == 0xfe80 || ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        return Reach::LinkLocal;
    }
    let non_public = ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] == 0x64 && s[1] == 0xff9b) // NAT64 for local use (64:ff9b:1::/48)
        || (s[0] == 0x2001 && s[1] == 0) // Teredo
        || (s[0] == 0x2001 && s[1] == 0xdb8) // documentation
        || (s[0] == 0x100 && s[1..4] == [0, 0, 0]) // discard only
        || s[..6] == [0; 6]; // the rest of ::/96
    if non_public {
        Reach::Private
    } else {
        Reach::Public
    }
}

/// The IPv4 address an IPv6 one carries: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
/// (`::a.b.c.d`, not `::` or `::1`), the NAT64 well-known prefix (`64:ff9b::/96`) and 6to4
/// (`2002:AABB:CCDD::/48`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if s[..5] == [0; 5] && (s[5] == 0xffff || (s[5] == 0 && s[6] != 0)) {
        return Some(v4(s[6], s[7]));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(v4(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return Some(v4(s[1], s[2]));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(text: &str) -> Reach {
        classify(text.parse().unwrap())
    }

    #[test]
    fn every_form_of_a_refused_address_is_refused() {
        for public in [
            "93.184.215.14",
            "2606:2800:21f:cb07:6820:80da:af6b:8b2c",
            "64:ff9b::5db8:d70e",
            "2002:5db8:d70e::1",
            "::ffff:93.184.215.14",
        ] {
            assert_eq!(reach(public), Reach::Public, "{public}");
        }
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "2002:a00:1::5",
            "64:ff9b:1::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:db8::1",
        ] {
            assert_eq!(reach(private), Reach::Private, "{private}");
        }
        for metadata in [
            "169.254.169.254",
            "169.254.0.1",
            "100.100.100.200",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:a9fe:a9fe::",
        ] {
            assert_eq!(reach(metadata), Reach::LinkLocal, "{metadata}");
        }
    }

    #[test]
    fn the_flags_open_one_class_each() {
        let ip = |t: &str| t.parse::<IpAddr>().unwrap();
        let none = Allowed::default();
        let private = Allowed {
            private: true,
            link_local: false,
        };
        let link_local = Allowed {
            private: false,
            link_local: true,
        };
        assert!(none.check(ip("8.8.8.8")).is_ok());
        assert!(none.check(ip("127.0.0.1")).is_err());
        assert!(private.check(ip("127.0.0.1")).is_ok());
        let refused = private.check(ip("169.254.169.254")).unwrap_err();
        assert!(refused.contains("--webhook-allow-link-local"), "{refused}");
        assert!(link_local.check(ip("169.254.169.254")).is_ok());
        assert!(link_local.check(ip("10.0.0.1")).is_err());
    }
}
