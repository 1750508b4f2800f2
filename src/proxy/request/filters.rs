//! HTTPRoute filters and header hygiene as pure functions over headers and
//! paths, so each spec rule is unit tested without a socket.

use std::fmt::Write as _;
use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::route::{HeaderModifier, PathModifier, Redirect};

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1, plus
/// the legacy ones proxies are expected to drop).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
];

/// Remove hop-by-hop headers: the fixed list, `Proxy-Authorization`, and
/// every header the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass over the names (standard names
    // compare as enums) instead of nine hashed removals, twice per request.
    if !headers
        .keys()
        .any(|name| HOP_BY_HOP.contains(name) || name == header::PROXY_AUTHORIZATION)
    {
        return;
    }
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::PROXY_AUTHORIZATION);
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Append the client's address to `X-Forwarded-For` (keeping what earlier
/// proxies wrote, as one comma-separated list) and set `X-Forwarded-Proto`
/// to the scheme the client used (`http`, or `https` on a TLS listener).
pub fn add_forwarded(headers: &mut HeaderMap, client: IpAddr, proto: &'static str) {
    let mut list = String::new();
    for v in headers.get_all(&X_FORWARDED_FOR) {
        if let Ok(v) = v.to_str() {
            list.push_str(v);
            list.push_str(", ");
        }
    }
    let _ = write!(list, "{client}");
    if let Ok(v) = HeaderValue::from_str(&list) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(proto));
}

/// HTTPHeaderFilter: "set" overwrites, "add" appends another value,
/// "remove" deletes; names are case-insensitive (`HeaderName` is lower case).
pub fn modify_headers(headers: &mut HeaderMap, m: &HeaderModifier) {
    for (name, value) in &m.set {
        headers.insert(name.clone(), value.clone());
    }
    for (name, value) in &m.add {
        headers.append(name.clone(), value.clone());
    }
    for name in &m.remove {
        headers.remove(name);
    }
}

/// The path after a ReplaceFullPath or ReplacePrefixMatch modifier.
///
/// `matched_prefix` is the rule's PathPrefix that matched the request
/// (stored without a trailing slash, or `/`). Per the spec, with prefix
/// `/foo` replaced by `/bar`, `/foo/x` becomes `/bar/x`; replaced by `/`,
/// `/foo/x` becomes `/x` and `/foo` becomes `/`. Without a prefix match the
/// whole path is replaced.
pub fn modify_path(path: &str, modifier: &PathModifier, matched_prefix: Option<&str>) -> String {
    match modifier {
        PathModifier::ReplaceFullPath(p) => p.clone(),
        PathModifier::ReplacePrefixMatch(replacement) => {
            let rest = match matched_prefix {
                Some("/") => path,
                Some(prefix) => path.get(prefix.len()..).unwrap_or(""),
                None => "",
            };
            let base = replacement.trim_end_matches('/');
            let mut out = String::with_capacity(base.len() + rest.len() + 1);
            out.push_str(base);
            if !rest.is_empty() && !rest.starts_with('/') {
                out.push('/');
            }
            out.push_str(rest);
            if out.is_empty() {
                out.push('/');
            }
            out
        }
    }
}

