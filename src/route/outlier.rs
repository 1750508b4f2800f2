//! What the proxy remembers about each backend's endpoints between
//! requests and across route tables: passive outlier ejection, and the
//! number of requests in flight to the backend (its overload cap).
//!
//! Outlier ejection follows Envoy's outlier detection (`consecutive_5xx`,
//! which also counts connection failures), HAProxy's `observe layer7` and
//! nginx's `max_fails`: an endpoint whose last N tries in a row failed (a
//! 5xx answer, a refused or reset connection, a per-try timeout) stops
//! getting new requests for a while, 30 s the first time and that much
//! longer each time it is ejected again soon after (at most the maximum).
//! Ejection is only ever *within* a backend: the weighted choice of the
//! backendRef is made before, so a backend's share never moves to another
//! backend (the spec's rule). At most half of a backend's endpoints are
//! ejected at once, so at least one always stays.
//!
//! State is keyed by backend identity (the Service as `ns/name:port`) and
//! endpoint address, like the connection pools, so an ejection outlives a
//! reload that keeps the endpoint. A route table's [`EndpointSet`] finds
//! its entries once ([`Outliers::resolve`]) and keeps them; the hot path
//! then touches one atomic per endpoint it considers, and reads the clock
//! only while something of that backend is ejected.
//!
//! Nothing here logs, counts or sleeps: [`Outliers::record`] and
//! [`Outliers::sweep`] return what happened and the proxy reports it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use super::EndpointSet;
use crate::FastMap;

/// The outlier ejection knobs (Envoy's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierPolicy {
    /// Failed tries in a row that eject an endpoint; 0 turns ejection
    /// off. Envoy: `consecutive_5xx: 5`.
    pub consecutive_failures: u32,
    /// How long a first ejection lasts; the n-th lasts n times as long.
    /// Envoy: `base_ejection_time: 30s`.
    pub base_ejection: Duration,
    /// The longest an ejection lasts. Envoy: `max_ejection_time: 300s`.
    pub max_ejection: Duration,
}

impl Default for OutlierPolicy {
    fn default() -> Self {
        OutlierPolicy {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
        }
    }
}

/// How one try to an endpoint failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The endpoint answered with this 5xx status (or, for gRPC, with a
    /// `grpc-status` that stands for one).
    Status(u16),
    /// No connection could be made.
    Connect,
    /// The connection broke before the response head.
    Reset,
    /// No response head in time.
    Timeout,
}

impl Failure {
    /// The `reason` label of the ejection metrics.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Status(_) => "5xx",
            Failure::Connect => "connect_failure",
            Failure::Reset => "reset",
            Failure::Timeout => "timeout",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Status(code) => write!(f, "answered {code}"),
            Failure::Connect => f.write_str("connection failed"),
            Failure::Reset => f.write_str("connection reset"),
            Failure::Timeout => f.write_str("timed out"),
        }
    }
}

/// An endpoint taken out of its backend's rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ejection {
    pub backend: Arc<str>,
    pub endpoint: SocketAddr,
    /// The failure that made it (the last of the run).
    pub reason: Failure,
    /// Failed tries in a row.
    pub failures: u32,
    /// How long it is out.
    pub duration: Duration,
    /// Times it was ejected, this one included (decays while it behaves).
    pub times: u32,
    /// Endpoints of the backend out now, this one included.
    pub ejected_now: usize,
}

/// An endpoint back in its backend's rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Return {
    pub backend: Arc<str>,
    pub endpoint: SocketAddr,
    /// Endpoints of the backend still out.
    pub ejected_now: usize,
}

/// All backends' endpoint state. Outlives route tables.
#[derive(Debug)]
pub struct Outliers {
    policy: OutlierPolicy,
    epoch: Instant,
    backends: Mutex<FastMap<Arc<str>, Arc<BackendHealth>>>,
    /// Added to the clock (tests move time forward).
    #[cfg(test)]
    skew_ms: AtomicU64,
}

