//! `GET /openapi.json`: the service's API as an OpenAPI 3.1 document, for
//! app developers to read and to generate clients from.
//!
//! The document is generated from the code: each handler carries a
//! `#[utoipa::path]` attribute beside it (method, path, parameters,
//! answers) and each body type derives `ToSchema` where it is declared, so
//! a changed field changes the document. [`ApiDoc`] gathers them. That
//! every route of [`super::router`] is described, with the methods it
//! answers, is checked by walking the router itself (the `openapi` tests),
//! and the running service is tested against this document by schemathesis.
//!
//! The document is public, like the README: it describes the code, never a
//! configuration (no room, no key, no token), so it is the same for every
//! caller and every instance.

use std::borrow::Cow;
use std::sync::LazyLock;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{IntoParams, Modify, OpenApi, PartialSchema, ToSchema};

/// The room of the path: `[a-z0-9][a-z0-9-]{0,63}`; any other name is
/// answered 404, as a room that does not exist. Public, with its module:
/// only the derive reads its field, which in a crate-private type the
/// compiler would call dead.
#[derive(IntoParams)]
#[into_params(names("room"), parameter_in = Path)]
pub struct RoomParam(#[param(pattern = r"^[a-z0-9][a-z0-9-]{0,63}$", example = "sale")] pub String);

/// Every JSON error: a stable code and a sentence for people. Some errors
/// add fields (a refused join's fresh `challenge`, the `reason` a token was
/// refused), so clients should ignore keys they do not know.
#[derive(Serialize, ToSchema)]
#[schema(as = Error, example = json!({"error": "unknown_room", "message": "There is no room \"sale\"."}))]
pub(crate) struct ErrorBody {
    /// A stable, machine-readable code (`unknown_room`, `no_ticket`, …).
    pub error: String,
    /// A human sentence; its wording may change.
    pub message: String,
}

/// One event of an event stream as an `EventSource` (and schemathesis)
/// parses it: its name (`event`), `id`, `retry` and `data`, the JSON text
/// a handler parses. One schema per event name; each `data` is described
/// by `contentSchema` and its start checked by a `pattern`, since a
/// validator checks only the text, not the JSON inside it.
fn sse_events(events: serde_json::Value) -> RefOr<Schema> {
    serde_json::from_value(serde_json::json!({ "oneOf": events }))
        .expect("the event schemas are well-formed")
}

/// An event with a fixed name (or one of several), an `id` schema and a
/// `data` whose JSON has `content`.
fn sse_event(
    names: &[&str],
    id: serde_json::Value,
    pattern: &str,
    content: serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "required": ["event", "data"],
        "additionalProperties": false,
        "properties": {
            "event": { "type": "string", "enum": names },
            "id": id,
            "retry": { "type": "integer", "minimum": 0 },
            "data": {
                "type": "string",
                "pattern": pattern,
                "contentMediaType": "application/json",
                "contentSchema": content,
            },
        },
    })
}

/// The events of a visitor's stream (`GET /api/rooms/{room}/events`):
/// `position` while waiting (its `id` the number ahead, which a
/// reconnecting browser sends back as `Last-Event-ID`), then one event
/// that ends the stream with `id: end`.
pub(crate) struct VisitorEvent;

impl PartialSchema for VisitorEvent {
    fn schema() -> RefOr<Schema> {
        let end = serde_json::json!({ "type": "string", "enum": ["end"] });
        sse_events(serde_json::json!([
            sse_event(
                &["position"],
                serde_json::json!({ "type": "string", "pattern": "^[0-9]+$" }),
                r#"^\{"status":"waiting","#,
                serde_json::json!({ "$ref": "#/components/schemas/VisitorStatus" }),
            ),
            sse_event(
                &["admitted"],
                end.clone(),
                r#"^\{"status":"admitted","#,
                serde_json::json!({
                    "type": "object",
                    "required": ["status"],
                    "properties": {
                        "status": { "type": "string", "enum": ["admitted"] },
                        "redirect": { "type": ["string", "null"], "description": "Where to go now: the return path." },
                        "pass_expires_at": { "type": ["string", "null"], "format": "date-time" },
                    },
                }),
            ),
            sse_event(
                &["expired", "left"],
                end.clone(),
                r#"^\{"status":"(expired|left)"\}$"#,
                serde_json::json!({
                    "type": "object",
                    "required": ["status"],
                    "properties": { "status": { "type": "string", "enum": ["expired", "left"] } },
                }),
            ),
            sse_event(
                &["closed"],
                end.clone(),
                r#"^\{"status":"closed","reason":"(sold_out|closed)"\}$"#,
                serde_json::json!({
                    "type": "object",
                    "required": ["status", "reason"],
                    "properties": {
                        "status": { "type": "string", "enum": ["closed"] },
                        "reason": { "type": "string", "enum": ["sold_out", "closed"] },
                    },
                }),
            ),
            sse_event(
                &["reset"],
                end,
                r#"^\{"status":"reset"\}$"#,
                serde_json::json!({
                    "type": "object",
                    "required": ["status"],
                    "properties": { "status": { "type": "string", "enum": ["reset"] } },
                }),
            ),
        ]))
    }
}

impl ToSchema for VisitorEvent {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("VisitorEvent")
    }
}

/// The events of the operators' stream (`GET /admin/events`): `history`
/// once (each room's last minutes of figures), then `update` every second
/// (every room's view).
pub(crate) struct DashboardEvent;

