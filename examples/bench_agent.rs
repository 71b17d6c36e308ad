//! `bench_agent`: the cheapest ACP agent that streams a turn, for throughput benchmarks in
//! which the agent must cost less than the front being measured (the echo agent, built on the
//! SDK and persisting every turn, spends more CPU per prompt than the gateway does).
//!
//! One thread, blocking stdio, no runtime: it reads newline-delimited JSON-RPC from stdin and
//! answers each request before reading the next, all of a turn's lines in one write. It keeps no
//! state and no files, so it is not a test agent: sessions are not remembered, loaded or listed.
//!
//! | Method | Behaviour |
//! |---|---|
//! | `initialize` | protocolVersion 1, agentInfo `bench-agent`, no optional capability. |
//! | `session/new` | `sess_` + a counter. |
//! | `session/prompt` | N `agent_message_chunk` updates "c1 ", "c2 ", …, "cN" (N from a `/chunks N` in the prompt's first text, else `BENCH_AGENT_CHUNKS`, else 20), then `end_turn`. The last chunk's `_meta.writtenNs` is the `CLOCK_MONOTONIC` time at which the turn was written, in nanoseconds, so that a subscriber on this machine can tell how long the update took to reach it. |
//! | `session/close`, `authenticate` | `{}`. |
//!
//! Any other request gets -32601; notifications (`session/cancel`) are ignored. It exits when
//! stdin closes.
//!
//! ```text
//! cargo build --release --example bench_agent
//! ```

use std::io::{BufRead, Write};

use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    method: Option<&'a str>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Prompt {
    session_id: String,
    #[serde(default)]
    prompt: Vec<Block>,
}

#[derive(Deserialize)]
struct Block {
    #[serde(default)]
    text: Option<String>,
}

/// The chunk count a prompt asks for with `/chunks N`, if it does.
fn chunks_asked(prompt: &Prompt) -> Option<usize> {
    let text = prompt.prompt.iter().find_map(|b| b.text.as_deref())?;
    let mut words = text.split_whitespace();
    while let Some(word) = words.next() {
        if word == "/chunks" {
            return words.next()?.parse().ok();
        }
    }
    None
}

fn main() {
    let default_chunks = std::env::var("BENCH_AGENT_CHUNKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let stdin = std::io::stdin().lock();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let mut sessions = 0u64;
    for line in stdin.lines() {
        let Ok(line) = line else { break };
        let Ok(req) = serde_json::from_str::<Request>(&line) else {
            continue;
        };
        let (Some(id), Some(method)) = (req.id, req.method) else {
            continue; // a notification, or a response to nothing we asked
        };
        let id = id.get();
        let result = match method {
            "initialize" => r#"{"protocolVersion":1,"agentInfo":{"name":"bench-agent","version":"0.1.0"},"agentCapabilities":{},"authMethods":[]}"#.to_owned(),
            "session/new" => {
                sessions += 1;
                format!(r#"{{"sessionId":"sess_{sessions:032}"}}"#)
            }
            "session/prompt" => {
                let Some(prompt) = req
                    .params
                    .and_then(|p| serde_json::from_str::<Prompt>(p.get()).ok())
                else {
                    error(&mut out, id, -32602, "invalid params");
                    continue;
                };
                let n = chunks_asked(&prompt).unwrap_or(default_chunks);
                let session = serde_json::to_string(&prompt.session_id).unwrap();
                let written = monotonic_ns();
                for i in 1..=n {
                    let (space, meta) = if i < n {
                        (" ", String::new())
                    } else {
                        ("", format!(r#","_meta":{{"writtenNs":{written}}}"#))
                    };
                    let _ = writeln!(
                        out,
                        r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{session},"update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"c{i}{space}"}}{meta}}}}}}}"#
                    );
                }
                r#"{"stopReason":"end_turn"}"#.to_owned()
            }
            "session/close" | "authenticate" => "{}".to_owned(),
            _ => {
                error(&mut out, id, -32601, "Method not found");
                continue;
            }
        };
        let _ = writeln!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#);
        if out.flush().is_err() {
            break;
        }
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the same clock in every process of the machine.
fn monotonic_ns() -> i64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("a clock");
    t.tv_sec() * 1_000_000_000 + t.tv_nsec()
}

fn error(out: &mut impl Write, id: &str, code: i32, message: &str) {
    let _ = writeln!(
        out,
        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":"{message}"}}}}"#
    );
    let _ = out.flush();
}
