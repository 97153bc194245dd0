//! Engine benchmarks: join throughput (one thread and every core),
//! release with hand-off, one tick with 1,000,000 waiting and 10,000
//! admitted, and heap bytes per waiting ticket at 1,000,000 waiting
//! (counted by a wrapping allocator, printed before the timings).
//!
//! `cargo bench --bench engine`; figures go into BENCHMARKS.md.

use std::alloc::System;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use narabu::engine::{Identity, Room, RoomId, RoomSettings, SystemClock};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn room(capacity: u32) -> Arc<Room> {
    let mut s = RoomSettings::new(RoomId::new("bench").unwrap());
    s.capacity = capacity;
    Room::new(s, Arc::new(SystemClock))
}

fn memory_per_waiting_ticket() {
    const WAITING: u32 = 1_000_000;
    for with_identity in [false, true] {
        let region = Region::new(GLOBAL);
        let r = room(100);
        for i in 0..WAITING {
            let identity = with_identity.then_some(Identity(u128::from(i) * 7919));
            r.join(identity).unwrap();
        }
        let change = region.change();
        let net = change.bytes_allocated as i64 - change.bytes_deallocated as i64;
        println!(
            "engine memory per waiting ticket ({} identity): {:.1} bytes ({} waiting, {} MiB heap)",
            if with_identity { "with" } else { "without" },
            net as f64 / f64::from(WAITING),
            r.waiting_count(),
            net / (1 << 20)
        );
        drop(r);
    }
}

/// The heaviest tick: 10,000 permits arrive at once (capacity raised) and
/// go to the head of a million-long line. Too costly to set up for
/// criterion's thousands of iterations, so timed directly a few times.
fn tick_admitting_10k() {
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let r = room(0);
            for _ in 0..1_000_000 {
                r.join(None).unwrap();
            }
            r.set_capacity(10_000);
            let start = Instant::now();
            let report = black_box(r.tick());
            let elapsed = start.elapsed();
            assert_eq!(report.admitted.len(), 10_000);
            elapsed
        })
        .collect();
    times.sort();
    println!(
        "tick admitting 10,000 of 1,000,000 waiting: median {:?}, min {:?} (5 runs)",
        times[2], times[0]
    );
}

fn joins(c: &mut Criterion) {
    memory_per_waiting_ticket();
    tick_admitting_10k();
    let mut g = c.benchmark_group("join");
    g.throughput(Throughput::Elements(1));
    g.bench_function("one_thread", |b| {
        b.iter_custom(|iters| {
            let r = room(100);
            let start = Instant::now();
            for _ in 0..iters {
                black_box(r.join(None).unwrap());
            }
            start.elapsed()
        });
    });
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    g.bench_function(format!("{threads}_threads"), |b| {
        b.iter_custom(|iters| {
            let r = room(100);
            let per_thread = iters.div_ceil(threads as u64);
            let start = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        for _ in 0..per_thread {
                            black_box(r.join(None).unwrap());
                        }
                    });
                }
            });
            start.elapsed()
        });
    });
    g.bench_function("one_thread_with_identity", |b| {
        b.iter_custom(|iters| {
            let r = room(100);
            let start = Instant::now();
            for i in 0..iters {
                black_box(r.join(Some(Identity(u128::from(i)))).unwrap());
            }
            start.elapsed()
        });
    });
    g.finish();
}

fn release_with_handoff(c: &mut Criterion) {
    c.bench_function("release_with_handoff", |b| {
        b.iter_custom(|iters| {
            let r = room(1);
            let ids: Vec<_> = (0..=iters).map(|_| r.join(None).unwrap().ticket).collect();
            r.tick();
            let start = Instant::now();
            for &id in &ids[..iters as usize] {
                black_box(r.leave(id));
            }
            start.elapsed()
        });
    });
}

fn tick(c: &mut Criterion) {
    let r = room(10_000);
    for _ in 0..1_010_000 {
        r.join(None).unwrap();
    }
    r.tick();
    assert_eq!(r.admitted_count(), 10_000);
    assert_eq!(r.waiting_count(), 1_000_000);
    let mut g = c.benchmark_group("tick");
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("1M_waiting_10k_admitted", |b| {
        b.iter(|| black_box(r.tick()));
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3));
    targets = joins, release_with_handoff, tick
}
criterion_main!(benches);
