//! The workspace's files on a real folder: written, read, listed and deleted, ETags that
//! change with the content, and every way out through a symlink refused.

use std::io::Read as _;
use std::os::unix::fs::symlink;

use super::*;

fn path(text: &str) -> WorkPath {
    WorkPath::parse(text).unwrap()
}

/// A workspace in a temporary folder, beside a folder outside it holding `secret.txt`.
fn workspace() -> (tempfile::TempDir, WorkFiles, std::path::PathBuf) {
    let top = tempfile::tempdir().unwrap();
    let (root, outside) = (top.path().join("ws"), top.path().join("outside"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    let files = WorkFiles::open(&root).unwrap();
    (top, files, root)
}

fn read(files: &WorkFiles, p: &str) -> Result<String, FileError> {
    let (mut file, _) = files.open_file(&path(p))?;
    let mut text = String::new();
    file.read_to_string(&mut text).unwrap();
    Ok(text)
}

#[test]
fn written_files_are_read_listed_and_deleted() {
    let (_top, files, root) = workspace();
    let (info, _) = files
        .write(&path("src/deep/a.txt"), b"hello", None)
        .unwrap();
    assert_eq!((info.kind, info.size), (EntryKind::File, 5));
    assert_eq!(
        std::fs::read_to_string(root.join("src/deep/a.txt")).unwrap(),
        "hello"
    );
    assert_eq!(read(&files, "src/deep/a.txt").unwrap(), "hello");
    files.write(&path("b.txt"), b"", None).unwrap();

    let top: Vec<(String, EntryKind)> = files
        .list(&WorkPath::default())
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.kind))
        .collect();
    assert_eq!(
        top,
        [
            ("b.txt".into(), EntryKind::File),
            ("src".into(), EntryKind::Folder)
        ]
    );
    assert!(matches!(
        files.open_file(&path("src")),
        Err(FileError::IsAFolder(_))
    ));
    assert!(matches!(
        files.list(&path("b.txt")),
        Err(FileError::NotAFolder(_))
    ));
    assert!(matches!(
        files.info(&path("nope")),
        Err(FileError::NotFound(_))
    ));

    files.delete(&path("src")).unwrap();
    assert!(!root.join("src").exists());
    assert!(matches!(
        files.delete(&path("src")),
        Err(FileError::NotFound(_))
    ));
    assert!(matches!(
        files.delete(&WorkPath::default()),
        Err(FileError::Root)
    ));
    assert!(matches!(
        files.write(&WorkPath::default(), b"x", None),
        Err(FileError::Root)
    ));
}

#[test]
fn a_write_names_the_etag_it_replaces() {
    let (_top, files, _root) = workspace();
    let p = path("f.txt");
    assert!(matches!(
        files.write(&p, b"x", Some("*")),
        Err(FileError::Gone { .. })
    ));
    let (first, _) = files.write(&p, b"one", None).unwrap();
    assert_eq!(files.info(&p).unwrap().etag, first.etag);
    let (second, _) = files.write(&p, b"two", Some(&first.etag)).unwrap();
    assert_ne!(second.etag, first.etag, "a write changes the ETag");
    match files.write(&p, b"three", Some(&first.etag)) {
        Err(FileError::Stale { current, .. }) => assert_eq!(current, second.etag),
        other => panic!("{other:?}"),
    }
    assert_eq!(read(&files, "f.txt").unwrap(), "two");
    files.write(&p, b"four", Some("*")).unwrap();
    assert_eq!(read(&files, "f.txt").unwrap(), "four");
    // The temporary file a write goes through is never left, nor listed.
    let names: Vec<String> = files
        .list(&WorkPath::default())
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["f.txt"]);
}

