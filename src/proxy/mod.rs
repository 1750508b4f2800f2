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
//! with prior knowledge. HTTP/1.1 is served by sluice's own lean loop
//! ([`h1_conn`], heads parsed in place by [`h1`]); HTTP/2 by hyper. Both
//! hand each request to the same codec-independent [`handler`]. HTTP/1.1
//! upgrades (WebSocket) are passed through ([`upgrade`]). gRPC requests
//! get their errors in gRPC terms ([`grpc`]), and rules with session
//! persistence keep a client on its endpoint ([`session`]). Sockets of TLS
//! listeners carry no HTTP: each connection is routed by its SNI to a
//! TLSRoute and relayed ([`passthrough`]).
//!
//! Every connection is held to [`ProxyLimits`]: a connection limit per
//! socket and in total, a deadline for request heads, an idle timeout,
//! head and URI sizes, HTTP/2 stream and flood limits ([`conn`]). On
//! shutdown the proxy stops accepting and drains: open connections finish
//! their requests within the drain period.
//!
//! Not supported yet: timeouts cover the time to the response headers, not
//! the streaming of the body after them.

mod body;
mod conn;
mod cors;
mod error;
mod filters;
mod forwarded;
mod grpc;
pub mod h1;
mod h1_client;
mod h1_conn;
mod h2;
mod handler;
mod limits;
mod outliers;
mod passthrough;
mod pool;
mod replay;
mod retry;
mod session;
mod tls;
mod upgrade;
mod upstream;

pub use body::ResponseBody;
pub use error::{ErrorSource, ProxyError, UpstreamError};
pub use forwarded::{Cidr, ForwardedTrust};
pub use limits::ProxyLimits;
pub use tls::TlsConnection;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::AbortHandle;
use tokio_rustls::TlsAcceptor;

use crate::metrics::Metrics;
use crate::route::{EndpointReport, Outliers, RouteTable};
use body::RequestBody;
use conn::{ClientSlot, FloodLimits, InFlight, PerClient, TrackedBody, Watched};

/// What holds a client connection's places under the connection limits:
/// per socket, in total, and per client address (when limited).
type Permits = (
    OwnedSemaphorePermit,
    OwnedSemaphorePermit,
    Option<ClientSlot>,
);

/// Whether the proxy refuses a request hyper's HTTP/1 server parsed, before
/// routing it: the limits (target length, `_` in names) and the framing and
/// Host checks hyper leaves to it. The reference of the differential fuzz
/// target (`crate::fuzzing::h1_framing`).
pub(crate) fn refuses_parsed_head<B>(limits: &ProxyLimits, req: &hyper::Request<B>) -> bool {
    limits::refuse(limits, req).is_some() || handler::check_request_head(req).is_err()
}

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
    /// HTTP/1.1 to endpoints (cleartext, and TLS per BackendTLSPolicy),
    /// pooled per endpoint address and TLS setting; outlives tables.
    pool: Arc<pool::Pool>,
    /// HTTP/2 (`appProtocol: kubernetes.io/h2c`, GRPCRoute backends), one
    /// client per endpoint; outlives tables.
    h2: Arc<h2::H2Clients>,
    /// How client connections are served: HTTP/1.1 with keep-alive, or
    /// HTTP/2 with prior knowledge (h2c), detected per connection.
    server: auto::Builder<TokioExecutor>,
    /// The accept loop of each bound socket, by its configured address.
    listeners: Mutex<BTreeMap<SocketAddr, AbortHandle>>,
    limits: ProxyLimits,
    /// One permit per open client connection, across all sockets.
    connections: Arc<Semaphore>,
    /// Open connections per client address (when limited).
    per_client: Arc<PerClient>,
    /// Outlier ejection and the overload cap: per backend and endpoint,
    /// outlives tables.
    health: Arc<outliers::Health>,
    /// Set once on shutdown: every connection finishes what it is doing
    /// and closes.
    draining: watch::Sender<bool>,
}

/// The running proxy. Cheap to clone.
#[derive(Clone)]
pub struct Proxy {
    shared: Arc<Shared>,
}

