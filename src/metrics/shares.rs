//! The per-backend series a scrape computes rather than the request path
//! counts: the spec, served and observed shares of each backend of each
//! rule, and its latency histogram.
//!
//! The request path only does what it did before (atomic increments of
//! [`BackendStats`]); shares are set once per table swap
//! ([`super::Metrics::set_shares`]) and the observed share is the
//! difference of two readings of the counters, taken when `/metrics` or
//! the dashboard is read.
//!
//! The observed share is over the last minute, not the last N requests of
//! the rule: a minute is what an operator compares with a Prometheus
//! `rate(...[1m])`, it needs no per-request bookkeeping (a count window
//! would need a ring per rule written by every request), and a rule with
//! little traffic shows recent traffic instead of requests hours old.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use serde::Serialize;

use super::{BackendStats, BackendStatsKey, BackendTotals, LATENCY_BOUNDS_MICROS, backend_parts};

/// How far back the observed share looks.
pub const OBSERVED_WINDOW: Duration = Duration::from_secs(60);

/// Readings of the counters are kept at most this often, so that a window
/// holds a bounded number of them (the window is 60 to 70 s long).
const READING_EVERY: Duration = Duration::from_secs(10);

/// One backend of one rule as the route table serves it, set after every
/// table swap.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareRow {
    pub key: BackendStatsKey,
    /// The spec's share of the rule's traffic (0 to 1).
    pub spec: f64,
    /// The share served (0 to 1): the spec's, or a rollout's step.
    pub served: f64,
}

/// Labels of the per-backend series: the route and rule, and the backend
/// both as one label and in parts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BackendLabels {
    route: String,
    rule: String,
    backend: String,
    backend_namespace: String,
    backend_name: String,
    backend_port: String,
}

impl BackendLabels {
    fn of(key: &BackendStatsKey) -> Self {
        let (namespace, name, port) = backend_parts(&key.backend);
        BackendLabels {
            route: format!("{}{}/{}", key.kind, key.namespace, key.route),
            rule: key.rule.to_string(),
            backend: key.backend.clone(),
            backend_namespace: namespace.to_string(),
            backend_name: name.to_string(),
            backend_port: port.to_string(),
        }
    }
}

/// What one backend of one rule is doing: its shares and outcomes.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendView {
    #[serde(skip)]
    pub key: BackendStatsKey,
    /// The spec's share (0 to 1); `None` for a backend only counted (its
    /// rule is gone from the table).
    pub spec_share: Option<f64>,
    pub served_share: Option<f64>,
    /// Share of the rule's requests it answered over the window; `None`
    /// when the rule had none.
    pub observed_share: Option<f64>,
    /// Requests and 5xx over the window, and its length in seconds.
    pub window_requests: u64,
    pub window_errors: u64,
    pub window_seconds: f64,
    /// The 99th percentile latency over the window, in milliseconds.
    pub p99_ms: Option<f64>,
    /// Since the gateway started.
    pub requests: u64,
    pub errors: u64,
}

/// A reading of every backend's counters.
struct Reading {
    at: Instant,
    totals: HashMap<BackendStatsKey, BackendTotals>,
}

/// The per-backend state the request path and the scrape share.
#[derive(Default)]
pub(super) struct Backends {
    pub(super) stats: RwLock<HashMap<BackendStatsKey, Arc<BackendStats>>>,
    shares: RwLock<Arc<Vec<ShareRow>>>,
    readings: Mutex<VecDeque<Reading>>,
    started: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Backends")
    }
}

impl Backends {
    pub(super) fn set_shares(&self, rows: Vec<ShareRow>) {
        *self.shares.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(rows);
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(Instant::now);
    }

    fn totals_now(&self) -> HashMap<BackendStatsKey, BackendTotals> {
        let all = self.stats.read().unwrap_or_else(|p| p.into_inner());
        all.iter().map(|(k, s)| (k.clone(), s.totals())).collect()
    }

