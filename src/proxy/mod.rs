//! The proxy: accepts connections on every socket the route table names,
//! and serves each request against the table current at that moment.
//!
//! Per request: look the rule up, apply filters, choose a backend by weight,
//! choose an endpoint, forward on a pooled connection, apply response
//! filters, record metrics. The table is swapped atomically on reload;
//! connection pools are keyed by endpoint and outlive tables.
//!
//! The proxy is laid out by direction: [`inbound`] accepts and reads
//! client connections, [`request`] is what happens to one request, and
//! [`outbound`] carries it to an endpoint. The wire pieces both sides
//! share stay here: HTTP/1.1 framing ([`h1`]), bodies ([`body`]), the one
//! error type ([`error`]), the limits ([`ProxyLimits`]) and upgraded
//! connections, spliced client to backend ([`upgrade`]).
//!
//! Sockets of HTTPS listeners terminate TLS first ([`inbound::tls`]:
//! certificate by SNI, ALPN `h2`/`http/1.1`); cleartext sockets serve
//! HTTP/1.1 and h2c with prior knowledge. HTTP/1.1 is served by sluice's
//! own lean loop ([`inbound::h1_conn`], heads parsed in place by [`h1`]);
//! HTTP/2 by hyper ([`inbound::h2_conn`]). Both hand each request to the
//! same codec-independent [`request::handler`]. HTTP/1.1 upgrades
//! (WebSocket) are passed through ([`upgrade`]). gRPC requests get their
//! errors in gRPC terms ([`request::grpc`]), and rules with session
//! persistence keep a client on its endpoint ([`request::session`]).
//! Sockets of TLS listeners carry no HTTP: each connection is routed by
//! its SNI to a TLSRoute and relayed ([`inbound::passthrough`]).
//!
//! Every connection is held to [`ProxyLimits`]: a connection limit per
//! socket and in total, a deadline for request heads, an idle timeout,
//! head and URI sizes, HTTP/2 stream and flood limits ([`inbound::conn`]).
//! On shutdown the proxy stops accepting and drains: open connections
//! finish their requests within the drain period.
//!
//! With [`ProxyLimits::workers`] set (the `sluice` executable: one per
//! core), client connections are served thread per core ([`workers`]):
//! each worker accepts on every socket and keeps its connections, their
//! timers and its own pool of backend connections on its own thread.
//!
//! Not supported yet: timeouts cover the time to the response headers, not
//! the streaming of the body after them.

mod body;
mod error;
pub mod h1;
mod inbound;
mod limits;
mod outbound;
mod request;
mod upgrade;
mod workers;

pub use body::ResponseBody;
pub use error::{ErrorSource, ProxyError, UpstreamError};
pub use inbound::tls::TlsConnection;
pub use limits::ProxyLimits;
pub use request::forwarded::{Cidr, ForwardedTrust};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::AbortHandle;

use crate::metrics::Metrics;
use crate::route::{EndpointReport, Outliers, RouteTable};
use inbound::accept::{accept_loop, listen};
use inbound::conn::PerClient;
use outbound::{h2, pool};
use request::{handler, outliers};

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
    /// pooled per endpoint address and TLS setting; outlives tables. One
    /// pool per worker (a connection is registered with the reactor of
    /// the thread that opened it), the first for threads that are none.
    pools: Box<[Arc<pool::Pool>]>,
    /// HTTP/2 (`appProtocol: kubernetes.io/h2c`, GRPCRoute backends), one
    /// client per endpoint; outlives tables.
    h2: Arc<h2::H2Clients>,
    /// How client connections are served: HTTP/1.1 with keep-alive, or
    /// HTTP/2 with prior knowledge (h2c), detected per connection.
    server: auto::Builder<TokioExecutor>,
    /// The accept loops of each bound socket (one per worker, or one),
    /// by its configured address.
    listeners: Mutex<BTreeMap<SocketAddr, Vec<AbortHandle>>>,
    /// The threads serving client connections, when there are workers;
    /// otherwise connections are served on the runtime that applies
    /// tables.
    workers: Option<workers::Workers>,
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
    /// Wakes idle HTTP/1.1 connections when `draining` is set: a
    /// `Notified` is half the size of a watch's `changed()` in each idle
    /// connection's task. One per worker thread (by its index), as the
    /// watch spreads its waiters, so that threads do not take one lock.
    drain_notify: [Notify; DRAIN_NOTIFIES],
    /// Idle HTTP/1.1 connections parked off their tasks, per worker.
    idle: inbound::idle::IdleTables,
}

/// How many [`Shared::drain_notify`] there are.
const DRAIN_NOTIFIES: usize = 8;

