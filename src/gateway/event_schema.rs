//! The events as typed clients decode them: `SessionEvent` (a history page's item, and each
//! event of `GET /sessions/{id}/events`) and `LifecycleEvent` (each event of `GET /events`).
//! Every kind of event is its own schema, `{seq, event, data}` (and `createdAt` in a session's
//! history) with `event` fixed to the kind's name, and the unions choose among them by `event`
//! (a discriminator with a mapping), so that a generated client deserializes each event into its
//! own type. Agents may send kinds no document can list (newer ACP `sessionUpdate` tags,
//! extension notifications `_…`): those are `OtherSessionEvent`, which excludes every listed
//! name, so the variants never overlap.
#![allow(dead_code)] // described, never constructed

use std::borrow::Cow;

use serde_json::json;
use utoipa::openapi::schema::{Discriminator, OneOf, Schema};
use utoipa::openapi::{KnownFormat, Object, ObjectBuilder, RefOr, SchemaFormat, Type};
use utoipa::{PartialSchema, ToSchema};

use super::event_schemas::*;
use crate::gateway::UPDATE_KINDS;

type Schemas = Vec<(String, RefOr<Schema>)>;

/// One kind of event: its `event` name and the schema of its `data`.
struct Kind {
    event: &'static str,
    data: Cow<'static, str>,
    /// Adds the `data` schema and the schemas it refers to.
    register: fn(&mut Schemas),
}

fn kind<T: ToSchema>(event: &'static str) -> Kind {
    Kind {
        event,
        data: T::name(),
        register: |out| {
            out.push((T::name().into_owned(), T::schema()));
            T::schemas(out);
        },
    }
}

/// The kinds of a session's log and stream that this document lists.
fn session_kinds() -> Vec<Kind> {
    let mut kinds = vec![
        kind::<TurnStarted>("turn_started"),
        kind::<TurnEnded>("turn_ended"),
        kind::<PermissionRequested>("permission_requested"),
        kind::<PermissionResolved>("permission_resolved"),
        kind::<ElicitationRequested>("elicitation_requested"),
        kind::<ElicitationResolved>("elicitation_resolved"),
        kind::<ElicitationCompleted>("elicitation_completed"),
        kind::<SessionDeleted>("session_deleted"),
        kind::<AgentExited>("agent_exited"),
        kind::<StateChanged>("state_changed"),
        kind::<Forked>("forked"),
        kind::<Gap>("gap"),
        kind::<StateSnapshot>("state"),
    ];
    kinds.extend(
        UPDATE_KINDS
            .iter()
            .map(|tag| kind::<SessionUpdateData>(tag)),
    );
    kinds
}

/// The kinds of `GET /events`.
fn lifecycle_kinds() -> Vec<Kind> {
    vec![
        kind::<LifecycleSession>("session_created"),
        kind::<LifecycleSession>("session_updated"),
        kind::<LifecycleStatus>("session_status"),
        kind::<SessionDeleted>("session_deleted"),
        kind::<WebhookDisabled>("webhook_disabled"),
    ]
}

/// The log a union's events come from: a session's (whose history pages have `createdAt`) or
/// the lifecycle log (only streamed).
#[derive(Clone, Copy, PartialEq)]
enum Log {
    Session,
    Lifecycle,
}

/// `turn_started` → `TurnStartedEvent`; in the lifecycle log, `session_deleted` →
/// `SessionDeletedLifecycleEvent`.
fn variant_name(event: &str, log: Log) -> String {
    let mut name: String = event
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_uppercase().chain(chars).collect()
            })
        })
        .collect();
    if log == Log::Lifecycle {
        name.push_str("Lifecycle");
    }
    name.push_str("Event");
    name
}

fn reference(name: &str) -> RefOr<Schema> {
    RefOr::Ref(utoipa::openapi::Ref::from_schema_name(name))
}

/// The envelope every event shares, with `event` and `data` as given.
fn envelope(description: String, event: Object, data: RefOr<Schema>, log: Log) -> Schema {
    let envelope = ObjectBuilder::new()
        .description(Some(description))
        .property(
            "seq",
            typed(Type::Integer, KnownFormat::Int64).description(Some(
                "The event's sequence number in its log: the SSE `id` on a stream.",
            )),
        )
        .required("seq")
        .property("event", event)
        .required("event")
        .property("data", data)
        .required("data");
    match log {
        Log::Session => envelope.property(
            "createdAt",
            typed(Type::String, KnownFormat::DateTime).description(Some(
                "When it was logged: in a history page (the stream does not send it).",
            )),
        ),
        Log::Lifecycle => envelope,
    }
    .build()
    .into()
}

fn typed(ty: Type, format: KnownFormat) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(ty)
        .format(Some(SchemaFormat::KnownFormat(format)))
}

fn string(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
}

/// The schema of one kind: `event` is its name only. A pattern says so rather than an `enum`,
/// which some generators (openapi-generator's rust) turn into a type of its own that no longer
/// takes the discriminator's value.
fn variant(kind: &Kind, log: Log) -> Schema {
    let description = format!("`{}`: the SSE `event` on a stream.", kind.event);
    let event = string(&description)
        .pattern(Some(format!("^{}$", kind.event)))
        .build();
    let description = format!("`{}`: `data` is a {}.", kind.event, kind.data);
    envelope(description, event, reference(&kind.data), log)
}

