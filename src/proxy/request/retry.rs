//! Tries on the data path: one request sent to an endpoint of the chosen
//! backend, and a rule's [`RetryPolicy`] applied to it, each try on the
//! next endpoint of that backend.
//!
//! The weighted backend choice is made once per request and kept across
//! tries (a retry never shifts traffic to another backendRef, so the split
//! stays exact); the endpoint is chosen again for each try, since "an
//! implementation can retry the request to another server" (GEP-1731).
//! Every try's outcome counts towards its endpoint's outlier ejection.
//!
//! A request with a body is retried when the body fits the replay buffer
//! ([`Replay`]): never once a larger body streamed past it, and after a
//! timed-out try only when none of the body reached the backend or the
//! method is idempotent (the backend may be acting on what it got).

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::Either;
use http::request::Parts;
use http::{Request, Response};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::outliers::{Health, failure_of};
use crate::metrics::Metrics;
use crate::proxy::body::{ResponseBody, UpstreamBody};
use crate::proxy::error::ProxyError;
use crate::proxy::outbound::replay::Replay;
use crate::proxy::outbound::upstream::Upstream;
use crate::route::{EndpointSet, RetryPolicy, SetHealth, TryOutcome};

/// The endpoint a try is waiting for, if any.
pub(in crate::proxy) type Trying<'t> = Option<(&'t SetHealth, usize)>;

/// The endpoints of the backend a request goes to, and how to reach them.
pub(in crate::proxy) struct Endpoints<'a, 't> {
    pub health: &'a Arc<Health>,
    pub set: &'t EndpointSet,
    pub state: &'t SetHealth,
    pub upstream: Upstream,
    /// The rule's `timeouts.backendRequest`: each try's limit.
    pub per_try: Option<Duration>,
}

impl<'t> Endpoints<'_, 't> {
    /// One try to endpoint `index` (of `set`), within the per-try limit;
    /// its outcome is recorded against the endpoint. `trying` names the
    /// endpoint while the try waits.
    ///
    /// Not an `async fn`, for the reason [`Upstream::send`] is not: the
    /// future is part of every request's and would hold `req` twice.
    pub fn send<'s>(
        &'s self,
        index: usize,
        req: Request<UpstreamBody>,
        trying: &'s mut Trying<'t>,
    ) -> impl Future<Output = Result<Response<ResponseBody>, ProxyError>> + Send + 's {
        *trying = Some((self.state, index));
        let pending = self.upstream.send(self.set.addrs()[index], req);
        let limited = match self.per_try {
            Some(limit) => Either::Left(
                tokio::time::timeout(limit, pending).map(|r| r.unwrap_or(Err(ProxyError::Timeout))),
            ),
            None => Either::Right(pending),
        };
        limited.map(move |result| {
            *trying = None;
            record_try(self.health, self.state, index, &result);
            result
        })
    }
}

/// Count how a try to endpoint `index` of `state` went towards its
/// outlier ejection.
pub(in crate::proxy) fn record_try(
    health: &Arc<Health>,
    state: &SetHealth,
    index: usize,
    result: &Result<Response<ResponseBody>, ProxyError>,
) {
    if let Some(failure) = failure_of(result) {
        health.record(state, index, failure);
    }
}

/// Send the request `head` (origin-form URI; its body from `body`, or
/// none) to endpoint `first`, then to the next endpoints, until a try
/// succeeds or the policy (or the body) stops retrying; the last try's
/// endpoint and response or error are the answer.
pub(in crate::proxy) async fn send_with_retries<'t>(
    to: &Endpoints<'_, 't>,
    policy: &RetryPolicy,
    first: usize,
    head: &Parts,
    body: Option<Replay>,
    trying: &mut Trying<'t>,
    metrics: &Metrics,
) -> (usize, Result<Response<ResponseBody>, ProxyError>) {
    let mut tried = 0;
    loop {
        tried += 1;
        let index = if tried == 1 {
            first
        } else {
            to.health.pick(to.set, to.state)
        };
        let mut req = Request::new(match &body {
            Some(replay) => UpstreamBody::Replay(replay.next_try()),
            None => UpstreamBody::Empty,
        });
        *req.method_mut() = head.method.clone();
        *req.uri_mut() = head.uri.clone();
        *req.version_mut() = head.version;
        *req.headers_mut() = head.headers.clone();
        let result = to.send(index, req, trying).await;
        let outcome = match &result {
            Err(ProxyError::Timeout) => TryOutcome::TimedOut,
            Ok(resp) => TryOutcome::Answered(resp.status()),
            Err(ProxyError::Unreachable(e)) if e.is_connect() => TryOutcome::ConnectFailed,
            Err(_) => TryOutcome::Broken,
        };
        let Some(wait) = policy.next_try(tried, outcome) else {
            record_retried(metrics, tried, &result);
            return (index, result);
        };
        if let Some(replay) = &body
            && !replay.can_send_again(outcome, &head.method)
        {
            tracing::debug!(tried, ?outcome, "the request body cannot be sent again");
            record_retried(metrics, tried, &result);
            return (index, result);
        }
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

/// Count a request that was tried more than once, by how its last try
/// ended.
fn record_retried(
    metrics: &Metrics,
    tried: u32,
    result: &Result<Response<ResponseBody>, ProxyError>,
) {
    if tried > 1 {
        let recovered = matches!(result, Ok(r) if r.status().as_u16() < 500);
        metrics.record_retried(recovered);
    }
}

async fn drain(mut body: ResponseBody) {
    while let Some(Ok(_)) = body.frame().await {}
}
