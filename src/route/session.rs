//! Session persistence (GEP-1619, a route rule's `sessionPersistence`):
//! the gateway starts a session on the backend and endpoint the weighted
//! choice picks, hands the client a token naming them (a cookie, or a
//! header of the session name), and sends every request carrying a valid
//! token to that endpoint.
//!
//! What the GEP asks, and how it is met:
//! - "Persistence is an exception to load balancing": a request with a
//!   valid token skips the weighted choice, and "the persistence to a
//!   single backend MUST be maintained across services, even if the weight
//!   is set to 0". A session follows its pod (the GEP's conformance plan
//!   checks pod identity); when the pod is gone it stays on the backend
//!   with another of its endpoints, and when the backend has no endpoint
//!   left or left the rule, the request is balanced anew and a new session
//!   starts ("Data planes MAY fall back to available backends").
//! - "Route rules referencing the same service MUST NOT share persistent
//!   sessions": every token names its rule; another rule's token is not a
//!   session here. Cookie and header names default to one per rule.
//! - `absoluteTimeout`: a session older than it is over (the token carries
//!   when it started); `lifetimeType: Permanent` also gives the cookie
//!   `Max-Age` and `Expires` of what is left of it. `idleTimeout`: a token
//!   not used for that long is over (the token carries when it was last
//!   used, renewed on every response).
//! - Cookie `Path` "should be interpreted based on the route path that was
//!   matched" ([`cookie_path`]); `HttpOnly`, `SameSite=Strict`, and
//!   `Secure` on TLS connections (security by default, but a cookie a
//!   cleartext listener cannot use would end every session).
//!
//! The token is not signed: like Envoy's stateful sessions (which encode
//! the upstream address), it lets a client choose among the rule's own
//! backends and their ready endpoints, and nothing else: a token naming
//! anything else is no session. Replicas and restarts need no shared
//! secret. A weight-0 backend is therefore reachable by a client that
//! forges a token, as the GEP already makes it reachable to sessions.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::header::COOKIE;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::matching::{PathMatch, ValueMatch};

/// Format of the token (the first byte).
const TOKEN_VERSION: u8 = 1;

/// A rule's `sessionPersistence`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPersistence {
    pub carrier: SessionCarrier,
    pub absolute_timeout: Option<Duration>,
    pub idle_timeout: Option<Duration>,
    /// Names the rule in its tokens: another rule's token is not a
    /// session here.
    pub rule_tag: u32,
    /// [`stable_hash`] of each backendRef's identity, in the rule's order:
    /// a token names its backend by it, so that reordering the backendRefs
    /// keeps sessions.
    pub backend_keys: Vec<u64>,
}

/// Where the token travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCarrier {
    /// `type: Cookie`: the gateway sets the cookie, the client sends it.
    Cookie {
        name: String,
        /// `lifetimeType: Permanent`: the cookie expires with the session.
        permanent: bool,
    },
    /// `type: Header`: the gateway answers with this header, the client
    /// sends it back.
    Header(HeaderName),
}

/// One session, as its token says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionToken {
    /// Index of the backendRef in the rule.
    pub backend: usize,
    pub endpoint: SocketAddr,
    /// When the session started and was last used (Unix seconds).
    pub started: u64,
    pub seen: u64,
}

impl SessionPersistence {
    /// The session `headers` carry for this rule, if one is valid at `now`
    /// (Unix seconds) and names one of the rule's backends.
    pub fn read(&self, headers: &HeaderMap, now: u64) -> Option<SessionToken> {
        match &self.carrier {
            SessionCarrier::Cookie { name, .. } => {
                cookie_values(headers, name).find_map(|value| self.decode(value, now))
            }
            SessionCarrier::Header(name) => headers
                .get_all(name)
                .iter()
                .find_map(|v| self.decode(v.as_bytes(), now)),
        }
    }

    /// A session starting now on `backend`'s `endpoint`.
    pub fn start(&self, backend: usize, endpoint: SocketAddr, now: u64) -> SessionToken {
        SessionToken {
            backend,
            endpoint,
            started: now,
            seen: now,
        }
    }

    /// Must the response carry the token? When the session is new or
    /// moved (it differs from what the request carried), and on every
    /// response when an idle timeout needs the last use renewed.
    pub fn must_send(&self, carried: Option<&SessionToken>, token: &SessionToken) -> bool {
        self.idle_timeout.is_some()
            || carried.is_none_or(|c| c.backend != token.backend || c.endpoint != token.endpoint)
    }