impl Proxy {
    /// A proxy with the default [`ProxyLimits`].
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self::with_limits(metrics, ProxyLimits::default())
    }

    pub fn with_limits(metrics: Arc<Metrics>, mut limits: ProxyLimits) -> Self {
        limits.max_connections = limits.max_connections.min(Semaphore::MAX_PERMITS);
        limits.max_connections_per_listener = limits
            .max_connections_per_listener
            .min(Semaphore::MAX_PERMITS);
        let mut server = auto::Builder::new(TokioExecutor::new());
        // hyper's read buffer bounds the request head: a head that does not
        // fit gets 431. (It also caps how much of a body is read ahead.)
        server
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.request_header_timeout)
            .max_buf_size(
                limits
                    .max_request_header_bytes
                    .max(limits::MIN_HTTP1_BUFFER),
            )
            .max_headers(limits.max_request_headers);
        server
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.http2_max_concurrent_streams)
            .initial_stream_window_size(limits.http2_stream_window)
            .initial_connection_window_size(limits.http2_connection_window)
            .max_header_list_size(
                u32::try_from(limits.max_request_header_bytes).unwrap_or(u32::MAX),
            );
        Proxy {
            shared: Arc::new(Shared {
                server,
                table: ArcSwap::from_pointee(RouteTable::default()),
                metrics: metrics.clone(),
                pool: pool::Pool::new(POOL_IDLE_TIMEOUT),
                h2: Default::default(),
                listeners: Mutex::new(BTreeMap::new()),
                connections: Arc::new(Semaphore::new(limits.max_connections)),
                per_client: Arc::default(),
                health: outliers::Health::new(Outliers::new(limits.outliers), metrics.clone()),
                limits,
                draining: watch::Sender::new(false),
            }),
        }
    }

    /// The limits every connection is held to.
    pub fn limits(&self) -> &ProxyLimits {
        &self.shared.limits
    }

    /// Client connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.limits.max_connections - self.shared.connections.available_permits()
    }

    /// Graceful shutdown: stop accepting, let every open connection finish
    /// its requests in flight (idle ones close at once, HTTP/2 ones get
    /// GOAWAY), and wait for them for up to the drain period. Returns the
    /// number of connections still open when the period ended.
    pub async fn drain(&self) -> usize {
        self.shutdown();
        self.shared.draining.send_replace(true);
        let deadline = tokio::time::Instant::now() + self.shared.limits.drain_timeout;
        loop {
            let open = self.open_connections();
            if open == 0 {
                return 0;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(open, "drain period over; closing the remaining connections");
                return open;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
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
        // Endpoint state of backends and endpoints gone from the tables
        // is forgotten, unless an ejection is still worth remembering.
        self.shared.health.sweep();
        self.sync_listeners(&wanted)
    }

    /// The endpoints ejected now or not long ago, and those failing
    /// (admin `/endpoints`).
    pub fn endpoint_report(&self) -> Vec<EndpointReport> {
        self.shared.health.outliers.report()
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
    let per_listener = Arc::new(Semaphore::new(shared.limits.max_connections_per_listener));
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
        // Over a limit: close at once (the client sees the connection
        // closed before any response); open connections are untouched.
        let Ok(listener_permit) = per_listener.clone().try_acquire_owned() else {
            tracing::debug!(%bind, %client, "listener connection limit reached; closing");
            continue;
        };
        let Ok(total_permit) = shared.connections.clone().try_acquire_owned() else {
            tracing::debug!(%bind, %client, "connection limit reached; closing");
            continue;
        };
        let per_client = match shared.limits.max_connections_per_client {
            0 => None,
            max => match shared.per_client.admit(client.ip(), max) {
                Some(slot) => Some(slot),
                None => {
                    tracing::debug!(%bind, %client, "connection limit per client reached; closing");
                    continue;
                }
            },
        };
        let permits = (listener_permit, total_permit, per_client);
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        // Whether the socket terminates TLS is read per connection: a
        // reload may turn a port's listeners from HTTP to HTTPS (or TLS).
        let (is_tls, is_stream) = shared
            .table
            .load()
            .port(bind)
            .map_or((false, false), |p| (p.is_tls(), p.is_stream()));
        if is_stream {
            // TLS listeners: routed by SNI, relayed (passthrough.rs).
            tokio::spawn(passthrough::serve(shared, stream, client, bind, permits));
            continue;
        }
        if !is_tls {
            tokio::spawn(serve_cleartext(shared, stream, client, bind, permits));
            continue;
        }
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            // Boxed: the handshake's future is freed once it is done, instead
            // of sizing the connection's task for the connection's whole life
            // (3.7 KB more per idle TLS connection, measured with DHAT).
            let handshake = Box::pin(acceptor.accept(stream));
            let stream = match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, handshake).await {
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
            let tls = Some(TlsConnection { server_name });
            if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                // A task of its own, as HTTP/1.1's below.
                tokio::spawn(serve(shared, stream, tls, client, bind, permits));
            } else {
                let head_by = tokio::time::Instant::now() + shared.limits.request_header_timeout;
                // A task of its own: this one (the handshake's) ends, and
                // the idle connection's task is no larger than its loop.
                let peer = handler::Peer::new(client);
                let h1 = h1_conn::serve(shared, stream, tls, peer, bind, permits, Some(head_by));
                tokio::spawn(h1);
            }
        });
    }
}

