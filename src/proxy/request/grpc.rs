//! gRPC specifics of the data path (gRPC rides HTTP/2, served by the same
//! handler as every request; this module only knows what gRPC adds).
//!
//! - Errors the proxy answers itself are gRPC answers when the request is a
//!   gRPC call (`content-type: application/grpc...`): a "Trailers-Only"
//!   response, HTTP 200 with `grpc-status` and `grpc-message` in its only
//!   HEADERS frame, as Envoy's local replies to gRPC requests are. The
//!   status follows the gRPC project's HTTP-to-gRPC mapping (404
//!   UNIMPLEMENTED, 400 INTERNAL, 429/502/503/504 UNAVAILABLE, otherwise
//!   UNKNOWN), except that a share the configuration cannot serve (an
//!   invalid backendRef, no ready endpoint, all weights 0) is UNAVAILABLE,
//!   as GRPCRoute's spec says: "When a GRPCBackendRef is invalid,
//!   UNAVAILABLE statuses MUST be returned for requests that would have
//!   otherwise been routed to an invalid backend". The HTTP status the
//!   error stands for is what metrics record.
//! - `TE: trailers` is hop-by-hop, but gRPC requires it end to end ("TE
//!   → 'te' 'trailers' # Used to detect incompatible proxies"), and HTTP/2
//!   allows exactly that value: it is kept on requests sent with HTTP/2.

use http::header::{CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::proxy::body::ResponseBody;
use crate::proxy::error::{ErrorSource, ProxyError};

/// gRPC status codes the proxy answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::proxy) enum GrpcCode {
    Unknown = 2,
    PermissionDenied = 7,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

/// Is this request a gRPC call?
pub(in crate::proxy) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The gRPC status for an error the proxy answers.
pub(in crate::proxy) fn code_for(err: &ProxyError) -> GrpcCode {
    if err.source_of_failure() == ErrorSource::Config {
        return GrpcCode::Unavailable;
    }
    match err.status() {
        StatusCode::BAD_REQUEST => GrpcCode::Internal,
        StatusCode::UNAUTHORIZED => GrpcCode::Unauthenticated,
        StatusCode::FORBIDDEN => GrpcCode::PermissionDenied,
        StatusCode::NOT_FOUND => GrpcCode::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => GrpcCode::Unavailable,
        StatusCode::INTERNAL_SERVER_ERROR => GrpcCode::Internal,
        _ => GrpcCode::Unknown,
    }
}

/// The Trailers-Only answer to a gRPC call that failed with `err`.
pub(in crate::proxy) fn error_response(err: &ProxyError) -> Response<ResponseBody> {
    let code = code_for(err) as u8;
    let mut resp = Response::new(ResponseBody::empty());
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if let Ok(message) = HeaderValue::from_str(&percent_encode(&err.to_string())) {
        headers.insert("grpc-message", message);
    }
    resp
}

/// `grpc-message` encoding: bytes outside printable ASCII, and `%`, as
/// `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Did the client ask for trailers (`TE: trailers`)? Read before the
/// hop-by-hop headers are removed.
pub(in crate::proxy) fn te_trailers(headers: &HeaderMap) -> bool {
    headers.get_all(TE).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
    })
}

/// Put `TE: trailers` back on a request sent with HTTP/2.
pub(in crate::proxy) fn restore_te(headers: &mut HeaderMap) {
    headers.insert(TE, HeaderValue::from_static("trailers"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_errors_become_grpc_statuses() {
        let cases = [
            (ProxyError::NoRoute, GrpcCode::Unimplemented),
            (ProxyError::BadRequest("x"), GrpcCode::Internal),
            (ProxyError::NoBackends, GrpcCode::Unavailable),
            (ProxyError::AllWeightsZero, GrpcCode::Unavailable),
            (
                ProxyError::Unresolved {
                    backend: "b".into(),
                    reason: "BackendNotFound".into(),
                },
                GrpcCode::Unavailable,
            ),
            (
                ProxyError::NoReadyEndpoints {
                    backend: "b".into(),
                },
                GrpcCode::Unavailable,
            ),
            (ProxyError::Timeout, GrpcCode::Unavailable),
            (
                ProxyError::InvalidFilterResult { what: "path" },
                GrpcCode::Internal,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(code_for(&err), code, "{err}");
            let resp = error_response(&err);
            assert_eq!(resp.status(), StatusCode::OK, "Trailers-Only is HTTP 200");
            assert_eq!(resp.headers()["grpc-status"], (code as u8).to_string());
            assert_eq!(resp.headers()[CONTENT_TYPE], "application/grpc");
        }
    }

    #[test]
    fn grpc_calls_and_te_trailers_are_recognized() {
        let mut h = HeaderMap::new();
        assert!(!is_grpc(&h));
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&h));
        assert!(!te_trailers(&h));
        h.insert(TE, HeaderValue::from_static("gzip, Trailers"));
        assert!(te_trailers(&h));
        assert_eq!(percent_encode("a%b\u{e9}"), "a%25b%C3%A9");
    }
}
