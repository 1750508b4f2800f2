//! Keep-alive HTTP/1.1 connections to cleartext endpoints, pooled per
//! endpoint address.
//!
//! hyper-util's pooled client checks a connection out under a lock keyed by
//! scheme and authority, boxes the response future, rewrites the URI, and
//! once the response is done spawns a task per request to put the
//! connection back. Here a connection is hyper's `client::conn::http1`
//! pair: its connection future runs in a task of its own (spawned once per
//! connection), and the request sender is kept in the endpoint's idle
//! stack, most recently used first. The response body ([`PooledBody`])
//! holds the sender and puts it back when the body has ended and the
//! connection is ready for another request; nothing is spawned or boxed
//! per request.
//!
//! (Polling the connection future in the request's own task instead was
//! measured too: fewer instructions, but more CPU in total, because the
//! proxy's writes to the backend and the client then come one at a time
//! instead of batched per scheduler turn, and wake the other side more
//! often. See docs/performance.md.)
//!
//! The connection task notices a close the endpoint sends while the
//! connection is idle, so a closed connection is not taken out again; a
//! request that a reused connection turned out unable to carry before any
//! of it was written is sent again on another connection, as hyper-util's
//! client does. At most [`MAX_IDLE_PER_ENDPOINT`] connections are kept idle
//! per endpoint, each for at most the idle timeout; a sweeper task drops
//! the expired and closed ones of endpoints no request visits any more.
//!
//! Upgrades (WebSocket), h2c and TLS backends are not served from here.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::{self, Either, FutureExt};
use http::header::HOST;
use http::{HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{Builder, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::body::UpstreamBody;
use super::error::UpstreamError;

/// Idle connections kept per endpoint; more are closed when they become
/// idle. It covers the concurrency the proxy itself allows a few clients
/// (HTTP/2: 100 streams per connection): below that, a burst of concurrent
/// requests closes connections that the next burst opens again (with 500
/// concurrent HTTP/2 streams, `h2load -c50 -m10`, 18% of requests opened
/// a new upstream connection at 64). Idle ones close after the idle
/// timeout all the same.
pub const MAX_IDLE_PER_ENDPOINT: usize = 1024;

/// How often the sweeper looks for expired or closed idle connections.
const SWEEP_INTERVAL: Duration = Duration::from_secs(15);

/// What sends requests on one connection (its connection future runs in
/// its own task).
type Conn = SendRequest<UpstreamBody>;

struct Idle {
    conn: Conn,
    since: Instant,
}

/// The pool: idle connections by endpoint. Outlives route tables.
pub(crate) struct Pool {
    idle: Mutex<HashMap<SocketAddr, Vec<Idle>>>,
    idle_timeout: Duration,
    builder: Builder,
    sweeper: AtomicBool,
}

impl Pool {
    pub fn new(idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Pool {
            idle: Mutex::new(HashMap::new()),
            idle_timeout,
            builder: Builder::new(),
            sweeper: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<SocketAddr, Vec<Idle>>> {
        // Each change under the lock is one push, pop or retain: a panic
        // cannot leave the map inconsistent, so poisoning is ignored.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Send `req` (origin-form URI, HTTP/1.1) to `endpoint` on an idle
    /// connection or a new one. The response body keeps the connection
    /// and returns it to the pool when it has been read to its end.
    ///
    /// The request is handed to an idle connection before the returned
    /// future is first polled, so the future holds the answer's receiver
    /// and not the request as well: futures are moved whole, and this one
    /// is part of every request's.
    pub fn send(
        self: &Arc<Self>,
        endpoint: SocketAddr,
        mut req: Request<UpstreamBody>,
    ) -> impl Future<Output = Result<Response<PooledBody>, UpstreamError>> + Send + 'static {
        if !req.headers().contains_key(HOST) {
            // hyper-util's client did this; requests from HTTP/2 clients
            // without an authority would otherwise have no Host at all.
            if let Ok(v) = HeaderValue::from_str(&endpoint.to_string()) {
                req.headers_mut().insert(HOST, v);
            }
        }
        // Combinators rather than an `async` block: one would keep the
        // request (or the sent request's future) twice.
        match self.checkout(endpoint) {
            Some(mut conn) => {
                let pool = self.clone();
                Either::Left(conn.try_send_request(req).then(move |answer| match answer {
                    Ok(resp) => {
                        Either::Left(future::ready(Ok(pool.response(endpoint, resp, conn))))
                    }
                    Err(mut e) => Either::Right(match e.take_message() {
                        // Not a byte of it was written: the idle connection
                        // had closed meanwhile. Another connection gets it.
                        Some(unsent) => {
                            Box::pin(async move { pool.send_again(endpoint, unsent).await })
                                as Pin<Box<dyn Future<Output = _> + Send>>
                        }
                        None => {
                            Box::pin(future::ready(Err(UpstreamError::exchange(e.into_error()))))
                        }
                    }),
                }))
            }
            // Boxed: the future of the common case (an idle connection)
            // stays small.
            None => {
                let pool = self.clone();
                Either::Right(Box::pin(
                    async move { pool.send_on_new(endpoint, req).await },
                ))
            }
        }
    }

    /// [`Pool::send`] after an idle connection turned out closed: the
    /// next idle ones, then a new one.
    async fn send_again(
        self: &Arc<Self>,
        endpoint: SocketAddr,
        mut req: Request<UpstreamBody>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        loop {
            let Some(mut conn) = self.checkout(endpoint) else {
                return self.send_on_new(endpoint, req).await;
            };
            match conn.try_send_request(req).await {
                Ok(resp) => return Ok(self.response(endpoint, resp, conn)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(UpstreamError::exchange(e.into_error())),
                },
            }
        }
    }

    async fn send_on_new(
        self: &Arc<Self>,
        endpoint: SocketAddr,
        req: Request<UpstreamBody>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let mut conn = self.connect(endpoint).await?;
        match conn.try_send_request(req).await {
            Ok(resp) => Ok(self.response(endpoint, resp, conn)),
            Err(e) => Err(UpstreamError::exchange(e.into_error())),
        }
    }

    fn response(
        self: &Arc<Self>,
        endpoint: SocketAddr,
        resp: Response<Incoming>,
        conn: Conn,
    ) -> Response<PooledBody> {
        let (parts, body) = resp.into_parts();
        let body = PooledBody {
            body,
            conn: Some(conn),
            pool: self.clone(),
            endpoint,
        };
        Response::from_parts(parts, body)
    }

    /// The most recently used idle connection to `endpoint` that is still
    /// open and ready.
    fn checkout(&self, endpoint: SocketAddr) -> Option<Conn> {
        let mut pool = self.lock();
        let stack = pool.get_mut(&endpoint)?;
        while let Some(idle) = stack.pop() {
            if idle.since.elapsed() >= self.idle_timeout {
                // The rest of the stack is older still.
                stack.clear();
                break;
            }
            if idle.conn.is_ready() {
                return Some(idle.conn);
            }
        }
        pool.remove(&endpoint);
        None
    }

    async fn connect(&self, endpoint: SocketAddr) -> Result<Conn, UpstreamError> {
        let tcp = TcpStream::connect(endpoint)
            .await
            .map_err(|e| UpstreamError::connect(endpoint, e))?;
        tcp.set_nodelay(true)
            .map_err(|e| UpstreamError::connect(endpoint, e))?;
        let (conn, driver) = self
            .builder
            .handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| UpstreamError::connect(endpoint, e))?;
        tokio::spawn(async move {
            if let Err(e) = driver.await {
                tracing::debug!(%endpoint, error = %e, "upstream connection failed");
            }
        });
        Ok(conn)
    }

    /// Put `conn` back if it can take another request; close it otherwise.
    fn checkin(self: &Arc<Self>, endpoint: SocketAddr, conn: Conn) {
        if !conn.is_ready() {
            return;
        }
        let idle = Idle {
            conn,
            since: Instant::now(),
        };
        {
            let mut pool = self.lock();
            let stack = pool.entry(endpoint).or_default();
            if stack.len() >= MAX_IDLE_PER_ENDPOINT {
                return;
            }
            stack.push(idle);
        }
        if !self.sweeper.load(Ordering::Relaxed) {
            self.start_sweeper();
        }
    }

    /// Start the sweeper once, on the runtime of the first check-in.
    fn start_sweeper(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.sweeper.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = Arc::downgrade(self);
        runtime.spawn(sweep(pool));
    }

    /// Drop expired and closed idle connections.
    fn sweep(&self) {
        let now = Instant::now();
        self.lock().retain(|_, stack| {
            stack.retain(|idle| {
                now.duration_since(idle.since) < self.idle_timeout && !idle.conn.is_closed()
            });
            !stack.is_empty()
        });
    }

    /// Idle connections to `endpoint` now (for tests).
    #[cfg(test)]
    fn idle_count(&self, endpoint: SocketAddr) -> usize {
        self.lock().get(&endpoint).map_or(0, Vec::len)
    }
}

async fn sweep(pool: Weak<Pool>) {
    let mut every = tokio::time::interval(SWEEP_INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        pool.sweep();
    }
}

/// A response body from a pooled connection; once it has ended the
/// connection goes back to the pool. Dropped before its end, it closes the
/// connection.
pub struct PooledBody {
    body: Incoming,
    conn: Option<Conn>,
    pool: Arc<Pool>,
    endpoint: SocketAddr,
}

impl std::fmt::Debug for PooledBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBody")
            .field("endpoint", &self.endpoint)
            .field("pooled", &self.conn.is_some())
            .finish()
    }
}

impl PooledBody {
    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.checkin(self.endpoint, conn);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        match &frame {
            Some(Ok(_)) if this.body.is_end_stream() => this.release(),
            Some(Ok(_)) => {}
            None => this.release(),
            Some(Err(_)) => this.conn = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // A body with nothing in it (HEAD, 204, 304, `Content-Length: 0`)
        // may never be polled: its connection is reusable all the same.
        if self.body.is_end_stream() {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A backend that answers each request on a connection with `ok`, and
    /// closes the connection after `per_conn` answers.
    async fn backend(per_conn: usize) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    for _ in 0..per_conn {
                        loop {
                            if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                                break;
                            }
                            let mut chunk = [0u8; 1024];
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let end = buf
                            .windows(4)
                            .position(|w| w == b"\r\n\r\n")
                            .expect("head end found above")
                            + 4;
                        buf.drain(..end);
                        let resp = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(resp).await.is_err() {
                            return;
                        }
                    }
                    // Close after the last answer.
                });
            }
        });
        (addr, accepted)
    }

    fn get() -> Request<UpstreamBody> {
        let mut req = Request::new(UpstreamBody::Empty);
        *req.uri_mut() = "/x".parse().expect("uri");
        req.headers_mut()
            .insert(HOST, HeaderValue::from_static("example.com"));
        req
    }

    async fn read(resp: Response<PooledBody>) -> Bytes {
        resp.into_body().collect().await.expect("body").to_bytes()
    }

    #[tokio::test]
    async fn reuses_one_connection_for_sequential_requests() {
        let (addr, accepted) = backend(usize::MAX).await;
        let pool = Pool::new(Duration::from_secs(90));
        for _ in 0..5 {
            let resp = pool.send(addr, get()).await.expect("answered");
            assert_eq!(read(resp).await, "ok");
            assert_eq!(pool.idle_count(addr), 1);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_backend_closed_while_idle_is_not_used() {
        let (addr, accepted) = backend(1).await;
        let pool = Pool::new(Duration::from_secs(90));
        for _ in 0..5 {
            let resp = pool.send(addr, get()).await.expect("answered");
            assert_eq!(read(resp).await, "ok");
            // Let the backend's close arrive before the next request.
            let deadline = Instant::now() + Duration::from_secs(5);
            while pool.idle_count(addr) > 0 && Instant::now() < deadline {
                pool.sweep();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn expired_connections_are_not_reused() {
        let (addr, accepted) = backend(usize::MAX).await;
        let pool = Pool::new(Duration::ZERO);
        for _ in 0..3 {
            let resp = pool.send(addr, get()).await.expect("answered");
            assert_eq!(read(resp).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        pool.sweep();
        assert_eq!(pool.idle_count(addr), 0);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_the_connection() {
        let (addr, accepted) = backend(usize::MAX).await;
        let pool = Pool::new(Duration::from_secs(90));
        let resp = pool.send(addr, get()).await.expect("answered");
        let body = resp.into_body();
        // `Content-Length: 2` not read yet: nothing is returned.
        if body.is_end_stream() {
            panic!("body of two bytes reported empty");
        }
        drop(body);
        assert_eq!(pool.idle_count(addr), 0);
        let resp = pool.send(addr, get()).await.expect("answered");
        assert_eq!(read(resp).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn connect_failures_are_marked_as_such() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let pool = Pool::new(Duration::from_secs(90));
        let err = pool.send(addr, get()).await.expect_err("nothing listens");
        assert!(err.is_connect(), "{err}");
    }
}