    /// The response header that hands `token` to the client: a
    /// `Set-Cookie` for `path` (`Secure` when the client came over TLS),
    /// or the session header. `now` renews the last use.
    pub fn issue(
        &self,
        token: &SessionToken,
        path: &str,
        secure: bool,
        now: u64,
    ) -> Option<(HeaderName, HeaderValue)> {
        let value = self.encode(&SessionToken {
            seen: now,
            ..*token
        })?;
        match &self.carrier {
            SessionCarrier::Header(name) => {
                Some((name.clone(), HeaderValue::from_str(&value).ok()?))
            }
            SessionCarrier::Cookie { name, permanent } => {
                let mut cookie = format!("{name}={value}; Path={path}; HttpOnly; SameSite=Strict");
                if secure {
                    cookie.push_str("; Secure");
                }
                if *permanent && let Some(absolute) = self.absolute_timeout {
                    let end = token.started.saturating_add(absolute.as_secs());
                    let left = end.saturating_sub(now);
                    let expires = std::time::UNIX_EPOCH + Duration::from_secs(end);
                    cookie.push_str(&format!(
                        "; Max-Age={left}; Expires={}",
                        httpdate::fmt_http_date(expires)
                    ));
                }
                Some((
                    http::header::SET_COOKIE,
                    HeaderValue::from_str(&cookie).ok()?,
                ))
            }
        }
    }

    fn encode(&self, t: &SessionToken) -> Option<String> {
        let mut bytes = Vec::with_capacity(48);
        bytes.push(TOKEN_VERSION);
        bytes.extend_from_slice(&self.rule_tag.to_be_bytes());
        bytes.extend_from_slice(&self.backend_keys.get(t.backend)?.to_be_bytes());
        bytes.extend_from_slice(&t.started.to_be_bytes());
        bytes.extend_from_slice(&t.seen.to_be_bytes());
        match t.endpoint.ip() {
            IpAddr::V4(ip) => {
                bytes.push(4);
                bytes.extend_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                bytes.push(6);
                bytes.extend_from_slice(&ip.octets());
            }
        }
        bytes.extend_from_slice(&t.endpoint.port().to_be_bytes());
        Some(URL_SAFE_NO_PAD.encode(bytes))
    }

    /// The token in `value`, if it is this rule's, names one of its
    /// backends, and has not timed out at `now`.
    fn decode(&self, value: &[u8], now: u64) -> Option<SessionToken> {
        if value.len() > 128 {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(value).ok()?;
        let (head, rest) = bytes.split_first_chunk::<29>()?;
        let u64_at = |i: usize| u64::from_be_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        if head[0] != TOKEN_VERSION || head[1..5] != self.rule_tag.to_be_bytes() {
            return None;
        }
        let key = u64_at(5);
        let backend = self.backend_keys.iter().position(|k| *k == key)?;
        let (started, seen) = (u64_at(13), u64_at(21));
        let ip = match rest {
            [4, a, b, c, d, _, _] => IpAddr::from([*a, *b, *c, *d]),
            [6, tail @ ..] if tail.len() == 18 => {
                IpAddr::from(<[u8; 16]>::try_from(&tail[..16]).ok()?)
            }
            _ => return None,
        };
        let port = u16::from_be_bytes(rest[rest.len() - 2..].try_into().ok()?);
        let expired = |since: u64, timeout: Option<Duration>| {
            timeout.is_some_and(|t| now >= since.saturating_add(t.as_secs()))
        };
        if seen < started
            || expired(started, self.absolute_timeout)
            || expired(seen, self.idle_timeout)
        {
            return None;
        }
        Some(SessionToken {
            backend,
            endpoint: SocketAddr::new(ip, port),
            started,
            seen,
        })
    }
}

/// The cookie `Path` for a request matched by `m`, as the GEP says: the
/// matched path for Exact and PathPrefix matches, the longest literal
/// prefix up to its last `/` for a regular expression, `/` when the route
/// matches all paths; for a GRPCRoute match with an exact service,
/// `/<service>`.
pub fn cookie_path(m: &PathMatch) -> String {
    match m {
        PathMatch::Exact(p) | PathMatch::Prefix(p) => p.clone(),
        PathMatch::RegularExpression(re) => {
            let literal = re
                .prefixes()
                .and_then(|p| p.first())
                .and_then(|l| std::str::from_utf8(&l.bytes).ok())
                .unwrap_or("");
            match literal.rfind('/') {
                Some(0) | None => "/".to_owned(),
                Some(i) => literal[..i].to_owned(),
            }
        }
        PathMatch::Grpc(g) => match &g.service {
            Some(ValueMatch::Exact(s)) => format!("/{s}"),
            _ => "/".to_owned(),
        },
    }
}

/// The values of every cookie named `name` in the request's `Cookie`
/// fields, in order.
pub(crate) fn cookie_values<'h>(
    headers: &'h HeaderMap,
    name: &str,
) -> impl Iterator<Item = &'h [u8]> {
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|h| h.as_bytes().split(|b| *b == b';'))
        .filter_map(move |pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|b| *b == b'=')?;
            (&pair[..eq] == name.as_bytes()).then(|| &pair[eq + 1..])
        })
}

