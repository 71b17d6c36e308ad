//! Fuzzes the validators every request passes before anything reaches the agent: session ids,
//! absolute paths, workspace confinement, list cursors, webhook URLs and the addresses a
//! webhook may reach (every IPv6 form of an IPv4 address judged like it). Whatever they accept
//! must satisfy the rule they stand for; nothing may panic.
#![no_main]

use acp_gateway::gateway::cursor::{decode_cursor, encode_cursor};
use acp_gateway::gateway::input::{SessionId, confine, validate_abs_path};
use acp_gateway::gateway::reach::{self, Allowed, Reach};
use acp_gateway::store::ListQuery;
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

fuzz_target!(|data: &[u8]| {
    if let Some(octets) = data.get(..4) {
        let v4 = Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3]);
        let [a, b] = [
            u16::from_be_bytes([octets[0], octets[1]]),
            u16::from_be_bytes([octets[2], octets[3]]),
        ];
        let class = reach::classify(IpAddr::V4(v4));
        for v6 in [
            v4.to_ipv6_mapped(),
            Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, a, b),
            Ipv6Addr::new(0x2002, a, b, 0, 0, 0, 0, 1),
        ] {
            assert_eq!(reach::classify(IpAddr::V6(v6)), class, "{v6} carries {v4}");
        }
    }
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };

    if reach::check_url(s, Allowed::default()).is_ok() {
        let lower = s.to_ascii_lowercase();
        let rest = lower
            .strip_prefix("http://")
            .or_else(|| lower.strip_prefix("https://"))
            .unwrap_or_else(|| panic!("accepted a URL that is not http(s):// {s:?}"));
        assert!(
            !rest.starts_with(['/', '\\']),
            "accepted a URL without a host: {s:?}"
        );
        assert!(s.len() <= 2048 && !s.contains('\0'), "{s:?}");
        let host = reqwest::Url::parse(s)
            .unwrap()
            .host_str()
            .unwrap()
            .to_owned();
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            assert_eq!(
                reach::classify(ip),
                Reach::Public,
                "accepted {s:?}, which is {ip}"
            );
        }
    }

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
        owner: None,
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
