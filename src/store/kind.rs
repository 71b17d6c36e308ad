//! The kinds of event the logs hold that the gateway knows by name: its own, the streams' own
//! and the ACP v1 `sessionUpdate` tags. Each kind's name is written here only; everything else
//! says [`EventKind`]. A log keeps a kind as its text (an agent may send a tag or an extension
//! notification `_…` the gateway does not know, which is logged as it came), so a stored kind is
//! read with [`EventKind::parse`], which knows none of those.

/// `kinds! { GROUP { Variant = "name", … } … }` declares [`EventKind`] with every variant, its
/// name and a slice of each group's kinds, in the order written.
macro_rules! kinds {
    ($( $(#[$group_doc:meta])* $group:ident { $( $variant:ident = $name:literal, )* } )*) => {
        /// A kind of event the gateway knows by name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum EventKind {
            $($( $variant, )*)*
        }

        impl EventKind {
            $(
                $(#[$group_doc])*
                pub const $group: &'static [EventKind] = &[$( EventKind::$variant, )*];
            )*

            /// The kind's name: the SSE `event`, the log's `kind`, a webhook's `type`.
            pub const fn name(self) -> &'static str {
                match self {
                    $($( EventKind::$variant => $name, )*)*
                }
            }

            /// The kind named `name`, if the gateway knows it.
            pub fn parse(name: &str) -> Option<Self> {
                match name {
                    $($( $name => Some(EventKind::$variant), )*)*
                    _ => None,
                }
            }
        }
    };
}

kinds! {
    /// The kinds the gateway itself logs, besides the agent's `sessionUpdate` tags and extension
    /// notifications (`_…`): in sessions' logs, then in the lifecycle log.
    GATEWAY {
        TurnStarted = "turn_started",
        TurnEnded = "turn_ended",
        PermissionRequested = "permission_requested",
        PermissionResolved = "permission_resolved",
        ElicitationRequested = "elicitation_requested",
        ElicitationResolved = "elicitation_resolved",
        ElicitationCompleted = "elicitation_completed",
        SessionDeleted = "session_deleted",
        AgentExited = "agent_exited",
        StateChanged = "state_changed",
        Forked = "forked",
        WorkspaceChanged = "workspace_changed",
        PromptQueued = "prompt_queued",
        PromptWithdrawn = "prompt_withdrawn",
        SessionCreated = "session_created",
        SessionUpdated = "session_updated",
        SessionStatus = "session_status",
        WebhookDisabled = "webhook_disabled",
        WatchersChanged = "watchers_changed",
        UsageBudget = "usage_budget",
    }
    /// What only a session's stream sends, never logged: the state at a position (first in a
    /// stream asked with a snapshot) and the events retention removed before a reader got them.
    STREAM {
        State = "state",
        Gap = "gap",
    }
    /// The ACP v1 `sessionUpdate` tags the gateway knows: those an agent sends to any client,
    /// and the prompt suggestions it sends to a client that advertises
    /// `session.promptSuggestions` (as the gateway does).
    UPDATES {
        UserMessageChunk = "user_message_chunk",
        AgentMessageChunk = "agent_message_chunk",
        AgentThoughtChunk = "agent_thought_chunk",
        ToolCall = "tool_call",
        ToolCallUpdate = "tool_call_update",
        Plan = "plan",
        AvailableCommandsUpdate = "available_commands_update",
        CurrentModeUpdate = "current_mode_update",
        ConfigOptionUpdate = "config_option_update",
        SessionInfoUpdate = "session_info_update",
        UsageUpdate = "usage_update",
        PromptSuggestionsUpdate = "prompt_suggestions_update",
    }
}

impl EventKind {
    /// The log's kinds that change a session's state (what its fold reads).
    pub const STATE: &'static [EventKind] = &[
        EventKind::StateChanged,
        EventKind::CurrentModeUpdate,
        EventKind::ConfigOptionUpdate,
        EventKind::AvailableCommandsUpdate,
        EventKind::UsageUpdate,
        EventKind::Plan,
        EventKind::SessionInfoUpdate,
        EventKind::PromptSuggestionsUpdate,
        EventKind::TurnEnded,
    ];

    /// Whether it is the gateway's own (logged or only streamed), a name an agent's
    /// `sessionUpdate` tag may not take.
    pub fn is_gateway(self) -> bool {
        !Self::UPDATES.contains(&self)
    }

    /// Whether it changes a session's state.
    pub fn changes_state(self) -> bool {
        Self::STATE.contains(&self)
    }

    /// The names of `kinds`.
    pub fn names(kinds: &[EventKind]) -> Vec<&'static str> {
        kinds.iter().map(|k| k.name()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_parsed_back_from_its_name_and_in_one_group() {
        let all = [EventKind::GATEWAY, EventKind::STREAM, EventKind::UPDATES].concat();
        for kind in &all {
            assert_eq!(EventKind::parse(kind.name()), Some(*kind));
            assert_eq!(all.iter().filter(|k| *k == kind).count(), 1);
        }
        assert_eq!(EventKind::parse("_x/notice"), None);
        assert!(EventKind::TurnEnded.is_gateway() && EventKind::Gap.is_gateway());
        assert!(!EventKind::Plan.is_gateway());
    }
}