/// FNV-1a (64-bit) of `bytes`, finished with MurmurHash3's 64-bit
/// finalizer (so that values differing in their last byte land far
/// apart). Stable across processes, replicas and versions: session tokens
/// carry it and a rollout's consistent users are placed by it, so changing
/// it would end every session and move consistent users.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(carrier: SessionCarrier) -> SessionPersistence {
        SessionPersistence {
            carrier,
            absolute_timeout: Some(Duration::from_secs(100)),
            idle_timeout: None,
            rule_tag: 7,
            backend_keys: vec![stable_hash(b"ns/a:80"), stable_hash(b"ns/b:80")],
        }
    }

    fn cookie() -> SessionCarrier {
        SessionCarrier::Cookie {
            name: "sid".into(),
            permanent: false,
        }
    }

    fn request_with(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
        h
    }

    /// The value a client sends back for an issued header.
    fn token_value(issued: &HeaderValue) -> String {
        let text = issued.to_str().unwrap();
        let first = text.split(';').next().unwrap();
        first.split_once('=').map_or(first, |(_, v)| v).to_owned()
    }

    #[test]
    fn a_cookie_round_trips_to_the_same_backend_and_endpoint() {
        let p = policy(cookie());
        let endpoint: SocketAddr = "10.0.0.7:8080".parse().unwrap();
        let t = p.start(1, endpoint, 1000);
        let (name, value) = p.issue(&t, "/api", false, 1000).unwrap();
        assert_eq!(name, http::header::SET_COOKIE);
        let text = value.to_str().unwrap();
        assert!(text.starts_with("sid="), "{text}");
        assert!(
            text.contains("; Path=/api; HttpOnly; SameSite=Strict"),
            "{text}"
        );
        assert!(
            !text.contains("Secure") && !text.contains("Max-Age"),
            "{text}"
        );
        let back = request_with(
            "cookie",
            &format!("other=1; sid={}; x=y", token_value(&value)),
        );
        assert_eq!(p.read(&back, 1010), Some(t));
        // An IPv6 endpoint too.
        let v6: SocketAddr = "[fd00::1]:443".parse().unwrap();
        let t6 = p.start(0, v6, 5);
        let (_, v) = p.issue(&t6, "/", true, 5).unwrap();
        assert!(v.to_str().unwrap().ends_with("; Secure"));
        let back = request_with("cookie", &format!("sid={}", token_value(&v)));
        assert_eq!(p.read(&back, 6).map(|t| t.endpoint), Some(v6));
    }

    #[test]
    fn the_absolute_timeout_ends_a_session_and_permanent_cookies_expire_with_it() {
        let mut p = policy(SessionCarrier::Cookie {
            name: "sid".into(),
            permanent: true,
        });
        let t = p.start(0, "127.0.0.1:1".parse().unwrap(), 1_000_000);
        let (_, value) = p.issue(&t, "/", false, 1_000_040).unwrap();
        let text = value.to_str().unwrap();
        assert!(text.contains("; Max-Age=60; Expires="), "{text}");
        let back = request_with("cookie", &format!("sid={}", token_value(&value)));
        assert!(p.read(&back, 1_000_099).is_some());
        assert!(p.read(&back, 1_000_100).is_none(), "100 s after it started");
        p.absolute_timeout = None;
        assert!(p.read(&back, u64::MAX / 2).is_some(), "no timeout, no end");
    }

    #[test]
    fn the_idle_timeout_ends_a_session_left_unused_and_is_renewed_by_use() {
        let mut p = policy(SessionCarrier::Header(HeaderName::from_static("x-session")));
        p.absolute_timeout = None;
        p.idle_timeout = Some(Duration::from_secs(10));
        let t = p.start(1, "127.0.0.1:2".parse().unwrap(), 100);
        assert!(p.must_send(Some(&t), &t), "renewed on every response");
        let (name, first) = p.issue(&t, "/", false, 100).unwrap();
        assert_eq!(name.as_str(), "x-session");
        let carried = p
            .read(&request_with("x-session", first.to_str().unwrap()), 109)
            .unwrap();
        let (_, renewed) = p.issue(&carried, "/", false, 109).unwrap();
        assert!(
            p.read(&request_with("x-session", first.to_str().unwrap()), 110)
                .is_none()
        );
        let again = p.read(&request_with("x-session", renewed.to_str().unwrap()), 118);
        assert_eq!(again.map(|t| (t.backend, t.started)), Some((1, 100)));
    }

    #[test]
    fn tokens_of_other_rules_unknown_backends_or_garbage_are_no_session() {
        let p = policy(cookie());
        let t = p.start(0, "127.0.0.1:3".parse().unwrap(), 1);
        let (_, v) = p.issue(&t, "/", false, 1).unwrap();
        let good = token_value(&v);
        let other_rule = SessionPersistence {
            rule_tag: 8,
            ..p.clone()
        };
        let back = request_with("cookie", &format!("sid={good}"));
        assert!(p.read(&back, 2).is_some());
        assert!(other_rule.read(&back, 2).is_none(), "sessions are per rule");
        let fewer = SessionPersistence {
            backend_keys: vec![stable_hash(b"ns/b:80")],
            ..p.clone()
        };
        assert!(fewer.read(&back, 2).is_none(), "its backend left the rule");
        let reordered = SessionPersistence {
            backend_keys: vec![stable_hash(b"ns/c:80"), stable_hash(b"ns/a:80")],
            ..p.clone()
        };
        assert_eq!(
            reordered.read(&back, 2).map(|t| t.backend),
            Some(1),
            "found by identity, not position"
        );
        for garbage in ["", "x", "AAAA", &good[..good.len() - 2], "%%%"] {
            let h = request_with("cookie", &format!("sid={garbage}"));
            assert!(p.read(&h, 2).is_none(), "{garbage:?}");
        }
        assert!(
            p.read(&request_with("cookie", &format!("sidx={good}")), 2)
                .is_none()
        );
    }

    #[test]
    fn a_session_is_sent_when_new_or_moved() {
        let p = policy(cookie());
        let e1: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let e2: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let t = p.start(0, e1, 1);
        assert!(p.must_send(None, &t));
        assert!(!p.must_send(Some(&t), &t));
        let moved = SessionToken { endpoint: e2, ..t };
        assert!(p.must_send(Some(&t), &moved));
    }

    #[test]
    fn cookie_paths_follow_the_matched_path() {
        assert_eq!(cookie_path(&PathMatch::prefix("/")), "/");
        assert_eq!(cookie_path(&PathMatch::prefix("/api/")), "/api");
        assert_eq!(cookie_path(&PathMatch::Exact("/a/b".into())), "/a/b");
        assert_eq!(
            cookie_path(&PathMatch::regex("/p1/p2/[a-z]+/p3").unwrap()),
            "/p1/p2"
        );
        assert_eq!(cookie_path(&PathMatch::regex("/[a-z]+").unwrap()), "/");
        let grpc = crate::route::GrpcMethodMatch {
            service: Some(ValueMatch::Exact("pkg.Svc".into())),
            method: None,
        };
        assert_eq!(cookie_path(&PathMatch::Grpc(grpc)), "/pkg.Svc");
    }

    /// FNV-1a then the fmix64 finalizer of `sluice`, computed apart (as
    /// are the other values of the test, by a separate implementation).
    const PINNED: u64 = 0xbc99_4db9_d32a_bd3c;

    #[test]
    fn the_hash_is_stable() {
        // Pinned: tokens in clients' hands and where consistent users of
        // a rollout land depend on these values. Never change them.
        assert_eq!(stable_hash(b"sluice"), PINNED);
        assert_eq!(stable_hash(b""), 0xefd0_1f60_ba99_2926);
        assert_eq!(stable_hash(b"alice"), 0x3507_d047_a67c_08f4);
        assert_eq!(stable_hash(b"user-1"), 0x41a2_fca5_c684_01c5);
        // Backend keys differing in their last byte (computed apart too).
        assert_eq!(stable_hash(b"ns/a:80"), 0xf703_7dad_6010_e154);
        assert_eq!(stable_hash(b"ns/a:81"), 0x2473_0589_cd88_406a);
    }
}
