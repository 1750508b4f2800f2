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
use http::uri::Authority;
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;

use super::body::UpstreamBody;
use super::error::ProxyError;
use crate::route::{EndpointSet, RetryPolicy, TryOutcome};

/// Send the bodiless request `head` (already addressed to its first
/// endpoint) until a try succeeds or the policy stops retrying; the last
/// try's response or error is the answer. `per_try` is the rule's
/// `timeouts.backendRequest`.
pub(super) async fn send_with_retries(
    client: &Client<HttpConnector, UpstreamBody>,
    policy: &RetryPolicy,
    endpoints: &EndpointSet,
    head: &Parts,
    per_try: Option<Duration>,
) -> Result<Response<Incoming>, ProxyError> {
    let mut tried = 0;
    loop {
        tried += 1;
        let uri = if tried == 1 {
            head.uri.clone()
        } else {
            readdress(&head.uri, endpoints.pick())?
        };
        let mut req = Request::new(UpstreamBody::Empty);
        *req.method_mut() = head.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = head.version;
        *req.headers_mut() = head.headers.clone();
        let pending = client.request(req);
        let result = match per_try {
            Some(limit) => tokio::time::timeout(limit, pending).await.ok(),
            None => Some(pending.await),
        };
        let (outcome, result) = match result {
            None => (TryOutcome::TimedOut, Err(ProxyError::Timeout)),
            Some(Ok(resp)) => (TryOutcome::Answered(resp.status()), Ok(resp)),
            Some(Err(e)) if e.is_connect() => {
                (TryOutcome::ConnectFailed, Err(ProxyError::Unreachable(e)))
            }
            Some(Err(e)) => (TryOutcome::Broken, Err(ProxyError::Unreachable(e))),
        };
        let Some(wait) = policy.next_try(tried, outcome) else {
            return result;
        };
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

/// `uri` sent to `endpoint` instead.
fn readdress(uri: &Uri, endpoint: SocketAddr) -> Result<Uri, ProxyError> {
    let mut parts = uri.clone().into_parts();
    let invalid = || ProxyError::InvalidFilterResult {
        what: "request path",
    };
    parts.authority = Some(Authority::try_from(endpoint.to_string()).map_err(|_| invalid())?);
    Uri::from_parts(parts).map_err(|_| invalid())
}

async fn drain(mut body: Incoming) {
    while let Some(Ok(_)) = body.frame().await {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readdress_keeps_path_and_query() {
        let uri: Uri = "http://127.0.0.1:1/a/b?x=1&y".parse().expect("uri");
        let moved = readdress(&uri, "127.0.0.1:2".parse().expect("addr")).expect("valid");
        assert_eq!(moved.to_string(), "http://127.0.0.1:2/a/b?x=1&y");
        let v6 = readdress(&uri, "[::1]:3".parse().expect("addr")).expect("valid");
        assert_eq!(v6.to_string(), "http://[::1]:3/a/b?x=1&y");
    }
}
