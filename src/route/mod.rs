//! The compiled route table: what the proxy consults for every request.
//!
//! `translate` builds a [`RouteTable`] once per configuration change with a
//! [`RouteTableBuilder`]; the proxy only ever reads it. Nothing here knows
//! about Kubernetes objects: rules, matches and backends are plain data, so
//! matching, precedence and weighted choice are tested as pure functions.
//!
//! A table is immutable once built and is swapped in whole (`arc_swap`), so a
//! request always finishes on the table it started with.

mod consistent;
mod cors;
mod grpc;
mod hostname;
mod matching;
mod outlier;
mod retry;
mod session;
mod stream;
mod table;
mod weighted;

pub use consistent::{Consistent, KeySource};
pub use cors::{CorsList, CorsPolicy, OriginHost, OriginPattern};
pub use grpc::{GrpcMethodMatch, split_path as grpc_path};
pub use hostname::{HostPattern, normalize_host};
pub use matching::{
    AnchoredRegex, CookieMatch, HeaderMatch, Mismatch, PathMatch, QueryMatch, RegexError,
    RequestMatch, ValueMatch,
};
pub use outlier::{
    BackendHealth, Ejection, EndpointReport, Failure, InFlight, OutlierPolicy, Outliers, Return,
    SetHealth,
};
pub use retry::{DEFAULT_RETRY_ATTEMPTS, DEFAULT_RETRY_BACKOFF, RetryPolicy, TryOutcome};
pub use session::{SessionCarrier, SessionPersistence, SessionToken, cookie_path, stable_hash};
pub use stream::{StreamRoutes, TlsMode};
pub use table::{
    ClientValidation, Criterion, Explained, ExplainedCandidate, ListenerHandle, ListenerRoutes,
    Lookup, PortRoutes, RouteMatch, RouteOrder, RouteTable, RouteTableBuilder, StreamLookup,
};
pub use weighted::WeightedPicker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{HeaderName, HeaderValue, StatusCode};

/// The kind of route a rule comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKind {
    #[default]
    Http,
    Grpc,
    Tls,
}

impl RouteKind {
    /// The Kubernetes `kind`.
    pub const fn as_str(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
            RouteKind::Tls => "TLSRoute",
        }
    }

    /// What the route's metrics label starts with before `ns/name`:
    /// nothing for an HTTPRoute (its labels are as they always were), the
    /// kind and a space for the others (`GRPCRoute ns/name`), so that
    /// routes of different kinds sharing a name never share counters.
    pub const fn metrics_prefix(self) -> &'static str {
        match self {
            RouteKind::Http => "",
            RouteKind::Grpc => "GRPCRoute ",
            RouteKind::Tls => "TLSRoute ",
        }
    }

    /// The lower-case kind that starts readable ids (`grpcroute/...`).
    pub const fn id_prefix(self) -> &'static str {
        match self {
            RouteKind::Http => "httproute",
            RouteKind::Grpc => "grpcroute",
            RouteKind::Tls => "tlsroute",
        }
    }
}

impl std::fmt::Display for RouteKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identity of one route rule, used in logs, metrics and `/status` dumps.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId {
    pub kind: RouteKind,
    pub namespace: String,
    pub route: String,
    pub index: usize,
    /// The rule's `name` (Gateway API named rules), when it has one.
    pub name: Option<String>,
}

impl std::fmt::Display for RuleId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}/rule/{}",
            self.kind.id_prefix(),
            self.namespace,
            self.route,
            self.index
        )
    }
}

/// One route rule, compiled: filters to apply and the weighted backends
/// (a TLSRoute rule has backends only).
#[derive(Debug)]
pub struct Rule {
    pub id: RuleId,
    /// Rule-level filters, in the order the HTTPRoute lists them.
    pub filters: Vec<Filter>,
    pub backends: BackendSplit,
    pub timeouts: Timeouts,
    /// `retry`: send the request again when a try fails retriably.
    pub retry: Option<RetryPolicy>,
    /// `sessionPersistence` (GEP-1619): a request carrying a session goes
    /// to the backend and endpoint the session started on.
    pub session: Option<SessionPersistence>,
}

