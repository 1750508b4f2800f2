//! Prometheus metrics, served as text at the admin listener's `/metrics`.
//!
//! One registry for the process. The proxy records one sample per request;
//! the file source records configuration loads and parse errors.
//!
//! The per-request path ([`Metrics::record`]) takes its labels borrowed from
//! the route table and finds the label set's counter and histogram in a
//! cache under one read lock: no allocation once a (rule, backend, code) has
//! been seen. Label sets are built as Strings only the first time.
//!
//! The same path keeps cumulative outcome counters per backend of each
//! rule ([`BackendStats`]: requests, 5xx, a latency histogram of atomic
//! buckets), which the rollout gates judge by diffing two readings
//! ([`Metrics::backend_total`], [`Metrics::backend_totals`]).
//!
//! A backend a rollout governs ([`Metrics::govern`]) also counts the
//! responses slower than its policy's `maxLatency`, exactly, and its 5xx
//! and slow responses wake the rollout driver ([`Metrics::rollout_events`]):
//! overwhelming evidence is acted on within milliseconds, not at a poll.
//! The wake is one relaxed load for a backend no rollout governs and one
//! swap of a flag for one it does; no lock on the request path.
//!
//! With a policy's `consistentBy`, a backend of a rollout at a step also
//! counts its distinct users and the users with a 5xx in that step
//! ([`users`], [`Metrics::track_users`]), from the key's hash the
//! placement computed ([`Metrics::record_user`]).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::FastMap;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod shares;
pub mod users;

pub use shares::{BackendView, OBSERVED_WINDOW, ShareRow};
pub use users::{EXACT_USERS, UserCounts};

/// Labels of one proxied request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `<namespace>/<name>` of the HTTPRoute (`GRPCRoute <namespace>/<name>`
    /// for a GRPCRoute), empty when no route matched.
    pub route: String,
    /// Rule index within the route, empty when no route matched.
    pub rule: String,
    /// `<namespace>/<service>:<port>`, empty when no backend was chosen.
    pub backend: String,
    /// The parts of `backend`, so that PromQL selects them without a regex.
    pub backend_namespace: String,
    pub backend_name: String,
    pub backend_port: String,
    pub code: u16,
}

/// The parts of a backend label (`[Kind ]<namespace>/<name>[:<port>]`):
/// namespace, name and port, each empty when absent.
pub fn backend_parts(backend: &str) -> (&str, &str, &str) {
    // A kind other than Service is written first, then a space.
    let reference = backend.rsplit_once(' ').map_or(backend, |(_, r)| r);
    let (namespace, rest) = reference.split_once('/').unwrap_or(("", reference));
    let (name, port) = rest.rsplit_once(':').unwrap_or((rest, ""));
    (namespace, name, port)
}

/// A request's labels borrowed from the route table: what the proxy
/// passes for every request (see [`Metrics::record`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestKey<'a> {
    /// Written before the route ([`crate::route::RouteKind::metrics_prefix`]):
    /// empty for an HTTPRoute (whose labels are as they always were),
    /// `GRPCRoute ` for a GRPCRoute.
    pub kind: &'static str,
    /// The route's namespace and name, empty when no route matched.
    pub namespace: &'a str,
    pub route: &'a str,
    /// Rule index within the route, `None` when no route matched.
    pub rule: Option<usize>,
    /// `<namespace>/<service>:<port>`, empty when no backend was chosen.
    pub backend: &'a str,
    pub code: u16,
}

impl RequestKey<'_> {
    fn labels(&self) -> RequestLabels {
        let (backend_namespace, backend_name, backend_port) = backend_parts(self.backend);
        RequestLabels {
            route: if self.namespace.is_empty() && self.route.is_empty() {
                String::new()
            } else {
                format!("{}{}/{}", self.kind, self.namespace, self.route)
            },
            rule: self.rule.map(|i| i.to_string()).unwrap_or_default(),
            backend: self.backend.to_string(),
            backend_namespace: backend_namespace.to_string(),
            backend_name: backend_name.to_string(),
            backend_port: backend_port.to_string(),
            code: self.code,
        }
    }

    /// The fields hashed, each string followed by a separator (foldhash
    /// with a fixed seed: the hash only keys this process's map of
    /// series; byte-wise FNV was about 200 instructions per request).
    fn hash(&self) -> u64 {
        let mut h = foldhash::fast::FixedState::default().build_hasher();
        h.write(self.kind.as_bytes());
        h.write(self.namespace.as_bytes());
        h.write_u8(0xff);
        h.write(self.route.as_bytes());
        h.write_u8(0xff);
        h.write_u64(self.rule.map_or(u64::MAX, |i| i as u64));
        h.write(self.backend.as_bytes());
        h.write_u8(0xff);
        h.write_u16(self.code);
        h.finish()
    }
}

/// The metrics of one label set, shared with the registry's families.
struct CachedSeries {
    kind: &'static str,
    namespace: String,
    route: String,
    rule: Option<usize>,
    backend: String,
    code: u16,
    requests: Counter,
    latency: Histogram,
    /// The outcome counters of the series' backend (every code of one
    /// rule's backend shares them); `None` when no backend was chosen.
    stats: Option<Arc<BackendStats>>,
}

