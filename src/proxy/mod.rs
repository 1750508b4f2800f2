//! The proxy: accepts connections on every socket the route table names,
//! and serves each request against the table current at that moment.
//!
//! Per request: look the rule up, apply filters, choose a backend by weight,
//! choose an endpoint, forward on a pooled connection, apply response
//! filters, record metrics. The table is swapped atomically on reload;
//! connection pools are keyed by endpoint and outlive tables.
//!
//! Sockets of HTTPS listeners terminate TLS first ([`tls`]: certificate by
//! SNI, ALPN `h2`/`http/1.1`); cleartext sockets serve HTTP/1.1 and h2c
//! with prior knowledge. HTTP/1.1 upgrades (WebSocket) are passed through
//! ([`upgrade`]).
//!
//! Not supported yet: timeouts cover the time to the response headers, not
//! the streaming of the body after them.

mod body;
mod cors;
mod error;
mod filters;
mod handler;
mod retry;
mod tls;
mod upgrade;

pub use body::ResponseBody;
pub use error::{ErrorSource, ProxyError};
pub use tls::TlsConnection;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::AbortHandle;
use tokio_rustls::TlsAcceptor;

use crate::metrics::Metrics;
use crate::route::RouteTable;
use body::UpstreamBody;

/// A socket the proxy could not listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindFailure {
    pub bind: SocketAddr,
    pub error: String,
}

/// How long an idle pooled connection to an endpoint is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// What every connection and request of the proxy shares.
pub(crate) struct Shared {
    table: ArcSwap<RouteTable>,
    metrics: Arc<Metrics>,
    /// HTTP/1.1 to endpoints, pooled per endpoint address; outlives tables.
    client: Client<HttpConnector, UpstreamBody>,
    /// HTTP/2 with prior knowledge, for `appProtocol: kubernetes.io/h2c`.
    h2_client: Client<HttpConnector, UpstreamBody>,
    /// How client connections are served: HTTP/1.1 with keep-alive, or
    /// HTTP/2 with prior knowledge (h2c), detected per connection.
    server: auto::Builder<TokioExecutor>,
    /// The accept loop of each bound socket, by its configured address.
    listeners: Mutex<BTreeMap<SocketAddr, AbortHandle>>,
}

/// The running proxy. Cheap to clone.
#[derive(Clone)]
pub struct Proxy {
    shared: Arc<Shared>,
}

impl Proxy {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(connector.clone());
        let h2_client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .http2_only(true)
            .build(connector);
        let mut server = auto::Builder::new(TokioExecutor::new());
        // A timer makes hyper enforce its limit on how long a client may
        // take to send request headers.
        server.http1().timer(TokioTimer::new());
        server.http2().timer(TokioTimer::new());
        Proxy {
            shared: Arc::new(Shared {
                server,
                table: ArcSwap::from_pointee(RouteTable::default()),
                metrics,
                client,
                h2_client,
                listeners: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// Swap in `table` and make the set of listening sockets match its
    /// binds: new sockets are bound, sockets no longer named stop accepting
    /// (their open connections finish what they are doing). Returns the
    /// sockets that could not be bound; every other socket serves.
    ///
    /// Sockets the previous table already had are kept as they are, so
    /// applying tables with the same binds never rebinds.
    pub async fn apply(&self, table: RouteTable) -> Vec<BindFailure> {
        let wanted: Vec<SocketAddr> = table.binds().collect();
        self.shared.table.store(Arc::new(table));
        self.sync_listeners(&wanted)
    }

    /// The table requests are served from now.
    pub fn table(&self) -> Arc<RouteTable> {
        self.shared.table.load_full()
    }

    /// The sockets currently accepting connections.
    pub fn active_binds(&self) -> Vec<SocketAddr> {
        self.lock_listeners().keys().copied().collect()
    }

    /// Stop accepting on every socket. Connections already open finish
    /// their requests.
    pub fn shutdown(&self) {
        let mut listeners = self.lock_listeners();
        for (_, accept) in std::mem::take(&mut *listeners) {
            accept.abort();
        }
    }

    fn lock_listeners(&self) -> std::sync::MutexGuard<'_, BTreeMap<SocketAddr, AbortHandle>> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (each change is one insert or remove), so poisoning is ignored.
        self.shared
            .listeners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn sync_listeners(&self, wanted: &[SocketAddr]) -> Vec<BindFailure> {
        let mut listeners = self.lock_listeners();
        listeners.retain(|bind, accept| {
            let keep = wanted.contains(bind);
            if !keep {
                tracing::info!(%bind, "listener removed, no longer accepting");
                accept.abort();
            }
            keep
        });
        let mut failures = Vec::new();
        for &bind in wanted {
            if listeners.contains_key(&bind) {
                continue;
            }
            match listen(bind) {
                Ok(listener) => {
                    tracing::info!(%bind, "listening");
                    let shared = self.shared.clone();
                    let task = tokio::spawn(accept_loop(shared, listener, bind));
                    listeners.insert(bind, task.abort_handle());
                }
                Err(e) => {
                    tracing::warn!(%bind, error = %e, "cannot listen");
                    failures.push(BindFailure {
                        bind,
                        error: e.to_string(),
                    });
                }
            }
        }
        failures
    }
}

fn listen(bind: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if bind.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(bind)?;
    socket.listen(1024)
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, bind: SocketAddr) {
    // Built once per socket; the certificate is picked per handshake from
    // the current table, so reloads change certificates without rebinding.
    let acceptor = TlsAcceptor::from(tls::server_config(shared.clone(), bind));
    loop {
        let (stream, client) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: back off briefly
                // instead of spinning.
                tracing::warn!(%bind, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        // Whether the socket terminates TLS is read per connection: a
        // reload may turn a port's listeners from HTTP to HTTPS.
        let is_tls = shared.table.load().port(bind).is_some_and(|p| p.is_tls());
        if !is_tls {
            tokio::spawn(serve(shared, stream, None, client, bind));
            continue;
        }
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let stream =
                match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        tracing::debug!(%client, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%client, "TLS handshake timed out");
                        return;
                    }
                };
            let server_name = stream.get_ref().1.server_name().map(Arc::from);
            serve(
                shared,
                stream,
                Some(TlsConnection { server_name }),
                client,
                bind,
            )
            .await;
        });
    }
}

/// Serve the requests of one client connection (cleartext, or TLS after the
/// handshake), with upgrades allowed.
async fn serve<S>(
    shared: Arc<Shared>,
    stream: S,
    tls: Option<TlsConnection>,
    client: SocketAddr,
    bind: SocketAddr,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let for_requests = shared.clone();
    let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        let shared = for_requests.clone();
        if let Some(tls) = &tls {
            req.extensions_mut().insert(tls.clone());
        }
        async move { Ok::<_, Infallible>(handler::handle(&shared, req, client, bind).await) }
    });
    let conn = shared
        .server
        .serve_connection_with_upgrades(TokioIo::new(stream), service);
    if let Err(e) = conn.await {
        tracing::debug!(%client, error = %e, "connection ended with an error");
    }
}
