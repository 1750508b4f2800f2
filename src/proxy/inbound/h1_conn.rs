//! The lean HTTP/1.1 path's client connections (issue 13): one loop per
//! connection, cleartext or TLS, instead of hyper's HTTP/1 server.
//!
//! Each request head is parsed in place ([`h1::parse_request`]), served by
//! the same codec-independent [`handler`] as HTTP/2 requests, and the
//! response is written here: head and the body's first bytes in one write
//! when both are ready, the body by its own framing. A request body is read
//! by the loop as the handler's upstream exchange takes it (a small channel
//! of frames), also while the response streams back.
//!
//! A connection quiet for a second after its response is parked off its
//! task ([`idle`]): it then costs its socket and its [`ConnInfo`] only.
//! While a connection idles it holds no buffer, as nginx does: the read and
//! write buffers are given back once a response is written and nothing
//! more was sent, and the next request's first bytes are read into room on
//! the stack before a buffer is taken for them. hyper's server kept 24 KiB
//! of buffers per idle connection. Buffers given back wait in a small
//! per-thread [`Spare`] list for the next request, so that busy
//! connections do not pay an allocation per request for them. The
//! connection's task is sized by its idle state (its largest), so that
//! state is kept small: one timer, the drain's notification, and the read
//! (docs/performance.md, *Issue 13, third pass*).
//!
//! Everything the parser refuses is answered from its [`ProxyError`] and
//! the connection closed; a head that does not arrive within the
//! request-head timeout (or the idle timeout) closes the connection; on
//! drain an idle connection closes at once and a busy one after its
//! response. An upgrade (WebSocket) hands the connection to
//! [`crate::proxy::upgrade`] after the 101.

use std::cell::RefCell;
use std::future::poll_fn;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::ops::Range;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::header::{CONNECTION, CONTENT_LENGTH, HOST, HeaderName, HeaderValue, TRANSFER_ENCODING};
use http::{HeaderMap, Method, Request, StatusCode, Version};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::idle;
use crate::proxy::body::{BodyTimedOut, BoxError, LeanBody, RequestBody, ResponseBody};
use crate::proxy::error::ProxyError;
use crate::proxy::h1::{self, ChunkedWalker, Framing, HeadLimits, RequestHead};
use crate::proxy::request::handler;
use crate::proxy::upgrade::{LeanUpgrade, Upgraded};
use crate::proxy::{Shared, TlsConnection};

/// Free space kept in the read buffer while a request body is read.
const READ_CHUNK: usize = 8 * 1024;
/// Room a request head is read into first (nginx's
/// `client_header_buffer_size`); a larger head doubles it as it comes.
const HEAD_CHUNK: usize = 1024;
/// Room reserved for a response head when the write buffer is taken.
const OUT_HEAD: usize = 512;
/// A read buffer with less room than this left is not kept.
const SPARE_MIN_ROOM: usize = 256;
/// Buffers kept per thread for the next requests (of each kind).
const SPARE_BUFFERS: usize = 64;
/// A buffer larger than this is freed, not kept (at most 1 MiB kept per
/// thread).
const SPARE_MAX_BYTES: usize = 8 * 1024;
/// Request body frames the loop may read ahead of the upstream exchange.
const BODY_FRAMES: usize = 2;
/// Response bytes gathered before they are written.
const WRITE_BATCH: usize = 64 * 1024;

/// Serve the HTTP/1.1 requests of one client connection until it closes,
/// idles past its timeout, or the proxy drains. `permits` hold its places
/// under the connection limits; the first request head is due by
/// `first_head_by`.
///
/// Spawned as a task of its own (not awaited inside another future), so
/// that the task is no larger than this future. What a request needs and
/// the wait for a head does not (the peer, the TLS details, the permits)
/// is kept in one [`ConnInfo`] box for the connection's life: a tokio task
/// is allocated in 128-byte steps and 128-byte aligned, a box in 16-byte
/// ones, and the task is 512 bytes instead of 1,024.
pub(in crate::proxy) fn serve<S>(
    shared: Arc<Shared>,
    io: S,
    tls: Option<TlsConnection>,
    peer: handler::Peer,
    bind: SocketAddr,
    permits: super::accept::Permits,
    first_head_by: Option<Instant>,
) -> impl Future<Output = ()> + Send + 'static
where
    S: ClientStream,
{
    let info = Box::new(ConnInfo {
        shared,
        tls,
        peer,
        bind,
        due: first_head_by.map_or(Due::Next, Due::First),
        _permits: permits,
    });
    serve_with(info, io)
}

