//! TLS to backends: what a BackendTLSPolicy asks of the proxy.
//!
//! A backend whose [`EndpointSet`](crate::route::EndpointSet) carries a
//! [`BackendTls`] is reached over TLS: the connection to the endpoint is
//! made, then the TLS handshake with `validation.hostname` as SNI, the
//! backend's certificate verified against the policy's CAs, and the
//! Gateway's client certificate presented when it has one. Requests are
//! HTTP/1.1 over pooled keep-alive connections, as to cleartext backends;
//! a GRPCRoute's backends get HTTP/2, offered with ALPN `h2` (a backend
//! that does not take it fails the handshake's protocol check).
//!
//! One pooled client per distinct TLS setting ([`BackendTls::key`]) and
//! HTTP version, kept
//! across route tables like the cleartext pool. A handshake that fails (an
//! untrusted or misnamed certificate, an invalid policy) fails the request
//! as an unreachable endpoint does: 502.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::POOL_IDLE_TIMEOUT;
use super::body::{BoxError, UpstreamBody};
use crate::route::BackendTls;

/// How long a TLS handshake with a backend may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Distinct settings kept at most; past this the cache starts afresh
/// (settings that changed many times over reloads are not kept forever).
const MAX_CLIENTS: usize = 256;

/// The pooled TLS clients, by [`BackendTls::key`] and HTTP/2 or not.
#[derive(Default)]
pub(crate) struct BackendTlsClients {
    clients: Mutex<HashMap<(String, bool), Client<BackendTlsConnector, UpstreamBody>>>,
}

impl BackendTlsClients {
    /// The client for `tls` (speaking HTTP/2 when `h2`), made on first use.
    pub(crate) fn client(
        &self,
        tls: &Arc<BackendTls>,
        h2: bool,
    ) -> Client<BackendTlsConnector, UpstreamBody> {
        // A panic while holding the lock cannot leave the map inconsistent.
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (tls.key.clone(), h2);
        if let Some(c) = clients.get(&key) {
            return c.clone();
        }
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .http2_only(h2)
            .build(BackendTlsConnector {
                http,
                tls: tls.clone(),
                h2,
            });
        clients.insert(key, client.clone());
        client
    }
}

/// Connects to the endpoint named by the request URI, then makes the TLS
/// handshake of one [`BackendTls`].
#[derive(Clone)]
pub(crate) struct BackendTlsConnector {
    http: HttpConnector,
    tls: Arc<BackendTls>,
    /// Offer ALPN `h2` and require it.
    h2: bool,
}

impl tower_service::Service<Uri> for BackendTlsConnector {
    type Response = TlsIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<TlsIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let tls = self.tls.clone();
        let h2 = self.h2;
        let tcp = self.http.call(dst);
        Box::pin(async move {
            let mut config = tls.config.clone().map_err(|why| {
                io::Error::other(format!("BackendTLSPolicy {} is invalid: {why}", tls.policy))
            })?;
            if h2 {
                let mut with_alpn = (*config).clone();
                with_alpn.alpn_protocols = vec![b"h2".to_vec()];
                config = Arc::new(with_alpn);
            }
            let stream: TcpStream = tcp.await?.into_inner();
            let handshake = TlsConnector::from(config).connect(tls.server_name.clone(), stream);
            let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                })??;
            if h2 && stream.get_ref().1.alpn_protocol() != Some(b"h2".as_slice()) {
                return Err(io::Error::other(format!(
                    "the backend of BackendTLSPolicy {} did not agree to HTTP/2 (ALPN h2)",
                    tls.policy
                ))
                .into());
            }
            Ok(TlsIo(TokioIo::new(stream), h2))
        })
    }
}

/// A TLS connection to an endpoint, as the pooled client drives it, and
/// whether it negotiated HTTP/2.
pub(crate) struct TlsIo(TokioIo<TlsStream<TcpStream>>, bool);

impl Connection for TlsIo {
    fn connected(&self) -> Connected {
        if self.1 {
            Connected::new().negotiated_h2()
        } else {
            Connected::new()
        }
    }
}

impl hyper::rt::Read for TlsIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TlsIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
}
