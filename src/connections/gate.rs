//! Gate checks on a connection of their own, served without hyper.
//!
//! A proxy that asks the gate on every page view keeps a few connections
//! to Narabu open and sends nothing else on them: each check is a small
//! `GET /gate/{room}` with no body, answered by a small head. On such a
//! connection hyper's general machinery (its dispatcher, a header-read
//! timer set and cancelled for every request, the read and write buffers
//! behind the first-read [`Rewind`](super::Rewind)) costs as much as the
//! check itself. So a connection whose first request is a gate check is
//! served here: each head is parsed with `httparse`, answered by the same
//! service the router would call ([`GateFirst::answer`]), and written in
//! one send; pipelined checks are answered in order. The first request
//! that is not a plain gate check (another path, a body, an upgrade, a
//! head too large to parse here) hands the connection, with the bytes not
//! yet answered, to hyper, which serves the rest of it as any other.
//!
//! The slowloris bound holds: a head must arrive whole within the header
//! timeout of the connection going idle. One timer per connection keeps
//! it, moved forward only when it fires, instead of one per request.

use std::net::IpAddr;
use std::pin::pin;
use std::time::Duration;

use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri, Version, header};
use axum::response::Response;
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{MAX_HEAD, MAX_HEADERS, status_and_headers, write_all};
use crate::http::gate::{GateFirst, is_gate_check};

/// What became of a gate connection.
pub(crate) enum Ended {
    /// Closed: by the peer, by the timeout, by a `Connection: close`, or
    /// at shutdown.
    Closed,
    /// A request this path does not serve: hyper takes the socket, the
    /// bytes not yet answered first.
    Handoff(TcpStream, Bytes),
}

/// Serve gate checks from `buf` (which holds at least one whole head) and
/// then from the socket, until the connection ends or asks for something
/// else.
pub(crate) async fn serve(
    mut socket: TcpStream,
    mut buf: BytesMut,
    app: GateFirst,
    peer: IpAddr,
    header_timeout: Duration,
    stop: CancellationToken,
) -> Ended {
    let mut idle_since = Instant::now();
    let mut deadline = pin!(tokio::time::sleep_until(idle_since + header_timeout));
    // A token of the connection's own: waiting on the server's (shared by
    // every connection) would take its lock on every request.
    let mut stopped = pin!(stop.child_token().cancelled_owned());
    loop {
        // Answer every whole check already read.
        loop {
            let check = match parse(&buf) {
                Head::Gate(check) => check,
                Head::Partial if buf.len() < MAX_HEAD => break,
                Head::Partial | Head::Other => return Ended::Handoff(socket, buf.freeze()),
            };
            buf.advance(check.len);
            let response = app.answer(check.request, Some(peer)).await;
            let out = encode(response, check.version, check.close).await;
            if write_all(&socket, &out).await.is_err() {
                return Ended::Closed;
            }
            if check.close {
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut socket).await;
                return Ended::Closed;
            }
            idle_since = Instant::now();
        }
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(2048);
        }
        tokio::select! {
            biased;
            read = socket.read_buf(&mut buf) => match read {
                Ok(0) | Err(_) => return Ended::Closed,
                Ok(_) => {}
            },
            () = &mut deadline => {
                let due = idle_since + header_timeout;
                if Instant::now() >= due {
                    return Ended::Closed;
                }
                deadline.as_mut().reset(due);
            }
            // Between requests a shutdown just closes; a head half read
            // still has until the timeout to arrive.
            () = &mut stopped, if buf.is_empty() => return Ended::Closed,
        }
    }
}

/// A whole gate check read from the buffer.
struct Check {
    /// The head's length in the buffer.
    len: usize,
    request: Parts,
    version: Version,
    /// Whether the connection ends after the answer.
    close: bool,
}

// Lives on the stack for a moment; boxing the check would be an
// allocation per request.
#[allow(clippy::large_enum_variant)]
enum Head {
    Gate(Check),
    Partial,
    Other,
}

fn parse(buf: &[u8]) -> Head {
    if buf.is_empty() {
        return Head::Partial;
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut head = httparse::Request::new(&mut headers);
    let len = match head.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Head::Partial,
        Err(_) => return Head::Other,
    };
    let (Some("GET"), Some(target), Some(minor)) = (head.method, head.path, head.version) else {
        return Head::Other;
    };
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    if !is_gate_check(&Method::GET, path) {
        return Head::Other;
    }
    let Ok(uri) = Uri::try_from(target) else {
        return Head::Other;
    };
    let version = if minor == 0 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut request = Request::new(());
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    // HTTP/1.0 closes unless asked not to; HTTP/1.1 stays open unless
    // asked to close.
    let mut close = version == Version::HTTP_10;
    let map = request.headers_mut();
    map.reserve(head.headers.len());
    for h in head.headers.iter() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) else {
            return Head::Other;
        };
        // A body, an upgrade or a continue are hyper's business.
        if name == header::TRANSFER_ENCODING
            || name == header::UPGRADE
            || name == header::EXPECT
            || (name == header::CONTENT_LENGTH && value.as_bytes().trim_ascii() != b"0")
        {
            return Head::Other;
        }
        if name == header::CONNECTION {
            for token in value.as_bytes().split(|b| *b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && version == Version::HTTP_10 {
                    close = false;
                }
            }
        }
        map.append(name, value);
    }
    let (request, ()) = request.into_parts();
    Head::Gate(Check {
        len,
        request,
        version,
        close,
    })
}

