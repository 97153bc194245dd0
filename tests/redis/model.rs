//! The model-based tests: random sequences of operations run against a
//! plain sequential model of the semaphore (`narabu_testkit::model`) and
//! against the engine three ways — directly, through the embedded backend,
//! and through three instances on one Redis whose room changes owner at
//! random points of the sequence (the owner stops and hands the room over,
//! and a new instance takes its place). Every operation goes to a random
//! instance through the interface the HTTP layer uses. They must agree on
//! every ticket's state and position and on where every permit is, and
//! the semaphore's invariants (capacity never exceeded, strict ticket
//! order, every permit accounted for) must hold after every step: at once
//! on the instance that made the change, and on every other instance as
//! soon as its copy of the room has caught up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narabu::backend::embedded::EmbeddedBackend;
use narabu::backend::owned::OwnedBackend;
use narabu::backend::owner::OwnerOptions;
use narabu::backend::{Backend, BackendError, JoinRequest, RoomPatch, StreamsReport, TicketRef};
use narabu::config::RedisWait;
use narabu::engine::{
    Identity, JoinError, ManualClock, Room, RoomId, RoomPatch as EnginePatch, TicketId, TicketState,
};
use proptest::prelude::*;

use narabu_testkit::model::{Model, Op, T0, op, settings};
use narabu_testkit::redis_server::{RedisServer, owners_on};

fn run_on_the_engine(initial_capacity: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(T0);
    let room = Room::new(settings("model", initial_capacity), Arc::new(clock.clone()));
    let mut model = Model::new(initial_capacity);
    let mut last_positions: HashMap<usize, u64> = HashMap::new();

    for op in ops {
        let admitted_before = model.admitted();
        let admissions_before = room.stats().admissions;
        let pick = |i: usize| (!model.tickets.is_empty()).then(|| i % model.tickets.len());
        match op {
            Op::Join(identity) => {
                let joined = room.join(identity.map(|i| Identity(u128::from(i))));
                match model.join(identity) {
                    Some((expected, is_new)) => {
                        let joined = joined.unwrap();
                        prop_assert_eq!(joined.ticket as usize, expected, "idempotent joins");
                        prop_assert_eq!(joined.is_new, is_new);
                    }
                    None => prop_assert_eq!(joined, Err(JoinError::SoldOut)),
                }
            }
            Op::Leave(i) => {
                if let Some(id) = pick(i) {
                    model.end(id, TicketState::Released, TicketState::Left);
                    room.leave(id as TicketId);
                }
            }
            Op::Release(i) => {
                if let Some(id) = pick(i) {
                    model.release(id);
                    room.release(id as TicketId);
                }
            }
            Op::Revoke(i) => {
                if let Some(id) = pick(i) {
                    model.end(id, TicketState::Revoked, TicketState::Revoked);
                    room.revoke(id as TicketId);
                }
            }
            Op::Touch(i) => {
                if let Some(id) = pick(i) {
                    model.touch(id);
                    room.touch(id as TicketId);
                }
            }
            Op::Tick => {
                model.tick();
                room.tick();
            }
            Op::Advance(ms) => {
                model.now += ms;
                clock.advance(Duration::from_millis(ms));
            }
            Op::SetCapacity(c) => {
                model.set_capacity(c);
                room.set_capacity(c);
            }
            Op::Pause(p) => {
                model.paused = p;
                room.set_paused(p);
            }
            Op::SetMode(m) => {
                model.mode = m;
                room.patch(&EnginePatch {
                    mode: Some(m),
                    ..EnginePatch::default()
                });
            }
        }

        // The engine and the model agree on every ticket.
        for id in 0..model.tickets.len() {
            let status = room.status(id as TicketId).unwrap();
            prop_assert_eq!(status.state, model.tickets[id].state, "ticket {}", id);
            let position = shown_position(&model, id, &mut last_positions);
            prop_assert_eq!(status.position, position, "position of ticket {}", id);
        }

        // Invariant 4: every permit is somewhere, and in the same place.
        let ledger = room.ledger();
        prop_assert!(ledger.balances(), "{:?}", ledger);
        prop_assert_eq!(ledger.held, model.hand);
        prop_assert_eq!(ledger.tray, model.tray);
        prop_assert_eq!(ledger.debt, model.debt);
        prop_assert_eq!(ledger.admitted, model.admitted());
        prop_assert_eq!(room.stats().admissions, model.admissions);

        // Invariant 1: above capacity (after a decrease, or after
        // passthrough), nobody new gets in, unless the room lets everyone in.
        let admitted_now = ledger.admitted;
        if admitted_now > ledger.capacity && !model.mode.admits_everyone() {
            prop_assert_eq!(room.stats().admissions, admissions_before);
            prop_assert!(admitted_now <= admitted_before);
        }

        // Invariant 3: after a tick, no free permit coexists with a waiter.
        if matches!(op, Op::Tick) && model.admitting() && ledger.held + ledger.tray > 0 {
            prop_assert_eq!(room.waiting_count(), 0, "{:?}", ledger);
        }
        prop_assert_eq!(room.waiting_count(), model_waiting(&model));
    }
    Ok(())
}

