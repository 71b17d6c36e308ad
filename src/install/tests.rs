//! The registry's parsing and choices, and installs from archives made here in a temporary
//! folder: good ones unpack and run, hostile or broken ones are refused and leave nothing. The
//! helpers that build archives and installers here serve the other test files too.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::install::archive::UnpackLimits;
use crate::install::error::InstallError;
use crate::install::installer::Installer;
use crate::install::packages::npm_bin;
use crate::install::registry::{Choice, DistKind, RegistryIndex, platform};

pub(super) const SCRIPT: &[u8] = b"#!/bin/sh\necho agent-ran \"$@\"\n";

/// A tar header of any name and type, written byte by byte (the tar crate's setters refuse
/// the hostile names these tests need).
pub(super) fn header(
    name: &str,
    kind: tar::EntryType,
    size: u64,
    mode: u32,
    link: &str,
) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_cksum();
    header
}

/// One entry of a test tar: name, type, mode, data (or link target).
pub(super) type Entry<'a> = (&'a str, tar::EntryType, u32, &'a [u8]);

/// A `.tar.gz` of `entries` at `path`.
pub(super) fn tar_gz(path: &Path, entries: &[Entry]) {
    let file = std::fs::File::create(path).unwrap();
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut builder = tar::Builder::new(gz);
    for (name, kind, mode, data) in entries {
        if kind.is_symlink() || kind.is_hard_link() {
            let link = std::str::from_utf8(data).unwrap();
            builder
                .append(&header(name, *kind, 0, *mode, link), &[][..])
                .unwrap();
        } else {
            let size = data.len() as u64;
            builder
                .append(&header(name, *kind, size, *mode, ""), *data)
                .unwrap();
        }
    }
    builder.into_inner().unwrap().finish().unwrap();
}

/// The good archive: a folder and an executable script in it.
pub(super) fn good_entries() -> Vec<Entry<'static>> {
    vec![
        ("bin/", tar::EntryType::Directory, 0o755, b""),
        ("bin/agent", tar::EntryType::Regular, 0o755, SCRIPT),
        ("README", tar::EntryType::Regular, 0o644, b"hello"),
    ]
}

pub(super) fn binary(source: &Path, cmd: &str) -> Choice {
    Choice {
        kind: DistKind::Binary,
        version: "1.0.0".to_owned(),
        source: source.display().to_string(),
        cmd: Some(cmd.to_owned()),
        args: vec!["acp".to_owned()],
        env: BTreeMap::from([("MODE".to_owned(), "acp".to_owned())]),
    }
}

/// An installer under `root` that takes the tests' archives from their local files.
pub(super) fn installer(root: &Path) -> Installer {
    Installer::new(root.to_path_buf(), reqwest::Client::new()).allow_local_archives(true)
}

pub(super) fn quiet(_: &str) {}

/// What is under `root`, sorted.
pub(super) fn listing(root: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(root)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Installs `choice` under a fresh root, expects a failure, and checks nothing is left, not
/// even the agent's folder.
pub(super) async fn refused(archive_dir: &Path, choice: &Choice) -> InstallError {
    let root = archive_dir.join("root");
    let error = installer(&root)
        .install("agent", choice, None, &quiet)
        .await
        .expect_err("the install is refused");
    assert!(listing(&root).is_empty(), "{error}: {:?}", listing(&root));
    error
}

pub(super) fn runs(program: &Path) {
    let out = std::process::Command::new(program)
        .arg("x")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "agent-ran x\n");
}

#[tokio::test]
async fn a_tar_gz_unpacks_with_its_executable_bits_and_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent-linux.tar.gz");
    tar_gz(&archive, &good_entries());
    let root = tmp.path().join("root");
    let seen = std::sync::Mutex::new(Vec::new());
    let progress = |line: &str| seen.lock().unwrap().push(line.to_owned());
    let installed = installer(&root)
        .install("agent", &binary(&archive, "./bin/agent"), None, &progress)
        .await
        .unwrap();
    assert_eq!(installed.dir, root.join("agent").join("1.0.0"));
    assert_eq!(installed.program, installed.dir.join("bin/agent"));
    assert_eq!(installed.args, vec!["acp".to_owned()]);
    assert_eq!(installed.env["MODE"], "acp");
    let mode = std::fs::metadata(&installed.program)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    let readme = std::fs::metadata(installed.dir.join("README")).unwrap();
    assert_eq!(readme.permissions().mode() & 0o777, 0o644);
    runs(&installed.program);
    assert_eq!(listing(&root), vec!["agent".to_owned()], "no staging left");
    let seen = seen.lock().unwrap();
    assert!(seen[0].starts_with("downloading "), "{seen:?}");
    assert!(seen.iter().any(|l| l.contains("sha256")), "{seen:?}");
    assert_eq!(seen.last().unwrap(), "installed");
}

