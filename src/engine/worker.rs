//! The room's worker (案内人): once per tick it opens a scheduled room,
//! takes back stalled permits, admits from the head with the permits in its
//! hand, and sweeps quiet tickets out of the line.
//!
//! Its hand of permits is owned by the worker alone (behind a mutex that
//! only the tick and operators' controls take, never a visitor's request).
//! Finishers never touch the hand: they hand off directly or use the tray,
//! and the worker empties the tray into its hand only when its hand is
//! empty, so the two sides share one atomic and nothing else.

use std::sync::atomic::Ordering;

use super::event::RoomEvent;
use super::room::{Line, Room, take_up_to};
use super::rules::{self, AdmissionRate, SWEEP_BUDGET};
use super::ticket::{TicketId, TicketState};
use super::view::TickReport;
use crate::locks::lock;

#[derive(Debug)]
pub(crate) struct Worker {
    /// Permits in the worker's hand.
    pub(crate) hand: u64,
    /// Tickets admitted and not yet seen to end, checked for stalls.
    admitted: Vec<TicketId>,
    /// Tickets skipped while away, checked for quiet past `queue_idle`.
    away: Vec<TicketId>,
    /// Where each lane's last quiet sweep stopped.
    sweep_cursor: Vec<u32>,
    pub(crate) rate: AdmissionRate,
    last_tick_ms: u64,
    admissions_at_last_tick: u64,
}

impl Worker {
    pub(crate) fn new(capacity: u64, now: u64) -> Self {
        Self {
            hand: capacity,
            admitted: Vec::new(),
            away: Vec::new(),
            sweep_cursor: Vec::new(),
            rate: AdmissionRate::default(),
            last_tick_ms: now,
            admissions_at_last_tick: 0,
        }
    }
}

impl Room {
    /// One turn of the worker. Call it every `tick`; tests call it on
    /// virtual time.
    pub fn tick(&self) -> TickReport {
        let now = self.clock.now_ms();
        let mut w = lock(&self.worker);
        let mut report = TickReport::default();
        if self.hot.closed.load(Ordering::Acquire) {
            return report;
        }
        if !self.hot.open.load(Ordering::Acquire)
            && self.settings_snapshot().opens_at.is_some_and(|t| t <= now)
        {
            self.open(&mut w);
            report.opened = true;
        }
        self.lapse_holders(now);
        self.reap_stalled(&mut w, now, &mut report);
        self.pay_debt(&mut w);
        if self.hot.admitting() {
            self.admit_from_hand(&mut w, now, &mut report);
            if self.hot.mode().admits_everyone() {
                // Past the permits: the rest borrow (see `Room::admit_everyone`).
                report.admitted.extend(self.admit_everyone(now));
            }
        }
        report.abandoned = self.sweep_quiet(&mut w, now) + self.sweep_away(&mut w, now);
        self.observe_rate(&mut w, now);
        self.call_ahead(w.rate.mean);
        self.publish_locked(&w, now, false);
        report
    }

    fn admit_from_hand(&self, w: &mut Worker, now: u64, report: &mut TickReport) {
        loop {
            if w.hand == 0 {
                let moved = self.tray.swap(0, Ordering::AcqRel);
                report.from_tray += moved;
                w.hand += moved;
                self.pay_debt(w);
                if w.hand == 0 {
                    return;
                }
            }
            if !self.has_queued() || !self.limiter.try_take(self.hot.admit_cap(), now) {
                return;
            }
            match self.pop_and_admit(now) {
                Some(id) => {
                    w.hand -= 1;
                    report.admitted.push(id);
                }
                None => return,
            }
        }
    }

    /// Permits owed after a capacity decrease come out of the hand first.
    fn pay_debt(&self, w: &mut Worker) {
        let paid = take_up_to(&self.debt, w.hand);
        w.hand -= paid;
    }

    /// Take back permits from admitted visitors who went idle past
    /// `pass_idle`, or never arrived within `arrival_grace`.
    fn reap_stalled(&self, w: &mut Worker, now: u64, report: &mut TickReport) {
        while let Some(id) = self.admitted_log.pop() {
            w.admitted.push(id);
        }
        let mut returned = 0;
        w.admitted.retain(|&id| {
            let Some(t) = self.ticket(id) else {
                return false;
            };
            if t.state() != TicketState::Admitted {
                return false;
            }
            // A live stream keeps the pass as a sign of life would.
            if t.is_held() || self.pass_deadline(t) >= now {
                return true;
            }
            // Whoever wins this CAS owns the permit; a release racing us
            // either won (and handed off) or will find the ticket expired.
            if t.transition(TicketState::Admitted, TicketState::Expired) {
                self.count_permit_back(id);
                self.counters.expirations.fetch_add(1, Ordering::Relaxed);
                returned += 1;
                report.expired.push(id);
            }
            false
        });
        for &id in &report.expired {
            self.emit(RoomEvent::Ended {
                ticket: id,
                state: TicketState::Expired,
                at: now,
            });
            self.notify_ticket(id);
        }
        w.hand += returned;
    }

