//! Autotune: the next admission rate of a room from its origin's health.
//!
//! An operator who does not know in advance how fast the site copes gives
//! bounds (an admission rate between `min_rate` and `max_rate` a minute,
//! and optionally a capacity between two more) and targets (a latency the
//! origin's chosen quantile should stay under, an error ratio); the room's
//! owner measures the origin (`crate::autotune`) and asks [`decide`] what
//! the rate should be. This is the whole rule, pure and on plain numbers:
//! the caller brings the clock, the signal and the room's current figures.
//!
//! The controller is additive increase, multiplicative decrease (the rule
//! TCP uses to find a link's capacity without being told it), with a band
//! of rest below the target, and it remembers where the origin last got
//! into trouble (the *ceiling*), since an origin's latency answers a
//! change late: the visitors admitted before a cut keep loading pages
//! after it, so a reading can still show the old rate's crowd, and a rise
//! shows only once the crowd it lets in has built up.
//!
//! - errors over the target: back off by the whole step (`rate × (1 −
//!   step)`), since an origin that fails is past helping by degrees;
//! - latency over the target: back off in proportion to the overshoot, to
//!   `rate × target / latency`, by at least one and at most the step, so a
//!   slight overshoot costs a slight cut and the rate settles near the
//!   knee rather than sawing far below it. While a run of cuts goes on and
//!   latency is still rising, the proportion is taken of the ceiling
//!   rather than of the rate already cut: the rise is the crowd of the
//!   rates before, read late, and cutting again what was cut for it would
//!   slide to the floor; once the rate is down to that share it holds (and
//!   a latency no longer rising but still over counts against the rate as
//!   it is, so a stuck origin is cut on). Held, too, while latency fell by
//!   a tenth or more since the last reading: the origin is working off
//!   what an earlier rate sent it;
//! - latency inside the band of rest (`target × (1 − headroom)` to the
//!   target) and up by a tenth or more since the last reading: eased off
//!   the same way, in proportion to how far it is over the band's lower
//!   edge, before the late readings carry it over the target;
//! - the first cut of a run (a run lasts until latency is back under the
//!   band) marks the rate it began at as the ceiling. The first cut of a
//!   run for errors or latency over the target (an overshoot: that rate was
//!   past the origin's limit) puts the ceiling a tenth ([`BELOW`]) under
//!   the rate the run began at, once a run, and cuts the rate at least to
//!   it (by no more than the step), so the climb back aims under the rate
//!   that overshot rather than straight back into the knee;
//! - latency under the band while people are waiting: raised, but only
//!   once [`CALM`] readings in a row have been under the band at the rate
//!   as it is (a reading over the band, or a change, starts the count
//!   again), so each rise shows what it does before the next. With an
//!   `increase` set, by that much; otherwise by half the distance to the
//!   ceiling, whether under it (a binary search) or past it (the distance
//!   grows by half each time: the ceiling is old news once the origin
//!   copes above it, yet a rate just past it only creeps), at least a
//!   fiftieth of the ceiling ([`CREEP`]); or by the whole step while no
//!   ceiling is known (TCP's slow start). A rise is never more than the
//!   step, nor less than one, and shrinks as latency nears the band: in
//!   full while latency is under half the band's lower edge, to nothing
//!   at the edge, since an origin past its knee shows it first as latency
//!   climbing towards the band;
//! - otherwise (steady inside the band, or nobody is held back by the
//!   rate, when a higher rate would show nothing and only wind up) it
//!   holds.
//!
//! The controller judges at most once every `interval` (a sampled loop:
//! each judgement reads the origin since the one before), and a signal of
//! too few samples changes nothing. The rate always ends within the bounds; a rate
//! found outside them (an operator's earlier setting) is brought inside at
//! once. With capacity bounds the capacity moves by the same factor as the
//! rate, within its own bounds. Nothing here revokes anyone: a lower rate
//! or capacity only admits fewer from now on (the capacity rule,
//! `rules::capacity`, lets those already admitted finish). What the
//! controller remembers ([`Memory`]: the ceiling, whether a run of cuts is
//! going on and has overshot, the calm readings in a row; and the last
//! reading) the caller keeps and hands back: [`Decision`] says what to
//! keep next.

use serde::{Deserialize, Serialize};