impl Shared {
    /// What wakes this thread's idle HTTP/1.1 connections on drain.
    fn drain_notify(&self) -> &Notify {
        &self.drain_notify[workers::current() % DRAIN_NOTIFIES]
    }

    /// The pool of connections to endpoints of the calling thread's
    /// worker.
    pub(crate) fn pool(&self) -> &Arc<pool::Pool> {
        self.pools.get(workers::current()).unwrap_or(&self.pools[0])
    }
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

    /// A proxy held to `limits`. With `limits.workers` above 0 it starts
    /// that many worker threads; when they cannot be started it says so
    /// and serves on the caller's runtime.
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
        let workers = match limits.workers {
            0 => None,
            n => match workers::Workers::start(n) {
                Ok(workers) => Some(workers),
                Err(e) => {
                    tracing::warn!(workers = n, error = %e, "cannot start the proxy's worker threads; serving on the main runtime");
                    None
                }
            },
        };
        let worker_count = workers.as_ref().map_or(0, |w| w.handles().len());
        let pools = (0..=worker_count)
            .map(|_| pool::Pool::new(POOL_IDLE_TIMEOUT))
            .collect();
        Proxy {
            shared: Arc::new(Shared {
                server,
                table: ArcSwap::from_pointee(RouteTable::default()),
                metrics: metrics.clone(),
                pools,
                workers,
                h2: Default::default(),
                listeners: Mutex::new(BTreeMap::new()),
                connections: Arc::new(Semaphore::new(limits.max_connections)),
                per_client: Arc::default(),
                health: outliers::Health::new(Outliers::new(limits.outliers), metrics.clone()),
                limits,
                draining: watch::Sender::new(false),
                drain_notify: Default::default(),
                idle: inbound::idle::IdleTables::new(worker_count),
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

    /// Idle HTTP/1.1 connections parked now (each waiting for its next
    /// request without a task of its own).
    pub fn parked_connections(&self) -> usize {
        self.shared.idle.parked()
    }

    /// Graceful shutdown: stop accepting, let every open connection finish
    /// its requests in flight (idle ones close at once, HTTP/2 ones get
    /// GOAWAY), and wait for them for up to the drain period. Returns the
    /// number of connections still open when the period ended.
    pub async fn drain(&self) -> usize {
        self.shutdown();
        self.shared.draining.send_replace(true);
        for notify in &self.shared.drain_notify {
            notify.notify_waiters();
        }
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
        for accept in std::mem::take(&mut *listeners).into_values().flatten() {
            accept.abort();
        }
    }

    fn lock_listeners(&self) -> std::sync::MutexGuard<'_, BTreeMap<SocketAddr, Vec<AbortHandle>>> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (each change is one insert or remove), so poisoning is ignored.
        self.shared
            .listeners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn sync_listeners(&self, wanted: &[SocketAddr]) -> Vec<BindFailure> {
        let mut listeners = self.lock_listeners();
        listeners.retain(|bind, accepts| {
            let keep = wanted.contains(bind);
            if !keep {
                tracing::info!(%bind, "listener removed, no longer accepting");
                accepts.iter().for_each(AbortHandle::abort);
            }
            keep
        });
        let mut failures = Vec::new();
        for &bind in wanted {
            if listeners.contains_key(&bind) {
                continue;
            }
            match self.accept_on(bind) {
                Ok(accepts) => {
                    tracing::info!(%bind, "listening");
                    listeners.insert(bind, accepts);
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

    /// Bind `bind` and start accepting on it: on every worker, each with
    /// the listening socket's descriptor registered in its own reactor,
    /// or on the calling runtime when there are no workers. The socket's
    /// connection limit is one for all of them.
    fn accept_on(&self, bind: SocketAddr) -> std::io::Result<Vec<AbortHandle>> {
        let per_listener = Arc::new(Semaphore::new(
            self.shared.limits.max_connections_per_listener,
        ));
        let handles = match &self.shared.workers {
            Some(workers) => workers.handles().to_vec(),
            None => vec![tokio::runtime::Handle::current()],
        };
        let socket = listen(bind)?.into_std()?;
        let mut accepts = Vec::with_capacity(handles.len());
        for handle in &handles {
            let listener = socket.try_clone().and_then(|socket| {
                let _runtime = handle.enter();
                tokio::net::TcpListener::from_std(socket)
            });
            let listener = match listener {
                Ok(listener) => listener,
                Err(e) => {
                    accepts.iter().for_each(AbortHandle::abort);
                    return Err(e);
                }
            };
            let task = handle.spawn(accept_loop(
                self.shared.clone(),
                listener,
                bind,
                per_listener.clone(),
            ));
            accepts.push(task.abort_handle());
        }
        Ok(accepts)
    }
}
