//! The one error type of the data path.
//!
//! Every way a request can fail is a [`ProxyError`], and every error
//! response the proxy makes (400, 404, 408, 414, 421, 431, 500, 502, 503,
//! 504)
//! is built here from one: each variant knows where the failure came from
//! ([`ErrorSource`]), maps to exactly one HTTP status, and says whether the
//! connection can carry another request. Error responses carry a short
//! text body, on HTTP/1.1 (sluice's own connection loop,
//! [`super::inbound::h1_conn`]) and HTTP/2 alike.

use http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};

use super::body::{BoxError, ResponseBody};

/// Where a failure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSource {
    /// The client's request does not fit the configuration (no route).
    Downstream,
    /// The configuration sends this request nowhere useful (unresolved or
    /// all-zero backends, no ready endpoint).
    Config,
    /// The backend endpoint could not be reached or did not answer in time.
    Upstream,
    /// sluice itself could not build the request or response.
    Internal,
}

/// Why the proxy answered a request itself instead of forwarding it.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// No listener on the socket accepts the host, or no rule matches.
    #[error("no route")]
    NoRoute,
    /// The request is malformed or ambiguous (framing that could smuggle a
    /// second request, a missing or repeated Host, `_` in a header name):
    /// answered 400 and the connection closed, never forwarded.
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// The request target is longer than `max_uri_bytes` (414, closed).
    #[error("request target too long")]
    UriTooLong,
    /// The request head is over `max_request_header_bytes` or has more
    /// than `max_request_headers` fields (431, closed).
    #[error("request head too large")]
    HeadTooLarge,
    /// On a TLS connection, the Host belongs to another listener than the
    /// one the handshake chose (421).
    #[error("misdirected request")]
    Misdirected,
    /// The rule has no backendRefs (and no redirect).
    #[error("rule has no backends")]
    NoBackends,
    /// Every backendRef of the rule has weight 0.
    #[error("all backend weights are zero")]
    AllWeightsZero,
    /// The chosen backendRef does not resolve.
    #[error("backend {backend} is not resolved: {reason}")]
    Unresolved { backend: String, reason: String },
    /// The chosen backend's Service has no ready endpoint.
    #[error("backend {backend} has no ready endpoints")]
    NoReadyEndpoints { backend: String },
    /// The chosen backend has as many requests in flight as its cap
    /// allows (`--max-requests-per-backend`): 503 at once, rather than a
    /// pile-up behind a stalled backend.
    #[error("backend {backend} has too many requests in flight")]
    Overloaded { backend: String },
    /// The client sent nothing of its request body for the body timeout
    /// (408, closed).
    #[error("the client's request body stalled")]
    BodyTimeout,
    /// The endpoint refused the connection or the exchange failed.
    #[error("endpoint unreachable: {0}")]
    Unreachable(#[source] UpstreamError),
    /// `timeouts.request` or `timeouts.backendRequest` was exceeded.
    #[error("timed out")]
    Timeout,
    /// A filter produced something that is not valid HTTP (a rewritten
    /// path, a redirect Location).
    #[error("invalid {what} after filters")]
    InvalidFilterResult { what: &'static str },
}

impl ProxyError {
    /// Why the request was refused before routing, as the refusal counter
    /// labels it; `None` for what is not a refusal of the request itself.
    pub fn refusal_reason(&self) -> Option<&'static str> {
        match self {
            ProxyError::BadRequest(_) => Some("bad_request"),
            ProxyError::UriTooLong => Some("uri_too_long"),
            ProxyError::HeadTooLarge => Some("head_too_large"),
            ProxyError::Misdirected => Some("misdirected"),
            _ => None,
        }
    }
}

/// A failed exchange with an endpoint, whichever client made it: whether
/// the connection could not be made (nothing was sent: a retry is safe and
/// counts as a connect failure) or broke during the exchange.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct UpstreamError {
    what: &'static str,
    connect: bool,
    #[source]
    source: BoxError,
}

impl UpstreamError {
    /// The connection to `endpoint` could not be made.
    pub fn connect(endpoint: std::net::SocketAddr, source: impl Into<BoxError>) -> Self {
        let source = source.into();
        tracing::trace!(%endpoint, error = %source, "connect failed");
        UpstreamError {
            what: "connect",
            connect: true,
            source,
        }
    }

    /// The connection was made but the exchange failed.
    pub fn exchange(source: impl Into<BoxError>) -> Self {
        UpstreamError {
            what: "exchange",
            connect: false,
            source: source.into(),
        }
    }

    /// Whether it failed before any connection was made.
    pub fn is_connect(&self) -> bool {
        self.connect
    }
}

impl From<hyper_util::client::legacy::Error> for UpstreamError {
    fn from(e: hyper_util::client::legacy::Error) -> Self {
        UpstreamError {
            what: if e.is_connect() {
                "connect"
            } else {
                "exchange"
            },
            connect: e.is_connect(),
            source: Box::new(e),
        }
    }
}