    /// Mark quiet waiting tickets abandoned, a bounded slice per tick, so
    /// that people behind them see their true position before the head
    /// reaches them. (Whoever pops a quiet ticket skips it regardless.)
    fn sweep_quiet(&self, w: &mut Worker, now: u64) -> u64 {
        let quiet_before = rules::quiet_cutoff(now, self.hot.queue_idle_ms.load(Ordering::Acquire));
        w.sweep_cursor.resize(self.lines.len(), 0);
        // The budget is the room's, shared by its lanes.
        let budget = SWEEP_BUDGET / self.lines.len().max(1) as u32;
        let mut abandoned = 0;
        for (line, cursor) in self.lines.iter().zip(w.sweep_cursor.iter_mut()) {
            abandoned += self.sweep_line(line, cursor, budget, quiet_before);
        }
        abandoned
    }

    fn sweep_line(
        &self,
        line: &Line,
        sweep_cursor: &mut u32,
        budget: u32,
        quiet_before: u64,
    ) -> u64 {
        // Abandons the ticket at a queue slot if it waits and is quiet.
        let abandon_if_quiet = |index: u32| {
            line.queue.get(index as usize).is_some_and(|&id| {
                self.ticket(id).is_some_and(|t| {
                    t.state() == TicketState::Waiting
                        && !t.is_held()
                        && t.last_seen() < quiet_before
                        && self.depart_waiting(id, t, TicketState::Abandoned)
                })
            })
        };
        // Returners stand ahead of the head: a quiet one is abandoned like
        // anyone in the main line (a copy restored from an image holds them
        // in its main line, and must judge them alike).
        let mut abandoned = line
            .index
            .returners()
            .into_iter()
            .filter(|&index| abandon_if_quiet(index))
            .count() as u64;
        let head = line.index.head();
        let end = line.queue.count() as u32;
        if head >= end {
            return abandoned;
        }
        // Resume where the last sweep stopped and wrap to the head once, so
        // a line shorter than the budget is covered whole every tick.
        let mut cursor = (*sweep_cursor).clamp(head, end);
        let mut budget = budget.min(end - head);
        while budget > 0 {
            if cursor >= end {
                cursor = head;
            }
            budget -= 1;
            let index = cursor;
            cursor += 1;
            if abandon_if_quiet(index) {
                abandoned += 1;
            }
        }
        *sweep_cursor = cursor;
        abandoned
    }

    /// Abandon away tickets whose visitor stayed quiet past `queue_idle`;
    /// forget those that came back or ended.
    fn sweep_away(&self, w: &mut Worker, now: u64) -> u64 {
        while let Some(id) = self.skipped_log.pop() {
            w.away.push(id);
        }
        let quiet_before = rules::quiet_cutoff(now, self.hot.queue_idle_ms.load(Ordering::Acquire));
        let mut abandoned = 0;
        w.away.retain(|&id| {
            let Some(t) = self.ticket(id) else {
                return false;
            };
            if t.state() != TicketState::Away {
                return false;
            }
            if t.is_held() || t.last_seen() >= quiet_before {
                return true;
            }
            if self.depart_away(id, t, TicketState::Abandoned) {
                abandoned += 1;
            }
            false
        });
        abandoned
    }

    fn observe_rate(&self, w: &mut Worker, now: u64) {
        let total = self.counters.admissions.load(Ordering::Relaxed);
        let admitting = self.hot.admitting();
        w.rate.after_tick(
            admitting,
            total - w.admissions_at_last_tick,
            now.saturating_sub(w.last_tick_ms),
        );
        w.admissions_at_last_tick = total;
        w.last_tick_ms = now;
    }

    /// The opening: draw the pre-queue (or keep arrival order for `fifo`)
    /// and place it ahead of everyone who joins from now on.
    pub(crate) fn open(&self, _w: &mut Worker) {
        let mut pre = lock(&self.prequeue);
        let mut ids = pre.take().unwrap_or_default();
        ids.sort_unstable();
        let order = match &self.lottery {
            Some(seed) => seed.draw(&ids),
            None => ids,
        };
        // `enqueue` counts those who left before the draw as departures.
        for &id in &order {
            self.enqueue(id);
        }
        let _ = self.drawn.set(order.clone());
        self.emit(RoomEvent::Opened {
            order: &order,
            at: self.clock.now_ms(),
        });
        // Joins that see `open` go straight to the queue, behind the draw;
        // joins that saw it closed wait on the pre-queue lock we hold and
        // then find it gone.
        self.hot.open.store(true, Ordering::Release);
        drop(pre);
    }
}