/// Serve a parked connection again, from its wait for a head (it became
/// readable, or closed).
pub(super) fn resume(parked: idle::Parked) -> impl Future<Output = ()> + Send + 'static {
    let idle::Parked { io, mut info, by } = parked;
    info.due = Due::KeepAlive(by);
    serve_with(info, io)
}

/// A client connection's stream, as the loop needs it. Plain TCP streams
/// are parked while idle ([`idle`]); others wait in their task.
pub(in crate::proxy) trait ClientStream:
    AsyncRead + AsyncWrite + Unpin + Send + Sized + 'static
{
    /// Whether an idle connection on this stream is parked.
    const PARKS: bool = false;

    /// Park the connection until `by`, idle; `Err` gives it back.
    fn park(self, info: Box<ConnInfo>, _by: Instant) -> Result<(), (Self, Box<ConnInfo>)> {
        Err((self, info))
    }
}

impl ClientStream for TcpStream {
    const PARKS: bool = true;

    fn park(self, info: Box<ConnInfo>, by: Instant) -> Result<(), (Self, Box<ConnInfo>)> {
        idle::park(idle::Parked { io: self, info, by }).map_err(|p| (p.io, p.info))
    }
}

impl ClientStream for tokio_rustls::server::TlsStream<TcpStream> {}

/// When a connection's next request head is due.
#[derive(Clone, Copy)]
pub(super) enum Due {
    /// The connection's first: its whole head by then.
    First(Instant),
    /// After a response: its first byte within the keep-alive timeout,
    /// then the head within the request-head timeout.
    Next,
    /// Parked, woken: its first byte by then (its keep-alive deadline),
    /// then the head within the request-head timeout.
    KeepAlive(Instant),
}

/// What a connection keeps for its requests, boxed once (see [`serve`]).
pub(in crate::proxy) struct ConnInfo {
    pub(super) shared: Arc<Shared>,
    tls: Option<TlsConnection>,
    peer: handler::Peer,
    bind: SocketAddr,
    /// When the next request head is due (taken by each wait).
    due: Due,
    /// Held until the connection ends.
    _permits: super::accept::Permits,
}

#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps each argument twice in its future"
)]
fn serve_with<S>(mut info: Box<ConnInfo>, mut io: S) -> impl Future<Output = ()> + Send + 'static
where
    S: ClientStream,
{
    // An `async` block, not an `async fn`: an `async fn` moves each
    // argument into a local of its own, and both are kept in the future
    // (with `read_head`'s, 256 bytes of task per idle connection). The
    // block uses what it captures in place.
    async move {
        let mut conn = Conn {
            buf: BytesMut::new(),
            out: Vec::new(),
        };
        // The refusal is answered after the loop: awaited inside the
        // `match`, the head's whole result (192 bytes) would be kept in the
        // task beside the wait for a head.
        let refused = loop {
            let head = match conn.read_head(&info.shared, &mut io, &mut info.due).await {
                Ok(Wait::Head(head)) => head,
                Ok(Wait::Close) => return,
                // Idle for a while: the connection waits in its worker's
                // table, and this task ends.
                Ok(Wait::Park(by)) => match io.park(info, by) {
                    Ok(()) => return,
                    // Readable already, or draining: read on.
                    Err(back) => {
                        (io, info) = back;
                        info.due = Due::KeepAlive(by);
                        continue;
                    }
                },
                Err(refused) => break refused,
            };
            // One exchange, boxed: the connection's task is sized by its
            // largest state, and an idle connection should not keep room for a
            // request (3 KB). One allocation per request instead.
            match Box::pin(Exchange { info: &info }.run(&mut conn, &mut io, head)).await {
                Next::Request => conn.release(),
                Next::Close => {
                    let _ = io.shutdown().await;
                    return;
                }
                Next::Gone => return,
                Next::HandOver(tx) => {
                    let read_ahead = conn.buf.split().freeze();
                    let _ = tx.send(Upgraded {
                        io: Box::new(io),
                        read_ahead,
                    });
                    return;
                }
            }
        };
        let client = info.peer.addr;
        tracing::debug!(%client, error = %refused, "request head refused");
        let _ = Box::pin(conn.write_error(&mut io, refused)).await;
    }
}

