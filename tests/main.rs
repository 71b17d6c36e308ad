//! Every integration test in one crate, so that what they share (`support`) is compiled once and
//! one binary is linked: each file of `tests/` is a module of it, named as the file (`cargo test
//! --test integration sessions::` runs one file's tests). Cargo runs the tests of a binary on
//! as many threads as there are cores, so one file's tests fill another's waits.

#[macro_use]
mod support;

mod access;
mod acp;
mod agent_login;
mod agents;
mod architecture;
mod availability;
mod browser;
mod chaos;
mod check_agent;
mod cluster;
mod cluster_acp;
mod connect;
mod controls;
mod database_urls;
mod elicitations;
mod faults;
mod files;
mod flood;
mod forwarded;
mod hostile_input;
mod http2;
mod idempotency;
mod identity;
mod image;
mod installs;
mod list_sync;
mod moves;
mod oidc;
mod openapi;
mod outage;
mod people;
mod queue;
mod rebinding;
mod remote_agents;
mod remote_workspaces;
mod security;
mod sessions;
mod shares;
mod slow_clients;
mod soak;
mod store_contract;
mod stream_bytes;
mod streams;
mod system;
mod tenant_env;
mod tenant_limits;
mod traces;
mod transcripts;
mod turns;
mod upgrades;
mod usage;
mod webhook_receiver;
mod webhook_targets;
mod webhooks;
mod worktrees;
