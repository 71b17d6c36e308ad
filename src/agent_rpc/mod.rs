//! The gateway's own JSON-RPC 2.0 client over an agent's stdio (NDJSON), on tokio.
//!
//! The gateway assigns its own request ids and keeps a pending map. Lines go to the agent's stdin
//! from the sending task itself (see `stdin`). Everything the agent writes to stdout is read, in
//! order, as [`Inbound`] by one thread, which resolves responses and dispatches the rest, so a
//! response is never seen before the notifications that preceded it. Notifications stay raw
//! JSON so unknown `sessionUpdate` variants pass through.
//!
//! Files: `connection.rs` the client side of a connection (its calls and the lines it writes),
//! `errors.rs` JSON-RPC's errors and answers, `inbound.rs` what the agent writes, parsed,
//! `process.rs` the agent's process (and the count of lines it had to ignore), `stdin.rs` its
//! stdin, `caps.rs` the capabilities an agent advertises. This file only declares them and
//! re-exports their names.

pub mod caps;
mod connection;
mod errors;
mod inbound;
mod process;
mod stdin;
pub mod terminal;

pub use connection::{Connection, PendingCall};
pub use errors::{CallError, RpcError, answer_value};
pub use inbound::{Inbound, NotificationHead, parse_line};
pub use process::{
    AgentCommand, AgentProcess, AgentStdout, ExitInfo, MAX_LINE_BYTES, count_garbage, garbage_count,
};