#[tokio::test]
async fn a_zip_unpacks_with_its_executable_bits_and_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.zip");
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&archive).unwrap());
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    zip.add_directory("dist/", options.unix_permissions(0o755))
        .unwrap();
    zip.start_file("dist/agent", options.unix_permissions(0o755))
        .unwrap();
    zip.write_all(SCRIPT).unwrap();
    zip.start_file("dist/data.txt", options.unix_permissions(0o644))
        .unwrap();
    zip.write_all(b"data").unwrap();
    zip.finish().unwrap();
    let root = tmp.path().join("root");
    let installed = installer(&root)
        .install("agent", &binary(&archive, "dist/agent"), None, &quiet)
        .await
        .unwrap();
    runs(&installed.program);
    let data = installed.dir.join("dist/data.txt");
    assert_eq!(std::fs::read(&data).unwrap(), b"data");
    assert_eq!(
        std::fs::metadata(&data).unwrap().permissions().mode() & 0o777,
        0o644
    );
}

#[tokio::test]
async fn a_raw_binary_is_saved_as_its_name_and_made_executable() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("my-agent");
    std::fs::write(&archive, SCRIPT).unwrap();
    let root = tmp.path().join("root");
    let installed = installer(&root)
        .install("agent", &binary(&archive, "./my-agent"), None, &quiet)
        .await
        .unwrap();
    assert_eq!(installed.program, installed.dir.join("my-agent"));
    runs(&installed.program);
}

#[tokio::test]
async fn hostile_tar_entries_are_refused_and_leave_nothing() {
    use tar::EntryType::{Block, Directory, Fifo, Link, Regular, Symlink};
    let cases: Vec<(&str, Vec<Entry>)> = vec![
        ("parent", vec![("../evil", Regular, 0o644, b"x")]),
        (
            "nested parent",
            vec![("bin/../../evil", Regular, 0o644, b"x")],
        ),
        ("absolute", vec![("/etc/x", Regular, 0o644, b"x")]),
        (
            "symlink out, written through",
            vec![
                ("out", Symlink, 0o777, b"/tmp"),
                ("out/x", Regular, 0o644, b"x"),
            ],
        ),
        (
            "relative symlink out",
            vec![
                ("bin/", Directory, 0o755, b""),
                ("bin/up", Symlink, 0o777, b"../../x"),
            ],
        ),
        (
            "symlink inside, written through",
            vec![
                ("real/", Directory, 0o755, b""),
                ("alias", Symlink, 0o777, b"real"),
                ("alias/x", Regular, 0o644, b"x"),
            ],
        ),
        (
            "hard link out",
            vec![("passwd", Link, 0o644, b"/etc/passwd")],
        ),
        ("hard link up", vec![("up", Link, 0o644, b"../x")]),
        (
            "hard link to nothing",
            vec![("copy", Link, 0o644, b"missing")],
        ),
        ("fifo", vec![("pipe", Fifo, 0o644, b"")]),
        ("device", vec![("disk", Block, 0o644, b"")]),
    ];
    for (what, mut entries) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let archive = tmp.path().join("agent.tar.gz");
        entries.extend(good_entries());
        tar_gz(&archive, &entries);
        let error = refused(tmp.path(), &binary(&archive, "bin/agent")).await;
        assert!(matches!(error, InstallError::Unsafe(_)), "{what}: {error}");
    }
}