/// What the controller may do, and what it aims for: already checked
/// (`min ≤ max`, `0 < step ≤ 0.5`, a positive interval and target).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Controller {
    /// Admissions a minute, the lowest and highest the rate may be set to.
    pub min_rate: u32,
    pub max_rate: u32,
    /// Bounds of the capacity, when the controller sets it too.
    pub capacity: Option<(u32, u32)>,
    /// The latency the signal's quantile should stay under (ms).
    pub target_ms: f64,
    /// The share of failed requests the origin may show (0 to 1).
    pub max_error_ratio: f64,
    /// The least time between two changes (ms).
    pub interval_ms: u64,
    /// The most one change moves the rate, as a share of it.
    pub step: f64,
    /// Admissions a minute added by one increase (before the step's
    /// limit); `None`: a binary search towards the ceiling, or the step
    /// without one.
    pub increase: Option<u32>,
    /// The band of rest: no increase while latency is within this share
    /// under the target.
    pub headroom: f64,
    /// Fewer samples than this in a signal decide nothing.
    pub min_samples: u32,
}

/// What the origin looked like since the last change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Signal {
    /// The chosen latency quantile (ms); `None` when nothing measured it.
    pub latency_ms: Option<f64>,
    /// Failed ÷ all requests; `None` when the source cannot tell.
    pub error_ratio: Option<f64>,
    /// How many requests the figures stand on.
    pub samples: u32,
}

/// The room as the controller finds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Current {
    /// The admission cap now (`admit_per_minute`); `None`: no cap, taken
    /// as the highest the bounds allow.
    pub rate: Option<u32>,
    pub capacity: u32,
    /// Whether visitors are waiting on an admitting room: only then does
    /// a higher rate show in the signal.
    pub demand: bool,
    /// When the controller last judged a reading (Unix ms), if ever.
    pub last_judged_ms: Option<u64>,
    /// The latency that judgement read.
    pub previous_latency_ms: Option<f64>,
    /// What the controller remembers from earlier judgements.
    pub memory: Memory,
    pub now_ms: u64,
}

/// What the controller remembers between judgements; the caller keeps
/// it and hands it back ([`Decision::memory`] says what to keep next).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// The rate to search towards: where the latest run of cuts began,
    /// lowered by [`BELOW`] once that run was cut for latency over the
    /// target or errors (that rate was past the origin's limit). `None`
    /// until a first run of cuts.
    pub ceiling: Option<u32>,
    /// Whether a run of cuts is going on: the origin has not been under
    /// the band of rest since the last cut.
    pub cutting: bool,
    /// Whether the run of cuts going on has been cut for latency over the
    /// target or errors (its ceiling is lowered once, the first time).
    pub overshot: bool,
    /// Readings in a row under the band of rest at the rate as it is: a
    /// change, or a reading that is not under the band, starts again.
    pub calm: u32,
}

/// Why the controller chose what it chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The rate (or capacity) was outside the bounds and was brought in.
    Bounds,
    /// The last judgement is more recent than `interval`.
    TooSoon,
    /// Too few samples to judge by.
    NoSignal,
    /// Errors over the target: backed off by the step (held at the floor).
    Errors,
    /// Latency over the target: backed off in proportion (held at the
    /// floor).
    Slow,
    /// Latency over the target but down by a tenth or more since the last
    /// reading, or the rate already cut in proportion to it: held while
    /// earlier cuts take effect.
    Recovering,
    /// Latency inside the band of rest and rising: eased off before it
    /// crosses the target (held at the floor).
    Rising,
    /// Latency under the band of rest with people waiting: increased
    /// (held at `max_rate`).
    Headroom,
    /// Inside the band and not rising, or under it for fewer than
    /// [`CALM`] readings in a row: held.
    Hold,
    /// Nobody waiting: held, since a higher rate would go unmeasured.
    Idle,
}

impl Verdict {
    /// The name logs, metrics and the admin API use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bounds => "bounds",
            Self::TooSoon => "too_soon",
            Self::NoSignal => "no_signal",
            Self::Errors => "errors",
            Self::Slow => "slow",
            Self::Recovering => "recovering",
            Self::Rising => "rising",
            Self::Headroom => "headroom",
            Self::Hold => "hold",
            Self::Idle => "idle",
        }
    }
}

/// The rate and capacity to set, and why; a change when they differ from
/// the current ones. With it, what the controller remembers for the next
/// judgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub rate: u32,
    pub capacity: u32,
    pub memory: Memory,
}

impl Controller {
    fn clamp_rate(&self, rate: f64) -> u32 {
        rate.round()
            .clamp(f64::from(self.min_rate), f64::from(self.max_rate)) as u32
    }

