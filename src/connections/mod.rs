//! Connections served without hyper: those whose first request is an
//! event stream, and those that only ask the gate ([`gate`]).
//!
//! hyper keeps an 8 KiB read buffer and an 8 KiB write buffer for every
//! connection for as long as it is open (its `INIT_BUFFER_SIZE`, which its
//! builder cannot lower). That is most of what a waiting visitor's open
//! stream costs, and a stream should cost at most 16 KiB in all. So the
//! accept loop reads the first request head of each connection itself: a
//! `GET /api/rooms/{room}/events` is run through the same router as every
//! other request (auth, limits, stream caps, metrics, request ids and
//! errors all apply from one place), and its response is written here: a
//! visitor's event stream as a head, then the socket goes to the stream
//! writers (`http::events`), which write each event straight to it with no
//! buffer kept between events; any other stream event by event, anything
//! else whole, then the connection closes. A connection whose first
//! request is a gate check is served by [`gate`]. Every other connection
//! goes to hyper with the bytes read so far put back in front
//! ([`Rewind`]).
//!
//! Only a connection's first request can take this path; an event stream
//! asked for on a kept-alive connection is served by hyper as before (so
//! config/nginx.conf sends streams on connections of their own).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::ConnectInfo;
use axum::http::{self, HeaderValue, Method, Request, Version, header};
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tower::ServiceExt;

pub(crate) mod gate;

/// The most a head may take on this path; a bigger one goes to hyper and
/// on to the router, whose edge layer refuses it (431).
const MAX_HEAD: usize = 16 * 1024 + 1024;
/// Headers beyond this many go to hyper too.
const MAX_HEADERS: usize = 64;

/// What the first bytes of a connection turned out to be.
pub(crate) enum First {
    /// The head of an event-stream request, to serve here.
    Stream(Box<Request<axum::body::Body>>),
    /// A gate check (and whatever followed it), to serve with [`gate`].
    Gate(BytesMut),
    /// Anything else: the bytes read so far, for hyper.
    Other(Bytes),
    /// The peer closed (or failed) before sending a whole head.
    Closed,
}

/// Read the connection's first request head, or as much of it as tells it
/// is neither an event-stream request nor a gate check. The caller bounds
/// this in time.
pub(crate) async fn read_first(socket: &mut TcpStream, peer: SocketAddr) -> First {
    const PREFIXES: [&[u8]; 2] = [b"GET /api/rooms/", b"GET /gate"];
    let mut buf = BytesMut::with_capacity(1024);
    loop {
        match socket.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return First::Closed,
            Ok(_) => {}
        }
        let may_be_ours = PREFIXES.iter().any(|prefix| {
            let n = buf.len().min(prefix.len());
            buf[..n] == prefix[..n]
        });
        if !may_be_ours {
            return First::Other(buf.freeze());
        }
        match parse(&buf, peer) {
            Parsed::Partial if buf.len() < MAX_HEAD => {
                if buf.capacity() == buf.len() {
                    buf.reserve(buf.len());
                }
            }
            Parsed::Stream(request) => return First::Stream(request),
            Parsed::Gate => return First::Gate(buf),
            Parsed::Partial | Parsed::Other => return First::Other(buf.freeze()),
        }
    }
}

enum Parsed {
    Partial,
    Stream(Box<Request<axum::body::Body>>),
    /// A whole gate check: [`gate`] reads it again, with what follows.
    Gate,
    Other,
}

/// Kept out of `read_first`'s future, so the header array is never part
/// of a connection task's state.
fn parse(buf: &[u8], peer: SocketAddr) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut head = httparse::Request::new(&mut headers);
    let len = match head.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Other,
    };
    let (Some(path), Some(minor)) = (head.path, head.version) else {
        return Parsed::Other;
    };
    let route = path.split('?').next().unwrap_or("");
    if head.method == Some("GET") && crate::http::gate::is_gate_check(&Method::GET, route) {
        return Parsed::Gate;
    }
    // Pipelined bytes after a stream's head belong to hyper's keep-alive
    // logic.
    if len != buf.len() || !is_events_path(route) {
        return Parsed::Other;
    }
    let mut builder = Request::builder()
        .method(Method::GET)
        .uri(path)
        .version(if minor == 0 {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        });
    for h in head.headers.iter() {
        let name = h.name;
        // A request body (or an upgrade) is hyper's business.
        if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("upgrade")
            || (name.eq_ignore_ascii_case("content-length") && h.value.trim_ascii() != b"0")
        {
            return Parsed::Other;
        }
        builder = builder.header(name, h.value);
    }
    match builder.body(axum::body::Body::empty()) {
        Ok(mut request) => {
            request.extensions_mut().insert(ConnectInfo(peer));
            Parsed::Stream(Box::new(request))
        }
        Err(_) => Parsed::Other,
    }
}

/// `/api/rooms/{room}/events`, with one non-empty room segment.
fn is_events_path(path: &str) -> bool {
    path.strip_prefix("/api/rooms/")
        .and_then(|rest| rest.strip_suffix("/events"))
        .is_some_and(|room| !room.is_empty() && !room.contains('/'))
}

