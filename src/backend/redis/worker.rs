//! A room's worker on Redis: one instance at a time, elected by lease,
//! runs the tick script once per `tick`, then computes the smoothed
//! admission rate from what the tick reports (`rules::AdmissionRate`) and
//! publishes the room view with it, fenced by its lease.

use std::sync::Weak;
use std::time::Duration;

use super::keys::RoomKeys;
use super::lease::Lease;
use super::reply::{self, decode};
use super::{RedisBackend, STALE_RETRIES};
use crate::backend::BackendError;
use crate::engine::rules;
use crate::engine::{RoomId, TickReport};

impl RedisBackend {
    /// One tick; `owner` is the worker's lease token ('' for a manual
    /// tick). `None` when the lease is someone else's.
    pub(super) async fn tick_as(
        &self,
        room: &RoomId,
        owner: &str,
    ) -> Result<Option<(TickReport, u64)>, BackendError> {
        let mut opened = false;
        for _ in 0..STALE_RETRIES + 2 {
            let now = self.now();
            let args = match self.timeouts_of(room) {
                Some(t) => {
                    let pass = t.pass().cutoffs(now);
                    [
                        pass.unarrived_before.to_string(),
                        pass.idle_before.to_string(),
                        rules::quiet_cutoff(now, t.queue_idle_ms).to_string(),
                        t.queue_idle_ms.to_string(),
                        t.pass_idle_ms.to_string(),
                        t.arrival_grace_ms.to_string(),
                        t.away_args(now)[0].clone(),
                        t.away_args(now)[1].clone(),
                    ]
                }
                None => std::array::from_fn(|_| "?".to_owned()),
            };
            let mut all = vec![owner];
            all.extend(args.iter().map(String::as_str));
            let raw = self.run(&self.scripts.tick, room, now, &all).await?;
            match decode::<reply::Tick>(&raw)? {
                reply::Tick::NotOwner => return Ok(None),
                reply::Tick::NoRoom => return Err(BackendError::NoSuchRoom(room.clone())),
                reply::Tick::Stale(timeouts) => {
                    self.timeouts.insert(room.clone(), timeouts);
                }
                reply::Tick::OpenNeeded => {
                    self.open(room, false).await?;
                    opened = true;
                }
                reply::Tick::Ok {
                    tick_ms,
                    closed,
                    from_tray,
                    abandoned,
                    admitted,
                    expired,
                    total,
                    prev_total,
                    prev_at,
                    view,
                } => {
                    let id = |v: Vec<u64>| -> Vec<u32> {
                        v.into_iter()
                            .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
                            .collect()
                    };
                    let report = TickReport {
                        opened,
                        from_tray,
                        admitted: id(admitted),
                        expired: id(expired),
                        abandoned,
                    };
                    if let (false, Some(fields)) = (closed, view) {
                        let mut rate = fields.rate();
                        let v = fields.view();
                        rate.after_tick(
                            v.open && !v.paused,
                            total.saturating_sub(prev_total),
                            now.saturating_sub(prev_at),
                        );
                        self.publish(room, &fields, false, owner, Some(rate))
                            .await?;
                    }
                    return Ok(Some((report, tick_ms)));
                }
            }
        }
        Err(BackendError::Unavailable(
            "the room's tick did not settle".into(),
        ))
    }
}

/// A room's worker loop on this instance: contend for the lease; while
/// holding it, tick every `tick` and renew it every third of the lease;
/// on shutdown give it up.
pub(super) async fn run_worker(me: Weak<RedisBackend>, room: RoomId) {
    use tokio::time::Instant;
    let (stop, ttl) = match me.upgrade() {
        Some(b) => (b.shutdown.clone(), b.options.lease),
        None => return,
    };
    let lease = Lease::new(RoomKeys::new(&room).lease, ttl);
    let renew_every = ttl / 3;
    let retry = renew_every.min(Duration::from_millis(500));
    let mut holding = false;
    let mut renewed_at = Instant::now();
    let mut next_tick = Instant::now();
    let mut wake = Instant::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep_until(wake) => {}
        }
        let Some(backend) = me.upgrade() else { return };
        let mut con = backend.con();
        let now = Instant::now();
        if !holding {
            match lease.acquire(&mut con).await {
                Ok(true) => {
                    tracing::info!(room = %room, "this instance runs the room's worker");
                    holding = true;
                    renewed_at = now;
                    next_tick = now;
                }
                Ok(false) => {
                    wake = now + renew_every;
                    continue;
                }
                Err(e) => {
                    tracing::debug!(room = %room, kind = ?e.kind(), "lease: redis error");
                    wake = now + retry;
                    continue;
                }
            }
        } else if now >= renewed_at + renew_every {
            match lease.extend(&mut con, &backend.scripts).await {
                Ok(true) => renewed_at = now,
                Ok(false) => {
                    tracing::warn!(room = %room, "lost the room's worker lease");
                    holding = false;
                    wake = now + renew_every;
                    continue;
                }
                Err(_) => {
                    wake = now + retry;
                    continue;
                }
            }
        }
        if now >= next_tick {
            match backend.tick_as(&room, &lease.token).await {
                Ok(Some((report, tick_ms))) => {
                    if report.opened {
                        tracing::info!(room = %room, "room opened");
                    }
                    next_tick = now + Duration::from_millis(tick_ms.max(1));
                }
                Ok(None) => {
                    holding = false;
                    wake = now + renew_every;
                    continue;
                }
                Err(BackendError::NoSuchRoom(_)) if backend.recover(&room).await => {
                    next_tick = now;
                }
                Err(e) => {
                    tracing::debug!(room = %room, error = %e, "tick failed");
                    next_tick = now + retry;
                }
            }
        }
        wake = next_tick.min(renewed_at + renew_every);
    }
    if holding && let Some(backend) = me.upgrade() {
        let _ = lease.release(&mut backend.con(), &backend.scripts).await;
    }
}
