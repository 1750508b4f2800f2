//! Which client carries a request to an endpoint, and the request URI each
//! one needs.
//!
//! HTTP/1.1 to endpoints, cleartext or TLS (BackendTLSPolicy), upgrades
//! (WebSocket) included, goes through sluice's own client and pool
//! ([`h1_client`], [`Pool`]); HTTP/2 (h2c, and GRPCRoute backends in
//! cleartext or TLS) through hyper's client, one per endpoint, which keeps
//! the request's authority ([`super::h2`]). Requests, retries and mirrors all go through
//! [`Upstream::send`], so each gets the same treatment whatever the client.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;

use std::pin::Pin;

use futures_util::FutureExt;
use futures_util::future::Either;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri, Version};

use super::h1_client;
use super::h2::H2Clients;
use super::pool::Pool;
use crate::FastMap;
use crate::proxy::body::{ResponseBody, UpstreamBody, client_body_failure};
use crate::proxy::error::{ProxyError, UpstreamError};
use crate::route::BackendTls;

/// The client for one backend's endpoints. hyper's HTTP/2 client is
/// boxed: this is held across the request's awaits, and the common case
/// (the pool) should not make every request's future a few hundred bytes
/// larger.
#[derive(Clone)]
pub(in crate::proxy) enum Upstream {
    /// HTTP/1.1, cleartext or TLS (a BackendTLSPolicy's): sluice's own
    /// client ([`super::h1_client`]) on its pool.
    Pool(Arc<Pool>, Option<Arc<BackendTls>>),
    /// hyper's HTTP/2 client (h2c, GRPCRoute backends).
    Client(Box<ClientUpstream>),
}

/// HTTP/2, through hyper's client.
#[derive(Clone)]
pub(in crate::proxy) enum ClientUpstream {
    /// HTTP/2, over TLS per the setting when given.
    H2(Arc<H2Clients>, Option<Arc<BackendTls>>),
}

impl Upstream {
    /// Send `req` (origin-form URI) to `endpoint`.
    ///
    /// Not an `async fn`: that would keep `req` in the future next to the
    /// pool's, which holds it already; the future is part of every
    /// request's and is moved whole.
    pub fn send(
        &self,
        endpoint: SocketAddr,
        req: Request<UpstreamBody>,
    ) -> impl Future<Output = Result<Response<ResponseBody>, ProxyError>> + Send + '_ {
        let pending = match self {
            Upstream::Pool(pool, tls) => Either::Left(
                h1_client::send(pool, endpoint, tls.as_ref(), req)
                    .map(|r| r.map(|r| r.map(ResponseBody::Pooled)).map_err(Ok)),
            ),
            // Boxed: HTTP/2 backends are the rarer path, and the future
            // of the common one (the pool) stays small.
            Upstream::Client(client) => {
                let client = (**client).clone();
                Either::Right(
                    Box::pin(client.send(endpoint, req)) as Pin<Box<dyn Future<Output = _> + Send>>
                )
            }
        };
        // Combinators rather than an `async` block, which would keep
        // `pending` twice.
        pending.map(|result| {
            result.map_err(|e| match e {
                Ok(e) => client_body_failure(&e).unwrap_or(ProxyError::Unreachable(e)),
                Err(e) => e,
            })
        })
    }
}

impl ClientUpstream {
    /// [`Upstream::send`] through hyper's HTTP/2 client, which takes the
    /// request with its absolute URI. `Err(Err(_))`: no URI could be
    /// made; `Err(Ok(_))`: the backend could not be reached.
    async fn send(
        self,
        endpoint: SocketAddr,
        mut req: Request<UpstreamBody>,
    ) -> Result<Response<ResponseBody>, Result<UpstreamError, ProxyError>> {
        let ClientUpstream::H2(clients, tls) = self;
        // The client's authority goes in the URI (`:authority`); the
        // client of this endpoint dials it whatever the URI says.
        let authority = req
            .headers_mut()
            .remove(http::header::HOST)
            .and_then(|h| Authority::try_from(h.as_bytes()).ok());
        *req.uri_mut() =
            authority_uri(endpoint, authority, tls.is_some(), req.uri()).map_err(Err)?;
        *req.version_mut() = Version::HTTP_2;
        clients
            .client(endpoint, tls.as_ref())
            .request(req)
            .await
            .map(|r| r.map(ResponseBody::Upstream))
            .map_err(|e| Ok(UpstreamError::from(e)))
    }
}

