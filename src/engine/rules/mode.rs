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
//! the report that takes the last unit turns the room `sold_out`, once.

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
    pub const fn name(self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::Passthrough => "passthrough",
            Self::Maintenance => "maintenance",
            Self::SoldOut => "sold_out",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The number a store keeps the mode as (the engine's atomic, the
    /// metrics gauge).
    pub const fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<Self> {
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
pub const STOCK_MAX: u64 = 1_000_000_000_000;

/// What a reported purchase did to a room's stock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StockTaken {
    /// Units left after it (never below zero).
    pub left: u64,
    /// This report took the last unit: the room is sold out from now on.
    /// True for exactly one report, however many race.
    pub sold_out_now: bool,
}

/// Take `purchased` units off `stock`: what is left never goes below zero,
/// and only the report that takes it from above zero to zero ends the sale.
pub fn take_stock(stock: u64, purchased: u64) -> StockTaken {
    let left = stock.saturating_sub(purchased);
    StockTaken {
        left,
        sold_out_now: stock > 0 && left == 0,
    }
}

/// The mode a room is in once its stock is `stock`: none left means sold
/// out, whatever it was; otherwise unchanged (restocking does not reopen a
/// room by itself: the operator chooses the mode to reopen in).
pub fn mode_with_stock(mode: Mode, stock: Option<u64>) -> Mode {
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
        assert_eq!(
            take_stock(5, 2),
            StockTaken {
                left: 3,
                sold_out_now: false
            }
        );
        assert_eq!(
            take_stock(3, 3),
            StockTaken {
                left: 0,
                sold_out_now: true
            }
        );
        assert_eq!(
            take_stock(2, 9),
            StockTaken {
                left: 0,
                sold_out_now: true
            }
        );
        assert_eq!(
            take_stock(0, 1),
            StockTaken {
                left: 0,
                sold_out_now: false
            }
        );
        assert_eq!(mode_with_stock(Mode::Queue, Some(0)), Mode::SoldOut);
        assert_eq!(
            mode_with_stock(Mode::Maintenance, Some(4)),
            Mode::Maintenance
        );
        assert_eq!(mode_with_stock(Mode::Passthrough, None), Mode::Passthrough);
    }
}