/// HTTPRoute rule `timeouts`; `None` means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub request: Option<Duration>,
    pub backend_request: Option<Duration>,
}

/// The backendRefs of a rule with their weights and the lock-free picker
/// that spreads requests over them exactly in proportion to the weights.
///
/// The weights are the spec's, or the shares a rollout serves
/// ([`BackendSplit::served`]); during a rollout with consistent users,
/// requests carrying the key are placed by its hash instead.
#[derive(Debug)]
pub struct BackendSplit {
    backends: Vec<Backend>,
    picker: WeightedPicker,
    consistent: Option<Consistent>,
}

/// What a rule with backendRefs decided for one request.
#[derive(Debug)]
pub enum BackendChoice<'a> {
    /// A backend was chosen by weight (it may still be unresolved: 500, or
    /// empty: 503; see [`BackendTarget`]).
    Backend(&'a Backend),
    /// The rule has backendRefs but every weight is 0: the spec says 500.
    AllWeightsZero,
    /// The rule has no backendRefs at all. Without a redirect filter the
    /// spec says 500.
    NoBackends,
}

impl BackendSplit {
    pub fn new(backends: Vec<Backend>) -> Self {
        let weights: Vec<u64> = backends.iter().map(|b| u64::from(b.weight)).collect();
        BackendSplit {
            picker: WeightedPicker::new(&weights),
            backends,
            consistent: None,
        }
    }

    /// Backends served with `weights` (one per backend, in order) instead
    /// of their spec weights, and keyed requests placed by `consistent`.
    pub fn served(backends: Vec<Backend>, weights: &[u64], consistent: Option<Consistent>) -> Self {
        debug_assert_eq!(backends.len(), weights.len());
        BackendSplit {
            picker: WeightedPicker::new(weights),
            backends,
            consistent,
        }
    }

    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// The consistent-users placement, when a rollout governs the rule.
    pub fn consistent(&self) -> Option<&Consistent> {
        self.consistent.as_ref()
    }

    /// The position of `backend` (one of this split's) in the rule.
    pub fn index_of(&self, backend: &Backend) -> Option<usize> {
        self.backends.iter().position(|b| std::ptr::eq(b, backend))
    }

    /// Choose the backend for one request (or connection, for TLSRoutes)
    /// by weight. Per request, never per connection, so a keep-alive
    /// client is spread like everyone else.
    pub fn choose(&self) -> BackendChoice<'_> {
        if self.backends.is_empty() {
            return BackendChoice::NoBackends;
        }
        match self.picker.pick() {
            Some(i) => BackendChoice::Backend(&self.backends[i]),
            None => BackendChoice::AllWeightsZero,
        }
    }

    /// [`choose`](Self::choose) for a request with these headers: one
    /// carrying the consistent-users key of a rollout goes where its hash
    /// places it; others get the weighted choice.
    pub fn choose_for(&self, headers: &http::HeaderMap) -> BackendChoice<'_> {
        self.choose_for_user(self.user(headers))
    }

    /// The [`stable_hash`] of the request's consistent-users key, when a
    /// rollout with `consistentBy` governs the rule and the request
    /// carries the key: what places it, and what counts its user.
    pub fn user(&self, headers: &http::HeaderMap) -> Option<u64> {
        let c = self.consistent.as_ref()?;
        c.key.value(headers).map(stable_hash)
    }

    /// [`choose_for`](Self::choose_for) with the key's hash already
    /// computed ([`BackendSplit::user`]).
    pub fn choose_for_user(&self, user: Option<u64>) -> BackendChoice<'_> {
        if let Some(c) = &self.consistent
            && let Some(hash) = user
            && !self.backends.is_empty()
        {
            return match c.place(hash) {
                Some(i) => BackendChoice::Backend(&self.backends[i]),
                None => BackendChoice::AllWeightsZero,
            };
        }
        self.choose()
    }
}

/// One backendRef of a rule.
#[derive(Debug)]
pub struct Backend {
    /// Readable id: `httproute/<ns>/<route>/rule/<i>/backend/<j>`.
    pub id: String,
    /// The Service as `<namespace>/<name>:<port>` (the metrics label).
    pub service: String,
    pub weight: u32,
    pub target: BackendTarget,
    /// Backend-level filters (header modifiers), applied after the rule's.
    pub filters: Vec<Filter>,
}