    /// Every backend of the table (in rule order), then the backends only
    /// counted, with what they did over the window.
    pub(super) fn view(&self, now: Instant) -> Vec<BackendView> {
        let current = self.totals_now();
        let mut readings = self.readings.lock().unwrap_or_else(|p| p.into_inner());
        // Keep the newest reading at least a window old, and those after.
        while readings.len() >= 2 && now.duration_since(readings[1].at) >= OBSERVED_WINDOW {
            readings.pop_front();
        }
        // The window starts at that reading; before a reading is a window
        // old, at the start (everything counted so far).
        let started = *self.started.lock().unwrap_or_else(|p| p.into_inner());
        let (since, base) = match readings.front() {
            Some(r) if now.duration_since(r.at) >= OBSERVED_WINDOW => (r.at, Some(&r.totals)),
            _ => (started.unwrap_or(now), None),
        };
        let window = now.duration_since(since);
        let mut windowed: HashMap<&BackendStatsKey, BackendTotals> = current
            .iter()
            .map(|(k, t)| {
                let before = base.and_then(|b| b.get(k)).copied().unwrap_or_default();
                (k, t.since(&before))
            })
            .collect();
        // Requests per rule over the window.
        let mut per_rule: HashMap<(&str, &str, &str, usize), u64> = HashMap::new();
        for (k, t) in &windowed {
            *per_rule
                .entry((k.kind, &k.namespace, &k.route, k.rule))
                .or_default() += t.requests;
        }
        let shares = self
            .shares
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let view_of = |key: &BackendStatsKey, spec, served, t: BackendTotals| {
            let rule_total = per_rule
                .get(&(
                    key.kind,
                    key.namespace.as_str(),
                    key.route.as_str(),
                    key.rule,
                ))
                .copied()
                .unwrap_or(0);
            let all = current.get(key).copied().unwrap_or_default();
            BackendView {
                key: key.clone(),
                spec_share: spec,
                served_share: served,
                observed_share: (rule_total > 0).then(|| t.requests as f64 / rule_total as f64),
                window_requests: t.requests,
                window_errors: t.errors,
                window_seconds: window.as_secs_f64(),
                p99_ms: t.latency_quantile(0.99).map(|d| d.as_secs_f64() * 1000.0),
                requests: all.requests,
                errors: all.errors,
            }
        };
        let mut out = Vec::with_capacity(shares.len());
        for row in shares.iter() {
            let t = windowed.remove(&row.key).unwrap_or_default();
            out.push(view_of(&row.key, Some(row.spec), Some(row.served), t));
        }
        let rest: BTreeMap<_, _> = windowed.into_iter().collect();
        for (key, t) in rest {
            out.push(view_of(key, None, None, t));
        }
        let newest = readings.back().map(|r| r.at);
        if newest.is_none_or(|at| now.duration_since(at) >= READING_EVERY) {
            readings.push_back(Reading {
                at: now,
                totals: current.clone(),
            });
        }
        out
    }
}

/// Encodes the per-backend series at each scrape.
#[derive(Debug)]
pub(super) struct BackendCollector(pub(super) Arc<Backends>);

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: &[(BackendLabels, f64)],
) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for BackendCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let view = self.0.view(Instant::now());
        let labelled: Vec<(BackendLabels, &BackendView)> = view
            .iter()
            .map(|v| (BackendLabels::of(&v.key), v))
            .collect();
        let pick = |f: &dyn Fn(&BackendView) -> Option<f64>| -> Vec<(BackendLabels, f64)> {
            labelled
                .iter()
                .filter_map(|(l, v)| f(v).map(|x| (l.clone(), x)))
                .collect()
        };
        gauge(
            &mut encoder,
            "backend_spec_share",
            "Share of its rule's traffic the spec gives each backendRef (weight / sum of weights, 0 to 1)",
            &pick(&|v| v.spec_share),
        )?;
        gauge(
            &mut encoder,
            "backend_served_share",
            "Share of its rule's traffic each backendRef is served (0 to 1): the spec's, or a rollout's step",
            &pick(&|v| v.served_share),
        )?;
        gauge(
            &mut encoder,
            "backend_observed_share",
            "Share of its rule's requests each backendRef answered over the last minute (0 to 1; from the newest reading at least 60 s old, readings at most every 10 s when /metrics or the dashboard is read); absent when the rule had no request",
            &pick(&|v| v.observed_share),
        )?;
        // The latency histogram of each backend, from the outcome counters.
        let mut family = encoder.encode_descriptor(
            "backend_request_duration_seconds",
            "Time from request received to response headers sent, by route, rule and backend",
            None,
            MetricType::Histogram,
        )?;
        let all = self.0.stats.read().unwrap_or_else(|p| p.into_inner());
        let mut keys: Vec<_> = all.keys().collect();
        keys.sort();
        for key in keys {
            let stats = &all[key];
            let t = stats.totals();
            // Per bucket, not cumulative: the encoder sums them up; the
            // last bound is written `+Inf`.
            let buckets: Vec<(f64, u64)> = t
                .latency
                .iter()
                .enumerate()
                .map(|(i, count)| {
                    let bound = LATENCY_BOUNDS_MICROS
                        .get(i)
                        .map_or(f64::MAX, |m| *m as f64 / 1e6);
                    (bound, *count)
                })
                .collect();
            let labels = BackendLabels::of(key);
            family
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(
                    stats.latency_sum_seconds(),
                    t.latency.iter().sum(),
                    &buckets,
                    None,
                )?;
        }
        Ok(())
    }
}
