//! One request, start to finish, against the route table current when it
//! arrived: lookup, rule filters, mirrors, weighted backend, endpoint,
//! forward, response filters, metrics.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::header::{HOST, LOCATION};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Version};
use http_body::Body;
use http_body_util::BodyExt;

use super::filters::{
    add_forwarded, modify_headers, modify_path, redirect_location, strip_hop_by_hop,
};
use super::retry::{Endpoints, Trying};
use super::session::Sticky;
use super::{cors, grpc, retry};
use crate::metrics::{Metrics, Rejection, RequestKey};
use crate::proxy::Shared;
use crate::proxy::body::{BodyTimedOut, ClientBody, RequestBody, ResponseBody, Tee, UpstreamBody};
use crate::proxy::error::ProxyError;
use crate::proxy::h1;
use crate::proxy::inbound::tls;
use crate::proxy::outbound::replay::Replay;
use crate::proxy::outbound::upstream::{ClientUpstream, Upstream, origin_uri};
use crate::proxy::upgrade::UpgradeRequest;
use crate::route::{
    Backend, BackendChoice, BackendTarget, CorsPolicy, EndpointSet, Failure, Filter, InFlight,
    Lookup, Mirror, PathMatch, RetryPolicy, RouteTable, Rule, SetHealth, normalize_host,
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
pub(in crate::proxy) struct Peer {
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
    /// The endpoint a try is waiting for: the request's own timeout
    /// cutting it counts against that endpoint.
    trying: Trying<'t>,
    /// The hash of the request's consistent-users key, when a rollout
    /// with `consistentBy` governs the rule: its backend counts the user.
    user: Option<u64>,
}

/// Serve one request that arrived on the socket bound at `bind` from
/// `client`. Never fails: every error becomes its response.
pub(in crate::proxy) async fn handle(
    shared: &Shared,
    req: Request<RequestBody>,
    client: &Peer,
    bind: SocketAddr,
) -> Response<ResponseBody> {
    let start = Instant::now();
    // One atomic load: the request finishes on this table whatever reloads.
    let table = shared.table.load_full();
    let mut outcome = Outcome::default();
    let (req, grpc) = is_grpc(req);
    let (resp, code) = match route(shared, &table, req, client, bind, &mut outcome).await {
        Ok(resp) => {
            let code = resp.status().as_u16();
            (resp, code)
        }
        Err(err) => {
            tracing::debug!(error = %err, source = ?err.source_of_failure(), "request failed");
            if let Some(reason) = err.refusal_reason() {
                shared.metrics.record_refusal(reason);
            }
            // A gRPC call gets a gRPC answer; metrics count the HTTP
            // status the error stands for.
            let code = err.status().as_u16();
            let resp = if grpc {
                grpc::error_response(&err)
            } else {
                err.into_response()
            };
            (resp, code)
        }
    };
    // Labels borrowed from the table: no allocation per request.
    let key = RequestKey {
        kind: outcome.rule.map_or("", |r| r.id.kind.metrics_prefix()),
        namespace: outcome.rule.map_or("", |r| r.id.namespace.as_str()),
        route: outcome.rule.map_or("", |r| r.id.route.as_str()),
        rule: outcome.rule.map(|r| r.id.index),
        backend: outcome.backend.map_or("", |b| b.service.as_str()),
        code,
    };
    shared
        .metrics
        .record_user(&key, start.elapsed(), outcome.user);
    resp
}

async fn route<'t>(
    shared: &Shared,
    table: &'t RouteTable,
    req: Request<RequestBody>,
    client: &Peer,
    bind: SocketAddr,
    outcome: &mut Outcome<'t>,
) -> Result<Response<ResponseBody>, ProxyError> {
    check_request_head(&req)?;
    let host = request_host(&req);
    if tls::misdirected(table, bind, &req, &host) {
        return Err(ProxyError::Misdirected);
    }
    let uri = req.uri();
    let found = table.lookup(
        bind,
        &host,
        req.method(),
        uri.path(),
        uri.query(),
        req.headers(),
    );
    let Lookup::Matched(found) = found else {
        return Err(ProxyError::NoRoute);
    };
    let rule: &'t Rule = found.rule;
    outcome.rule = Some(rule);
    let matched_path = &found.matched.path;
    let matched_prefix = match matched_path {
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
        matched_path,
        matched_prefix,
        host,
        client,
        bind,
    };
    // Without route timeouts, a request without a body waits at most the
    // proxy's default (Envoy's route timeout) for the backend's answer.
    let limit = match (rule.timeouts.request, rule.timeouts.backend_request) {
        (None, None) if req.body().is_end_stream() => shared.limits.backend_timeout,
        (limit, _) => limit,
    };
    match limit {
        Some(limit) => match tokio::time::timeout(limit, request.run(req, outcome)).await {
            Ok(result) => result,
            Err(_) => {
                if let Some((health, index)) = outcome.trying.take() {
                    shared.health.record(health, index, Some(Failure::Timeout));
                }
                Err(ProxyError::Timeout)
            }
        },
        None => request.run(req, outcome).await,
    }
}

