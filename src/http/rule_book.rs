//! Every room's traffic rules on this instance, compiled, with their
//! match counters: what the gate asks on each check; and the site's
//! routes, for the gate without a room.
//!
//! Fed like the access book: from the settings of every room at start,
//! from the monitor's samples each second (so a change made on another
//! instance applies here within about a second) and at once from
//! operators' changes on this instance. Only rooms with rules are kept,
//! and while no room has any the gate pays one atomic load for asking.
//!
//! A rule's `network_file` is read here, when a room's rules are first
//! compiled, and watched ([`watch_files`]): a file whose size or time of
//! change moved is read again within [`FILE_POLL`], every file at once on
//! `SIGHUP`, and the rooms that use it are compiled anew. A file that no
//! longer reads keeps the list read before, with an error logged naming
//! the file and line.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use ipnet::IpNet;
use prometheus_client::metrics::counter::Counter;
use serde::Serialize;

use super::shadow::ShadowBook;
use crate::engine::{RoomId, RoomSettings};
use crate::metrics::Metrics;
use crate::routes::RouteTable;
use crate::rules::{Action, RequestView, Rule, RuleSet};

/// One room's rules, ready for the gate.
#[derive(Debug)]
pub(crate) struct RoomRules {
    /// As written, to tell a change from a repeat.
    source: Vec<Rule>,
    pub set: RuleSet,
    /// One per rule: `narabu_rule_matches_total{room,rule,action}`.
    pub matches: Vec<Counter>,
}

impl RoomRules {
    /// What the first rule that matches says of a request, counted as
    /// one of its matches; `None` when none matches.
    pub(crate) fn judge(&self, request: &RequestView<'_>) -> Option<Action> {
        let (index, action) = self.set.first_match(request)?;
        self.matches[index].inc();
        Some(action)
    }
}

/// How long a changed network file may go unnoticed.
pub(crate) const FILE_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// A network file as last read well.
#[derive(Debug)]
struct NetworkFile {
    networks: Arc<[IpNet]>,
    /// What its metadata said when it was read.
    stamp: Option<Stamp>,
}

/// A file's size and time of last change: either moving is a change (a
/// copy of the same size within one clock tick aside, which `SIGHUP`
/// catches).
type Stamp = (std::time::SystemTime, u64);

fn stamp(path: &str) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Watches the rules' network files until `stop`: every [`FILE_POLL`]
/// for a change, and on `SIGHUP` every file read again.
pub(crate) fn watch_files(book: Arc<RuleBook>, stop: tokio_util::sync::CancellationToken) {
    // Listened for before this returns: a `SIGHUP` from then on never
    // takes its default course (ending the process).
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| tracing::warn!(error = %e, "SIGHUP cannot be listened for; network files are still watched"))
        .ok();
    tokio::spawn(async move {
        loop {
            #[cfg(unix)]
            let hung_up = async {
                match hangup.as_mut() {
                    Some(h) => {
                        h.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let hung_up = std::future::pending::<()>();
            let every = tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(FILE_POLL) => false,
                () = hung_up => {
                    tracing::info!("SIGHUP: reading every network file again");
                    true
                }
            };
            let book = book.clone();
            // Reading files is blocking work.
            let _ = tokio::task::spawn_blocking(move || book.reload_files(every)).await;
        }
    });
}

/// A rule and how often it has matched on this instance, for the admin
/// room view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct RuleCount {
    /// The rule's name, or its index.
    pub rule: String,
    pub action: Action,
    /// Requests it decided on this instance since it started.
    pub matches: u64,
}

#[derive(Debug)]
pub(crate) struct RuleBook {
    metrics: Arc<Metrics>,
    rooms: RwLock<HashMap<RoomId, Arc<RoomRules>>>,
    /// Rooms with rules; while 0 the map is never read.
    with_rules: AtomicUsize,
    /// The network files the rules name, as last read well.
    files: RwLock<HashMap<String, NetworkFile>>,
    /// What this instance remembers of the shadow line's joins.
    pub shadow: ShadowBook,
}

