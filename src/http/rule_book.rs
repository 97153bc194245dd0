//! Every room's traffic rules on this instance, compiled, with their
//! match counters: what the gate asks on each check; and the site's
//! routes, for the gate without a room.
//!
//! Fed like the access book: from the settings of every room at start,
//! from the monitor's samples each second (so a change made on another
//! instance applies here within about a second) and at once from
//! operators' changes on this instance. Only rooms with rules are kept,
//! and while no room has any the gate pays one atomic load for asking.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;

use super::shadow::ShadowBook;
use crate::engine::{RoomId, RoomSettings};
use crate::metrics::Metrics;
use crate::routes::RouteTable;
use crate::rules::{Action, RequestView, Rule, RuleSet};

/// One room's rules, ready for the gate.
#[derive(Debug)]
pub struct RoomRules {
    /// As written, to tell a change from a repeat.
    source: Vec<Rule>,
    pub set: RuleSet,
    /// One per rule: `narabu_rule_matches_total{room,rule,action}`.
    pub matches: Vec<Counter>,
}

impl RoomRules {
    /// What the first rule that matches says of a request, counted as
    /// one of its matches; `None` when none matches.
    pub fn judge(&self, request: &RequestView<'_>) -> Option<Action> {
        let (index, action) = self.set.first_match(request)?;
        self.matches[index].inc();
        Some(action)
    }
}

/// A rule and how often it has matched on this instance, for the admin
/// room view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RuleCount {
    /// The rule's name, or its index.
    pub rule: String,
    pub action: Action,
    /// Requests it decided on this instance since it started.
    pub matches: u64,
}

#[derive(Debug)]
pub struct RuleBook {
    metrics: Arc<Metrics>,
    rooms: RwLock<HashMap<RoomId, Arc<RoomRules>>>,
    /// Rooms with rules; while 0 the map is never read.
    with_rules: AtomicUsize,
    /// What this instance remembers of the shadow line's joins.
    pub shadow: ShadowBook,
}

impl RuleBook {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            rooms: RwLock::default(),
            with_rules: AtomicUsize::new(0),
            shadow: ShadowBook::default(),
        }
    }

    /// Takes a room's current rules.
    pub fn observe(&self, s: &RoomSettings) {
        {
            let rooms = self.rooms.read().unwrap_or_else(|e| e.into_inner());
            match rooms.get(&s.id) {
                Some(known) if known.source == s.rules => return,
                None if s.rules.is_empty() => return,
                _ => {}
            }
        }
        let compiled = if s.rules.is_empty() {
            None
        } else {
            match RuleSet::compile(&s.rules) {
                Some(set) => Some(Arc::new(RoomRules {
                    matches: s
                        .rules
                        .iter()
                        .enumerate()
                        .map(|(i, r)| {
                            self.metrics
                                .rule_matches(s.id.as_str(), &r.label(i), r.action.as_str())
                        })
                        .collect(),
                    source: s.rules.clone(),
                    set,
                })),
                None => {
                    // Rules are checked before they are stored; ones
                    // that no longer pass (written by a later version)
                    // are better ignored than half applied.
                    tracing::error!(room = %s.id, "the room's rules cannot be used on this instance; ignoring them");
                    None
                }
            }
        };
        let mut rooms = self.rooms.write().unwrap_or_else(|e| e.into_inner());
        match compiled {
            Some(rules) => rooms.insert(s.id.clone(), rules),
            None => rooms.remove(&s.id),
        };
        self.with_rules.store(rooms.len(), Ordering::Relaxed);
    }

    /// A room's rules; `None` for a room without any.
    pub fn for_room(&self, room: &RoomId) -> Option<Arc<RoomRules>> {
        if self.with_rules.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let rooms = self.rooms.read().unwrap_or_else(|e| e.into_inner());
        rooms.get(room).cloned()
    }

    /// A room's rules with their counts, in order.
    pub fn counts(&self, room: &RoomId) -> Vec<RuleCount> {
        let Some(rules) = self.for_room(room) else {
            return Vec::new();
        };
        rules
            .source
            .iter()
            .zip(&rules.matches)
            .enumerate()
            .map(|(i, (rule, count))| RuleCount {
                rule: rule.label(i),
                action: rule.action,
                matches: count.get(),
            })
            .collect()
    }
}

/// The site's routes (`crate::routes`): which room a check at `GET /gate`
/// without a room goes to. Rebuilt whole from every room's settings, at
/// start, on each monitor sample and on an operator's change.
#[derive(Debug, Default)]
pub struct RouteBook {
    table: RwLock<Arc<RouteTable>>,
}

impl RouteBook {
    /// Takes every room's routes. A conflict (two instances given
    /// clashing rooms at once) keeps the table as it was.
    pub fn rebuild<'a>(&self, rooms: impl IntoIterator<Item = &'a RoomSettings>) {
        match RouteTable::build(rooms.into_iter().map(|s| (&s.id, s.routes.as_slice()))) {
            Ok(table) => *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table),
            Err(c) => tracing::error!(
                first = %c.first, second = %c.second,
                "two rooms claim the same route; keeping the routes as they were"
            ),
        }
    }

    /// The room for a check at `GET /gate`, by what the proxy says the
    /// visitor asked for.
    pub fn pick(&self, headers: &axum::http::HeaderMap) -> Option<RoomId> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        if table.is_empty() {
            return None;
        }
        let view = crate::rules::RequestView::from_proxy(headers, None);
        table.pick(view.host, view.path.unwrap_or("/")).cloned()
    }
}
