//! Outlier ejection and the per-backend overload cap on the data path:
//! each try's outcome is recorded against its endpoint
//! ([`crate::route::Outliers`] decides), ejections and returns are logged
//! and counted, and a sweeper puts endpoints back in the counts when
//! their time is up (they get requests again as soon as it is, sweeper
//! or not).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{HeaderName, Response};

use crate::metrics::Metrics;
use crate::proxy::body::ResponseBody;
use crate::proxy::error::ProxyError;
use crate::route::{EndpointSet, Failure, Outliers, SetHealth};

/// How often ejections that are over are swept while any is in force.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The proxy's side of outlier ejection. Outlives route tables.
pub(crate) struct Health {
    pub outliers: Arc<Outliers>,
    metrics: Arc<Metrics>,
    sweeping: AtomicBool,
}

impl Health {
    pub fn new(outliers: Outliers, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Health {
            outliers: Arc::new(outliers),
            metrics,
            sweeping: AtomicBool::new(false),
        })
    }

    /// The state of `set`, the endpoints of the Service `service`.
    pub fn of<'t>(&self, service: &str, set: &'t EndpointSet) -> &'t SetHealth {
        set.health(&self.outliers, service)
    }

    /// The endpoint index for the next request to `set`.
    pub fn pick(&self, set: &EndpointSet, health: &SetHealth) -> usize {
        self.outliers.pick(set, health)
    }

    /// Whether endpoint `index` of `health` is out of rotation.
    pub fn is_ejected(&self, health: &SetHealth, index: usize) -> bool {
        health.is_ejected(&self.outliers, index)
    }

    /// Record how a try to endpoint `index` ended (`Ok(None)`: it
    /// succeeded); an ejection it causes is logged and counted.
    pub fn record(self: &Arc<Self>, health: &SetHealth, index: usize, failure: Option<Failure>) {
        let Some(e) = self.outliers.record(health, index, failure) else {
            return;
        };
        tracing::warn!(
            backend = %e.backend,
            endpoint = %e.endpoint,
            failures = e.failures,
            last = %e.reason,
            seconds = e.duration.as_secs(),
            times = e.times,
            ejected = e.ejected_now,
            "endpoint ejected: it gets no new requests of this backend for a while"
        );
        self.metrics
            .record_ejection(&e.backend, e.reason.label(), e.ejected_now);
        self.start_sweeper();
    }

    /// Sweep every second while some endpoint is ejected.
    fn start_sweeper(self: &Arc<Self>) {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweeping.store(false, Ordering::Release);
            return;
        };
        let health = Arc::downgrade(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                let Some(health) = health.upgrade() else {
                    return;
                };
                health.sweep();
                if !health.outliers.any_ejected() {
                    health.sweeping.store(false, Ordering::Release);
                    // An ejection between the check and the store finds the
                    // flag still set and starts no sweeper: look again.
                    if !health.outliers.any_ejected()
                        || health.sweeping.swap(true, Ordering::AcqRel)
                    {
                        return;
                    }
                }
            }
        });
    }

    /// Put the endpoints whose ejection is over back in the counts, and
    /// forget the state no route table uses any more (also on reload).
    pub fn sweep(&self) {
        for r in self.outliers.sweep() {
            tracing::info!(backend = %r.backend, endpoint = %r.endpoint,
                ejected = r.ejected_now, "ejected endpoint back in rotation");
            self.metrics.set_ejected(&r.backend, r.ejected_now);
        }
    }
}

/// How a try went, for outlier ejection: `None` when it says nothing
/// about the endpoint (the client's body failed, the request was
/// refused before it was sent); `Some(None)` for a success.
pub(in crate::proxy) fn failure_of(
    result: &Result<Response<ResponseBody>, ProxyError>,
) -> Option<Option<Failure>> {
    match result {
        Ok(resp) => {
            let status = resp.status().as_u16();
            if status >= 500 {
                return Some(Some(Failure::Status(status)));
            }
            Some(grpc_failure(resp).map(Failure::Status))
        }
        Err(ProxyError::Unreachable(e)) if e.is_connect() => Some(Some(Failure::Connect)),
        Err(ProxyError::Unreachable(_)) => Some(Some(Failure::Reset)),
        Err(ProxyError::Timeout) => Some(Some(Failure::Timeout)),
        Err(_) => None,
    }
}

/// A gRPC answer with no message (trailers only: `grpc-status` in the
/// response head) that stands for a server failure, as the HTTP status
/// Envoy maps it to for its outlier detection: UNKNOWN, INTERNAL and
/// DATA_LOSS 500, UNAVAILABLE 503, DEADLINE_EXCEEDED 504.
fn grpc_failure(resp: &Response<ResponseBody>) -> Option<u16> {
    // A `HeaderName`, not a `&str`: a string is parsed into a name at every
    // lookup (about 170 instructions per request, docs/performance.md).
    static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
    let code = resp.headers().get(&GRPC_STATUS)?;
    match code.as_bytes() {
        b"2" | b"13" | b"15" => Some(500),
        b"14" => Some(503),
        b"4" => Some(504),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, grpc: Option<&str>) -> Result<Response<ResponseBody>, ProxyError> {
        let mut resp = Response::new(ResponseBody::empty());
        *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
        if let Some(g) = grpc {
            resp.headers_mut()
                .insert("grpc-status", http::HeaderValue::from_str(g).unwrap());
        }
        Ok(resp)
    }

    #[test]
    fn server_failures_count_and_client_failures_do_not() {
        assert_eq!(failure_of(&answer(200, None)), Some(None));
        assert_eq!(failure_of(&answer(404, None)), Some(None));
        assert_eq!(
            failure_of(&answer(503, None)),
            Some(Some(Failure::Status(503)))
        );
        assert_eq!(
            failure_of(&answer(200, Some("14"))),
            Some(Some(Failure::Status(503)))
        );
        assert_eq!(
            failure_of(&answer(200, Some("13"))),
            Some(Some(Failure::Status(500)))
        );
        assert_eq!(failure_of(&answer(200, Some("5"))), Some(None), "NOT_FOUND");
        assert_eq!(failure_of(&answer(200, Some("0"))), Some(None));
        assert_eq!(
            failure_of(&Err(ProxyError::Timeout)),
            Some(Some(Failure::Timeout))
        );
        assert_eq!(
            failure_of(&Err(ProxyError::BadRequest("malformed request body"))),
            None
        );
        let refused =
            crate::proxy::error::UpstreamError::connect("127.0.0.1:1".parse().unwrap(), "refused");
        assert_eq!(
            failure_of(&Err(ProxyError::Unreachable(refused))),
            Some(Some(Failure::Connect))
        );
        let reset = crate::proxy::error::UpstreamError::exchange("reset");
        assert_eq!(
            failure_of(&Err(ProxyError::Unreachable(reset))),
            Some(Some(Failure::Reset))
        );
    }
}
