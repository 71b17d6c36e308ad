//! What must hold in a session's log after the chaos run, and the log told briefly for a
//! failure's message.

use serde_json::Value;

/// What must hold in one session's log: seqs 1..n; every `turn_started` followed by its
/// `turn_ended` before the next; a turn that ended `end_turn` holds the chunks it asked for,
/// `c1 `…`cN`, once each, in order; no `session_deleted` (nobody deletes a session).
pub fn check_log(id: &str, log: &[Value]) -> Vec<String> {
    let mut problems = vec![];
    for (i, e) in log.iter().enumerate() {
        if e["seq"].as_i64() != Some(i as i64 + 1) {
            problems.push(format!("{id}: event {i} has seq {}", e["seq"]));
        }
    }
    let mut open: Option<(usize, Vec<&str>)> = None;
    for e in log {
        let data = &e["data"];
        match e["event"].as_str().unwrap_or("") {
            "turn_started" => {
                if open.is_some() {
                    problems.push(format!(
                        "{id}: turn at {} started before one ended",
                        e["seq"]
                    ));
                }
                let text = data["prompt"][0]["text"].as_str().unwrap_or("");
                let asked = text
                    .strip_prefix("/chunks ")
                    .and_then(|t| t.split(' ').next()?.parse().ok())
                    .unwrap_or(0);
                open = Some((asked, vec![]));
            }
            "session_deleted" => problems.push(format!(
                "{id}: marked deleted at {} though nobody deleted it: {data}",
                e["seq"]
            )),
            "agent_message_chunk" => match &mut open {
                Some((_, chunks)) => {
                    chunks.push(data["update"]["content"]["text"].as_str().unwrap_or(""))
                }
                None => problems.push(format!("{id}: chunk {} outside a turn", e["seq"])),
            },
            "turn_ended" => match open.take() {
                None => problems.push(format!("{id}: turn_ended {} without a turn", e["seq"])),
                Some((asked, chunks)) if data["stopReason"] == "end_turn" => {
                    let expected = (1..=asked).map(|i| {
                        if i == asked {
                            format!("c{i}")
                        } else {
                            format!("c{i} ")
                        }
                    });
                    if !expected.eq(chunks.iter().map(|c| c.to_string())) {
                        problems.push(format!(
                            "{id}: the turn ended at {} asked for {asked} chunks and holds {} ({:?}…)",
                            e["seq"],
                            chunks.len(),
                            &chunks[..chunks.len().min(5)]
                        ));
                    }
                }
                Some(_) => {}
            },
            _ => {}
        }
    }
    if open.is_some() {
        problems.push(format!("{id}: the last turn never ended"));
    }
    if problems.len() > 10 {
        let n = problems.len();
        problems.truncate(10);
        problems.push(format!("{id}: … {} more", n - 10));
    }
    if !problems.is_empty() {
        problems.push(format!("{id}: the log's turns:\n{}", outline(log)));
    }
    problems
}

/// The log without its chunks: one line per other event, a count for each run of chunks.
pub fn outline(log: &[Value]) -> String {
    let mut out = String::new();
    let mut chunks = 0;
    for e in log {
        if e["event"] == "agent_message_chunk" {
            chunks += 1;
            continue;
        }
        if chunks > 0 {
            out += &format!("    … {chunks} chunks\n");
            chunks = 0;
        }
        let mut data = e["data"].clone();
        data.as_object_mut().map(|d| d.remove("sessionId"));
        out += &format!("    {} {} {data}\n", e["seq"], e["event"]);
    }
    if chunks > 0 {
        out += &format!("    … {chunks} chunks\n");
    }
    out
}
