//! Retries on the data path: a rule's [`RetryPolicy`] applied to one
//! request, each try on the next endpoint of the chosen backend.
//!
//! The weighted backend choice is made once per request and kept across
//! tries (a retry never shifts traffic to another backendRef, so the split
//! stays exact); the endpoint is chosen again for each try, since "an
//! implementation can retry the request to another server" (GEP-1731).
//!
//! Only requests without a body are retried: the request body is streamed
//! to the backend, never buffered, so it cannot be sent twice. A request
//! with a body gets one try whatever the policy.

use std::net::SocketAddr;
use std::time::Duration;

use http::request::Parts;
use http::{Request, Response};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::body::{ResponseBody, UpstreamBody};
use super::error::ProxyError;
use super::upstream::Upstream;
use crate::metrics::Metrics;
use crate::route::{EndpointSet, RetryPolicy, TryOutcome};

/// Send the bodiless request `head` (origin-form URI) to `first`, then to
/// the next endpoints, until a try succeeds or the policy stops retrying;
/// the last try's response or error is the answer. `per_try` is the rule's
/// `timeouts.backendRequest`.
pub(super) async fn send_with_retries(
    upstream: &Upstream,
    policy: &RetryPolicy,
    endpoints: &EndpointSet,
    first: SocketAddr,
    head: &Parts,
    per_try: Option<Duration>,
    metrics: &Metrics,
) -> Result<Response<ResponseBody>, ProxyError> {
    let mut tried = 0;
    loop {
        tried += 1;
        let endpoint = if tried == 1 { first } else { endpoints.pick() };
        let mut req = Request::new(UpstreamBody::Empty);
        *req.method_mut() = head.method.clone();
        *req.uri_mut() = head.uri.clone();
        *req.version_mut() = head.version;
        *req.headers_mut() = head.headers.clone();
        let pending = upstream.send(endpoint, req);
        let result = match per_try {
            Some(limit) => tokio::time::timeout(limit, pending).await.ok(),
            None => Some(pending.await),
        };
        let (outcome, result) = match result {
            None => (TryOutcome::TimedOut, Err(ProxyError::Timeout)),
            Some(Ok(resp)) => (TryOutcome::Answered(resp.status()), Ok(resp)),
            Some(Err(ProxyError::Unreachable(e))) if e.is_connect() => {
                (TryOutcome::ConnectFailed, Err(ProxyError::Unreachable(e)))
            }
            Some(Err(e)) => (TryOutcome::Broken, Err(e)),
        };
        let Some(wait) = policy.next_try(tried, outcome) else {
            if tried > 1 {
                let recovered = matches!(&result, Ok(r) if r.status().as_u16() < 500);
                metrics.record_retried(recovered);
            }
            return result;
        };
        match outcome {
            TryOutcome::TimedOut => metrics.record_retry("timeout"),
            TryOutcome::ConnectFailed => metrics.record_retry("connect_failed"),
            TryOutcome::Broken => metrics.record_retry("broken"),
            TryOutcome::Answered(status) => metrics.record_retry(status.as_str()),
        }
        tracing::debug!(tried, ?outcome, ?wait, "retrying the request");
        let deadline = Instant::now() + wait;
        if let Ok(resp) = result {
            // Read the failed answer out while waiting, so its connection
            // can go back to the pool; whatever is left is dropped.
            let _ = tokio::time::timeout_at(deadline, drain(resp.into_body())).await;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

async fn drain(mut body: ResponseBody) {
    while let Some(Ok(_)) = body.frame().await {}
}
