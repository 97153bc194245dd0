//! A set of page templates: the built-in ones, overlaid by the files of an
//! operator's template directories, parsed and checked once.
//!
//! Why minijinja and not the askama the dashboard uses: askama compiles
//! templates into the binary, and the point here is that an operator
//! changes the pages without a rebuild. minijinja is maintained, has no
//! dependencies of its own, auto-escapes, and can both list the variables
//! a template uses and refuse undefined ones while rendering, which is
//! what makes a broken template a start-up error rather than a visitor's.
//!
//! Every `.html` file of a directory (and its subdirectories, named like
//! `partials/header.html`) is read into memory when the set is loaded;
//! nothing is read from disk while serving, so a file edited later cannot
//! reach visitors unchecked. A file a directory lacks comes from the next
//! layer: a room's directory, then the instance's, then the built-in
//! pages. [`check`](super::check) then proves the set before it is used.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use minijinja::{AutoEscape, Environment, Output, State, UndefinedBehavior, Value};

use super::{PageKind, files};
use crate::http::i18n::Languages;

/// The built-in pages, compiled in: the default and the worked example
/// (`templates/pages/` in the repository).
pub(crate) const BUILTIN: [(&str, &str); 5] = [
    (
        "base.html",
        include_str!("../../../templates/pages/base.html"),
    ),
    (
        "queue.html",
        include_str!("../../../templates/pages/queue.html"),
    ),
    (
        "admitted.html",
        include_str!("../../../templates/pages/admitted.html"),
    ),
    (
        "closed.html",
        include_str!("../../../templates/pages/closed.html"),
    ),
    (
        "error.html",
        include_str!("../../../templates/pages/error.html"),
    ),
];

/// Bounds on what a template directory may hold, so a wrong path (a home
/// directory, `/`) is refused quickly instead of being read whole.
const MAX_FILES: usize = 200;
const MAX_FILE_BYTES: u64 = 512 * 1024;
const MAX_DEPTH: usize = 4;
/// Entries (files and directories) looked at in all, whatever they are.
const MAX_ENTRIES: usize = 2_000;

/// Why a template set was refused: the file, the line when known, and
/// what is wrong, in words an operator can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageError {
    /// The file relative to its directory (`.` for the directory itself),
    /// never the server's absolute path; `built-in <name>` for a
    /// compiled-in page.
    pub file: String,
    pub line: Option<usize>,
    pub reason: String,
}

impl PageError {
    pub(crate) fn new(
        file: impl Into<String>,
        line: Option<usize>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            file: file.into(),
            line,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for PageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file, self.reason),
            None => write!(f, "{}: {}", self.file, self.reason),
        }
    }
}

impl std::error::Error for PageError {}

/// One template of a set and where it came from.
#[derive(Clone, Debug)]
pub(super) struct Source {
    pub name: String,
    /// The file's path relative to its directory; `None` for a built-in
    /// page.
    pub path: Option<String>,
    pub text: Arc<str>,
}

impl Source {
    /// How errors name this template.
    pub(crate) fn shown(&self) -> String {
        match &self.path {
            Some(p) => p.clone(),
            None => format!("built-in {}", self.name),
        }
    }
}

/// Parsed, checked templates, ready to render.
pub(crate) struct PageTemplates {
    env: Environment<'static>,
    sources: Vec<Source>,
}

impl fmt::Debug for PageTemplates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.sources.iter().map(Source::shown).collect();
        f.debug_struct("PageTemplates")
            .field("sources", &names)
            .finish()
    }
}

/// The built-in set, parsed once. Its check is a unit test.
static BUILTIN_SET: LazyLock<Arc<PageTemplates>> = LazyLock::new(|| {
    Arc::new(PageTemplates::parse(builtin_sources()).expect("the built-in pages parse"))
});

fn builtin_sources() -> Vec<Source> {
    BUILTIN
        .iter()
        .map(|(name, text)| Source {
            name: (*name).to_owned(),
            path: None,
            text: Arc::from(*text),
        })
        .collect()
}

impl PageTemplates {
    /// The compiled-in pages.
    pub(crate) fn builtin() -> Arc<PageTemplates> {
        BUILTIN_SET.clone()
    }

    /// Loads the layers, first one first (a room's directory, then the
    /// instance's), over the built-in pages, and checks the result in
    /// every language of `languages`.
    pub(crate) fn load(
        layers: &[&Path],
        languages: &Languages,
    ) -> Result<PageTemplates, PageError> {
        let mut sources: Vec<Source> = Vec::new();
        for dir in layers {
            for source in read_dir(dir)? {
                if !sources.iter().any(|s| s.name == source.name) {
                    sources.push(source);
                }
            }
        }
        for source in builtin_sources() {
            if !sources.iter().any(|s| s.name == source.name) {
                sources.push(source);
            }
        }
        let set = PageTemplates::parse(sources)?;
        super::check::check(&set, languages)?;
        Ok(set)
    }

