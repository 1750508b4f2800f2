//! The backend side of the lean HTTP/1.1 path: one request/response
//! exchange on a pooled connection ([`super::pool`]), cleartext or TLS,
//! driven by the request's own task.
//!
//! The request head is written from the client's head as received, with
//! the route's edits applied on the way ([`Fields`]): the request line, the
//! Host field first, every other field as it came (hop-by-hop fields and
//! the framing fields left out), the edits' fields, then the framing of
//! the body. The head and the body's first bytes go out in one write. A
//! body is sent by its own framing: a Content-Length body as its bytes, a
//! chunked body from an HTTP/1.1 client as the chunks it sent (never
//! decoded and re-chunked), a body of unknown length (HTTP/2 without
//! `content-length`) chunked here. The response head is parsed in place
//! ([`h1::parse_response`]) and its fields forwarded as received; the
//! response body streams from the connection's read buffer by the
//! response's framing, and gives the connection back to the pool when it
//! has ended.
//!
//! A request that a reused connection turns out unable to carry (the
//! endpoint closed it while it was idle: the write fails, or the
//! connection closes before a byte of answer) is sent again on a new
//! connection when it can be: it was written whole in the first write
//! (no body, or all of it). Interim responses (100, 102, 103) are read and
//! dropped; a 101 to a request that asked to upgrade hands the connection
//! over ([`PooledBody::take_upgraded`]).