    fn clamp_capacity(&self, capacity: f64, now: u32) -> u32 {
        match self.capacity {
            Some((low, high)) => capacity.round().clamp(f64::from(low), f64::from(high)) as u32,
            None => now,
        }
    }
}

/// How much latency must fall between two readings for the origin to
/// count as recovering.
pub const RECOVERING: f64 = 0.1;

/// How much latency must rise between two readings inside the band of
/// rest for the rate to ease off.
pub const RISING: f64 = 0.1;

/// The least share of the ceiling one increase adds when `increase` is
/// unset, and all it adds at the ceiling and past it.
pub const CREEP: f64 = 0.02;

/// How far under the rate a run of cuts began at its ceiling is put once
/// the run is cut for latency over the target or errors.
pub const BELOW: f64 = 0.1;

/// Readings in a row under the band of rest, at the rate as it is, before
/// it is raised.
pub const CALM: u32 = 2;

/// The next rate and capacity (see the module's comment for the rule).
pub fn decide(c: &Controller, now: &Current, signal: &Signal) -> Decision {
    let rate = now.rate.unwrap_or(c.max_rate);
    let memory = now.memory;
    let hold = |verdict| Decision {
        verdict,
        rate,
        capacity: now.capacity,
        memory,
    };
    let in_bounds = c.clamp_rate(f64::from(rate));
    let capacity_in_bounds = c.clamp_capacity(f64::from(now.capacity), now.capacity);
    if now.rate != Some(in_bounds) || capacity_in_bounds != now.capacity {
        return Decision {
            rate: in_bounds,
            capacity: capacity_in_bounds,
            memory: Memory { calm: 0, ..memory },
            ..hold(Verdict::Bounds)
        };
    }
    if now
        .last_judged_ms
        .is_some_and(|at| now.now_ms.saturating_sub(at) < c.interval_ms)
    {
        return hold(Verdict::TooSoon);
    }
    if signal.samples < c.min_samples.max(1) {
        return hold(Verdict::NoSignal);
    }
    // A judgement that is not calm breaks a calm spell.
    let unsettled = |verdict| Decision {
        memory: Memory { calm: 0, ..memory },
        ..hold(verdict)
    };
    let r = f64::from(rate);
    let edge = c.target_ms * (1.0 - c.headroom);
    // A cut in proportion to how far latency `l` is over `goal`: of the
    // ceiling while a run of cuts goes on and latency still climbs (the
    // climb is the crowd of the rates before, read late), else of the
    // rate; `None` when the rate is already there.
    let cut = |l: f64, goal: f64| {
        let rising = now.previous_latency_ms.is_some_and(|p| l > p);
        let of = match memory.ceiling {
            Some(ceiling) if memory.cutting && rising => f64::from(ceiling),
            _ => r,
        };
        let want = of * goal / l;
        (want < r).then(|| want.max(r * (1.0 - c.step)).min(r - 1.0))
    };
    let (verdict, next) = match (signal.error_ratio, signal.latency_ms) {
        (Some(e), _) if e > c.max_error_ratio => (Verdict::Errors, r * (1.0 - c.step)),
        (_, Some(l)) if l > c.target_ms => {
            if now
                .previous_latency_ms
                .is_some_and(|p| l <= p * (1.0 - RECOVERING))
            {
                return unsettled(Verdict::Recovering);
            }
            match cut(l, c.target_ms) {
                Some(next) => (Verdict::Slow, next),
                None => return unsettled(Verdict::Recovering),
            }
        }
        (_, Some(l)) if l < edge => {
            let calm = Decision {
                memory: Memory {
                    cutting: false,
                    overshot: false,
                    calm: memory.calm.saturating_add(1),
                    ..memory
                },
                ..hold(Verdict::Idle)
            };
            if !now.demand {
                return calm;
            }
            if calm.memory.calm < CALM {
                return Decision {
                    verdict: Verdict::Hold,
                    ..calm
                };
            }
            let additive = match (c.increase, memory.ceiling) {
                (Some(n), _) => f64::from(n),
                // Half the distance, under the ceiling or past it: near it
                // a creep, so the late readings of a rise carry the rate
                // little past where the origin got into trouble, and far
                // past it (an origin that copes better now) a stride.
                (None, Some(ceiling)) => {
                    let ceiling = f64::from(ceiling);
                    ((ceiling - r).abs() / 2.0).max(ceiling * CREEP)
                }
                (None, None) => r * c.step,
            };
            // Latency climbs towards the band before it enters it: the
            // nearer it is, the smaller the rise.
            let approach = (2.0 * (edge - l) / edge).min(1.0);
            let up = (additive.min(r * c.step) * approach).max(1.0);
            let next = c.clamp_rate(r + up);
            return Decision {
                verdict: Verdict::Headroom,
                ..with_rate(c, now, next, calm)
            };
        }
        (_, Some(l))
            if now
                .previous_latency_ms
                .is_some_and(|p| l > p * (1.0 + RISING)) =>
        {
            match cut(l, edge) {
                Some(next) => (Verdict::Rising, next),
                None => return unsettled(Verdict::Hold),
            }
        }
        (_, None) if signal.error_ratio.is_none() => return hold(Verdict::NoSignal),
        _ => return unsettled(Verdict::Hold),
    };
    // A cut. The first of a run marks where the trouble began; the first
    // overshoot of a run (latency over the target, or errors) puts the
    // ceiling under that, since the rate it began at was past the limit.
    let began = if memory.cutting {
        memory.ceiling
    } else {
        Some(rate)
    };
    let overshoots = verdict != Verdict::Rising;
    let first_overshoot = overshoots && !(memory.cutting && memory.overshot);
    let ceiling = match began {
        Some(ceiling) if first_overshoot => Some(c.clamp_rate(f64::from(ceiling) * (1.0 - BELOW))),
        began => began,
    };
    // The first overshoot also cuts at least to the lowered ceiling (by
    // no more than the step): a slight overshoot would otherwise cost a
    // slight cut and leave the rate past the limit while the crowd it let
    // in builds up.
    let next = match ceiling {
        Some(ceiling) if first_overshoot => next.min(f64::from(ceiling)).max(r * (1.0 - c.step)),
        _ => next,
    };
    let cutting = Decision {
        memory: Memory {
            ceiling,
            cutting: true,
            overshot: overshoots || memory.cutting && memory.overshot,
            calm: 0,
        },
        ..hold(verdict)
    };
    with_rate(c, now, c.clamp_rate(next), cutting)
}

