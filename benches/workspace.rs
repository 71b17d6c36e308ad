//! Workspace benchmark (not a test): what the gateway's diff of a worktree and its file download
//! cost against git and the disk themselves, measured in the same run.
//!
//! Run with `bash bench/workspace.sh` (it builds the release binaries first). Prints a table and
//! writes it to `bench/results/workspace.md`.
//!
//! How: a repository of `FILES` files (100 folders, each file 20 lines) is committed; a release
//! gateway (SQLite) makes a session a worktree of it; 100 files of the worktree change (60
//! modified, 20 added, 20 deleted). Then, `REPEATS` times each, alternating: `GET
//! /sessions/{id}/diff` (JSON: every file with its counts and patch), the same with `Accept:
//! text/x-diff`, and the baseline, `git diff HEAD` run in the worktree directly (which, unlike the
//! gateway, leaves the 20 untracked files out). The gateway's first diff is reported apart: it
//! reads every file once into the index of its own (seeded from the worktree's). Download: a
//! `DOWNLOAD_MB` file in the workspace, `GET /sessions/{id}/files/{path}` read to the end,
//! against reading it from disk (`std::fs::read`), both from the page cache; then `CLIENTS`
//! clients downloading an `EACH_MB` file at once, against as many threads reading it.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::shared::git::git;
use support::{Backend, Database, Gateway, Options};

const FILES: usize = 10_000;
const REPEATS: usize = 7;
const DOWNLOAD_MB: usize = 256;
/// Clients downloading at once, each a file of `EACH_MB`.
const CLIENTS: usize = 8;
const EACH_MB: usize = 32;

fn lines(seed: usize) -> String {
    (0..20)
        .map(|l| format!("line {l} of file {seed}\n"))
        .collect()
}

