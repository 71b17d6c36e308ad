//! Archives built here to attack the unpacker and the installer: symlink chains that lead out
//! together, a link named as the installer's marker, data hidden in headers and in entries
//! that are not files, modes that would let others write. Each is refused (or defused) and
//! writes nothing outside its folder.

use std::os::unix::fs::PermissionsExt;

use tar::EntryType::{Directory, GNULongName, Regular, Symlink, XGlobalHeader, XHeader};

use super::tests::{Entry, binary, good_entries, installer, listing, quiet, refused, runs, tar_gz};
use crate::install::archive::UnpackLimits;
use crate::install::error::InstallError;
use crate::install::links::{Escape, resolve_beneath};
use crate::install::staging::write_new;

/// The name of the installer's marker file in a version's folder.
const MARKER: &str = ".acp-gateway-installed.json";

/// A chain of links that lexically stays inside, and on disk climbs out: `up` leads back to
/// the folder's root, and the marker's name leads through it three levels above the root.
fn chain_out(marker_first: bool) -> Vec<Entry<'static>> {
    let dirs: Vec<Entry> = vec![
        ("a/", Directory, 0o755, b""),
        ("a/b/", Directory, 0o755, b""),
        ("a/b/c/", Directory, 0o755, b""),
        ("a/b/c/d/", Directory, 0o755, b""),
    ];
    let up: Entry = ("a/b/c/d/up", Symlink, 0o777, b"../../../..");
    let marker: Entry = (MARKER, Symlink, 0o777, b"a/b/c/d/up/../../../pwned");
    let mut entries = dirs;
    if marker_first {
        entries.insert(0, marker);
        entries.push(up);
    } else {
        entries.push(up);
        entries.push(marker);
    }
    entries.extend(good_entries());
    entries
}

#[tokio::test]
async fn a_symlink_chain_that_leads_out_together_is_refused_and_nothing_is_written_out() {
    for marker_first in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let archive = tmp.path().join("agent.tar.gz");
        tar_gz(&archive, &chain_out(marker_first));
        let error = refused(tmp.path(), &binary(&archive, "bin/agent")).await;
        assert!(matches!(error, InstallError::Unsafe(_)), "{error}");
        assert!(error.to_string().contains(MARKER), "{error}");
        assert!(!tmp.path().join("pwned").exists(), "written outside");
        assert!(!tmp.path().join("root").join("pwned").exists());
    }
}

#[test]
fn links_are_followed_link_by_link_from_the_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::create_dir_all(root.join("a/b/lib/v1")).unwrap();
    std::os::unix::fs::symlink("../..", root.join("a/b/up")).unwrap();
    std::os::unix::fs::symlink("v1", root.join("a/b/lib/current")).unwrap();
    std::os::unix::fs::symlink("a/b/up/..", root.join("out")).unwrap();
    std::os::unix::fs::symlink("a/b/up/a/b/lib/current/x", root.join("in")).unwrap();
    std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("abs")).unwrap();
    assert_eq!(
        resolve_beneath(root, "in".as_ref()),
        Ok("a/b/lib/v1/x".into())
    );
    assert_eq!(resolve_beneath(root, "a/b/up".as_ref()), Ok("".into()));
    assert_eq!(resolve_beneath(root, "out".as_ref()), Err(Escape::Outside));
    assert_eq!(resolve_beneath(root, "abs".as_ref()), Err(Escape::Outside));
    assert_eq!(
        resolve_beneath(root, "loop".as_ref()),
        Err(Escape::TooManyLinks)
    );
}

#[tokio::test]
async fn links_made_of_links_that_stay_inside_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.tar.gz");
    let mut entries = good_entries();
    let chain: [Entry; 6] = [
        ("lib/", Directory, 0o755, b""),
        ("lib/v1/", Directory, 0o755, b""),
        ("lib/v1/agent", Regular, 0o755, super::tests::SCRIPT),
        ("lib/current", Symlink, 0o777, b"v1"),
        ("bin/again", Symlink, 0o777, b"../lib/current/agent"),
        ("bin/dangling", Symlink, 0o777, b"../lib/not-yet"),
    ];
    entries.extend(chain);
    tar_gz(&archive, &entries);
    let installed = installer(&tmp.path().join("root"))
        .install("agent", &binary(&archive, "bin/again"), None, &quiet)
        .await
        .unwrap();
    runs(&installed.program);
}

