//! The chaos run's ACP clients: each makes a session of its own over the HTTP transport
//! through the round-robin balancer in front of the replicas alive, and prompts it in a closed
//! loop. A connection that ends (a replica carrying one of its requests or streams was killed)
//! is made again and the session resumed, as an editor's bridge does. Each turn answered
//! `end_turn` reached the client whole, once, in order; every other answer is a failure of a
//! [`Class`] the faults cause (checked afterwards against them) or a problem.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::{Value, json};

use super::Replicas;
use super::bounds::{Class, Failure, RETRY};
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
    pub failures: Vec<Failure>,
    pub problems: Vec<String>,
}

impl AcpRun {
    /// Sorts the error `e` of a request sent at `sent` (`failed`: whether the client's last
    /// prompt failed) into a failure of its class, or a problem.
    fn failed(
        &mut self,
        e: &agent_client_protocol::Error,
        sent: std::time::Duration,
        started: Instant,
        failed: bool,
    ) {
        let name = self
            .session
            .clone()
            .unwrap_or_else(|| "an ACP client".into());
        let class = if ended(e) {
            Some(Class::Lost)
        } else {
            Class::of_message(&e.message)
        };
        *self.tally.entry(e.message.clone()).or_default() += 1;
        match class {
            None => self.problems.push(format!(
                "{name}: an ACP request failed in a way no fault causes: {e:?}"
            )),
            Some(Class::Busy) if !failed => self.problems.push(format!(
                "{name}: an ACP prompt at {sent:?} found a turn running though the last one was answered"
            )),
            Some(_) => {}
        }
        if let Some(class) = class {
            self.failures.push(Failure {
                client: name,
                class,
                sent,
                answered: started.elapsed(),
            });
        }
    }
}

/// Whether `e` says the connection ended.
fn ended(e: &agent_client_protocol::Error) -> bool {
    (e.data.as_ref()).is_some_and(|d| d["reason"] == "connection_terminated")
}

/// Prompts one session over ACP until `stop`; times are since `started`.
pub async fn prompter(
    replicas: Arc<Replicas>,
    stop: Arc<AtomicBool>,
    started: Instant,
    mut rng: fastrand::Rng,
) -> AcpRun {
    let mut run = AcpRun::default();
    // The connection, and how many replicas had been killed when it was made.
    let mut client: Option<(AcpClient, usize)> = None;
    // Whether the connection has been sent nothing of a turn not yet checked.
    let mut clean = true;
    // Whether the last prompt failed (and its turn may go on without its client).
    let mut failed = false;
    while !stop.load(Ordering::Relaxed) {
        let Some((acp, kills)) = &mut client else {
            let kills = replicas.kills();
            let sent = started.elapsed();
            match connect(&replicas.balancer, run.session.as_deref()).await {
                Ok((acp, session)) => {
                    run.session = Some(session);
                    run.connects += 1;
                    client = Some((acp, kills));
                    // The turn of a prompt that failed may go on, and its last updates
                    // follow the session resumed here.
                    clean = !failed;
                }
                Err(e) => {
                    if ended(&e) && replicas.kills() == kills {
                        run.problems.push(format!(
                            "a connection to /acp ended while no replica was killed: {e:?}"
                        ));
                    }
                    run.failed(&e, sent, started, failed);
                    tokio::time::sleep(RETRY).await;
                }
            }
            continue;
        };
        let session = run.session.clone().unwrap();
        let asked = rng.usize(20..100);
        let text = format!("/chunks {asked} /delay {}", rng.u64(0..3));
        let sent = started.elapsed();
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
                failed = false;
            }
            Ok(answer) => {
                run.problems.push(format!(
                    "{session}: an ACP prompt answered {answer}, which no fault causes"
                ));
                clean = false;
            }
            Err(e) if ended(&e) => {
                if replicas.kills() == *kills {
                    run.problems.push(format!(
                        "{session}: an ACP connection ended while no replica was killed: {e:?}"
                    ));
                }
                run.failed(&e, sent, started, failed);
                failed = true;
                client.take().unwrap().0.close().await;
            }
            Err(e) => {
                run.failed(&e, sent, started, failed);
                failed = true;
                clean = false;
                tokio::time::sleep(RETRY).await;
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
) -> Result<(AcpClient, String), agent_client_protocol::Error> {
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
            Err(e)
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
