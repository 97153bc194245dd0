//! The access checks a new join passes before it reaches the backend:
//! the enqueue token (whose account becomes the join identity) and the
//! proof of work; and `GET /api/rooms/{room}/challenge`.
//!
//! Each instance keeps a room's access rules compiled in an [`AccessBook`]
//! (keys parsed once), fed every second from the monitor's samples of
//! every room and at once from operators' changes on this instance, so a
//! change made on another instance applies here within about a second.
//! The same samples give the room's join rate over the last ten seconds
//! (counted over every instance: the backend's join counter), from which
//! the challenge difficulty rises when the room is configured to.
//!
//! The checks run before the join's one backend call and say what a new
//! ticket would lack; the backend then refuses a new ticket (a visitor who
//! holds a live ticket keeps it), and spends a solution's nonce in the same
//! step that issues the ticket. Refusals carry what a client needs to try
//! again: a join without a solution, or with one that fails, gets `428`
//! with a fresh `challenge`; a missing enqueue token `401`, a bad one `403`
//! with its `reason`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::error::ApiError;
use super::extract::Room;
use super::limits::ClientIp;
use super::openapi::{ErrorBody, RoomParam};
use super::state::AppState;
use crate::access::{Challenge, EnqueueError, PowError, RoomAccess, Solved, account_identity};
use crate::backend::{Backend, BackendError, NonceSpend, RoomSnapshot};
use crate::engine::{Identity, RoomId, RoomSettings, Timestamp};

/// A room's rules older than this are read from the backend again (the
/// monitor's samples normally keep them fresher).
const STALE_MS: u64 = 3_000;
/// The join rate behind a rising difficulty is measured over this window.
const RATE_WINDOW_MS: u64 = 10_000;

/// What a join brings besides itself: fields of the join's JSON body (or,
/// for the queue page, its query).
#[derive(Clone, Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Proof {
    /// A challenge token this server issued, and the counter solving it.
    pub challenge: Option<String>,
    pub counter: Option<u64>,
    /// The origin's enqueue token (a JWT).
    pub enqueue_token: Option<String>,
}

/// What a join's checks found: who it is (an account from an enqueue
/// token), its lane, and the solution whose nonce a new ticket spends.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cleared {
    pub identity: Option<Identity>,
    /// The lane a new ticket queues in: the token's, else the room's
    /// default.
    pub lane: u8,
    pub solved: Option<Solved>,
    /// An enqueue token was checked and accepted.
    pub enqueued: bool,
}

impl Cleared {
    /// The nonce a new ticket spends.
    pub(crate) fn nonce(&self) -> Option<NonceSpend> {
        self.solved.map(|s| NonceSpend {
            nonce: s.nonce,
            until_ms: s.expires_at_ms,
        })
    }
}

/// A room's compiled rules and the difficulty to ask now.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    pub access: Arc<RoomAccess>,
    pub difficulty: u8,
    /// The room's settings as last read (its lanes: which a token may
    /// name, and what they are called).
    pub settings: Arc<RoomSettings>,
}

struct Entry {
    epoch: u64,
    access: Arc<RoomAccess>,
    settings: Arc<RoomSettings>,
    fetched_at: u64,
    /// (time, the room's join counter), over the last `RATE_WINDOW_MS`.
    joins: VecDeque<(u64, u64)>,
    difficulty: u8,
}

impl Entry {
    fn joins_per_second(&self) -> f64 {
        match (self.joins.front(), self.joins.back()) {
            (Some(&(t0, j0)), Some(&(t1, j1))) if t1 > t0 + 500 => {
                j1.saturating_sub(j0) as f64 * 1000.0 / (t1 - t0) as f64
            }
            _ => 0.0,
        }
    }
}

/// Every room's access rules on this instance.
#[derive(Default)]
pub(crate) struct AccessBook {
    rooms: RwLock<HashMap<RoomId, Entry>>,
}

impl std::fmt::Debug for AccessBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessBook")
    }
}

