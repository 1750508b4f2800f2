//! Keep-alive HTTP/1.1 connections to endpoints, cleartext or TLS, pooled
//! per endpoint address (and TLS setting).
//!
//! A connection is just the socket and its read buffer ([`Conn`]): no task
//! drives it. The request's own task writes the request and reads the
//! response on it ([`super::h1_client`]); the response body owns it while
//! it streams and puts it back here when the body has ended and the
//! connection may carry another request. Idle connections are kept most
//! recently used first, at most [`MAX_IDLE_PER_ENDPOINT`] per endpoint,
//! each for at most the idle timeout.
//!
//! Nobody reads an idle connection, so a close from the endpoint is seen
//! when the connection is taken out: a connection whose socket has become
//! readable while idle (the endpoint closed it, or sent bytes nobody asked
//! for) is dropped then. A close that arrives in the moment between that
//! check and the request is caught by the exchange, which sends a request
//! it can send again on a new connection. A sweeper task drops expired and
//! closed idle connections of endpoints no request visits any more.
//!
//! TLS to backends is what a BackendTLSPolicy asks: an endpoint whose
//! [`EndpointSet`](crate::route::EndpointSet) carries a [`BackendTls`] is
//! reached over TLS, `validation.hostname` sent as SNI, the backend's
//! certificate verified against the policy's CAs, the Gateway's client
//! certificate presented when it has one; no ALPN is offered (HTTP/1.1).
//! Its connections are pooled apart, per setting ([`BackendTls::key`]). A
//! handshake that fails (an untrusted or misnamed certificate, an invalid
//! policy) fails the request as a refused connection does: 502, and a
//! connect failure to the rule's retry policy.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::FastMap;
use crate::proxy::error::UpstreamError;
use crate::route::BackendTls;

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

/// How long a TLS handshake with a backend may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Which connections may carry a request: the endpoint, and the TLS
/// settings (a BackendTLSPolicy's [`BackendTls::key`]) or none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub endpoint: SocketAddr,
    pub tls: Option<Arc<str>>,
}

