//! One request, start to finish, against the route table current when it
//! arrived: lookup, rule filters, mirrors, weighted backend, endpoint,
//! forward, response filters, metrics. The same for every codec: the
//! request is a [`ProxyRequest`] (an HTTP/1.1 head as received, or
//! hyper's HTTP/2 head), the answer a [`ProxyResponse`].

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::header::{HOST, LOCATION};
use http::uri::PathAndQuery;
use http::{HeaderName, HeaderValue, Method, Request, Uri, Version};
use http_body::Body;
use http_body_util::BodyExt;

use super::Shared;
use super::body::{ClientBody, ResponseBody, Tee, UpstreamBody};
use super::error::ProxyError;
use super::filters::{add_forwarded, modify_headers, modify_path, redirect_location};
use super::h1_client::{UpstreamHead, UpstreamRequest};
use super::head::{Fields, ProxyRequest, ProxyResponse, strip_hop_by_hop};
use super::upgrade::UpgradeRequest;
use super::upstream::{Upstream, origin_target};
use super::{cors, retry, tls};
use crate::metrics::RequestKey;
use crate::route::{
    AppProtocol, Backend, BackendChoice, BackendTarget, EndpointSet, Filter, Lookup, Mirror,
    PathMatch, RouteTable, Rule, normalize_host,
};

/// How long a mirrored request may take before it is abandoned.
const MIRROR_TIMEOUT: Duration = Duration::from_secs(30);

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// The client at the other end of a connection, as its requests are
/// forwarded: its address, and that address as a header value, made once
/// per connection rather than formatted for every request.
#[derive(Debug, Clone)]
pub(super) struct Peer {
    pub addr: SocketAddr,
    ip: HeaderValue,
}

impl Peer {
    pub fn new(addr: SocketAddr) -> Self {
        let ip = HeaderValue::from_str(&addr.ip().to_string())
            .expect("an IP address is a valid header value");
        Peer { addr, ip }
    }
}

/// Where a request got to, for its metrics labels.
#[derive(Default)]
struct Outcome<'t> {
    rule: Option<&'t Rule>,
    backend: Option<&'t Backend>,
}

/// Serve one request that arrived on the socket bound at `bind` from
/// `client`. Never fails: every error becomes its response.
pub(super) async fn handle(
    shared: &Shared,
    req: ProxyRequest,
    client: &Peer,
    bind: SocketAddr,
) -> ProxyResponse {
    let start = Instant::now();
    // One atomic load: the request finishes on this table whatever reloads.
    let table = shared.table.load_full();
    let mut outcome = Outcome::default();
    let resp = match route(shared, &table, req, client, bind, &mut outcome).await {
        Ok(resp) => resp,
        Err(err) => {
            tracing::debug!(error = %err, source = ?err.source_of_failure(), "request failed");
            err.into_response().into()
        }
    };
    // Labels borrowed from the table: no allocation per request.
    let key = RequestKey {
        namespace: outcome.rule.map_or("", |r| r.id.namespace.as_str()),
        route: outcome.rule.map_or("", |r| r.id.route.as_str()),
        rule: outcome.rule.map(|r| r.id.index),
        backend: outcome.backend.map_or("", |b| b.service.as_str()),
        code: resp.status.as_u16(),
    };
    shared.metrics.record(&key, start.elapsed());
    resp
}