#[test]
fn symlinks_inside_are_followed_and_those_leading_out_refused() {
    let (top, files, root) = workspace();
    let outside = top.path().join("outside");
    files
        .write(&path("real/inner.txt"), b"inner", None)
        .unwrap();
    symlink("real/inner.txt", root.join("alias.txt")).unwrap();
    symlink("real", root.join("alias-dir")).unwrap();
    symlink(outside.join("secret.txt"), root.join("abs.txt")).unwrap();
    symlink("../outside/secret.txt", root.join("rel.txt")).unwrap();
    symlink("../outside", root.join("out")).unwrap();
    symlink("/", root.join("slash")).unwrap();

    assert_eq!(read(&files, "alias.txt").unwrap(), "inner");
    // A write to a link that stays inside replaces the link with the file.
    files.write(&path("alias.txt"), b"own", None).unwrap();
    assert_eq!(read(&files, "alias.txt").unwrap(), "own");
    assert_eq!(read(&files, "real/inner.txt").unwrap(), "inner");
    assert_eq!(read(&files, "alias-dir/inner.txt").unwrap(), "inner");
    for p in ["abs.txt", "rel.txt", "out/secret.txt", "slash/etc/hostname"] {
        assert!(
            matches!(read(&files, p), Err(FileError::Escapes(_))),
            "read {p}"
        );
        assert!(
            matches!(files.info(&path(p)), Err(FileError::Escapes(_))),
            "info {p}"
        );
    }
    for p in [
        "rel.txt",
        "abs.txt",
        "out/new.txt",
        "out/secret.txt",
        "slash/tmp/x",
    ] {
        let wrote = files.write(&path(p), b"pwned", None);
        assert!(
            matches!(wrote, Err(FileError::Escapes(_))),
            "write {p}: {wrote:?}"
        );
    }
    assert!(matches!(
        files.list(&path("out")),
        Err(FileError::Escapes(_))
    ));
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "secret"
    );
    assert!(!outside.join("new.txt").exists());

    // Listed as what they are; deleting one removes the link, not what it leads to.
    let listed = files.list(&WorkPath::default()).unwrap();
    let rel = listed.iter().find(|e| e.name == "rel.txt").unwrap();
    assert_eq!(rel.kind, EntryKind::Symlink);
    files.delete(&path("out")).unwrap();
    files.delete(&path("rel.txt")).unwrap();
    assert!(outside.join("secret.txt").exists());
}

#[test]
fn a_folder_swapped_for_a_symlink_after_it_was_seen_is_refused() {
    let (top, files, root) = workspace();
    files.write(&path("d/f.txt"), b"mine", None).unwrap();
    assert_eq!(read(&files, "d/f.txt").unwrap(), "mine");
    // The agent replaces the folder with a link out between two requests.
    std::fs::remove_dir_all(root.join("d")).unwrap();
    symlink(top.path().join("outside"), root.join("d")).unwrap();
    assert!(matches!(
        read(&files, "d/secret.txt"),
        Err(FileError::Escapes(_))
    ));
    let wrote = files.write(&path("d/f.txt"), b"x", None);
    assert!(matches!(wrote, Err(FileError::Escapes(_))), "{wrote:?}");
    assert!(!top.path().join("outside/f.txt").exists());
}

#[test]
fn a_copy_holds_the_files_and_the_links_as_links() {
    let (top, files, root) = workspace();
    files.write(&path("src/a.txt"), b"a", None).unwrap();
    files.write(&path("b.txt"), b"b", None).unwrap();
    symlink("../outside", root.join("out")).unwrap();
    symlink("src/a.txt", root.join("alias")).unwrap();
    let copy = top.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    files.copy_into(&copy).unwrap();
    assert_eq!(
        std::fs::read_to_string(copy.join("src/a.txt")).unwrap(),
        "a"
    );
    assert_eq!(std::fs::read_to_string(copy.join("b.txt")).unwrap(), "b");
    assert_eq!(
        std::fs::read_link(copy.join("out")).unwrap(),
        std::path::Path::new("../outside")
    );
    assert_eq!(
        std::fs::read_link(copy.join("alias")).unwrap(),
        std::path::Path::new("src/a.txt")
    );
    // The copy is its own: a write to it leaves the original alone.
    let copied = WorkFiles::open(&copy).unwrap();
    copied.write(&path("b.txt"), b"changed", None).unwrap();
    assert_eq!(read(&files, "b.txt").unwrap(), "b");
}