impl CachedSeries {
    fn is(&self, key: &RequestKey<'_>) -> bool {
        self.code == key.code
            && self.rule == key.rule
            && self.route == key.route
            && self.namespace == key.namespace
            && self.kind == key.kind
            && self.backend == key.backend
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FileLabels {
    file: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RetryLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

/// Upper bounds of the per-backend latency buckets, in microseconds (a
/// last bucket takes everything slower). Roughly 1.5x apart from 250 µs to
/// a minute, fine enough for a p99 gate set anywhere in that range.
pub const LATENCY_BOUNDS_MICROS: [u64; 29] = [
    250, 500, 1_000, 2_000, 3_000, 5_000, 7_500, 10_000, 15_000, 20_000, 30_000, 50_000, 75_000,
    100_000, 150_000, 200_000, 300_000, 500_000, 750_000, 1_000_000, 1_500_000, 2_000_000,
    3_000_000, 5_000_000, 7_500_000, 10_000_000, 15_000_000, 30_000_000, 60_000_000,
];

/// Buckets of a latency histogram: one per bound, plus the slower rest.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_MICROS.len() + 1;

/// Which backend of which rule outcome counters are about.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct BackendStatsKey {
    /// As [`RequestKey::kind`] ([`crate::route::RouteKind::metrics_prefix`]):
    /// empty for an HTTPRoute, `GRPCRoute ` for a GRPCRoute (a route of
    /// each kind may share a name).
    pub kind: &'static str,
    /// The route's namespace and name.
    pub namespace: String,
    pub route: String,
    /// Rule index within the route.
    pub rule: usize,
    /// The backend as metrics label it: `<namespace>/<service>:<port>`.
    pub backend: String,
}

/// Cumulative outcomes of one backend of one rule, counted on the
/// per-request path with atomic increments.
#[derive(Debug)]
pub struct BackendStats {
    requests: AtomicU64,
    /// 5xx responses, including those sluice answers itself for the
    /// backend (500 unresolved, 502 refused, 503 no endpoint, 504 timeout).
    errors: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS],
    /// The sum of the latencies in microseconds (a histogram's `_sum`).
    latency_sum_micros: AtomicU64,
    /// Responses slower than `slow_after_micros`, counted while a rollout
    /// governs the backend.
    slow: AtomicU64,
    /// `maxLatency` of the policy governing the backend, in microseconds;
    /// `u64::MAX` when none.
    slow_after_micros: AtomicU64,
    /// A rollout governs the backend: its 5xx and slow responses wake the
    /// rollout driver.
    governed: AtomicBool,
    /// The users of the step being served, while a rollout with
    /// `consistentBy` is at a step ([`Metrics::track_users`]).
    users: arc_swap::ArcSwap<users::StepUsers>,
    /// 5xx of a user that had one before in the same step.
    repeated_errors: AtomicU64,
    /// Responses whose counting began and ended: a reading taken while
    /// none was half counted is whole ([`BackendStats::totals`]).
    begun: AtomicU64,
    done: AtomicU64,
}

/// How many times [`BackendStats::totals`] reads again a backend's
/// counters that responses were being counted into, before it settles
/// for a reading that may count some of them in part: first spinning
/// (a response is counted in nanoseconds), then yielding the thread (a
/// thread preempted while counting one, on a busy machine, may need it).
const WHOLE_READING_SPINS: usize = 64;
const WHOLE_READING_TRIES: usize = 128;

impl Default for BackendStats {
    fn default() -> Self {
        BackendStats {
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
            latency_sum_micros: AtomicU64::new(0),
            slow: AtomicU64::new(0),
            slow_after_micros: AtomicU64::new(u64::MAX),
            governed: AtomicBool::new(false),
            users: arc_swap::ArcSwap::from_pointee(users::StepUsers::new(
                None,
                UserCounts::default(),
            )),
            repeated_errors: AtomicU64::new(0),
            begun: AtomicU64::new(0),
            done: AtomicU64::new(0),
        }
    }
}

impl BackendStats {
    /// Count one response (of the user whose consistent-users key hashes
    /// to `user`, if any); whether it is an event a rollout judges (a 5xx
    /// or a slow response of a governed backend).
    ///
    /// The counters of one response are written between `begun` and
    /// `done` (a seqlock with many writers): a reading never sees a 5xx
    /// counted without its user, or a repeated error as a first one.
    fn record(&self, code: u16, elapsed: Duration, user: Option<u64>) -> bool {
        self.begun.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
        let event = self.count(code, elapsed, user);
        self.done.fetch_add(1, Ordering::Release);
        event
    }