/// One backend's state: its requests in flight, and its endpoints'.
#[derive(Debug)]
pub struct BackendHealth {
    service: Arc<str>,
    in_flight: AtomicUsize,
    /// Endpoints ejected and not yet swept back: while 0, the hot path
    /// never looks at the clock or the endpoints' state.
    ejected: AtomicUsize,
    endpoints: Mutex<FastMap<SocketAddr, Arc<EndpointHealth>>>,
    /// Ejection decisions of this backend are made one at a time.
    deciding: Mutex<()>,
}

/// One endpoint's state.
#[derive(Debug)]
pub struct EndpointHealth {
    addr: SocketAddr,
    consecutive: AtomicU32,
    /// Milliseconds since [`Outliers`]' epoch until which it is out; 0
    /// when in service.
    ejected_until: AtomicU64,
    record: Mutex<Record>,
}

/// What an endpoint's ejections were.
#[derive(Debug, Clone, Default)]
struct Record {
    times: u32,
    since_ms: u64,
    since: Option<SystemTime>,
    until_ms: u64,
    reason: Option<Failure>,
    failures: u32,
    /// When its last ejection ended (ms since the epoch).
    ended_ms: Option<u64>,
}

/// A route table's view of one backend: its state and its endpoints', in
/// the order of the [`EndpointSet`]'s addresses.
#[derive(Debug)]
pub struct SetHealth {
    pub backend: Arc<BackendHealth>,
    endpoints: Box<[Arc<EndpointHealth>]>,
}

/// A request counted against its backend's cap until dropped.
#[derive(Debug)]
pub struct InFlight<'a>(&'a BackendHealth);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One endpoint's ejection state, as the admin listener shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointReport {
    pub backend: String,
    pub endpoint: SocketAddr,
    /// Out of rotation now.
    pub ejected: bool,
    /// When the current or last ejection started.
    pub since: Option<SystemTime>,
    /// What is left of the current ejection.
    pub remaining: Option<Duration>,
    /// The failure that ended the run that ejected it.
    pub reason: Option<Failure>,
    /// Failed tries in a row that ejected it.
    pub failures: u32,
    /// Times ejected (one is forgiven per ejection period in service).
    pub ejections: u32,
    /// Failed tries in a row now.
    pub consecutive_failures: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is a few field writes that cannot
    // panic halfway: a poisoned lock still holds consistent data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EndpointHealth {
    fn new(addr: SocketAddr) -> Self {
        EndpointHealth {
            addr,
            consecutive: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            record: Mutex::new(Record::default()),
        }
    }

    fn is_ejected(&self, now_ms: u64) -> bool {
        self.ejected_until.load(Ordering::Acquire) > now_ms
    }
}

impl BackendHealth {
    fn new(service: Arc<str>) -> Self {
        BackendHealth {
            service,
            in_flight: AtomicUsize::new(0),
            ejected: AtomicUsize::new(0),
            endpoints: Mutex::new(FastMap::default()),
            deciding: Mutex::new(()),
        }
    }

    /// Count a request against the backend's cap: `None` when `max`
    /// requests are in flight already (0: no cap).
    pub fn begin(&self, max: usize) -> Option<InFlight<'_>> {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if max != 0 && before >= max {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(InFlight(self))
    }

    /// Requests in flight to the backend now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    pub fn service(&self) -> &str {
        &self.service
    }

    fn ejected_now(&self, now_ms: u64) -> usize {
        lock(&self.endpoints)
            .values()
            .filter(|e| e.is_ejected(now_ms))
            .count()
    }
}

impl SetHealth {
    /// The endpoint at `index` of the set is out of rotation now.
    pub fn is_ejected(&self, outliers: &Outliers, index: usize) -> bool {
        self.backend.ejected.load(Ordering::Acquire) != 0
            && self.endpoints[index].is_ejected(outliers.now_ms())
    }
}