/// The bytes of `request`'s answer, read to the end as they come.
async fn download(request: reqwest::RequestBuilder) -> usize {
    let mut r = request.send().await.unwrap();
    let mut got = 0;
    while let Some(chunk) = r.chunk().await.unwrap() {
        got += chunk.len();
    }
    got
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    for i in 0..FILES {
        let folder = repo.join(format!("d{:03}", i % 100));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join(format!("f{i:05}.txt")), lines(i)).unwrap();
    }
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "files"]);

    let db = Database::create(Backend::Sqlite, dir.path(), "bench").await;
    let gw = Gateway::spawn(&db.url, dir.path(), &Options::bench()).await;
    let body = json!({"cwd": repo.to_str().unwrap(), "workspace": {"kind": "worktree"}});
    let r = gw.post("/sessions", body).await;
    assert_eq!(r.status(), 201);
    let view: Value = r.json().await.unwrap();
    let id = view["sessionId"].as_str().unwrap().to_owned();
    let tree = std::path::PathBuf::from(view["cwd"].as_str().unwrap());
    for i in 0..60 {
        let path = tree.join(format!("d{:03}/f{:05}.txt", i % 100, i));
        std::fs::write(path, format!("{}changed\n", lines(i))).unwrap();
    }
    for i in 60..80 {
        std::fs::write(tree.join(format!("d{:03}/new{i}.txt", i % 100)), lines(i)).unwrap();
    }
    for i in 80..100 {
        std::fs::remove_file(tree.join(format!("d{:03}/f{:05}.txt", i % 100, i))).unwrap();
    }

    let http = reqwest::Client::new();
    let diff_url = gw.url(&format!("/sessions/{id}/diff"));
    let timed_diff = |accept: &'static str| {
        let (http, url) = (http.clone(), diff_url.clone());
        async move {
            let start = Instant::now();
            let r = http.get(url).header("accept", accept).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let body = r.bytes().await.unwrap();
            (start.elapsed(), body)
        }
    };
    let (first, body) = timed_diff("application/json").await;
    let files = serde_json::from_slice::<Value>(&body).unwrap()["files"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(files, 100, "every changed file, untracked ones included");
    let (mut json_d, mut patch_d, mut git_d) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..REPEATS {
        json_d.push(timed_diff("application/json").await.0);
        patch_d.push(timed_diff("text/x-diff").await.0);
        let start = Instant::now();
        let patch = git(&tree, &["diff", "HEAD"]);
        git_d.push(start.elapsed());
        assert!(!patch.is_empty());
    }

    let size = DOWNLOAD_MB << 20;
    let big = tree.join("big.bin");
    std::fs::write(&big, vec![7u8; size]).unwrap();
    let file_url = gw.url(&format!("/sessions/{id}/files/big.bin"));
    let (mut http_d, mut disk_d) = (Vec::new(), Vec::new());
    for _ in 0..REPEATS {
        let start = Instant::now();
        let got = download(http.get(&file_url)).await;
        http_d.push(start.elapsed());
        assert_eq!(got, size);
        let start = Instant::now();
        let read = std::fs::read(&big).unwrap();
        disk_d.push(start.elapsed());
        assert_eq!(read.len(), size);
    }

    // Many at once: `CLIENTS` downloads of one file, against as many threads reading it.
    let each = EACH_MB << 20;
    let shared = tree.join("shared.bin");
    std::fs::write(&shared, vec![9u8; each]).unwrap();
    let shared_url = gw.url(&format!("/sessions/{id}/files/shared.bin"));
    let (mut many_http_d, mut many_disk_d) = (Vec::new(), Vec::new());
    for _ in 0..REPEATS {
        let start = Instant::now();
        let downloads: Vec<_> = (0..CLIENTS)
            .map(|_| tokio::spawn(download(http.get(&shared_url))))
            .collect();
        for d in downloads {
            assert_eq!(d.await.unwrap(), each);
        }
        many_http_d.push(start.elapsed());
        let start = Instant::now();
        let reads: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let path = shared.clone();
                std::thread::spawn(move || std::fs::read(path).unwrap().len())
            })
            .collect();
        for r in reads {
            assert_eq!(r.join().unwrap(), each);
        }
        many_disk_d.push(start.elapsed());
    }
    gw.stop().await;

    let (many_http_m, many_disk_m) = (median(many_http_d), median(many_disk_d));
    let many_rate =
        |d: Duration| format!("{:.0} MB/s", (CLIENTS * EACH_MB) as f64 / d.as_secs_f64());
    let (json_m, patch_m, git_m) = (median(json_d), median(patch_d), median(git_d));
    let (http_m, disk_m) = (median(http_d), median(disk_d));
    let rate = |d: Duration| format!("{:.0} MB/s", DOWNLOAD_MB as f64 / d.as_secs_f64());
    let ratio = |a: Duration, b: Duration| format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64());
    let table = format!(
        "# Workspace benchmark\n\n\
         Commit {commit}, {cores} cores. A worktree of a {FILES}-file repository with 100 changed \
         files (60 modified, 20 added, 20 deleted); medians of {REPEATS}, alternating. \
         Reproduce: `bash bench/workspace.sh`.\n\n\
         | measured | time | against the baseline |\n|---|---|---|\n\
         | `git diff HEAD` in the worktree (baseline; leaves the 20 untracked files out) | {git} | 1.00× |\n\
         | `GET /diff`, JSON (100 files, counts and patches) | {json} | {json_r} |\n\
         | `GET /diff`, `Accept: text/x-diff` | {patch} | {patch_r} |\n\
         | `GET /diff`, the first (its index filled from the files once) | {first} | {first_r} |\n\n\
         | download of a {DOWNLOAD_MB} MB file | time | rate | against the disk |\n|---|---|---|---|\n\
         | `std::fs::read` (baseline, page cache) | {disk} | {disk_rate} | 1.00× |\n\
         | `GET /sessions/{{id}}/files/big.bin` | {http} | {http_rate} | {http_r} |\n\n\
         | {CLIENTS} clients at once, a {EACH_MB} MB file each | time | total rate | against the disk |\n|---|---|---|---|\n\
         | {CLIENTS} threads' `std::fs::read` (baseline) | {many_disk} | {many_disk_rate} | 1.00× |\n\
         | {CLIENTS} concurrent `GET /sessions/{{id}}/files/shared.bin` | {many_http} | {many_http_rate} | {many_r} |\n",
        commit = support::commit(),
        cores = support::cores(),
        git = ms(git_m),
        json = ms(json_m),
        json_r = ratio(json_m, git_m),
        patch = ms(patch_m),
        patch_r = ratio(patch_m, git_m),
        first = ms(first),
        first_r = ratio(first, git_m),
        disk = ms(disk_m),
        disk_rate = rate(disk_m),
        http = ms(http_m),
        http_rate = rate(http_m),
        http_r = ratio(http_m, disk_m),
        many_disk = ms(many_disk_m),
        many_disk_rate = many_rate(many_disk_m),
        many_http = ms(many_http_m),
        many_http_rate = many_rate(many_http_m),
        many_r = ratio(many_http_m, many_disk_m),
    );
    println!("{table}");
    std::fs::create_dir_all("bench/results").unwrap();
    std::fs::write("bench/results/workspace.md", table).unwrap();
}
