//! TLS to backends: what a BackendTLSPolicy asks of the proxy.
//!
//! A backend whose [`EndpointSet`](crate::route::EndpointSet) carries a
//! [`BackendTls`] is reached over TLS: the connection to the endpoint is
//! made, then the TLS handshake with `validation.hostname` as SNI, the
//! backend's certificate verified against the policy's CAs, and the
//! Gateway's client certificate presented when it has one. Requests are
//! HTTP/1.1 over pooled keep-alive connections, as to cleartext backends.
//!
//! One pooled client per distinct TLS setting ([`BackendTls::key`]), kept
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

/// The pooled TLS clients, by [`BackendTls::key`].
#[derive(Default)]
pub(crate) struct BackendTlsClients {
    clients: Mutex<HashMap<String, Client<BackendTlsConnector, UpstreamBody>>>,
}

impl BackendTlsClients {
    /// The client for `tls`, made on first use.
    pub(crate) fn client(
        &self,
        tls: &Arc<BackendTls>,
    ) -> Client<BackendTlsConnector, UpstreamBody> {
        // A panic while holding the lock cannot leave the map inconsistent.
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(c) = clients.get(&tls.key) {
            return c.clone();
        }
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(BackendTlsConnector {
                http,
                tls: tls.clone(),
            });
        clients.insert(tls.key.clone(), client.clone());
        client
    }
}

/// Connects to the endpoint named by the request URI, then makes the TLS
/// handshake of one [`BackendTls`].
#[derive(Clone)]
pub(crate) struct BackendTlsConnector {
    http: HttpConnector,
    tls: Arc<BackendTls>,
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
        let tcp = self.http.call(dst);
        Box::pin(async move {
            let config = tls.config.clone().map_err(|why| {
                io::Error::other(format!("BackendTLSPolicy {} is invalid: {why}", tls.policy))
            })?;
            let stream: TcpStream = tcp.await?.into_inner();
            let handshake = TlsConnector::from(config).connect(tls.server_name.clone(), stream);
            let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                })??;
            Ok(TlsIo(TokioIo::new(stream)))
        })
    }
}

/// A TLS connection to an endpoint, as the pooled client drives it.
pub(crate) struct TlsIo(TokioIo<TlsStream<TcpStream>>);

impl Connection for TlsIo {
    fn connected(&self) -> Connected {
        Connected::new()
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