#[tokio::test]
async fn a_hard_link_to_a_file_inside_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.tgz");
    let mut entries = good_entries();
    entries.push(("bin/again", tar::EntryType::Link, 0o755, b"bin/agent"));
    tar_gz(&archive, &entries);
    let installed = installer(&tmp.path().join("root"))
        .install("agent", &binary(&archive, "bin/again"), None, &quiet)
        .await
        .unwrap();
    runs(&installed.program);
}

#[tokio::test]
async fn an_archive_past_the_limits_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.tar.gz");
    tar_gz(&archive, &good_entries());
    let root = tmp.path().join("root");
    let choice = binary(&archive, "bin/agent");
    let small = UnpackLimits {
        max_bytes: 10,
        max_entries: 100,
    };
    let error = installer(&root)
        .with_limits(small, 1 << 20)
        .install("agent", &choice, None, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(error, InstallError::TooLarge(_)), "{error}");
    let few = UnpackLimits {
        max_bytes: 1 << 20,
        max_entries: 2,
    };
    let error = installer(&root)
        .with_limits(few, 1 << 20)
        .install("agent", &choice, None, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(error, InstallError::TooLarge(_)), "{error}");
    let error = installer(&root)
        .with_limits(UnpackLimits::default(), 16)
        .install("agent", &choice, None, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(error, InstallError::TooLarge(_)), "{error}");
    assert!(listing(&root).is_empty(), "{:?}", listing(&root));
}

#[tokio::test]
async fn a_corrupt_or_missing_archive_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.tar.gz");
    tar_gz(&archive, &good_entries());
    let mut bytes = std::fs::read(&archive).unwrap();
    let middle = bytes.len() / 2;
    bytes.truncate(middle);
    bytes.extend_from_slice(&[0xff; 64]);
    std::fs::write(&archive, bytes).unwrap();
    let error = refused(tmp.path(), &binary(&archive, "bin/agent")).await;
    assert!(matches!(error, InstallError::Archive(_)), "{error}");

    let tmp = tempfile::tempdir().unwrap();
    let gone = tmp.path().join("gone.tar.gz");
    let error = refused(tmp.path(), &binary(&gone, "bin/agent")).await;
    assert!(matches!(error, InstallError::Download(_)), "{error}");

    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.tar.gz");
    tar_gz(&archive, &good_entries());
    let error = refused(tmp.path(), &binary(&archive, "bin/other")).await;
    assert!(matches!(error, InstallError::Missing(_)), "{error}");
    let error = refused(tmp.path(), &binary(&archive, "README")).await;
    assert!(
        matches!(error, InstallError::Unsafe(_)),
        "not executable: {error}"
    );
    let error = refused(tmp.path(), &binary(&archive, "../bin/agent")).await;
    assert!(matches!(error, InstallError::Unsafe(_)), "{error}");
}

#[tokio::test]
async fn a_changed_archive_is_refused_and_an_unchanged_install_is_reused() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("agent.tar.gz");
    tar_gz(&archive, &good_entries());
    let choice = binary(&archive, "bin/agent");
    let root = tmp.path().join("root");
    let wrong = "0".repeat(64);
    let error = installer(&root)
        .install("agent", &choice, Some(&wrong), &quiet)
        .await
        .unwrap_err();
    assert!(matches!(error, InstallError::Hash { .. }), "{error}");
    assert!(listing(&root).is_empty(), "{:?}", listing(&root));

    let first = installer(&root)
        .install("agent", &choice, None, &quiet)
        .await
        .unwrap();
    let sha = first.sha256.clone().unwrap();
    assert_eq!(sha.len(), 64);
    std::fs::remove_file(&archive).unwrap();
    let again = installer(&root)
        .install("agent", &choice, Some(&sha.to_uppercase()), &quiet)
        .await
        .expect("reused without a download");
    assert_eq!(again, first);
    let error = installer(&root)
        .install("agent", &choice, Some(&wrong), &quiet)
        .await
        .unwrap_err();
    assert!(matches!(error, InstallError::Download(_)), "{error}");
    runs(&first.program);

    installer(&root).remove("agent").unwrap();
    installer(&root).remove("agent").unwrap();
    assert!(listing(&root).is_empty());
}