use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::uri::PathAndQuery;
use http::{Method, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::body::{BodyFraming, BoxError, ResponseBody, UpstreamBody};
use super::error::{ProxyError, UpstreamError};
use super::h1::{self, ChunkedWalker, ResponseFraming};
use super::head::{Fields, ProxyResponse, RawFields, field_line};
use super::pool::{Conn, Io, Key, Pool};
use crate::route::BackendTls;

/// Free space kept in a connection's read buffer before a read.
const READ_CHUNK: usize = 4 * 1024;

/// A request head on its way to an endpoint.
#[derive(Debug, Clone)]
pub(super) struct UpstreamHead {
    pub method: Method,
    /// The request target, origin-form.
    pub target: PathAndQuery,
    pub headers: Fields,
    /// The head asks to switch protocols (`Connection: upgrade`): a 101
    /// hands the connection over.
    pub upgrade: bool,
}

/// A request on its way to an endpoint.
#[derive(Debug)]
pub(super) struct UpstreamRequest {
    pub head: UpstreamHead,
    pub body: UpstreamBody,
}

/// Does a request with this method and no body still say its length (0)?
/// Backends may refuse a POST without one (411).
fn says_empty_length(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

/// `n` in decimal.
pub(super) fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// `n` in hex (a chunk size).
fn push_hex(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Write the request head: request line, Host, the other fields, framing.
pub(super) fn encode_head(
    out: &mut Vec<u8>,
    head: &UpstreamHead,
    framing: BodyFraming,
    endpoint: std::net::SocketAddr,
) {
    out.extend_from_slice(head.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(head.target.as_str().as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    match head.headers.get(&HOST) {
        Some(host) => field_line(out, b"Host", host),
        // Requests from HTTP/2 clients without an authority.
        None => field_line(out, b"Host", endpoint.to_string().as_bytes()),
    }
    head.headers.write(out, |name| {
        name.eq_ignore_ascii_case(b"host")
            || name.eq_ignore_ascii_case(b"content-length")
            || name.eq_ignore_ascii_case(b"transfer-encoding")
    });
    match framing {
        BodyFraming::Empty if says_empty_length(&head.method) => {
            out.extend_from_slice(b"content-length: 0\r\n");
        }
        BodyFraming::Empty => {}
        BodyFraming::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        BodyFraming::Chunked | BodyFraming::Unknown => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// Sends a request body after the head, by its framing.
struct BodySender {
    body: UpstreamBody,
    /// Chunk the data frames here (their length was not known).
    encode: bool,
    /// Bytes of the body ready to be written.
    pending: Bytes,
    done: bool,
}

/// Why sending a request body stopped.
enum SendError {
    /// The client's body failed (malformed, cut short).
    Body,
    /// Writing to the endpoint failed.
    Io(std::io::Error),
}

impl BodySender {
    /// The next bytes of the body, framed, or `None` at its end.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, SendError>> {
        loop {
            let frame = match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                None => {
                    self.done = true;
                    return Poll::Ready(Ok(self.encode.then(|| Bytes::from_static(b"0\r\n\r\n"))));
                }
                Some(Err(_)) => return Poll::Ready(Err(SendError::Body)),
                Some(Ok(frame)) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers are not forwarded
            };
            if data.is_empty() {
                continue;
            }
            if !self.encode {
                return Poll::Ready(Ok(Some(data)));
            }
            let mut chunk = Vec::with_capacity(data.len() + 20);
            push_hex(&mut chunk, data.len() as u64);
            chunk.extend_from_slice(b"\r\n");
            chunk.extend_from_slice(&data);
            chunk.extend_from_slice(b"\r\n");
            return Poll::Ready(Ok(Some(chunk.into())));
        }
    }

    /// Write the rest of the body to `io`.
    fn poll_send(&mut self, io: &mut Io, cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        loop {
            while !self.pending.is_empty() {
                let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.pending))
                    .map_err(SendError::Io)?;
                if n == 0 {
                    return Poll::Ready(Err(SendError::Io(std::io::ErrorKind::WriteZero.into())));
                }
                self.pending.advance(n);
            }
            if self.done {
                return Pin::new(&mut *io).poll_flush(cx).map_err(SendError::Io);
            }
            if let Some(next) = ready!(self.poll_next(cx))? {
                self.pending = next;
            }
        }
    }
}

/// Why no response head was read.
enum HeadError {
    /// The connection closed (or broke) before a byte of answer.
    Closed(std::io::Error),
    /// It broke or sent something that is not a response head.
    Failed(BoxError),
    /// The client's body failed.
    Body,
}

/// Read into `conn.buf`: the bytes read (0 at the end of the stream).
fn poll_fill(conn: &mut Conn, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
    if conn.buf.capacity() - conn.buf.len() < 1024 {
        conn.buf.reserve(READ_CHUNK);
    }
    pin!(conn.io.read_buf(&mut conn.buf)).poll(cx)
}

/// Read the final response head (interim ones are dropped).
fn poll_head(
    conn: &mut Conn,
    head_request: bool,
    got_bytes: &mut bool,
    cx: &mut Context<'_>,
) -> Poll<Result<h1::ResponseHead, HeadError>> {
    loop {
        if !conn.buf.is_empty() {
            match h1::parse_response(&conn.buf, head_request) {
                Ok(Some(head))
                    if head.status.is_informational()
                        && head.status != StatusCode::SWITCHING_PROTOCOLS =>
                {
                    conn.buf.advance(head.len);
                    continue;
                }
                Ok(Some(head)) => return Poll::Ready(Ok(head)),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Err(HeadError::Failed(Box::new(e)))),
            }
        }
        match ready!(poll_fill(conn, cx)) {
            Ok(0) if !*got_bytes => {
                return Poll::Ready(Err(HeadError::Closed(
                    std::io::ErrorKind::UnexpectedEof.into(),
                )));
            }
            Ok(0) => {
                return Poll::Ready(Err(HeadError::Failed(
                    "the connection closed within the response head".into(),
                )));
            }
            Ok(_) => *got_bytes = true,
            Err(e) if !*got_bytes => return Poll::Ready(Err(HeadError::Closed(e))),
            Err(e) => return Poll::Ready(Err(HeadError::Failed(Box::new(e)))),
        }
    }
}

/// Send `req` to the endpoint of `key` on an idle connection or a new one
/// (TLS as `tls` says).
pub(super) async fn send(
    pool: &Arc<Pool>,
    key: Key,
    tls: Option<&Arc<BackendTls>>,
    req: UpstreamRequest,
) -> Result<ProxyResponse, ProxyError> {
    let UpstreamRequest { head, body } = req;
    let framing = body.framing();
    let head_request = head.method == Method::HEAD;
    let mut out = Vec::with_capacity(512);
    encode_head(&mut out, &head, framing, key.endpoint);
    let mut sender = match framing {
        BodyFraming::Empty => None,
        _ => {
            let mut s = BodySender {
                body,
                encode: framing == BodyFraming::Unknown,
                pending: Bytes::new(),
                done: false,
            };
            // The head and the body's first bytes go out together.
            if let Some(first) = poll_fn(|cx| s.poll_next(cx))
                .await
                .map_err(|_| ProxyError::BadRequest("malformed request body"))?
            {
                out.extend_from_slice(&first);
            }
            (!s.done).then_some(s)
        }
    };
    // Written whole in the first write: it can be written again.
    let replayable = sender.is_none();
    let upgrade = head.upgrade;
    drop(head);
    loop {
        let mut conn = match pool.checkout(&key) {
            Some(conn) => conn,
            // Boxed: the rarer path, kept out of every request's future.
            None => Box::pin(Pool::connect(&key, tls.map(|t| &**t)))
                .await
                .map_err(ProxyError::Unreachable)?,
        };
        let stale = conn.reused && replayable;
        if let Err(e) = write_all(&mut conn.io, &out).await {
            if stale {
                continue;
            }
            return Err(ProxyError::Unreachable(UpstreamError::exchange(e)));
        }
        let mut got_bytes = false;
        let mut write_failed = false;
        let head = poll_fn(|cx| {
            if let Some(s) = &mut sender {
                match s.poll_send(&mut conn.io, cx) {
                    Poll::Ready(Ok(())) => sender = None,
                    Poll::Ready(Err(SendError::Body)) => return Poll::Ready(Err(HeadError::Body)),
                    // The endpoint may have answered already (and stopped
                    // reading): read on.
                    Poll::Ready(Err(SendError::Io(e))) => {
                        tracing::debug!(error = %e, "writing a request body failed");
                        sender = None;
                        write_failed = true;
                    }
                    Poll::Pending => {}
                }
            }
            poll_head(&mut conn, head_request, &mut got_bytes, cx)
        })
        .await;
        let head = match head {
            Ok(head) => head,
            Err(HeadError::Closed(_)) if stale => continue,
            Err(HeadError::Closed(e)) => {
                return Err(ProxyError::Unreachable(UpstreamError::exchange(e)));
            }
            Err(HeadError::Failed(e)) => {
                return Err(ProxyError::Unreachable(UpstreamError::exchange(e)));
            }
            Err(HeadError::Body) => return Err(ProxyError::BadRequest("malformed request body")),
        };
        if head.status == StatusCode::SWITCHING_PROTOCOLS && !upgrade {
            // Nothing after it could be read as HTTP.
            return Err(ProxyError::Unreachable(UpstreamError::exchange(
                "a 101 to a request that did not ask to upgrade",
            )));
        }
        return Ok(response(
            pool.clone(),
            conn,
            head,
            sender,
            write_failed,
            upgrade,
        ));
    }
}

async fn write_all(io: &mut Io, bytes: &[u8]) -> std::io::Result<()> {
    io.write_all(bytes).await?;
    io.flush().await
}

/// The response whose head was just parsed at the start of `conn.buf`.
fn response(
    pool: Arc<Pool>,
    mut conn: Box<Conn>,
    head: h1::ResponseHead,
    sender: Option<BodySender>,
    write_failed: bool,
    upgrade: bool,
) -> ProxyResponse {
    let bytes = conn.buf.split_to(head.len).freeze();
    let status = head.status;
    let headers = Fields::Raw(RawFields::new(bytes, head.fields));
    let state = match head.framing {
        _ if status == StatusCode::SWITCHING_PROTOCOLS && upgrade => State::Upgraded,
        ResponseFraming::None => State::Done,
        ResponseFraming::Length(n) => State::Length(n),
        ResponseFraming::Chunked => State::Chunked(ChunkedWalker::default()),
        ResponseFraming::UntilClose => State::UntilClose,
    };
    let reusable = head.keep_alive
        && !write_failed
        && status != StatusCode::SWITCHING_PROTOCOLS
        && state != State::UntilClose;
    let mut body = PooledBody {
        conn: Some(conn),
        pool,
        state,
        sending: sender.map(Box::new),
        raw: false,
        reusable,
    };
    if body.state == State::Done {
        body.finish();
    }
    ProxyResponse {
        status,
        headers,
        body: ResponseBody::Pooled(body),
    }
}

/// Where a response body is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// This many bytes left.
    Length(u64),
    Chunked(ChunkedWalker),
    /// Until the endpoint closes the connection.
    UntilClose,
    /// A 101: the connection is to be handed over.
    Upgraded,
    Done,
}

/// A response body read from a pooled connection; once it has ended the
/// connection goes back to the pool. Dropped before its end, it closes
/// the connection.
pub struct PooledBody {
    conn: Option<Box<Conn>>,
    pool: Arc<Pool>,
    state: State,
    /// The rest of the request body, when the response came first.
    sending: Option<Box<BodySender>>,
    /// Chunked: give the chunks as received (framing included).
    raw: bool,
    reusable: bool,
}

impl std::fmt::Debug for PooledBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBody")
            .field("state", &self.state)
            .field("raw", &self.raw)
            .finish()
    }
}

