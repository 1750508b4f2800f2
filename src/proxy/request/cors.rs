//! The CORS filter on the data path: the gateway answers preflights itself
//! and adds the CORS response headers to the backend's answer to an actual
//! cross-origin request.
//!
//! A preflight is an `OPTIONS` request with `Origin` and
//! `Access-Control-Request-Method`. It never reaches a backend: "The status
//! code of a successful response to a 'preflight' request is always an OK
//! status", and for an origin that is not allowed "the gateway returns
//! 204/200 response but doesn't set the relevant cross-origin response
//! headers". `Access-Control-Allow-Origin` always echoes the request's
//! `Origin` (valid with or without credentials, so one rule serves both),
//! and a `*` in `allowMethods`/`allowHeaders` echoes what the preflight
//! asked for, which the spec requires when credentials are allowed and
//! permits otherwise.

use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};

use crate::proxy::body::ResponseBody;
use crate::route::{CorsList, CorsPolicy};

/// Is this request a CORS preflight?
pub(in crate::proxy) fn is_preflight(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::OPTIONS
        && headers.contains_key(ORIGIN)
        && headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD)
}

/// The request's `Origin` when the policy allows it.
pub(in crate::proxy) fn allowed_origin(
    policy: &CorsPolicy,
    headers: &HeaderMap,
) -> Option<HeaderValue> {
    let origin = headers.get(ORIGIN)?;
    policy
        .allows_origin(origin.to_str().ok()?)
        .then(|| origin.clone())
}

