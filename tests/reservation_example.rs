//! Runs the article's simulation (`examples/reservation.rs`) on virtual time
//! and checks what the article shows: everyone answered at once, never more
//! than two holding a permit, and admission in ticket order.

#[path = "../examples/reservation.rs"]
mod reservation;

fn check(quiet: bool) {
    for seed in 0..50 {
        let outcome = reservation::simulate(seed, quiet);
        assert_eq!(
            outcome.admissions.len(),
            20,
            "seed {seed}: everyone admitted"
        );
        assert!(outcome.peak_holding <= 2, "seed {seed}: capacity exceeded");
        let numbers: Vec<u64> = outcome.admissions.iter().map(|a| a.number).collect();
        assert_eq!(numbers, (1..=20).collect::<Vec<_>>(), "seed {seed}: order");
        // With one tick every 500 ms and hand-offs in between, nobody in
        // the crowded case waits more than the article's ~2 s.
        if !quiet {
            let longest = outcome.admissions.iter().map(|a| a.delay_ms).max().unwrap();
            assert!(longest < 2_500, "seed {seed}: longest wait {longest} ms");
        }
    }
}

#[test]
fn the_crowded_case_admits_in_order_within_capacity() {
    check(false);
}

#[test]
fn the_quiet_case_uses_the_tray_and_still_keeps_order() {
    check(true);
    let outcome = reservation::simulate(7, true);
    assert!(
        outcome
            .log
            .iter()
            .any(|l| l.text.contains("move reserved permits")),
        "the worker should take permits back from the tray"
    );
}
