//! What the use cases are made of: [`Parts`], every part built once by `Gateway::start`, and
//! `use_case!`, which declares a use case by the names of the parts it needs (each of the type
//! it has in `Parts`) beside settings of its own, with a `new` that clones those parts out of a
//! `Parts` and takes the settings in the order they are declared.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::counters::Counters;
use super::log::Log;
use super::placement::Placement;
use super::records::Records;
use super::requests::Requests;
use super::snapshots::States;
use super::views::Views;

/// Every part the use cases take theirs from.
pub(super) struct Parts {
    pub(super) placement: Arc<Placement>,
    pub(super) records: Arc<Records>,
    pub(super) log: Log,
    pub(super) states: Arc<States>,
    pub(super) views: Arc<Views>,
    pub(super) requests: Arc<Requests>,
    pub(super) counters: Arc<Counters>,
    /// Turns, permission and elicitation timers, the idle reaper, the heartbeat and the syncs.
    pub(super) tasks: TaskTracker,
    /// Stops the permission and elicitation timers, the idle reaper and the list sync.
    pub(super) stop: CancellationToken,
}

/// The type of a part, by the name of its field in [`Parts`].
macro_rules! part {
    (placement) => { ::std::sync::Arc<$crate::gateway::placement::Placement> };
    (records) => { ::std::sync::Arc<$crate::gateway::records::Records> };
    (log) => { $crate::gateway::log::Log };
    (states) => { ::std::sync::Arc<$crate::gateway::snapshots::States> };
    (views) => { ::std::sync::Arc<$crate::gateway::views::Views> };
    (requests) => { ::std::sync::Arc<$crate::gateway::requests::Requests> };
    (counters) => { ::std::sync::Arc<$crate::gateway::counters::Counters> };
    (tasks) => { ::tokio_util::task::TaskTracker };
    (stop) => { ::tokio_util::sync::CancellationToken };
}

/// `pub struct Name { parts: [a, b], own: Type, … }`: a use case holding parts `a` and `b` of
/// [`Parts`] and its own fields, and `Name::new(&parts, own, …)`.
macro_rules! use_case {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            parts: [$($part:ident),+ $(,)?]
            $(, $(#[$own_meta:meta])* $own:ident: $own_type:ty)* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone)]
        pub struct $name {
            $(pub(super) $part: $crate::gateway::parts::part!($part),)+
            $($(#[$own_meta])* pub(super) $own: $own_type,)*
        }

        impl $name {
            pub(super) fn new(
                parts: &$crate::gateway::parts::Parts,
                $($own: $own_type),*
            ) -> Self {
                $name {
                    $($part: parts.$part.clone(),)+
                    $($own,)*
                }
            }
        }
    };
}

pub(super) use {part, use_case};