/// Where a backend's share of the traffic goes.
#[derive(Debug)]
pub enum BackendTarget {
    /// Resolved Service with at least one ready endpoint.
    Endpoints(EndpointSet),
    /// Resolved Service with no ready endpoint: its share gets 503.
    NoReadyEndpoints,
    /// The reference does not resolve (missing Service, unsupported kind,
    /// cross-namespace without a ReferenceGrant): its share gets 500.
    Unresolved { reason: String },
}

/// How to talk to a backend's endpoints (Service port `appProtocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AppProtocol {
    #[default]
    Http1,
    /// `kubernetes.io/h2c`: HTTP/2 over cleartext with prior knowledge.
    H2c,
    /// `kubernetes.io/ws`: HTTP/1.1 with WebSocket upgrades passed through.
    WebSocket,
    /// HTTP/2 whatever the port says (a GRPCRoute's backends): with prior
    /// knowledge in cleartext, negotiated with ALPN `h2` over TLS.
    Http2,
}

impl AppProtocol {
    /// Are requests sent with HTTP/2? `kubernetes.io/h2c` names cleartext:
    /// over TLS (a BackendTLSPolicy) such a backend gets HTTP/1.1, as it
    /// always did; a GRPCRoute's backends get HTTP/2 either way.
    pub fn is_http2(self, tls: bool) -> bool {
        match self {
            AppProtocol::H2c => !tls,
            AppProtocol::Http2 => true,
            AppProtocol::Http1 | AppProtocol::WebSocket => false,
        }
    }
}

/// The ready endpoints of one backend, chosen round robin per request
/// (skipping those ejected as outliers, see [`Outliers::pick`]).
#[derive(Debug)]
pub struct EndpointSet {
    addrs: Vec<SocketAddr>,
    next: AtomicUsize,
    pub protocol: AppProtocol,
    /// Speak TLS to the endpoints (a BackendTLSPolicy targets the Service).
    pub tls: Option<Arc<BackendTls>>,
    /// The backend's and endpoints' state that outlives tables, found
    /// once per table ([`EndpointSet::health`]).
    health: OnceLock<SetHealth>,
}

/// How the gateway speaks TLS to a backend's endpoints, from the
/// BackendTLSPolicy that targets its Service (and the Gateway's
/// `spec.tls.backend` client certificate).
#[derive(Debug)]
pub struct BackendTls {
    /// `<namespace>/<name>` of the BackendTLSPolicy, for logs.
    pub policy: String,
    /// `validation.hostname`: sent as SNI, and the name the backend's
    /// certificate is verified for (unless subjectAltNames are given).
    pub server_name: rustls_pki_types::ServerName<'static>,
    /// The TLS client settings (trusted CAs, client certificate). `Err`
    /// when the policy is invalid: per the spec every connection to the
    /// backend then fails (the client gets a 5xx); the message says why.
    pub config: Result<Arc<rustls::ClientConfig>, String>,
    /// Equal for equal settings, across route tables: connection pools are
    /// keyed by it, so they survive reloads that keep the settings.
    pub key: String,
}

impl EndpointSet {
    /// `addrs` must not be empty (an empty set is `NoReadyEndpoints`).
    pub fn new(addrs: Vec<SocketAddr>, protocol: AppProtocol) -> Self {
        assert!(
            !addrs.is_empty(),
            "an EndpointSet needs at least one address"
        );
        EndpointSet {
            addrs,
            next: AtomicUsize::new(0),
            protocol,
            tls: None,
            health: OnceLock::new(),
        }
    }

