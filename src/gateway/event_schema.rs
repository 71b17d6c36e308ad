//! The events as typed clients decode them: `SessionEvent` (a history page's item, and each
//! event of `GET /sessions/{id}/events`) and `LifecycleEvent` (each event of `GET /events`),
//! built from the variants of `event.rs`'s events. Every kind of event is its own schema,
//! `{seq, event, data}` (and `createdAt` in a session's history) with `event` fixed to the kind's
//! name, and the unions choose among them by `event` (a discriminator with a mapping), so that a
//! generated client deserializes each event into its own type. Agents may send kinds no document
//! can list (newer ACP `sessionUpdate` tags, extension notifications `_…`): those are
//! `OtherSessionEvent`, which excludes every listed name, so the variants never overlap.

use serde_json::json;
use utoipa::openapi::schema::{Discriminator, OneOf, Schema};
use utoipa::openapi::{KnownFormat, Object, ObjectBuilder, RefOr, SchemaFormat, Type};
use utoipa::{PartialSchema, ToSchema};

use super::event::{GatewayEvent, GatewayLifecycleEvent, Schemas, SessionUpdateData, Variant};
use crate::store::EventKind;

/// The kinds of a session's log and stream that this document lists: the gateway's, then the
/// ACP `sessionUpdate` tags it knows.
fn session_kinds() -> Vec<Variant> {
    let ours = GatewayEvent::VARIANTS.iter().copied();
    let updates = EventKind::UPDATES
        .iter()
        .map(|&kind| Variant::of::<SessionUpdateData>(kind));
    ours.chain(updates).collect()
}

/// The kinds of `GET /events`.
fn lifecycle_kinds() -> Vec<Variant> {
    GatewayLifecycleEvent::VARIANTS.to_vec()
}

/// The log a union's events come from: a session's (whose history pages have `createdAt`) or
/// the lifecycle log (only streamed).
#[derive(Clone, Copy, PartialEq)]
enum Logged {
    Session,
    Lifecycle,
}

/// A variant's schema name: its kind's name in upper camel case, then `Event` (`LifecycleEvent`
/// in the lifecycle log).
fn variant_name(event: &str, log: Logged) -> String {
    let mut name: String = event
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_uppercase().chain(chars).collect()
            })
        })
        .collect();
    if log == Logged::Lifecycle {
        name.push_str("Lifecycle");
    }
    name.push_str("Event");
    name
}

fn reference(name: &str) -> RefOr<Schema> {
    RefOr::Ref(utoipa::openapi::Ref::from_schema_name(name))
}

/// The envelope every event shares, with `event` and `data` as given.
fn envelope(description: String, event: Object, data: RefOr<Schema>, log: Logged) -> Schema {
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
        Logged::Session => envelope.property(
            "createdAt",
            typed(Type::String, KnownFormat::DateTime).description(Some(
                "When it was logged: in a history page (the stream does not send it).",
            )),
        ),
        Logged::Lifecycle => envelope,
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
fn variant(kind: &Variant, log: Logged) -> Schema {
    let (name, data) = (kind.kind.name(), (kind.data)());
    let description = format!("`{name}`: the SSE `event` on a stream.");
    let event = string(&description)
        .pattern(Some(format!("^{name}$")))
        .build();
    let description = format!("`{name}`: `data` is a {data}.");
    envelope(description, event, reference(&data), log)
}

/// The union of `kinds`, chosen by `event`.
fn union(kinds: &[Variant], log: Logged, description: &str) -> Schema {
    let mut one_of = OneOf::new();
    let mut discriminator = Discriminator::new("event");
    for kind in kinds {
        let name = variant_name(kind.kind.name(), log);
        one_of.items.push(reference(&name));
        discriminator.mapping.insert(
            kind.kind.name().into(),
            format!("#/components/schemas/{name}"),
        );
    }
    one_of.discriminator = Some(discriminator);
    one_of.description = Some(description.into());
    one_of.into()
}

/// Adds the variant of each of `kinds` and its `data` to `out`.
fn register(kinds: &[Variant], log: Logged, out: &mut Schemas) {
    for kind in kinds {
        out.push((
            variant_name(kind.kind.name(), log),
            variant(kind, log).into(),
        ));
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
        register(&kinds, Logged::Session, out);
        let known = union(
            &kinds,
            Logged::Session,
            "An event of a kind this document lists, chosen by `event`: the gateway's own \
             events and the ACP v1 `sessionUpdate` tags.",
        );
        out.push(("KnownSessionEvent".into(), known.into()));
        let names: Vec<&str> = kinds.iter().map(|k| k.kind.name()).collect();
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
            Logged::Session,
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
            Logged::Lifecycle,
            "One SSE event of `GET /events` (its `id` is `seq`, its `event` is `event`, its \
             `data` is `data`), chosen by `event`.",
        )
        .into()
    }
}

impl ToSchema for LifecycleEvent {
    fn schemas(out: &mut Schemas) {
        register(&lifecycle_kinds(), Logged::Lifecycle, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_a_webhook_can_name_is_a_variant() {
        let listed: Vec<EventKind> = session_kinds()
            .iter()
            .chain(&lifecycle_kinds())
            .map(|k| k.kind)
            .collect();
        for kind in EventKind::GATEWAY.iter().chain(EventKind::UPDATES) {
            assert!(listed.contains(kind), "{kind:?} is in no union");
        }
    }

    #[test]
    fn variants_are_named_after_their_event() {
        assert_eq!(
            variant_name(EventKind::TurnStarted.name(), Logged::Session),
            "TurnStartedEvent"
        );
        assert_eq!(
            variant_name(EventKind::State.name(), Logged::Session),
            "StateEvent"
        );
        assert_eq!(
            variant_name(EventKind::SessionDeleted.name(), Logged::Lifecycle),
            "SessionDeletedLifecycleEvent"
        );
    }
}