/// The `Location` of a RequestRedirect, built from the request.
///
/// Per the spec: hostname and path default to the request's; the query is
/// kept; without a port, the port is the well-known one of the redirect's
/// scheme when a scheme is given, else the listener's port; the port is
/// left out when it is the scheme's default (http 80, https 443).
pub fn redirect_location(
    redirect: &Redirect,
    request_scheme: &str,
    request_host: &str,
    listener_port: u16,
    path: &str,
    query: Option<&str>,
    matched_prefix: Option<&str>,
) -> String {
    let scheme = redirect.scheme.as_deref().unwrap_or(request_scheme);
    let host = redirect.hostname.as_deref().unwrap_or(request_host);
    let port = match (redirect.port, redirect.scheme.as_deref()) {
        (Some(p), _) => p,
        (None, Some(s)) => default_port(s).unwrap_or(listener_port),
        (None, None) => listener_port,
    };
    let path = match &redirect.path {
        Some(m) => modify_path(path, m, matched_prefix),
        None => path.to_string(),
    };
    let mut out = String::with_capacity(scheme.len() + host.len() + path.len() + 16);
    out.push_str(scheme);
    out.push_str("://");
    out.push_str(host);
    if default_port(scheme) != Some(port) {
        out.push(':');
        out.push_str(&port.to_string());
    }
    out.push_str(&path);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

fn default_port(scheme: &str) -> Option<u16> {
    if scheme.eq_ignore_ascii_case("http") {
        Some(80)
    } else if scheme.eq_ignore_ascii_case("https") {
        Some(443)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn prefix(path: &str, to: &str, matched: &str) -> String {
        modify_path(
            path,
            &PathModifier::ReplacePrefixMatch(to.into()),
            Some(matched),
        )
    }

    #[test]
    fn replace_prefix_match_keeps_the_rest_of_the_path() {
        assert_eq!(prefix("/foo/x", "/bar", "/foo"), "/bar/x");
        assert_eq!(prefix("/foo", "/bar", "/foo"), "/bar");
        assert_eq!(prefix("/foo/", "/bar", "/foo"), "/bar/");
        assert_eq!(prefix("/foo/x", "/", "/foo"), "/x");
        assert_eq!(prefix("/foo", "/", "/foo"), "/");
        assert_eq!(prefix("/foo/x", "/bar/", "/foo"), "/bar/x");
        assert_eq!(prefix("/x/y", "/bar", "/"), "/bar/x/y");
        assert_eq!(prefix("/prefix/one/two", "/one", "/prefix/one"), "/one/two");
    }

    #[test]
    fn replace_full_path_ignores_the_request_path() {
        assert_eq!(
            modify_path(
                "/full/one/two",
                &PathModifier::ReplaceFullPath("/one".into()),
                Some("/full")
            ),
            "/one"
        );
    }

    fn redirect(scheme: Option<&str>, host: Option<&str>, port: Option<u16>) -> Redirect {
        Redirect {
            scheme: scheme.map(Into::into),
            hostname: host.map(Into::into),
            path: None,
            port,
            status: StatusCode::FOUND,
        }
    }

    #[test]
    fn redirect_port_follows_the_scheme_and_listener() {
        let loc = |r: &Redirect, listener_port| {
            redirect_location(
                r,
                "http",
                "example.org",
                listener_port,
                "/p",
                Some("a=1"),
                None,
            )
        };
        // nothing set: listener port, omitted when it is 80
        assert_eq!(
            loc(&redirect(None, None, None), 80),
            "http://example.org/p?a=1"
        );
        assert_eq!(
            loc(&redirect(None, None, None), 8080),
            "http://example.org:8080/p?a=1"
        );
        // scheme set: its well-known port
        assert_eq!(
            loc(&redirect(Some("https"), None, None), 8080),
            "https://example.org/p?a=1"
        );
        // port set
        assert_eq!(
            loc(&redirect(Some("https"), None, Some(8443)), 80),
            "https://example.org:8443/p?a=1"
        );
        assert_eq!(
            loc(&redirect(Some("http"), None, Some(80)), 8080),
            "http://example.org/p?a=1"
        );
        assert_eq!(
            loc(&redirect(None, Some("other.example"), Some(443)), 80),
            "http://other.example:443/p?a=1"
        );
        // On an HTTPS listener the request's scheme is https: kept when the
        // redirect sets none, with the listener port (omitted when 443).
        let tls = |r: &Redirect, listener_port| {
            redirect_location(r, "https", "example.org", listener_port, "/p", None, None)
        };
        assert_eq!(
            tls(&redirect(None, None, None), 443),
            "https://example.org/p"
        );
        assert_eq!(
            tls(&redirect(None, None, None), 8443),
            "https://example.org:8443/p"
        );
        assert_eq!(
            tls(&redirect(Some("http"), None, None), 8443),
            "http://example.org/p"
        );
    }

    #[test]
    fn hop_by_hop_headers_and_those_named_by_connection_are_removed() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, X-Custom-Hop"),
            ("keep-alive", "timeout=5"),
            ("x-custom-hop", "1"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "secret"),
            ("transfer-encoding", "chunked"),
            ("x-end-to-end", "kept"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["x-end-to-end"]);
    }

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        add_forwarded(&mut h, "10.0.0.1".parse().unwrap(), "http");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1");
        add_forwarded(&mut h, "10.0.0.2".parse().unwrap(), "http");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2");
        assert_eq!(h["x-forwarded-proto"], "http");
        add_forwarded(&mut h, "10.0.0.3".parse().unwrap(), "https");
        assert_eq!(h["x-forwarded-proto"], "https");
    }

    #[test]
    fn header_modifier_sets_adds_then_removes() {
        let mut h = HeaderMap::new();
        h.insert("x-set", HeaderValue::from_static("old"));
        h.insert("x-add", HeaderValue::from_static("a"));
        h.insert("x-remove", HeaderValue::from_static("gone"));
        let m = HeaderModifier {
            set: vec![(
                HeaderName::from_static("x-set"),
                HeaderValue::from_static("new"),
            )],
            add: vec![(
                HeaderName::from_static("x-add"),
                HeaderValue::from_static("b"),
            )],
            remove: vec![HeaderName::from_static("x-remove")],
        };
        modify_headers(&mut h, &m);
        assert_eq!(h["x-set"], "new");
        let added: Vec<_> = h.get_all("x-add").iter().collect();
        assert_eq!(added, vec!["a", "b"]);
        assert!(!h.contains_key("x-remove"));
    }
}
