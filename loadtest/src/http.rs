//! A lean HTTP/1.1 client over tokio sockets: keep-alive requests, and
//! event streams read as they arrive.
//!
//! A general client (reqwest, hyper's pool) costs tens of kilobytes and a
//! task or two per connection; the `streams` scenario holds thousands of
//! connections per client process, and the throughput scenarios want the
//! client's own cost small next to the server it measures. So each
//! connection here is one socket and one growable buffer, optionally bound
//! to a chosen loopback source address (127.0.0.2, 127.0.0.3, …) so that
//! many connections fit in the ephemeral port range.

use std::io;
use std::net::{IpAddr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::sse::{SseEvent, SseParser};

/// Headers bigger than this are refused: a Narabu answer is a few hundred bytes.
const MAX_HEAD: usize = 64 * 1024;
/// Bodies bigger than this are refused (the tool reads small JSON only).
const MAX_BODY: usize = 1024 * 1024;

/// A response's status line and the headers this tool looks at.
#[derive(Debug, Clone, Default)]
pub struct Head {
    pub status: u16,
    pub content_length: Option<usize>,
    pub chunked: bool,
    pub close: bool,
    pub content_type: Option<String>,
    /// Every `Set-Cookie`, in order (a visitor behind a proxy keeps its
    /// pass fresh from them).
    pub set_cookies: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    pub set_cookies: Vec<String>,
}

impl Response {
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// Build a request. `Host` is always sent; a body always has a length.
pub fn request(
    method: &str,
    path: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + path.len() + body.len());
    out.extend_from_slice(format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n").as_bytes());
    for (name, value) in headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    if !body.is_empty() || method == "POST" || method == "PUT" || method == "PATCH" {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// How long a connection must have sat idle before a close with nothing
/// read is taken for the server's idle timeout and retried once.
const IDLE_BEFORE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// One keep-alive connection.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    /// Where it goes and from where, to reconnect after the server closed
    /// it while idle.
    addr: SocketAddr,
    source: Option<IpAddr>,
    /// Since when the connection has been waiting for its next request
    /// (opened, or its last answer read).
    idle_since: std::time::Instant,
    /// The server said `Connection: close`, or a body was left unread.
    pub broken: bool,
}

impl Conn {
    pub async fn connect(addr: SocketAddr, source: Option<IpAddr>) -> io::Result<Self> {
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        if let Some(ip) = source
            && ip.is_ipv4() == addr.is_ipv4()
        {
            socket.bind(SocketAddr::new(ip, 0))?;
        }
        let stream = socket.connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::new(),
            pos: 0,
            addr,
            source,
            idle_since: std::time::Instant::now(),
            broken: false,
        })
    }

    /// Send a request and read the whole answer. A connection the server
    /// closed while it sat idle (servers do, after their idle or
    /// header-read timeout: Narabu's is 10 s) is reopened and the request
    /// sent again, as any HTTP client does with a pooled connection. Only
    /// a connection idle for a while and closed with nothing read counts:
    /// a server that drops a request on a busy connection is still an error.
    pub async fn call(&mut self, req: &[u8]) -> io::Result<Response> {
        if self.pos == self.buf.len() {
            // Every byte read so far is consumed: start this answer afresh,
            // so that "nothing read" below means nothing of this answer.
            self.buf.clear();
            self.pos = 0;
        }
        let reused = self.buf.is_empty() && self.idle_since.elapsed() >= IDLE_BEFORE_RETRY;
        match self.call_once(req).await {
            Err(e)
                if reused
                    && self.buf.is_empty()
                    && matches!(
                        e.kind(),
                        io::ErrorKind::UnexpectedEof
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::BrokenPipe
                    ) =>
            {
                *self = Self::connect(self.addr, self.source).await?;
                self.call_once(req).await
            }
            other => other,
        }
    }

    async fn call_once(&mut self, req: &[u8]) -> io::Result<Response> {
        self.stream.write_all(req).await?;
        let head = self.read_head().await?;
        let body = self.read_body(&head).await?;
        if head.close {
            self.broken = true;
        }
        self.idle_since = std::time::Instant::now();
        Ok(Response {
            status: head.status,
            body,
            set_cookies: head.set_cookies,
        })
    }

    /// Send a request and read only the head; the body follows with
    /// [`Conn::next_event`] (event streams) or [`Conn::read_body`].
    pub async fn open(&mut self, req: &[u8]) -> io::Result<Head> {
        self.stream.write_all(req).await?;
        let head = self.read_head().await?;
        // The server closes the connection after this answer.
        if head.close {
            self.broken = true;
        }
        Ok(head)
    }

    async fn fill(&mut self) -> io::Result<()> {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 4096 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.reserve(1024);
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        Ok(())
    }

    /// Bytes up to (not including) `delim`, consuming both.
    async fn read_until(&mut self, delim: &[u8], limit: usize) -> io::Result<Vec<u8>> {
        loop {
            if let Some(at) = find(&self.buf[self.pos..], delim) {
                let out = self.buf[self.pos..self.pos + at].to_vec();
                self.pos += at + delim.len();
                return Ok(out);
            }
            if self.buf.len() - self.pos > limit {
                return Err(invalid("a line or head too long"));
            }
            self.fill().await?;
        }
    }

    async fn read_exact_vec(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() - self.pos < n {
            self.fill().await?;
        }
        let out = self.buf[self.pos..self.pos + n].to_vec();
        self.pos += n;
        Ok(out)
    }

    pub async fn read_head(&mut self) -> io::Result<Head> {
        loop {
            let raw = self.read_until(b"\r\n\r\n", MAX_HEAD).await?;
            let head = parse_head(&raw)?;
            // 1xx answers precede the real one.
            if !(100..200).contains(&head.status) {
                return Ok(head);
            }
        }
    }

    pub async fn read_body(&mut self, head: &Head) -> io::Result<Vec<u8>> {
        if head.status == 204 || head.status == 304 {
            return Ok(Vec::new());
        }
        if head.chunked {
            let mut body = Vec::new();
            while let Some(chunk) = self.next_chunk().await? {
                if body.len() + chunk.len() > MAX_BODY {
                    return Err(invalid("body too large"));
                }
                body.extend_from_slice(&chunk);
            }
            return Ok(body);
        }
        match head.content_length {
            Some(n) if n > MAX_BODY => Err(invalid("body too large")),
            Some(n) => self.read_exact_vec(n).await,
            None => {
                // Read to the end: the connection cannot be reused.
                self.broken = true;
                let mut body = self.buf[self.pos..].to_vec();
                self.pos = self.buf.len();
                let _ = self.stream.read_to_end(&mut body).await;
                Ok(body)
            }
        }
    }

    /// The next chunk of a chunked body; `None` after the last one.
    pub async fn next_chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        let line = self.read_until(b"\r\n", 1024).await?;
        let size = parse_chunk_size(&line)?;
        if size == 0 {
            // Trailers, then the blank line.
            loop {
                if self.read_until(b"\r\n", MAX_HEAD).await?.is_empty() {
                    return Ok(None);
                }
            }
        }
        if size > MAX_BODY {
            return Err(invalid("chunk too large"));
        }
        let data = self.read_exact_vec(size).await?;
        let crlf = self.read_exact_vec(2).await?;
        if crlf != b"\r\n" {
            return Err(invalid("chunk not followed by CRLF"));
        }
        Ok(Some(data))
    }
}

