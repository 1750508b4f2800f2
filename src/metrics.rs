//! Prometheus metrics, served as text at the admin listener's `/metrics`.
//!
//! One registry for the process. The proxy records one sample per request;
//! the file source records configuration loads and parse errors.

use std::sync::Arc;
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
    /// `<namespace>/<name>` of the HTTPRoute, empty when no route matched.
    pub route: String,
    /// Rule index within the route, empty when no route matched.
    pub rule: String,
    /// `<namespace>/<service>:<port>`, empty when no backend was chosen.
    pub backend: String,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FileLabels {
    file: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
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
            "Requests served, by HTTPRoute, rule, backend and status code",
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
        Metrics {
            registry,
            requests,
            latency,
            config_errors,
            config_reloads,
            mirrors,
            mirror_failures,
            config_generation,
        }
    }

    pub fn shared() -> Arc<Self> {
        Arc::new(Self::new())
    }

    /// Record one request's outcome.
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
}