/// What the connection does after an exchange.
enum Next {
    /// Read the next request.
    Request,
    /// Close it (after a response that says so, or a body not read).
    Close,
    /// It is gone (a write failed, or it was closed already).
    Gone,
    /// Hand it over to the upgrade's splice (after a 101).
    HandOver(oneshot::Sender<Upgraded>),
}

/// What one request/response exchange of a connection needs.
struct Exchange<'a> {
    info: &'a ConnInfo,
}

impl Exchange<'_> {
    /// Serve the request whose head is at the start of `conn.buf`, and
    /// write its response.
    async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        self,
        conn: &mut Conn,
        io: &mut S,
        head: RequestHead,
    ) -> Next {
        let head_bytes = conn.buf.split_to(head.len).freeze();
        let keep_alive = head.keep_alive;
        let minor = head.minor;
        let is_head = head.method == Method::HEAD;
        let (body, mut pump) =
            Pump::for_framing(head.framing, self.info.shared.limits.request_body_timeout);
        let expect_continue = head.expect_continue && pump.is_some() && conn.buf.is_empty();
        let upgrade = head.upgrade;
        let mut req = match build_request(head, &head_bytes, body) {
            Ok(req) => req,
            Err(refused) => {
                let _ = conn.write_error(io, refused).await;
                return Next::Gone;
            }
        };
        if let Some(tls) = &self.info.tls {
            req.extensions_mut().insert(tls.clone());
        }
        let handover = upgrade.then(|| {
            let (tx, rx) = oneshot::channel();
            req.extensions_mut()
                .insert(LeanUpgrade(Arc::new(Mutex::new(Some(rx)))));
            tx
        });
        if expect_continue
            && write_now(io, b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .is_err()
        {
            return Next::Gone;
        }

        // The handler runs while the loop reads the request body for it.
        let handling = handler::handle(&self.info.shared, req, &self.info.peer, self.info.bind);
        tokio::pin!(handling);
        let resp = loop {
            match &mut pump {
                Some(p) if p.active() => {
                    tokio::select! {
                        resp = &mut handling => break resp,
                        () = p.step(io, &mut conn.buf) => {}
                    }
                }
                // No body to read: watch the connection, so that a client
                // that goes away ends its request (and gives its place
                // under the backend's cap back) as hyper does.
                _ => {
                    let limit = self.info.shared.limits.max_request_header_bytes;
                    tokio::select! {
                        resp = &mut handling => break resp,
                        () = closed_by_client(io, &mut conn.buf, limit) => return Next::Gone,
                    }
                }
            }
        };

        let status = resp.status();
        let close = !keep_alive
            || *self.info.shared.draining.borrow()
            || resp.headers().get(CONNECTION).is_some_and(|v| v == "close");
        let (parts, mut body) = resp.into_parts();
        let mut framing = encode_head(&mut conn.out, &parts, &body, is_head, minor, close);
        drop(parts);
        // A backend's chunked body goes on as the backend chunked it.
        if framing == OutFraming::Chunked
            && let ResponseBody::Pooled(b) = &mut body
            && b.pass_chunks_through()
        {
            framing = OutFraming::ChunkedAsIs;
        }
        if conn.write_body(io, body, framing, &mut pump).await.is_err() {
            return Next::Gone;
        }
        if status == StatusCode::SWITCHING_PROTOCOLS
            && let Some(tx) = handover
        {
            return Next::HandOver(tx);
        }
        let body_read = pump.as_ref().is_none_or(Pump::complete);
        if close || !body_read || framing == OutFraming::UntilClose {
            return Next::Close;
        }
        Next::Request
    }
}

