//! Which pages each room shows, on this instance.
//!
//! The instance's set (its `templates_dir`, or the built-in pages) is
//! loaded at start; so is the set of every room of the config file that
//! names its own `templates_dir`, and a failure of any stops the start.
//! An operator's `PUT` or `PATCH` loads and checks a room's directory
//! before the change is stored ([`PageBook::prepare`]), and installs it
//! once it is; patching the same directory again reloads it, which is how
//! edited files go live without a restart.
//!
//! Rooms are shared by instances (Redis), so a room's directory may be set
//! on another instance: the monitor's samples of every room reach
//! [`PageBook::observe`] each second, which loads a directory it has not
//! seen. A directory that fails there (the file differs on this machine)
//! is logged and the room shows the instance's pages: a visitor never
//! meets a broken page.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::http::StatusCode;
use axum::response::Response;

use super::templates::{PageError, PageTemplates};
use super::{Page, Visit, context, html};
use crate::backend::RoomSnapshot;
use crate::config::Config;
use crate::engine::RoomId;
use crate::http::i18n::Languages;

/// The pages of one template directory (or of the instance): its
/// templates and the languages it speaks.
#[derive(Debug)]
pub(crate) struct PageSet {
    pub templates: Arc<PageTemplates>,
    pub languages: Arc<Languages>,
}

impl PageSet {
    fn builtin() -> Arc<PageSet> {
        Arc::new(PageSet {
            templates: PageTemplates::builtin(),
            languages: Languages::builtin(),
        })
    }

    /// Loads a set: template directories first one first, message
    /// directories likewise; everything is checked before it is returned.
    pub(crate) fn load(templates: &[&Path], messages: &[&Path]) -> Result<PageSet, PageError> {
        let languages = Arc::new(Languages::load(messages)?);
        let templates = Arc::new(PageTemplates::load(templates, &languages)?);
        Ok(PageSet {
            templates,
            languages,
        })
    }

    /// Renders a page; a template that fails anyway (a check cannot
    /// foresee every value) is logged and the built-in page is shown.
    pub(crate) fn render(&self, status: StatusCode, visit: &Visit, page: &Page) -> Response {
        let ctx = context(visit, page, &self.languages);
        let kind = page.kind();
        match self.templates.render(kind, &ctx) {
            Ok(body) => html(status, body),
            Err(e) => {
                let e = self.templates.describe(&e);
                tracing::error!(error = %e, page = kind.name(), "rendering a page failed; showing the built-in page");
                match PageTemplates::builtin().render(kind, &ctx) {
                    Ok(body) => html(status, body),
                    Err(e) => {
                        tracing::error!(error = %e, "rendering a built-in page failed");
                        html(StatusCode::INTERNAL_SERVER_ERROR, String::new())
                    }
                }
            }
        }
    }
}

struct RoomPages {
    dir: Option<String>,
    set: Arc<PageSet>,
}

/// Every room's pages on this instance; see the module doc.
pub struct PageBook {
    instance_dir: Option<String>,
    messages_dir: Option<String>,
    instance: Arc<PageSet>,
    rooms: RwLock<HashMap<RoomId, RoomPages>>,
}

impl std::fmt::Debug for PageBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageBook")
            .field("instance_dir", &self.instance_dir)
            .finish_non_exhaustive()
    }
}

impl Default for PageBook {
    /// The built-in pages for every room.
    fn default() -> Self {
        Self {
            instance_dir: None,
            messages_dir: None,
            instance: PageSet::builtin(),
            rooms: RwLock::default(),
        }
    }
}

impl PageBook {
    /// The instance's pages and those of every configured room, each
    /// checked; the first failure is the error.
    pub fn load(config: &Config) -> Result<Self, PageError> {
        let instance_dir = config
            .templates_dir
            .as_ref()
            .map(|p| p.display().to_string());
        let mut book = Self {
            instance_dir,
            messages_dir: config
                .messages_dir
                .as_ref()
                .map(|p| p.display().to_string()),
            ..Self::default()
        };
        if book.instance_dir.is_some() || book.messages_dir.is_some() {
            book.instance = book.load_set(None)?;
        }
        for room in &config.rooms {
            if let Some(dir) = &room.templates_dir {
                let set = book.prepare(Some(dir))?;
                book.install(&room.id, Some(dir), set);
            }
        }
        Ok(book)
    }

    /// The layers for a room directory: it, then the instance's; for
    /// messages, each one's `messages/` (when there is one), then
    /// `messages_dir`.
    fn load_set(&self, room_dir: Option<&str>) -> Result<Arc<PageSet>, PageError> {
        let templates: Vec<PathBuf> = [room_dir, self.instance_dir.as_deref()]
            .into_iter()
            .flatten()
            .map(PathBuf::from)
            .collect();
        let mut messages: Vec<PathBuf> = Vec::new();
        for dir in templates.iter().map(|dir| dir.join("messages")) {
            // A link would let the directory's writer point the message
            // files anywhere on the server.
            if super::files::is_symlink(&dir) {
                return Err(PageError::new(
                    "messages",
                    None,
                    super::files::symlink_reason(),
                ));
            }
            if dir.is_dir() {
                messages.push(dir);
            }
        }
        messages.extend(self.messages_dir.as_deref().map(PathBuf::from));
        let templates: Vec<&Path> = templates.iter().map(PathBuf::as_path).collect();
        let messages: Vec<&Path> = messages.iter().map(PathBuf::as_path).collect();
        Ok(Arc::new(PageSet::load(&templates, &messages)?))
    }

    /// Loads and checks a room's directory (`None`: the instance's pages),
    /// for an operator's change that is about to be stored.
    pub(crate) fn prepare(&self, dir: Option<&str>) -> Result<Arc<PageSet>, PageError> {
        match dir {
            None => Ok(self.instance.clone()),
            Some(dir) => self.load_set(Some(dir)),
        }
    }

    /// Puts a prepared set in use for a room.
    pub(crate) fn install(&self, room: &RoomId, dir: Option<&str>, set: Arc<PageSet>) {
        let mut rooms = self.rooms.write().unwrap_or_else(|e| e.into_inner());
        rooms.insert(
            room.clone(),
            RoomPages {
                dir: dir.map(str::to_owned),
                set,
            },
        );
    }

    /// Follows a room's settings as stored: loads a directory not seen
    /// here yet (set on another instance).
    pub(crate) fn observe(&self, s: &RoomSnapshot) {
        let id = &s.settings.id;
        let dir = s.settings.templates_dir.as_deref();
        {
            let rooms = self.rooms.read().unwrap_or_else(|e| e.into_inner());
            match rooms.get(id) {
                Some(known) if known.dir.as_deref() == dir => return,
                None if dir.is_none() => return,
                _ => {}
            }
        }
        let set = match self.prepare(dir) {
            Ok(set) => set,
            Err(e) => {
                tracing::error!(room = %id, error = %e, "the room's templates_dir cannot be used on this instance; showing the instance's pages");
                self.instance.clone()
            }
        };
        self.install(id, dir, set);
    }

    /// The pages a room shows: its own, or the instance's.
    pub(crate) fn for_room(&self, room: &str) -> Arc<PageSet> {
        let rooms = self.rooms.read().unwrap_or_else(|e| e.into_inner());
        RoomId::new(room)
            .ok()
            .and_then(|id| rooms.get(&id).map(|r| r.set.clone()))
            .unwrap_or_else(|| self.instance.clone())
    }

    /// Renders a page of the visit's room.
    pub(crate) fn render(&self, status: StatusCode, visit: &Visit, page: &Page) -> Response {
        self.for_room(&visit.room).render(status, visit, page)
    }
}
