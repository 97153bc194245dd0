//! How a room queues right now, and the stock it has left to sell.
//!
//! A room's [`Mode`] is an operator's live choice, beside capacity and
//! pause: `queue` (the fair line), `passthrough` (everyone is admitted at
//! once but still counted, so switching back to `queue` admits nobody new
//! until the admitted count is below capacity), `maintenance` (everyone
//! waits, nobody is admitted, the page says why) and `sold_out` (the room
//! closes for that reason: live tickets are told `closed`, nobody joins).
//!
//! Admitting past capacity in `passthrough` borrows permits the way a
//! capacity decrease does: each admission beyond the worker's hand adds one
//! to the room's debt, which finishers and the worker pay back before any
//! permit is handed on. So `held + tray + admitted == capacity + debt`
//! holds in every mode, and the capacity invariant resumes by itself when
//! the room queues again.
//!
//! A room may also know its `stock`: units left to sell. Purchases the
//! origin reports are taken off it, never below zero ([`take_stock`]), and
//! the report that takes the last unit turns the room `sold_out`, once:
//! the engine takes a report in one atomic step under its worker lock (on
//! Redis, on the room's owner), so of reports racing on several instances
//! exactly one sees the room turn.

use serde::{Deserialize, Serialize};

/// How a room treats its visitors now.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The fair line: admission by the permits, in ticket order.
    #[default]
    Queue,
    /// Everyone is admitted at once, still counted.
    Passthrough,
    /// Everyone waits; nobody is admitted.
    Maintenance,
    /// The sale is over: the room closes with this reason.
    SoldOut,
}

impl Mode {
    /// Every mode, in the order operators see them.
    pub const ALL: [Mode; 4] = [
        Self::Queue,
        Self::Passthrough,
        Self::Maintenance,
        Self::SoldOut,
    ];

    /// The name in the config, the admin API, the status JSON and stores.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::Passthrough => "passthrough",
            Self::Maintenance => "maintenance",
            Self::SoldOut => "sold_out",
        }
    }

    #[cfg(test)]
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The number a store keeps the mode as (the engine's atomic, the
    /// metrics gauge).
    pub(crate) const fn code(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(usize::from(code)).copied()
    }

    /// Whether anyone is admitted in this mode.
    pub const fn admits(self) -> bool {
        matches!(self, Self::Queue | Self::Passthrough)
    }

    /// Whether everyone in line is admitted at once, past the permits.
    pub const fn admits_everyone(self) -> bool {
        matches!(self, Self::Passthrough)
    }

    /// Whether the room is closed in this mode: live tickets are told
    /// `closed` and no ticket is issued.
    pub const fn closes(self) -> bool {
        matches!(self, Self::SoldOut)
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The most units a room may have for sale (a typo's guard, and far from
/// any overflow in a store's arithmetic).
pub(crate) const STOCK_MAX: u64 = 1_000_000_000_000;

/// What a reported purchase did to a room's stock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockTaken {
    /// Units left after it (never below zero).
    pub left: u64,
    /// The room's mode before and after it.
    pub before: Mode,
    pub mode: Mode,
    /// This report turned the room sold out.
    pub sold_out_now: bool,
}

/// Take `purchased` units off `stock` in a room in `mode`: what is left
/// never goes below zero, and with none left the room is sold out; the
/// report that makes it so is the one that ends the sale.
pub(crate) fn take_stock(stock: u64, mode: Mode, purchased: u64) -> StockTaken {
    let left = stock.saturating_sub(purchased);
    let after = mode_with_stock(mode, Some(left));
    StockTaken {
        left,
        before: mode,
        mode: after,
        sold_out_now: after.closes() && !mode.closes(),
    }
}

/// The mode a room is in once its stock is `stock`: none left means sold
/// out, whatever it was; otherwise unchanged (restocking does not reopen a
/// room by itself: the operator chooses the mode to reopen in).
pub(crate) fn mode_with_stock(mode: Mode, stock: Option<u64>) -> Mode {
    if stock == Some(0) {
        Mode::SoldOut
    } else {
        mode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip_and_match_serde() {
        for m in Mode::ALL {
            assert_eq!(Mode::from_name(m.name()), Some(m));
            assert_eq!(Mode::from_code(m.code()), Some(m));
            assert_eq!(
                serde_json::to_value(m).unwrap(),
                serde_json::json!(m.name())
            );
        }
        assert_eq!(Mode::from_name("fifo"), None);
        assert_eq!(Mode::default(), Mode::Queue);
    }

    #[test]
    fn what_each_mode_does() {
        let rows: Vec<_> = Mode::ALL
            .iter()
            .map(|m| (m.admits(), m.admits_everyone(), m.closes()))
            .collect();
        assert_eq!(
            rows,
            [
                (true, false, false),
                (true, true, false),
                (false, false, false),
                (false, false, true)
            ]
        );
    }

    #[test]
    fn stock_never_goes_below_zero_and_ends_the_sale_once() {
        let taken = |stock, mode, n| {
            let t = take_stock(stock, mode, n);
            (t.left, t.mode, t.sold_out_now)
        };
        assert_eq!(taken(5, Mode::Queue, 2), (3, Mode::Queue, false));
        assert_eq!(taken(3, Mode::Queue, 3), (0, Mode::SoldOut, true));
        assert_eq!(taken(2, Mode::Maintenance, 9), (0, Mode::SoldOut, true));
        // Once sold out, later reports end nothing more.
        assert_eq!(taken(0, Mode::SoldOut, 1), (0, Mode::SoldOut, false));
        // A room an operator already closed as sold out is not ended twice.
        assert_eq!(taken(1, Mode::SoldOut, 1), (0, Mode::SoldOut, false));
        assert_eq!(mode_with_stock(Mode::Queue, Some(0)), Mode::SoldOut);
        assert_eq!(
            mode_with_stock(Mode::Maintenance, Some(4)),
            Mode::Maintenance
        );
        assert_eq!(mode_with_stock(Mode::Passthrough, None), Mode::Passthrough);
    }
}