/// Serve a cleartext connection: HTTP/2 with prior knowledge (h2c) through
/// hyper, anything else on the lean HTTP/1.1 path. The first bytes are
/// peeked, not read, so either gets them all.
async fn serve_cleartext(
    shared: Arc<Shared>,
    stream: tokio::net::TcpStream,
    client: SocketAddr,
    bind: SocketAddr,
    permits: Permits,
) {
    let deadline = tokio::time::Instant::now() + shared.limits.request_header_timeout;
    let mut draining = shared.draining.subscribe();
    let h2 = tokio::select! {
        h2 = starts_with_h2_preface(&stream, deadline) => h2,
        // A connection that has sent nothing yet is idle: close it.
        _ = draining.wait_for(|d| *d) => return,
    };
    // Either protocol's connection is a task of its own, not awaited here:
    // this future's arguments and the peek would stay in the connection's
    // task for its whole life (500 bytes per idle HTTP/1.1 connection).
    if h2 {
        tokio::spawn(serve(shared, stream, None, client, bind, permits));
    } else {
        // The first head is due by the same deadline as the first bytes.
        let peer = handler::Peer::new(client);
        let h1 = h1_conn::serve(shared, stream, None, peer, bind, permits, Some(deadline));
        tokio::spawn(h1);
    }
}

/// Whether the client's first bytes start the HTTP/2 preface (`PRI`, a
/// method nothing else uses). `false` as soon as they cannot, or when the
/// connection closes or sends nothing before `deadline` (the HTTP/1.1 loop
/// then sees the same).
async fn starts_with_h2_preface(
    stream: &tokio::net::TcpStream,
    deadline: tokio::time::Instant,
) -> bool {
    const START: &[u8; 3] = b"PRI";
    let mut first = [0u8; 3];
    loop {
        match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
            Ok(Ok(n)) if n > 0 => {
                if first[..n] != START[..n] {
                    return false;
                }
                if n == START.len() {
                    return true;
                }
                // `P` or `PR` so far (a POST or PUT could still follow).
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            _ => return false,
        }
    }
}

/// Serve the requests of one HTTP/2 client connection (h2c, or TLS with
/// ALPN `h2`) through hyper, until the client closes it, it has been idle
/// too long, or the proxy drains. `_permits` hold its places under the
/// connection limits. (HTTP/1.1 connections are served by
/// [`h1_conn::serve`]; hyper's auto server still detects the version.)
async fn serve<S>(
    shared: Arc<Shared>,
    stream: S,
    tls: Option<TlsConnection>,
    client: SocketAddr,
    bind: SocketAddr,
    _permits: Permits,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let in_flight = InFlight::new();
    let for_requests = shared.clone();
    let requests = in_flight.clone();
    let peer = handler::Peer::new(client);
    let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        let guard = requests.begin();
        let shared = for_requests.clone();
        let peer = peer.clone();
        if let Some(tls) = &tls {
            req.extensions_mut().insert(tls.clone());
        }
        async move {
            let resp = match limits::refuse(&shared.limits, &req) {
                Some(refused) => {
                    if let Some(reason) = refused.refusal_reason() {
                        shared.metrics.record_refusal(reason);
                    }
                    refused.into_response()
                }
                None => handler::handle(&shared, req.map(RequestBody::Hyper), &peer, bind).await,
            };
            Ok::<_, Infallible>(resp.map(|body| TrackedBody::new(body, guard)))
        }
    });
    let flood = FloodLimits {
        max_control_frames: shared.limits.http2_max_control_frames,
        reset_streams_threshold: shared.limits.http2_reset_streams_threshold,
    };
    let conn = shared
        .server
        .serve_connection_with_upgrades(TokioIo::new(Watched::new(stream, flood)), service);
    tokio::pin!(conn);
    let mut draining = shared.draining.subscribe();
    let mut closing = false;
    loop {
        tokio::select! {
            // The connection first: it is what wakes this task for nearly
            // every request, and its end ends the loop.
            biased;
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(%client, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = in_flight.idle_for(shared.limits.idle_timeout), if !closing => {
                tracing::debug!(%client, "idle timeout; closing the connection");
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = draining.wait_for(|d| *d), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