/// `decision` with the rate `next` (held at a bound, the verdict still
/// says what the origin showed) and the capacity following it. A new rate
/// starts a new calm spell: it has yet to show what it does.
fn with_rate(c: &Controller, now: &Current, next: u32, decision: Decision) -> Decision {
    let r = f64::from(decision.rate);
    let calm = if next == decision.rate {
        decision.memory.calm
    } else {
        0
    };
    Decision {
        rate: next,
        capacity: c.clamp_capacity(
            f64::from(now.capacity) * f64::from(next) / r.max(1.0),
            now.capacity,
        ),
        memory: Memory {
            calm,
            ..decision.memory
        },
        ..decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn controller() -> Controller {
        Controller {
            min_rate: 60,
            max_rate: 6000,
            capacity: None,
            target_ms: 800.0,
            max_error_ratio: 0.02,
            interval_ms: 5_000,
            step: 0.25,
            increase: Some(120),
            headroom: 0.2,
            min_samples: 5,
        }
    }

    fn current(rate: u32) -> Current {
        Current {
            rate: Some(rate),
            capacity: 100,
            demand: true,
            last_judged_ms: Some(0),
            previous_latency_ms: None,
            memory: Memory::default(),
            now_ms: 10_000,
        }
    }

    /// The room at `rate`, one calm reading short of a rise.
    fn calm(rate: u32) -> Current {
        let mut now = current(rate);
        now.memory.calm = CALM - 1;
        now
    }

    fn latency(ms: f64) -> Signal {
        Signal {
            latency_ms: Some(ms),
            error_ratio: Some(0.0),
            samples: 50,
        }
    }

    #[test]
    fn slow_origin_backs_off_in_proportion_fast_one_climbs_by_the_increase() {
        let c = controller();
        // 1000 ms against 800: cut to 80 %, within the 25 % step.
        let d = decide(&c, &current(1000), &latency(1000.0));
        assert_eq!((d.verdict, d.rate), (Verdict::Slow, 800));
        // Far over: no more than the step.
        let d = decide(&c, &current(1000), &latency(10_000.0));
        assert_eq!((d.verdict, d.rate), (Verdict::Slow, 750));
        // Well under: the additive increase.
        let d = decide(&c, &calm(1000), &latency(100.0));
        assert_eq!((d.verdict, d.rate), (Verdict::Headroom, 1120));
        // Low rates grow by the step rather than the increase.
        let d = decide(&c, &calm(100), &latency(100.0));
        assert_eq!((d.verdict, d.rate), (Verdict::Headroom, 125));
        // Inside the band of rest: held.
        let d = decide(&c, &current(1000), &latency(700.0));
        assert_eq!((d.verdict, d.rate), (Verdict::Hold, 1000));
    }

    #[test]
    fn errors_back_off_whatever_the_latency() {
        let c = controller();
        let failing = Signal {
            latency_ms: Some(10.0),
            error_ratio: Some(0.5),
            samples: 50,
        };
        let d = decide(&c, &current(1000), &failing);
        assert_eq!((d.verdict, d.rate), (Verdict::Errors, 750));
        // Errors alone (a source that times nothing) still back off.
        let errors_only = Signal {
            latency_ms: None,
            ..failing
        };
        assert_eq!(decide(&c, &current(1000), &errors_only).rate, 750);
    }

    #[test]
    fn it_waits_for_the_interval_for_samples_and_for_demand() {
        let c = controller();
        let mut now = current(1000);
        now.now_ms = 4_999;
        assert_eq!(decide(&c, &now, &latency(5000.0)).verdict, Verdict::TooSoon);
        let few = Signal {
            samples: 4,
            ..latency(5000.0)
        };
        assert_eq!(decide(&c, &current(1000), &few).verdict, Verdict::NoSignal);
        let mut idle = current(1000);
        idle.demand = false;
        assert_eq!(decide(&c, &idle, &latency(10.0)).verdict, Verdict::Idle);
        // Nobody waiting does not stop a back-off.
        assert_eq!(decide(&c, &idle, &latency(5000.0)).verdict, Verdict::Slow);
    }

    #[test]
    fn a_recovering_origin_is_given_time_but_a_stuck_one_is_not() {
        let c = controller();
        let mut now = current(1000);
        now.previous_latency_ms = Some(3000.0);
        let d = decide(&c, &now, &latency(2000.0));
        assert_eq!((d.verdict, d.rate), (Verdict::Recovering, 1000));
        let d = decide(&c, &now, &latency(2900.0));
        assert_eq!((d.verdict, d.rate), (Verdict::Slow, 750));
        // Errors are never waited out.
        let failing = Signal {
            error_ratio: Some(0.5),
            ..latency(2000.0)
        };
        assert_eq!(decide(&c, &now, &failing).verdict, Verdict::Errors);
    }

    #[test]
    fn bounds_apply_at_once_and_capacity_follows_the_rate() {
        let mut c = controller();
        let mut now = current(10_000);
        now.now_ms = 1; // even right after a change
        let d = decide(&c, &now, &Signal::default());
        assert_eq!((d.verdict, d.rate), (Verdict::Bounds, 6000));
        now.rate = None;
        assert_eq!(decide(&c, &now, &Signal::default()).rate, 6000);
        c.capacity = Some((50, 400));
        let d = decide(&c, &current(1000), &latency(1000.0));
        assert_eq!((d.rate, d.capacity), (800, 80));
        let d = decide(&c, &calm(1000), &latency(100.0));
        assert_eq!((d.rate, d.capacity), (1120, 112));
        let mut small = current(1000);
        small.capacity = 10;
        assert_eq!(decide(&c, &small, &latency(700.0)).capacity, 50);
    }

    /// An origin whose latency is flat up to a knee in admissions a minute
    /// and climbs steeply past it.
    fn origin(rate: u32) -> f64 {
        let knee = 1200.0;
        let r = f64::from(rate);
        if r <= knee {
            200.0
        } else {
            200.0 + (r - knee) * 2.0
        }
    }

    /// The rates the controller sets over `rounds` intervals, each
    /// reading showing the rate of `lag` intervals before (the visitors a
    /// rate let in keep loading pages after it changed).
    fn run(c: &Controller, start: u32, rounds: usize, lag: usize) -> Vec<u32> {
        let mut now = current(start);
        let mut rates = Vec::new();
        for round in 0..rounds {
            let rate = now.rate.unwrap();
            let shown = round.checked_sub(lag + 1).map_or(start, |i| rates[i]);
            let reading = origin(if lag == 0 { rate } else { shown });
            let d = decide(c, &now, &latency(reading));
            now.last_judged_ms = Some(now.now_ms);
            now.previous_latency_ms = Some(reading);
            now.memory = d.memory;
            now.rate = Some(d.rate);
            now.now_ms += c.interval_ms;
            rates.push(d.rate);
        }
        rates
    }

    #[test]
    fn without_an_increase_it_grows_by_the_step_then_searches_for_the_ceiling() {
        let mut c = controller();
        c.increase = None;
        let mut now = calm(1000);
        assert_eq!(decide(&c, &now, &latency(100.0)).rate, 1250);
        // Under the ceiling: half the way there, at least a fiftieth of it.
        now.memory.ceiling = Some(1200);
        assert_eq!(decide(&c, &now, &latency(100.0)).rate, 1100);
        now.rate = Some(1190);
        assert_eq!(decide(&c, &now, &latency(100.0)).rate, 1214);
        // Just past it: a fiftieth; further past (the origin copes there
        // now), half the distance gone past.
        now.rate = Some(1210);
        assert_eq!(decide(&c, &now, &latency(100.0)).rate, 1234);
        now.rate = Some(1300);
        assert_eq!(decide(&c, &now, &latency(100.0)).rate, 1350);
        // Never more than the step.
        now.rate = Some(100);
        assert_eq!(decide(&c, &now, &latency(100.0)).rate, 125);
        // Latency nearing the band (640 ms) slows the rise: at 480 ms, half.
        now.rate = Some(1000);
        assert_eq!(decide(&c, &now, &latency(480.0)).rate, 1050);
        assert_eq!(decide(&c, &now, &latency(639.0)).rate, 1001);
    }

    #[test]
    fn a_run_of_cuts_remembers_where_it_began_and_reads_late_latency_against_it() {
        let c = controller();
        // Eased off inside the band: the run's start is the ceiling.
        let mut now = current(1000);
        now.previous_latency_ms = Some(600.0);
        let d = decide(&c, &now, &latency(700.0));
        assert_eq!(
            (d.verdict, d.rate, d.memory.ceiling, d.memory.cutting),
            (Verdict::Rising, 914, Some(1000), true)
        );
        // The next reading is over the target: the crowd of the rates
        // before, measured late. The cut is taken of the ceiling, not
        // compounded on the rate already cut; and this run has now
        // overshot, so its ceiling goes a tenth under where it began.
        let mut now = current(914);
        (now.memory, now.previous_latency_ms) = (d.memory, Some(700.0));
        let d = decide(&c, &now, &latency(1000.0));
        assert_eq!(
            (d.verdict, d.rate, d.memory.ceiling),
            (Verdict::Slow, 800, Some(900))
        );
        // Already cut that far: held while the cut takes effect.
        let mut now = current(800);
        (now.memory, now.previous_latency_ms) = (d.memory, Some(850.0));
        let d = decide(&c, &now, &latency(880.0));
        assert_eq!((d.verdict, d.rate), (Verdict::Recovering, 800));
        // No longer rising yet still over: the rate as it is is too high.
        let d = decide(&c, &now, &latency(840.0));
        assert_eq!(
            (d.verdict, d.rate, d.memory.ceiling),
            (Verdict::Slow, 762, Some(900))
        );
        // Back under the band: the run is over, the ceiling stays.
        let d = decide(&c, &now, &latency(100.0));
        assert_eq!(
            (d.verdict, d.memory.ceiling, d.memory.cutting),
            (Verdict::Hold, Some(900), false)
        );
        // The next run marks a new ceiling.
        now.memory = d.memory;
        now.previous_latency_ms = Some(600.0);
        let d = decide(&c, &now, &latency(700.0));
        assert_eq!((d.rate, d.memory.ceiling), (731, Some(800)));
    }

    #[test]
    fn an_overshoot_lowers_the_ceiling_under_the_rate_that_overshot() {
        let mut c = controller();
        c.increase = None;
        // Slightly over at 1000: the proportional cut would be to 941, but
        // 1000 was past the limit; the ceiling goes a tenth under it, and
        // the rate at least as far.
        let d = decide(&c, &current(1000), &latency(850.0));
        assert_eq!(
            (d.verdict, d.rate, d.memory.ceiling, d.memory.overshot),
            (Verdict::Slow, 900, Some(900), true)
        );
        // Once a run: a later overshoot in the same run leaves it.
        let mut now = current(900);
        (now.memory, now.previous_latency_ms) = (d.memory, Some(850.0));
        let d = decide(&c, &now, &latency(840.0));
        assert_eq!((d.rate, d.memory.ceiling), (857, Some(900)));
        // Never more than the step, even to reach the lowered ceiling.
        let mut now = current(1000);
        now.memory = Memory {
            ceiling: Some(1200),
            cutting: true,
            overshot: false,
            calm: 0,
        };
        let d = decide(&c, &now, &latency(850.0));
        assert_eq!((d.rate, d.memory.ceiling), (941, Some(1080)));
        now.memory.ceiling = Some(400);
        let d = decide(&c, &now, &latency(850.0));
        assert_eq!((d.rate, d.memory.ceiling), (750, Some(360)));
        // Errors lower it as well.
        let failing = Signal {
            error_ratio: Some(0.5),
            ..latency(100.0)
        };
        assert_eq!(
            decide(&c, &current(1000), &failing).memory.ceiling,
            Some(900)
        );
        // The climb back aims at the lowered ceiling, not the rate that
        // overshot: from 700, half the way to 900.
        let mut now = calm(700);
        now.memory.ceiling = Some(900);
        assert_eq!(decide(&c, &now, &latency(100.0)).rate, 800);
    }

    #[test]
    fn it_rises_only_after_calm_readings_in_a_row() {
        let c = controller();
        // A first reading under the band: held, counted.
        let d = decide(&c, &current(1000), &latency(100.0));
        assert_eq!((d.verdict, d.rate, d.memory.calm), (Verdict::Hold, 1000, 1));
        // The next: raised, and the new rate starts its own count.
        let mut now = current(1000);
        now.memory = d.memory;
        let d = decide(&c, &now, &latency(100.0));
        assert_eq!(
            (d.verdict, d.rate, d.memory.calm),
            (Verdict::Headroom, 1120, 0)
        );
        // A reading inside the band breaks the count.
        let d = decide(&c, &now, &latency(700.0));
        assert_eq!((d.verdict, d.memory.calm), (Verdict::Hold, 0));
        // Nobody waiting: still counted, so a rise can follow at once.
        let mut idle = current(1000);
        idle.demand = false;
        let d = decide(&c, &idle, &latency(100.0));
        assert_eq!((d.verdict, d.memory.calm), (Verdict::Idle, 1));
    }

    #[test]
    fn latency_rising_inside_the_band_eases_off_before_the_target() {
        let c = controller();
        // The band is 640 to 800 ms.
        let mut now = current(1000);
        now.previous_latency_ms = Some(600.0);
        let d = decide(&c, &now, &latency(700.0));
        assert_eq!(
            (d.verdict, d.rate, d.memory.ceiling),
            (Verdict::Rising, 914, Some(1000))
        );
        // Up by less than a tenth, or down: held.
        assert_eq!(decide(&c, &now, &latency(650.0)).verdict, Verdict::Hold);
        now.previous_latency_ms = Some(780.0);
        assert_eq!(decide(&c, &now, &latency(700.0)).verdict, Verdict::Hold);
    }

    #[test]
    fn it_settles_under_the_target_from_too_high_and_too_low() {
        let mut c = controller();
        // The best fixed rate keeps latency at 800 ms: 1500 a minute.
        for (increase, start) in [(Some(120), 6000), (Some(120), 60), (None, 6000), (None, 60)] {
            c.increase = increase;
            let rates = run(&c, start, 60, 0);
            let settled = &rates[40..];
            for &r in settled {
                assert!(
                    origin(r) <= c.target_ms * 1.1,
                    "from {start}, {increase:?}: {rates:?}"
                );
                assert!(
                    r >= 1200,
                    "from {start}, {increase:?}, too far under: {rates:?}"
                );
            }
        }
    }

    #[test]
    fn readings_that_lag_neither_slide_it_to_the_floor_nor_keep_it_past_the_knee() {
        let mut c = controller();
        c.increase = None;
        // Each reading shows the rate of two judgements before: the sawtooth
        // this makes must damp out around the best fixed rate (1500).
        for start in [6000, 60] {
            let rates = run(&c, start, 80, 2);
            let settled = &rates[50..];
            let low = settled.iter().min().copied().unwrap_or(0);
            assert!(low >= 800, "from {start}, slid to {low}: {rates:?}");
            let mean = settled.iter().map(|&r| f64::from(r)).sum::<f64>() / settled.len() as f64;
            assert!(mean >= 1275.0, "from {start}, mean {mean}: {rates:?}");
            let end = &rates[70..];
            let latency = end.iter().map(|&r| origin(r)).sum::<f64>() / end.len() as f64;
            assert!(
                latency <= c.target_ms,
                "from {start}, {latency} ms at the end: {rates:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn every_decision_keeps_bounds_step_and_direction(
            min in 1u32..5_000,
            span in 0u32..50_000,
            rate in proptest::option::of(0u32..100_000),
            latency in proptest::option::of(0.0f64..20_000.0),
            errors in proptest::option::of(0.0f64..1.0),
            samples in 0u32..100,
            step in 0.01f64..0.5,
            increase in proptest::option::of(1u32..10_000),
            ceiling in proptest::option::of(1u32..100_000),
            cutting: bool,
            overshot: bool,
            calm in 0u32..4,
            demand: bool,
            since in 0u64..20_000,
            previous in proptest::option::of(0.0f64..20_000.0),
        ) {
            let c = Controller { min_rate: min, max_rate: min + span, step, increase, ..controller() };
            let now = Current {
                rate,
                capacity: 100,
                demand,
                last_judged_ms: Some(0),
                previous_latency_ms: previous,
                memory: Memory { ceiling, cutting, overshot, calm },
                now_ms: since,
            };
            let signal = Signal { latency_ms: latency, error_ratio: errors, samples };
            let d = decide(&c, &now, &signal);
            prop_assert!(d.rate >= c.min_rate && d.rate <= c.max_rate);
            let before = now.rate.unwrap_or(c.max_rate);
            if d.verdict != Verdict::Bounds {
                let moved = f64::from(d.rate.abs_diff(before));
                prop_assert!(moved <= (f64::from(before) * step).max(1.0) + 0.5, "{before} -> {d:?}");
            }
            match d.verdict {
                Verdict::Errors | Verdict::Slow | Verdict::Rising => {
                    prop_assert!(d.rate < before || d.rate == c.min_rate);
                    // A run of cuts marks where it began, and goes on; its
                    // first overshoot puts the ceiling a tenth under that,
                    // and the rate at least as low unless the step forbids.
                    let began = if cutting { ceiling } else { Some(before) };
                    let first = d.verdict != Verdict::Rising && !(cutting && overshot);
                    let expected = if first {
                        began.map(|b| c.clamp_rate(f64::from(b) * (1.0 - BELOW)))
                    } else {
                        began
                    };
                    prop_assert_eq!((d.memory.ceiling, d.memory.cutting), (expected, true));
                    prop_assert_eq!(d.memory.overshot, d.verdict != Verdict::Rising || cutting && overshot);
                    if first && let Some(lowered) = expected {
                        let floor = (f64::from(before) * (1.0 - step)).round() as u32;
                        prop_assert!(d.rate <= lowered.max(floor).max(c.min_rate), "{before} -> {d:?}");
                    }
                }
                Verdict::Headroom => {
                    prop_assert!(demand && (d.rate > before || d.rate == c.max_rate));
                    // Only after calm readings in a row.
                    prop_assert!(calm + 1 >= CALM);
                }
                Verdict::Bounds => {}
                _ => prop_assert_eq!(d.rate, before),
            }
            // Only a cut sets the ceiling, and only latency under the band
            // of rest ends a run of cuts (and counts as calm).
            let under = latency.is_some_and(|l| l < c.target_ms * (1.0 - c.headroom));
            if !matches!(d.verdict, Verdict::Errors | Verdict::Slow | Verdict::Rising) {
                prop_assert_eq!(d.memory.ceiling, ceiling);
                if matches!(d.verdict, Verdict::Headroom | Verdict::Idle) {
                    prop_assert!(!d.memory.cutting);
                }
                if cutting && !d.memory.cutting {
                    prop_assert!(under);
                }
            }
            // The count of calm readings goes up by one on a calm reading
            // at an unchanged rate, is kept when nothing was judged, and
            // otherwise starts again.
            let counted = d.memory.calm == calm + 1 && under && d.rate == before;
            let kept = d.memory.calm == calm
                && matches!(d.verdict, Verdict::TooSoon | Verdict::NoSignal);
            prop_assert!(d.memory.calm == 0 || counted || kept, "{calm} -> {d:?}");
            if since < c.interval_ms && d.verdict != Verdict::Bounds {
                prop_assert_eq!(d.rate, before);
            }
            if errors.is_some_and(|e| e > c.max_error_ratio) && d.verdict != Verdict::Bounds {
                prop_assert!(d.rate <= before);
            }
        }
    }
}