impl AccessBook {
    /// Takes a room's current settings and join counter.
    pub(crate) fn observe(&self, s: &RoomSnapshot, now: u64) {
        let id = &s.settings.id;
        let mut rooms = self.rooms.write().unwrap_or_else(|e| e.into_inner());
        let entry = rooms.entry(id.clone()).or_insert_with(|| Entry {
            epoch: s.epoch,
            access: Arc::new(RoomAccess::new(id, (*s.settings.access).clone())),
            settings: Arc::new(s.settings.clone()),
            fetched_at: now,
            joins: VecDeque::new(),
            difficulty: s.settings.access.pow_difficulty,
        });
        if entry.access.settings != *s.settings.access {
            entry.access = Arc::new(RoomAccess::new(id, (*s.settings.access).clone()));
        }
        if *entry.settings != s.settings {
            entry.settings = Arc::new(s.settings.clone());
        }
        if entry.epoch != s.epoch {
            entry.epoch = s.epoch;
            entry.joins.clear();
        }
        entry.fetched_at = now;
        if entry.joins.back().is_none_or(|&(t, _)| t + 500 <= now) {
            entry.joins.push_back((now, s.stats.joins));
        }
        while entry
            .joins
            .front()
            .is_some_and(|&(t, _)| t + RATE_WINDOW_MS < now)
        {
            entry.joins.pop_front();
        }
        entry.difficulty = entry.access.settings.difficulty(entry.joins_per_second());
    }

    fn cached(&self, room: &RoomId, now: u64) -> Option<Policy> {
        let rooms = self.rooms.read().unwrap_or_else(|e| e.into_inner());
        rooms
            .get(room)
            .filter(|e| e.fetched_at + STALE_MS > now)
            .map(|e| Policy {
                access: e.access.clone(),
                difficulty: e.difficulty,
                settings: e.settings.clone(),
            })
    }

    /// What a room calls one of its lanes; `None` for a room without
    /// lanes. A room's lanes are fixed for its life, so this instance's
    /// copy of its settings answers, read from the backend only when
    /// this instance has none.
    pub(crate) async fn lane_name(
        &self,
        backend: &dyn Backend,
        room: &RoomId,
        lane: u8,
        now: u64,
    ) -> Option<String> {
        let known = {
            let rooms = self.rooms.read().unwrap_or_else(|e| e.into_inner());
            rooms.get(room).map(|e| e.settings.clone())
        };
        let settings = match known {
            Some(s) => s,
            None => self.policy(backend, room, now).await.ok()?.settings,
        };
        settings.lane_name(lane).map(str::to_owned)
    }

    /// A room's rules, from this instance's book or else the backend.
    pub(crate) async fn policy(
        &self,
        backend: &dyn Backend,
        room: &RoomId,
        now: u64,
    ) -> Result<Policy, BackendError> {
        if let Some(policy) = self.cached(room, now) {
            return Ok(policy);
        }
        let snapshot = backend.room(room).await?;
        self.observe(&snapshot, now);
        self.cached(room, now)
            .ok_or_else(|| BackendError::NoSuchRoom(room.clone()))
    }

    /// The difficulty a room asks now, for operators; `None` for a room
    /// without proof of work or not seen yet.
    pub(crate) fn difficulty(&self, room: &RoomId) -> Option<u8> {
        let rooms = self.rooms.read().unwrap_or_else(|e| e.into_inner());
        rooms
            .get(room)
            .filter(|e| e.access.needs_pow())
            .map(|e| e.difficulty)
    }
}

/// A challenge as JSON: what a solver needs (`docs/fair-access.md`, "Proof of work").
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Challenge)]
pub(crate) struct ChallengeBody {
    pub token: String,
    /// Leading zero bits SHA-256(token || decimal counter) must have.
    pub difficulty: u8,
    pub expires_at: Timestamp,
    pub scheme: &'static str,
}

/// The scheme's name, for clients to check they solve the right puzzle.
pub(crate) const SCHEME: &str = "sha256-leading-zero-bits";

impl From<&Challenge> for ChallengeBody {
    fn from(c: &Challenge) -> Self {
        Self {
            token: c.token.clone(),
            difficulty: c.difficulty,
            expires_at: Timestamp(c.expires_at_ms),
            scheme: SCHEME,
        }
    }
}

/// A fresh challenge for `room`, counted.
pub(crate) fn issue(state: &AppState, room: &RoomId, policy: &Policy) -> Challenge {
    state.metrics.challenge_issued(room.as_str());
    state
        .challenges
        .issue(room, policy.difficulty, state.clock.now_ms())
}

/// Why the access rules would refuse a new ticket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No proof of work (`None`), or one that failed.
    Pow(Option<PowError>),
    Enqueue(EnqueueError),
}