async fn route<'t>(
    shared: &Shared,
    table: &'t RouteTable,
    req: ProxyRequest,
    client: &Peer,
    bind: SocketAddr,
    outcome: &mut Outcome<'t>,
) -> Result<ProxyResponse, ProxyError> {
    let host = request_host(&req.headers, &req.uri);
    if tls::misdirected(table, bind, req.tls.as_ref(), &host) {
        return Err(ProxyError::Misdirected);
    }
    let found = table.lookup(
        bind,
        &host,
        &req.method,
        req.uri.path(),
        req.uri.query(),
        &req.headers,
    );
    let Lookup::Matched(found) = found else {
        return Err(ProxyError::NoRoute);
    };
    let rule: &'t Rule = found.rule;
    outcome.rule = Some(rule);
    let matched_prefix = match &found.matched.path {
        PathMatch::Prefix(p) => Some(p.as_str()),
        _ => None,
    };
    // Only redirects need the host after this point: keep a copy for them.
    let host = if has_redirect(rule) {
        host.into_owned()
    } else {
        String::new()
    };
    let request = Forwarding {
        shared,
        rule,
        matched_prefix,
        host,
        client,
        bind,
    };
    // Without route timeouts, a request without a body waits at most the
    // proxy's default (Envoy's route timeout) for the backend's answer.
    let limit = match (rule.timeouts.request, rule.timeouts.backend_request) {
        (None, None) if req.body.is_end_stream() => shared.limits.backend_timeout,
        (limit, _) => limit,
    };
    match limit {
        Some(limit) => tokio::time::timeout(limit, request.run(req, outcome))
            .await
            .unwrap_or(Err(ProxyError::Timeout)),
        None => request.run(req, outcome).await,
    }
}

/// Refuse request heads that a backend could read differently from us
/// (request smuggling) or that name no single host: the checks the proxy
/// made after hyper's HTTP/1 server parsed a head. The lean HTTP/1.1
/// parser makes them itself; this is the reference of the differential
/// fuzz target (`crate::fuzzing::h1_framing`).
pub(super) fn check_request_head<B>(req: &Request<B>) -> Result<(), ProxyError> {
    use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
    let headers = req.headers();
    let http1 = matches!(req.version(), Version::HTTP_10 | Version::HTTP_11);
    if http1 {
        if headers.contains_key(TRANSFER_ENCODING) {
            if headers.contains_key(CONTENT_LENGTH) {
                return Err(ProxyError::BadRequest(
                    "both Content-Length and Transfer-Encoding",
                ));
            }
            if req.version() == Version::HTTP_10 {
                return Err(ProxyError::BadRequest("Transfer-Encoding on HTTP/1.0"));
            }
        }
        match headers.get_all(HOST).iter().count() {
            0 if req.version() == Version::HTTP_11 && req.uri().authority().is_none() => {
                return Err(ProxyError::BadRequest("missing Host"));
            }
            0 | 1 => {}
            _ => return Err(ProxyError::BadRequest("more than one Host")),
        }
    }
    Ok(())
}

/// The request's host as hostnames are matched: the Host header, or the
/// URI authority (HTTP/2, absolute-form).
fn request_host<'a>(headers: &'a Fields, uri: &'a Uri) -> Cow<'a, str> {
    match headers.get(&HOST).and_then(|h| std::str::from_utf8(h).ok()) {
        Some(h) => normalize_host(h),
        None => uri
            .authority()
            .map(|a| normalize_host(a.as_str()))
            .unwrap_or_default(),
    }
}

/// Whether the rule can answer with a redirect (only rule filters can:
/// backends' redirects are ignored).
fn has_redirect(rule: &Rule) -> bool {
    rule.filters
        .iter()
        .any(|f| matches!(f, Filter::RequestRedirect(_)))
}

/// `X-Forwarded-For` (the client appended), `X-Forwarded-Proto` and
/// `X-Real-IP`, as [`add_forwarded`] and
/// [`ForwardedTrust::set_real_ip`](super::ForwardedTrust::set_real_ip) set
/// them; without an incoming `X-Forwarded-For` or trusted hops (the usual
/// case) from the connection's ready-made value, with no formatting.
fn set_forwarded_headers(
    headers: &mut Fields,
    client: &Peer,
    scheme: &'static str,
    trust: &super::ForwardedTrust,
) {
    if headers.contains(&X_FORWARDED_FOR) {
        add_forwarded(headers, client.addr.ip(), scheme);
    } else {
        headers.set(X_FORWARDED_FOR.clone(), client.ip.clone());
        headers.set(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(scheme));
    }
    if trust.trusted_hops == 0 && trust.trusted_cidrs.is_empty() {
        headers.set(X_REAL_IP.clone(), client.ip.clone());
    } else {
        trust.set_real_ip(headers, client.addr.ip());
    }
}