/// Refuse request heads that a backend could read differently from us
/// (request smuggling) or that name no single host, whichever parser read
/// them. The HTTP/1.1 parser ([`crate::proxy::h1`]) already refuses
/// malformed Content-Length values, differing duplicates, obs-fold, bare CR
/// and NUL, as hyper's server did; these are the cases hyper's server
/// accepted, checked here for every version.
pub(in crate::proxy) fn check_request_head<B>(req: &Request<B>) -> Result<(), ProxyError> {
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
    } else {
        // HTTP/2: `:authority` and a Host field are `host[:port]` (RFC
        // 3986), as the HTTP/1.1 parser checks Host and an absolute-form
        // target; hyper takes `user@a` and a Host of any bytes.
        if req
            .uri()
            .authority()
            .is_some_and(|a| !h1::valid_host(a.as_str().as_bytes()))
            || headers
                .get_all(HOST)
                .iter()
                .any(|h| !h1::valid_host(h.as_bytes()))
        {
            return Err(ProxyError::BadRequest("malformed :authority or Host"));
        }
    }
    Ok(())
}

/// The request's host as hostnames are matched: the Host header, or the
/// URI authority (HTTP/2, absolute-form).
fn request_host<B>(req: &Request<B>) -> Cow<'_, str> {
    match req.headers().get(HOST).and_then(|h| h.to_str().ok()) {
        Some(h) => normalize_host(h),
        None => req
            .uri()
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
/// [`ForwardedTrust::set_real_ip`](crate::proxy::ForwardedTrust::set_real_ip) set
/// them; without an incoming `X-Forwarded-For` or trusted hops (the usual
/// case) from the connection's ready-made value, with no formatting.
fn set_forwarded_headers(
    headers: &mut HeaderMap,
    client: &Peer,
    scheme: &'static str,
    trust: &crate::proxy::ForwardedTrust,
) {
    if headers.contains_key(&X_FORWARDED_FOR) {
        add_forwarded(headers, client.addr.ip(), scheme);
    } else {
        headers.insert(X_FORWARDED_FOR.clone(), client.ip.clone());
        headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(scheme));
    }
    if trust.trusted_hops == 0 && trust.trusted_cidrs.is_empty() {
        headers.insert(X_REAL_IP.clone(), client.ip.clone());
    } else {
        trust.set_real_ip(headers, client.addr.ip());
    }
}

/// A matched request on its way through the rule.
struct Forwarding<'a, 't> {
    shared: &'a Shared,
    rule: &'t Rule,
    /// The path condition that matched (a session cookie's `Path`).
    matched_path: &'t PathMatch,
    matched_prefix: Option<&'t str>,
    /// Normalized request host (for redirects; empty when the rule has
    /// none).
    host: String,
    client: &'a Peer,
    bind: SocketAddr,
}

