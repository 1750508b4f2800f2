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

use http_body_util::BodyExt;
use tokio::time::Instant;

use super::body::{ResponseBody, UpstreamBody};
use super::error::ProxyError;
use super::h1_client::{UpstreamHead, UpstreamRequest};
use super::head::ProxyResponse;
use super::upstream::Upstream;
use crate::route::{EndpointSet, RetryPolicy, TryOutcome};

/// Send the bodiless request `head` to `first`, then to
/// the next endpoints, until a try succeeds or the policy stops retrying;
/// the last try's response or error is the answer. `per_try` is the rule's
/// `timeouts.backendRequest`.
pub(super) async fn send_with_retries(
    upstream: &Upstream,
    policy: &RetryPolicy,
    endpoints: &EndpointSet,
    first: SocketAddr,
    head: &UpstreamHead,
    per_try: Option<Duration>,
) -> Result<ProxyResponse, ProxyError> {
    let mut tried = 0;
    loop {
        tried += 1;
        let endpoint = if tried == 1 { first } else { endpoints.pick() };
        let req = UpstreamRequest {
            head: head.clone(),
            body: UpstreamBody::Empty,
        };
        let pending = upstream.send(endpoint, req);
        let result = match per_try {
            Some(limit) => tokio::time::timeout(limit, pending).await.ok(),
            None => Some(pending.await),
        };
        let (outcome, result) = match result {
            None => (TryOutcome::TimedOut, Err(ProxyError::Timeout)),
            Some(Ok(resp)) => (TryOutcome::Answered(resp.status), Ok(resp)),
            Some(Err(ProxyError::Unreachable(e))) if e.is_connect() => {
                (TryOutcome::ConnectFailed, Err(ProxyError::Unreachable(e)))
            }
            Some(Err(e)) => (TryOutcome::Broken, Err(e)),
        };
        let Some(wait) = policy.next_try(tried, outcome) else {
            return result;
        };
        tracing::debug!(tried, ?outcome, ?wait, "retrying the request");
        let deadline = Instant::now() + wait;
        if let Ok(resp) = result {
            // Read the failed answer out while waiting, so its connection
            // can go back to the pool; whatever is left is dropped.
            let _ = tokio::time::timeout_at(deadline, drain(resp.body)).await;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

async fn drain(mut body: ResponseBody) {
    while let Some(Ok(_)) = body.frame().await {}
}