    /// The same endpoints, reached over TLS with `tls` (none: cleartext).
    pub fn with_tls(mut self, tls: Option<Arc<BackendTls>>) -> Self {
        self.tls = tls;
        self
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The next endpoint, round robin across all requests on all threads
    /// (whatever their state; the proxy picks with [`Outliers::pick`]).
    pub fn pick(&self) -> SocketAddr {
        self.addrs[self.next_index()]
    }

    /// The index of the next endpoint in the round robin.
    fn next_index(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.addrs.len()
    }

    /// This backend's state in `outliers` (`service` is its identity,
    /// [`Backend::service`]), looked up on first use.
    pub fn health(&self, outliers: &Outliers, service: &str) -> &SetHealth {
        self.health
            .get_or_init(|| outliers.resolve(service, &self.addrs))
    }
}

/// An HTTPRoute filter, compiled.
#[derive(Debug, Clone)]
pub enum Filter {
    RequestHeaderModifier(HeaderModifier),
    ResponseHeaderModifier(HeaderModifier),
    RequestRedirect(Redirect),
    UrlRewrite(UrlRewrite),
    RequestMirror(Mirror),
    /// `CORS`: preflights are answered by the gateway; other requests with
    /// an allowed `Origin` get the CORS response headers.
    Cors(CorsPolicy),
}

/// Header edits in the spec's order: set, then add, then remove.
#[derive(Debug, Clone, Default)]
pub struct HeaderModifier {
    pub set: Vec<(HeaderName, HeaderValue)>,
    pub add: Vec<(HeaderName, HeaderValue)>,
    pub remove: Vec<HeaderName>,
}

/// `RequestRedirect`: fields left `None` keep the request's own value.
#[derive(Debug, Clone)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<u16>,
    pub status: StatusCode,
}

/// `URLRewrite`: fields left `None` keep the request's own value.
#[derive(Debug, Clone, Default)]
pub struct UrlRewrite {
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathModifier {
    ReplaceFullPath(String),
    /// Replace the part of the path matched by the rule's PathPrefix match.
    ReplacePrefixMatch(String),
}

/// `RequestMirror`: a copy of the request goes to `backend`, its response is
/// discarded, and the client never waits for it.
#[derive(Debug, Clone)]
pub struct Mirror {
    pub backend: Arc<Backend>,
    /// Mirror this fraction of requests: `numerator / denominator`
    /// (`percent: 50` is 50/100; absent is 100/100).
    pub numerator: u32,
    pub denominator: u32,
    /// Decides which requests are mirrored: exact like the weighted split
    /// (one request in two for 50/100, evenly spread), not a random draw.
    sampler: Arc<WeightedPicker>,
}

impl Mirror {
    pub fn new(backend: Arc<Backend>, numerator: u32, denominator: u32) -> Self {
        let numerator = numerator.min(denominator);
        let sampler =
            WeightedPicker::new(&[u64::from(numerator), u64::from(denominator - numerator)]);
        Mirror {
            backend,
            numerator,
            denominator,
            sampler: Arc::new(sampler),
        }
    }

    /// Should this request be mirrored? Over any run of requests the
    /// mirrored count stays within one of `numerator / denominator`.
    pub fn sample(&self) -> bool {
        self.sampler.pick() == Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mirror(numerator: u32, denominator: u32) -> Mirror {
        let backend = Backend {
            id: "httproute/ns/r/rule/0/mirror/0".into(),
            service: "ns/copy:80".into(),
            weight: 1,
            target: BackendTarget::NoReadyEndpoints,
            filters: Vec::new(),
        };
        Mirror::new(Arc::new(backend), numerator, denominator)
    }

    #[test]
    fn mirror_fraction_is_exact_not_random() {
        let half = mirror(50, 100);
        let picks: Vec<bool> = (0..1_000).map(|_| half.sample()).collect();
        assert_eq!(picks.iter().filter(|p| **p).count(), 500);
        // Evenly spread: never two mirrored in a row at 50%.
        assert!(picks.windows(2).all(|w| w[0] != w[1]));
        let tenth = mirror(1, 10);
        assert_eq!((0..1_000).filter(|_| tenth.sample()).count(), 100);
        assert_eq!((0..100).filter(|_| mirror(0, 100).sample()).count(), 0);
        assert_eq!((0..100).filter(|_| mirror(100, 100).sample()).count(), 100);
        // A numerator above the denominator mirrors everything.
        assert_eq!((0..10).filter(|_| mirror(7, 5).sample()).count(), 10);
    }
}