impl PooledBody {
    /// Whether the body is chunked (and not read yet).
    pub fn is_chunked(&self) -> bool {
        matches!(self.state, State::Chunked(_))
    }

    /// A chunked body: pass its chunks on as they are (framing and all),
    /// for a client that reads chunked too.
    pub fn pass_chunks_through(&mut self) {
        self.raw = self.is_chunked();
    }

    /// After a 101: the connection and the bytes read past the head.
    pub(crate) fn take_upgraded(&mut self) -> Option<(Io, Bytes)> {
        if self.state != State::Upgraded {
            return None;
        }
        self.state = State::Done;
        let mut conn = self.conn.take()?;
        let read_ahead = conn.buf.split().freeze();
        Some((conn.io, read_ahead))
    }

    /// The body ended: give the connection back if it can carry another
    /// request.
    fn finish(&mut self) {
        self.state = State::Done;
        if let Some(conn) = self.conn.take()
            && self.reusable
            && self.sending.is_none()
        {
            self.pool.checkin(conn);
        }
    }

    /// Send more of the request body, as far as it goes without waiting.
    fn drive_sending(&mut self, cx: &mut Context<'_>) {
        let (Some(sending), Some(conn)) = (&mut self.sending, &mut self.conn) else {
            return;
        };
        match sending.poll_send(&mut conn.io, cx) {
            Poll::Pending => {}
            Poll::Ready(result) => {
                self.reusable &= result.is_ok();
                self.sending = None;
            }
        }
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BoxError>>> {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if matches!(self.state, State::Done | State::Upgraded) {
                return Poll::Ready(None);
            }
            if conn.buf.is_empty() {
                match ready!(poll_fill(conn, cx)) {
                    Ok(0) if self.state == State::UntilClose => {
                        self.reusable = false;
                        self.finish();
                        return Poll::Ready(None);
                    }
                    Ok(0) => {
                        self.conn = None;
                        return Poll::Ready(Some(Err(
                            "the endpoint closed the connection within the response body".into(),
                        )));
                    }
                    Ok(_) => continue,
                    Err(e) => {
                        self.conn = None;
                        return Poll::Ready(Some(Err(Box::new(e))));
                    }
                }
            }
            let data = match &mut self.state {
                State::Length(left) => {
                    let n = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(conn.buf.len());
                    *left -= n as u64;
                    let data = conn.buf.split_to(n).freeze();
                    if *left == 0 {
                        self.finish();
                    }
                    data
                }
                State::UntilClose => conn.buf.split().freeze(),
                State::Chunked(walker) if self.raw => {
                    let n = match walker.walk(&conn.buf) {
                        Ok(n) => n,
                        Err(e) => {
                            self.conn = None;
                            return Poll::Ready(Some(Err(Box::new(e))));
                        }
                    };
                    let data = conn.buf.split_to(n).freeze();
                    if walker.is_done() {
                        self.finish();
                    }
                    data
                }
                State::Chunked(walker) => {
                    let mut ranges = Vec::new();
                    let n = match walker.walk_with(&conn.buf, |r| ranges.push(r)) {
                        Ok(n) => n,
                        Err(e) => {
                            self.conn = None;
                            return Poll::Ready(Some(Err(Box::new(e))));
                        }
                    };
                    let walked = conn.buf.split_to(n).freeze();
                    let data = match ranges.as_slice() {
                        [] => Bytes::new(),
                        [one] => walked.slice(one.clone()),
                        many => {
                            let mut data =
                                BytesMut::with_capacity(many.iter().map(|r| r.len()).sum());
                            for r in many {
                                data.extend_from_slice(&walked[r.clone()]);
                            }
                            data.freeze()
                        }
                    };
                    if walker.is_done() {
                        self.finish();
                    }
                    data
                }
                State::Done | State::Upgraded => unreachable!("returned above"),
            };
            if !data.is_empty() {
                return Poll::Ready(Some(Ok(data)));
            }
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        this.drive_sending(cx);
        this.poll_data(cx).map(|d| d.map(|r| r.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done | State::Length(0))
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Length(n) => SizeHint::with_exact(n),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

/// The fields a response head written by the proxy leaves out: the
/// framing, which it writes from the body.
pub(super) fn is_framing_field(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(CONTENT_LENGTH.as_str().as_bytes())
        || name.eq_ignore_ascii_case(TRANSFER_ENCODING.as_str().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_in_decimal_and_hex() {
        let mut out = Vec::new();
        for n in [0u64, 7, 10, 12345, u64::MAX] {
            out.clear();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
            out.clear();
            push_hex(&mut out, n);
            assert_eq!(out, format!("{n:x}").as_bytes());
        }
    }
}
