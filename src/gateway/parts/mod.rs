//! What the use cases are made of: [`Parts`], every part built once by `Gateway::start`, and
//! `use_case!`, which declares a use case by the names of the parts it needs (each of the type
//! it has in `Parts`) beside settings of its own, with a `new` that clones those parts out of a
//! `Parts` and takes the settings in the order they are declared.

pub(in crate::gateway) mod callbacks;
pub(in crate::gateway) mod counters;
pub(in crate::gateway) mod elicitations;
pub(in crate::gateway) mod form;
pub(in crate::gateway) mod info_update;
pub(in crate::gateway) mod installs;
pub(in crate::gateway) mod kicks;
pub(in crate::gateway) mod live;
pub(in crate::gateway) mod log;
pub(in crate::gateway) mod meter;
pub(in crate::gateway) mod pending;
pub(in crate::gateway) mod permissions;
pub(in crate::gateway) mod placement;
pub(in crate::gateway) mod quotas;
pub(in crate::gateway) mod records;
pub(in crate::gateway) mod replicas;
pub(in crate::gateway) mod requests;
pub(in crate::gateway) mod snapshots;
pub(in crate::gateway) mod views;
pub(in crate::gateway) mod watchers;
pub(in crate::gateway) mod workspaces;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use counters::Counters;
use installs::AgentInstalls;
use log::Log;
use meter::Meter;
use placement::Placement;
use records::Records;
use requests::Requests;
use snapshots::States;
use views::Views;
use watchers::Watchers;
use workspaces::Workspaces;

/// `Parts`, written once: the struct, `Parts::new` taking every part in this order, and a
/// method per part handing out a clone of it (the fields stay private).
macro_rules! parts {
    ($($(#[$doc:meta])* $name:ident: $type:ty),+ $(,)?) => {
        /// Every part the use cases take theirs from.
        pub(in crate::gateway) struct Parts {
            $($(#[$doc])* $name: $type,)+
        }

        impl Parts {
            /// Every part, built by `Gateway::start`.
            #[allow(clippy::too_many_arguments)]
            pub(in crate::gateway) fn new($($name: $type),+) -> Self {
                Parts { $($name),+ }
            }

            $(
                pub(in crate::gateway) fn $name(&self) -> $type {
                    self.$name.clone()
                }
            )+
        }
    };
}

parts! {
    placement: Arc<Placement>,
    records: Arc<Records>,
    log: Log,
    states: Arc<States>,
    views: Arc<Views>,
    requests: Arc<Requests>,
    counters: Arc<Counters>,
    workspaces: Arc<Workspaces>,
    watchers: Arc<Watchers>,
    meter: Arc<Meter>,
    installs: Arc<AgentInstalls>,
    /// Turns, permission and elicitation timers, the idle reaper, the heartbeat and the syncs.
    tasks: TaskTracker,
    /// Stops the permission and elicitation timers, the idle reaper and the list sync.
    stop: CancellationToken,
}

/// The type of a part, by the name of its field in [`Parts`].
macro_rules! part {
    (placement) => { ::std::sync::Arc<$crate::gateway::parts::placement::Placement> };
    (records) => { ::std::sync::Arc<$crate::gateway::parts::records::Records> };
    (log) => { $crate::gateway::parts::log::Log };
    (states) => { ::std::sync::Arc<$crate::gateway::parts::snapshots::States> };
    (views) => { ::std::sync::Arc<$crate::gateway::parts::views::Views> };
    (requests) => { ::std::sync::Arc<$crate::gateway::parts::requests::Requests> };
    (counters) => { ::std::sync::Arc<$crate::gateway::parts::counters::Counters> };
    (workspaces) => { ::std::sync::Arc<$crate::gateway::parts::workspaces::Workspaces> };
    (watchers) => { ::std::sync::Arc<$crate::gateway::parts::watchers::Watchers> };
    (meter) => { ::std::sync::Arc<$crate::gateway::parts::meter::Meter> };
    (installs) => { ::std::sync::Arc<$crate::gateway::parts::installs::AgentInstalls> };
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
            $(pub(in crate::gateway) $part: $crate::gateway::parts::part!($part),)+
            $($(#[$own_meta])* pub(in crate::gateway) $own: $own_type,)*
        }

        impl $name {
            pub(in crate::gateway) fn new(
                parts: &$crate::gateway::parts::Parts,
                $($own: $own_type),*
            ) -> Self {
                $name {
                    $($part: parts.$part(),)+
                    $($own,)*
                }
            }
        }
    };
}

pub(in crate::gateway) use {part, use_case};