/// Wait until the client closes its connection (or it fails), keeping
/// what it sends meanwhile (a pipelined request) in `buf`; once `buf`
/// holds `limit` bytes, wait no more.
async fn closed_by_client<S: AsyncRead + Unpin>(io: &mut S, buf: &mut BytesMut, limit: usize) {
    while buf.len() < limit {
        match io.read_buf(buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
    std::future::pending().await
}

/// A connection's buffers.
struct Conn {
    /// Bytes read and not yet used (the next head, body bytes).
    buf: BytesMut,
    /// What is about to be written.
    out: Vec<u8>,
}

impl Conn {
    /// Give the buffers back between requests, unless the client has sent
    /// (pipelined) the next request's bytes already: an idle connection
    /// holds no buffer. They go to the thread's [`Spare`] list, from which
    /// the next request to start takes them.
    fn release(&mut self) {
        let buf = self.buf.is_empty().then(|| std::mem::take(&mut self.buf));
        Spare::give_back(buf, std::mem::take(&mut self.out));
    }

    /// Wait for and parse the next request head, due as `due` says (which
    /// is taken: the wait after this one is [`Due::Next`]).
    /// `Wait::Close`: the connection is to close without an answer (closed
    /// by the client, timed out, draining while idle); `Wait::Park`: it has
    /// waited for the first byte of its next request for [`idle::PARK_AFTER`]
    /// (on a stream that parks), and is still due by then.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps each argument twice in its future"
    )]
    fn read_head<'a, S: ClientStream>(
        &'a mut self,
        shared: &'a Shared,
        io: &'a mut S,
        due: &'a mut Due,
    ) -> impl Future<Output = Result<Wait, ProxyError>> + 'a {
        // A block, not an `async fn`, as `serve`: the arguments are not
        // kept twice in the future.
        async move {
            let l = &shared.limits;
            // Scoped, so that none of this is kept in the future.
            let (mut between, mut parking, first) = {
                let due = std::mem::replace(due, Due::Next);
                let now = Instant::now();
                // Waiting for the first byte of the next request on a
                // kept-alive connection (pipelined bytes start the head at
                // once).
                let between = !matches!(due, Due::First(_)) && self.buf.is_empty();
                let deadline = match due {
                    Due::First(by) | Due::KeepAlive(by) => by,
                    Due::Next if between => now + l.keepalive_timeout.min(l.idle_timeout),
                    Due::Next => now + l.request_header_timeout.min(l.idle_timeout),
                };
                // Parked, instead of waiting here, once quiet for a while.
                let park_at = now + idle::PARK_AFTER;
                let parking = S::PARKS && between && matches!(due, Due::Next) && park_at < deadline;
                (between, parking, if parking { park_at } else { deadline })
            };
            // One timer, moved when the first byte comes. The drain's
            // notification is made before the flag is looked at, so that a
            // drain between the two is not missed.
            let mut timer = pin!(tokio::time::sleep_until(first));
            let mut drained = pin!(shared.drain_notify().notified());
            loop {
                if !self.buf.is_empty() {
                    let limits = HeadLimits::from_limits(l);
                    if let Some(head) = h1::parse_request(&self.buf, &limits)? {
                        return Ok(Wait::Head(head));
                    }
                } else if *shared.draining.borrow() {
                    return Ok(Wait::Close);
                }
                // Draining is watched only while no head has started.
                let idle = self.buf.is_empty();
                let buf = &mut self.buf;
                let woke = poll_fn(|cx| {
                    if let Poll::Ready(read) = poll_head_bytes(io, buf, cx) {
                        return Poll::Ready(Woke::Read(read));
                    }
                    // The head timeout (or the keep-alive or idle timeout,
                    // or the time to park).
                    if timer.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Woke::TimedOut);
                    }
                    if idle && drained.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Woke::Drained);
                    }
                    Poll::Pending
                })
                .await;
                match woke {
                    // The timer was set to park: the keep-alive deadline is
                    // `keepalive` after the wait began.
                    Woke::TimedOut if parking => {
                        let began = timer.deadline() - idle::PARK_AFTER;
                        let keepalive = l.keepalive_timeout.min(l.idle_timeout);
                        return Ok(Wait::Park(began + keepalive));
                    }
                    Woke::Read(Ok(0) | Err(_)) | Woke::TimedOut => return Ok(Wait::Close),
                    Woke::Read(Ok(_)) => {
                        if between {
                            between = false;
                            parking = false;
                            let by = Instant::now() + l.request_header_timeout.min(l.idle_timeout);
                            timer.as_mut().reset(by);
                        }
                    }
                    // The flag is set: looked at above.
                    Woke::Drained => {}
                }
            }
        }
    }

    /// Answer a refused head and close.
    async fn write_error<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        refused: ProxyError,
    ) -> Result<(), ()> {
        let resp = refused.into_response();
        let (parts, body) = resp.into_parts();
        let framing = encode_head(&mut self.out, &parts, &body, false, 1, true);
        let mut none = None;
        self.write_body(io, body, framing, &mut none).await?;
        io.shutdown().await.map_err(drop)
    }

    /// Write the head in `out` and the body, by `framing`; the request
    /// body's pump keeps reading meanwhile. Response bytes that are ready
    /// together go out in one write.
    async fn write_body<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        mut body: ResponseBody,
        framing: OutFraming,
        pump: &mut Option<Pump>,
    ) -> Result<(), ()> {
        if framing == OutFraming::None {
            // HEAD, 1xx, 204, 304: whatever the body holds is not sent.
            drop(body);
            return self.flush_out(io).await;
        }
        loop {
            let frame = match body.frame().now_or_never() {
                Some(frame) => frame,
                None => {
                    self.flush_out(io).await?;
                    loop {
                        match pump {
                            Some(p) if p.active() => {
                                tokio::select! {
                                    frame = body.frame() => break frame,
                                    () = p.step(io, &mut self.buf) => {}
                                }
                            }
                            _ => break body.frame().await,
                        }
                    }
                }
            };
            match frame {
                None => break,
                Some(Err(e)) => {
                    // The backend's body broke: the client sees it cut
                    // short (no last chunk) and the connection closed.
                    tracing::debug!(error = %e, "response body failed");
                    let _ = self.flush_out(io).await;
                    return Err(());
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue; // trailers are not forwarded
                    };
                    if data.is_empty() {
                        continue;
                    }
                    if framing == OutFraming::Chunked {
                        self.out
                            .extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                    }
                    if data.len() > WRITE_BATCH {
                        self.flush_out(io).await?;
                        io.write_all(&data).await.map_err(drop)?;
                    } else {
                        self.out.extend_from_slice(&data);
                    }
                    if framing == OutFraming::Chunked {
                        self.out.extend_from_slice(b"\r\n");
                    }
                    if self.out.len() > WRITE_BATCH {
                        self.flush_out(io).await?;
                    }
                }
            }
        }
        if framing == OutFraming::Chunked {
            self.out.extend_from_slice(b"0\r\n\r\n");
        }
        self.flush_out(io).await
    }

    async fn flush_out<S: AsyncWrite + Unpin>(&mut self, io: &mut S) -> Result<(), ()> {
        if !self.out.is_empty() {
            io.write_all(&self.out).await.map_err(drop)?;
            self.out.clear();
        }
        io.flush().await.map_err(drop)
    }
}

