//! A real webhook receiver for the tests: `tests/webhooks/receiver.py`, a Python HTTP server
//! that verifies every delivery's signature with the reference Standard Webhooks library
//! (`standardwebhooks` from PyPI, pinned in `tests/webhooks/setup.sh`), records it as an
//! attempt and answers as configured (fail the first attempts of each id, be down, be slow).
//!
//! [`Receiver::start`] makes the Python environment once per test process (a venv under the
//! target dir, `tests/webhooks/setup.sh`), spawns the receiver on an ephemeral loopback port
//! and returns once it listens; it is killed when dropped (and exits by itself when the test
//! process dies: it watches its stdin). What an attempt holds, and the settings
//! [`Receiver::configure`] takes, are described at the top of `receiver.py`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::OnceCell;

use super::PATIENCE;
use super::process::listening_on;

/// A running receiver. Deliveries go to `url` plus any path (`format!("{}/hooks", r.url)`);
/// `/_control/` is the receiver's own.
pub struct Receiver {
    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub url: String,
    pub port: u16,
    http: reqwest::Client,
    child: Child,
    /// Held so that the receiver's stdin stays open: it exits when it closes.
    _stdin: ChildStdin,
}

/// The venv's python, made by `setup.sh` the first time a test of this process asks.
static PYTHON: OnceCell<PathBuf> = OnceCell::const_new();

fn webhooks_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/webhooks")
}

/// Runs `tests/webhooks/setup.sh` (idempotent; the first run creates the venv and installs the
/// pinned `standardwebhooks`) and returns the python it prints. Panics with its stderr.
pub async fn python() -> &'static Path {
    PYTHON
        .get_or_init(|| async {
            let setup = webhooks_dir().join("setup.sh");
            let started = Instant::now();
            let out = tokio::time::timeout(
                PATIENCE * 5,
                Command::new("bash")
                    .arg(&setup)
                    .stdin(Stdio::null())
                    .stderr(Stdio::inherit())
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .unwrap_or_else(|_| panic!("{} did not finish in {:?}", setup.display(), PATIENCE * 5))
            .unwrap_or_else(|e| panic!("run {}: {e}", setup.display()));
            assert!(
                out.status.success(),
                "{} failed ({}): the webhook tests need python3 and PyPI's standardwebhooks",
                setup.display(),
                out.status
            );
            let python = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
            assert!(
                python.is_file(),
                "setup.sh printed {python:?}, not a python"
            );
            if started.elapsed() > Duration::from_secs(2) {
                eprintln!("webhook receiver: venv ready in {:?}", started.elapsed());
            }
            python
        })
        .await
}

impl Receiver {
    /// Starts a receiver that verifies with `secret` (`whsec_<base64>`) and answers 204.
    pub async fn start(secret: &str) -> Receiver {
        Receiver::start_with(secret, &[]).await
    }

    /// Starts a receiver with more of `receiver.py`'s flags: `--fail-first N`, `--fail-status S`,
    /// `--ok-status 200`, `--delay-ms D`, `--down`, another `--secret`, `--verbose`.
    pub async fn start_with(secret: &str, args: &[&str]) -> Receiver {
        super::secrets::secret(secret);
        let python = python().await;
        let mut child = Command::new(python)
            .arg(webhooks_dir().join("receiver.py"))
            .args(["--port", "0", "--secret", secret])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start tests/webhooks/receiver.py");
        let stdin = child.stdin.take().unwrap();
        let url = listening_on(child.stdout.take().unwrap(), "the receiver").await;
        let port = url.rsplit(':').next().unwrap().parse().unwrap();
        Receiver {
            url,
            port,
            http: reqwest::Client::new(),
            child,
            _stdin: stdin,
        }
    }

    /// Changes settings at runtime, e.g. `json!({"failFirst": 2})`, `json!({"down": true})`,
    /// `json!({"secret": [old, new]})` (a new secret list replaces the old one), `delayMs`,
    /// `failStatus`, `okStatus`. Panics on anything the receiver refuses.
    pub async fn configure(&self, json: Value) {
        super::secrets::secrets_in_json(&json);
        let resp = self
            .http
            .post(format!("{}/_control/config", self.url))
            .json(&json)
            .send()
            .await
            .expect("the receiver answers");
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "configure {json}: {status} {body}");
    }

    /// The attempts answered so far, in arrival order (one JSON object each: msgId, timestamp,
    /// signature, verified, error, status, aborted, attempt, body, rawBody, path, method,
    /// headers, receivedAt, answeredAt, concurrent).
    pub async fn attempts(&self) -> Vec<Value> {
        self.get_attempts("/_control/attempts").await
    }

    /// The attempts including those still waiting for their answer (`status` null).
    pub async fn attempts_in_flight(&self) -> Vec<Value> {
        self.get_attempts("/_control/attempts?inflight=1").await
    }

    async fn get_attempts(&self, path: &str) -> Vec<Value> {
        let url = format!("{}{path}", self.url);
        control(self.http.get(url)).await.json().await.unwrap()
    }

    /// Polls the answered attempts every 50 ms until `pred` holds and returns them; panics
    /// with them after [`PATIENCE`].
    pub async fn wait_for(&self, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let attempts = self.attempts().await;
            if pred(&attempts) {
                return attempts;
            }
            if Instant::now() >= deadline {
                panic!(
                    "the receiver's attempts did not match within {PATIENCE:?}: {}",
                    serde_json::to_string_pretty(&attempts).unwrap()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Forgets the attempts (and with them the fail-first counts); the settings stay.
    pub async fn reset(&self) {
        control(self.http.post(format!("{}/_control/reset", self.url))).await;
    }

    /// Kills the receiver and waits for it: its port then refuses connections.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Sends a request to the receiver's `/_control/`, which must answer with a 2xx.
async fn control(request: reqwest::RequestBuilder) -> reqwest::Response {
    request
        .send()
        .await
        .expect("the receiver answers")
        .error_for_status()
        .unwrap()
}

/// The bodies (`body`) of the verified attempts answered with a 2xx, in arrival order.
pub fn delivered(attempts: &[Value]) -> Vec<&Value> {
    attempts
        .iter()
        .filter(|a| {
            a["verified"] == true
                && a["status"]
                    .as_u64()
                    .is_some_and(|s| (200..300).contains(&s))
        })
        .map(|a| &a["body"])
        .collect()
}

/// A fresh random signing secret, `whsec_` and the base64 of 32 random bytes.
pub fn random_secret() -> String {
    use base64::Engine;
    let key: Vec<u8> = (0..32).map(|_| fastrand::u8(..)).collect();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}
