//! The HTTP layer: thin handlers over the backend trait, one file per
//! audience, with every route assembled in [`router::router`].
//!
//! - `admin`, `metrics`: operators' JSON API, live stream, dashboard and
//!   the Prometheus page
//! - `api`: join, status, leave, release (visitors' apps and the origin)
//! - `access`: what a new join must show (proof of work, an enqueue token)
//!   and the challenge endpoint; `draw`: the opening draw's public record
//! - `events`: the Server-Sent Events stream a waiting page follows, and
//!   the writers (a few per-core shards) that send every stream's events
//! - `gate`: what a reverse proxy asks on every protected request, and
//!   `rule_book`: each room's traffic rules (`crate::rules`) it applies;
//!   `shadow`: the line a `shadow` rule sends visitors to, which never
//!   admits anyone and which the engine never sees;
//!   `passes`: the signed passes a proxy verifies by itself, their keys
//!   and their cookie
//! - `health`: liveness and readiness; `openapi`: this API described as
//!   an OpenAPI 3.1 document, generated from the handlers and their types
//! - `extract`: the room of the path, the visitor's ticket and operators'
//!   credentials, as extractors
//! - `ticket`, `auth`: the visitor's signed ticket and operators' tokens
//! - `origin`: whether a cookie-authenticated change comes from this site
//! - `return_path`: the open-redirect guard for `?return=`
//! - `limits`: which address a request counts against, and the coarse
//!   cap on open streams per address
//! - `presence`: the streams held per ticket (their cap) and the batched
//!   renewal of their visitors' presence
//! - `error`: the JSON error shape
//! - `edge`: request ids, log spans, HTTP metrics and the header limit,
//!   around every route
//! - `visitor`, `pages`, `i18n`, `assets`: the queue page in three
//!   languages and its embedded script and styles

pub(crate) mod access;
pub(crate) mod admin;
pub(crate) mod api;
pub(crate) mod assets;
pub(crate) mod auth;
pub mod draw;
pub(crate) mod edge;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod extract;
pub(crate) mod gate;
pub(crate) mod health;
pub(crate) mod i18n;
pub(crate) mod limits;
pub(crate) mod metrics;
pub(crate) mod notify;
pub mod openapi;
pub(crate) mod origin;
pub mod pages;
pub(crate) mod passes;
pub mod presence;
pub(crate) mod receipts;
pub(crate) mod record;
pub mod return_path;
pub mod router;
pub(crate) mod rule_book;
pub(crate) mod shadow;
pub(crate) mod state;
pub mod ticket;
pub(crate) mod visitor;