const REGISTRY: &str = r#"{"version": "1.0.0", "agents": [
 {"id": "entry-id", "name": "Entry Name", "version": "1.0.0", "description": "An agent",
  "repository": "https://github.com/example/agent", "website": "https://example.com",
  "authors": ["Author Name"], "license": "MIT", "license_url": "https://example.com/LICENSE",
  "icon": "https://example.com/entry-id.svg", "preview": {"state": "beta"},
  "distribution": {
   "binary": {"PLATFORM": {"archive": "https://example.com/a.tar.gz", "cmd": "./executable",
                           "args": ["serve"], "env": {}},
              "plan9-mips": {"archive": "https://example.com/b.zip", "cmd": "./x"}},
   "npx": {"package": "@scope/package@1.0.0", "cmd": "package-command", "args": ["--acp"], "env": {}},
   "uvx": {"package": "package-name==1.0", "cmd": "package-command", "args": ["serve"]}}},
 {"id": "npx-only", "name": "Npx Only", "version": "2.0.0",
  "distribution": {"binary": {"plan9-mips": {"archive": "https://example.com/b.zip", "cmd": "x"}},
                   "npx": {"package": "pkg", "args": []}}},
 {"id": "uvx-only", "name": "Uvx Only", "version": "0.3.0",
  "distribution": {"uvx": {"package": "tool@0.3.0"}}},
 {"id": "none", "name": "None", "version": "1.0.0",
  "distribution": {"binary": {"plan9-mips": {"archive": "https://example.com/b.zip", "cmd": "x"}}}}
]}"#;

fn registry() -> RegistryIndex {
    serde_json::from_str(&REGISTRY.replace("PLATFORM", platform())).unwrap()
}

#[test]
fn the_registry_parses_and_choose_prefers_this_platforms_binary() {
    let index = registry();
    assert_eq!(index.agents.len(), 4);
    let entry = &index.agents[0];
    assert_eq!(entry.authors, vec!["Author Name".to_owned()]);
    assert_eq!(
        entry.kinds(),
        vec![DistKind::Binary, DistKind::Npx, DistKind::Uvx]
    );
    let choice = entry.choose(None).unwrap();
    assert_eq!(choice.kind, DistKind::Binary);
    assert_eq!(choice.source, "https://example.com/a.tar.gz");
    assert_eq!(choice.cmd.as_deref(), Some("./executable"));
    assert_eq!(choice.args, vec!["serve".to_owned()]);
    assert_eq!(entry.choose(Some("1.0.0")).unwrap(), choice);
    let error = entry.choose(Some("2.0.0")).unwrap_err();
    assert!(
        matches!(&error, InstallError::Version(m) if m.contains("1.0.0")),
        "{error}"
    );

    let npx = entry
        .choose_kind(Some(DistKind::Npx), Some("2.0.0"))
        .unwrap();
    assert_eq!(npx.source, "@scope/package@2.0.0");
    assert_eq!(npx.version, "2.0.0");
    assert_eq!(npx.cmd.as_deref(), Some("package-command"));
    let uvx = entry.choose_kind(Some(DistKind::Uvx), None).unwrap();
    assert_eq!(uvx.source, "package-name==1.0");
    let uvx = entry.choose_kind(Some(DistKind::Uvx), Some("1.5")).unwrap();
    assert_eq!(uvx.source, "package-name==1.5");
    let text = serde_json::to_string(&npx).unwrap();
    assert_eq!(serde_json::from_str::<Choice>(&text).unwrap(), npx);
    assert!(text.contains(r#""kind":"npx""#), "{text}");
}

#[test]
fn without_a_binary_for_this_platform_the_packages_are_chosen() {
    let index = registry();
    let npx_only = &index.agents[1];
    assert_eq!(npx_only.kinds(), vec![DistKind::Npx]);
    let choice = npx_only.choose(None).unwrap();
    assert_eq!(
        (choice.kind, choice.source.as_str()),
        (DistKind::Npx, "pkg@2.0.0")
    );
    assert_eq!(npx_only.choose(Some("3.1.0")).unwrap().source, "pkg@3.1.0");
    let error = npx_only
        .choose_kind(Some(DistKind::Binary), None)
        .unwrap_err();
    assert!(matches!(error, InstallError::NoDistribution(_)), "{error}");
    let error = npx_only.choose(Some("1.0; rm -rf /")).unwrap_err();
    assert!(matches!(error, InstallError::Version(_)), "{error}");

    let uvx_only = index.agents[2].choose(None).unwrap();
    assert_eq!(
        (uvx_only.kind, uvx_only.source.as_str()),
        (DistKind::Uvx, "tool==0.3.0")
    );
    let error = index.agents[3].choose(None).unwrap_err();
    assert!(matches!(error, InstallError::NoDistribution(_)), "{error}");
    assert_eq!("uvx".parse::<DistKind>(), Ok(DistKind::Uvx));
    assert!("pip".parse::<DistKind>().is_err());
}

#[tokio::test]
async fn the_registry_loads_from_a_file_and_names_it_when_broken() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("registry.json");
    std::fs::write(&path, REGISTRY).unwrap();
    let client = reqwest::Client::new();
    let by_path = crate::install::registry::load(path.to_str().unwrap(), &client)
        .await
        .unwrap();
    assert_eq!(by_path.agents.len(), 4);
    let url = format!("file://{}", path.display());
    let by_url = crate::install::registry::load(&url, &client).await.unwrap();
    assert_eq!(by_url, by_path);
    std::fs::write(&path, "{not json").unwrap();
    let error = crate::install::registry::load(path.to_str().unwrap(), &client)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, InstallError::Registry(m) if m.contains("registry.json")),
        "{error}"
    );
}