/// What a wait for a request head ended with.
enum Wait {
    Head(RequestHead),
    Close,
    /// Park the connection, due by then.
    Park(Instant),
}

/// What ended a wait for request head bytes.
enum Woke {
    Read(std::io::Result<usize>),
    TimedOut,
    Drained,
}

/// Read the next bytes of a request head into `buf`. A connection that
/// holds no buffer (idle) reads into room on the stack first and takes a
/// buffer only once bytes came; a full buffer is grown first (doubled, for
/// a head larger than [`HEAD_CHUNK`]).
fn poll_head_bytes<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<usize>> {
    if buf.capacity() == 0 {
        let mut room = [MaybeUninit::<u8>::uninit(); HEAD_CHUNK];
        let mut read = ReadBuf::uninit(&mut room);
        ready!(Pin::new(io).poll_read(cx, &mut read))?;
        let got = read.filled();
        if !got.is_empty() {
            *buf = Spare::buf();
            if buf.capacity() < got.len() {
                buf.reserve(HEAD_CHUNK);
            }
            buf.extend_from_slice(got);
        }
        return Poll::Ready(Ok(got.len()));
    }
    if buf.capacity() == buf.len() {
        buf.reserve(buf.len().max(HEAD_CHUNK));
    }
    // tokio's `read_buf` future holds nothing between polls.
    pin!(io.read_buf(buf)).poll(cx)
}

