//! Priority lanes: which lane's head the next free permit goes to.
//!
//! A room may split its line into lanes (members, general, …), each with a
//! weight. Within a lane admission follows ticket order exactly (each lane
//! is a line of its own); across lanes the room's permits are shared by
//! weight. The rule: a free permit goes to the lane, among those with
//! someone waiting, that would hold the smallest multiple of its weight
//! with it, `(admitted + 1) / weight` (ties to the lane listed first). When
//! every lane has people waiting this hands out the room's capacity in
//! proportion to the weights (the largest-divisor apportionment: with
//! capacity 10 and weights 30/70, exactly 3 and 7); when a lane has nobody
//! waiting it takes no turn, so its share goes to the others, and as its
//! visitors come back each permit that frees up goes to it first until it
//! holds its share again.
//!
//! The rule needs only each lane's admitted count and whether anyone waits
//! in it, so the engine applies it inside its atomic admission step.

/// One lane as the rule sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LaneLoad {
    pub weight: u32,
    /// Permits the lane's visitors hold now.
    pub admitted: u64,
    /// Someone may be waiting at the lane's head.
    pub waiting: bool,
}

/// Whether lane `a` comes before lane `b` for the next permit: its
/// `(admitted + 1) / weight` is smaller (cross-multiplied, exactly).
fn before(a: &LaneLoad, b: &LaneLoad) -> bool {
    let a_need = u128::from(a.admitted + 1) * u128::from(b.weight.max(1));
    let b_need = u128::from(b.admitted + 1) * u128::from(a.weight.max(1));
    a_need < b_need
}

/// The lane the next free permit goes to, or `None` when nobody waits in
/// any lane. With one lane this is always that lane when it has waiters.
pub(crate) fn next_lane(lanes: &[LaneLoad]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, lane) in lanes.iter().enumerate() {
        if !lane.waiting {
            continue;
        }
        if best.is_none_or(|b| before(lane, &lanes[b])) {
            best = Some(i);
        }
    }
    best
}

/// The lanes in the order the next permit would try them: `next_lane`
/// first, then, should its head turn out to hold nobody admissible (every
/// ticket left or went quiet), the next best, and so on.
pub(crate) fn lane_order(lanes: &[LaneLoad]) -> Vec<usize> {
    let mut loads = lanes.to_vec();
    let mut order = Vec::with_capacity(lanes.len());
    while let Some(i) = next_lane(&loads) {
        order.push(i);
        loads[i].waiting = false;
    }
    order
}

/// The part of the room's admissions `lane` can expect now: its weight over
/// the weights of the lanes with someone waiting (itself included), so a
/// lane whose neighbours are empty expects them all. What a lane's
/// estimated wait scales the room's admission rate by.
#[cfg(test)]
pub(crate) fn lane_share(lanes: &[LaneLoad], lane: usize) -> f64 {
    let Some(own) = lanes.get(lane) else {
        return 1.0;
    };
    let busy: u64 = lanes
        .iter()
        .enumerate()
        .filter(|&(i, l)| l.waiting || i == lane)
        .map(|(_, l)| u64::from(l.weight.max(1)))
        .sum();
    f64::from(own.weight.max(1)) / busy as f64
}

/// Each lane's share of `capacity` when every lane has people waiting: the
/// admitted counts the rule settles at.
#[cfg(test)]
pub(crate) fn shares(weights: &[u32], capacity: u64) -> Vec<u64> {
    let mut loads: Vec<LaneLoad> = weights
        .iter()
        .map(|&weight| LaneLoad {
            weight,
            admitted: 0,
            waiting: true,
        })
        .collect();
    for _ in 0..capacity {
        match next_lane(&loads) {
            Some(i) => loads[i].admitted += 1,
            None => break,
        }
    }
    loads.iter().map(|l| l.admitted).collect()
}

/// The lanes as a ticket's status sees them: each lane's weight and
/// whether anyone waits in it. Fixed-size so the room's facts stay a
/// plain value; a room without lanes is one lane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneLoads {
    len: u8,
    weight: [u32; MAX_LANES],
    waiting: [bool; MAX_LANES],
}

/// The most lanes a room may have.
pub(crate) const MAX_LANES: usize = 16;

impl LaneLoads {
    /// From each lane's weight and whether anyone waits in it, in lane
    /// order; lanes past [`MAX_LANES`] are not counted.
    pub(crate) fn new(lanes: impl IntoIterator<Item = (u32, bool)>) -> Self {
        let mut loads = Self::default();
        for (i, (weight, waiting)) in lanes.into_iter().take(MAX_LANES).enumerate() {
            loads.weight[i] = weight;
            loads.waiting[i] = waiting;
            loads.len = i as u8 + 1;
        }
        loads
    }

