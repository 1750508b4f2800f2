//! The backend side of the lean HTTP/1.1 path (issue 13): one
//! request/response exchange on a pooled connection ([`super::pool`]),
//! cleartext or TLS, driven by the request's own task instead of hyper's
//! client and its connection task.
//!
//! The request head is written as bytes from the request the handler
//! edited (request line, Host, every other field, then the framing of the
//! body); the head and the body's first bytes go out in one write when
//! the body has them ready. A body of known length goes as its bytes, one
//! of unknown length (a chunked upload, HTTP/2 without `content-length`)
//! chunked. The response head is parsed in place
//! ([`h1::parse_response`], which refuses what could be framed two ways:
//! the client gets 502) and its field values share the bytes read; the
//! response body streams from the connection's read buffer by the
//! response's framing. A chunked body is walked, never decoded, when the
//! client connection passes it on chunked ([`PooledBody::pass_chunks_through`]):
//! its chunks go out as the backend sent them. Once the body has ended,
//! the connection goes back to the pool if the response allowed
//! keep-alive and nothing is left unread on it.
//!
//! A request that a reused connection turns out unable to carry is sent
//! again on another connection when nothing of it can have been acted on:
//! the pool drops idle connections the backend closed before they are
//! used; after that, a request written whole in its first write whose
//! connection closed before a byte of answer is sent again when its
//! method is idempotent (RFC 9110 §9.2.2), or whatever its method when
//! the first write itself failed (the backend had reset the connection:
//! nothing of the request was taken). A request whose body was still
//! streaming is never sent again here (the retry policy and its replay
//! buffer decide that). Interim responses (100, 102, 103) are read and
//! dropped. A 101 to a request that asked to upgrade hands the connection
//! over ([`BackendUpgrade`], spliced by [`crate::proxy::upgrade`]); a 101 to any
//! other request is a 502.
//!
//! HTTP/2 backends stay with hyper's client ([`super::h2`]).

use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::pool::{Conn, Io, Key, Pool};
use crate::proxy::body::{BoxError, UpstreamBody};
use crate::proxy::error::UpstreamError;
use crate::proxy::h1::{self, BadResponse, ChunkedWalker, ResponseFraming};
use crate::route::BackendTls;

/// Free space kept in a connection's read buffer before a read.
const READ_CHUNK: usize = 8 * 1024;

/// How a request body goes to the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyFraming {
    /// No body; `content-length: 0` said when `true`.
    Empty(bool),
    /// This many bytes (Content-Length).
    Length(u64),
    /// Of a length not known in advance: chunked here.
    Chunked,
}

/// How the body of the request `parts` goes out. The body's own length
/// first (what the client connection read), else the Content-Length the
/// request carries, else chunked.
fn request_framing(parts: &http::request::Parts, body: &UpstreamBody) -> BodyFraming {
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if body.is_end_stream() {
        // Backends may refuse a POST without a length (411).
        let says = declared.is_some()
            || matches!(parts.method, Method::POST | Method::PUT | Method::PATCH);
        return BodyFraming::Empty(says);
    }
    match body.size_hint().exact().or(declared) {
        Some(n) => BodyFraming::Length(n),
        None => BodyFraming::Chunked,
    }
}

/// `n` in decimal.
fn push_decimal(out: &mut Vec<u8>, n: u64) {
    push_digits(out, n, 10);
}

/// `n` in hex (a chunk size).
fn push_hex(out: &mut Vec<u8>, n: u64) {
    push_digits(out, n, 16);
}