/// The answer to a join the backend refused a new ticket, counted: `428`
/// with a fresh challenge for the proof of work, `401`/`403` for the
/// enqueue token.
pub(crate) fn refuse(
    state: &AppState,
    room: &RoomId,
    policy: &Policy,
    refusal: Refusal,
) -> ApiError {
    match refusal {
        Refusal::Pow(why) => challenge_refusal(state, room, policy, why),
        Refusal::Enqueue(e) => enqueue_refusal(state, room, &e),
    }
}

fn challenge_refusal(
    state: &AppState,
    room: &RoomId,
    policy: &Policy,
    why: Option<PowError>,
) -> ApiError {
    let reason = why.map_or("missing", PowError::reason);
    state.metrics.challenge_refused(room.as_str(), reason);
    let challenge = ChallengeBody::from(&issue(state, room, policy));
    let challenge = serde_json::to_value(challenge).unwrap_or_default();
    match why {
        None => ApiError::new(
            StatusCode::PRECONDITION_REQUIRED,
            "challenge_required",
            "This room asks for a small proof of work before joining: find a counter for \
             `challenge` and send {\"challenge\": token, \"counter\": n} with the join.",
        )
        .with("challenge", challenge),
        Some(e) => ApiError::new(
            StatusCode::PRECONDITION_REQUIRED,
            "challenge_failed",
            format!(
                "The proof of work was refused: {e}. Solve the new `challenge` and join again."
            ),
        )
        .with("reason", reason)
        .with("challenge", challenge),
    }
}

fn enqueue_refusal(state: &AppState, room: &RoomId, e: &EnqueueError) -> ApiError {
    state.metrics.enqueue_refused(room.as_str(), e.reason());
    match e {
        EnqueueError::Missing => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "enqueue_token_required",
            "This room is invite-only: join with the enqueue token the site gave you \
             (`enqueue_token` in the body, or in the queue page's address).",
        ),
        EnqueueError::UnknownLane(_) => ApiError::new(
            StatusCode::FORBIDDEN,
            "unknown_lane",
            format!("{}.", capitalize(&e.to_string())),
        )
        .with("reason", e.reason()),
        other => ApiError::new(
            StatusCode::FORBIDDEN,
            "enqueue_token_invalid",
            format!("{}.", capitalize(&other.to_string())),
        )
        .with("reason", other.reason()),
    }
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

/// Checks what a join brings against the room's rules: the token's
/// account and the verified solution, or what a new ticket would lack. A
/// solution is only verified here: the backend spends its nonce with the
/// new ticket, in one step.
pub(crate) fn clear(
    state: &AppState,
    room: &RoomId,
    policy: &Policy,
    proof: &Proof,
) -> Result<Cleared, Refusal> {
    let now = state.clock.now_ms();
    let mut cleared = Cleared::default();
    if let Some(verifier) = &policy.access.enqueue {
        let who = verifier
            .verify(proof.enqueue_token.as_deref(), now / 1000)
            .map_err(Refusal::Enqueue)?;
        cleared.identity = Some(account_identity(room, &who.account));
        cleared.lane = policy
            .settings
            .lane_of(who.lane.as_deref())
            .map_err(|e| Refusal::Enqueue(EnqueueError::UnknownLane(e.0)))?;
        cleared.enqueued = true;
    } else {
        cleared.lane = policy.settings.lane_of(None).unwrap_or(0);
    }
    if policy.access.needs_pow() {
        let token = proof.challenge.as_deref().ok_or(Refusal::Pow(None))?;
        // A challenge sent without its counter is an unsolved one.
        let counter = proof.counter.ok_or(Refusal::Pow(Some(PowError::Wrong)))?;
        // Against what the room asks now, not its base: a challenge
        // fetched while the room was calm must not buy a cheap join after a
        // flood has made joins dearer.
        let min = policy.access.settings.least_accepted(policy.difficulty);
        let solved = state
            .challenges
            .check(room, token, counter, min, now)
            .map_err(|e| Refusal::Pow(Some(e)))?;
        cleared.solved = Some(solved);
    }
    Ok(cleared)
}

/// Counts what a join that made a new ticket showed.
pub(crate) fn admitted(state: &AppState, room: &RoomId, cleared: &Cleared) {
    if cleared.solved.is_some() {
        state.metrics.challenge_solved(room.as_str());
    }
    if cleared.enqueued {
        state.metrics.enqueue_accepted(room.as_str());
    }
}