/// The gateway's answer to a preflight (see [`is_preflight`]).
pub(in crate::proxy) fn preflight_response(
    policy: &CorsPolicy,
    request: &HeaderMap,
) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::empty());
    *resp.status_mut() = StatusCode::OK;
    let out = resp.headers_mut();
    out.append(VARY, HeaderValue::from_static("Origin"));
    let Some(origin) = allowed_origin(policy, request) else {
        return resp;
    };
    out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    if policy.allow_credentials {
        out.insert(
            ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
    let echo = |name| request.get(name).cloned();
    let methods = match &policy.allow_methods {
        CorsList::Unset => None,
        CorsList::Wildcard => echo(ACCESS_CONTROL_REQUEST_METHOD),
        CorsList::Names(v) => Some(v.clone()),
    };
    if let Some(v) = methods {
        out.insert(ACCESS_CONTROL_ALLOW_METHODS, v);
    }
    let headers = match &policy.allow_headers {
        CorsList::Unset => None,
        CorsList::Wildcard => echo(ACCESS_CONTROL_REQUEST_HEADERS),
        CorsList::Names(v) => Some(v.clone()),
    };
    if let Some(v) = headers {
        out.insert(ACCESS_CONTROL_ALLOW_HEADERS, v);
    }
    let expose = match &policy.expose_headers {
        CorsList::Wildcard if !policy.allow_credentials => Some(HeaderValue::from_static("*")),
        CorsList::Names(v) => Some(v.clone()),
        // With credentials `*` is not allowed, and a preflight has no
        // response headers to name instead.
        CorsList::Wildcard | CorsList::Unset => None,
    };
    if let Some(v) = expose {
        out.insert(ACCESS_CONTROL_EXPOSE_HEADERS, v);
    }
    out.insert(ACCESS_CONTROL_MAX_AGE, policy.max_age.clone());
    resp
}

/// Add the CORS headers to the backend's response to an actual request
/// from `origin` (already known to be allowed). They replace any the
/// backend set.
pub(in crate::proxy) fn add_response_headers(
    policy: &CorsPolicy,
    origin: HeaderValue,
    out: &mut HeaderMap,
) {
    let expose = match &policy.expose_headers {
        CorsList::Unset => None,
        CorsList::Names(v) => Some(v.clone()),
        CorsList::Wildcard if !policy.allow_credentials => Some(HeaderValue::from_static("*")),
        // With credentials `*` cannot be used: name this response's headers.
        CorsList::Wildcard => {
            let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
            (!names.is_empty())
                .then(|| HeaderValue::from_str(&names.join(", ")).ok())
                .flatten()
        }
    };
    out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    out.append(VARY, HeaderValue::from_static("Origin"));
    if policy.allow_credentials {
        out.insert(
            ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
    if let Some(v) = expose {
        out.insert(ACCESS_CONTROL_EXPOSE_HEADERS, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::OriginPattern;

    fn policy(origins: &[&str], credentials: bool) -> CorsPolicy {
        CorsPolicy {
            allow_origins: origins
                .iter()
                .map(|o| OriginPattern::parse(o).expect("test origin"))
                .collect(),
            allow_credentials: credentials,
            allow_methods: CorsList::Names(HeaderValue::from_static("GET, OPTIONS")),
            allow_headers: CorsList::Names(HeaderValue::from_static("x-header-1, x-header-2")),
            expose_headers: CorsList::Names(HeaderValue::from_static("x-header-3")),
            max_age: HeaderValue::from(3600u32),
        }
    }

    fn request(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("test name"),
                HeaderValue::from_str(v).expect("test value"),
            );
        }
        h
    }

    fn get<'a>(r: &'a Response<ResponseBody>, name: &str) -> Option<&'a str> {
        r.headers().get(name).map(|v| v.to_str().expect("ascii"))
    }

    #[test]
    fn preflight_detection_needs_options_origin_and_request_method() {
        let full = request(&[
            ("origin", "https://a.com"),
            ("access-control-request-method", "GET"),
        ]);
        assert!(is_preflight(&Method::OPTIONS, &full));
        assert!(!is_preflight(&Method::GET, &full));
        let no_method = request(&[("origin", "https://a.com")]);
        assert!(!is_preflight(&Method::OPTIONS, &no_method));
        let no_origin = request(&[("access-control-request-method", "GET")]);
        assert!(!is_preflight(&Method::OPTIONS, &no_origin));
    }

    #[test]
    fn preflight_from_an_allowed_origin_gets_every_allow_header() {
        let p = policy(&["https://www.foo.com", "https://*.bar.com"], true);
        let r = preflight_response(
            &p,
            &request(&[
                ("origin", "https://xpto.www.bar.com"),
                ("access-control-request-method", "GET"),
            ]),
        );
        assert_eq!(r.status(), 200);
        assert_eq!(
            get(&r, "access-control-allow-origin"),
            Some("https://xpto.www.bar.com")
        );
        assert_eq!(
            get(&r, "access-control-allow-methods"),
            Some("GET, OPTIONS")
        );
        assert_eq!(
            get(&r, "access-control-allow-headers"),
            Some("x-header-1, x-header-2")
        );
        assert_eq!(get(&r, "access-control-expose-headers"), Some("x-header-3"));
        assert_eq!(get(&r, "access-control-max-age"), Some("3600"));
        assert_eq!(get(&r, "access-control-allow-credentials"), Some("true"));
    }

    #[test]
    fn preflight_from_another_origin_gets_no_cors_headers() {
        let p = policy(&["https://www.foo.com"], true);
        let r = preflight_response(
            &p,
            &request(&[
                ("origin", "https://foobar.com"),
                ("access-control-request-method", "GET"),
            ]),
        );
        assert_eq!(r.status(), 200);
        for h in [
            "access-control-allow-origin",
            "access-control-allow-credentials",
            "access-control-allow-methods",
            "access-control-max-age",
        ] {
            assert_eq!(get(&r, h), None, "{h}");
        }
    }

    #[test]
    fn wildcards_echo_the_request_and_credentials_only_when_allowed() {
        let mut p = policy(&["*"], true);
        p.allow_methods = CorsList::Wildcard;
        p.allow_headers = CorsList::Wildcard;
        p.expose_headers = CorsList::Wildcard;
        let asking = request(&[
            ("origin", "https://other.foo.com"),
            ("access-control-request-method", "PUT"),
            ("access-control-request-headers", "x-header-1, x-header-2"),
        ]);
        let r = preflight_response(&p, &asking);
        assert_eq!(
            get(&r, "access-control-allow-origin"),
            Some("https://other.foo.com")
        );
        assert_eq!(get(&r, "access-control-allow-methods"), Some("PUT"));
        assert_eq!(
            get(&r, "access-control-allow-headers"),
            Some("x-header-1, x-header-2")
        );
        assert_eq!(get(&r, "access-control-expose-headers"), None);
        assert_eq!(get(&r, "access-control-allow-credentials"), Some("true"));

        p.allow_credentials = false;
        let r = preflight_response(
            &p,
            &request(&[
                ("origin", "https://foobar.com:12345"),
                ("access-control-request-method", "PUT"),
            ]),
        );
        assert_eq!(
            get(&r, "access-control-allow-origin"),
            Some("https://foobar.com:12345")
        );
        assert_eq!(get(&r, "access-control-allow-headers"), None, "none asked");
        assert_eq!(get(&r, "access-control-expose-headers"), Some("*"));
        assert_eq!(get(&r, "access-control-allow-credentials"), None);
    }

    #[test]
    fn actual_responses_get_origin_credentials_and_exposed_headers() {
        let p = policy(&["https://www.foo.com"], true);
        let req = request(&[("origin", "https://www.foo.com")]);
        let origin = allowed_origin(&p, &req).expect("allowed");
        let mut resp = request(&[
            ("content-type", "text/plain"),
            ("access-control-allow-origin", "*"),
        ]);
        add_response_headers(&p, origin, &mut resp);
        assert_eq!(resp["access-control-allow-origin"], "https://www.foo.com");
        assert_eq!(
            resp.get_all("access-control-allow-origin").iter().count(),
            1
        );
        assert_eq!(resp["access-control-allow-credentials"], "true");
        assert_eq!(resp["access-control-expose-headers"], "x-header-3");
        assert_eq!(resp["vary"], "Origin");
        assert_eq!(
            allowed_origin(&p, &request(&[("origin", "https://foobar.com")])),
            None
        );
        assert_eq!(allowed_origin(&p, &HeaderMap::new()), None);
    }

    #[test]
    fn exposing_every_header_with_credentials_names_them() {
        let mut p = policy(&["*"], true);
        p.expose_headers = CorsList::Wildcard;
        let mut resp = request(&[("x-a", "1"), ("x-b", "2")]);
        add_response_headers(&p, HeaderValue::from_static("https://a.com"), &mut resp);
        assert_eq!(resp["access-control-expose-headers"], "x-a, x-b");
    }
}