impl RuleBook {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            rooms: RwLock::default(),
            with_rules: AtomicUsize::new(0),
            files: RwLock::default(),
            shadow: ShadowBook::default(),
        }
    }

    /// Takes a room's current rules.
    pub(crate) fn observe(&self, s: &RoomSettings) {
        {
            let rooms = self.rooms.read().unwrap_or_else(|e| e.into_inner());
            match rooms.get(&s.id) {
                Some(known) if known.source == s.rules => return,
                None if s.rules.is_empty() => return,
                _ => {}
            }
        }
        // Compiled under the lock, as the watcher compiles: a file read
        // again meanwhile cannot leave this room with the list before.
        let mut rooms = self.rooms.write().unwrap_or_else(|e| e.into_inner());
        match self.compile(&s.id, &s.rules) {
            Some(rules) => rooms.insert(s.id.clone(), rules),
            None => rooms.remove(&s.id),
        };
        self.with_rules.store(rooms.len(), Ordering::Relaxed);
    }

    /// A room's rules compiled, with their files' networks as last read.
    fn compile(&self, room: &RoomId, rules: &[Rule]) -> Option<Arc<RoomRules>> {
        if rules.is_empty() {
            None
        } else {
            match RuleSet::compile_with(rules, |path| self.networks_of(path)) {
                Some(set) => Some(Arc::new(RoomRules {
                    matches: rules
                        .iter()
                        .enumerate()
                        .map(|(i, r)| {
                            self.metrics
                                .rule_matches(room.as_str(), &r.label(i), r.action.as_str())
                        })
                        .collect(),
                    source: rules.to_vec(),
                    set,
                })),
                None => {
                    // Rules are checked before they are stored; ones
                    // that no longer pass (written by a later version)
                    // are better ignored than half applied.
                    tracing::error!(room = %room, "the room's rules cannot be used on this instance; ignoring them");
                    None
                }
            }
        }
    }

    /// A network file's list, read now if it was not before. One that
    /// does not read (checked at start and on every change on this
    /// instance, so missing from this instance's disk) adds no network.
    fn networks_of(&self, path: &str) -> Option<Arc<[IpNet]>> {
        if let Some(file) = self
            .files
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
        {
            return Some(file.networks.clone());
        }
        let stamp = stamp(path);
        let read = crate::rules::read_networks(path);
        let networks: Arc<[IpNet]> = match &read {
            Ok(nets) => {
                tracing::info!(file = path, networks = nets.len(), "network file read");
                nets.as_slice().into()
            }
            // Watched all the same: read once it changes.
            Err(e) => {
                tracing::error!(error = %e, "a rule's network file does not read; its rule matches no client by it");
                Arc::new([])
            }
        };
        self.files
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                path.to_owned(),
                NetworkFile {
                    networks: networks.clone(),
                    stamp,
                },
            );
        read.is_ok().then_some(networks)
    }

    /// Reads again the network files that changed (`every`: all of them),
    /// and compiles anew the rooms whose rules name one that read well.
    pub(crate) fn reload_files(&self, every: bool) {
        {
            // A file no room's rules name any more is let go. Under the
            // rooms' lock, which a room's rules are compiled under (their
            // files read): none is between its file read and its place.
            let rooms = self.rooms.read().unwrap_or_else(|e| e.into_inner());
            let named: std::collections::HashSet<&str> = rooms
                .values()
                .flat_map(|r| {
                    r.source
                        .iter()
                        .filter_map(|rule| rule.network_file.as_deref())
                })
                .collect();
            self.files
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|path, _| named.contains(path.as_str()));
        }
        let known: Vec<(String, Option<Stamp>)> = self
            .files
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(path, f)| (path.clone(), f.stamp))
            .collect();
        let mut changed = Vec::new();
        for (path, was) in known {
            let now = stamp(&path);
            if !every && now == was {
                continue;
            }
            match crate::rules::read_networks(&path) {
                Ok(nets) => {
                    tracing::info!(file = %path, networks = nets.len(), "network file read again");
                    self.files
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(
                            path.clone(),
                            NetworkFile {
                                networks: nets.into(),
                                stamp: now,
                            },
                        );
                    changed.push(path);
                }
                Err(e) => {
                    tracing::error!(error = %e, "a network file does not read; keeping the list read before");
                    // Not again until it changes once more.
                    if let Some(f) = self
                        .files
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_mut(&path)
                    {
                        f.stamp = now;
                    }
                }
            }
        }
        if changed.is_empty() {
            return;
        }
        let mut rooms = self.rooms.write().unwrap_or_else(|e| e.into_inner());
        let using: Vec<RoomId> = rooms
            .iter()
            .filter(|(_, r)| {
                r.source.iter().any(|rule| {
                    rule.network_file
                        .as_ref()
                        .is_some_and(|f| changed.contains(f))
                })
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in using {
            let Some(old) = rooms.get(&id) else { continue };
            let source = old.source.clone();
            if let Some(fresh) = self.compile(&id, &source) {
                rooms.insert(id, fresh);
            }
        }
    }

    /// A room's rules; `None` for a room without any.
    pub(crate) fn for_room(&self, room: &RoomId) -> Option<Arc<RoomRules>> {
        if self.with_rules.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let rooms = self.rooms.read().unwrap_or_else(|e| e.into_inner());
        rooms.get(room).cloned()
    }

    /// A room's rules with their counts, in order.
    pub(crate) fn counts(&self, room: &RoomId) -> Vec<RuleCount> {
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
pub(crate) struct RouteBook {
    table: RwLock<Arc<RouteTable<RoomId>>>,
}

impl RouteBook {
    /// Takes every room's routes. A conflict (two instances given
    /// clashing rooms at once) keeps the table as it was.
    pub(crate) fn rebuild<'a>(&self, rooms: impl IntoIterator<Item = &'a RoomSettings>) {
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
    pub(crate) fn pick(&self, headers: &axum::http::HeaderMap) -> Option<RoomId> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        if table.is_empty() {
            return None;
        }
        let view = crate::rules::RequestView::from_proxy(headers, None);
        table.pick(view.host, view.path.unwrap_or("/")).cloned()
    }
}
