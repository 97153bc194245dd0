//! What fairness on the record costs: the admission record's CPU per
//! admission (the projection's apply: one canonical line and one SHA-256),
//! reading a page of 1,000 entries, and signing a receipt (what it adds to
//! a join); and the record's bytes per admission in memory and in a
//! snapshot or image (postcard), printed before the timings.
//!
//! `cargo bench --bench record`; figures go into BENCHMARKS.md.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use narabu::engine::{AdmissionRecord, EventRecord};
use narabu::pass::{PassAlgorithm, PassKeys};
use narabu::receipt::{ReceiptClaims, audience};

/// A record of `n` tickets, each joined and admitted.
fn admitted(n: u32) -> AdmissionRecord {
    let mut r = AdmissionRecord::new("bench", 1);
    let mut seq = 0;
    for id in 0..n {
        seq += 1;
        r.apply(seq, &joined(id));
        seq += 1;
        r.apply(
            seq,
            &EventRecord::Admitted {
                ticket: id,
                at: 1_764_237_600_000 + u64::from(id) * 3,
            },
        );
    }
    r
}

fn joined(id: u32) -> EventRecord {
    EventRecord::Joined {
        ticket: id,
        identity: None,
        lane: 0,
        index: Some(id),
        ahead: 0,
        at: 1_764_237_600_000,
    }
}

fn bytes_per_admission() {
    const N: u32 = 1_000_000;
    let r = admitted(N);
    let stored = postcard::to_allocvec(&r).unwrap().len();
    let memory = std::mem::size_of::<narabu::engine::Entry>() + 16;
    println!(
        "record bytes per admission ({N} admissions): {:.1} stored (postcard, in the snapshot or image), {memory} in memory (entry {} + the ticket's lane, number and time of joining 16, and a checkpoint hash per 64 entries, {:.1})",
        stored as f64 / f64::from(N),
        std::mem::size_of::<narabu::engine::Entry>(),
        32.0 / narabu::engine::CHECKPOINT as f64,
    );
}

fn record(c: &mut Criterion) {
    bytes_per_admission();
    let mut g = c.benchmark_group("record");
    g.bench_function("admission", |b| {
        b.iter_custom(|iters| {
            let n = u32::try_from(iters).unwrap_or(u32::MAX);
            let mut r = AdmissionRecord::new("bench", 1);
            // The joins are applied first: only the admissions are timed
            // (each numbered after every join).
            for id in 0..n {
                r.apply(u64::from(id) + 1, &joined(id));
            }
            let start = std::time::Instant::now();
            for id in 0..n {
                r.apply(
                    u64::from(n) + u64::from(id) + 1,
                    &EventRecord::Admitted {
                        ticket: id,
                        at: 1_764_237_600_000 + u64::from(id),
                    },
                );
            }
            let took = start.elapsed();
            assert_eq!(r.len(), u64::from(n), "every admission made an entry");
            took
        });
    });
    let r = admitted(100_000);
    g.bench_function("page_of_1000", |b| {
        b.iter(|| black_box(r.read(50_030, 1000)));
    });
    g.finish();
}

fn receipts(c: &mut Criterion) {
    let claims = ReceiptClaims {
        iss: "https://queue.example.com".into(),
        aud: audience("sale"),
        room: "sale".into(),
        epoch: 6_911_925_761_153_930_331,
        ticket: 41_234,
        number: Some(41_235),
        lane: Some("members".into()),
        joined_at: 1_764_237_600_123,
        iat: 1_764_237_600,
    };
    let mut g = c.benchmark_group("receipt");
    for alg in [PassAlgorithm::ES256, PassAlgorithm::EdDSA] {
        let keys = PassKeys::derived(alg, &[7; 32], None);
        g.bench_function(format!("sign_{}", alg.as_str()), |b| {
            b.iter(|| black_box(keys.sign_receipt(&claims)));
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3));
    targets = record, receipts
}
criterion_main!(benches);