/// The union of `kinds`, chosen by `event`.
fn union(kinds: &[Kind], log: Log, description: &str) -> Schema {
    let mut one_of = OneOf::new();
    let mut discriminator = Discriminator::new("event");
    for kind in kinds {
        let name = variant_name(kind.event, log);
        one_of.items.push(reference(&name));
        discriminator
            .mapping
            .insert(kind.event.into(), format!("#/components/schemas/{name}"));
    }
    one_of.discriminator = Some(discriminator);
    one_of.description = Some(description.into());
    one_of.into()
}

/// Adds the variant of each of `kinds` and its `data` to `out`.
fn register(kinds: &[Kind], log: Log, out: &mut Schemas) {
    for kind in kinds {
        out.push((variant_name(kind.event, log), variant(kind, log).into()));
        (kind.register)(out);
    }
}

/// An event of a session: any kind of `KnownSessionEvent`, or else an `OtherSessionEvent`.
pub struct SessionEvent;

impl PartialSchema for SessionEvent {
    fn schema() -> RefOr<Schema> {
        let mut one_of = OneOf::new();
        one_of.items = vec![
            reference("KnownSessionEvent"),
            reference("OtherSessionEvent"),
        ];
        one_of.description = Some(
            "One event of a session's log: an item of a history page, or one SSE event of \
             `GET /sessions/{id}/events` (its `id` is `seq`, its `event` is `event`, its `data` \
             is `data`). `event` selects the variant: a name `KnownSessionEvent` maps is that \
             variant; any other is an `OtherSessionEvent`."
                .into(),
        );
        Schema::OneOf(one_of).into()
    }
}

impl ToSchema for SessionEvent {
    fn schemas(out: &mut Schemas) {
        let kinds = session_kinds();
        register(&kinds, Log::Session, out);
        let known = union(
            &kinds,
            Log::Session,
            "An event of a kind this document lists, chosen by `event`: the gateway's own \
             events and the ACP v1 `sessionUpdate` tags.",
        );
        out.push(("KnownSessionEvent".into(), known.into()));
        let names: Vec<&str> = kinds.iter().map(|k| k.event).collect();
        let mut event = string(
            "An ACP `sessionUpdate` tag this document does not list (a newer ACP version's, or \
             an agent's own), or the method of an agent's extension notification (`_…`).",
        )
        .build();
        event
            .extensions
            .get_or_insert_with(Default::default)
            .insert("not".into(), json!({ "enum": names }));
        let data = ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::SchemaType::AnyValue)
            .description(Some(
                "The notification's params as the agent sent them: for a `sessionUpdate` tag, \
                 `sessionId` and `update` (as in `SessionUpdateData`).",
            ))
            .build();
        let other = envelope(
            "An event of a kind this document does not list: the agent's, logged as it came."
                .into(),
            event,
            data.into(),
            Log::Session,
        );
        out.push(("OtherSessionEvent".into(), other.into()));
    }
}

/// An event of `GET /events`.
pub struct LifecycleEvent;

impl PartialSchema for LifecycleEvent {
    fn schema() -> RefOr<Schema> {
        union(
            &lifecycle_kinds(),
            Log::Lifecycle,
            "One SSE event of `GET /events` (its `id` is `seq`, its `event` is `event`, its \
             `data` is `data`), chosen by `event`.",
        )
        .into()
    }
}

impl ToSchema for LifecycleEvent {
    fn schemas(out: &mut Schemas) {
        register(&lifecycle_kinds(), Log::Lifecycle, out);
    }
}

/// A page of `GET /sessions/{id}/history`.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"events": [{"seq": 1, "event": "turn_started", "data": {"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "prompt": [{"type": "text", "text": "hi"}]}, "createdAt": "2026-11-22T12:47:51.068421Z"}, {"seq": 2, "event": "agent_message_chunk", "data": {"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}}, "createdAt": "2026-11-22T12:47:51.073427Z"}], "nextAfter": 2}))]
pub struct HistoryPage {
    events: Vec<SessionEvent>,
    /// Pass as `after` for the next page; absent when this page reached the end of the log.
    next_after: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::GATEWAY_KINDS;

    #[test]
    fn every_kind_a_webhook_can_name_is_a_variant() {
        let listed: Vec<&str> = session_kinds()
            .iter()
            .chain(&lifecycle_kinds())
            .map(|k| k.event)
            .collect();
        for kind in GATEWAY_KINDS.iter().chain(UPDATE_KINDS) {
            assert!(listed.contains(kind), "{kind} is in no union");
        }
    }

    #[test]
    fn variants_are_named_after_their_event() {
        assert_eq!(
            variant_name("turn_started", Log::Session),
            "TurnStartedEvent"
        );
        assert_eq!(variant_name("state", Log::Session), "StateEvent");
        assert_eq!(
            variant_name("session_deleted", Log::Lifecycle),
            "SessionDeletedLifecycleEvent"
        );
    }
}