    fn parse(sources: Vec<Source>) -> Result<PageTemplates, PageError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_auto_escape_callback(|_| AutoEscape::Html);
        env.set_formatter(format_value);
        // Templates are trusted operator files, but a loop gone wrong
        // should end a render, not hold a worker thread.
        env.set_fuel(Some(FUEL));
        for s in &sources {
            env.add_template_owned(s.name.clone(), s.text.to_string())
                .map_err(|e| error_in(&sources, &e))?;
        }
        Ok(PageTemplates { env, sources })
    }

    pub(super) fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// Renders one page with its context.
    pub(crate) fn render(
        &self,
        kind: PageKind,
        context: &Value,
    ) -> Result<String, minijinja::Error> {
        self.env.get_template(kind.file())?.render(context)
    }

    /// Renders a named template (the check renders partials too).
    pub(super) fn render_named(
        &self,
        name: &str,
        context: &Value,
    ) -> Result<String, minijinja::Error> {
        self.env.get_template(name)?.render(context)
    }

    pub(super) fn undeclared(&self, name: &str) -> Vec<String> {
        let mut vars: Vec<String> = self
            .env
            .get_template(name)
            .map(|t| t.undeclared_variables(true).into_iter().collect())
            .unwrap_or_default();
        vars.sort();
        vars
    }

    /// The error of a render, as an operator reads it: the template and
    /// line where it happened.
    pub(crate) fn describe(&self, e: &minijinja::Error) -> PageError {
        error_in(&self.sources, e)
    }
}

/// Instructions one render may spend: the built-in queue page uses a few
/// hundred.
const FUEL: u64 = 200_000;

/// Prints a value: `none` as nothing (rather than the word "none"), and
/// HTML-escaped unless marked safe. Escapes the five characters that
/// matter in text and quoted attributes, and leaves `/` alone so paths
/// read as paths in the page source.
fn format_value(
    out: &mut Output,
    state: &mut State,
    value: &Value,
) -> Result<(), minijinja::Error> {
    if value.is_none() {
        return Ok(());
    }
    if value.is_safe() || matches!(state.auto_escape(), AutoEscape::None) {
        return write!(out, "{value}").map_err(Into::into);
    }
    let text = value.to_string();
    let mut last = 0;
    for (i, c) in text.char_indices() {
        let entity = match c {
            '&' => "&amp;",
            '<' => "&lt;",
            '>' => "&gt;",
            '"' => "&quot;",
            '\'' => "&#39;",
            _ => continue,
        };
        out.write_str(&text[last..i])?;
        out.write_str(entity)?;
        last = i + 1;
    }
    out.write_str(&text[last..]).map_err(Into::into)
}

/// A minijinja error, located in the file it happened in.
fn error_in(sources: &[Source], e: &minijinja::Error) -> PageError {
    let file = e
        .name()
        .map(|name| {
            sources
                .iter()
                .find(|s| s.name == name)
                .map_or_else(|| name.to_owned(), Source::shown)
        })
        .unwrap_or_else(|| "templates".to_owned());
    let reason = match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    };
    PageError::new(file, e.line(), reason)
}

/// Every `.html` file under `dir`, named by its path relative to it with
/// `/` separators. A `messages` directory is left to the message files.
/// Errors name files relative to `dir` (the directory itself is `.`), and
/// a symbolic link among the templates or the subdirectories is refused
/// rather than followed (see [`files`]).
fn read_dir(dir: &Path) -> Result<Vec<Source>, PageError> {
    let meta = std::fs::metadata(dir).map_err(|e| {
        PageError::new(
            ".",
            None,
            format!("cannot read the directory: {}", files::io_reason(&e)),
        )
    })?;
    if !meta.is_dir() {
        return Err(PageError::new(".", None, "is not a directory"));
    }
    let mut out = Vec::new();
    let mut seen = 0usize;
    let mut pending = vec![(dir.to_path_buf(), String::new(), 0usize)];
    while let Some((path, prefix, depth)) = pending.pop() {
        let shown_dir = if prefix.is_empty() {
            "."
        } else {
            prefix.trim_end_matches('/')
        };
        let entries = std::fs::read_dir(&path).map_err(|e| {
            PageError::new(
                shown_dir,
                None,
                format!("cannot read the directory: {}", files::io_reason(&e)),
            )
        })?;
        let mut entries: Vec<_> = entries
            .filter_map(Result::ok)
            .take(MAX_ENTRIES + 1)
            .collect();
        seen += entries.len();
        if seen > MAX_ENTRIES {
            return Err(PageError::new(
                ".",
                None,
                format!("holds more than {MAX_ENTRIES} files; is it the right directory?"),
            ));
        }
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for entry in entries {
            let file = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let shown_file = format!("{prefix}{name}");
            // The entry's own type: a symbolic link is not followed here.
            let kind = entry.file_type().map_err(|e| {
                PageError::new(
                    &shown_file,
                    None,
                    format!("cannot read: {}", files::io_reason(&e)),
                )
            })?;
            let skipped = depth == 0 && name == "messages" || name.starts_with('.');
            if kind.is_symlink() && !skipped && (name.ends_with(".html") || file.is_dir()) {
                return Err(PageError::new(shown_file, None, files::symlink_reason()));
            }
            if kind.is_dir() {
                if skipped {
                    continue;
                }
                if depth + 1 >= MAX_DEPTH {
                    return Err(PageError::new(
                        shown_file,
                        None,
                        format!("templates nest at most {MAX_DEPTH} directories deep"),
                    ));
                }
                pending.push((file, format!("{shown_file}/"), depth + 1));
                continue;
            }
            if !name.ends_with(".html") {
                continue;
            }
            if out.len() == MAX_FILES {
                return Err(PageError::new(
                    ".",
                    None,
                    format!("holds more than {MAX_FILES} templates; is it the right directory?"),
                ));
            }
            let text = files::read_text(&file, &shown_file, MAX_FILE_BYTES)?;
            out.push(Source {
                name: shown_file.clone(),
                path: Some(shown_file),
                text: Arc::from(text),
            });
        }
    }
    Ok(out)
}
