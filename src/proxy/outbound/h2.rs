//! HTTP/2 to endpoints: `appProtocol: kubernetes.io/h2c` backends and a
//! GRPCRoute's backends, in cleartext with prior knowledge, or over TLS
//! negotiated with ALPN `h2` when a BackendTLSPolicy targets the Service.
//!
//! The request keeps the `:authority` the client sent (its Host), as a
//! proxy should: a gRPC server, or any HTTP/2 server that routes by host,
//! sees the name the client asked for, not the pod's address. hyper-util's
//! pooled client takes the authority from the request URI both to connect
//! and to key its pool, so here each endpoint has a client of its own
//! whose connector always dials that endpoint: the URI carries the
//! client's authority, and the pool (one client's) holds connections to
//! that endpoint only. HTTP/2 multiplexes, so there is about one
//! connection per endpoint and authority.
//!
//! A handshake that fails (untrusted certificate, an invalid policy, a
//! backend that does not agree to `h2`) fails the request as an
//! unreachable endpoint does.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::proxy::POOL_IDLE_TIMEOUT;
use crate::proxy::body::{BoxError, UpstreamBody};
use crate::route::BackendTls;

/// How long a TLS handshake with an endpoint may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Clients kept at most; past this the cache starts afresh (endpoints come
/// and go over reloads).
const MAX_CLIENTS: usize = 4096;

/// An HTTP/2 client bound to one endpoint.
pub(crate) type H2Client = Client<EndpointConnector, UpstreamBody>;

/// The HTTP/2 clients, by endpoint and TLS setting ([`BackendTls::key`]).
#[derive(Default)]
pub(crate) struct H2Clients {
    clients: Mutex<HashMap<(SocketAddr, Option<String>), H2Client>>,
}

impl H2Clients {
    /// The client for `endpoint`, over TLS per `tls` when given.
    pub(crate) fn client(&self, endpoint: SocketAddr, tls: Option<&Arc<BackendTls>>) -> H2Client {
        let key = (endpoint, tls.map(|t| t.key.clone()));
        // A panic while holding the lock cannot leave the map inconsistent.
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(c) = clients.get(&key) {
            return c.clone();
        }
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .http2_only(true)
            .build(EndpointConnector {
                endpoint,
                tls: tls.cloned(),
            });
        clients.insert(key, client.clone());
        client
    }
}

/// Dials one endpoint whatever the URI names, then makes the TLS handshake
/// of its [`BackendTls`] (ALPN `h2`) when it has one.
#[derive(Clone)]
pub(crate) struct EndpointConnector {
    endpoint: SocketAddr,
    tls: Option<Arc<BackendTls>>,
}

impl tower_service::Service<Uri> for EndpointConnector {
    type Response = H2Io;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<H2Io, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let (endpoint, tls) = (self.endpoint, self.tls.clone());
        Box::pin(async move {
            let tcp = TcpStream::connect(endpoint).await?;
            let _ = tcp.set_nodelay(true);
            let Some(tls) = tls else {
                return Ok(H2Io::Plain(TokioIo::new(tcp)));
            };
            let config = tls.config.clone().map_err(|why| {
                io::Error::other(format!("BackendTLSPolicy {} is invalid: {why}", tls.policy))
            })?;
            let mut with_alpn = (*config).clone();
            with_alpn.alpn_protocols = vec![b"h2".to_vec()];
            let handshake =
                TlsConnector::from(Arc::new(with_alpn)).connect(tls.server_name.clone(), tcp);
            let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                })??;
            if stream.get_ref().1.alpn_protocol() != Some(b"h2".as_slice()) {
                return Err(io::Error::other(format!(
                    "the backend of BackendTLSPolicy {} did not agree to HTTP/2 (ALPN h2)",
                    tls.policy
                ))
                .into());
            }
            Ok(H2Io::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// A connection to an endpoint: cleartext or TLS.
pub(crate) enum H2Io {
    Plain(TokioIo<TcpStream>),
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Connection for H2Io {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for H2Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            H2Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            H2Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for H2Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            H2Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            H2Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            H2Io::Plain(s) => Pin::new(s).poll_flush(cx),
            H2Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            H2Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            H2Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
