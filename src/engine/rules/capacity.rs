//! Where permits go when an operator changes a room's capacity.
//!
//! Raising capacity first cancels debt (permits still owed from an earlier
//! decrease), then adds to the worker's hand. Lowering it takes permits
//! from the worker's hand, then from the tray; whatever is still out with
//! admitted visitors becomes debt, which the next finishers pay instead of
//! handing their permit on. Nobody is revoked, and nobody new is admitted
//! until the admitted count is below the new capacity.
//!
//! The rule is a [`Transfer`]: an amount taken from counters in a given
//! order, the rest added to another. Each store applies it as one atomic
//! step on the counters it keeps.

/// The permit counters a room keeps besides its admitted visitors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counter {
    /// Permits in the worker's hand.
    Hand,
    /// Permits given back while nobody waited.
    Tray,
    /// Permits owed after a capacity decrease.
    Debt,
}

impl Counter {}

/// Where permits come from and go to: take from each of `take_from` in
/// turn, add what could not be taken to `rest_to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub take_from: &'static [Counter],
    pub rest_to: Counter,
}

/// Raising capacity by some amount.
pub(crate) const GROW: Plan = Plan {
    take_from: &[Counter::Debt],
    rest_to: Counter::Hand,
};

/// Lowering capacity by some amount.
pub(crate) const SHRINK: Plan = Plan {
    take_from: &[Counter::Hand, Counter::Tray],
    rest_to: Counter::Debt,
};

/// A plan and how many permits it moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Transfer {
    pub amount: u64,
    pub plan: Plan,
}

/// The transfer that moves a room from capacity `old` to `new`.
pub(crate) fn resize(old: u32, new: u32) -> Transfer {
    if new >= old {
        Transfer {
            amount: u64::from(new - old),
            plan: GROW,
        }
    } else {
        Transfer {
            amount: u64::from(old - new),
            plan: SHRINK,
        }
    }
}

impl Transfer {
    /// The transfer on plain numbers (`hand`, `tray`, `debt`), for tests and
    /// for stores that hold all three under one lock.
    #[cfg(test)]
    pub(crate) fn apply(&self, counters: &mut [u64; 3]) {
        let mut left = self.amount;
        for c in self.plan.take_from {
            let have = &mut counters[*c as usize];
            let take = (*have).min(left);
            *have -= take;
            left -= take;
        }
        counters[self.plan.rest_to as usize] += left;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_takes_hand_then_tray_then_owes() {
        let mut c = [1, 1, 0]; // hand, tray, debt
        resize(5, 1).apply(&mut c);
        assert_eq!(c, [0, 0, 2]);
        // Up again: the debt is cancelled first, the rest goes to the hand.
        resize(1, 4).apply(&mut c);
        assert_eq!(c, [1, 0, 0]);
        resize(4, 4).apply(&mut c);
        assert_eq!(c, [1, 0, 0]);
    }
}