/// What [`Forwarding::prepare_headers`] read from the request before
/// editing its headers, for the phases after it.
struct Prepared {
    /// `http` or `https`, as the client connected.
    scheme: &'static str,
    /// The protocol upgrade (WebSocket) the request asks for, if any.
    upgrade: Option<UpgradeRequest>,
    /// Whether the client sent its body chunked.
    chunked: bool,
    /// Whether the client sent `TE: trailers` (gRPC needs it end to end).
    te_trailers: bool,
}

/// What the rule's filters make of a request.
enum RuleFilters<'t> {
    /// Forward it, with what the filters leave for the phases after them.
    Forward(Filtered<'t>),
    /// A filter answered it (a redirect, a CORS preflight).
    Answered(Response<ResponseBody>),
}

/// What the rule's filters leave for the phases after them.
struct Filtered<'t> {
    /// The path a URLRewrite filter gave the request, if one did.
    path: Option<String>,
    /// The rule's RequestMirror filters.
    mirrors: Vec<&'t Mirror>,
    /// The CORS policy that allows the request's origin, and that origin.
    cors_origin: Option<(&'t CorsPolicy, HeaderValue)>,
}

/// The body the backend will read, and the least number of bytes it has.
struct OutgoingBody {
    body: UpstreamBody,
    length: u64,
}

/// The backend a request goes to (its choice is kept across tries).
struct Chosen<'t> {
    backend: &'t Backend,
    /// The endpoint (its index) a valid session is pinned to, if any.
    pinned: Option<usize>,
    /// The rule's session, when it has `sessionPersistence`.
    sticky: Option<Sticky<'t>>,
}

/// A backend that took the request: its ready endpoints, their health,
/// and the request's place under the backend's cap (held until the
/// response head is here).
struct Admitted<'t> {
    endpoints: &'t EndpointSet,
    health: &'t SetHealth,
    _in_flight: InFlight<'t>,
}

/// A request ready for its backend, as [`Forwarding::send`] leaves it.
enum Sending<'a, 't> {
    /// Sent once (no retry policy, or a body too large to send again).
    Once {
        req: Request<UpstreamBody>,
        upstream: Upstream,
        /// The rule's `timeouts.backendRequest`.
        per_try: Option<Duration>,
    },
    /// Sent under the rule's retry policy.
    Retrying(Retrying<'a, 't>),
}

/// What the retry loop needs, owned, so that its boxed future holds it.
struct Retrying<'a, 't> {
    to: Endpoints<'a, 't>,
    policy: &'t RetryPolicy,
    head: Parts,
    replay: Option<Replay>,
}

impl<'t> Retrying<'_, 't> {
    async fn send(
        self,
        first: usize,
        trying: &mut Trying<'t>,
        metrics: &Metrics,
    ) -> (usize, Result<Response<ResponseBody>, ProxyError>) {
        retry::send_with_retries(
            &self.to,
            self.policy,
            first,
            &self.head,
            self.replay,
            trying,
            metrics,
        )
        .await
    }
}