/// The URI of an HTTP/2 request: `authority` (the client's), or the
/// endpoint's address when the request has none.
fn authority_uri(
    endpoint: SocketAddr,
    authority: Option<Authority>,
    tls: bool,
    origin: &Uri,
) -> Result<Uri, ProxyError> {
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(if tls { Scheme::HTTPS } else { Scheme::HTTP });
    parts.authority = match authority {
        Some(a) => Some(a),
        None => endpoint_authority(endpoint),
    };
    parts.path_and_query = origin
        .path_and_query()
        .cloned()
        .or_else(|| Some(http::uri::PathAndQuery::from_static("/")));
    Uri::from_parts(parts).map_err(|_| ProxyError::InvalidFilterResult {
        what: "request path",
    })
}

pub(in crate::proxy) fn origin_uri(path: Option<&str>, original: &Uri) -> Result<Uri, ProxyError> {
    // The usual case: the path is not rewritten, so the request's own path
    // and query are reused as they are (no copy, no parse).
    if path.is_none()
        && let Some(pq) = original.path_and_query()
        && pq.path().starts_with('/')
    {
        return Ok(Uri::from(pq.clone()));
    }
    let path = path.unwrap_or(original.path());
    let path = if path.is_empty() { "/" } else { path };
    let mut s = String::with_capacity(path.len() + 1 + original.query().map_or(0, str::len));
    s.push_str(path);
    if let Some(q) = original.query() {
        s.push('?');
        s.push_str(q);
    }
    Uri::try_from(s).map_err(|_| ProxyError::InvalidFilterResult {
        what: "request path",
    })
}

/// Endpoint addresses as URI authorities, made once per address and
/// thread (formatting an address is a good part of building the URI).
const MAX_CACHED_AUTHORITIES: usize = 4096;

thread_local! {
    static AUTHORITIES: RefCell<FastMap<SocketAddr, Authority>> = RefCell::new(FastMap::default());
}

fn endpoint_authority(endpoint: SocketAddr) -> Option<Authority> {
    AUTHORITIES.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some(a) = cache.get(&endpoint) {
            return Some(a.clone());
        }
        let authority = Authority::try_from(endpoint.to_string()).ok()?;
        if cache.len() >= MAX_CACHED_AUTHORITIES {
            // Endpoints come and go over reloads: start afresh.
            cache.clear();
        }
        cache.insert(endpoint, authority.clone());
        Some(authority)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_uri_keeps_or_rewrites_the_path_and_keeps_the_query() {
        let uri: Uri = "http://example.com/a/b?x=1&y".parse().expect("uri");
        assert_eq!(origin_uri(None, &uri).expect("valid"), "/a/b?x=1&y");
        assert_eq!(origin_uri(Some("/c"), &uri).expect("valid"), "/c?x=1&y");
        assert_eq!(origin_uri(Some(""), &uri).expect("valid"), "/?x=1&y");
        let origin: Uri = "/p".parse().expect("uri");
        assert_eq!(origin_uri(None, &origin).expect("valid"), "/p");
        assert!(origin_uri(Some("/a b"), &uri).is_err());
    }

    #[test]
    fn http2_uris_keep_the_clients_authority() {
        let uri: Uri = "/a.B/C?x".parse().expect("uri");
        let endpoint = "10.0.0.1:8080".parse().expect("addr");
        let host = Authority::from_static("grpc.example.com");
        let kept = authority_uri(endpoint, Some(host), false, &uri).expect("valid");
        assert_eq!(kept.to_string(), "http://grpc.example.com/a.B/C?x");
        let tls = authority_uri(endpoint, None, true, &uri).expect("valid");
        assert_eq!(tls.to_string(), "https://10.0.0.1:8080/a.B/C?x");
    }
}