/// An event stream on a connection whose head has been read.
pub struct EventStream {
    pub conn: Conn,
    parser: SseParser,
    pending: std::collections::VecDeque<SseEvent>,
    chunked: bool,
    ended: bool,
}

impl EventStream {
    pub fn new(conn: Conn, head: &Head) -> Self {
        Self {
            conn,
            parser: SseParser::default(),
            pending: std::collections::VecDeque::new(),
            chunked: head.chunked,
            ended: false,
        }
    }

    /// The next event (comments are skipped); `None` when the stream ends.
    pub async fn next_event(&mut self) -> io::Result<Option<SseEvent>> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Ok(Some(e));
            }
            if self.ended {
                return Ok(None);
            }
            let data = if self.chunked {
                self.conn.next_chunk().await?
            } else {
                // Until the connection closes.
                match self.conn.fill().await {
                    Ok(()) => {
                        let d = self.conn.buf[self.conn.pos..].to_vec();
                        self.conn.pos = self.conn.buf.len();
                        Some(d)
                    }
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => None,
                    Err(e) => return Err(e),
                }
            };
            match data {
                Some(bytes) => {
                    let mut out = Vec::new();
                    self.parser.feed(&bytes, &mut out);
                    self.pending.extend(out);
                }
                None => {
                    self.ended = true;
                    if !self.chunked {
                        self.conn.broken = true;
                    }
                }
            }
        }
    }

    /// The connection back, reusable when the stream ended cleanly.
    pub fn into_conn(mut self) -> Conn {
        if !self.ended {
            self.conn.broken = true;
        }
        self.conn
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

pub fn parse_chunk_size(line: &[u8]) -> io::Result<usize> {
    let text = std::str::from_utf8(line).map_err(|_| invalid("chunk size not ASCII"))?;
    let hex = text.split(';').next().unwrap_or("").trim();
    usize::from_str_radix(hex, 16).map_err(|_| invalid("bad chunk size"))
}

pub fn parse_head(raw: &[u8]) -> io::Result<Head> {
    let text = std::str::from_utf8(raw).map_err(|_| invalid("head not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(invalid("not an HTTP/1.x answer"));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| invalid("bad status line"))?;
    let mut head = Head {
        status,
        close: version == "HTTP/1.0",
        ..Head::default()
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => {
                head.content_length =
                    Some(value.parse().map_err(|_| invalid("bad content-length"))?);
            }
            "transfer-encoding" => {
                head.chunked = value.to_ascii_lowercase().contains("chunked");
            }
            "connection" => {
                let v = value.to_ascii_lowercase();
                if v.contains("close") {
                    head.close = true;
                } else if v.contains("keep-alive") {
                    head.close = false;
                }
            }
            "content-type" => head.content_type = Some(value.to_owned()),
            "set-cookie" => head.set_cookies.push(value.to_owned()),
            _ => {}
        }
    }
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that closes its first connection unanswered (as an idle
    /// timeout does) and answers `200 ok` on each later one.
    async fn closes_first_connection() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (first, _) = listener.accept().await.unwrap();
            drop(first);
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut scratch = [0u8; 1024];
                let _ = socket.read(&mut scratch).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_connection_closed_while_idle_is_reopened_once() {
        let addr = closes_first_connection().await;
        let mut conn = Conn::connect(addr, None).await.unwrap();
        tokio::time::sleep(IDLE_BEFORE_RETRY + std::time::Duration::from_millis(100)).await;
        let r = conn
            .call(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    }

    #[tokio::test]
    async fn a_used_connection_closed_while_idle_is_reopened_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            // Each connection answers one request, then is reset, so that
            // the client's next write fails outright (not only its read).
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut scratch = [0u8; 1024];
                let _ = socket.read(&mut scratch).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                let _ = socket.set_zero_linger();
            }
        });
        let mut conn = Conn::connect(addr, None).await.unwrap();
        let request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(conn.call(request).await.unwrap().status, 200);
        tokio::time::sleep(IDLE_BEFORE_RETRY + std::time::Duration::from_millis(100)).await;
        let r = conn.call(request).await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    }

    #[tokio::test]
    async fn a_busy_connection_closed_unanswered_is_an_error() {
        let addr = closes_first_connection().await;
        let mut conn = Conn::connect(addr, None).await.unwrap();
        let err = conn
            .call(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap_err();
        assert!(matches!(
            err.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
        ));
    }

    #[test]
    fn heads_are_parsed() {
        let h = parse_head(
            b"HTTP/1.1 201 Created\r\ncontent-length: 12\r\nContent-Type: application/json",
        )
        .unwrap();
        assert_eq!(h.status, 201);
        assert_eq!(h.content_length, Some(12));
        assert!(!h.chunked && !h.close);
        let h = parse_head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close")
            .unwrap();
        assert!(h.chunked && h.close);
        assert!(parse_head(b"SSH-2.0 hello").is_err());
        assert!(parse_head(b"HTTP/1.1 abc OK").is_err());
    }

    #[test]
    fn chunk_sizes_are_hex_with_optional_extensions() {
        assert_eq!(parse_chunk_size(b"1a").unwrap(), 26);
        assert_eq!(parse_chunk_size(b"0;ext=1").unwrap(), 0);
        assert!(parse_chunk_size(b"zz").is_err());
    }

    #[test]
    fn requests_carry_host_and_length() {
        let r = request(
            "POST",
            "/api/rooms/a/join",
            "127.0.0.1:1",
            &[("X", "y")],
            b"",
        );
        let text = String::from_utf8(r).unwrap();
        assert!(
            text.starts_with("POST /api/rooms/a/join HTTP/1.1\r\nHost: 127.0.0.1:1\r\nX: y\r\n")
        );
        assert!(text.ends_with("Content-Length: 0\r\n\r\n"));
        let g = String::from_utf8(request("GET", "/gate/a", "h", &[], b"")).unwrap();
        assert!(!g.contains("Content-Length"));
    }
}
