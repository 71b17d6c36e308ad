//! The secrets a test hands a gateway, which none of the gateway's log lines may hold: the API
//! keys and tokens of its flags, environment, keys file and `--config` file, the URL passwords
//! of its arguments, every key a request of the harness carries, the webhook signing secrets
//! and URL passwords in the bodies the harness sends and receives, and whatever a test names
//! with [`secret`]. Every gateway the harness starts with a log is checked when it is stopped
//! or dropped ([`check_log`]): the first line holding a secret fails the test.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

use serde_json::Value;

/// Every secret a test of this binary has used (tests run side by side: a secret of one is
/// no other gateway's to log either).
static SECRETS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Shorter strings are too likely to occur in a log by chance to count as a leak.
const SHORTEST: usize = 8;

/// Names `value` a secret no gateway log may hold.
pub fn secret(value: &str) {
    let value = value.trim();
    if value.len() >= SHORTEST {
        SECRETS.lock().unwrap().insert(value.to_owned());
    }
}

/// The password (else the user name, a token) of each URL in `text`.
fn url_credentials(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        rest = &rest[at + 3..];
        let end = rest
            .find(|c: char| c.is_whitespace() || "/?#".contains(c))
            .unwrap_or(rest.len());
        if let Some((userinfo, _)) = rest[..end].rsplit_once('@') {
            let credential = match userinfo.split_once(':') {
                Some((_, password)) => password,
                None => userinfo,
            };
            found.push(credential.to_owned());
        }
    }
    found
}

/// Names the secrets in `text`: its URLs' credentials.
pub fn secrets_in_text(text: &str) {
    for credential in url_credentials(text) {
        secret(&credential);
    }
}

/// Names the secrets in a JSON body: webhook signing secrets, tokens, and URL credentials.
pub fn secrets_in_json(value: &Value) {
    match value {
        Value::String(s) => {
            if s.starts_with("whsec_") {
                secret(s);
            }
            secrets_in_text(s);
        }
        Value::Array(items) => items.iter().for_each(secrets_in_json),
        Value::Object(fields) => {
            for (name, field) in fields {
                let name = name.to_ascii_lowercase().replace(['_', '-'], "");
                let secretive = [
                    "secret",
                    "clientsecret",
                    "token",
                    "accesstoken",
                    "password",
                    "apikey",
                ]
                .contains(&name.as_str());
                match field {
                    Value::String(s) if secretive => secret(s),
                    _ => secrets_in_json(field),
                }
            }
        }
        _ => {}
    }
}

/// The key of each `TENANT:KEY` line of a keys file's text.
fn keys_of_file(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once(':').map(|(_, key)| key))
}

/// What a gateway's command line and environment hand it that must stay secret, named with
/// [`secret`]; the files it names (keys file, `--config`) are read again at the check, since
/// a test may change them while the gateway runs.
pub fn secrets_of_command(args: &[String], env: &[(String, String)]) -> Vec<String> {
    let mut files = Vec::new();
    for pair in args.windows(2) {
        let (flag, value) = (pair[0].as_str(), pair[1].as_str());
        match flag {
            "--api-key" => secret(value.split_once(':').map_or(value, |(_, key)| key)),
            "--admin-api-key" | "--token" => secret(value),
            "--api-keys-file" | "--config" => files.push(value.to_owned()),
            _ => {}
        }
    }
    args.iter().for_each(|a| secrets_in_text(a));
    for (name, value) in env {
        let name = name.to_ascii_uppercase();
        // A file's path, a directory or a duration is no secret (a keys file is read instead).
        let about = ["FILE", "PATH", "DIR", "TTL"]
            .iter()
            .any(|s| name.contains(s));
        if name.contains("KEYS_FILE") {
            files.push(value.clone());
        } else if !about
            && ["KEY", "TOKEN", "SECRET", "PASSWORD"]
                .iter()
                .any(|s| name.contains(s))
        {
            // A list of keys (`ACP_GATEWAY_API_KEYS`), each `TENANT:KEY` or a key.
            for item in value.split(',') {
                secret(item.split_once(':').map_or(item, |(_, key)| key));
            }
        }
        secrets_in_text(value);
    }
    files
}

/// Names the secrets of the files a gateway was given: each key of a keys file, each `token`
/// of a `--config` file (and its URLs' credentials).
fn secrets_of_files(files: &[String]) {
    for file in files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for key in keys_of_file(&text) {
            secret(key);
        }
        for line in text.lines() {
            if let Some((name, value)) = line.split_once('=')
                && name.trim() == "token"
            {
                secret(value.trim().trim_matches('"'));
            }
        }
        secrets_in_text(&text);
    }
}

/// Fails (panics with the line) when the log at `log` holds a secret of this test binary,
/// those of the gateway's `files` included.
pub fn check_log(log: &Path, files: &[String]) {
    secrets_of_files(files);
    let Ok(text) = std::fs::read_to_string(log) else {
        return;
    };
    let secrets = SECRETS.lock().unwrap().clone();
    for line in text.lines() {
        if let Some(leaked) = secrets.iter().find(|s| line.contains(s.as_str())) {
            panic!(
                "a gateway logged a secret the test used ({leaked:?}) in {}:\n{line}",
                log.display()
            );
        }
    }
}