/// The position a holder is shown: the model's, never above what it was
/// shown before (a returner steps in ahead of the line: the count behind
/// it grows, what each holder is shown does not).
fn shown_position(model: &Model, id: usize, shown: &mut HashMap<usize, u64>) -> Option<u64> {
    let position = model
        .position(id)
        .map(|p| shown.get(&id).map_or(p, |&before| p.min(before)));
    if let Some(p) = position {
        shown.insert(id, p);
    }
    position
}

fn model_waiting(model: &Model) -> u64 {
    model
        .tickets
        .iter()
        .filter(|t| t.state == TicketState::Waiting)
        .count() as u64
}

/// One step of a sequence on a deployment: an operation on the instance
/// `at` picks, or (on Redis) a change of the room's owner.
#[derive(Clone, Debug)]
enum Step {
    Op { op: Op, at: usize },
    NewOwner,
}

fn step(owner_changes: bool) -> impl Strategy<Value = Step> {
    let on = (op(), any::<usize>()).prop_map(|(op, at)| Step::Op { op, at });
    let change = if owner_changes { 1 } else { 0 };
    prop_oneof![12 => on, change => Just(Step::NewOwner)]
}

/// The instances of a deployment: each an `Arc<dyn Backend>` as the HTTP
/// layer holds it; on Redis also each as the owners' backend, to find the
/// room's owner and stop it.
struct Deployment {
    instances: Vec<Arc<dyn Backend>>,
    owners: Vec<Arc<OwnedBackend>>,
    redis: Option<RedisServer>,
    clock: ManualClock,
    capacity: u32,
}

const INSTANCES: usize = 3;

/// Short, so that an owner change costs the sequence little: the others
/// try for the lease every quarter of it.
const LEASE: Duration = Duration::from_millis(400);

fn owner_options() -> OwnerOptions {
    OwnerOptions {
        lease: LEASE,
        ticks: false,
        ..OwnerOptions::default()
    }
}

impl Deployment {
    fn embedded(capacity: u32) -> Self {
        let clock = ManualClock::new(T0);
        let b: Arc<dyn Backend> = EmbeddedBackend::without_workers(
            vec![settings("model", capacity)],
            Arc::new(clock.clone()),
        );
        Self {
            instances: vec![b],
            owners: Vec::new(),
            redis: None,
            clock,
            capacity,
        }
    }

    async fn on_redis(capacity: u32) -> Self {
        let clock = ManualClock::new(T0);
        let mut d = Self {
            instances: Vec::new(),
            owners: Vec::new(),
            redis: Some(RedisServer::start().await),
            clock,
            capacity,
        };
        for _ in 0..INSTANCES {
            let owned = d.new_instance().await;
            d.instances.push(owned.clone());
            d.owners.push(owned);
        }
        d
    }

    async fn new_instance(&self) -> Arc<OwnedBackend> {
        owners_on(
            self.redis.as_ref().expect("on Redis"),
            vec![settings("model", self.capacity)],
            Arc::new(self.clock.clone()),
            owner_options(),
            RedisWait::OFF,
        )
        .await
    }

    /// The owner stops (handing the room over) and a new instance takes
    /// its place; one of the others becomes the owner.
    async fn change_owner(&mut self) {
        let room = rid();
        let deadline = Instant::now() + Duration::from_secs(10);
        let k = loop {
            if let Some(k) = self.owners.iter().position(|o| o.owns(&room)) {
                break k;
            }
            assert!(Instant::now() < deadline, "nobody owns the room");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        bounded("the owner's shutdown", self.owners[k].shutdown()).await;
        let fresh = bounded("a new instance", self.new_instance()).await;
        self.instances[k] = fresh.clone();
        self.owners[k] = fresh;
    }
}

fn rid() -> RoomId {
    RoomId::new("model").unwrap()
}

/// A change the model expects to be made: on Redis, an owner change in
/// flight is waited out by the backend itself, so any refusal here is a
/// failure.
fn made<T>(r: Result<T, BackendError>, what: &str) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: {e}")))
}

