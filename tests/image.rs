//! The Dockerfile against Cargo.toml, without building anything: its build command produces
//! every binary the runtime stage copies, its dependency layer comes from cargo-chef (no stub
//! sources written by hand: those once forgot six of the eight benches and the image could not
//! build), and the cook step prepares the dependencies of what the build command builds.
//! `scripts/image.sh` runs the same steps for real, outside Docker.

use std::collections::BTreeSet;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn dockerfile() -> String {
    std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).expect("read Dockerfile")
}

/// The Dockerfile's instructions with comments dropped and continuation lines joined.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head.trim());
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    out
}

/// The command after `RUN ` on the line following `# image-build-command:` (the one
/// `scripts/image.sh` runs).
fn build_command(text: &str) -> Vec<String> {
    let mut lines = text.lines();
    lines
        .find(|l| l.trim() == "# image-build-command:")
        .expect("a `# image-build-command:` marker in the Dockerfile");
    let run = lines.next().expect("a line after the marker");
    let command = run
        .strip_prefix("RUN ")
        .expect("a RUN line after the marker");
    assert!(
        !command.ends_with('\\') && !command.contains("&&"),
        "the build command is one plain cargo command: {command}"
    );
    command.split_whitespace().map(str::to_owned).collect()
}

/// The Cargo.toml targets of one kind: declared (`[[bin]]`, `[[example]]`, `[[bench]]`) and
/// auto-discovered from their directory, as cargo does.
fn targets(kind: &str, dir: &str) -> BTreeSet<String> {
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).unwrap())
            .expect("parse Cargo.toml");
    let mut names: BTreeSet<String> = manifest
        .get(kind)
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .map(|t| t["name"].as_str().expect("a target name").to_owned())
        .collect();
    if let Ok(entries) = std::fs::read_dir(Path::new(ROOT).join(dir)) {
        for entry in entries {
            let path = entry.unwrap().path();
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.extension().is_some_and(|e| e == "rs") || path.join("main.rs").is_file() {
                names.insert(stem);
            }
        }
    }
    names
}

/// What `cargo build ARGS` leaves under `target/`: `release/NAME` per bin and
/// `release/examples/NAME` per example.
fn artifacts(args: &[String]) -> BTreeSet<String> {
    let profile = if args.iter().any(|a| a == "--release") {
        "release"
    } else {
        "debug"
    };
    let bins = targets("bin", "src/bin");
    let examples = targets("example", "examples");
    let mut out = BTreeSet::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--bin" => {
                let name = args.next().expect("a name after --bin");
                assert!(bins.contains(name), "no bin target {name}");
                out.insert(format!("{profile}/{name}"));
            }
            "--bins" => out.extend(bins.iter().map(|n| format!("{profile}/{n}"))),
            "--example" => {
                let name = args.next().expect("a name after --example");
                assert!(examples.contains(name), "no example target {name}");
                out.insert(format!("{profile}/examples/{name}"));
            }
            "--examples" | "--all-targets" => {
                out.extend(examples.iter().map(|n| format!("{profile}/examples/{n}")));
            }
            _ => {}
        }
    }
    out
}

#[test]
fn the_build_command_produces_every_binary_the_runtime_stage_copies() {
    let text = dockerfile();
    let command = build_command(&text);
    assert_eq!(
        command[..2],
        ["cargo", "build"],
        "the build command is a cargo build"
    );
    assert!(
        command.iter().any(|a| a == "--locked"),
        "the image builds with the lock file"
    );
    let built = artifacts(&command);
    let copied: Vec<String> = instructions(&text)
        .iter()
        .filter_map(|i| i.strip_prefix("COPY --from=build /src/target/"))
        .map(|rest| rest.split_whitespace().next().unwrap().to_owned())
        .collect();
    assert!(
        copied.iter().any(|c| c.ends_with("/acp-gateway")),
        "the image ships the gateway: {copied:?}"
    );
    for artifact in &copied {
        assert!(
            built.contains(artifact),
            "the runtime stage copies {artifact}, which `{}` does not build (it builds {built:?})",
            command.join(" ")
        );
    }
}

#[test]
fn the_build_command_builds_every_example() {
    let command = build_command(&dockerfile());
    let built = artifacts(&command);
    for example in targets("example", "examples") {
        assert!(
            built.contains(&format!("release/examples/{example}")),
            "example {example} is not built by `{}`",
            command.join(" ")
        );
    }
}

#[test]
fn every_declared_bench_and_example_has_its_source_file() {
    // cargo (and so `cargo chef prepare`) fails on a declared target whose file is missing.
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).unwrap())
            .unwrap();
    for (kind, dir) in [
        ("bench", "benches"),
        ("example", "examples"),
        ("bin", "src/bin"),
    ] {
        for target in manifest
            .get(kind)
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
        {
            let name = target["name"].as_str().unwrap();
            let path = match target.get("path").and_then(|p| p.as_str()) {
                Some(path) => Path::new(ROOT).join(path),
                None => Path::new(ROOT).join(dir).join(format!("{name}.rs")),
            };
            assert!(
                path.is_file() || path.with_extension("").join("main.rs").is_file(),
                "[[{kind}]] {name}: no {}",
                path.display()
            );
        }
    }
    assert!(
        targets("bench", "benches").len() >= 8,
        "the benches are all found"
    );
}

#[test]
fn the_dependency_layer_comes_from_cargo_chef_not_from_stubs() {
    let text = dockerfile();
    let runs: Vec<String> = instructions(&text)
        .into_iter()
        .filter(|i| i.starts_with("RUN "))
        .collect();
    for run in &runs {
        for stub in ["fn main", "src/main.rs", "src/lib.rs", "touch "] {
            assert!(
                !run.contains(stub),
                "a RUN writes or touches sources ({stub:?}): {run}"
            );
        }
    }
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("ARG CARGO_CHEF_VERSION="))
        .expect("ARG CARGO_CHEF_VERSION= pins cargo-chef");
    assert!(
        version.split('.').count() == 3 && version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "cargo-chef is pinned to an exact version, not {version:?}"
    );
    assert!(
        runs.iter()
            .any(|r| r == "RUN cargo install cargo-chef --locked --version ${CARGO_CHEF_VERSION}"),
        "cargo-chef is installed at the pinned version"
    );
    let prepare = runs
        .iter()
        .filter(|r| r.starts_with("RUN cargo chef prepare "))
        .count();
    assert_eq!(prepare, 1, "one `cargo chef prepare`");
    let cook: Vec<&String> = runs
        .iter()
        .filter(|r| r.starts_with("RUN cargo chef cook "))
        .collect();
    assert_eq!(cook.len(), 1, "one `cargo chef cook`");
    let cook: Vec<&str> = cook[0].split_whitespace().collect();
    let build = build_command(&text);
    // The cook must build the dependencies the build needs, with the same profile and lock
    // file; examples need the dev-dependencies, which cook builds only for examples.
    for flag in ["--release", "--locked"] {
        assert_eq!(
            cook.contains(&flag),
            build.iter().any(|a| a == flag),
            "cook and build differ on {flag}"
        );
    }
    if build.iter().any(|a| a == "--example" || a == "--examples") {
        assert!(
            cook.contains(&"--examples") || cook.contains(&"--all-targets"),
            "the build builds examples, so cook needs --examples: {cook:?}"
        );
    }
}
