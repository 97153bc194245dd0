//! `GET /api/rooms/{room}/record`: the room's chained admission record, for
//! anyone, without credentials, a page at a time (`?after=N`). Entries
//! carry ticket ids, lanes, numbers and times, never an identity or a
//! token; each names its hash, and the page the hash before it, so a
//! reader checks the chain page by page (`narabu verify-record`, or a few
//! lines of shell). What an entry is and how it hashes is
//! `crate::engine::record`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::ApiError;
use super::extract::Room;
use super::openapi::{ErrorBody, RoomParam};
use super::state::AppState;
use crate::engine::{Page, RoomId};
use crate::published_record::{EntryBody, LaneBody, RecordBody};

/// The most entries one page holds.
pub(crate) const PAGE_MAX: usize = 1000;

/// What a status answer says of the record.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[schema(as = RecordHead)]
pub(crate) struct HeadBody {
    /// Entries in the room's admission record.
    pub entries: u64,
    /// The hash of its last entry (hex): keep it to show later that the
    /// record was not rewritten.
    pub head: String,
}

impl From<&Page> for HeadBody {
    fn from(page: &Page) -> Self {
        Self {
            entries: page.total,
            head: hex::encode(page.head),
        }
    }
}

/// The record's head, for a status answer; `None` when it cannot be read
/// now (the answer goes out without it).
pub(crate) async fn head(state: &AppState, room: &RoomId) -> Option<HeadBody> {
    let page = state.backend.record(room, u64::MAX, 0).await.ok()?;
    Some(HeadBody::from(&page))
}

/// A whole number from `least` to `most` (the document's bounds).
fn whole(
    name: &str,
    value: Option<&str>,
    default: u64,
    least: u64,
    most: u64,
) -> Result<u64, ApiError> {
    let Some(v) = value else {
        return Ok(default);
    };
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (least..=most).contains(n))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_field",
                format!("{name}: expected a whole number from {least} to {most}, got {v:?}"),
            )
        })
}

/// The room's admission record
///
/// Every admission, skip, return, ending and the opening draw, in order,
/// each entry chained to the one before by SHA-256. No credentials; no
/// identities or tokens in it.
#[utoipa::path(
    get,
    path = "/api/rooms/{room}/record",
    tag = "visitors",
    params(
        RoomParam,
        ("after" = Option<i64>, Query, minimum = 0, description = "Start after this many entries (default 0)."),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 1000, description = "At most this many entries (default and most 1000)."),
    ),
    responses(
        (status = 200, description = "A page of the record.", body = RecordBody),
        (status = 400, description = "`after` or `limit` is not a whole number.", body = ErrorBody),
        (status = 404, description = "No such room.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn record(
    State(state): State<AppState>,
    Room(room): Room,
    uri: axum::http::Uri,
) -> Result<Json<RecordBody>, ApiError> {
    // Read by hand: the first of a repeated key counts, and a bad value
    // gets this API's JSON error.
    let query = |key: &str| {
        form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    };
    let after = whole("after", query("after").as_deref(), 0, 0, i64::MAX as u64)?;
    let limit = whole(
        "limit",
        query("limit").as_deref(),
        PAGE_MAX as u64,
        1,
        PAGE_MAX as u64,
    )?;
    let limit = usize::try_from(limit).unwrap_or(PAGE_MAX);
    let page = state.backend.record(&room, after, limit).await?;
    let settings = state.backend.room(&room).await?.settings;
    let lanes = settings
        .lanes
        .iter()
        .map(|l| LaneBody {
            name: l.name.clone(),
            weight: l.weight,
        })
        .collect();
    let after = after.min(page.total);
    let end = after + page.entries.len() as u64;
    let next = (end < page.total).then(|| format!("/api/rooms/{room}/record?after={end}"));
    Ok(Json(RecordBody {
        room: room.to_string(),
        epoch: page.epoch,
        total: page.total,
        head: hex::encode(page.head),
        after,
        previous: hex::encode(page.previous),
        lanes,
        entries: page
            .entries
            .iter()
            .map(|c| EntryBody {
                n: c.n,
                kind: c.entry.kind.word().to_owned(),
                ticket: u64::from(c.entry.ticket),
                lane: c.entry.lane,
                number: u64::from(c.entry.number),
                at: c.entry.at,
                hash: hex::encode(c.hash),
            })
            .collect(),
        next,
    }))
}