    fn count(&self, code: u16, elapsed: Duration, user: Option<u64>) -> bool {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let error = (500..600).contains(&code);
        if error {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(user) = user
            && self.users.load().see(user, error)
        {
            self.repeated_errors.fetch_add(1, Ordering::Relaxed);
        }
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BOUNDS_MICROS.partition_point(|b| *b < micros);
        self.latency[bucket].fetch_add(1, Ordering::Relaxed);
        self.latency_sum_micros.fetch_add(micros, Ordering::Relaxed);
        let slow = micros > self.slow_after_micros.load(Ordering::Relaxed);
        if slow {
            self.slow.fetch_add(1, Ordering::Relaxed);
        }
        (error || slow) && self.governed.load(Ordering::Relaxed)
    }

    /// The sum of the latencies recorded, in seconds.
    pub fn latency_sum_seconds(&self) -> f64 {
        self.latency_sum_micros.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// A reading of the counters: whole, counting every response it
    /// counts in full (its request, its 5xx, its user, whether the error
    /// was the user's repeated one), unless responses were being counted
    /// through [`WHOLE_READING_TRIES`] readings in a row (then the last,
    /// which may count those in part). A rollout's look reads whole
    /// counts: its status fields agree with each other, and its gates
    /// never judge a repeated error as a first one.
    pub fn totals(&self) -> BackendTotals {
        let mut tries = 0;
        loop {
            tries += 1;
            let (reading, whole) = self.reading();
            if whole || tries == WHOLE_READING_TRIES {
                return reading;
            }
            if tries < WHOLE_READING_SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// One reading of the counters, and whether it is whole (no response
    /// was being counted meanwhile).
    fn reading(&self) -> (BackendTotals, bool) {
        let done = self.done.load(Ordering::Acquire);
        let reading = self.read();
        fence(Ordering::Acquire);
        // No response began since the counting of those done before the
        // reading: none was half counted while it read.
        (reading, self.begun.load(Ordering::Relaxed) == done)
    }

    fn read(&self) -> BackendTotals {
        let users = self.users.load().totals();
        BackendTotals {
            requests: self.requests.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            slow: self.slow.load(Ordering::Relaxed),
            latency: std::array::from_fn(|i| self.latency[i].load(Ordering::Relaxed)),
            users: users.users,
            users_with_errors: users.with_errors,
            users_estimated: users.estimated,
            repeated_errors: self.repeated_errors.load(Ordering::Relaxed),
        }
    }

    /// Count the users of `step` from now on (`None`: stop counting); the
    /// counts so far are kept as the base of the next.
    fn track_users(&self, step: Option<&str>) {
        let current = self.users.load();
        if current.step() == step {
            return;
        }
        let base = current.totals();
        self.users.store(Arc::new(users::StepUsers::new(
            step.map(str::to_owned),
            base,
        )));
    }
}

/// A reading of a backend's cumulative outcomes (or the difference of two
/// readings: what happened in between). Readings of several backends, or
/// of several replicas, add up field by field (`+`, [`BackendTotals::merge`]).
/// Serialized field by field (each replica publishes its counts in
/// Kubernetes mode, `rollout::fleet`); a field a replica does not know
/// reads as zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct BackendTotals {
    pub requests: u64,
    pub errors: u64,
    /// Responses slower than the governing policy's `maxLatency`, counted
    /// while a rollout governs the backend.
    pub slow: u64,
    /// Responses per latency bucket ([`LATENCY_BOUNDS_MICROS`], then the
    /// rest); not cumulative.
    pub latency: [u64; LATENCY_BUCKETS],
    /// With `consistentBy`, while a rollout is at a step
    /// ([`Metrics::track_users`]): the distinct users of each step, summed
    /// over the steps (the difference of two readings within a step is the
    /// users new in it), and of those the users with a 5xx in the step.
    /// Published only when not zero (no user, no bytes).
    #[serde(skip_serializing_if = "is_zero")]
    pub users: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub users_with_errors: u64,
    /// Steps whose user counts are estimates (more than [`EXACT_USERS`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub users_estimated: u64,
    /// 5xx of a user that had one before in the same step: a user's
    /// retries of a failure, which the error gates do not judge.
    #[serde(skip_serializing_if = "is_zero")]
    pub repeated_errors: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Default for BackendTotals {
    fn default() -> Self {
        BackendTotals {
            requests: 0,
            errors: 0,
            slow: 0,
            latency: [0; LATENCY_BUCKETS],
            users: 0,
            users_with_errors: 0,
            users_estimated: 0,
            repeated_errors: 0,
        }
    }
}

impl std::ops::Add for BackendTotals {
    type Output = BackendTotals;

    fn add(self, other: BackendTotals) -> BackendTotals {
        self.plus(&other)
    }
}

impl std::ops::AddAssign for BackendTotals {
    fn add_assign(&mut self, other: BackendTotals) {
        *self = self.plus(&other);
    }
}

impl std::iter::Sum for BackendTotals {
    fn sum<I: Iterator<Item = BackendTotals>>(iter: I) -> BackendTotals {
        iter.fold(BackendTotals::default(), |a, b| a + b)
    }
}

impl BackendTotals {
    /// What happened since `earlier` (a reading of the same counters).
    pub fn since(&self, earlier: &BackendTotals) -> BackendTotals {
        BackendTotals {
            requests: self.requests.saturating_sub(earlier.requests),
            errors: self.errors.saturating_sub(earlier.errors),
            slow: self.slow.saturating_sub(earlier.slow),
            latency: std::array::from_fn(|i| self.latency[i].saturating_sub(earlier.latency[i])),
            users: self.users.saturating_sub(earlier.users),
            users_with_errors: self
                .users_with_errors
                .saturating_sub(earlier.users_with_errors),
            users_estimated: self.users_estimated.saturating_sub(earlier.users_estimated),
            repeated_errors: self.repeated_errors.saturating_sub(earlier.repeated_errors),
        }
    }

    /// The sum of two readings (several backends, or several replicas'
    /// counts of one backend, together), every field added.
    pub fn plus(&self, other: &BackendTotals) -> BackendTotals {
        BackendTotals {
            requests: self.requests.saturating_add(other.requests),
            errors: self.errors.saturating_add(other.errors),
            slow: self.slow.saturating_add(other.slow),
            latency: std::array::from_fn(|i| self.latency[i].saturating_add(other.latency[i])),
            users: self.users.saturating_add(other.users),
            users_with_errors: self
                .users_with_errors
                .saturating_add(other.users_with_errors),
            users_estimated: self.users_estimated.saturating_add(other.users_estimated),
            repeated_errors: self.repeated_errors.saturating_add(other.repeated_errors),
        }
    }

    /// Add `other` into `self` (see [`BackendTotals::plus`]).
    pub fn merge(&mut self, other: &BackendTotals) {
        *self = self.plus(other);
    }

    /// The `q` quantile (0 < q <= 1) of the latencies, estimated as
    /// Prometheus' `histogram_quantile` does: linear within the bucket
    /// holding it; the largest bound when it falls in the last bucket.
    /// `None` without responses.
    pub fn latency_quantile(&self, q: f64) -> Option<Duration> {
        let total: u64 = self.latency.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = q * total as f64;
        let mut before = 0u64;
        for (i, count) in self.latency.iter().enumerate() {
            let through = before + count;
            if *count > 0 && through as f64 >= rank {
                let Some(&upper) = LATENCY_BOUNDS_MICROS.get(i) else {
                    break;
                };
                let lower = if i == 0 {
                    0
                } else {
                    LATENCY_BOUNDS_MICROS[i - 1]
                };
                let within = ((rank - before as f64) / *count as f64).clamp(0.0, 1.0);
                let micros = lower as f64 + (upper - lower) as f64 * within;
                return Some(Duration::from_micros(micros.round() as u64));
            }
            before = through;
        }
        LATENCY_BOUNDS_MICROS
            .last()
            .map(|m| Duration::from_micros(*m))
    }
}

/// What became of a connection on a TLS listener.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum TlsOutcome {
    /// Relayed to an endpoint until both sides were done (or idle).
    Forwarded,
    /// No SNI, or no TLSRoute for it: closed.
    NoRoute,
    /// Its share goes to a backendRef that does not resolve, has no ready
    /// endpoint, or weighs 0 with the rest: closed.
    Rejected,
    /// The endpoint could not be reached (or its TLS failed): closed.
    Unreachable,
    /// The first bytes were no ClientHello, too large, or (Terminate) the
    /// handshake failed.
    BadClientHello,
    /// No whole ClientHello within the limit.
    ClientHelloTimeout,
    /// The client closed before it sent a whole ClientHello (a port check,
    /// an impatient client).
    Closed,
}

impl TlsOutcome {
    fn as_str(self) -> &'static str {
        match self {
            TlsOutcome::Forwarded => "forwarded",
            TlsOutcome::NoRoute => "no_route",
            TlsOutcome::Rejected => "rejected",
            TlsOutcome::Unreachable => "unreachable",
            TlsOutcome::BadClientHello => "bad_client_hello",
            TlsOutcome::ClientHelloTimeout => "client_hello_timeout",
            TlsOutcome::Closed => "closed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TlsLabels {
    /// `TLSRoute <namespace>/<name>`, empty when none was found.
    route: String,
    backend: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabel {
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendReason {
    backend: String,
    reason: &'static str,
}

/// Why the proxy answered a request itself instead of sending it to the
/// backend it chose.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Rejection {
    /// The backend has as many requests in flight as its cap allows.
    BackendOverloaded,
}

impl Rejection {
    fn as_str(self) -> &'static str {
        match self {
            Rejection::BackendOverloaded => "backend_overloaded",
        }
    }
}

/// All of sluice's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabel, Histogram>,
    config_errors: Family<FileLabels, Counter>,
    config_reloads: Counter,
    mirrors: Counter,
    mirror_failures: Counter,
    config_generation: Gauge,
    tls_connections: Family<TlsLabels, Counter>,
    ejections: Family<BackendReason, Counter>,
    ejected: Family<BackendLabel, Gauge>,
    rejected: Family<BackendReason, Counter>,
    /// Label-set hash -> the series with that hash (collisions share a bucket).
    series: RwLock<FastMap<u64, Vec<CachedSeries>>>,
    /// Outcome counters per backend of each rule, and their shares.
    backends: Arc<shares::Backends>,
    refusals: Family<ReasonLabels, Counter>,
    retries: Family<RetryLabels, Counter>,
    retried: Family<OutcomeLabels, Counter>,
    rollouts: RolloutMetrics,
    events: RolloutEvents,
    /// The backends whose users are counted ([`Metrics::track_users`]).
    users_tracked: std::sync::Mutex<Vec<BackendStatsKey>>,
}

/// Wakes the rollout driver when a governed backend answers a 5xx or a
/// slow response.
#[derive(Debug, Default)]
pub struct RolloutEvents {
    notify: tokio::sync::Notify,
    pending: AtomicBool,
}

impl RolloutEvents {
    /// Wait for the next event (returns at once when one came since the
    /// last wait).
    pub async fn next(&self) {
        self.notify.notified().await;
        self.pending.store(false, Ordering::Release);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests served, by HTTPRoute or GRPCRoute, rule, backend and status code",
            requests.clone(),
        );
        let latency = Family::<RouteLabel, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0,
            ])
        });
        registry.register(
            "request_duration_seconds",
            "Time from request received to response headers sent, by HTTPRoute",
            latency.clone(),
        );
        let config_errors = Family::<FileLabels, Counter>::default();
        registry.register(
            "config_errors",
            "Manifest files that failed to parse or objects that failed validation, by file",
            config_errors.clone(),
        );
        let config_reloads = Counter::default();
        registry.register(
            "config_reloads",
            "Route tables swapped in",
            config_reloads.clone(),
        );
        let mirrors = Counter::default();
        registry.register("mirror_requests", "Requests mirrored", mirrors.clone());
        let mirror_failures = Counter::default();
        registry.register(
            "mirror_failures",
            "Mirrored requests that failed (never seen by the client)",
            mirror_failures.clone(),
        );
        let config_generation = Gauge::default();
        registry.register(
            "config_generation",
            "Number of the route table in service",
            config_generation.clone(),
        );
        let tls_connections = Family::<TlsLabels, Counter>::default();
        registry.register(
            "tls_connections",
            "Connections on TLS listeners, by TLSRoute, backend and outcome",
            tls_connections.clone(),
        );
        let refusals = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "refused_requests",
            "Requests refused before routing by a limit or a check of the request, by reason",
            refusals.clone(),
        );
        let retries = Family::<RetryLabels, Counter>::default();
        registry.register(
            "retries",
            "Tries sent again by a rule's retry policy, by what the failed try got (timeout, connect_failed, broken, or the status code)",
            retries.clone(),
        );
        let retried = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "retried_requests",
            "Requests tried more than once, by outcome (recovered: the last try got a status below 500; failed: otherwise)",
            retried.clone(),
        );
        let backends = Arc::new(shares::Backends::default());
        registry.register_collector(Box::new(shares::BackendCollector(backends.clone())));
        // Outlier ejection and overload (docs/hardening.md, "Backends
        // misbehaving").
        let ejections = Family::<BackendReason, Counter>::default();
        registry.register(
            "outlier_ejections",
            "Endpoints ejected from their backend's rotation after failed tries in a row, by backend and the last failure (5xx, connect_failure, reset, timeout)",
            ejections.clone(),
        );
        let ejected = Family::<BackendLabel, Gauge>::default();
        registry.register(
            "endpoints_ejected",
            "Endpoints out of their backend's rotation now, by backend",
            ejected.clone(),
        );
        let rejected = Family::<BackendReason, Counter>::default();
        registry.register(
            "requests_rejected",
            "Requests answered by the gateway instead of the backend it chose, by backend and reason (backend_overloaded: 503, the backend's cap on requests in flight was reached)",
            rejected.clone(),
        );
        let rollouts = RolloutMetrics::register(&mut registry);
        Metrics {
            refusals,
            retries,
            retried,
            registry,
            ejections,
            ejected,
            rejected,
            requests,
            latency,
            config_errors,
            config_reloads,
            mirrors,
            mirror_failures,
            config_generation,
            tls_connections,
            series: RwLock::new(FastMap::default()),
            backends,
            rollouts,
            events: RolloutEvents::default(),
            users_tracked: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Count one connection on a TLS listener (one per connection, when
    /// it ends or is refused).
    pub fn record_tls(&self, route: &str, backend: &str, outcome: TlsOutcome) {
        self.tls_connections
            .get_or_create(&TlsLabels {
                route: route.to_owned(),
                backend: backend.to_owned(),
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Count an endpoint of `backend` ejected for `reason`; `ejected_now`
    /// of its endpoints are out.
    pub fn record_ejection(&self, backend: &str, reason: &'static str, ejected_now: usize) {
        self.ejections
            .get_or_create(&BackendReason {
                backend: backend.to_owned(),
                reason,
            })
            .inc();
        self.set_ejected(backend, ejected_now);
    }

    /// `ejected_now` endpoints of `backend` are out of rotation.
    pub fn set_ejected(&self, backend: &str, ejected_now: usize) {
        self.ejected
            .get_or_create(&BackendLabel {
                backend: backend.to_owned(),
            })
            .set(ejected_now as i64);
    }

    /// Count a request to `backend` the gateway answered itself.
    pub fn record_rejected(&self, backend: &str, why: Rejection) {
        self.rejected
            .get_or_create(&BackendReason {
                backend: backend.to_owned(),
                reason: why.as_str(),
            })
            .inc();
    }

    pub fn shared() -> Arc<Self> {
        Arc::new(Self::new())
    }

    /// Record one request's outcome: the proxy's per-request path. No
    /// allocation and one uncontended read lock once the label set is known.
    pub fn record(&self, key: &RequestKey<'_>, elapsed: Duration) {
        self.record_user(key, elapsed, None);
    }

    /// [`Metrics::record`] for a request of the user whose consistent-users
    /// key hashes to `user` (the hash its placement used), counted among
    /// its backend's users while [`Metrics::track_users`] says so.
    pub fn record_user(&self, key: &RequestKey<'_>, elapsed: Duration, user: Option<u64>) {
        let hash = key.hash();
        {
            let series = self.series.read().unwrap_or_else(|p| p.into_inner());
            if let Some(s) = series.get(&hash).and_then(|b| b.iter().find(|s| s.is(key))) {
                s.requests.inc();
                s.latency.observe(elapsed.as_secs_f64());
                if let Some(stats) = &s.stats
                    && stats.record(key.code, elapsed, user)
                {
                    self.wake_rollouts();
                }
                return;
            }
        }
        let labels = key.labels();
        let requests = self.requests.get_or_create(&labels).clone();
        let latency = self
            .latency
            .get_or_create(&RouteLabel {
                route: labels.route,
            })
            .clone();
        requests.inc();
        latency.observe(elapsed.as_secs_f64());
        let stats = match key.rule {
            Some(rule) if !key.backend.is_empty() => {
                let stats = self.stats_for(BackendStatsKey {
                    kind: key.kind,
                    namespace: key.namespace.to_string(),
                    route: key.route.to_string(),
                    rule,
                    backend: key.backend.to_string(),
                });
                if stats.record(key.code, elapsed, user) {
                    self.wake_rollouts();
                }
                Some(stats)
            }
            _ => None,
        };
        let mut series = self.series.write().unwrap_or_else(|p| p.into_inner());
        let bucket = series.entry(hash).or_default();
        if !bucket.iter().any(|s| s.is(key)) {
            bucket.push(CachedSeries {
                kind: key.kind,
                namespace: key.namespace.to_string(),
                route: key.route.to_string(),
                rule: key.rule,
                backend: key.backend.to_string(),
                code: key.code,
                requests,
                latency,
                stats,
            });
        }
    }

    fn stats_for(&self, key: BackendStatsKey) -> Arc<BackendStats> {
        let mut all = self
            .backends
            .stats
            .write()
            .unwrap_or_else(|p| p.into_inner());
        all.entry(key).or_default().clone()
    }

    /// A reading of one backend's outcome counters (zero when it never
    /// answered a request).
    pub fn backend_total(&self, key: &BackendStatsKey) -> BackendTotals {
        let all = self
            .backends
            .stats
            .read()
            .unwrap_or_else(|p| p.into_inner());
        all.get(key).map(|s| s.totals()).unwrap_or_default()
    }

    /// A reading of every backend's outcome counters, in key order.
    pub fn backend_totals(&self) -> Vec<(BackendStatsKey, BackendTotals)> {
        let all = self
            .backends
            .stats
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = all.iter().map(|(k, s)| (k.clone(), s.totals())).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Govern exactly `backends` (every other backend stops being
    /// governed): count each one's responses slower than its limit (`None`:
    /// no latency gate) and wake [`Metrics::rollout_events`] on its 5xx
    /// and slow responses. Called by the rollout driver when the governed
    /// rules change; on every replica, so that each counts the same way.
    pub fn govern(&self, backends: &[(BackendStatsKey, Option<Duration>)]) {
        let mut all = self
            .backends
            .stats
            .write()
            .unwrap_or_else(|p| p.into_inner());
        for stats in all.values() {
            stats.governed.store(false, Ordering::Relaxed);
            stats.slow_after_micros.store(u64::MAX, Ordering::Relaxed);
        }
        for (key, slow_after) in backends {
            let stats = all.entry(key.clone()).or_default();
            let micros = slow_after.map_or(u64::MAX, |d| {
                u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
            });
            stats.slow_after_micros.store(micros, Ordering::Relaxed);
            stats.governed.store(true, Ordering::Relaxed);
        }
    }

    /// Count the users of exactly `backends`, each for its step (a step's
    /// identity, [`crate::rollout::fleet::step_id`]): a backend whose step
    /// changed starts counting afresh, one no longer listed stops. Called
    /// by the rollout driver after every evaluation, on every replica.
    pub fn track_users(&self, backends: &[(BackendStatsKey, String)]) {
        let mut tracked = self.users_tracked.lock().unwrap_or_else(|p| p.into_inner());
        let missing = {
            let all = self
                .backends
                .stats
                .read()
                .unwrap_or_else(|p| p.into_inner());
            backends.iter().any(|(k, _)| !all.contains_key(k))
        };
        if missing {
            for (key, _) in backends {
                self.stats_for(key.clone());
            }
        }
        let all = self
            .backends
            .stats
            .read()
            .unwrap_or_else(|p| p.into_inner());
        for key in tracked.iter() {
            if !backends.iter().any(|(k, _)| k == key)
                && let Some(stats) = all.get(key)
            {
                stats.track_users(None);
            }
        }
        for (key, step) in backends {
            if let Some(stats) = all.get(key) {
                stats.track_users(Some(step));
            }
        }
        *tracked = backends.iter().map(|(k, _)| k.clone()).collect();
    }

    /// Woken after a 5xx or slow response of a governed backend (at most
    /// one wake pending: many events between two looks are one wake).
    pub fn rollout_events(&self) -> &RolloutEvents {
        &self.events
    }

    fn wake_rollouts(&self) {
        if !self.events.pending.swap(true, Ordering::AcqRel) {
            self.events.notify.notify_one();
        }
    }

    /// The rollout gauges and counters.
    pub fn rollouts(&self) -> &RolloutMetrics {
        &self.rollouts
    }

    /// Record one request's outcome with owned labels (allocates; the proxy
    /// uses [`Metrics::record`]).
    pub fn record_request(&self, labels: &RequestLabels, elapsed: Duration) {
        self.requests.get_or_create(labels).inc();
        self.latency
            .get_or_create(&RouteLabel {
                route: labels.route.clone(),
            })
            .observe(elapsed.as_secs_f64());
    }

    pub fn record_config_error(&self, file: &str) {
        self.config_errors
            .get_or_create(&FileLabels {
                file: file.to_string(),
            })
            .inc();
    }

    pub fn record_reload(&self, generation: u64) {
        self.config_reloads.inc();
        self.config_generation.set(generation as i64);
    }

    /// Count a request refused before routing (`reason`: `uri_too_long`,
    /// `head_too_large`, `bad_request`, `misdirected`, ...).
    pub fn record_refusal(&self, reason: &'static str) {
        self.refusals.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Count a retry, by what the failed try got (`timeout`,
    /// `connect_failed`, `broken`, or its status code).
    pub fn record_retry(&self, reason: &str) {
        // Retries are rare: the label is allocated each time.
        self.retries
            .get_or_create(&RetryLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Count a request that was tried more than once, by whether the last
    /// try recovered it.
    pub fn record_retried(&self, recovered: bool) {
        let outcome = if recovered { "recovered" } else { "failed" };
        self.retried.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// Set the shares each backend of each rule is given and served (after
    /// every table swap); the observed shares are read against them.
    pub fn set_shares(&self, rows: Vec<ShareRow>) {
        self.backends.set_shares(rows);
    }

    /// Every backend of the table with its shares and what it did over the
    /// last minute: the share gauges, the dashboard and the demo read it.
    pub fn backend_view(&self) -> Vec<BackendView> {
        self.backends.view(std::time::Instant::now())
    }

    pub fn record_mirror(&self, ok: bool) {
        self.mirrors.inc();
        if !ok {
            self.mirror_failures.inc();
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Labels of one rollout: the policy and the rule it governs.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutLabels {
    /// `<namespace>/<name>` of the RolloutPolicy.
    pub policy: String,
    /// `<namespace>/<name>` of the HTTPRoute, as requests label it.
    pub route: String,
    pub rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutBackendLabels {
    policy: String,
    route: String,
    rule: String,
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutSideLabels {
    policy: String,
    route: String,
    rule: String,
    /// `canary` (the incoming backends) or `stable` (the outgoing ones).
    side: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutPhaseLabels {
    policy: String,
    route: String,
    rule: String,
    phase: String,
}

/// Rollout metrics: served share per backend, step and phase, transitions.
pub struct RolloutMetrics {
    served_share: Family<RolloutBackendLabels, Gauge<f64, AtomicU64>>,
    step: Family<RolloutLabels, Gauge<f64, AtomicU64>>,
    phase: Family<RolloutPhaseLabels, Gauge>,
    transitions: Family<RolloutPhaseLabels, Counter>,
    /// The backends and phases set per rollout, to remove their series
    /// when the rollout is gone.
    shown: RwLock<HashMap<RolloutLabels, Vec<String>>>,
    /// With `consistentBy`: distinct users of the step, and of those with
    /// a 5xx, per side.
    users: Family<RolloutSideLabels, Gauge>,
    users_with_errors: Family<RolloutSideLabels, Gauge>,
    /// The rollouts whose users are shown.
    users_shown: RwLock<Vec<RolloutLabels>>,
}

impl RolloutMetrics {
    /// Every phase a rollout can be in.
    pub const PHASES: [&'static str; 5] =
        ["Waiting", "Progressing", "Paused", "Complete", "RolledBack"];

    fn register(registry: &mut Registry) -> Self {
        let served_share = Family::default();
        registry.register(
            "rollout_served_share",
            "Share of the rule's traffic each backend is served (0 to 1), by RolloutPolicy, HTTPRoute, rule and backend",
            Family::clone(&served_share),
        );
        let step = Family::default();
        registry.register(
            "rollout_step_percent",
            "The step a rollout is at (percent of the way from the shares served before to the spec's; 0 before the first step)",
            Family::clone(&step),
        );
        let phase = Family::default();
        registry.register(
            "rollout_phase",
            "1 for the phase each rollout is in (Waiting, Progressing, Paused, Complete, RolledBack), 0 for the others",
            Family::clone(&phase),
        );
        let transitions = Family::default();
        registry.register(
            "rollout_transitions",
            "Rollout transitions, by the phase entered (a step passed counts as Progressing)",
            Family::clone(&transitions),
        );
        let users = Family::default();
        registry.register(
            "rollout_users",
            "With consistentBy: distinct users (consistent-users keys) answered in the current step, by RolloutPolicy, HTTPRoute, rule and side (canary: the incoming backends, stable: the outgoing ones); estimated above 4096 per backend",
            Family::clone(&users),
        );
        let users_with_errors = Family::default();
        registry.register(
            "rollout_users_with_errors",
            "With consistentBy: distinct users that got at least one 5xx in the current step, by RolloutPolicy, HTTPRoute, rule and side",
            Family::clone(&users_with_errors),
        );
        RolloutMetrics {
            served_share,
            step,
            phase,
            transitions,
            shown: RwLock::new(HashMap::new()),
            users,
            users_with_errors,
            users_shown: RwLock::new(Vec::new()),
        }
    }

    /// Show one rollout's users in its current step: per side, the
    /// distinct users and the users with a 5xx.
    pub fn set_users(&self, labels: &RolloutLabels, sides: [(&'static str, u64, u64); 2]) {
        for (side, users, with_errors) in sides {
            let l = Self::side_labels(labels, side);
            self.users
                .get_or_create(&l)
                .set(i64::try_from(users).unwrap_or(i64::MAX));
            self.users_with_errors
                .get_or_create(&l)
                .set(i64::try_from(with_errors).unwrap_or(i64::MAX));
        }
    }

    /// Remove the user gauges of rollouts not in `current` (their policy
    /// or rule is gone, or they no longer count users).
    pub fn retain_users(&self, current: &[RolloutLabels]) {
        let mut shown = self.users_shown.write().unwrap_or_else(|p| p.into_inner());
        for gone in shown.iter().filter(|l| !current.contains(l)) {
            for side in ["canary", "stable"] {
                let l = Self::side_labels(gone, side);
                self.users.remove(&l);
                self.users_with_errors.remove(&l);
            }
        }
        *shown = current.to_vec();
    }

    fn side_labels(labels: &RolloutLabels, side: &'static str) -> RolloutSideLabels {
        RolloutSideLabels {
            policy: labels.policy.clone(),
            route: labels.route.clone(),
            rule: labels.rule.clone(),
            side,
        }
    }

    /// Show one rollout: its phase, step and each backend's served share.
    pub fn set(
        &self,
        labels: &RolloutLabels,
        phase: &str,
        step_percent: f64,
        shares: &[(String, f64)],
    ) {
        let mut shown = self.shown.write().unwrap_or_else(|p| p.into_inner());
        let backends = shown.entry(labels.clone()).or_default();
        for stale in backends
            .iter()
            .filter(|b| !shares.iter().any(|(s, _)| s == *b))
        {
            self.served_share
                .remove(&Self::backend_labels(labels, stale));
        }
        *backends = shares.iter().map(|(b, _)| b.clone()).collect();
        for (backend, share) in shares {
            self.served_share
                .get_or_create(&Self::backend_labels(labels, backend))
                .set(*share);
        }
        self.step.get_or_create(labels).set(step_percent);
        for p in Self::PHASES {
            self.phase
                .get_or_create(&Self::phase_labels(labels, p))
                .set(i64::from(p == phase));
        }
    }

    /// Count a transition of one rollout into `phase`.
    pub fn transition(&self, labels: &RolloutLabels, phase: &str) {
        self.transitions
            .get_or_create(&Self::phase_labels(labels, phase))
            .inc();
    }

    /// Remove the gauges of rollouts that are not in `current` (their
    /// policy or rule is gone). Transition counters stay: they count.
    pub fn retain(&self, current: &[RolloutLabels]) {
        let mut shown = self.shown.write().unwrap_or_else(|p| p.into_inner());
        shown.retain(|labels, backends| {
            if current.contains(labels) {
                return true;
            }
            for backend in backends.iter() {
                self.served_share
                    .remove(&Self::backend_labels(labels, backend));
            }
            self.step.remove(labels);
            for p in Self::PHASES {
                self.phase.remove(&Self::phase_labels(labels, p));
            }
            false
        });
    }

    fn backend_labels(labels: &RolloutLabels, backend: &str) -> RolloutBackendLabels {
        RolloutBackendLabels {
            policy: labels.policy.clone(),
            route: labels.route.clone(),
            rule: labels.rule.clone(),
            backend: backend.to_string(),
        }
    }

    fn phase_labels(labels: &RolloutLabels, phase: &str) -> RolloutPhaseLabels {
        RolloutPhaseLabels {
            policy: labels.policy.clone(),
            route: labels.route.clone(),
            rule: labels.rule.clone(),
            phase: phase.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_route_rule_backend_and_code() {
        let m = Metrics::new();
        let l = RequestLabels {
            route: "shop/checkout".into(),
            rule: "0".into(),
            backend: "shop/checkout-v2:80".into(),
            backend_namespace: "shop".into(),
            backend_name: "checkout-v2".into(),
            backend_port: "80".into(),
            code: 200,
        };
        m.record_request(&l, Duration::from_millis(3));
        m.record_request(&l, Duration::from_millis(3));
        let text = m.encode();
        assert!(
            text.contains(r#"sluice_requests_total{route="shop/checkout",rule="0",backend="shop/checkout-v2:80",backend_namespace="shop",backend_name="checkout-v2",backend_port="80",code="200"} 2"#),
            "{text}"
        );
        assert!(text.contains("sluice_request_duration_seconds_bucket"));
    }

    #[tokio::test]
    async fn a_governed_backend_counts_slow_responses_and_wakes_the_judge_on_events() {
        let m = Metrics::new();
        let key = RequestKey {
            kind: "",
            namespace: "shop",
            route: "checkout",
            rule: Some(0),
            backend: "shop/canary:80",
            code: 200,
        };
        let stats = BackendStatsKey {
            kind: "",
            namespace: "shop".into(),
            route: "checkout".into(),
            rule: 0,
            backend: "shop/canary:80".into(),
        };
        // Not governed yet: slow responses are not counted, nothing wakes.
        m.record(&key, Duration::from_secs(1));
        m.record(&RequestKey { code: 500, ..key }, Duration::from_millis(1));
        assert_eq!(m.backend_total(&stats).slow, 0);
        assert!(!m.rollout_events().pending.load(Ordering::Relaxed));
        m.govern(&[(stats.clone(), Some(Duration::from_millis(100)))]);
        m.record(&key, Duration::from_millis(1));
        assert!(
            !m.rollout_events().pending.load(Ordering::Relaxed),
            "a fast 200 is no event"
        );
        m.record(&key, Duration::from_millis(150));
        assert_eq!(m.backend_total(&stats).slow, 1);
        m.record(&RequestKey { code: 503, ..key }, Duration::from_millis(1));
        // Two events, one wake pending: the wait returns at once.
        m.rollout_events().next().await;
        assert!(!m.rollout_events().pending.load(Ordering::Relaxed));
        m.govern(&[]);
        m.record(&RequestKey { code: 500, ..key }, Duration::from_millis(1));
        assert!(
            !m.rollout_events().pending.load(Ordering::Relaxed),
            "no longer governed"
        );
        let t = m.backend_total(&stats);
        assert_eq!((t.requests, t.errors, t.slow), (6, 3, 1));
        // Readings add field by field (replicas' counts are summed so).
        let sum = t + t;
        assert_eq!((sum.requests, sum.errors, sum.slow), (12, 6, 2));
    }

    #[test]
    fn borrowed_keys_count_into_the_same_series_as_owned_labels() {
        let m = Metrics::new();
        let key = RequestKey {
            kind: "",
            namespace: "shop",
            route: "checkout",
            rule: Some(0),
            backend: "shop/checkout-v2:80",
            code: 200,
        };
        m.record(&key, Duration::from_millis(1));
        m.record(&key, Duration::from_millis(1));
        m.record_request(&key.labels(), Duration::from_millis(1));
        m.record(&RequestKey { code: 503, ..key }, Duration::from_millis(1));
        // A GRPCRoute of the same name counts apart.
        m.record(
            &RequestKey {
                kind: "GRPCRoute ",
                ..key
            },
            Duration::from_millis(1),
        );
        m.record(
            &RequestKey {
                code: 404,
                ..RequestKey::default()
            },
            Duration::from_millis(1),
        );
        let text = m.encode();
        for line in [
            r#"sluice_requests_total{route="shop/checkout",rule="0",backend="shop/checkout-v2:80",backend_namespace="shop",backend_name="checkout-v2",backend_port="80",code="200"} 3"#,
            r#"sluice_requests_total{route="shop/checkout",rule="0",backend="shop/checkout-v2:80",backend_namespace="shop",backend_name="checkout-v2",backend_port="80",code="503"} 1"#,
            r#"sluice_requests_total{route="",rule="",backend="",backend_namespace="",backend_name="",backend_port="",code="404"} 1"#,
            r#"sluice_requests_total{route="GRPCRoute shop/checkout",rule="0",backend="shop/checkout-v2:80",backend_namespace="shop",backend_name="checkout-v2",backend_port="80",code="200"} 1"#,
            r#"sluice_request_duration_seconds_count{route="shop/checkout"} 4"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn keys_differing_in_one_field_hash_apart_or_compare_apart() {
        let a = RequestKey {
            namespace: "ab",
            route: "c",
            ..RequestKey::default()
        };
        let b = RequestKey {
            namespace: "a",
            route: "bc",
            ..RequestKey::default()
        };
        assert_ne!(a.hash(), b.hash());
        let m = Metrics::new();
        m.record(&a, Duration::ZERO);
        m.record(&b, Duration::ZERO);
        let text = m.encode();
        assert!(text.contains(r#"route="ab/c""#), "{text}");
        assert!(text.contains(r#"route="a/bc""#), "{text}");
    }

    #[test]
    fn backend_outcomes_count_requests_5xx_and_latency() {
        let m = Metrics::new();
        let key = RequestKey {
            kind: "",
            namespace: "shop",
            route: "checkout",
            rule: Some(1),
            backend: "shop/canary:80",
            code: 200,
        };
        m.record(&key, Duration::from_millis(4));
        m.record(&key, Duration::from_millis(4));
        m.record(&RequestKey { code: 503, ..key }, Duration::from_micros(100));
        m.record(&RequestKey { code: 404, ..key }, Duration::from_secs(100));
        // No backend chosen: nothing to count per backend.
        m.record(&RequestKey { backend: "", ..key }, Duration::ZERO);
        let stats_key = BackendStatsKey {
            kind: "",
            namespace: "shop".into(),
            route: "checkout".into(),
            rule: 1,
            backend: "shop/canary:80".into(),
        };
        let t = m.backend_total(&stats_key);
        assert_eq!((t.requests, t.errors), (4, 1));
        assert_eq!(t.latency[0], 1, "100 µs is in the first bucket");
        assert_eq!(
            t.latency[LATENCY_BUCKETS - 1],
            1,
            "100 s is past every bound"
        );
        assert_eq!(t.latency.iter().sum::<u64>(), 4);
        assert_eq!(m.backend_totals(), vec![(stats_key.clone(), t)]);
        let other = BackendStatsKey {
            rule: 0,
            ..stats_key.clone()
        };
        assert_eq!(m.backend_total(&other), BackendTotals::default());
        // A GRPCRoute of the same name counts apart.
        m.record(
            &RequestKey {
                kind: "GRPCRoute ",
                ..key
            },
            Duration::from_millis(1),
        );
        assert_eq!(m.backend_total(&stats_key), t);
    }

    #[test]
    fn backend_labels_split_into_namespace_name_and_port() {
        assert_eq!(backend_parts("shop/web:80"), ("shop", "web", "80"));
        assert_eq!(backend_parts("shop/web"), ("shop", "web", ""));
        assert_eq!(
            backend_parts("ServiceImport.multicluster.x-k8s.io shop/web:80"),
            ("shop", "web", "80")
        );
        assert_eq!(backend_parts(""), ("", "", ""));
    }

    #[test]
    fn share_gauges_show_spec_served_and_observed_shares() {
        let m = Metrics::new();
        let key = |backend: &str| BackendStatsKey {
            kind: "",
            namespace: "shop".into(),
            route: "checkout".into(),
            rule: 0,
            backend: backend.into(),
        };
        m.set_shares(vec![
            ShareRow {
                key: key("shop/stable:80"),
                spec: 0.995,
                served: 0.95,
            },
            ShareRow {
                key: key("shop/canary:80"),
                spec: 0.005,
                served: 0.05,
            },
        ]);
        let request = |backend: &'static str| RequestKey {
            kind: "",
            namespace: "shop",
            route: "checkout",
            rule: Some(0),
            backend,
            code: 200,
        };
        for _ in 0..3 {
            m.record(&request("shop/stable:80"), Duration::from_millis(2));
        }
        m.record(&request("shop/canary:80"), Duration::from_millis(20));
        let text = m.encode();
        let labels = r#"route="shop/checkout",rule="0",backend="shop/canary:80",backend_namespace="shop",backend_name="canary",backend_port="80""#;
        for line in [
            format!("sluice_backend_spec_share{{{labels}}} 0.005"),
            format!("sluice_backend_served_share{{{labels}}} 0.05"),
            format!("sluice_backend_observed_share{{{labels}}} 0.25"),
            format!("sluice_backend_request_duration_seconds_count{{{labels}}} 1"),
            format!("sluice_backend_request_duration_seconds_sum{{{labels}}} 0.02"),
            format!(r#"sluice_backend_request_duration_seconds_bucket{{le="0.03",{labels}}} 1"#),
        ] {
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
        let view = m.backend_view();
        assert_eq!(view.len(), 2);
        assert_eq!(view[0].observed_share, Some(0.75));
        assert_eq!((view[1].window_requests, view[1].requests), (1, 1));
    }

    #[test]
    fn the_observed_window_moves_with_readings() {
        let b = shares::Backends::default();
        let key = BackendStatsKey {
            kind: "",
            namespace: "n".into(),
            route: "r".into(),
            rule: 0,
            backend: "n/a:80".into(),
        };
        let other = BackendStatsKey {
            backend: "n/b:80".into(),
            ..key.clone()
        };
        let stats = |k: &BackendStatsKey| {
            let mut all = b.stats.write().unwrap();
            all.entry(k.clone()).or_default().clone()
        };
        let t0 = std::time::Instant::now();
        for _ in 0..10 {
            stats(&key).record(200, Duration::ZERO, None);
        }
        // First reading: everything since the start counts.
        assert_eq!(b.view(t0)[0].observed_share, Some(1.0));
        // Then only b answers: after a minute and more, the window holds
        // only what came after the reading that is a minute old.
        for s in [11, 22, 33, 44, 55, 66] {
            stats(&other).record(200, Duration::ZERO, None);
            b.view(t0 + Duration::from_secs(s));
        }
        let view = b.view(t0 + Duration::from_secs(67));
        let share = |k: &BackendStatsKey| {
            view.iter()
                .find(|v| &v.key == k)
                .and_then(|v| v.observed_share)
        };
        assert_eq!(share(&other), Some(1.0), "{view:?}");
        assert_eq!(share(&key), Some(0.0));
    }

    #[test]
    fn latency_quantiles_interpolate_within_buckets() {
        let mut t = BackendTotals::default();
        assert_eq!(t.latency_quantile(0.99), None);
        // 100 responses between 10 and 15 ms: the p99 is 99% of the way.
        t.latency[LATENCY_BOUNDS_MICROS.partition_point(|b| *b < 12_000)] = 100;
        assert_eq!(
            t.latency_quantile(0.99),
            Some(Duration::from_micros(14_950))
        );
        assert_eq!(t.latency_quantile(0.5), Some(Duration::from_micros(12_500)));
        // One slow response in 100 is the p99; two are above it.
        t.latency[LATENCY_BUCKETS - 1] = 2;
        assert_eq!(t.latency_quantile(0.99), Some(Duration::from_secs(60)));
        let later = t.plus(&t);
        assert_eq!(later.since(&t), t);
    }

    #[test]
    fn users_are_counted_per_backend_and_step_while_tracked() {
        let m = Metrics::new();
        let key = RequestKey {
            kind: "",
            namespace: "shop",
            route: "checkout",
            rule: Some(0),
            backend: "shop/canary:80",
            code: 200,
        };
        let stats = BackendStatsKey {
            kind: "",
            namespace: "shop".into(),
            route: "checkout".into(),
            rule: 0,
            backend: "shop/canary:80".into(),
        };
        let user = |i: u64| Some(crate::route::stable_hash(format!("u{i}").as_bytes()));
        // Not tracked: users are not counted.
        m.record_user(&key, Duration::ZERO, user(1));
        assert_eq!(m.backend_total(&stats).users, 0);
        m.track_users(&[(stats.clone(), "5%@t1".into())]);
        for i in 0..3 {
            m.record_user(&key, Duration::ZERO, user(i));
            m.record_user(&key, Duration::ZERO, user(i));
        }
        // User 0 fails three times; a request without a key fails once.
        for _ in 0..3 {
            m.record_user(&RequestKey { code: 503, ..key }, Duration::ZERO, user(0));
        }
        m.record(&RequestKey { code: 500, ..key }, Duration::ZERO);
        let t = m.backend_total(&stats);
        assert_eq!(
            (
                t.requests,
                t.errors,
                t.users,
                t.users_with_errors,
                t.repeated_errors
            ),
            (11, 4, 3, 1, 2)
        );
        // The same step again changes nothing; a new step counts afresh,
        // on top of the step before.
        m.track_users(&[(stats.clone(), "5%@t1".into())]);
        assert_eq!(m.backend_total(&stats), t);
        m.track_users(&[(stats.clone(), "25%@t2".into())]);
        m.record_user(&RequestKey { code: 503, ..key }, Duration::ZERO, user(0));
        m.record_user(&key, Duration::ZERO, user(9));
        let later = m.backend_total(&stats).since(&t);
        assert_eq!(
            (later.users, later.users_with_errors, later.repeated_errors),
            (2, 1, 0)
        );
        // Untracked: nothing more counted, the counts kept.
        m.track_users(&[]);
        let before = m.backend_total(&stats);
        m.record_user(&key, Duration::ZERO, user(42));
        assert_eq!(m.backend_total(&stats).users, before.users);
    }

    #[test]
    fn user_counts_are_published_only_when_counted_and_read_back() {
        let none = serde_json::to_string(&BackendTotals::default()).expect("serializes");
        assert!(
            !none.contains("users") && !none.contains("repeated"),
            "{none}"
        );
        let counted = BackendTotals {
            requests: 9,
            errors: 4,
            users: 3,
            users_with_errors: 1,
            repeated_errors: 3,
            users_estimated: 1,
            ..BackendTotals::default()
        };
        let text = serde_json::to_string(&counted).expect("serializes");
        let back: BackendTotals = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, counted);
        // Replicas' counts add up (each counts its own users).
        let sum = back + counted;
        assert_eq!((sum.users, sum.repeated_errors), (6, 6));
    }

    #[test]
    fn rollout_user_gauges_are_set_by_side_and_removed() {
        let m = Metrics::new();
        let labels = RolloutLabels {
            policy: "shop/p".into(),
            route: "shop/r".into(),
            rule: "0".into(),
        };
        m.rollouts()
            .set_users(&labels, [("canary", 12, 3), ("stable", 230, 1)]);
        let text = m.encode();
        for line in [
            r#"sluice_rollout_users{policy="shop/p",route="shop/r",rule="0",side="canary"} 12"#,
            r#"sluice_rollout_users{policy="shop/p",route="shop/r",rule="0",side="stable"} 230"#,
            r#"sluice_rollout_users_with_errors{policy="shop/p",route="shop/r",rule="0",side="canary"} 3"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        m.rollouts().retain_users(std::slice::from_ref(&labels));
        assert!(m.encode().contains("sluice_rollout_users{"));
        m.rollouts().retain_users(&[]);
        let text = m.encode();
        assert!(!text.contains("sluice_rollout_users{"), "{text}");
        assert!(
            !text.contains("sluice_rollout_users_with_errors{"),
            "{text}"
        );
    }

    #[test]
    fn rollout_series_are_set_and_removed() {
        let m = Metrics::new();
        let labels = RolloutLabels {
            policy: "shop/p".into(),
            route: "shop/r".into(),
            rule: "0".into(),
        };
        m.rollouts().set(
            &labels,
            "Progressing",
            5.0,
            &[("shop/a:80".into(), 0.95), ("shop/b:80".into(), 0.05)],
        );
        m.rollouts().transition(&labels, "Progressing");
        let text = m.encode();
        for line in [
            r#"sluice_rollout_served_share{policy="shop/p",route="shop/r",rule="0",backend="shop/b:80"} 0.05"#,
            r#"sluice_rollout_step_percent{policy="shop/p",route="shop/r",rule="0"} 5.0"#,
            r#"sluice_rollout_phase{policy="shop/p",route="shop/r",rule="0",phase="Progressing"} 1"#,
            r#"sluice_rollout_phase{policy="shop/p",route="shop/r",rule="0",phase="Waiting"} 0"#,
            r#"sluice_rollout_transitions_total{policy="shop/p",route="shop/r",rule="0",phase="Progressing"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        m.rollouts().retain(&[]);
        let text = m.encode();
        assert!(!text.contains("sluice_rollout_served_share{"), "{text}");
        assert!(!text.contains("sluice_rollout_phase{"), "{text}");
        assert!(text.contains("sluice_rollout_transitions_total{"), "{text}");
    }

    #[test]
    fn a_whole_reading_counts_each_response_in_full() {
        // Two threads count 5xx of 50 users (each user's first error, then
        // repeated ones) while a third reads: a whole reading agrees with
        // itself, whenever it is taken.
        let stats = Arc::new(BackendStats::default());
        stats.track_users(Some("5%@t"));
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let stats = stats.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let user =
                            crate::route::stable_hash(format!("u{}", (i + w) % 50).as_bytes());
                        stats.record(503, Duration::ZERO, Some(user));
                    }
                })
            })
            .collect();
        while writers.iter().any(|w| !w.is_finished()) {
            if let (t, true) = stats.reading() {
                assert_eq!(t.requests, t.errors, "{t:?}");
                assert_eq!(t.errors - t.repeated_errors, t.users_with_errors, "{t:?}");
            }
        }
        for w in writers {
            w.join().expect("a writer");
        }
        // Nothing counted any more: the reading is whole.
        let (t, whole) = stats.reading();
        assert!(whole);
        assert_eq!((t.requests, t.users, t.users_with_errors), (40_000, 50, 50));
        assert_eq!(t.repeated_errors, 40_000 - 50);
    }
}