    /// The part of the room's admissions `lane` can expect now
    /// ([`lane_share`]); 1 for a room without lanes.
    pub(crate) fn share(&self, lane: u8) -> f64 {
        let (len, lane) = (usize::from(self.len), usize::from(lane));
        if len <= 1 || lane >= len {
            return 1.0;
        }
        // The sum `lane_share` takes, without building its slice: every
        // waiting stream's status asks this on every count.
        let busy: u64 = (0..len)
            .filter(|&i| self.waiting[i] || i == lane)
            .map(|i| u64::from(self.weight[i].max(1)))
            .sum();
        f64::from(self.weight[lane].max(1)) / busy as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes(spec: &[(u32, u64, bool)]) -> Vec<LaneLoad> {
        spec.iter()
            .map(|&(weight, admitted, waiting)| LaneLoad {
                weight,
                admitted,
                waiting,
            })
            .collect()
    }

    #[test]
    fn capacity_is_shared_by_weight() {
        assert_eq!(shares(&[30, 70], 10), vec![3, 7]);
        assert_eq!(shares(&[30, 70], 100), vec![30, 70]);
        assert_eq!(shares(&[1, 1, 2], 8), vec![2, 2, 4]);
        assert_eq!(shares(&[5], 7), vec![7]);
        // Ties go to the lane listed first.
        assert_eq!(shares(&[1, 1], 1), vec![1, 0]);
    }

    #[test]
    fn a_lane_with_nobody_waiting_lends_its_share() {
        // Members (30) have nobody: general takes every permit.
        let l = lanes(&[(30, 0, false), (70, 9, true)]);
        assert_eq!(next_lane(&l), Some(1));
        // Members come back: freed permits go to them until they hold 3.
        let l = lanes(&[(30, 0, true), (70, 9, true)]);
        assert_eq!(next_lane(&l), Some(0));
        let l = lanes(&[(30, 2, true), (70, 7, true)]);
        assert_eq!(next_lane(&l), Some(0));
        let l = lanes(&[(30, 3, true), (70, 6, true)]);
        assert_eq!(next_lane(&l), Some(1));
        assert_eq!(next_lane(&lanes(&[(30, 3, false), (70, 6, false)])), None);
    }

    #[test]
    fn a_lane_expects_its_share_of_the_admissions() {
        let l = lanes(&[(30, 0, true), (70, 0, true)]);
        assert!((lane_share(&l, 0) - 0.3).abs() < 1e-9);
        // Nobody waits in general: members expect every admission.
        let l = lanes(&[(30, 0, true), (70, 0, false)]);
        assert!((lane_share(&l, 0) - 1.0).abs() < 1e-9);
        assert!((lane_share(&lanes(&[(5, 0, false)]), 0) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_ticket_status_sees_its_lanes_share() {
        let loads = LaneLoads::new([(30, true), (70, true)]);
        assert!((loads.share(0) - 0.3).abs() < 1e-9);
        assert!((loads.share(1) - 0.7).abs() < 1e-9);
        let loads = LaneLoads::new([(30, true), (70, false)]);
        assert!((loads.share(0) - 1.0).abs() < 1e-9);
        assert!((LaneLoads::default().share(0) - 1.0).abs() < 1e-9);
        assert!((LaneLoads::new([(5, true)]).share(0) - 1.0).abs() < 1e-9);
        // The same as the rule's own `lane_share`, whatever waits.
        let weights = [3, 1, 7];
        for mask in 0..8u8 {
            let waiting = |i: usize| mask & (1 << i) != 0;
            let loads = LaneLoads::new((0..3).map(|i| (weights[i], waiting(i))));
            let slice: Vec<LaneLoad> = (0..3)
                .map(|i| LaneLoad {
                    weight: weights[i],
                    admitted: 0,
                    waiting: waiting(i),
                })
                .collect();
            for lane in 0..3 {
                let (a, b) = (loads.share(lane as u8), lane_share(&slice, lane));
                assert!((a - b).abs() < 1e-12, "mask {mask} lane {lane}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn the_order_to_try_covers_every_waiting_lane() {
        let l = lanes(&[(1, 5, true), (1, 0, false), (2, 1, true)]);
        assert_eq!(lane_order(&l), vec![2, 0]);
    }
}
