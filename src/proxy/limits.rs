//! The limits and timeouts that protect the proxy from its clients and its
//! backends, with defaults taken from Envoy's edge-proxy guidance (and from
//! nginx where Envoy has no equivalent). `docs/hardening.md` lists each one
//! with the test that covers it.

use std::time::Duration;

use http::Request;

use super::error::ProxyError;
use super::request::forwarded::ForwardedTrust;
use crate::route::OutlierPolicy;

/// What a client may ask of the proxy, and how long anything may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyLimits {
    /// How long a client may take to send a request head: from the
    /// accept for the first request of a connection, from the head's
    /// first byte for the next ones on a keep-alive connection; a slower
    /// client is disconnected (slowloris). HAProxy's recommended `timeout
    /// http-request 10s` (Envoy starts its `request_headers_timeout` at
    /// the first byte too).
    pub request_header_timeout: Duration,
    /// HTTP/1.1: how long a keep-alive connection may wait for the first
    /// byte of its next request. nginx: `keepalive_timeout 75s`; sluice
    /// kept HTTP/1.1 connections 60 s before this had a knob of its own.
    pub keepalive_timeout: Duration,
    /// How long the client may send nothing of a request body the proxy
    /// is waiting for (the backend is ready for more); then 408 and the
    /// connection closed. nginx: `client_body_timeout 60s`.
    pub request_body_timeout: Duration,
    /// Open connections per client address (0: no limit); more are
    /// accepted and closed at once. No limit by default: behind a NAT or
    /// a load balancer that does not keep client addresses, every client
    /// shares a few addresses (nginx `limit_conn`, HAProxy `sc_conn_cur`).
    pub max_connections_per_client: usize,
    /// Requests in flight to one backend (a Service port, across every
    /// route that uses it) from when it is chosen until its response head
    /// arrives; more get 503 at once (0: no cap). Envoy's circuit breaker
    /// `max_requests: 1024`.
    pub max_requests_per_backend: usize,
    /// The request body bytes kept so that a rule's retry policy can send
    /// the request again (0: requests with a body are never retried);
    /// a larger body is streamed and sent once.
    pub retry_buffer_bytes: usize,
    /// Passive outlier ejection of endpoints within their backend.
    pub outliers: OutlierPolicy,
    /// How long a connection may have no request in flight before it is
    /// closed (HTTP/2: GOAWAY). Envoy edge: `common_http_protocol_options.idle_timeout: 3600s`.
    pub idle_timeout: Duration,
    /// Largest request head (request line plus headers; HTTP/2: the decoded
    /// header list) in bytes; larger gets 431. Envoy: `max_request_headers_kb: 60`.
    pub max_request_header_bytes: usize,
    /// Most request header fields; more gets 431. Envoy: `max_headers_count: 100`.
    pub max_request_headers: usize,
    /// Longest request target (path and query) in bytes; longer gets 414.
    /// nginx: `large_client_header_buffers 4 8k` (Envoy only bounds it by
    /// the header size).
    pub max_uri_bytes: usize,
    /// Open client connections of the whole process; a connection beyond
    /// it is accepted and closed at once. Envoy edge: overload manager
    /// `global_downstream_max_connections: 50000`.
    pub max_connections: usize,
    /// Open client connections per bound socket (the listeners of a Gateway
    /// that share a port share a socket). Envoy edge: listener
    /// `connection_limit: 10000`.
    pub max_connections_per_listener: usize,
    /// HTTP/2 streams a client may have open at once (more are refused
    /// with `REFUSED_STREAM`). Envoy edge: `max_concurrent_streams: 100`.
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2 flow-control window per stream: what a client may send on a
    /// stream before the proxy has passed it on. Envoy edge: 64 KiB.
    pub http2_stream_window: u32,
    /// HTTP/2 flow-control window per connection. Envoy edge: 1 MiB.
    pub http2_connection_window: u32,
    /// HTTP/2 frames that do no work (PING, SETTINGS, PRIORITY, empty
    /// DATA) a client may send in a row, without a HEADERS or DATA frame
    /// between them, before the connection is closed (PING and SETTINGS
    /// floods). Envoy: `max_outbound_control_frames: 1000`.
    pub http2_max_control_frames: u32,
    /// HTTP/2 rapid reset (CVE-2023-44487): once a client has opened this
    /// many streams, the connection is closed as soon as it has reset at
    /// least half of them. Envoy: `overload.premature_reset_total_stream_count: 500`.
    pub http2_reset_streams_threshold: u32,
    /// How long a backend may take to send its response headers when the
    /// route sets no `timeouts` and the request has no body; `None` waits
    /// forever. Envoy's default route timeout: 15 s. Requests with a body
    /// get no default (Envoy starts this timer when the request body is
    /// complete, which the proxy does not observe yet).
    pub backend_timeout: Option<Duration>,
    /// On shutdown (SIGTERM): how long in-flight requests may take to
    /// finish after the proxy stops accepting. Kubernetes' default grace
    /// period is 30 s; Envoy's `--drain-time-s` defaults to 600 s.
    pub drain_timeout: Duration,
    /// Refuse (400) requests with `_` in a header name, so that no backend
    /// that treats `_` and `-` alike can be handed a header the gateway
    /// removed or set. Envoy edge: `headers_with_underscores_action: REJECT_REQUEST`.
    pub reject_underscore_headers: bool,
    /// Which proxies in front of the gateway are trusted to report the
    /// client's address in `X-Forwarded-For`. Envoy: `xff_num_trusted_hops: 0`.
    pub forwarded: ForwardedTrust,
    /// TLS listeners: how long a client may take to send its whole
    /// ClientHello (the gateway needs its SNI to route); a slower one is
    /// closed. Envoy: `listener_filters_timeout: 15s`.
    pub client_hello_timeout: Duration,
    /// TLS listeners: the largest ClientHello accepted, in bytes; a larger
    /// one is closed. Envoy's TLS inspector: `max_client_hello_size: 64KiB`.
    pub max_client_hello_bytes: usize,
    /// Threads serving client connections, each with a runtime of its own
    /// (thread per core, `proxy::workers`); 0 serves them on the runtime
    /// that applies the tables. The `sluice` executable starts one per
    /// core when it may run on more than one.
    pub workers: usize,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        ProxyLimits {
            request_header_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(60),
            request_body_timeout: Duration::from_secs(60),
            max_connections_per_client: 0,
            max_requests_per_backend: 1024,
            retry_buffer_bytes: 64 * 1024,
            outliers: OutlierPolicy::default(),
            idle_timeout: Duration::from_secs(3600),
            max_request_header_bytes: 60 * 1024,
            max_request_headers: 100,
            max_uri_bytes: 8 * 1024,
            max_connections: 50_000,
            max_connections_per_listener: 10_000,
            http2_max_concurrent_streams: 100,
            http2_stream_window: 64 * 1024,
            http2_connection_window: 1024 * 1024,
            http2_max_control_frames: 1000,
            http2_reset_streams_threshold: 500,
            backend_timeout: Some(Duration::from_secs(15)),
            drain_timeout: Duration::from_secs(10),
            reject_underscore_headers: true,
            forwarded: ForwardedTrust::default(),
            client_hello_timeout: Duration::from_secs(15),
            max_client_hello_bytes: 64 * 1024,
            workers: 0,
        }
    }
}

