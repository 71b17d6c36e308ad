//! The gateway's stage histograms (`acp_gateway_event_stage_seconds`, see
//! `src/events/stages.rs`) as read from `/metrics`: their difference over a measuring window,
//! pooled over rounds, and their quantiles (the bound of the bucket that holds one).

use std::time::Duration;

use super::Gateway;

/// One stage: its buckets' upper bounds (seconds; the last is infinite), its cumulative counts
/// and the sum of its observations (seconds).
#[derive(Debug, Clone, Default)]
pub struct Stage {
    pub name: String,
    pub bounds: Vec<f64>,
    pub counts: Vec<u64>,
    pub sum: f64,
}

/// Every stage, in the order `/metrics` gives them.
#[derive(Debug, Clone, Default)]
pub struct Stages(pub Vec<Stage>);

const NAME: &str = "acp_gateway_event_stage_seconds";

/// The value after the last space of a line.
fn value(line: &str) -> f64 {
    line.rsplit_once(' ')
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0.0)
}

/// A label's value in a line (`name="value"`).
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    line[start..].split('"').next()
}

impl Stages {
    /// The stage histograms `gw` has counted so far.
    pub async fn read(gw: &Gateway) -> Stages {
        let text = gw.get("/metrics").await.text().await.unwrap();
        let mut stages: Vec<Stage> = Vec::new();
        for line in text.lines().filter(|l| l.starts_with(NAME)) {
            let Some(name) = label(line, "stage") else {
                continue;
            };
            if stages.last().is_none_or(|s| s.name != name) {
                stages.push(Stage {
                    name: name.to_owned(),
                    ..Stage::default()
                });
            }
            let stage = stages.last_mut().expect("just pushed");
            if line.starts_with(&format!("{NAME}_bucket")) {
                let le = label(line, "le").unwrap_or("+Inf");
                stage.bounds.push(le.parse().unwrap_or(f64::INFINITY));
                stage.counts.push(value(line) as u64);
            } else if line.starts_with(&format!("{NAME}_sum")) {
                stage.sum = value(line);
            }
        }
        Stages(stages)
    }

    /// What was counted after `before` (read from the same gateway).
    pub fn since(&self, before: &Stages) -> Stages {
        Stages(
            (self.0.iter().zip(&before.0))
                .map(|(now, then)| Stage {
                    counts: (now.counts.iter().zip(&then.counts))
                        .map(|(n, t)| n - t)
                        .collect(),
                    sum: now.sum - then.sum,
                    ..now.clone()
                })
                .collect(),
        )
    }

    /// Pools another window's counts into these.
    pub fn absorb(&mut self, other: Stages) {
        if self.0.is_empty() {
            *self = other;
            return;
        }
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            for (m, t) in mine.counts.iter_mut().zip(theirs.counts) {
                *m += t;
            }
            mine.sum += theirs.sum;
        }
    }
}

impl Stage {
    /// Observations counted.
    pub fn count(&self) -> u64 {
        self.counts.last().copied().unwrap_or(0)
    }

    /// The bound of the bucket holding quantile `q`, as "≤ 0.30 ms" ("—" without observations).
    pub fn quantile(&self, q: f64) -> String {
        let total = self.count();
        if total == 0 {
            return "—".into();
        }
        let rank = ((total as f64 * q).ceil() as u64).max(1);
        let i = self.counts.iter().position(|&c| c >= rank).unwrap_or(0);
        match self.bounds[i] {
            b if b.is_finite() => format!("≤ {:.2} ms", b * 1e3),
            _ => format!("> {:.0} ms", self.bounds[i.saturating_sub(1)] * 1e3),
        }
    }

    /// The mean observation.
    pub fn mean(&self) -> Duration {
        Duration::from_secs_f64(self.sum / self.count().max(1) as f64)
    }
}