/// A connection's transport.
pub(crate) enum Io {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// One connection to an endpoint.
pub(crate) struct Conn {
    pub io: Io,
    /// Bytes read and not used yet.
    pub buf: BytesMut,
    pub key: Key,
    /// It carried a request before this one (so it may have been closed
    /// by the endpoint while idle).
    pub reused: bool,
}

impl Conn {
    /// Whether the endpoint closed the idle connection (or sent something
    /// unasked): the socket is readable. Never waits; reads only when the
    /// runtime saw the socket become readable.
    fn closed_while_idle(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        !matches!(
            Pin::new(&mut self.io).poll_read(&mut cx, &mut buf),
            Poll::Pending
        )
    }
}

struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

/// The pool: idle connections by [`Key`]. Outlives route tables.
pub(crate) struct Pool {
    idle: Mutex<FastMap<Key, Vec<Idle>>>,
    idle_timeout: Duration,
    sweeper: AtomicBool,
}

impl Pool {
    pub fn new(idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Pool {
            idle: Mutex::new(FastMap::default()),
            idle_timeout,
            sweeper: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, FastMap<Key, Vec<Idle>>> {
        // Each change under the lock is one push, pop or retain: a panic
        // cannot leave the map inconsistent, so poisoning is ignored.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used idle connection for `key` that is still
    /// open.
    pub fn checkout(&self, key: &Key) -> Option<Box<Conn>> {
        let mut pool = self.lock();
        let stack = pool.get_mut(key)?;
        while let Some(mut idle) = stack.pop() {
            if idle.since.elapsed() >= self.idle_timeout {
                // The rest of the stack is older still.
                stack.clear();
                break;
            }
            if !idle.conn.closed_while_idle() {
                idle.conn.reused = true;
                return Some(idle.conn);
            }
        }
        pool.remove(key);
        None
    }

    /// A new connection for `key`: TCP, then TLS as `tls` says.
    pub async fn connect(key: &Key, tls: Option<&BackendTls>) -> Result<Box<Conn>, UpstreamError> {
        let endpoint = key.endpoint;
        let tcp = TcpStream::connect(endpoint)
            .await
            .map_err(|e| UpstreamError::connect(endpoint, e))?;
        tcp.set_nodelay(true)
            .map_err(|e| UpstreamError::connect(endpoint, e))?;
        let io = match tls {
            None => Io::Tcp(tcp),
            Some(tls) => {
                let config = tls.config.clone().map_err(|why| {
                    UpstreamError::connect(
                        endpoint,
                        io::Error::other(format!(
                            "BackendTLSPolicy {} is invalid: {why}",
                            tls.policy
                        )),
                    )
                })?;
                let handshake = TlsConnector::from(config).connect(tls.server_name.clone(), tcp);
                let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
                    .await
                    .map_err(|_| {
                        io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                    })
                    .and_then(|r| r)
                    .map_err(|e| {
                        tracing::debug!(policy = %tls.policy, error = %e, "TLS backend unreachable");
                        UpstreamError::connect(endpoint, e)
                    })?;
                Io::Tls(Box::new(stream))
            }
        };
        Ok(Box::new(Conn {
            io,
            buf: BytesMut::new(),
            key: key.clone(),
            reused: false,
        }))
    }

    /// Keep `conn` for another request (its exchange ended cleanly).
    pub fn checkin(self: &Arc<Self>, conn: Box<Conn>) {
        if !conn.buf.is_empty() {
            // Bytes beyond the response: nothing on it can be trusted.
            return;
        }
        {
            let mut pool = self.lock();
            let stack = pool.entry(conn.key.clone()).or_default();
            if stack.len() >= MAX_IDLE_PER_ENDPOINT {
                return;
            }
            stack.push(Idle {
                conn,
                since: Instant::now(),
            });
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
            stack.retain_mut(|idle| {
                now.duration_since(idle.since) < self.idle_timeout && !idle.conn.closed_while_idle()
            });
            !stack.is_empty()
        });
    }

    /// Idle connections for `key` now (for tests).
    #[cfg(test)]
    pub fn idle_count(&self, key: &Key) -> usize {
        self.lock().get(key).map_or(0, Vec::len)
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::body::UpstreamBody;
    use crate::proxy::outbound::h1_client::{self, PooledBody};
    use bytes::Bytes;
    use http::header::HOST;
    use http::{HeaderValue, Request, Response};
    use http_body::Body;
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

    fn key(endpoint: SocketAddr) -> Key {
        Key {
            endpoint,
            tls: None,
        }
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
            let resp = h1_client::send(&pool, addr, None, get())
                .await
                .expect("answered");
            assert_eq!(read(resp).await, "ok");
            assert_eq!(pool.idle_count(&key(addr)), 1);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_backend_closed_while_idle_is_not_used() {
        let (addr, accepted) = backend(1).await;
        let pool = Pool::new(Duration::from_secs(90));
        for _ in 0..5 {
            let resp = h1_client::send(&pool, addr, None, get())
                .await
                .expect("answered");
            assert_eq!(read(resp).await, "ok");
            // Let the backend's close arrive before the next request.
            let deadline = Instant::now() + Duration::from_secs(5);
            while pool.idle_count(&key(addr)) > 0 && Instant::now() < deadline {
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
            let resp = h1_client::send(&pool, addr, None, get())
                .await
                .expect("answered");
            assert_eq!(read(resp).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        pool.sweep();
        assert_eq!(pool.idle_count(&key(addr)), 0);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_the_connection() {
        let (addr, accepted) = backend(usize::MAX).await;
        let pool = Pool::new(Duration::from_secs(90));
        let resp = h1_client::send(&pool, addr, None, get())
            .await
            .expect("answered");
        let body = resp.into_body();
        // `Content-Length: 2` not read yet: nothing is returned.
        if body.is_end_stream() {
            panic!("body of two bytes reported empty");
        }
        drop(body);
        assert_eq!(pool.idle_count(&key(addr)), 0);
        let resp = h1_client::send(&pool, addr, None, get())
            .await
            .expect("answered");
        assert_eq!(read(resp).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn connect_failures_are_marked_as_such() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let pool = Pool::new(Duration::from_secs(90));
        let err = h1_client::send(&pool, addr, None, get())
            .await
            .expect_err("nothing listens");
        assert!(err.is_connect(), "{err}");
    }
}