impl<'a, 't> Forwarding<'a, 't> {
    /// The phases of a matched request, in the order they run. The phases
    /// are plain functions, and the request's two waits (a chunked body's
    /// first chunk, the backend's answer) are this function's own: a phase
    /// as an `async fn` is a future of its own, built with the request in
    /// it, moved into this one and copying its arguments again when first
    /// polled (docs/performance.md, issue 23 item 1).
    async fn run(
        &self,
        req: Request<RequestBody>,
        outcome: &mut Outcome<'t>,
    ) -> Result<Response<ResponseBody>, ProxyError> {
        let (mut parts, body) = req.into_parts();
        let prepared = self.prepare_headers(&mut parts);
        let mut filtered = match self.rule_filters(&mut parts, prepared.scheme)? {
            RuleFilters::Forward(filtered) => filtered,
            RuleFilters::Answered(answer) => return Ok(answer),
        };
        let (body, length) = self.request_body(body);
        let body = match body {
            Some(mut body) => {
                // A chunked body is refused before any backend sees the
                // request when its first chunk is malformed.
                if prepared.chunked {
                    body.read_ahead().await.map_err(first_chunk_error)?;
                }
                UpstreamBody::Incoming(body)
            }
            None => UpstreamBody::Empty,
        };
        let body = self.mirror(body, length, &parts, &filtered);
        outcome.user = self.rule.backends.user(&parts.headers);
        let chosen = self.choose_backend(&parts, outcome.user)?;
        outcome.backend = Some(chosen.backend);
        let admitted = self.admit(chosen.backend)?;
        self.backend_filters(chosen.backend, &mut parts, &mut filtered.path)?;
        let index = self.pick_endpoint(&chosen, &admitted);
        let sending = self.send(parts, body, &prepared, filtered.path.as_deref(), &admitted)?;
        let (index, resp) = match sending {
            // One try, written out rather than through `Endpoints::send`:
            // this future is part of every request's and is moved whole.
            Sending::Once {
                req,
                upstream,
                per_try,
            } => {
                outcome.trying = Some((admitted.health, index));
                let pending = upstream.send(admitted.endpoints.addrs()[index], req);
                let result = match per_try {
                    Some(limit) => tokio::time::timeout(limit, pending)
                        .await
                        .unwrap_or(Err(ProxyError::Timeout)),
                    None => pending.await,
                };
                outcome.trying = None;
                retry::record_try(&self.shared.health, admitted.health, index, &result);
                (index, result)
            }
            // Boxed: the retry loop is large and only rules with a retry
            // policy take it; the common path's future stays small.
            Sending::Retrying(retrying) => {
                Box::pin(retrying.send(index, &mut outcome.trying, &self.shared.metrics)).await
            }
        };
        Ok(self.respond(resp?, prepared, filtered, &chosen, &admitted, index))
    }

    /// Prepare headers: the Host an HTTP/2 request names only in its
    /// `:authority`, hop-by-hop fields removed (an upgrade's put back), the
    /// forwarded headers set.
    fn prepare_headers(&self, parts: &mut Parts) -> Prepared {
        let scheme = tls::scheme(&parts.extensions);
        let upgrade = UpgradeRequest::take(parts);
        let chunked = parts.headers.contains_key(http::header::TRANSFER_ENCODING);
        let te_trailers = grpc::te_trailers(&parts.headers);
        if !parts.headers.contains_key(HOST)
            && let Some(authority) = parts.uri.authority()
            && let Ok(v) = HeaderValue::from_str(authority.as_str())
        {
            parts.headers.insert(HOST, v);
        }
        strip_hop_by_hop(&mut parts.headers);
        set_forwarded_headers(
            &mut parts.headers,
            self.client,
            scheme,
            &self.shared.limits.forwarded,
        );
        if let Some(u) = &upgrade {
            u.restore_request_headers(&mut parts.headers);
        }
        Prepared {
            scheme,
            upgrade,
            chunked,
            te_trailers,
        }
    }