/// hyper refuses `max_buf_size` below this; the HTTP/1 head limit is
/// raised to it when configured lower.
pub(super) const MIN_HTTP1_BUFFER: usize = 8192;

/// Why the limits refuse a request (its head parsed by sluice's HTTP/1.1
/// parser, [`super::h1`], or hyper's HTTP/2 server) before it is routed:
/// a request target longer than `max_uri_bytes` (414), `_` in a header
/// name when those are rejected (400). Both close the connection.
pub(super) fn refuse<B>(limits: &ProxyLimits, req: &Request<B>) -> Option<ProxyError> {
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > limits.max_uri_bytes {
        return Some(ProxyError::UriTooLong);
    }
    if limits.reject_underscore_headers
        && req
            .headers()
            .keys()
            .any(|name| name.as_str().as_bytes().contains(&b'_'))
    {
        return Some(ProxyError::BadRequest("underscore in a header name"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::get(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn long_targets_get_414_and_underscores_400() {
        let limits = ProxyLimits {
            max_uri_bytes: 16,
            ..ProxyLimits::default()
        };
        assert!(refuse(&limits, &req("/0123456789abcde", &[])).is_none());
        let r = refuse(&limits, &req("/0123456789?abcdef", &[])).expect("refused");
        assert_eq!(r.status(), 414);
        assert!(r.closes_connection());
        let r = refuse(&limits, &req("/", &[("x_user", "1")])).expect("refused");
        assert_eq!(r.status(), 400);
        assert!(refuse(&limits, &req("/", &[("x-user", "1")])).is_none());
        let lenient = ProxyLimits {
            reject_underscore_headers: false,
            ..limits
        };
        assert!(refuse(&lenient, &req("/", &[("x_user", "1")])).is_none());
    }
}
