//! The chaos run's ACP clients: each makes a session of its own over the HTTP transport
//! through the round-robin balancer in front of the replicas alive, and prompts it in a closed
//! loop. A connection that ends (a replica carrying one of its requests or streams was killed)
//! is made again and the session resumed, as an editor's bridge does. Each turn answered
//! `end_turn` reached the client whole, once, in order.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::Replicas;
use crate::support::acp::AcpClient;
use crate::support::balancer::RoundRobin;

/// What one ACP client did and saw.
#[derive(Default)]
pub struct AcpRun {
    /// Its session, once made.
    pub session: Option<String>,
    /// Turns answered `end_turn`, each checked.
    pub answered: usize,
    /// Connections made.
    pub connects: usize,
    /// Every other answer, by kind.
    pub tally: BTreeMap<String, usize>,
    pub problems: Vec<String>,
}

/// Prompts one session over ACP until `stop`.
pub async fn prompter(
    replicas: Arc<Replicas>,
    stop: Arc<AtomicBool>,
    mut rng: fastrand::Rng,
) -> AcpRun {
    let mut run = AcpRun::default();
    // The connection, and how many replicas had been killed when it was made.
    let mut client: Option<(AcpClient, usize)> = None;
    // Whether the connection has been sent nothing of a turn not yet checked.
    let mut clean = true;
    while !stop.load(Ordering::Relaxed) {
        let Some((acp, kills)) = &mut client else {
            let kills = replicas.kills();
            match connect(&replicas.balancer, run.session.as_deref()).await {
                Ok((acp, session)) => {
                    run.session = Some(session);
                    run.connects += 1;
                    client = Some((acp, kills));
                    clean = true;
                }
                Err(e) => {
                    *run.tally.entry(format!("connect: {e}")).or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            continue;
        };
        let session = run.session.clone().unwrap();
        let asked = rng.usize(20..100);
        let text = format!("/chunks {asked} /delay {}", rng.u64(0..3));
        match acp.prompt(&session, &text).await {
            Ok(answer) if answer["stopReason"] == "end_turn" => {
                let chunks = chunks(&acp.drain_notes());
                let expected: Vec<String> = (1..=asked)
                    .map(|i| format!("c{i}{}", if i == asked { "" } else { " " }))
                    .collect();
                let whole = if clean {
                    chunks == expected
                } else {
                    chunks.ends_with(&expected)
                };
                if !whole {
                    run.problems.push(format!(
                        "{session}: an ACP turn answered end_turn after {} chunks for {asked} ({:?}…)",
                        chunks.len(),
                        &chunks[..chunks.len().min(5)]
                    ));
                }
                run.answered += 1;
                clean = true;
            }
            Ok(answer) => {
                *run.tally
                    .entry(format!("{}", answer["stopReason"]))
                    .or_default() += 1;
                clean = false;
            }
            Err(e)
                if e.data
                    .as_ref()
                    .is_some_and(|d| d["reason"] == "connection_terminated") =>
            {
                if replicas.kills() == *kills {
                    run.problems.push(format!(
                        "{session}: an ACP connection ended while no replica was killed: {e:?}"
                    ));
                }
                *run.tally.entry("connection ended".into()).or_default() += 1;
                client.take().unwrap().0.close().await;
            }
            Err(e) => {
                *run.tally.entry(e.message.clone()).or_default() += 1;
                clean = false;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    if let Some((acp, _)) = client {
        acp.close().await;
    }
    run
}

/// A connection through `balancer`, initialized, with `session` resumed or a new one made.
async fn connect(
    balancer: &RoundRobin,
    session: Option<&str>,
) -> Result<(AcpClient, String), String> {
    let transport = agent_client_protocol_http::HttpClient::builder(balancer.base.clone())
        .configure_http(|h| h.no_proxy())
        .build()
        .unwrap();
    let acp = AcpClient::connect(transport).await;
    let made = match acp.initialize().await {
        Err(e) => Err(e),
        Ok(_) => match session {
            Some(id) => acp
                .call("session/resume", json!({"sessionId": id, "cwd": "/tmp"}))
                .await
                .map(|_| id.to_owned()),
            None => acp
                .call("session/new", json!({"cwd": "/tmp", "mcpServers": []}))
                .await
                .map(|a| a["sessionId"].as_str().unwrap_or_default().to_owned()),
        },
    };
    match made {
        Ok(id) => Ok((acp, id)),
        Err(e) => {
            acp.close().await;
            Err(e.message)
        }
    }
}

/// The agent's chunks among `notes`, in order.
fn chunks(notes: &[(String, Value)]) -> Vec<String> {
    notes
        .iter()
        .filter(|(_, p)| p["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|(_, p)| p["update"]["content"]["text"].as_str().map(str::to_owned))
        .collect()
}