impl Outliers {
    pub fn new(policy: OutlierPolicy) -> Self {
        Outliers {
            policy,
            epoch: Instant::now(),
            backends: Mutex::new(FastMap::default()),
            #[cfg(test)]
            skew_ms: AtomicU64::new(0),
        }
    }

    pub fn policy(&self) -> &OutlierPolicy {
        &self.policy
    }

    fn now_ms(&self) -> u64 {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        #[cfg(test)]
        let now = now.saturating_add(self.skew_ms.load(Ordering::Relaxed));
        now
    }

    /// Move this detector's clock forward (tests).
    #[cfg(test)]
    fn advance(&self, by: Duration) {
        self.skew_ms
            .fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }

    /// The state of `service`'s backend and of each address of `set`,
    /// made when first asked for.
    pub fn resolve(&self, service: &str, addrs: &[SocketAddr]) -> SetHealth {
        let backend = {
            let mut backends = lock(&self.backends);
            match backends.get(service) {
                Some(b) => b.clone(),
                None => {
                    let name: Arc<str> = Arc::from(service);
                    let b = Arc::new(BackendHealth::new(name.clone()));
                    backends.insert(name, b.clone());
                    b
                }
            }
        };
        let endpoints = {
            let mut known = lock(&backend.endpoints);
            addrs
                .iter()
                .map(|a| {
                    known
                        .entry(*a)
                        .or_insert_with(|| Arc::new(EndpointHealth::new(*a)))
                        .clone()
                })
                .collect()
        };
        SetHealth { backend, endpoints }
    }

    /// The endpoint (its index in `set`) for the next request: round
    /// robin over those in rotation. Each request takes counter values
    /// until one lands on an endpoint in rotation, so the others share
    /// an ejected endpoint's turns evenly. When every one is out (the
    /// backend shrank under its ejections), round robin over all.
    pub fn pick(&self, set: &EndpointSet, health: &SetHealth) -> usize {
        let len = set.addrs().len();
        let first = set.next_index();
        if health.backend.ejected.load(Ordering::Acquire) == 0 {
            return first;
        }
        let now = self.now_ms();
        let mut i = first;
        for _ in 0..len {
            if !health.endpoints[i].is_ejected(now) {
                return i;
            }
            i = set.next_index();
        }
        first
    }

    /// Record how a try to endpoint `index` of `set` ended: `None` for a
    /// success. Returns the ejection it caused, if any.
    pub fn record(
        &self,
        health: &SetHealth,
        index: usize,
        failure: Option<Failure>,
    ) -> Option<Ejection> {
        let endpoint = health.endpoints.get(index)?;
        let Some(failure) = failure else {
            if endpoint.consecutive.load(Ordering::Relaxed) != 0 {
                endpoint.consecutive.store(0, Ordering::Relaxed);
            }
            return None;
        };
        let threshold = self.policy.consecutive_failures;
        if threshold == 0 {
            return None;
        }
        let failures = endpoint.consecutive.fetch_add(1, Ordering::AcqRel) + 1;
        if failures < threshold {
            return None;
        }
        self.eject(health, index, failure, failures, SystemTime::now())
    }