impl ProxyError {
    pub fn source_of_failure(&self) -> ErrorSource {
        match self {
            ProxyError::NoRoute
            | ProxyError::BadRequest(_)
            | ProxyError::UriTooLong
            | ProxyError::HeadTooLarge
            | ProxyError::Misdirected
            | ProxyError::BodyTimeout => ErrorSource::Downstream,
            ProxyError::NoBackends
            | ProxyError::AllWeightsZero
            | ProxyError::Unresolved { .. }
            | ProxyError::NoReadyEndpoints { .. } => ErrorSource::Config,
            ProxyError::Unreachable(_) | ProxyError::Timeout | ProxyError::Overloaded { .. } => {
                ErrorSource::Upstream
            }
            ProxyError::InvalidFilterResult { .. } => ErrorSource::Internal,
        }
    }

    /// The one place a data-path failure becomes an HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ProxyError::UriTooLong => StatusCode::URI_TOO_LONG,
            ProxyError::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ProxyError::Misdirected => StatusCode::MISDIRECTED_REQUEST,
            // Per the spec: "If all entries in BackendRefs are invalid, and
            // there are also no filters specified in this route rule, all
            // traffic which matches this rule MUST receive a 500 status code."
            ProxyError::NoBackends
            | ProxyError::AllWeightsZero
            | ProxyError::Unresolved { .. }
            | ProxyError::InvalidFilterResult { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::NoReadyEndpoints { .. } | ProxyError::Overloaded { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ProxyError::Unreachable(_) => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The short body sent to the client (no backend details leak out).
    fn body_text(&self) -> &'static str {
        match self {
            ProxyError::NoRoute => "no route\n",
            ProxyError::BadRequest(_) => "bad request\n",
            ProxyError::UriTooLong => "request target too long\n",
            ProxyError::HeadTooLarge => "request header fields too large\n",
            ProxyError::Misdirected => {
                "misdirected request: this connection does not serve that host\n"
            }
            ProxyError::NoBackends => "no backends\n",
            ProxyError::AllWeightsZero => "all backend weights are zero\n",
            ProxyError::Unresolved { .. } => "backend not resolved\n",
            ProxyError::NoReadyEndpoints { .. } => "no ready endpoints\n",
            ProxyError::Overloaded { .. } => "backend overloaded\n",
            ProxyError::BodyTimeout => "request body timed out\n",
            ProxyError::Unreachable(_) => "backend unreachable\n",
            ProxyError::Timeout => "backend timed out\n",
            ProxyError::InvalidFilterResult { .. } => "invalid filter result\n",
        }
    }

    /// Whether the connection must close after the answer: nothing after a
    /// malformed or oversized request on it can be trusted to be framed as
    /// the client meant (and its body, if any, was not read).
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            ProxyError::BadRequest(_)
                | ProxyError::UriTooLong
                | ProxyError::HeadTooLarge
                | ProxyError::BodyTimeout
        )
    }

    /// The error response: the one place every error answer is made.
    pub fn into_response(self) -> Response<ResponseBody> {
        let text = self.body_text();
        let close = self.closes_connection();
        let mut resp = Response::new(ResponseBody::full(text));
        *resp.status_mut() = self.status();
        let headers = resp.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        headers.insert(CONTENT_LENGTH, HeaderValue::from(text.len()));
        if close {
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_maps_to_the_spec_status() {
        let cases = [
            (ProxyError::NoRoute, 404, ErrorSource::Downstream),
            (
                ProxyError::BadRequest("missing Host"),
                400,
                ErrorSource::Downstream,
            ),
            (ProxyError::NoBackends, 500, ErrorSource::Config),
            (ProxyError::AllWeightsZero, 500, ErrorSource::Config),
            (
                ProxyError::Unresolved {
                    backend: "a/b:80".into(),
                    reason: "BackendNotFound".into(),
                },
                500,
                ErrorSource::Config,
            ),
            (
                ProxyError::NoReadyEndpoints {
                    backend: "a/b:80".into(),
                },
                503,
                ErrorSource::Config,
            ),
            (ProxyError::Timeout, 504, ErrorSource::Upstream),
            (ProxyError::UriTooLong, 414, ErrorSource::Downstream),
            (ProxyError::HeadTooLarge, 431, ErrorSource::Downstream),
            (ProxyError::Misdirected, 421, ErrorSource::Downstream),
            (
                ProxyError::Overloaded {
                    backend: "a/b:80".into(),
                },
                503,
                ErrorSource::Upstream,
            ),
            (ProxyError::BodyTimeout, 408, ErrorSource::Downstream),
        ];
        for (err, code, source) in cases {
            assert_eq!(err.status().as_u16(), code, "{err}");
            assert_eq!(err.source_of_failure(), source, "{err}");
            let close = err.closes_connection();
            let resp = err.into_response();
            assert_eq!(resp.status().as_u16(), code);
            assert!(resp.headers().contains_key(CONTENT_LENGTH));
            assert_eq!(resp.headers().contains_key(CONNECTION), close);
            assert_eq!(close, matches!(code, 400 | 408 | 414 | 431));
        }
    }
}