    /// Rule filters, in the order the route lists them; a redirect or a
    /// CORS preflight is answered here.
    fn rule_filters(
        &self,
        parts: &mut Parts,
        scheme: &'static str,
    ) -> Result<RuleFilters<'t>, ProxyError> {
        let mut path: Option<String> = None;
        let mut mirrors: Vec<&Mirror> = Vec::new();
        let mut cors_origin = None;
        for filter in &self.rule.filters {
            match filter {
                Filter::RequestHeaderModifier(m) => modify_headers(&mut parts.headers, m),
                Filter::ResponseHeaderModifier(_) => {}
                Filter::RequestRedirect(r) => {
                    let current = path.as_deref().unwrap_or(parts.uri.path());
                    let location = redirect_location(
                        r,
                        scheme,
                        &self.host,
                        self.bind.port(),
                        current,
                        parts.uri.query(),
                        self.matched_prefix,
                    );
                    let location = HeaderValue::from_str(&location).map_err(|_| {
                        ProxyError::InvalidFilterResult {
                            what: "redirect Location",
                        }
                    })?;
                    let mut resp = Response::new(ResponseBody::empty());
                    *resp.status_mut() = r.status;
                    resp.headers_mut().insert(LOCATION, location);
                    apply_response_filters(&self.rule.filters, &mut resp);
                    return Ok(RuleFilters::Answered(resp));
                }
                Filter::UrlRewrite(u) => {
                    if let Some(h) = &u.hostname {
                        set_host(parts, h)?;
                    }
                    if let Some(m) = &u.path {
                        let current = path.as_deref().unwrap_or(parts.uri.path());
                        path = Some(modify_path(current, m, self.matched_prefix));
                    }
                }
                Filter::RequestMirror(m) => mirrors.push(m),
                Filter::Cors(c) if cors::is_preflight(&parts.method, &parts.headers) => {
                    let mut resp = cors::preflight_response(c, &parts.headers);
                    apply_response_filters(&self.rule.filters, &mut resp);
                    return Ok(RuleFilters::Answered(resp));
                }
                Filter::Cors(c) => {
                    cors_origin = cors::allowed_origin(c, &parts.headers).map(|o| (c, o));
                }
            }
        }
        Ok(RuleFilters::Forward(Filtered {
            path,
            mirrors,
            cors_origin,
        }))
    }

    /// The body the backend will read: the client's (`None` when it has
    /// none), and the least number of bytes it has. [`Forwarding::run`]
    /// checks a chunked body's first chunk next.
    fn request_body(&self, body: RequestBody) -> (Option<ClientBody>, u64) {
        let length = body.size_hint().lower();
        if body.is_end_stream() {
            (None, length)
        } else {
            let body = ClientBody::new(body, self.shared.limits.request_body_timeout);
            (Some(body), length)
        }
    }

    /// The body teed to the mirrors the rule filters named (the last step
    /// of the rule filters), once its first chunk passed.
    fn mirror(
        &self,
        body: UpstreamBody,
        length: u64,
        parts: &Parts,
        filtered: &Filtered<'t>,
    ) -> OutgoingBody {
        let body = if filtered.mirrors.is_empty() {
            body
        } else {
            self.spawn_mirrors(&filtered.mirrors, parts, filtered.path.as_deref(), body)
        };
        OutgoingBody { body, length }
    }

    /// Choose the backend: a valid session wins (sessionPersistence), then
    /// a rollout's consistentBy key, then the exact weighted split of the
    /// served shares: `choose_for_user` does the last two, with the key's
    /// hash `user` (docs/sessions.md).
    fn choose_backend(&self, parts: &Parts, user: Option<u64>) -> Result<Chosen<'t>, ProxyError> {
        let sticky = self
            .rule
            .session
            .as_ref()
            .map(|policy| Sticky::read(policy, &parts.headers));
        let (backend, pinned) = match sticky.as_ref().and_then(|s| s.pinned(&self.rule.backends)) {
            Some((_, backend, endpoint)) => (backend, endpoint),
            None => match self.rule.backends.choose_for_user(user) {
                BackendChoice::Backend(b) => (b, None),
                BackendChoice::AllWeightsZero => return Err(ProxyError::AllWeightsZero),
                BackendChoice::NoBackends => return Err(ProxyError::NoBackends),
            },
        };
        Ok(Chosen {
            backend,
            pinned,
            sticky,
        })
    }

    /// Admit the request to the backend: it needs ready endpoints, and
    /// room under its cap, counted until the response head is here (a
    /// stalled backend gets 503s at once instead of a pile-up).
    fn admit(&self, backend: &'t Backend) -> Result<Admitted<'t>, ProxyError> {
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
        let health = self.shared.health.of(&backend.service, endpoints);
        let Some(in_flight) = health
            .backend
            .begin(self.shared.limits.max_requests_per_backend)
        else {
            self.shared
                .metrics
                .record_rejected(&backend.service, Rejection::BackendOverloaded);
            return Err(ProxyError::Overloaded {
                backend: backend.id.clone(),
            });
        };
        Ok(Admitted {
            endpoints,
            health,
            _in_flight: in_flight,
        })
    }

    /// Backend filters, after the rule's. Redirects and mirrors are
    /// rule-level only and are ignored here.
    fn backend_filters(
        &self,
        backend: &Backend,
        parts: &mut Parts,
        path: &mut Option<String>,
    ) -> Result<(), ProxyError> {
        for filter in &backend.filters {
            match filter {
                Filter::RequestHeaderModifier(m) => modify_headers(&mut parts.headers, m),
                Filter::UrlRewrite(u) => {
                    if let Some(h) = &u.hostname {
                        set_host(parts, h)?;
                    }
                    if let Some(m) = &u.path {
                        let current = path.as_deref().unwrap_or(parts.uri.path());
                        *path = Some(modify_path(current, m, self.matched_prefix));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Pick the endpoint: the session's, unless it is gone or ejected;
    /// then another of the same backend, as when its pod goes away.
    fn pick_endpoint(&self, chosen: &Chosen<'t>, admitted: &Admitted<'t>) -> usize {
        chosen
            .pinned
            .filter(|i| !self.shared.health.is_ejected(admitted.health, *i))
            .unwrap_or_else(|| self.shared.health.pick(admitted.endpoints, admitted.health))
    }

    /// Send: the request made for the endpoint (origin-form URI, HTTP/1.1
    /// or HTTP/2 as the backend speaks) and the client for it, with the
    /// rule's retry policy when the request can be sent again.
    /// [`Forwarding::run`] awaits the answer.
    fn send(
        &self,
        mut parts: Parts,
        body: OutgoingBody,
        prepared: &Prepared,
        path: Option<&str>,
        admitted: &Admitted<'t>,
    ) -> Result<Sending<'a, 't>, ProxyError> {
        let Admitted {
            endpoints, health, ..
        } = *admitted;
        let OutgoingBody {
            body,
            length: body_length,
        } = body;
        parts.uri = origin_uri(path, &parts.uri)?;
        // Upgrades (WebSocket) are HTTP/1.1 whatever the appProtocol.
        let h2 = endpoints.protocol.is_http2(endpoints.tls.is_some()) && prepared.upgrade.is_none();
        parts.version = if h2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        if h2 && prepared.te_trailers {
            grpc::restore_te(&mut parts.headers);
        }
        let upstream = self.upstream(endpoints, h2);
        let per_try = self.rule.timeouts.backend_request;
        // A request with a body can be sent again when it fits the replay
        // buffer; a larger one is streamed once.
        let buffer = self.shared.limits.retry_buffer_bytes;
        let replayable =
            matches!(body, UpstreamBody::Empty) || (buffer > 0 && body_length <= buffer as u64);
        let retry = (prepared.upgrade.is_none() && replayable)
            .then_some(self.rule.retry.as_ref())
            .flatten();
        Ok(match retry {
            Some(policy) => Sending::Retrying(Retrying {
                to: Endpoints {
                    health: &self.shared.health,
                    set: endpoints,
                    state: health,
                    upstream,
                    per_try,
                },
                policy,
                head: parts,
                replay: match body {
                    UpstreamBody::Empty => None,
                    body => Some(Replay::new(body, buffer)),
                },
            }),
            None => Sending::Once {
                req: Request::from_parts(parts, body),
                upstream,
                per_try,
            },
        })
    }

    /// Respond: the backend's response, hop-by-hop fields removed (an
    /// upgrade's put back), the rule's and the backend's response filters,
    /// CORS headers, and the session handed back.
    fn respond(
        &self,
        resp: Response<ResponseBody>,
        prepared: Prepared,
        filtered: Filtered<'t>,
        chosen: &Chosen<'t>,
        admitted: &Admitted<'t>,
        index: usize,
    ) -> Response<ResponseBody> {
        let (mut parts, body) = resp.into_parts();
        parts.version = Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        if let Some(u) = prepared.upgrade {
            u.finish(&mut parts);
        }
        let mut resp = Response::from_parts(parts, body);
        apply_response_filters(&self.rule.filters, &mut resp);
        apply_response_filters(&chosen.backend.filters, &mut resp);
        if let Some((policy, origin)) = filtered.cors_origin {
            cors::add_response_headers(policy, origin, resp.headers_mut());
        }
        if let Some(sticky) = &chosen.sticky
            && let Some(backend_index) = self.rule.backends.index_of(chosen.backend)
        {
            sticky.answer(
                &mut resp,
                backend_index,
                admitted.endpoints.addrs()[index],
                self.matched_path,
                prepared.scheme == "https",
            );
        }
        resp
    }

    /// The client for `endpoints`: HTTP/2 per endpoint (cleartext or TLS)
    /// for h2c and GRPCRoute backends, sluice's own HTTP/1.1 client and
    /// pool for the rest (upgrades included), cleartext or TLS per their
    /// BackendTLSPolicy.
    fn upstream(&self, endpoints: &EndpointSet, h2: bool) -> Upstream {
        let shared = self.shared;
        match &endpoints.tls {
            _ if h2 => Upstream::Client(Box::new(ClientUpstream::H2(
                shared.h2.clone(),
                endpoints.tls.clone(),
            ))),
            tls => Upstream::Pool(shared.pool().clone(), tls.clone()),
        }
    }

    /// Start one copy of the request per mirror (those that win their
    /// percentage draw and have an endpoint) and return the body the
    /// backend should read: the client's, teed to the mirrors.
    fn spawn_mirrors(
        &self,
        mirrors: &[&Mirror],
        parts: &Parts,
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
            let health = self.shared.health.of(&mirror.backend.service, set);
            let endpoint = set.addrs()[self.shared.health.pick(set, health)];
            let Ok(uri) = origin_uri(path, &parts.uri) else {
                metrics.record_mirror(false);
                continue;
            };
            let h2 = set.protocol.is_http2(set.tls.is_some());
            let mut copy = Request::new(match &mut tee {
                Some(t) => UpstreamBody::Mirror(t.add_mirror()),
                None => UpstreamBody::Empty,
            });
            *copy.method_mut() = parts.method.clone();
            *copy.uri_mut() = uri;
            *copy.version_mut() = if h2 {
                Version::HTTP_2
            } else {
                Version::HTTP_11
            };
            *copy.headers_mut() = parts.headers.clone();
            let upstream = self.upstream(set, h2);
            tokio::spawn(async move {
                let sent = async {
                    let resp = upstream.send(endpoint, copy).await.ok()?;
                    // Read the response to its end so the connection can go
                    // back to the pool; the content is discarded.
                    let mut body = resp.into_body();
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

/// The request, and whether it is a gRPC call. A function rather than a
/// borrow of `req` in [`handle`], which would keep a copy of the request
/// in every request's future until its end.
fn is_grpc(req: Request<RequestBody>) -> (Request<RequestBody>, bool) {
    let grpc = grpc::is_grpc(req.headers());
    (req, grpc)
}

/// The error for a chunked body whose first chunk did not come.
fn first_chunk_error(e: crate::proxy::body::BoxError) -> ProxyError {
    if e.is::<BodyTimedOut>() {
        ProxyError::BodyTimeout
    } else {
        ProxyError::BadRequest("malformed chunked body")
    }
}

fn set_host(parts: &mut Parts, host: &str) -> Result<(), ProxyError> {
    let v = HeaderValue::from_str(host).map_err(|_| ProxyError::InvalidFilterResult {
        what: "rewritten hostname",
    })?;
    parts.headers.insert(HOST, v);
    Ok(())
}

fn apply_response_filters(filters: &[Filter], resp: &mut Response<ResponseBody>) {
    for f in filters {
        if let Filter::ResponseHeaderModifier(m) = f {
            modify_headers(resp.headers_mut(), m);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(unreachable_code, unused_variables, clippy::diverging_sub_expression)]
    use super::*;

    /// The size of what `make` would return, without calling it.
    fn size_of_output<F>(_: &impl FnOnce() -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every request's future is moved whole (into hyper's dispatcher, into
    /// each parent future when first awaited): it was 5.6 KB, with memcpy
    /// ~14% of sluice's instructions per request. Rarely taken paths
    /// (retries, hyper's HTTP/2 client) and the HTTP/1.1 exchange are boxed.
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