thread_local! {
    static SPARE: RefCell<Spare> = const {
        RefCell::new(Spare {
            bufs: Vec::new(),
            outs: Vec::new(),
        })
    };
}

/// Read and write buffers given back by connections of this thread that
/// went idle, up to [`SPARE_BUFFERS`] of each: what a busy thread takes and
/// gives back per request, without the allocator (with 50 busy
/// connections, a fresh 1 KiB buffer per request was 1,000 instructions of
/// malloc and free). Held per thread, not per connection: an idle
/// connection holds nothing.
struct Spare {
    bufs: Vec<BytesMut>,
    outs: Vec<Vec<u8>>,
}

impl Spare {
    /// A read buffer for a request that starts: empty, with room for a
    /// head or none. (The room left after earlier heads, as a connection's
    /// own buffer is used: its start may still be shared with them.)
    fn buf() -> BytesMut {
        SPARE
            .with_borrow_mut(|spare| spare.bufs.pop())
            .unwrap_or_default()
    }

    /// A write buffer for a response (empty; it may have room).
    fn out() -> Vec<u8> {
        SPARE
            .with_borrow_mut(|spare| spare.outs.pop())
            .unwrap_or_default()
    }

    /// Keep what a connection gives back, if there is room and it is worth
    /// keeping; free the rest.
    fn give_back(buf: Option<BytesMut>, mut out: Vec<u8>) {
        SPARE.with_borrow_mut(|spare| {
            if let Some(mut buf) =
                buf.filter(|b| (SPARE_MIN_ROOM..=SPARE_MAX_BYTES).contains(&b.capacity()))
                && spare.bufs.len() < SPARE_BUFFERS
            {
                buf.clear();
                spare.bufs.push(buf);
            }
            if (1..=SPARE_MAX_BYTES).contains(&out.capacity()) && spare.outs.len() < SPARE_BUFFERS {
                out.clear();
                spare.outs.push(out);
            }
        });
    }
}

async fn write_now<S: AsyncWrite + Unpin>(io: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    io.write_all(bytes).await?;
    io.flush().await
}

/// The request as the handler takes it: the header map is built from the
/// head's bytes, values shared with them (no copy).
fn build_request(
    head: RequestHead,
    bytes: &Bytes,
    body: LeanBody,
) -> Result<Request<RequestBody>, ProxyError> {
    // Room for the fields the handler adds (X-Forwarded-*, X-Real-IP, a
    // filter's): growing the map is a reallocation per request.
    let mut headers = HeaderMap::with_capacity(head.headers.len() + 8);
    for (name, value) in &head.headers {
        let name = HeaderName::from_bytes(&bytes[name.clone()])
            .map_err(|_| ProxyError::BadRequest("malformed header name"))?;
        let value = HeaderValue::from_maybe_shared(bytes.slice(value.clone()))
            .map_err(|_| ProxyError::BadRequest("malformed header value"))?;
        headers.append(name, value);
    }
    // An absolute-form target names the host, whatever the Host field
    // says (RFC 9112 §3.2.2): the field is replaced by its authority.
    if let Some(authority) = head.uri.authority() {
        let value = HeaderValue::from_str(authority.as_str())
            .map_err(|_| ProxyError::BadRequest("malformed Host"))?;
        headers.insert(HOST, value);
    }
    let mut req = Request::new(RequestBody::Lean(body));
    *req.method_mut() = head.method;
    *req.uri_mut() = head.uri;
    *req.version_mut() = if head.minor == 0 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    *req.headers_mut() = headers;
    Ok(req)
}

