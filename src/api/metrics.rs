//! `/metrics`: the Prometheus text exposition. The service's numbers ([`Stats`]) are published
//! as of each scrape, beside the HTTP and upstream-call metrics recorded as they happen
//! (`telemetry`).

use metrics::{counter, describe_counter, describe_gauge, gauge};

use crate::events::{BOUNDS_US, LatencyCounts};
use crate::gateway::Stats;
use crate::pool::MemberState;

/// The exposition, with `stats` as the service's values now.
pub fn render(stats: &Stats) -> String {
    let handle = crate::telemetry::handle();
    let set_gauge = |name: &'static str, help: &'static str, value: f64| {
        describe_gauge!(name, help);
        gauge!(name).set(value);
    };
    let set_counter = |name: &'static str, help: &'static str, value: u64| {
        describe_counter!(name, help);
        counter!(name).absolute(value);
    };
    let members = &stats.members;
    set_gauge(
        "acp_gateway_members",
        "Pool members configured.",
        members.len() as f64,
    );
    set_gauge(
        "acp_gateway_members_ready",
        "Pool members ready.",
        stats.members_ready as f64,
    );
    describe_gauge!(
        "acp_gateway_agent_members_ready",
        "Pool members ready, by agent."
    );
    for (agent, ready) in &stats.agents_ready {
        gauge!("acp_gateway_agent_members_ready", "agent" => agent.clone()).set(*ready as f64);
    }
    describe_gauge!("acp_gateway_members_by_state", "Pool members by state.");
    for state in [
        MemberState::Starting,
        MemberState::Ready,
        MemberState::Restarting,
        MemberState::CrashLoop,
        MemberState::Stopped,
    ] {
        let n = members.iter().filter(|m| m.state == state).count();
        let label = serde_json::to_value(state).expect("state serialises");
        let label = label.as_str().unwrap_or_default().to_owned();
        gauge!("acp_gateway_members_by_state", "state" => label).set(n as f64);
    }
    let restarts: u32 = members.iter().map(|m| m.restarts).sum();
    set_counter(
        "acp_gateway_member_restarts_total",
        "Member restarts.",
        u64::from(restarts),
    );
    set_counter(
        "acp_gateway_member_exits_total",
        "Member process exits.",
        stats.member_exits,
    );
    set_counter(
        "acp_gateway_sessions_vanished_total",
        "Sessions the list sync marked deleted because their agent no longer knows them.",
        stats.sessions_vanished,
    );
    set_counter(
        "acp_gateway_sessions_revived_total",
        "Sessions the list sync had marked deleted that came back (listed, served or used again).",
        stats.sessions_revived,
    );
    set_gauge(
        "acp_gateway_sessions_live",
        "Sessions loaded in a member.",
        stats.sessions_live as f64,
    );
    set_gauge(
        "acp_gateway_replicas",
        "Replicas registered in the database (this one included), as of its last heartbeat.",
        stats.replicas as f64,
    );
    set_gauge(
        "acp_gateway_replicas_live",
        "Registered replicas that beat within three heartbeat intervals.",
        stats.replicas_live as f64,
    );
    set_counter(
        "acp_gateway_events_appended_total",
        "Session events appended to the log.",
        stats.events_appended,
    );
    set_counter(
        "acp_gateway_event_commits_total",
        "Group commits of session events (appended ÷ commits is the mean batch).",
        stats.event_commits,
    );
    set_gauge(
        "acp_gateway_sse_subscribers",
        "SSE streams open now (session and lifecycle).",
        stats.sse_open as f64,
    );
    set_counter(
        "acp_gateway_sse_lagged_total",
        "Times an SSE subscriber fell behind the live broadcast and read from the log.",
        stats.sse_lagged,
    );
    set_counter(
        "acp_gateway_sse_closed_total",
        "SSE streams the gateway closed because the log could not be read (clients reconnect).",
        stats.sse_closed,
    );
    set_counter(
        "acp_gateway_turns_started_total",
        "Prompt turns started.",
        stats.turns_started,
    );
    set_counter(
        "acp_gateway_turns_failed_total",
        "Prompt turns that ended with an error.",
        stats.turns_failed,
    );
    set_gauge(
        "acp_gateway_permissions_pending",
        "Permission requests awaiting an answer.",
        stats.permissions_pending as f64,
    );
    set_gauge(
        "acp_gateway_elicitations_pending",
        "Elicitations awaiting an answer.",
        stats.elicitations_pending as f64,
    );
    set_counter(
        "acp_gateway_agent_garbage_total",
        "Agent output lines or messages ignored as invalid.",
        crate::agent_rpc::garbage_count(),
    );
    handle.run_upkeep();
    let mut text = handle.render();
    stages(&mut text, &stats.event_stages);
    text
}

/// The event hub's stage histograms, kept by the hub itself (fixed buckets, atomic counters),
/// in the exposition's histogram form.
fn stages(text: &mut String, stages: &[(&'static str, LatencyCounts)]) {
    use std::fmt::Write;
    const NAME: &str = "acp_gateway_event_stage_seconds";
    let _ = writeln!(
        text,
        "# HELP {NAME} Time events spend on their way to subscribers: queued until their batch's write starts (waited, per event), the write with its commit (written, per batch), the commit until a live subscriber's stream takes it (handed, per subscriber and batch).\n# TYPE {NAME} histogram"
    );
    for (stage, counts) in stages {
        let mut total = 0;
        for (i, n) in counts.buckets.iter().enumerate() {
            total += n;
            let le = BOUNDS_US
                .get(i)
                .map_or("+Inf".to_owned(), |us| (*us as f64 / 1e6).to_string());
            let _ = writeln!(
                text,
                "{NAME}_bucket{{stage=\"{stage}\",le=\"{le}\"}} {total}"
            );
        }
        let sum = counts.sum_ns as f64 / 1e9;
        let _ = writeln!(text, "{NAME}_sum{{stage=\"{stage}\"}} {sum}");
        let _ = writeln!(text, "{NAME}_count{{stage=\"{stage}\"}} {total}");
    }
}