impl PartialSchema for DashboardEvent {
    fn schema() -> RefOr<Schema> {
        let none = serde_json::json!({ "type": "string" });
        sse_events(serde_json::json!([
            sse_event(
                &["history"],
                none.clone(),
                r#"^\{"rooms":\{"#,
                serde_json::json!({
                    "type": "object",
                    "required": ["rooms"],
                    "properties": { "rooms": {
                        "type": "object",
                        "description": "Per room, its figures a second apart, oldest first.",
                        "additionalProperties": { "type": "array", "items": { "type": "object" } },
                    } },
                }),
            ),
            sse_event(
                &["update"],
                none,
                r#"^\{"rooms":\["#,
                serde_json::json!({
                    "type": "object",
                    "required": ["rooms"],
                    "properties": { "rooms": { "type": "array", "items": { "type": "object" } } },
                }),
            ),
        ]))
    }
}

impl ToSchema for DashboardEvent {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("DashboardEvent")
    }
}

/// Names the two bearer schemes the operations refer to.
struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        let mut bearer = |name: &str, description: &str| {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.description = Some(description.to_owned());
            components.add_security_scheme(name, SecurityScheme::Http(http));
        };
        bearer(
            "ticket",
            "A visitor's ticket, the `ticket` of a join's answer. Browsers send it as the \
             room cookie `narabu_{room}` (`__Host-narabu_{room}` when served over HTTPS with \
             `cookie_secure`) instead, which the join sets; with the cookie, join and leave \
             must come from the site's own pages (403 otherwise).",
        );
        bearer(
            "admin",
            "The operator's admin token (`NARABU_ADMIN_TOKEN` or `admin_token`). With none \
             configured the admin API answers 404 everywhere.",
        );
        bearer(
            "release",
            "The release key the origin's backend uses to give permits back, or the admin token.",
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Narabu",
        description = "A fair virtual waiting room: the visitor and app API (join, status, \
                       events, leave), the origin's release, the reverse proxy's gate, and the \
                       operators' admin API. JSON errors have the shape `Error`.",
    ),
    paths(
        super::api::join,
        super::api::status,
        super::receipts::receipt,
        super::events::events,
        super::api::leave,
        super::api::release,
        super::notify::key,
        super::notify::subscribe,
        super::notify::unsubscribe,
        super::access::challenge,
        super::draw::draw,
        super::record::record,
        super::gate::gate,
        super::gate::site_gate,
        super::passes::jwks,
        super::passes::pem,
        super::visitor::queue,
        super::assets::serve,
        super::admin::list,
        super::admin::get_room,
        super::admin::put_room,
        super::admin::patch_room,
        super::admin::delete_room,
        super::admin::revoke,
        super::admin::purchases,
        super::admin::report::report,
        super::admin::report::reports,
        super::admin::events,
        super::admin::dashboard,
        super::health::healthz,
        super::health::readyz,
        super::metrics::metrics,
        openapi_json,
    ),
    modifiers(&Security),
    tags(
        (name = "visitors", description = "Joining, waiting and leaving: browsers and apps."),
        (name = "origin", description = "The protected site's backend."),
        (name = "gate", description = "What a reverse proxy asks on every protected request."),
        (name = "admin", description = "Operators: rooms, live figures, revocation."),
        (name = "service", description = "Health, metrics and this document."),
    ),
)]
pub(crate) struct ApiDoc;

/// The document, serialized once.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    ApiDoc::openapi()
        .to_json()
        .expect("the OpenAPI document serializes")
});

/// The OpenAPI document, as a value (for tests and tools).
#[cfg(test)]
pub(crate) fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "service",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of this service.",
         content_type = "application/json", body = Object),
    ),
)]
pub(crate) async fn openapi_json() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        DOCUMENT.as_str(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::config::{CAPACITY_MAX, CAPACITY_MIN};

    fn schemas() -> Value {
        serde_json::to_value(document()).unwrap()["components"]["schemas"].clone()
    }

    /// The bounds written as literals in `schema` attributes are the
    /// config's own limits.
    #[test]
    fn the_documented_bounds_are_the_checked_ones() {
        let schemas = schemas();
        for body in ["RoomTable", "RoomPatch"] {
            let props = &schemas[body]["properties"];
            assert_eq!(props["capacity"]["minimum"], CAPACITY_MIN, "{body}");
            assert_eq!(props["capacity"]["maximum"], CAPACITY_MAX, "{body}");
            assert_eq!(props["admit_per_minute"]["minimum"], 1, "{body}");
        }
    }

    /// Every key `PATCH` accepts is in its schema, and nothing else.
    #[test]
    fn the_patch_schema_lists_the_patchable_keys() {
        let schemas = schemas();
        let props = schemas["RoomPatch"]["properties"].as_object().unwrap();
        let mut documented: Vec<&str> = props.keys().map(String::as_str).collect();
        let mut patchable = crate::http::admin::patch::PATCHABLE.to_vec();
        documented.sort_unstable();
        patchable.sort_unstable();
        assert_eq!(documented, patchable);
    }

    /// A status as the API sends it has exactly the documented keys (a
    /// ticket in a room with lanes: `lane` is left out without them).
    #[test]
    fn the_status_schema_has_the_keys_the_status_has() {
        let schemas = schemas();
        let props = schemas["TicketStatus"]["properties"].as_object().unwrap();
        let status =
            crate::engine::rules::ticket_status(&Default::default(), None, &Default::default(), 0);
        let without_lanes = serde_json::to_value(&status).unwrap();
        assert!(without_lanes.get("lane").is_none());
        let body = crate::engine::StatusBody::named(&status, Some("members"));
        let sent = serde_json::to_value(&body).unwrap();
        let mut sent: Vec<&String> = sent.as_object().unwrap().keys().collect();
        let mut documented: Vec<&String> = props.keys().collect();
        sent.sort_unstable();
        documented.sort_unstable();
        assert_eq!(sent, documented);
    }
}