/// A departure of a ticket in any state: refusals that say the ticket is
/// past leaving are what the model's no-op is; the store failing is not.
fn departed(r: Result<narabu::engine::Departure, BackendError>) -> Result<(), TestCaseError> {
    match r {
        Err(e @ (BackendError::Unavailable(_) | BackendError::NotReplicated { .. })) => {
            Err(TestCaseError::fail(format!("a departure failed: {e}")))
        }
        _ => Ok(()),
    }
}

async fn run_on(mut d: Deployment, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let room = rid();
    let mut model = Model::new(d.capacity);
    let mut shown: HashMap<usize, u64> = HashMap::new();
    let mut refs: Vec<TicketRef> = Vec::new();

    for step in steps {
        let (op, at) = match step {
            Step::NewOwner => {
                bounded("an owner change", d.change_owner()).await;
                model.owner_changed();
                (None, None)
            }
            Step::Op { op, at } => (Some(op), Some(at % d.instances.len())),
        };
        if let (Some(op), Some(at)) = (op.clone(), at) {
            let b = d.instances[at].clone();
            let pick = |i: usize| (!model.tickets.is_empty()).then(|| i % model.tickets.len());
            match op {
                Op::Join(identity) => {
                    let request = match identity {
                        Some(i) => JoinRequest::with_identity(Identity(u128::from(i))),
                        None => JoinRequest::anonymous(),
                    };
                    let joined = bounded("b.join", b.join(&room, request)).await;
                    match model.join(identity) {
                        Some((expected, is_new)) => {
                            let joined = made(joined, "a join")?;
                            prop_assert_eq!(
                                joined.ticket.id as usize,
                                expected,
                                "idempotent joins"
                            );
                            prop_assert_eq!(joined.is_new, is_new);
                            if is_new {
                                refs.push(joined.ticket);
                            }
                        }
                        None => {
                            prop_assert!(
                                matches!(joined, Err(BackendError::SoldOut(_))),
                                "{:?}",
                                joined
                            )
                        }
                    }
                }
                Op::Leave(i) => {
                    if let Some(id) = pick(i) {
                        model.end(id, TicketState::Released, TicketState::Left);
                        departed(bounded("b.leave", b.leave(&room, refs[id])).await)?;
                    }
                }
                Op::Release(i) => {
                    if let Some(id) = pick(i) {
                        model.release(id);
                        departed(bounded("b.release", b.release(&room, refs[id])).await)?;
                    }
                }
                Op::Revoke(i) => {
                    if let Some(id) = pick(i) {
                        model.end(id, TicketState::Revoked, TicketState::Revoked);
                        departed(bounded("b.revoke", b.revoke(&room, refs[id])).await)?;
                    }
                }
                Op::Touch(i) => {
                    if let Some(id) = pick(i) {
                        model.touch(id);
                        // A stream that opens and closes in one report:
                        // a sign of life seen now, and nothing held.
                        let streams = StreamsReport {
                            holder: 1,
                            full: false,
                            opened: vec![refs[id]],
                            closed: vec![refs[id]],
                        };
                        made(
                            bounded("b.hold_streams", b.hold_streams(&room, &streams)).await,
                            "a stream's report",
                        )?;
                    }
                }
                Op::Tick => {
                    model.tick();
                    made(bounded("b.tick", b.tick(&room)).await, "a tick")?;
                }
                Op::Advance(ms) => {
                    model.now += ms;
                    d.clock.advance(Duration::from_millis(ms));
                }
                Op::SetCapacity(_) | Op::Pause(_) | Op::SetMode(_) => {
                    let patch = match op {
                        Op::SetCapacity(c) => {
                            model.set_capacity(c);
                            RoomPatch {
                                capacity: Some(c),
                                ..RoomPatch::default()
                            }
                        }
                        Op::Pause(p) => {
                            model.paused = p;
                            RoomPatch {
                                paused: Some(p),
                                ..RoomPatch::default()
                            }
                        }
                        Op::SetMode(m) => {
                            model.mode = m;
                            RoomPatch {
                                mode: Some(m),
                                ..RoomPatch::default()
                            }
                        }
                        _ => unreachable!("an operator's change"),
                    };
                    let changed = bounded("b.patch_room", b.patch_room(&room, patch)).await;
                    made(changed, "an operator's change")?;
                }
            }
        }

        let expected = Expected {
            states: model.tickets.iter().map(|t| t.state).collect(),
            positions: (0..model.tickets.len())
                .map(|id| shown_position(&model, id, &mut shown))
                .collect(),
            unclamped: (0..model.tickets.len())
                .map(|id| model.position(id))
                .collect(),
            strict_positions: d.owners.is_empty(),
            held: model.hand,
            tray: model.tray,
            debt: model.debt,
            admitted: model.admitted(),
            admissions: model.admissions,
            waiting: model_waiting(&model),
        };
        // The instance that made the change shows it at once; the others
        // once their copies have caught up.
        for (k, b) in d.instances.iter().enumerate() {
            let deadline = match at {
                Some(a) if a == k => Instant::now(),
                _ => Instant::now() + Duration::from_secs(5),
            };
            loop {
                let seen = bounded("the checks", expected.check(b.as_ref(), &room, &refs)).await;
                match seen {
                    Ok(()) => break,
                    Err(e) if Instant::now() >= deadline => {
                        return Err(TestCaseError::fail(format!(
                            "instance {k} (the change's: {at:?}) after {op:?}: {e}"
                        )));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        }
    }
    for b in &d.instances {
        bounded("a shutdown", b.shutdown()).await;
    }
    Ok(())
}

/// What every instance must show after a step.
struct Expected {
    states: Vec<TicketState>,
    /// What each holder is shown: never above what it was shown before.
    positions: Vec<Option<u64>>,
    /// Each ticket's place as counted now. A visitor who comes back steps
    /// in ahead of the line; the engine hides the step back from those
    /// behind by remembering what it showed them, in memory: an instance
    /// whose copy started again (an owner change) or another instance may
    /// show the count as it is, never more.
    unclamped: Vec<Option<u64>>,
    strict_positions: bool,
    held: u64,
    tray: u64,
    debt: u64,
    admitted: u64,
    admissions: u64,
    waiting: u64,
}

impl Expected {
    async fn check(
        &self,
        b: &dyn Backend,
        room: &RoomId,
        refs: &[TicketRef],
    ) -> Result<(), String> {
        for (id, t) in refs.iter().enumerate() {
            let s = b
                .status(room, *t, false)
                .await
                .map_err(|e| format!("ticket {id}: {e}"))?;
            let placed = match (s.position, self.positions[id], self.unclamped[id]) {
                _ if self.strict_positions => s.position == self.positions[id],
                (Some(p), Some(low), Some(high)) => (low..=high).contains(&p),
                (p, low, _) => p == low,
            };
            if s.state != self.states[id] || !placed {
                return Err(format!(
                    "ticket {id} is {:?} at {:?}, the model says {:?} at {:?}",
                    s.state, s.position, self.states[id], self.positions[id]
                ));
            }
        }
        let snap = b.room(room).await.map_err(|e| e.to_string())?;
        let l = snap.ledger;
        let seen = (
            l.balances(),
            l.held,
            l.tray,
            l.debt,
            l.admitted,
            snap.stats.admissions,
            snap.view.waiting,
        );
        let want = (
            true,
            self.held,
            self.tray,
            self.debt,
            self.admitted,
            self.admissions,
            self.waiting,
        );
        if seen != want {
            return Err(format!(
                "(balances, held, tray, debt, admitted, admissions, waiting) are {seen:?}, \
                 the model says {want:?}"
            ));
        }
        Ok(())
    }
}

/// Every await of a sequence ends: a hang is a failure that says where.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(30), f).await {
        Ok(t) => t,
        Err(_) => panic!("{what} did not end within 30 s"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn the_engine_behaves_like_the_model(
        capacity in 0u32..5,
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        run_on_the_engine(capacity, ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_embedded_backend_behaves_like_the_model(
        capacity in 0u32..5,
        steps in proptest::collection::vec(step(false), 1..100),
    ) {
        runtime().block_on(async move { run_on(Deployment::embedded(capacity), steps).await })?;
    }
}

proptest! {
    // Each case starts a Redis and three instances: fewer, shorter cases.
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn three_instances_on_redis_behave_like_the_model_while_owners_change(
        capacity in 0u32..5,
        steps in proptest::collection::vec(step(true), 1..60),
    ) {
        runtime().block_on(async move {
            let d = bounded("the deployment's start", Deployment::on_redis(capacity)).await;
            run_on(d, steps).await
        })?;
    }
}