/// A matched request on its way through the rule.
struct Forwarding<'a, 't> {
    shared: &'a Shared,
    rule: &'t Rule,
    matched_prefix: Option<&'t str>,
    /// Normalized request host (for redirects; empty when the rule has
    /// none).
    host: String,
    client: &'a Peer,
    bind: SocketAddr,
}

impl<'t> Forwarding<'_, 't> {
    async fn run(
        &self,
        req: ProxyRequest,
        outcome: &mut Outcome<'t>,
    ) -> Result<ProxyResponse, ProxyError> {
        let ProxyRequest {
            method,
            uri,
            version,
            mut headers,
            body,
            tls,
            upgrade,
        } = req;
        let scheme = tls::scheme(tls.as_ref());
        let upgrade = UpgradeRequest::take(version, &headers, upgrade);
        if !headers.contains(&HOST)
            && let Some(authority) = uri.authority()
            && let Ok(v) = HeaderValue::from_str(authority.as_str())
        {
            headers.set(HOST, v);
        }
        strip_hop_by_hop(&mut headers);
        set_forwarded_headers(
            &mut headers,
            self.client,
            scheme,
            &self.shared.limits.forwarded,
        );
        if let Some(u) = &upgrade {
            u.restore_request_headers(&mut headers);
        }

        // Rule filters, in the order the route lists them.
        let mut path: Option<String> = None;
        let mut mirrors: Vec<&Mirror> = Vec::new();
        let mut cors_origin = None;
        for filter in &self.rule.filters {
            match filter {
                Filter::RequestHeaderModifier(m) => modify_headers(&mut headers, m),
                Filter::ResponseHeaderModifier(_) => {}
                Filter::RequestRedirect(r) => {
                    let current = path.as_deref().unwrap_or(uri.path());
                    let location = redirect_location(
                        r,
                        scheme,
                        &self.host,
                        self.bind.port(),
                        current,
                        uri.query(),
                        self.matched_prefix,
                    );
                    let location = HeaderValue::from_str(&location).map_err(|_| {
                        ProxyError::InvalidFilterResult {
                            what: "redirect Location",
                        }
                    })?;
                    let mut resp = ProxyResponse::new(r.status, ResponseBody::empty());
                    resp.headers.set(LOCATION, location);
                    apply_response_filters(&self.rule.filters, &mut resp);
                    return Ok(resp);
                }
                Filter::UrlRewrite(u) => {
                    if let Some(h) = &u.hostname {
                        set_host(&mut headers, h)?;
                    }
                    if let Some(m) = &u.path {
                        let current = path.as_deref().unwrap_or(uri.path());
                        path = Some(modify_path(current, m, self.matched_prefix));
                    }
                }
                Filter::RequestMirror(m) => mirrors.push(m),
                Filter::Cors(c) if cors::is_preflight(&method, &headers) => {
                    let mut resp = cors::preflight_response(c, &headers);
                    apply_response_filters(&self.rule.filters, &mut resp);
                    return Ok(resp);
                }
                Filter::Cors(c) => {
                    cors_origin = cors::allowed_origin(c, &headers).map(|o| (c, o));
                }
            }
        }

        let mut body = if body.is_end_stream() {
            UpstreamBody::Empty
        } else {
            let mut body = ClientBody::new(body);
            if body.is_chunked() {
                // A chunked body is refused before any backend sees the
                // request when its first chunk is malformed.
                body.read_ahead()
                    .await
                    .map_err(|_| ProxyError::BadRequest("malformed chunked body"))?;
            }
            UpstreamBody::Incoming(body)
        };
        if !mirrors.is_empty() {
            body = self.spawn_mirrors(&mirrors, &method, &headers, &uri, path.as_deref(), body);
        }

        let backend = match self.rule.backends.choose() {
            BackendChoice::Backend(b) => b,
            BackendChoice::AllWeightsZero => return Err(ProxyError::AllWeightsZero),
            BackendChoice::NoBackends => return Err(ProxyError::NoBackends),
        };
        outcome.backend = Some(backend);
        let endpoints = match &backend.target {
            BackendTarget::Endpoints(set) => set,
            BackendTarget::NoReadyEndpoints => {
                return Err(ProxyError::NoReadyEndpoints {
                    backend: backend.id.clone(),
                });
            }
            BackendTarget::Unresolved { reason } => {
                return Err(ProxyError::Unresolved {
                    backend: backend.id.clone(),
                    reason: reason.clone(),
                });
            }
        };
        // Backend filters come after the rule's. Redirects and mirrors
        // are rule-level only and are ignored here.
        for filter in &backend.filters {
            match filter {
                Filter::RequestHeaderModifier(m) => modify_headers(&mut headers, m),
                Filter::UrlRewrite(u) => {
                    if let Some(h) = &u.hostname {
                        set_host(&mut headers, h)?;
                    }
                    if let Some(m) = &u.path {
                        let current = path.as_deref().unwrap_or(uri.path());
                        path = Some(modify_path(current, m, self.matched_prefix));
                    }
                }
                _ => {}
            }
        }

        let endpoint = endpoints.pick();
        let head = UpstreamHead {
            method,
            target: origin_target(path.as_deref(), &uri)?,
            headers,
            upgrade: upgrade.is_some(),
        };
        drop(uri);
        // Upgrades (WebSocket) are HTTP/1.1 whatever the appProtocol.
        let h2 = endpoints.protocol == AppProtocol::H2c && upgrade.is_none();
        let upstream = self.upstream(endpoints, h2);
        // Only a request without a body can be sent again (bodies stream).
        let retry = (upgrade.is_none() && matches!(body, UpstreamBody::Empty))
            .then_some(self.rule.retry.as_ref())
            .flatten();
        let per_try = self.rule.timeouts.backend_request;
        let mut resp = if let Some(policy) = retry {
            // Boxed: the retry loop is large and only rules with a retry
            // policy take it; the common path's future stays small.
            Box::pin(retry::send_with_retries(
                &upstream, policy, endpoints, endpoint, &head, per_try,
            ))
            .await?
        } else {
            let pending = upstream.send(endpoint, UpstreamRequest { head, body });
            match per_try {
                Some(limit) => tokio::time::timeout(limit, pending)
                    .await
                    .map_err(|_| ProxyError::Timeout)?,
                None => pending.await,
            }?
        };

        strip_hop_by_hop(&mut resp.headers);
        if let Some(u) = upgrade {
            u.finish(&mut resp);
        }
        apply_response_filters(&self.rule.filters, &mut resp);
        apply_response_filters(&backend.filters, &mut resp);
        if let Some((policy, origin)) = cors_origin {
            cors::add_response_headers(policy, origin, &mut resp.headers);
        }
        Ok(resp)
    }

    /// The client for `endpoints`: sluice's HTTP/1.1 pool (over TLS per
    /// their BackendTLSPolicy), or hyper-util's HTTP/2 client for h2c.
    fn upstream(&self, endpoints: &EndpointSet, h2: bool) -> Upstream {
        let shared = self.shared;
        match &endpoints.tls {
            None if h2 => Upstream::H2c(Box::new(shared.h2_client.clone())),
            tls => Upstream::H1 {
                pool: shared.pool.clone(),
                tls: tls.clone(),
            },
        }
    }

    /// Start one copy of the request per mirror (those that win their
    /// percentage draw and have an endpoint) and return the body the
    /// backend should read: the client's, teed to the mirrors.
    fn spawn_mirrors(
        &self,
        mirrors: &[&Mirror],
        method: &Method,
        headers: &Fields,
        uri: &Uri,
        path: Option<&str>,
        body: UpstreamBody,
    ) -> UpstreamBody {
        let mut tee = match body {
            UpstreamBody::Incoming(b) => Some(Tee::new(b)),
            _ => None,
        };
        for mirror in mirrors {
            if !mirror.sample() {
                continue;
            }
            let metrics = self.shared.metrics.clone();
            let BackendTarget::Endpoints(set) = &mirror.backend.target else {
                metrics.record_mirror(false);
                continue;
            };
            let endpoint = set.pick();
            let Ok(target) = origin_target(path, uri) else {
                metrics.record_mirror(false);
                continue;
            };
            let h2 = set.protocol == AppProtocol::H2c;
            let copy = UpstreamRequest {
                head: UpstreamHead {
                    method: method.clone(),
                    target,
                    headers: headers.clone(),
                    upgrade: false,
                },
                body: match &mut tee {
                    Some(t) => UpstreamBody::Mirror(t.add_mirror()),
                    None => UpstreamBody::Empty,
                },
            };
            let upstream = self.upstream(set, h2);
            tokio::spawn(async move {
                let sent = async {
                    let resp = upstream.send(endpoint, copy).await.ok()?;
                    // Read the response to its end so the connection can go
                    // back to the pool; the content is discarded.
                    let mut body = resp.body;
                    while let Some(frame) = body.frame().await {
                        frame.ok()?;
                    }
                    Some(())
                };
                let ok = matches!(
                    tokio::time::timeout(MIRROR_TIMEOUT, sent).await,
                    Ok(Some(()))
                );
                metrics.record_mirror(ok);
            });
        }
        match tee {
            Some(t) => UpstreamBody::Tee(t),
            None => UpstreamBody::Empty,
        }
    }
}

