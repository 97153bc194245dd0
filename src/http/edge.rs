//! What every request goes through before its route: a request id, a log
//! span carrying it, the HTTP metrics, the header-size limit, and
//! `X-Content-Type-Options: nosniff` on every answer.
//!
//! One layer rather than five (tower-http's set/propagate request id and
//! trace and set-header layers, and two `from_fn` middlewares; each
//! `Router::layer` also boxes and clones every route once more per
//! request): the gate answers in a few
//! microseconds of our own work, and each layer's future, boxing and
//! header lookups were a visible part of it (BENCHMARKS.md). The order
//! matters and is the one the separate layers had: the id is set first so
//! even a refused request (431) carries it, is logged under it and counted.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rand::RngCore;
use tower::{Layer, Service};
use tracing::Instrument;

use super::error::ApiError;
use crate::metrics::{HttpLabels, Metrics};

/// Headers beyond this (a cookie jar stuffed by a bot, a header flood) are
/// refused with 431 before any handler parses them. A visitor's own
/// headers, with one ticket cookie per room, are a few hundred bytes.
pub(crate) const HEADER_LIMIT: usize = 16 * 1024;

static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Request ids: a random per-process prefix and a counter. Unique across
/// instances and restarts (64 random bits), without asking the kernel for
/// randomness on every request as a v4 UUID does. The ids are not secret
/// and never were: the client sees its own.
#[derive(Debug)]
pub(crate) struct RequestIds {
    prefix: u64,
    next: AtomicU64,
}

impl Default for RequestIds {
    fn default() -> Self {
        Self {
            prefix: rand::rng().next_u64(),
            next: AtomicU64::new(0),
        }
    }
}

impl RequestIds {
    /// `{prefix:016x}-{n:016x}`: fixed width, written by hand since
    /// `core::fmt` showed up in the gate's profile.
    pub(crate) fn next(&self) -> HeaderValue {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut buf = [b'-'; 33];
        hex(self.prefix, &mut buf[..16]);
        hex(n, &mut buf[17..]);
        match HeaderValue::from_bytes(&buf) {
            Ok(v) => v,
            Err(_) => unreachable!("hex digits and a dash are a valid header value"),
        }
    }
}

fn hex(mut n: u64, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for slot in out.iter_mut().rev() {
        *slot = DIGITS[(n & 0xf) as usize];
        n >>= 4;
    }
}

#[derive(Clone, Debug)]
pub(crate) struct EdgeLayer {
    metrics: Arc<Metrics>,
    ids: Arc<RequestIds>,
}

impl EdgeLayer {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            ids: Arc::new(RequestIds::default()),
        }
    }
}

impl<S> Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Edge<S> {
        Edge {
            inner,
            metrics: self.metrics.clone(),
            ids: self.ids.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Edge<S> {
    inner: S,
    metrics: Arc<Metrics>,
    ids: Arc<RequestIds>,
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        // Arbitrary methods would grow the label set without bound.
        _ => "other",
    }
}

fn header_size(request: &Request) -> usize {
    request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum()
}

impl<S, B> Service<Request> for Edge<S>
where
    S: Service<Request, Response = axum::http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        // The clone is the one that was not polled ready; keep the ready one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let metrics = self.metrics.clone();
        // The caller's own id is kept, so a proxy's id follows the request.
        let id = match request.headers().get(&REQUEST_ID) {
            Some(id) => id.clone(),
            None => {
                let id = self.ids.next();
                request.headers_mut().insert(REQUEST_ID.clone(), id.clone());
                id
            }
        };
        // The query is left out: it may carry a return path, never needed
        // to trace a request. The fields are only formatted when the span
        // is enabled (not at the benchmarks' `warn`).
        let span = tracing::info_span!(
            "request",
            method = %request.method(),
            path = %request.uri().path(),
            request_id = id.to_str().unwrap_or(""),
        );
        let method = method_label(request.method());
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .map_or("unmatched", |p| metrics.route_label(p.as_str()));
        let start = Instant::now();
        let too_large = header_size(&request) > HEADER_LIMIT;
        let served = async move {
            let mut response = if too_large {
                ApiError::new(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "headers_too_large",
                    format!("The request's headers are larger than {HEADER_LIMIT} bytes."),
                )
                .into_response()
            } else {
                match inner.call(request).await {
                    Ok(response) => response.map(axum::body::Body::new),
                    Err(never) => match never {},
                }
            };
            let took = start.elapsed();
            let status = response.status();
            // What tower-http's trace layer logged by default: server
            // errors, at error level, inside the request's span.
            if status.is_server_error() {
                tracing::error!(
                    status = status.as_u16(),
                    latency_ms = took.as_millis() as u64,
                    "response failed"
                );
            }
            metrics.observe_http(
                HttpLabels {
                    method,
                    route,
                    status: status.as_u16(),
                },
                took,
            );
            let headers = response.headers_mut();
            headers.entry(&REQUEST_ID).or_insert(id);
            headers
                .entry(header::X_CONTENT_TYPE_OPTIONS)
                .or_insert(HeaderValue::from_static("nosniff"));
            Ok(response)
        };
        Box::pin(served.instrument(span))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_distinct_and_header_safe() {
        let ids = RequestIds::default();
        let a = ids.next();
        let b = ids.next();
        assert_ne!(a, b);
        assert_eq!(a.len(), 33);
        assert!(a.to_str().unwrap().ends_with("-0000000000000000"));
        assert!(
            a.to_str()
                .unwrap()
                .bytes()
                .all(|c| c == b'-' || c.is_ascii_hexdigit())
        );
    }
}