/// The answer as bytes, to go in one send: hyper's head (status line,
/// the headers, `date`, the length), keep-alive said out loud for an
/// HTTP/1.0 peer that asked for it.
async fn encode(response: Response, version: Version, close: bool) -> Vec<u8> {
    let (parts, body) = response.into_parts();
    // The gate's bodies are small and whole: ready on the first poll.
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let mut out = Vec::with_capacity(256 + body.len());
    status_and_headers(&mut out, &parts);
    date::push(&mut out);
    // A 204 carries no length (nor a body).
    if parts.status != StatusCode::NO_CONTENT {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if version == Version::HTTP_10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if parts.status != StatusCode::NO_CONTENT {
        out.extend_from_slice(&body);
    }
    out
}

/// The `date` header, formatted once a second per thread as hyper does.
mod date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
    }

    pub(crate) fn push(out: &mut Vec<u8>) {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        CACHED.with_borrow_mut(|(at, text)| {
            if *at != second || text.is_empty() {
                *at = second;
                *text = format!("date: {}\r\n", httpdate::fmt_http_date(now));
            }
            out.extend_from_slice(text.as_bytes());
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(head: &[u8]) -> Check {
        match parse(head) {
            Head::Gate(check) => check,
            Head::Partial => panic!("partial"),
            Head::Other => panic!("other"),
        }
    }

    #[test]
    fn plain_gate_checks_are_read_here_and_pipelined_ones_one_at_a_time() {
        let two = b"GET /gate/sale?redirect=1 HTTP/1.1\r\nHost: a\r\nCookie: x=1\r\n\r\nGET /gate/sale HTTP/1.1\r\n\r\n";
        let first = check(two);
        assert_eq!(first.request.uri.path(), "/gate/sale");
        assert_eq!(first.request.uri.query(), Some("redirect=1"));
        assert_eq!(first.request.headers["cookie"], "x=1");
        assert!(!first.close);
        let second = check(&two[first.len..]);
        assert_eq!(first.len + second.len, two.len());
        assert!(matches!(
            parse(b"GET /gate/sale HTTP/1.1\r\nHost"),
            Head::Partial
        ));
        assert!(matches!(parse(b""), Head::Partial));
    }

    #[test]
    fn anything_else_goes_to_hyper() {
        for head in [
            &b"GET /healthz HTTP/1.1\r\n\r\n"[..],
            b"POST /gate/sale HTTP/1.1\r\n\r\n",
            b"GET /gate/sale/x HTTP/1.1\r\n\r\n",
            b"GET /gate/s%61le HTTP/1.1\r\n\r\n",
            b"GET /gate/sale HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
            b"GET /gate/sale HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET /gate/sale HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            b"GET /gate/sale HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            b"GET /gate/sale HTTP/9.9\r\n\r\n",
        ] {
            assert!(
                matches!(parse(head), Head::Other),
                "{}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn connection_tokens_decide_whether_the_connection_stays() {
        assert!(check(b"GET /gate/a HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n").close);
        assert!(check(b"GET /gate/a HTTP/1.0\r\n\r\n").close);
        assert!(!check(b"GET /gate/a HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").close);
        assert!(!check(b"GET /gate/a HTTP/1.1\r\nContent-Length: 0\r\n\r\n").close);
    }

    #[tokio::test]
    async fn an_answer_is_one_head_with_its_length_and_date() {
        let mut refused = Response::new(axum::body::Body::from("{}"));
        *refused.status_mut() = StatusCode::NOT_FOUND;
        let out = String::from_utf8(encode(refused, Version::HTTP_11, true).await).unwrap();
        assert!(out.starts_with("HTTP/1.1 404 Not Found\r\n"), "{out}");
        assert!(out.contains("\r\ncontent-length: 2\r\n"), "{out}");
        assert!(out.contains("\r\ndate: "), "{out}");
        assert!(out.ends_with("connection: close\r\n\r\n{}"), "{out}");
        let mut passed = Response::new(axum::body::Body::empty());
        *passed.status_mut() = StatusCode::NO_CONTENT;
        let out = String::from_utf8(encode(passed, Version::HTTP_10, false).await).unwrap();
        assert!(!out.contains("content-length"), "{out}");
        assert!(out.ends_with("connection: keep-alive\r\n\r\n"), "{out}");
    }
}
