//! Prometheus metrics, served as text at the admin listener's `/metrics`.
//!
//! One registry for the process. The proxy records one sample per request;
//! the file source records configuration loads and parse errors.
//!
//! The per-request path ([`Metrics::record`]) takes its labels borrowed from
//! the route table and finds the label set's counter and histogram in a
//! cache under one read lock: no allocation once a (rule, backend, code) has
//! been seen. Label sets are built as Strings only the first time.

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

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
    pub code: u16,
}

/// A request's labels borrowed from the route table: what the proxy
/// passes for every request (see [`Metrics::record`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestKey<'a> {
    /// Written before the route: empty for an HTTPRoute (whose labels are
    /// as they always were), `GRPCRoute ` for a GRPCRoute.
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
        RequestLabels {
            route: if self.namespace.is_empty() && self.route.is_empty() {
                String::new()
            } else {
                format!("{}{}/{}", self.kind, self.namespace, self.route)
            },
            rule: self.rule.map(|i| i.to_string()).unwrap_or_default(),
            backend: self.backend.to_string(),
            code: self.code,
        }
    }

    /// FNV-1a over the fields, each followed by a separator.
    fn hash(&self) -> u64 {
        let mut h = Fnv::default();
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

struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
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
struct RouteLabel {
    route: String,
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
    series: RwLock<HashMap<u64, Vec<CachedSeries>>>,
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
        Metrics {
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
            series: RwLock::new(HashMap::new()),
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
        let hash = key.hash();
        {
            let series = self.series.read().unwrap_or_else(|p| p.into_inner());
            if let Some(s) = series.get(&hash).and_then(|b| b.iter().find(|s| s.is(key))) {
                s.requests.inc();
                s.latency.observe(elapsed.as_secs_f64());
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
            });
        }
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
            code: 200,
        };
        m.record_request(&l, Duration::from_millis(3));
        m.record_request(&l, Duration::from_millis(3));
        let text = m.encode();
        assert!(
            text.contains(r#"sluice_requests_total{route="shop/checkout",rule="0",backend="shop/checkout-v2:80",code="200"} 2"#),
            "{text}"
        );
        assert!(text.contains("sluice_request_duration_seconds_bucket"));
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
            r#"sluice_requests_total{route="shop/checkout",rule="0",backend="shop/checkout-v2:80",code="200"} 3"#,
            r#"sluice_requests_total{route="shop/checkout",rule="0",backend="shop/checkout-v2:80",code="503"} 1"#,
            r#"sluice_requests_total{route="",rule="",backend="",code="404"} 1"#,
            r#"sluice_requests_total{route="GRPCRoute shop/checkout",rule="0",backend="shop/checkout-v2:80",code="200"} 1"#,
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
}
