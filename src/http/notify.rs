//! Being called back by Web Push: what a page or app needs to subscribe
//! (`GET /api/rooms/{room}/notify`, the VAPID public key), and handing the
//! subscription over with the ticket (`POST`) or taking it back
//! (`DELETE`).
//!
//! The handlers only check and carry: when a message is due, and what it
//! says, is the engine's to decide; the room's owner hands it to the
//! sender. A subscription's endpoint is a capability (whoever knows it can
//! message the browser), so it never appears in logs or answers.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use super::error::ApiError;
use super::extract::{Room, Visitor};
use super::openapi::{ErrorBody, RoomParam};
use super::origin::Provenance;
use super::pages::PageBook;
use super::state::AppState;
use crate::backend::Backend;
use crate::backend::callouts::CallbackDue;
use crate::engine::{Callback, Notice};
use crate::push::{Outcome, Push, PushMessage, Subscription, Urgency};

/// What a page subscribes with.
#[derive(Serialize, ToSchema)]
#[schema(as = PushKey)]
pub(crate) struct KeyBody {
    /// The VAPID public key (RFC 8292): the uncompressed P-256 point,
    /// base64url without padding, to pass to `pushManager.subscribe` as
    /// `applicationServerKey`.
    public_key: String,
}

/// The answer when push is off on this service.
pub(crate) fn push_off() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "push_off",
        "This waiting room does not send push notifications.",
    )
}

/// Push key
///
/// The key a browser subscribes to Web Push with, for this room's
/// call-backs ("N ahead", "your turn").
#[utoipa::path(
    get,
    path = "/api/rooms/{room}/notify",
    tag = "visitors",
    params(RoomParam),
    responses(
        (status = 200, description = "Push is on: the application server key.", body = KeyBody),
        (status = 404, description = "No such room (`unknown_room`), or push is off (`push_off`).", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn key(
    State(state): State<AppState>,
    Room(room): Room,
) -> Result<Json<KeyBody>, ApiError> {
    let Some(push) = state.push.clone() else {
        return Err(push_off());
    };
    state.backend.epoch(&room).await?;
    Ok(Json(KeyBody {
        public_key: push.key.public_key().to_owned(),
    }))
}

/// The most a subscribe body may hold: a subscription is a few hundred
/// bytes (an endpoint of at most 2 KiB, two keys).
const MAX_BODY: usize = 4096;

/// A subscribe request: the browser's `PushSubscription.toJSON()` and,
/// optionally, the language the texts should be in.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NotifyRequest)]
pub(crate) struct SubscribeBody {
    /// `PushSubscription.toJSON()`: `{endpoint, expirationTime, keys:
    /// {p256dh, auth}}`. The endpoint must be `https:` and name a push
    /// service by host name.
    #[schema(value_type = Object, example = json!({
        "endpoint": "https://push.example.net/send/abc",
        "expirationTime": null,
        "keys": {"p256dh": "BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM", "auth": "tBHItJI5svbpez7KI4CCXg"}
    }))]
    subscription: serde_json::Value,
    /// The language of the notifications (`en`, `ja`, `zh`, or a language
    /// the site added); else the request's `Accept-Language`.
    #[serde(default)]
    lang: Option<String>,
}

