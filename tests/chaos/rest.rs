//! The chaos run's REST clients: each prompts a session of its own in a closed loop through
//! random replicas, and sorts every answer: a turn answered `end_turn`, a failure of a
//! [`Class`] the faults cause (checked afterwards against them, [`super::bounds`]), or a
//! problem (any other answer, no answer in time, a connection a live replica dropped, a busy
//! session whose last prompt was answered).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::{Value, json};

use super::Replicas;
use super::bounds::{Class, Failure, RETRY};
use crate::support::PATIENCE;

/// What one REST client did and saw.
#[derive(Default)]
pub struct RestRun {
    /// Turns answered `end_turn`.
    pub answered: usize,
    pub failures: Vec<Failure>,
    /// Every answer, by status and problem type (or what became of it).
    pub tally: BTreeMap<String, usize>,
    pub problems: Vec<String>,
}

/// Prompts session `id` in a closed loop through random replicas until `stop`; times are
/// since `started`.
pub async fn prompter(
    id: String,
    replicas: Arc<Replicas>,
    stop: Arc<AtomicBool>,
    started: Instant,
    mut rng: fastrand::Rng,
) -> RestRun {
    let mut run = RestRun::default();
    // Whether the last prompt failed (and its turn may go on without its client).
    let mut failed = false;
    while !stop.load(Ordering::Relaxed) {
        let (generation, gw) = replicas.pick(&mut rng);
        let text = format!("/chunks {} /delay {}", rng.usize(20..200), rng.u64(0..3));
        let sent = started.elapsed();
        let request = gw
            .http
            .post(gw.prompt_url(&id))
            .json(&json!({ "text": text }))
            .send();
        // The answer, or `Err` with what became of it.
        let answer = match tokio::time::timeout(PATIENCE, request).await {
            Err(_) => Err("hung"),
            Ok(Err(_)) => Err("lost"),
            Ok(Ok(r)) => {
                let status = r.status().as_u16();
                match tokio::time::timeout(PATIENCE, r.json::<Value>()).await {
                    Err(_) => Err("hung"),
                    Ok(Err(_)) => Err("lost"),
                    Ok(Ok(body)) => Ok((status, body)),
                }
            }
        };
        let answered = started.elapsed();
        let (key, class) = match &answer {
            Ok((200, body)) if body["stopReason"] == "end_turn" => {
                run.answered += 1;
                failed = false;
                *run.tally.entry("200 end_turn".into()).or_default() += 1;
                continue;
            }
            Ok((status, body)) => {
                let kind = body["type"].as_str().unwrap_or_default();
                let class = Class::of_problem(*status, kind);
                let key = format!("{status} {}", kind.rsplit(':').next().unwrap_or_default());
                if class.is_none() {
                    run.problems.push(format!(
                        "{id}: a prompt answered {status}, which no fault causes: {body}"
                    ));
                }
                (key, class)
            }
            Err("lost") if replicas.was_killed(generation) => ("lost".into(), Some(Class::Lost)),
            Err("lost") => {
                run.problems
                    .push(format!("{id}: a live replica dropped a prompt at {sent:?}"));
                ("lost by a live replica".into(), None)
            }
            Err(what) => {
                run.problems
                    .push(format!("{id}: a prompt sent at {sent:?} was not answered"));
                (what.to_string(), None)
            }
        };
        *run.tally.entry(key).or_default() += 1;
        if class == Some(Class::Busy) && !failed {
            run.problems.push(format!(
                "{id}: a prompt at {sent:?} found a turn running though the last one was answered"
            ));
        }
        if let Some(class) = class {
            run.failures.push(Failure {
                client: id.clone(),
                class,
                sent,
                answered,
            });
        }
        failed = true;
        // Come back shortly, as a client told to retry does.
        tokio::time::sleep(RETRY).await;
    }
    run
}
