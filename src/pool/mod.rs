//! The agent pool: N identical agent processes ("members"), each run by a supervisor task that
//! starts it, initializes it, dispatches what it writes, and restarts it with backoff when it
//! exits (`supervisor`). Placement picks the least-loaded ready member, waiting a bounded time
//! for a starting one (`acquire`); the gateway pins live sessions to it. `members` holds the
//! pool and its members, `agents` one pool per configured agent, `client` the typed calls to a
//! member. This file only declares the parts and re-exports their names.

mod acquire;
mod agents;
pub mod client;
mod members;
mod supervisor;

pub use agents::{AgentHost, AgentPool, AgentSetup, Agents, MemberAgents};
pub use members::{
    AgentCallbacks, Member, MemberState, MemberView, Pool, PoolConfig, ProviderParams, SignIn,
};

pub(crate) use supervisor::authenticate;