    fn eject(
        &self,
        health: &SetHealth,
        index: usize,
        reason: Failure,
        failures: u32,
        wall: SystemTime,
    ) -> Option<Ejection> {
        let _deciding = lock(&health.backend.deciding);
        let endpoint = &health.endpoints[index];
        // Another request of the same run may have decided already.
        if endpoint.consecutive.swap(0, Ordering::AcqRel) < self.policy.consecutive_failures {
            return None;
        }
        let now = self.now_ms();
        if endpoint.is_ejected(now) {
            return None;
        }
        // At most half of the backend's endpoints, so at least one stays.
        let out = health
            .endpoints
            .iter()
            .filter(|e| e.is_ejected(now))
            .count();
        if (out + 1) * 2 > health.endpoints.len() {
            return None;
        }
        let base = u64::try_from(self.policy.base_ejection.as_millis()).unwrap_or(u64::MAX);
        let max = u64::try_from(self.policy.max_ejection.as_millis())
            .unwrap_or(u64::MAX)
            .max(base);
        let mut record = lock(&endpoint.record);
        // One ejection forgiven per ejection period spent in service since
        // the last one ended (Envoy decrements its multiplier likewise).
        if let Some(ended) = record.ended_ms
            && base > 0
        {
            let forgiven = (now.saturating_sub(ended) / base).min(u64::from(u32::MAX));
            record.times = record.times.saturating_sub(forgiven as u32);
        }
        record.times = record.times.saturating_add(1);
        let duration_ms = base.saturating_mul(u64::from(record.times)).min(max);
        let until = now.saturating_add(duration_ms).max(1);
        record.since_ms = now;
        record.since = Some(wall);
        record.until_ms = until;
        record.reason = Some(reason);
        record.failures = failures;
        endpoint.ejected_until.store(until, Ordering::Release);
        health.backend.ejected.fetch_add(1, Ordering::AcqRel);
        Some(Ejection {
            backend: health.backend.service.clone(),
            endpoint: endpoint.addr,
            reason,
            failures,
            duration: Duration::from_millis(duration_ms),
            times: record.times,
            ejected_now: out + 1,
        })
    }

    /// Put the endpoints whose ejection is over back in rotation (they
    /// already get requests: this makes it official for the counts), and
    /// forget the state no route table uses any more and that holds
    /// nothing worth keeping. Returns the endpoints put back.
    pub fn sweep(&self) -> Vec<Return> {
        let now = self.now_ms();
        let mut returned = Vec::new();
        let mut backends = lock(&self.backends);
        backends.retain(|_, backend| {
            if backend.ejected.load(Ordering::Acquire) != 0 {
                let _deciding = lock(&backend.deciding);
                let endpoints = lock(&backend.endpoints);
                for e in endpoints.values() {
                    let until = e.ejected_until.load(Ordering::Acquire);
                    if until != 0 && until <= now {
                        e.ejected_until.store(0, Ordering::Release);
                        lock(&e.record).ended_ms = Some(until);
                        backend.ejected.fetch_sub(1, Ordering::AcqRel);
                        returned.push((e.addr, backend.clone()));
                    }
                }
            }
            let base = self.policy.base_ejection.as_millis() as u64;
            let mut endpoints = lock(&backend.endpoints);
            endpoints.retain(|_, e| {
                Arc::strong_count(e) > 1 || {
                    let record = lock(&e.record);
                    let forgotten = record.times == 0
                        || record.ended_ms.is_some_and(|ended| {
                            now.saturating_sub(ended)
                                >= base.saturating_mul(u64::from(record.times))
                        });
                    e.ejected_until.load(Ordering::Acquire) != 0 || !forgotten
                }
            });
            Arc::strong_count(backend) > 1
                || !endpoints.is_empty()
                || backend.in_flight.load(Ordering::Acquire) != 0
        });
        drop(backends);
        returned
            .into_iter()
            .map(|(endpoint, backend)| Return {
                ejected_now: backend.ejected_now(now),
                backend: backend.service.clone(),
                endpoint,
            })
            .collect()
    }

    /// Whether some endpoint is ejected and not yet swept back.
    pub fn any_ejected(&self) -> bool {
        lock(&self.backends)
            .values()
            .any(|b| b.ejected.load(Ordering::Acquire) != 0)
    }