#[tokio::test]
async fn a_link_named_as_the_marker_is_replaced_and_never_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.tar.gz");
    let mut entries = good_entries();
    entries.push((MARKER, Symlink, 0o777, b"README"));
    tar_gz(&archive, &entries);
    let root = tmp.path().join("root");
    let choice = binary(&archive, "bin/agent");
    let installed = installer(&root)
        .install("agent", &choice, None, &quiet)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(installed.dir.join("README")).unwrap(),
        b"hello"
    );
    let marker = std::fs::symlink_metadata(installed.dir.join(MARKER)).unwrap();
    assert!(marker.is_file(), "the marker is a file of its own");
    std::fs::remove_file(&archive).unwrap();
    let again = installer(&root)
        .install("agent", &choice, None, &quiet)
        .await
        .expect("reused from the marker");
    assert_eq!(again, installed);
}

#[tokio::test]
async fn a_file_the_installer_writes_replaces_a_link_of_its_name() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::write(&outside, b"keep").unwrap();
    let dir = tmp.path().join("dir");
    std::fs::create_dir(&dir).unwrap();
    let link = dir.join("file");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    write_new(&link, b"new").await.unwrap();
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_file());
    assert_eq!(std::fs::read(&link).unwrap(), b"new");
}

#[tokio::test]
async fn data_in_an_entry_that_is_not_a_file_is_bounded() {
    let big = vec![0u8; 1 << 20];
    let cases: [(&str, Entry); 2] = [
        ("folder", ("big/", Directory, 0o755, &big)),
        (
            "global header",
            ("pax_global_header", XGlobalHeader, 0o644, &big),
        ),
    ];
    for (what, entry) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let archive = tmp.path().join("agent.tar.gz");
        let mut entries = vec![entry];
        entries.extend(good_entries());
        tar_gz(&archive, &entries);
        let error = refused(tmp.path(), &binary(&archive, "bin/agent")).await;
        assert!(
            matches!(error, InstallError::TooLarge(_)),
            "{what}: {error}"
        );
    }
}

#[tokio::test]
async fn long_names_and_pax_records_are_bounded() {
    let long = vec![b'a'; 4 << 20];
    let mut pax = b"4194304 path=".to_vec();
    pax.resize(4 << 20, b'a');
    let cases: [(&str, Entry); 2] = [
        ("long name", ("././@LongLink", GNULongName, 0o644, &long)),
        ("pax records", ("PaxHeader/x", XHeader, 0o644, &pax)),
    ];
    for (what, extension) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let archive = tmp.path().join("agent.tar.gz");
        let mut entries = vec![extension, ("x", Regular, 0o644, b"x")];
        entries.extend(good_entries());
        tar_gz(&archive, &entries);
        let error = refused(tmp.path(), &binary(&archive, "bin/agent")).await;
        assert!(
            matches!(error, InstallError::TooLarge(_)),
            "{what}: {error}"
        );
    }
}

#[tokio::test]
async fn what_a_tar_stream_decompresses_to_is_bounded_beyond_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.tar.gz");
    let padding = vec![0u8; 60 << 10];
    let names: Vec<String> = (0..20).map(|i| format!("d{i}/")).collect();
    let mut entries: Vec<Entry> = (names.iter())
        .map(|name| (name.as_str(), Directory, 0o755, &padding[..]))
        .collect();
    entries.extend(good_entries());
    tar_gz(&archive, &entries);
    let root = tmp.path().join("root");
    let limits = UnpackLimits {
        max_bytes: 1 << 10,
        max_entries: 100,
    };
    let error = installer(&root)
        .with_limits(limits, 1 << 30)
        .install("agent", &binary(&archive, "bin/agent"), None, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(error, InstallError::TooLarge(_)), "{error}");
    assert!(listing(&root).is_empty(), "{:?}", listing(&root));
}

#[tokio::test]
async fn write_permission_for_others_and_special_bits_are_not_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.tar.gz");
    let entries: Vec<Entry> = vec![
        ("open/", Directory, 0o777, b""),
        ("open/data", Regular, 0o666, b"data"),
        ("bin/", Directory, 0o1777, b""),
        ("bin/agent", Regular, 0o6777, super::tests::SCRIPT),
    ];
    tar_gz(&archive, &entries);
    let installed = installer(&tmp.path().join("root"))
        .install("agent", &binary(&archive, "bin/agent"), None, &quiet)
        .await
        .unwrap();
    let mode = |rel: &str| {
        let meta = std::fs::symlink_metadata(installed.dir.join(rel)).unwrap();
        meta.permissions().mode() & 0o7777
    };
    assert_eq!(mode("open"), 0o755);
    assert_eq!(mode("open/data"), 0o644);
    assert_eq!(mode("bin"), 0o755);
    assert_eq!(mode("bin/agent"), 0o755);
    runs(&installed.program);
}