/// How a response body goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutFraming {
    /// No body (HEAD, 1xx, 204, 304, or empty with `content-length: 0`).
    None,
    /// As many bytes as the Content-Length says.
    Length,
    /// Chunked (the length is not known in advance).
    Chunked,
    /// Chunked by the backend: its chunks are written as they came
    /// ([`PooledBody::pass_chunks_through`](crate::proxy::outbound::h1_client::PooledBody::pass_chunks_through)).
    ChunkedAsIs,
    /// Until the connection closes (an HTTP/1.0 client, length unknown).
    UntilClose,
}

/// Write the response head into `out` and say how its body goes out.
fn encode_head(
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    body: &ResponseBody,
    head_request: bool,
    minor: u8,
    close: bool,
) -> OutFraming {
    if out.capacity() == 0 {
        // Given back while the connection idled.
        *out = Spare::out();
    }
    out.clear();
    out.reserve(OUT_HEAD);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut has_length = false;
    let mut has_connection = false;
    for (name, value) in &parts.headers {
        if name == TRANSFER_ENCODING {
            continue;
        }
        has_length |= name == CONTENT_LENGTH;
        has_connection |= name == CONNECTION;
        header_line(out, name.as_str().as_bytes(), value.as_bytes());
    }
    let status = parts.status;
    let bodiless = head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if bodiless {
        OutFraming::None
    } else if has_length {
        OutFraming::Length
    } else if body.is_end_stream() {
        header_line(out, b"content-length", b"0");
        OutFraming::None
    } else if let Some(n) = body.size_hint().exact() {
        header_line(out, b"content-length", n.to_string().as_bytes());
        OutFraming::Length
    } else if minor == 1 {
        header_line(out, b"transfer-encoding", b"chunked");
        OutFraming::Chunked
    } else {
        OutFraming::UntilClose
    };
    if !has_connection {
        if close || framing == OutFraming::UntilClose {
            header_line(out, b"connection", b"close");
        } else if minor == 0 {
            header_line(out, b"connection", b"keep-alive");
        }
    }
    out.extend_from_slice(b"\r\n");
    framing
}

fn header_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Reads a request body from the connection into the handler's
/// [`LeanBody`], frame by frame, as the channel has room.
struct Pump {
    tx: Option<mpsc::Sender<Result<Bytes, BoxError>>>,
    framing: PumpFraming,
    failed: bool,
    /// How long the client may send nothing while the pump waits for it.
    idle_limit: Duration,
    /// Since when the pump has waited for the client's next bytes.
    waiting_since: Option<Instant>,
}

enum PumpFraming {
    /// Bytes left of a Content-Length body.
    Length(u64),
    Chunked(ChunkedWalker),
}

impl Pump {
    /// The handler's body and, for a request that has one, its pump.
    fn for_framing(framing: Framing, idle_limit: Duration) -> (LeanBody, Option<Pump>) {
        let (framing, length) = match framing {
            Framing::None => return (LeanBody::empty(), None),
            Framing::Length(n) => (PumpFraming::Length(n), Some(n)),
            Framing::Chunked => (PumpFraming::Chunked(ChunkedWalker::default()), None),
        };
        let (tx, rx) = mpsc::channel(BODY_FRAMES);
        let pump = Pump {
            tx: Some(tx),
            framing,
            failed: false,
            idle_limit,
            waiting_since: None,
        };
        (LeanBody::new(rx, length), Some(pump))
    }

    /// Still reading the body.
    fn active(&self) -> bool {
        self.tx.is_some()
    }

    /// The body was read to its end.
    fn complete(&self) -> bool {
        !self.failed
            && match &self.framing {
                PumpFraming::Length(left) => *left == 0,
                PumpFraming::Chunked(walker) => walker.is_done(),
            }
    }