fn push_digits(out: &mut Vec<u8>, mut n: u64, radix: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[(n % radix) as usize];
        n /= radix;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

fn field_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Write the request head: request line, Host, the other fields (the
/// handler has removed the hop-by-hop ones), the body's framing.
fn encode_head(
    out: &mut Vec<u8>,
    parts: &http::request::Parts,
    framing: BodyFraming,
    endpoint: SocketAddr,
) {
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    match parts.uri.path_and_query() {
        Some(pq) if !pq.as_str().is_empty() => out.extend_from_slice(pq.as_str().as_bytes()),
        _ => out.push(b'/'),
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    match parts.headers.get(HOST) {
        Some(host) => field_line(out, b"host", host.as_bytes()),
        // Requests from HTTP/2 clients without an authority.
        None => field_line(out, b"host", endpoint.to_string().as_bytes()),
    }
    for (name, value) in &parts.headers {
        if name == HOST || name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            continue;
        }
        field_line(out, name.as_str().as_bytes(), value.as_bytes());
    }
    match framing {
        BodyFraming::Empty(true) => out.extend_from_slice(b"content-length: 0\r\n"),
        BodyFraming::Empty(false) => {}
        BodyFraming::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        BodyFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// Sends a request body after the head, by its framing.
struct BodySender {
    body: UpstreamBody,
    /// Chunk the data frames here.
    chunked: bool,
    /// Bytes still due, for a Content-Length body.
    left: Option<u64>,
    /// Bytes of the body ready to be written.
    pending: Bytes,
    done: bool,
}

/// Why sending a request body stopped.
enum SendError {
    /// The client's body failed (malformed, cut short, stalled), or it
    /// did not have the length it said.
    Body(BoxError),
    /// Writing to the endpoint failed.
    Io(std::io::Error),
}

impl BodySender {
    /// The next bytes of the body, framed, or `None` at its end.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, SendError>> {
        if self.done {
            return Poll::Ready(Ok(None));
        }
        loop {
            let frame = match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                None => {
                    self.done = true;
                    if self.left.is_some_and(|n| n > 0) {
                        return Poll::Ready(Err(SendError::Body(
                            "the request body ended before its Content-Length".into(),
                        )));
                    }
                    return Poll::Ready(Ok(self.chunked.then(|| Bytes::from_static(b"0\r\n\r\n"))));
                }
                Some(Err(e)) => return Poll::Ready(Err(SendError::Body(e))),
                Some(Ok(frame)) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers are not forwarded
            };
            if data.is_empty() {
                continue;
            }
            if let Some(left) = &mut self.left {
                if data.len() as u64 > *left {
                    return Poll::Ready(Err(SendError::Body(
                        "the request body is longer than its Content-Length".into(),
                    )));
                }
                *left -= data.len() as u64;
            }
            if !self.chunked {
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
            match ready!(self.poll_next(cx))? {
                Some(next) => self.pending = next,
                None => self.done = true,
            }
        }
    }
}

/// Why no response head was read.
enum HeadError {
    /// The connection closed (or broke) before a byte of answer.
    Closed(std::io::Error),
    /// It broke within the head, or sent something that is not a
    /// response head.
    Failed(BoxError),
    /// The client's body failed.
    Body(BoxError),
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

/// Send `req` (origin-form URI) to `endpoint` on an idle connection of
/// the pool or a new one (TLS as `tls` says). Boxed: the exchange is
/// large, and the future of every request holds this one.
pub(in crate::proxy) fn send(
    pool: &Arc<Pool>,
    endpoint: SocketAddr,
    tls: Option<&Arc<BackendTls>>,
    req: Request<UpstreamBody>,
) -> Pin<Box<dyn Future<Output = Result<Response<PooledBody>, UpstreamError>> + Send + 'static>> {
    let key = Key {
        endpoint,
        tls: tls.map(|t| t.key.as_str().into()),
    };
    Box::pin(exchange(pool.clone(), key, tls.cloned(), req))
}

async fn exchange(
    pool: Arc<Pool>,
    key: Key,
    tls: Option<Arc<BackendTls>>,
    req: Request<UpstreamBody>,
) -> Result<Response<PooledBody>, UpstreamError> {
    let (parts, body) = req.into_parts();
    let framing = request_framing(&parts, &body);
    let head_request = parts.method == Method::HEAD;
    let idempotent = parts.method.is_idempotent();
    // The handler puts `Upgrade` back only on requests that ask to
    // switch protocols (it is hop-by-hop otherwise).
    let upgrade = parts.headers.contains_key(UPGRADE);
    let mut out = Vec::with_capacity(512);
    encode_head(&mut out, &parts, framing, key.endpoint);
    drop(parts);
    let mut sender = match framing {
        BodyFraming::Empty(_) => None,
        BodyFraming::Length(n) => Some(BodySender {
            body,
            chunked: false,
            left: Some(n),
            pending: Bytes::new(),
            done: false,
        }),
        BodyFraming::Chunked => Some(BodySender {
            body,
            chunked: true,
            left: None,
            pending: Bytes::new(),
            done: false,
        }),
    };
    // The head and the body's first bytes go out together when the body
    // has them now (all of it, for most small bodies).
    if let Some(s) = &mut sender {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        while let Poll::Ready(next) = s.poll_next(&mut cx) {
            match next {
                Ok(Some(bytes)) => out.extend_from_slice(&bytes),
                Ok(None) => break,
                Err(SendError::Body(e)) => return Err(UpstreamError::exchange(e)),
                Err(SendError::Io(e)) => return Err(UpstreamError::exchange(e)),
            }
            if out.len() >= READ_CHUNK {
                break;
            }
        }
        if s.done {
            sender = None;
        }
    }
    // Written whole in the first write: it can be written again.
    let whole = sender.is_none();
    loop {
        let mut conn = match pool.checkout(&key) {
            Some(conn) => conn,
            None => Pool::connect(&key, tls.as_deref()).await?,
        };
        let again = conn.reused && whole;
        if let Err(e) = write_all(&mut conn.io, &out).await {
            if again && (idempotent || e.kind() == std::io::ErrorKind::BrokenPipe) {
                continue;
            }
            return Err(UpstreamError::exchange(e));
        }
        let mut got_bytes = false;
        let mut write_failed = false;
        let head = poll_fn(|cx| {
            if let Some(s) = &mut sender {
                match s.poll_send(&mut conn.io, cx) {
                    Poll::Ready(Ok(())) => sender = None,
                    Poll::Ready(Err(SendError::Body(e))) => {
                        return Poll::Ready(Err(HeadError::Body(e)));
                    }
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
            Err(HeadError::Closed(_)) if again && idempotent => continue,
            Err(HeadError::Closed(e)) => return Err(UpstreamError::exchange(e)),
            Err(HeadError::Failed(e)) | Err(HeadError::Body(e)) => {
                return Err(UpstreamError::exchange(e));
            }
        };
        return response(pool, conn, head, sender, write_failed, upgrade);
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
) -> Result<Response<PooledBody>, UpstreamError> {
    let status = head.status;
    let switching = status == StatusCode::SWITCHING_PROTOCOLS;
    if switching && !upgrade {
        // Nothing after it could be read as HTTP.
        return Err(UpstreamError::exchange(BadResponse(
            "a 101 to a request that did not ask to upgrade",
        )));
    }
    let state = match head.framing {
        _ if switching => State::Done,
        ResponseFraming::None => State::Done,
        ResponseFraming::Length(n) => State::Length(n),
        ResponseFraming::Chunked => {
            // A malformed chunk already here is refused with the head
            // (502) rather than after it.
            let rest = &conn.buf[head.len..];
            if !rest.is_empty() && ChunkedWalker::default().walk(rest).is_err() {
                return Err(UpstreamError::exchange(BadResponse(
                    "malformed chunked body",
                )));
            }
            State::Chunked(ChunkedWalker::default())
        }
        ResponseFraming::UntilClose => State::UntilClose,
    };
    let bytes = conn.buf.split_to(head.len).freeze();
    let mut headers = HeaderMap::with_capacity(head.fields.len() + 4);
    for (name, value) in &head.fields {
        let name = HeaderName::from_bytes(&bytes[name.clone()])
            .map_err(|_| UpstreamError::exchange(BadResponse("malformed field name")))?;
        let value = HeaderValue::from_maybe_shared(bytes.slice(value.clone()))
            .map_err(|_| UpstreamError::exchange(BadResponse("malformed field value")))?;
        headers.append(name, value);
    }
    let reusable = head.keep_alive && !write_failed && !switching;
    let (conn, handover) = if switching {
        // The connection is the upgrade's now, with what the backend sent
        // after the 101 (see `crate::proxy::upgrade`).
        let Conn { io, mut buf, .. } = *conn;
        let read_ahead = buf.split().freeze();
        let up = BackendUpgraded { io, read_ahead };
        (None, Some(BackendUpgrade(Arc::new(Mutex::new(Some(up))))))
    } else {
        (Some(conn), None)
    };
    let mut body = PooledBody {
        conn,
        pool,
        state,
        sending: sender.map(Box::new),
        raw: false,
        reusable,
    };
    if matches!(body.state, State::Done) {
        body.finish();
    }
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.version_mut() = if head.minor == 0 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    *resp.headers_mut() = headers;
    if let Some(handover) = handover {
        resp.extensions_mut().insert(handover);
    }
    Ok(resp)
}

/// A backend's connection after its 101, and the bytes it sent after the
/// response head.
pub(in crate::proxy) struct BackendUpgraded {
    pub io: Io,
    pub read_ahead: Bytes,
}

/// A response extension of a 101: the backend's connection, for
/// [`crate::proxy::upgrade`] to take (an extension must be `Clone`).
#[derive(Clone)]
pub(in crate::proxy) struct BackendUpgrade(Arc<Mutex<Option<BackendUpgraded>>>);

impl BackendUpgrade {
    pub fn take(&self) -> Option<BackendUpgraded> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Where a response body is.
#[derive(Debug)]
enum State {
    /// This many bytes left.
    Length(u64),
    Chunked(ChunkedWalker),
    /// Until the endpoint closes the connection.
    UntilClose,
    Done,
}

/// A response body read from a pooled connection; once it has ended the
/// connection goes back to the pool (when the response allowed keep-alive
/// and the request was sent whole). Dropped before its end, it closes
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
    /// A chunked body not read yet: pass its chunks on as they are
    /// (framing, extensions and trailers included), for a client that
    /// reads chunked too. Returns whether it does.
    pub fn pass_chunks_through(&mut self) -> bool {
        self.raw = matches!(&self.state, State::Chunked(w) if *w == ChunkedWalker::default());
        self.raw
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

    fn fail(&mut self, e: BoxError) -> Poll<Option<Result<Bytes, BoxError>>> {
        self.conn = None;
        self.state = State::Done;
        Poll::Ready(Some(Err(e)))
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BoxError>>> {
        loop {
            if matches!(self.state, State::Done) {
                return Poll::Ready(None);
            }
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if conn.buf.is_empty() {
                match ready!(poll_fill(conn, cx)) {
                    Ok(0) if matches!(self.state, State::UntilClose) => {
                        self.reusable = false;
                        self.finish();
                        return Poll::Ready(None);
                    }
                    Ok(0) => {
                        return self.fail(
                            "the endpoint closed the connection within the response body".into(),
                        );
                    }
                    Ok(_) => continue,
                    Err(e) => return self.fail(Box::new(e)),
                }
            }
            let (data, ended) = match &mut self.state {
                State::Length(left) => {
                    let n = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(conn.buf.len());
                    *left -= n as u64;
                    (conn.buf.split_to(n).freeze(), *left == 0)
                }
                State::UntilClose => (conn.buf.split().freeze(), false),
                State::Chunked(walker) if self.raw => match walker.walk(&conn.buf) {
                    Ok(n) => (conn.buf.split_to(n).freeze(), walker.is_done()),
                    Err(e) => return self.fail(Box::new(e)),
                },
                State::Chunked(walker) => {
                    let mut ranges = Vec::new();
                    let n = match walker.walk_with(&conn.buf, |r| ranges.push(r)) {
                        Ok(n) => n,
                        Err(e) => return self.fail(Box::new(e)),
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
                    (data, walker.is_done())
                }
                State::Done => unreachable!("returned above"),
            };
            if ended {
                self.finish();
            }
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
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Length(n) => SizeHint::with_exact(n),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
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

    fn parts(method: Method, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut req = Request::builder().method(method).uri("/a?b");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(()).expect("request").into_parts().0
    }

    #[test]
    fn the_head_names_host_first_and_the_framing_last() {
        let p = parts(
            Method::POST,
            &[
                ("x-a", "1"),
                ("host", "example.com"),
                ("content-length", "5"),
            ],
        );
        let mut out = Vec::new();
        encode_head(
            &mut out,
            &p,
            BodyFraming::Length(5),
            "10.0.0.1:80".parse().expect("addr"),
        );
        assert_eq!(
            String::from_utf8(out).expect("ascii"),
            "POST /a?b HTTP/1.1\r\nhost: example.com\r\nx-a: 1\r\ncontent-length: 5\r\n\r\n"
        );
        let p = parts(Method::GET, &[]);
        let mut out = Vec::new();
        encode_head(
            &mut out,
            &p,
            BodyFraming::Chunked,
            "10.0.0.1:80".parse().expect("addr"),
        );
        assert_eq!(
            String::from_utf8(out).expect("ascii"),
            "GET /a?b HTTP/1.1\r\nhost: 10.0.0.1:80\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn an_empty_body_says_its_length_where_a_backend_wants_it() {
        let empty = UpstreamBody::Empty;
        assert_eq!(
            request_framing(&parts(Method::GET, &[]), &empty),
            BodyFraming::Empty(false)
        );
        assert_eq!(
            request_framing(&parts(Method::POST, &[]), &empty),
            BodyFraming::Empty(true)
        );
        assert_eq!(
            request_framing(&parts(Method::GET, &[("content-length", "0")]), &empty),
            BodyFraming::Empty(true)
        );
    }
}