/// Run an event-stream request through the router and write its response.
pub(crate) async fn serve(
    mut socket: TcpStream,
    request: Box<Request<axum::body::Body>>,
    app: crate::http::gate::GateFirst,
) {
    let http10 = request.version() == Version::HTTP_10;
    let response = match app.oneshot(*request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let (parts, mut body) = response.into_parts();
    let streaming = parts.status == http::StatusCode::OK
        && parts
            .headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streaming {
        // An error (or whatever the router answered): small, sent whole.
        let bytes = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let mut out = head(&parts, Some(bytes.len()), false);
        out.extend_from_slice(&bytes);
        let _ = write_all(&socket, &out).await;
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut socket).await;
        return;
    }
    // HTTP/1.0 has no chunks: the body ends where the connection does.
    let chunked = !http10;
    if write_all(&socket, &head(&parts, None, chunked))
        .await
        .is_err()
    {
        return;
    }
    // A visitor's stream: its writer takes the socket from here.
    if let Some(start) = parts
        .extensions
        .get::<crate::http::events::Handoff>()
        .and_then(crate::http::events::Handoff::take)
    {
        start.adopt(crate::http::events::Sink::socket(socket, chunked));
        return;
    }
    drop(parts);
    loop {
        tokio::select! {
            frame = body.frame() => match frame {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else { continue };
                    if data.is_empty() {
                        continue;
                    }
                    let sent = if chunked {
                        write_all(&socket, &chunk(&data)).await
                    } else {
                        write_all(&socket, &data).await
                    };
                    if sent.is_err() {
                        return;
                    }
                }
                Some(Err(_)) => return,
                None => break,
            },
            // A client that goes away is noticed at once, not at the next
            // keep-alive comment: its stream slot is freed now.
            ready = socket.readable() => {
                if ready.is_err() || peer_gone(&socket) {
                    return;
                }
            }
        }
    }
    if chunked {
        let _ = write_all(&socket, b"0\r\n\r\n").await;
    }
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut socket).await;
}

/// Whether the peer closed its side; bytes it sends meanwhile (it should
/// send none) are read and dropped.
fn peer_gone(socket: &TcpStream) -> bool {
    let mut scratch = [0u8; 64];
    match socket.try_read(&mut scratch) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    }
}

/// The response head. Always `Connection: close`: this path serves one
/// request per connection.
fn head(parts: &http::response::Parts, length: Option<usize>, chunked: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    status_and_headers(&mut out, parts);
    if let Some(length) = length {
        out.extend_from_slice(format!("content-length: {length}\r\n").as_bytes());
    }
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out
}

/// A response's status line and its headers, but for those that say how
/// the body is framed and whether the connection stays (and `date`),
/// which the caller writes for the way it sends.
fn status_and_headers(out: &mut Vec<u8>, parts: &http::response::Parts) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        parts
            .status
            .canonical_reason()
            .unwrap_or("Unknown")
            .as_bytes(),
    );
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if name == header::CONNECTION
            || name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
            || name == header::DATE
        {
            continue;
        }
        push_header(out, name.as_str(), value);
    }
}

fn push_header(out: &mut Vec<u8>, name: &str, value: &HeaderValue) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// One chunk of a chunked body, in one buffer so it goes in one send.
fn chunk(data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut out = Vec::with_capacity(data.len() + 12);
    // Writing to a Vec cannot fail.
    let _ = write!(out, "{:x}\r\n", data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

async fn write_all(socket: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match socket.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => socket.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A connection with bytes already read put back in front, for hyper.
pub(crate) struct Rewind {
    prefix: Bytes,
    inner: TcpStream,
}

impl Rewind {
    pub(crate) fn new(prefix: Bytes, inner: TcpStream) -> Self {
        Self { prefix, inner }
    }
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            if self.prefix.is_empty() {
                // Give the head's buffer back now, not when the
                // connection ends.
                self.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_events_route_is_served_without_hyper() {
        assert!(is_events_path("/api/rooms/sale/events"));
        assert!(!is_events_path("/api/rooms//events"));
        assert!(!is_events_path("/api/rooms/a/b/events"));
        assert!(!is_events_path("/api/rooms/sale/status"));
        assert!(!is_events_path("/api/rooms/sale/events/x"));
    }

    #[test]
    fn heads_with_a_body_or_pipelined_bytes_go_to_hyper() {
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let ok = b"GET /api/rooms/s/events?return=/x HTTP/1.1\r\nHost: a\r\n\r\n";
        assert!(matches!(parse(ok, peer), Parsed::Stream(_)));
        let partial = b"GET /api/rooms/s/events HTTP/1.1\r\nHost: a\r\n";
        assert!(matches!(parse(partial, peer), Parsed::Partial));
        let body = b"GET /api/rooms/s/events HTTP/1.1\r\nContent-Length: 3\r\n\r\n";
        assert!(matches!(parse(body, peer), Parsed::Other));
        let piped = b"GET /api/rooms/s/events HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        assert!(matches!(parse(piped, peer), Parsed::Other));
    }

    #[test]
    fn a_chunk_is_its_length_in_hex_then_the_bytes() {
        assert_eq!(chunk(b"data: x\n\n"), b"9\r\ndata: x\n\n\r\n");
    }
}