/// A proof-of-work challenge to solve before joining
///
/// `404 no_challenge` for a room that asks none.
#[utoipa::path(
    get,
    path = "/api/rooms/{room}/challenge",
    tag = "visitors",
    params(RoomParam),
    responses(
        (status = 200, description = "A fresh challenge.", body = ChallengeBody),
        (status = 404, description = "No such room, or it asks for no proof of work.", body = ErrorBody),
        (status = 429, description = "This address fetched too many challenges in the last minute.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn challenge(
    State(state): State<AppState>,
    client: ClientIp,
    Room(room): Room,
) -> Result<Json<ChallengeBody>, ApiError> {
    let now = state.clock.now_ms();
    let policy = state
        .access
        .policy(state.backend.as_ref(), &room, now)
        .await?;
    if !policy.access.needs_pow() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_challenge",
            "This room asks for no proof of work: join directly.",
        ));
    }
    state
        .challenge_fetches
        .fetch(&room, client, policy.settings.join_limit_per_minute, now)?;
    Ok(Json(ChallengeBody::from(&issue(&state, &room, &policy))))
}

/// What the dashboard and the admin API show of a room's access rules.
pub(crate) fn summary(book: &AccessBook, s: &RoomSnapshot) -> serde_json::Value {
    let a = &s.settings.access;
    json!({
        "challenge": a.challenge,
        "pow_difficulty": a.pow_difficulty,
        "pow_difficulty_now": book.difficulty(&s.settings.id),
        "enqueue": a.enqueue,
        "enqueue_keys": {
            "hs256": a.enqueue_key.is_some(),
            "hs256_previous": a.enqueue_previous_key.is_some(),
            "eddsa": a.enqueue_public_key.is_some(),
            "eddsa_previous": a.enqueue_previous_public_key.is_some(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::ChallengeMode;
    use crate::backend::embedded::EmbeddedBackend;
    use crate::engine::{RoomSettings, SystemClock};

    #[tokio::test]
    async fn the_difficulty_follows_the_join_rate_of_the_last_seconds() {
        let id = RoomId::new("flood").unwrap();
        let mut s = RoomSettings::new(id.clone());
        s.access.challenge = ChallengeMode::Pow;
        s.access.pow_difficulty = 10;
        s.access.pow_difficulty_max = 14;
        s.access.pow_rise_per_second = 100;
        let backend = EmbeddedBackend::without_workers(vec![s], Arc::new(SystemClock));
        let mut snap = backend.room(&id).await.unwrap();
        let book = AccessBook::default();
        let t0 = 1_000_000;
        book.observe(&snap, t0);
        assert_eq!(book.difficulty(&id), Some(10));
        // 400 joins in a second: two doublings above 100/s.
        snap.stats.joins += 400;
        book.observe(&snap, t0 + 1000);
        assert_eq!(book.difficulty(&id), Some(12));
        // A flood far past it stops at the maximum.
        snap.stats.joins += 1_000_000;
        book.observe(&snap, t0 + 2000);
        assert_eq!(book.difficulty(&id), Some(14));
        // Calm for longer than the window: back to the base.
        book.observe(&snap, t0 + 2000 + RATE_WINDOW_MS + 1000);
        book.observe(&snap, t0 + 2000 + RATE_WINDOW_MS + 2000);
        assert_eq!(book.difficulty(&id), Some(10));

        // The policy comes from the book while fresh, else from the backend.
        let now = t0 + 2000 + RATE_WINDOW_MS + 2000;
        let cached = book.policy(backend.as_ref(), &id, now).await.unwrap();
        assert!(cached.access.needs_pow());
        let unknown = RoomId::new("nope").unwrap();
        assert!(matches!(
            book.policy(backend.as_ref(), &unknown, now).await,
            Err(BackendError::NoSuchRoom(_))
        ));
        // An operator's change reaches the book at once.
        snap.settings.access.challenge = ChallengeMode::None;
        book.observe(&snap, now + 10);
        assert!(
            !book
                .policy(backend.as_ref(), &id, now + 20)
                .await
                .unwrap()
                .access
                .needs_pow()
        );
        assert_eq!(
            book.difficulty(&id),
            None,
            "no difficulty without proof of work"
        );
    }
}