#[test]
fn a_packages_own_command_is_read_from_its_package_json() {
    let one = r#"{"name": "@scope/tool", "bin": "dist/cli.js"}"#;
    assert_eq!(npm_bin(one, "@scope/tool").unwrap(), "tool");
    let map = r#"{"bin": {"tool-acp": "dist/cli.js"}}"#;
    assert_eq!(npm_bin(map, "@scope/tool").unwrap(), "tool-acp");
    let several = r#"{"bin": {"tool": "a.js", "tool-dev": "b.js"}}"#;
    assert_eq!(npm_bin(several, "@scope/tool").unwrap(), "tool");
    let ambiguous = r#"{"bin": {"a": "a.js", "b": "b.js"}}"#;
    let error = npm_bin(ambiguous, "@scope/tool").unwrap_err();
    assert!(error.to_string().contains("a, b"), "{error}");
    assert!(npm_bin(r#"{"name": "x"}"#, "x").is_err());
}

#[tokio::test]
async fn names_that_are_not_folders_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let archive: PathBuf = tmp.path().join("agent.tar.gz");
    tar_gz(&archive, &good_entries());
    let root = tmp.path().join("root");
    for name in ["../x", ".hidden", "a/b", ""] {
        let error = installer(&root)
            .install(name, &binary(&archive, "bin/agent"), None, &quiet)
            .await
            .unwrap_err();
        assert!(matches!(error, InstallError::Unsafe(_)), "{name}: {error}");
    }
    assert!(!root.exists());
}

#[tokio::test]
async fn hostile_zip_entries_are_refused_and_leave_nothing() {
    let options = zip::write::SimpleFileOptions::default();
    type Add = fn(&mut zip::ZipWriter<std::fs::File>, zip::write::SimpleFileOptions);
    let cases: [(&str, Add); 3] = [
        ("parent", |zip, o| {
            zip.start_file("../evil", o).unwrap();
            zip.write_all(b"x").unwrap();
        }),
        ("absolute", |zip, o| {
            zip.start_file("/etc/x", o).unwrap();
            zip.write_all(b"x").unwrap();
        }),
        ("symlink out", |zip, o| {
            zip.add_symlink("out", "/tmp", o).unwrap()
        }),
    ];
    for (what, add) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let archive = tmp.path().join("agent.zip");
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&archive).unwrap());
        add(&mut zip, options);
        zip.start_file("agent", options.unix_permissions(0o755))
            .unwrap();
        zip.write_all(SCRIPT).unwrap();
        zip.finish().unwrap();
        let error = refused(tmp.path(), &binary(&archive, "agent")).await;
        assert!(matches!(error, InstallError::Unsafe(_)), "{what}: {error}");
    }
}
