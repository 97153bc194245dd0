//! Where a stream's bytes go: straight to its socket (a connection whose
//! first request was the stream, taken from hyper by `connections`), or into the
//! body of a response hyper serves (a stream asked for on a kept-alive
//! connection, or over HTTP/2). Either way its shard writes each event
//! with one call and is woken, through the stream's waker, when the
//! client goes away or a blocked socket can take more.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};
use tokio::net::TcpStream;

use super::Handoff;
use crate::locks::lock;

/// A client that has not taken this much of its stream has stopped
/// reading: it is let go rather than buffered for.
const MOST_PENDING: usize = 64 * 1024;

/// The client is gone (or stopped reading): drop the stream.
#[derive(Debug)]
pub(crate) struct Gone;

pub(crate) enum Sink {
    Socket(SocketSink),
    Body(Arc<BodyShared>),
}

pub(crate) struct SocketSink {
    socket: TcpStream,
    /// HTTP/1.1 chunks; HTTP/1.0's body ends where the connection does.
    chunked: bool,
    /// What the socket could not take yet.
    pending: Vec<u8>,
}

impl Sink {
    pub(crate) fn socket(socket: TcpStream, chunked: bool) -> Self {
        Self::Socket(SocketSink {
            socket,
            chunked,
            pending: Vec::new(),
        })
    }

    /// Send one piece of the stream: one write to the socket, framed as a
    /// chunk, in `frame` (a buffer the shard reuses).
    pub(crate) fn send(
        &mut self,
        data: &[u8],
        frame: &mut Vec<u8>,
        cx: &mut Context<'_>,
    ) -> Result<(), Gone> {
        match self {
            Self::Socket(s) => {
                frame.clear();
                if s.chunked {
                    use std::io::Write as _;
                    let _ = write!(frame, "{:x}\r\n", data.len());
                    frame.extend_from_slice(data);
                    frame.extend_from_slice(b"\r\n");
                } else {
                    frame.extend_from_slice(data);
                }
                if !s.pending.is_empty() {
                    s.pending.extend_from_slice(frame);
                    if s.pending.len() > MOST_PENDING {
                        return Err(Gone);
                    }
                    return Ok(());
                }
                match s.socket.try_write(frame) {
                    Ok(n) if n == frame.len() => Ok(()),
                    Ok(n) => {
                        s.pending.extend_from_slice(&frame[n..]);
                        s.flush(cx)
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        s.pending.extend_from_slice(frame);
                        s.flush(cx)
                    }
                    Err(_) => Err(Gone),
                }
            }
            Self::Body(b) => b.push(data),
        }
    }

    /// After a wake: whether the client went away; a blocked socket's
    /// bytes go on. Registers the stream's waker for the next change.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Result<(), Gone> {
        match self {
            Self::Socket(s) => {
                s.flush(cx)?;
                s.poll_gone(cx)
            }
            Self::Body(b) => {
                b.writer.register(cx.waker());
                if b.gone.load(Ordering::Acquire) {
                    Err(Gone)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Whether everything sent has reached the socket (or the body).
    pub(crate) fn flushed(&self) -> bool {
        match self {
            Self::Socket(s) => s.pending.is_empty(),
            Self::Body(_) => true,
        }
    }

    /// End the response: the last chunk, and the connection's write side
    /// closed (best effort: the peer may be gone).
    pub(crate) fn close(self) {
        match self {
            Self::Socket(mut s) => {
                if s.chunked && s.pending.is_empty() {
                    let _ = s.socket.try_write(b"0\r\n\r\n");
                }
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let _ = tokio::io::AsyncWrite::poll_shutdown(Pin::new(&mut s.socket), &mut cx);
            }
            Self::Body(b) => {
                lock(&b.queue).ended = true;
                b.reader.wake();
            }
        }
    }
}

impl SocketSink {
    fn flush(&mut self, cx: &mut Context<'_>) -> Result<(), Gone> {
        while !self.pending.is_empty() {
            match self.socket.try_write(&self.pending) {
                Ok(0) => return Err(Gone),
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match self.socket.poll_write_ready(cx) {
                        Poll::Pending => return Ok(()),
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(_)) => return Err(Gone),
                    }
                }
                Err(_) => return Err(Gone),
            }
        }
        // Give a big burst's buffer back.
        if self.pending.capacity() > 4096 {
            self.pending = Vec::new();
        }
        Ok(())
    }

    /// A client that goes away is noticed at once, not at the next write:
    /// its stream slot is freed now. Bytes it sends meanwhile (it should
    /// send none) are read and dropped.
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Result<(), Gone> {
        let mut scratch = [0u8; 64];
        // A client that keeps sending is read a little at a time.
        for _ in 0..16 {
            match self.socket.poll_read_ready(cx) {
                Poll::Pending => return Ok(()),
                Poll::Ready(Err(_)) => return Err(Gone),
                Poll::Ready(Ok(())) => match self.socket.try_read(&mut scratch) {
                    Ok(0) => return Err(Gone),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => return Err(Gone),
                },
            }
        }
        cx.waker().wake_by_ref();
        Ok(())
    }
}

/// A stream's bytes on their way through hyper.
#[derive(Default)]
pub(crate) struct BodyShared {
    queue: Mutex<Queue>,
    /// hyper's connection task, waiting for bytes.
    reader: AtomicWaker,
    /// The stream's shard, waiting for the body to be dropped.
    writer: AtomicWaker,
    gone: AtomicBool,
}

#[derive(Default)]
struct Queue {
    chunks: VecDeque<Bytes>,
    bytes: usize,
    ended: bool,
}

impl BodyShared {
    fn push(&self, data: &[u8]) -> Result<(), Gone> {
        if self.gone.load(Ordering::Acquire) {
            return Err(Gone);
        }
        {
            let mut q = lock(&self.queue);
            q.bytes += data.len();
            if q.bytes > MOST_PENDING {
                return Err(Gone);
            }
            q.chunks.push_back(Bytes::copy_from_slice(data));
        }
        self.reader.wake();
        Ok(())
    }
}

/// The response body of a stream hyper serves. Its first poll hands the
/// stream to a shard (unless `connections` took it with the socket first).
pub(crate) struct StreamBody {
    shared: Arc<BodyShared>,
    handoff: Option<Handoff>,
}

impl StreamBody {
    pub(crate) fn new(handoff: Handoff) -> Self {
        Self {
            shared: Arc::default(),
            handoff: Some(handoff),
        }
    }
}

impl Body for StreamBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(handoff) = self.handoff.take() {
            match handoff.take() {
                Some(start) => start.adopt(Sink::Body(self.shared.clone())),
                // Taken with the socket: this body is never sent.
                None => return Poll::Ready(None),
            }
        }
        let shared = &self.shared;
        for attempt in 0..2 {
            {
                let mut q = lock(&shared.queue);
                if let Some(chunk) = q.chunks.pop_front() {
                    q.bytes -= chunk.len();
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                if q.ended {
                    return Poll::Ready(None);
                }
            }
            if attempt == 0 {
                shared.reader.register(cx.waker());
            }
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for StreamBody {
    fn drop(&mut self) {
        self.shared.gone.store(true, Ordering::Release);
        self.shared.writer.wake();
    }
}