fn set_host(headers: &mut Fields, host: &str) -> Result<(), ProxyError> {
    let v = HeaderValue::from_str(host).map_err(|_| ProxyError::InvalidFilterResult {
        what: "rewritten hostname",
    })?;
    headers.set(HOST, v);
    Ok(())
}

fn apply_response_filters(filters: &[Filter], resp: &mut ProxyResponse) {
    for f in filters {
        if let Filter::ResponseHeaderModifier(m) = f {
            modify_headers(&mut resp.headers, m);
        }
    }
}

/// The request target the backend gets (see [`origin_target`]); kept for
/// the path rewrite of retries and mirrors.
#[allow(dead_code)]
fn target_of(path: Option<&str>, uri: &Uri) -> Result<PathAndQuery, ProxyError> {
    origin_target(path, uri)
}

#[cfg(test)]
mod tests {
    #![allow(unreachable_code, unused_variables, clippy::diverging_sub_expression)]
    use super::*;

    /// The size of what `make` would return, without calling it.
    fn size_of_output<F>(_: &impl FnOnce() -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every request's future is moved whole (into each parent future when
    /// first awaited, into hyper's dispatcher for HTTP/2): it was 5.6 KB,
    /// with memcpy ~14% of sluice's instructions per request. Rarely taken
    /// paths (retries, hyper-util's client, new connections) are boxed.
    #[test]
    fn the_request_future_stays_small() {
        let handle_future = || {
            handle(
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
            )
        };
        let send_future = || {
            let upstream: &Upstream = unreachable!();
            upstream.send(unreachable!(), unreachable!())
        };
        let handle_size = size_of_output(&handle_future);
        let send_size = size_of_output(&send_future);
        assert!(
            handle_size <= 3 * 1024,
            "request future is {handle_size} bytes"
        );
        assert!(
            send_size <= 768,
            "upstream send future is {send_size} bytes"
        );
    }
}
