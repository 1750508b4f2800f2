//! Which client carries a request to an endpoint, and the request target
//! each one needs.
//!
//! HTTP/1.1, cleartext or TLS as a BackendTLSPolicy says, goes through
//! sluice's own client ([`h1_client`]) on its pool ([`Pool`]); h2c
//! endpoints through hyper-util's pooled HTTP/2 client. Requests, retries
//! and mirrors all go through [`Upstream::send`], so each gets the same
//! treatment whatever the client.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::future::Either;
use http::uri::{PathAndQuery, Scheme};
use http::{Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use super::body::{ResponseBody, UpstreamBody, caused_by_client_body};
use super::error::{ProxyError, UpstreamError};
use super::h1_client::{self, UpstreamRequest};
use super::head::ProxyResponse;
use super::pool::{Key, Pool};
use crate::route::BackendTls;

/// The client for one backend's endpoints.
#[derive(Clone)]
pub(super) enum Upstream {
    /// HTTP/1.1: sluice's own, over TLS when the endpoints have a
    /// BackendTLSPolicy.
    H1 {
        pool: Arc<Pool>,
        tls: Option<Arc<BackendTls>>,
    },
    /// HTTP/2 with prior knowledge (`appProtocol: kubernetes.io/h2c`).
    /// Boxed: the common case should not make every request's future
    /// larger.
    H2c(Box<Client<HttpConnector, UpstreamBody>>),
}

impl Upstream {
    /// Send `req` to `endpoint`.
    pub fn send(
        &self,
        endpoint: SocketAddr,
        req: UpstreamRequest,
    ) -> impl Future<Output = Result<ProxyResponse, ProxyError>> + Send + '_ {
        match self {
            Upstream::H1 { pool, tls } => {
                let key = Key {
                    endpoint,
                    tls: tls.as_ref().map(|t| t.key.clone()),
                };
                Either::Left(h1_client::send(pool, key, tls.as_ref(), req))
            }
            // Boxed: h2c is the rarer path, and the future of the common
            // one stays small.
            Upstream::H2c(client) => Either::Right(Box::pin(send_h2c(client, endpoint, req))
                as Pin<Box<dyn Future<Output = _> + Send + '_>>),
        }
    }
}

/// [`Upstream::send`] through hyper-util's HTTP/2 client, which takes the
/// request with its absolute URI and data frames only.
async fn send_h2c(
    client: &Client<HttpConnector, UpstreamBody>,
    endpoint: SocketAddr,
    req: UpstreamRequest,
) -> Result<ProxyResponse, ProxyError> {
    let UpstreamRequest { head, body } = req;
    let mut out = http::Request::new(body.dechunked());
    *out.method_mut() = head.method;
    *out.uri_mut() = absolute_uri(endpoint, &head.target)?;
    *out.version_mut() = Version::HTTP_2;
    *out.headers_mut() = head.headers.into_map();
    match client.request(out).await {
        Ok(resp) => Ok(ProxyResponse::from(resp.map(ResponseBody::Upstream))),
        Err(e) => {
            let e = UpstreamError::from(e);
            Err(if caused_by_client_body(&e) {
                ProxyError::BadRequest("malformed request body")
            } else {
                ProxyError::Unreachable(e)
            })
        }
    }
}

/// The request target a backend gets: the request's own path and query
/// (no copy) or, after a path rewrite, `path` with the request's query.
pub(super) fn origin_target(path: Option<&str>, original: &Uri) -> Result<PathAndQuery, ProxyError> {
    if path.is_none()
        && let Some(pq) = original.path_and_query()
        && pq.path().starts_with('/')
    {
        return Ok(pq.clone());
    }
    let path = path.unwrap_or(original.path());
    let path = if path.is_empty() { "/" } else { path };
    let mut s = String::with_capacity(path.len() + 1 + original.query().map_or(0, str::len));
    s.push_str(path);
    if let Some(q) = original.query() {
        s.push('?');
        s.push_str(q);
    }
    PathAndQuery::try_from(s).map_err(|_| ProxyError::InvalidFilterResult {
        what: "request path",
    })
}

/// The absolute URI hyper-util's client needs (it connects to the
/// authority).
fn absolute_uri(endpoint: SocketAddr, target: &PathAndQuery) -> Result<Uri, ProxyError> {
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(Scheme::HTTP);
    parts.authority = Some(
        endpoint
            .to_string()
            .parse()
            .map_err(|_| ProxyError::InvalidFilterResult {
                what: "request path",
            })?,
    );
    parts.path_and_query = Some(target.clone());
    Uri::from_parts(parts).map_err(|_| ProxyError::InvalidFilterResult {
        what: "request path",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_target_keeps_or_rewrites_the_path_and_keeps_the_query() {
        let uri: Uri = "http://example.com/a/b?x=1&y".parse().expect("uri");
        assert_eq!(origin_target(None, &uri).expect("valid"), "/a/b?x=1&y");
        assert_eq!(origin_target(Some("/c"), &uri).expect("valid"), "/c?x=1&y");
        assert_eq!(origin_target(Some(""), &uri).expect("valid"), "/?x=1&y");
        let origin: Uri = "/p".parse().expect("uri");
        assert_eq!(origin_target(None, &origin).expect("valid"), "/p");
        assert!(origin_target(Some("/a b"), &uri).is_err());
    }

    #[test]
    fn absolute_uri_names_the_endpoint() {
        let pq: PathAndQuery = "/a/b?x=1&y".parse().expect("target");
        let v4 = absolute_uri("127.0.0.1:2".parse().expect("addr"), &pq).expect("valid");
        assert_eq!(v4.to_string(), "http://127.0.0.1:2/a/b?x=1&y");
        let v6 = absolute_uri("[::1]:3".parse().expect("addr"), &pq).expect("valid");
        assert_eq!(v6.to_string(), "http://[::1]:3/a/b?x=1&y");
    }
}