    /// Every endpoint that is ejected now or was ejected and is not yet
    /// forgiven, or has failures in a row, by backend and address.
    pub fn report(&self) -> Vec<EndpointReport> {
        let now = self.now_ms();
        let mut out = Vec::new();
        let backends: Vec<Arc<BackendHealth>> = lock(&self.backends).values().cloned().collect();
        for backend in backends {
            let endpoints: Vec<Arc<EndpointHealth>> =
                lock(&backend.endpoints).values().cloned().collect();
            for e in endpoints {
                let record = lock(&e.record).clone();
                let consecutive = e.consecutive.load(Ordering::Acquire);
                if record.times == 0 && consecutive == 0 {
                    continue;
                }
                let ejected = e.is_ejected(now);
                out.push(EndpointReport {
                    backend: backend.service.to_string(),
                    endpoint: e.addr,
                    ejected,
                    since: record.since,
                    remaining: ejected
                        .then(|| Duration::from_millis(record.until_ms.saturating_sub(now))),
                    reason: record.reason,
                    failures: record.failures,
                    ejections: record.times,
                    consecutive_failures: consecutive,
                });
            }
        }
        out.sort_by(|a, b| (&a.backend, &a.endpoint).cmp(&(&b.backend, &b.endpoint)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::AppProtocol;

    fn addrs(n: u16) -> Vec<SocketAddr> {
        (1..=n)
            .map(|p| SocketAddr::from(([10, 0, 0, 1], p)))
            .collect()
    }

    fn set(n: u16) -> EndpointSet {
        EndpointSet::new(addrs(n), AppProtocol::Http1)
    }

    fn fail(o: &Outliers, h: &SetHealth, i: usize, times: u32) -> Option<Ejection> {
        let mut last = None;
        for _ in 0..times {
            last = o.record(h, i, Some(Failure::Status(503))).or(last);
        }
        last
    }

    /// Requests per endpoint index over `n` picks.
    fn spread(o: &Outliers, s: &EndpointSet, h: &SetHealth, n: usize) -> Vec<usize> {
        let mut c = vec![0; s.addrs().len()];
        for _ in 0..n {
            c[o.pick(s, h)] += 1;
        }
        c
    }

    #[test]
    fn five_failures_in_a_row_eject_for_30s_and_the_others_share_its_turns() {
        let o = Outliers::new(OutlierPolicy::default());
        let s = set(5);
        let h = s.health(&o, "ns/app:80");
        assert_eq!(fail(&o, h, 1, 4), None, "four failures are not enough");
        let e = fail(&o, h, 1, 1).expect("the fifth ejects");
        assert_eq!(e.endpoint, addrs(5)[1]);
        assert_eq!(e.duration, Duration::from_secs(30));
        assert_eq!((e.failures, e.times, e.ejected_now), (5, 1, 1));
        assert_eq!(&*e.backend, "ns/app:80");
        assert_eq!(spread(&o, &s, h, 400), vec![100, 0, 100, 100, 100]);
        o.advance(Duration::from_secs(29));
        assert!(o.sweep().is_empty());
        assert_eq!(spread(&o, &s, h, 5)[1], 0);
        o.advance(Duration::from_secs(1));
        let back = o.sweep();
        assert_eq!(back.len(), 1);
        assert_eq!((back[0].endpoint, back[0].ejected_now), (addrs(5)[1], 0));
        assert_eq!(spread(&o, &s, h, 500), vec![100; 5]);
    }

    #[test]
    fn a_success_breaks_the_run() {
        let o = Outliers::new(OutlierPolicy::default());
        let s = set(3);
        let h = s.health(&o, "ns/app:80");
        for _ in 0..10 {
            assert_eq!(fail(&o, h, 0, 4), None);
            assert_eq!(o.record(h, 0, None), None);
        }
        assert!(fail(&o, h, 0, 5).is_some(), "3 endpoints: one may go");
    }

    #[test]
    fn at_most_half_of_a_backends_endpoints_are_ejected() {
        let o = Outliers::new(OutlierPolicy::default());
        for (n, most) in [(1u16, 0usize), (2, 1), (3, 1), (5, 2), (10, 5)] {
            let s = set(n);
            let h = s.health(&o, &format!("ns/app-{n}:80"));
            let ejected = (0..usize::from(n))
                .filter(|i| fail(&o, h, *i, 5).is_some())
                .count();
            assert_eq!(ejected, most, "{n} endpoints");
            // The rest still get every request.
            let c = spread(&o, &s, h, 100 * usize::from(n));
            assert_eq!(c.iter().filter(|c| **c > 0).count(), usize::from(n) - most);
        }
    }

    #[test]
    fn repeat_offenders_stay_out_longer_up_to_the_maximum_and_are_forgiven() {
        let o = Outliers::new(OutlierPolicy::default());
        let s = set(2);
        let h = s.health(&o, "ns/app:80");
        let mut durations = Vec::new();
        for _ in 0..12 {
            let e = fail(&o, h, 0, 5).expect("ejected");
            durations.push(e.duration.as_secs());
            o.advance(e.duration);
            assert_eq!(o.sweep().len(), 1);
        }
        assert_eq!(
            durations,
            [30, 60, 90, 120, 150, 180, 210, 240, 270, 300, 300, 300]
        );
        // Ten periods in service forgive ten of twelve ejections.
        o.advance(Duration::from_secs(300));
        assert_eq!(fail(&o, h, 0, 5).expect("ejected").duration.as_secs(), 90);
    }

    #[test]
    fn state_outlives_the_table_that_made_it() {
        let o = Outliers::new(OutlierPolicy::default());
        let old = set(4);
        let h = old.health(&o, "ns/app:80");
        fail(&o, h, 2, 5).expect("ejected");
        // A new table: the same endpoints in another order, one more.
        let mut reordered = addrs(5);
        reordered.reverse();
        let new = EndpointSet::new(reordered.clone(), AppProtocol::Http1);
        drop(old);
        let nh = new.health(&o, "ns/app:80");
        let c = spread(&o, &new, nh, 400);
        let out = reordered.iter().position(|a| *a == addrs(4)[2]).unwrap();
        assert_eq!(c[out], 0, "{c:?}");
        assert_eq!(c.iter().sum::<usize>(), 400);
        // Another backend with the same addresses is another fleet.
        let other = set(4);
        let oh = other.health(&o, "ns/other:80");
        assert_eq!(spread(&o, &other, oh, 400), vec![100; 4]);
    }

    #[test]
    fn state_no_table_uses_is_forgotten_unless_it_is_worth_keeping() {
        let o = Outliers::new(OutlierPolicy::default());
        let s = set(2);
        fail(&o, s.health(&o, "ns/app:80"), 0, 5).expect("ejected");
        let unused = set(2);
        unused.health(&o, "ns/unused:80");
        drop((s, unused));
        o.sweep();
        let report = o.report();
        assert_eq!(report.len(), 1, "{report:?}");
        assert!(report[0].ejected);
        assert_eq!(report[0].reason, Some(Failure::Status(503)));
        assert_eq!(report[0].remaining, Some(Duration::from_secs(30)));
        assert_eq!(lock(&o.backends).len(), 1, "ns/unused:80 is forgotten");
        // Once back and forgiven, nothing is kept.
        o.advance(Duration::from_secs(30));
        assert_eq!(o.sweep().len(), 1);
        o.advance(Duration::from_secs(30));
        o.sweep();
        assert!(lock(&o.backends).is_empty());
        assert!(o.report().is_empty());
    }

    #[test]
    fn zero_failures_turns_ejection_off() {
        let o = Outliers::new(OutlierPolicy {
            consecutive_failures: 0,
            ..OutlierPolicy::default()
        });
        let s = set(4);
        let h = s.health(&o, "ns/app:80");
        assert_eq!(fail(&o, h, 0, 100), None);
        assert!(!o.any_ejected());
    }

    #[test]
    fn the_cap_counts_requests_in_flight() {
        let o = Outliers::new(OutlierPolicy::default());
        let s = set(1);
        let h = s.health(&o, "ns/app:80");
        let a = h.backend.begin(2).expect("first");
        let b = h.backend.begin(2).expect("second");
        assert!(h.backend.begin(2).is_none(), "third is over the cap");
        assert_eq!(h.backend.in_flight(), 2);
        drop(a);
        let _c = h.backend.begin(2).expect("room again");
        drop(b);
        assert!(h.backend.begin(0).is_some(), "0 is no cap");
    }
}