    fn fail(&mut self, why: BoxError) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.try_send(Err(why));
        }
        self.failed = true;
    }

    /// One step: read more bytes, or pass the bytes read on as a frame.
    /// Cancel-safe: bytes leave `buf` only once the channel has room.
    async fn step<S: AsyncRead + Unpin>(&mut self, io: &mut S, buf: &mut BytesMut) {
        let Some(tx) = &self.tx else {
            return std::future::pending().await;
        };
        if buf.is_empty() {
            if buf.capacity() < 1024 {
                buf.reserve(READ_CHUNK);
            }
            // The wait for the client survives this future being dropped
            // and made again (it is raced against the handler).
            let since = *self.waiting_since.get_or_insert_with(Instant::now);
            match tokio::time::timeout_at(since + self.idle_limit, io.read_buf(buf)).await {
                Err(_) => self.fail(Box::new(BodyTimedOut)),
                Ok(Ok(0) | Err(_)) => {
                    self.fail("the client closed its connection in the body".into())
                }
                Ok(Ok(_)) => self.waiting_since = None,
            }
            return;
        }
        let Ok(permit) = tx.reserve().await else {
            // The handler dropped the body: nobody reads the rest.
            self.tx = None;
            self.failed = true;
            return;
        };
        match &mut self.framing {
            PumpFraming::Length(left) => {
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                *left -= n as u64;
                permit.send(Ok(buf.split_to(n).freeze()));
                if *left == 0 {
                    self.tx = None;
                }
            }
            PumpFraming::Chunked(walker) => {
                let mut ranges: Vec<Range<usize>> = Vec::new();
                match walker.walk_with(buf, |r| ranges.push(r)) {
                    Err(e) => {
                        permit.send(Err(Box::new(e)));
                        self.tx = None;
                        self.failed = true;
                    }
                    Ok(n) => {
                        let walked = buf.split_to(n).freeze();
                        match ranges.as_slice() {
                            [] => drop(permit),
                            [one] => permit.send(Ok(walked.slice(one.clone()))),
                            many => {
                                let mut data =
                                    BytesMut::with_capacity(many.iter().map(|r| r.len()).sum());
                                for r in many {
                                    data.extend_from_slice(&walked[r.clone()]);
                                }
                                permit.send(Ok(data.freeze()));
                            }
                        }
                        if walker.is_done() {
                            self.tx = None;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_of(status: u16, headers: &[(&str, &str)], body: ResponseBody, minor: u8) -> String {
        let mut resp = http::Response::new(());
        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
        for (k, v) in headers {
            resp.headers_mut().append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let (parts, ()) = resp.into_parts();
        let mut out = Vec::new();
        let framing = encode_head(&mut out, &parts, &body, false, minor, false);
        format!("{framing:?} {}", String::from_utf8(out).unwrap())
    }

    /// The size of the future an async fn returns, without calling it.
    fn future_size<F, A, B, C, D, E, G, H, R>(_: F) -> usize
    where
        F: FnOnce(A, B, C, D, E, G, H) -> R,
    {
        std::mem::size_of::<R>()
    }

    /// A connection's task is this future, sized by its largest state: the
    /// wait for a head (one timer, the drain's notification, the read).
    /// Whatever lives across that wait is paid per connection between
    /// requests (and by every idle one for its first second, before it is
    /// parked): a request's state belongs in the boxed exchange.
    #[test]
    fn the_idle_connection_future_stays_small() {
        // 408 bytes in a test build (December 2026), when a release
        // build's task is 512 bytes; it was 1,024 before the cold state was
        // boxed (docs/performance.md, issue 23 item 6). A connection idle
        // for a second is parked and frees its task (`idle`), but a busy
        // one's wait between requests is still this.
        let size = future_size(serve::<tokio::net::TcpStream>);
        assert!(size <= 448, "serve's future grew to {size} bytes");
    }

    #[test]
    fn response_heads_say_how_the_body_ends() {
        assert_eq!(
            head_of(200, &[("content-length", "2")], ResponseBody::full("ok"), 1),
            "Length HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
        );
        assert_eq!(
            head_of(200, &[], ResponseBody::empty(), 1),
            "None HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
        );
        assert_eq!(
            head_of(200, &[], ResponseBody::full("ok"), 0),
            "Length HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\n"
        );
        assert_eq!(
            head_of(
                204,
                &[("transfer-encoding", "chunked")],
                ResponseBody::empty(),
                1
            ),
            "None HTTP/1.1 204 No Content\r\n\r\n"
        );
    }
}