/// Call me back
///
/// Hand over a Web Push subscription with the ticket: the room sends "N
/// ahead" when the visitor comes near the head and "it's your turn" when
/// it reaches them (then, if their page is closed, their place is kept for
/// `queue_idle`). A new subscription replaces the ticket's earlier one;
/// it ends with the ticket. Apps with their own push may ignore this.
#[utoipa::path(
    post,
    path = "/api/rooms/{room}/notify",
    tag = "visitors",
    params(RoomParam),
    security(("ticket" = [])),
    request_body(content = SubscribeBody, content_type = "application/json"),
    responses(
        (status = 204, description = "Kept: the visitor will be called back."),
        (status = 400, description = "The body is not JSON (`bad_body`).", body = ErrorBody),
        (status = 401, description = "No ticket, a damaged one, or one of another room.", body = ErrorBody),
        (status = 403, description = "The ticket cookie came on a request from another site or origin (`cross_site_request`).", body = ErrorBody),
        (status = 404, description = "No such room (`unknown_room`), or push is off (`push_off`).", body = ErrorBody),
        (status = 409, description = "The ticket is not waiting any more (`not_waiting`).", body = ErrorBody),
        (status = 410, description = "The line this ticket stood in was reset: join again.", body = ErrorBody),
        (status = 413, description = "The body is too large."),
        (status = 422, description = "The subscription or a field is not valid (`bad_subscription`, `invalid_field`); the message names the field.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn subscribe(
    State(state): State<AppState>,
    Visitor { room, ticket }: Visitor,
    provenance: Provenance,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Some(push) = state.push.clone() else {
        return Err(push_off());
    };
    if ticket.from_cookie {
        provenance.require_same_origin()?;
    }
    if body.len() > MAX_BODY {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("The body must be at most {MAX_BODY} bytes."),
        ));
    }
    let request: SubscribeBody = super::extract::json_body(&body)?;
    let text = request.subscription.to_string();
    let subscription = Subscription::from_json(text.as_bytes(), push.allow_insecure_endpoints)
        .map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "bad_subscription",
                format!("`subscription`: {e}"),
            )
        })?;
    let languages = state.pages.for_room(room.as_str()).languages.clone();
    let accept = headers
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok());
    let lang = languages.negotiate(request.lang.as_deref(), accept);
    let callback = Callback {
        // Kept as the checked subscription writes itself: no unknown
        // field of the visitor's rides along into the log.
        subscription: serde_json::to_string(&subscription)
            .map_err(|_| ApiError::bad_body("The subscription cannot be kept."))?,
        lang: lang.code().to_owned(),
    };
    match ticket.shadow {
        // Never called: its turn never comes. Checked as a real one is.
        Some(t) => {
            super::shadow::status(&state, &room, t).await?;
        }
        None => {
            state
                .backend
                .subscribe(&room, ticket.ticket, callback)
                .await?;
        }
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Stop calling me back
///
/// Forget the ticket's push subscription: no more notifications.
#[utoipa::path(
    delete,
    path = "/api/rooms/{room}/notify",
    tag = "visitors",
    params(RoomParam),
    security(("ticket" = [])),
    responses(
        (status = 204, description = "Forgotten (also when there was none)."),
        (status = 401, description = "No ticket, a damaged one, or one of another room.", body = ErrorBody),
        (status = 403, description = "The ticket cookie came on a request from another site or origin (`cross_site_request`).", body = ErrorBody),
        (status = 404, description = "No such room (`unknown_room`), or push is off (`push_off`).", body = ErrorBody),
        (status = 410, description = "The line this ticket stood in was reset: join again.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn unsubscribe(
    State(state): State<AppState>,
    Visitor { room, ticket }: Visitor,
    provenance: Provenance,
) -> Result<Response, ApiError> {
    if state.push.is_none() {
        return Err(push_off());
    }
    if ticket.from_cookie {
        provenance.require_same_origin()?;
    }
    match ticket.shadow {
        Some(t) => {
            super::shadow::status(&state, &room, t).await?;
        }
        None => {
            state.backend.unsubscribe(&room, ticket.ticket).await?;
        }
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// What the service worker receives: the texts to show, and what it needs
/// to open the queue page.
#[derive(Serialize)]
struct Payload<'a> {
    kind: &'static str,
    room: &'a str,
    /// The visitor's queue number.
    number: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ahead: Option<u32>,
    /// Unix ms: when the place lapses (for the turn).
    #[serde(skip_serializing_if = "Option::is_none")]
    until: Option<u64>,
    title: &'a str,
    body: String,
    lang: &'a str,
    /// The queue page, relative to this service.
    url: String,
}

/// How long an "ahead" message is worth delivering: about the time it
/// warns ahead by default.
const AHEAD_TTL: Duration = Duration::from_secs(120);

/// Carries the calls the backend's rooms find due to the push sender,
/// until `stop`: each one's text in the visitor's language, sent off the
/// admission path; a subscription the push service says is gone is
/// forgotten.
pub(crate) fn deliver(
    mut due: mpsc::Receiver<CallbackDue>,
    push: Arc<Push>,
    backend: Arc<dyn Backend>,
    pages: Arc<PageBook>,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            let call = tokio::select! {
                () = stop.cancelled() => return,
                call = due.recv() => match call {
                    Some(call) => call,
                    None => return,
                },
            };
            let Some(message) = message(&call, &pages, backend.clock().now_ms(), &push) else {
                push.sends.count(call.room.as_str(), Outcome::Dropped);
                continue;
            };
            let receipt = push.sender.send(message);
            let (backend, push) = (backend.clone(), push.clone());
            tokio::spawn(async move {
                let outcome = receipt.outcome().await;
                if outcome == Outcome::Gone {
                    let _ = backend.unsubscribe(&call.room, call.ticket).await;
                }
                push.sends.count(call.room.as_str(), outcome);
            });
        }
    });
}

/// The push message for one call; `None` for a subscription that no
/// longer reads (kept by an earlier version, say).
fn message(call: &CallbackDue, pages: &PageBook, now_ms: u64, push: &Push) -> Option<PushMessage> {
    let subscription = Subscription::from_json(
        call.callback.subscription.as_bytes(),
        push.allow_insecure_endpoints,
    )
    .ok()?;
    let languages = pages.for_room(call.room.as_str()).languages.clone();
    let texts = languages.push_strings(&call.callback.lang);
    let room = call.room.as_str();
    let lang = call.callback.lang.as_str();
    let url = format!("/queue/{room}?lang={lang}");
    let (payload, ttl, urgency) = match call.notice {
        Notice::Ahead { ahead } => (
            Payload {
                kind: "ahead",
                room,
                number: call.number,
                ahead: Some(ahead),
                until: None,
                title: &texts.ahead_title,
                body: texts.ahead_body.replace("{n}", &ahead.to_string()),
                lang,
                url,
            },
            AHEAD_TTL,
            Urgency::Normal,
        ),
        Notice::Turn { until } => {
            let left = Duration::from_millis(until.saturating_sub(now_ms));
            let minutes = left.as_secs().div_ceil(60).max(1);
            (
                Payload {
                    kind: "turn",
                    room,
                    number: call.number,
                    ahead: None,
                    until: Some(until),
                    title: &texts.turn_title,
                    body: texts.turn_body.replace("{minutes}", &minutes.to_string()),
                    lang,
                    url,
                },
                left,
                Urgency::High,
            )
        }
    };
    Some(PushMessage {
        subscription,
        payload: serde_json::to_vec(&payload).ok()?,
        ttl,
        urgency,
        // A turn replaces an "ahead" still waiting at the push service.
        topic: Some("narabu-queue".into()),
    })
}
