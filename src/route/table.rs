//! The route table and its builder: precedence is decided once, here, when
//! the table is built; a request takes the first candidate that matches.
//!
//! Order of candidates for a request host (DESIGN.md, the spec):
//! 1. the route hostname most specific for the host (characters in a
//!    matching non-wildcard hostname, then characters in a matching hostname);
//! 2. Exact path, then RegularExpression path (implementation-specific in the
//!    spec; sluice ranks it between Exact and PathPrefix), then PathPrefix
//!    with the longest prefix first;
//! 3. method present; 4. most header matches; 5. most query param matches;
//! 6. oldest route (creationTimestamp); 7. `namespace/name` alphabetically;
//! 8. rule order within the route, then match order within the rule.
//!
//! YAML order never decides anything else.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderMap, Method};
use rustls::sign::CertifiedKey;

use super::Rule;
use super::hostname::HostPattern;
use super::matching::{PathMatch, RequestMatch};

/// What identifies a route for the precedence tie-breaks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RouteOrder {
    /// `metadata.creationTimestamp` as Unix nanoseconds (older sorts first).
    pub created: i128,
    pub namespace: String,
    pub name: String,
}

/// The one sort key that ranks every (rule, match) on a listener.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct PrecedenceKey {
    host: (Reverse<usize>, Reverse<usize>),
    path_kind: u8,
    path_len: Reverse<usize>,
    method: Reverse<bool>,
    headers: Reverse<usize>,
    query: Reverse<usize>,
    route: Arc<RouteOrder>,
    rule_index: usize,
    match_index: usize,
}

impl PrecedenceKey {
    fn new(
        host: &HostPattern,
        m: &RequestMatch,
        route: &Arc<RouteOrder>,
        rule_index: usize,
        match_index: usize,
    ) -> Self {
        let (path_kind, path_len) = match &m.path {
            PathMatch::Exact(p) => (0, p.len()),
            PathMatch::RegularExpression(re) => (1, re.as_str().len()),
            PathMatch::Prefix(p) => (2, p.len()),
        };
        PrecedenceKey {
            host: host.precedence(),
            path_kind,
            path_len: Reverse(path_len),
            method: Reverse(m.method.is_some()),
            headers: Reverse(m.headers.len()),
            query: Reverse(m.query.len()),
            route: route.clone(),
            rule_index,
            match_index,
        }
    }
}

/// One (rule, match) pair on a listener, for one route hostname.
#[derive(Debug, Clone)]
struct Candidate {
    host: HostPattern,
    matcher: RequestMatch,
    rule: Arc<Rule>,
    key_without_host: PrecedenceKey,
}

/// The candidates that apply to one host, already in precedence order.
type Candidates = Arc<[Candidate]>;

/// The routes attached to one Gateway listener.
#[derive(Debug)]
pub struct ListenerRoutes {
    /// `gateway/<ns>/<name>/listener/<listener name>`.
    pub id: String,
    pub hostname: HostPattern,
    /// The certificate of an HTTPS listener (TLS terminated here); `None`
    /// for a cleartext HTTP listener.
    pub tls: Option<Arc<CertifiedKey>>,
    exact: HashMap<String, Candidates>,
    /// Keyed by the wildcard's suffix (`.example.com`).
    wildcard: HashMap<String, Candidates>,
    any: Candidates,
}

impl ListenerRoutes {
    fn candidates(&self, host: &str) -> &[Candidate] {
        if let Some(c) = self.exact.get(host) {
            return c;
        }
        if !self.wildcard.is_empty() {
            // Longest wildcard first: try suffixes starting at each dot.
            for (i, _) in host.match_indices('.') {
                if i == 0 {
                    continue;
                }
                if let Some(c) = self.wildcard.get(&host[i..]) {
                    return c;
                }
            }
        }
        &self.any
    }

    /// Number of (rule, match) candidates, over all hostnames.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty() && self.any.is_empty()
    }
}

/// The listeners that share one socket (same address and port), most
/// specific hostname first: a request is served by the first listener whose
/// hostname matches its host (listener isolation).
#[derive(Debug, Default)]
pub struct PortRoutes {
    pub listeners: Vec<ListenerRoutes>,
    /// Frontend client certificate validation on this TLS socket, when its
    /// Gateway asks for it (`spec.tls.frontend`).
    pub client_validation: Option<Arc<ClientValidation>>,
}

/// Frontend client certificate validation of one TLS socket (a Gateway's
/// `spec.tls.frontend`, default or per port), compiled by translate.
#[derive(Debug)]
pub struct ClientValidation {
    /// Checks a client certificate chain against the configured CAs.
    pub verifier: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    /// Mode `AllowInsecureFallback`: a client without a valid certificate
    /// is still served.
    pub insecure_fallback: bool,
}

impl PortRoutes {
    /// Is TLS terminated on this socket? (Listeners of different protocols
    /// never share a socket: translate marks them conflicted.)
    pub fn is_tls(&self) -> bool {
        self.listeners.iter().any(|l| l.tls.is_some())
    }

    /// The listener that owns `host` (normalized): the most specific one
    /// whose hostname matches (listener isolation).
    pub fn listener_for(&self, host: &str) -> Option<&ListenerRoutes> {
        self.listeners.iter().find(|l| l.hostname.matches(host))
    }

    /// The certificate to present for a TLS handshake whose SNI is
    /// `server_name`: that of the listener owning the name. Without SNI (a
    /// client that connects by address), the listener without a hostname,
    /// else the first listener with a certificate. `None` aborts the
    /// handshake.
    pub fn certificate_for(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let listener = match server_name {
            Some(name) => self.listener_for(&super::normalize_host(name))?,
            None => self
                .listeners
                .iter()
                .find(|l| l.hostname == HostPattern::Any && l.tls.is_some())
                .or_else(|| self.listeners.iter().find(|l| l.tls.is_some()))?,
        };
        listener.tls.clone()
    }

    /// Is a request for `host` misdirected on a TLS connection whose SNI was
    /// `server_name`? It is when the listener owning the host is not the one
    /// the handshake chose: the client reused a connection (HTTP/2
    /// coalescing, or a mismatched Host) for a name this listener does not
    /// serve, and must get 421 Misdirected Request.
    pub fn misdirected(&self, server_name: &str, host: &str) -> bool {
        let by_sni = self.listener_for(&super::normalize_host(server_name));
        let by_host = self.listener_for(host);
        match (by_sni, by_host) {
            (Some(a), Some(b)) => !std::ptr::eq(a, b),
            (None, None) => false,
            _ => true,
        }
    }
}

/// What the table says about one request.
#[derive(Debug)]
pub enum Lookup<'a> {
    /// No listener on this socket accepts the request's host: 404.
    NoListener,
    /// A listener accepts the host but no rule matches: 404.
    NoRoute {
        listener: &'a ListenerRoutes,
    },
    Matched(RouteMatch<'a>),
}

/// The rule chosen for a request, and the match entry that chose it (the
/// proxy needs its path prefix for `ReplacePrefixMatch`).
#[derive(Debug)]
pub struct RouteMatch<'a> {
    pub listener: &'a ListenerRoutes,
    pub rule: &'a Arc<Rule>,
    pub matched: &'a RequestMatch,
}

/// Every socket sluice serves and the routes behind each.
#[derive(Debug, Default)]
pub struct RouteTable {
    binds: BTreeMap<SocketAddr, PortRoutes>,
}

impl RouteTable {
    /// The socket addresses the proxy must listen on.
    pub fn binds(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.binds.keys().copied()
    }

    pub fn port(&self, bind: SocketAddr) -> Option<&PortRoutes> {
        self.binds.get(&bind)
    }

    /// Find the rule for a request that arrived on the socket bound at
    /// `bind`. `host` must be normalized ([`super::normalize_host`]).
    pub fn lookup<'a>(
        &'a self,
        bind: SocketAddr,
        host: &str,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Lookup<'a> {
        let Some(port) = self.binds.get(&bind) else {
            return Lookup::NoListener;
        };
        let Some(listener) = port.listeners.iter().find(|l| l.hostname.matches(host)) else {
            return Lookup::NoListener;
        };
        for c in listener.candidates(host) {
            if c.matcher.matches(method, path, query, headers) {
                return Lookup::Matched(RouteMatch {
                    listener,
                    rule: &c.rule,
                    matched: &c.matcher,
                });
            }
        }
        Lookup::NoRoute { listener }
    }
}

/// Handle to a listener added to a [`RouteTableBuilder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerHandle {
    bind: SocketAddr,
    index: usize,
}

struct ListenerBuild {
    id: String,
    hostname: HostPattern,
    tls: Option<Arc<CertifiedKey>>,
    candidates: Vec<Candidate>,
}

/// Collects listeners and rules, then sorts everything once in [`build`].
///
/// [`build`]: RouteTableBuilder::build
#[derive(Default)]
pub struct RouteTableBuilder {
    binds: BTreeMap<SocketAddr, Vec<ListenerBuild>>,
    client_validation: BTreeMap<SocketAddr, Arc<ClientValidation>>,
}

impl RouteTableBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a listener served on the socket `bind`. Listeners sharing a
    /// socket are told apart by hostname.
    pub fn add_listener(
        &mut self,
        bind: SocketAddr,
        id: String,
        hostname: HostPattern,
    ) -> ListenerHandle {
        let listeners = self.binds.entry(bind).or_default();
        listeners.push(ListenerBuild {
            id,
            hostname,
            tls: None,
            candidates: Vec::new(),
        });
        ListenerHandle {
            bind,
            index: listeners.len() - 1,
        }
    }

    /// Make a listener an HTTPS one: TLS is terminated with `certificate`
    /// for the names the listener owns.
    pub fn set_listener_tls(&mut self, listener: ListenerHandle, certificate: Arc<CertifiedKey>) {
        self.binds
            .get_mut(&listener.bind)
            .expect("handle from this builder")[listener.index]
            .tls = Some(certificate);
    }

    /// Validate client certificates on the TLS socket `bind` (the first
    /// setting for a socket wins).
    pub fn set_port_client_validation(&mut self, bind: SocketAddr, v: Arc<ClientValidation>) {
        self.client_validation.entry(bind).or_insert(v);
    }

    /// Attach one rule of a route to a listener under the route's effective
    /// hostnames (already intersected with the listener's). An empty
    /// `matches` means the spec's default: PathPrefix `/`.
    pub fn add_rule(
        &mut self,
        listener: ListenerHandle,
        hostnames: &[HostPattern],
        route: &RouteOrder,
        rule: Arc<Rule>,
        matches: Vec<RequestMatch>,
    ) {
        let listener = &mut self
            .binds
            .get_mut(&listener.bind)
            .expect("handle from this builder")[listener.index];
        let route = Arc::new(route.clone());
        let matches = if matches.is_empty() {
            vec![RequestMatch::default()]
        } else {
            matches
        };
        for host in hostnames {
            for (match_index, m) in matches.iter().enumerate() {
                listener.candidates.push(Candidate {
                    host: host.clone(),
                    key_without_host: PrecedenceKey::new(
                        &HostPattern::Any,
                        m,
                        &route,
                        rule.id.index,
                        match_index,
                    ),
                    matcher: m.clone(),
                    rule: rule.clone(),
                });
            }
        }
    }

    pub fn build(mut self) -> RouteTable {
        let binds = self
            .binds
            .into_iter()
            .map(|(bind, listeners)| {
                let mut listeners: Vec<ListenerRoutes> =
                    listeners.into_iter().map(build_listener).collect();
                listeners.sort_by_key(|l| l.hostname.precedence());
                let client_validation = self.client_validation.remove(&bind);
                (
                    bind,
                    PortRoutes {
                        listeners,
                        client_validation,
                    },
                )
            })
            .collect();
        RouteTable { binds }
    }
}

fn build_listener(l: ListenerBuild) -> ListenerRoutes {
    // Group the candidates by route hostname first, so that each host's
    // list is assembled from the groups that apply to it: linear in the
    // candidates (times the few wildcard groups), not hosts x candidates.
    let mut groups: HashMap<&HostPattern, Vec<&Candidate>> = HashMap::new();
    for c in &l.candidates {
        groups.entry(&c.host).or_default().push(c);
    }
    let wildcards: Vec<(&HostPattern, &Vec<&Candidate>)> = groups
        .iter()
        .filter(|(p, _)| matches!(p, HostPattern::Wildcard(_)))
        .map(|(p, g)| (*p, g))
        .collect();
    let any_group: &[&Candidate] = groups
        .get(&HostPattern::Any)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let sorted = |parts: Vec<&[&Candidate]>| -> Candidates {
        let mut v: Vec<(PrecedenceKey, &Candidate)> = parts
            .into_iter()
            .flatten()
            .map(|c| {
                let mut key = c.key_without_host.clone();
                key.host = c.host.precedence();
                (key, *c)
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.into_iter().map(|(_, c)| c.clone()).collect()
    };
    let mut exact = HashMap::new();
    let mut wildcard = HashMap::new();
    for (pattern, group) in &groups {
        match pattern {
            HostPattern::Exact(h) => {
                let mut parts: Vec<&[&Candidate]> = vec![group.as_slice(), any_group];
                parts.extend(
                    wildcards
                        .iter()
                        .filter(|(w, _)| w.matches(h))
                        .map(|(_, g)| g.as_slice()),
                );
                exact.insert(h.clone(), sorted(parts));
            }
            HostPattern::Wildcard(suffix) => {
                let mut parts: Vec<&[&Candidate]> = vec![any_group];
                parts.extend(
                    wildcards
                        .iter()
                        .filter(|(w, _)| match w {
                            HostPattern::Wildcard(s) => suffix.ends_with(s.as_str()),
                            _ => false,
                        })
                        .map(|(_, g)| g.as_slice()),
                );
                wildcard.insert(suffix.clone(), sorted(parts));
            }
            HostPattern::Any => {}
        }
    }
    let any = sorted(vec![any_group]);
    ListenerRoutes {
        id: l.id,
        hostname: l.hostname,
        tls: l.tls,
        exact,
        wildcard,
        any,
    }
}

/// One table test per precedence bullet of the spec, plus the spots where
/// other implementations drift (STYLE.md #3). Each test inserts the
/// candidates in the *wrong* order so that insertion order cannot pass it.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::matching::{HeaderMatch, QueryMatch, ValueMatch};
    use crate::route::{BackendSplit, RuleId, Timeouts};
    use http::HeaderName;

    const BIND: &str = "127.0.0.1:8080";

    fn bind() -> SocketAddr {
        BIND.parse().unwrap()
    }

    fn rule(route: &str, index: usize) -> Arc<Rule> {
        Arc::new(Rule {
            id: RuleId {
                namespace: "default".into(),
                route: route.into(),
                index,
                name: None,
            },
            filters: vec![],
            backends: BackendSplit::new(vec![]),
            timeouts: Timeouts::default(),
            retry: None,
        })
    }

    fn order(name: &str, created: i128) -> RouteOrder {
        RouteOrder {
            created,
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn path(p: PathMatch) -> RequestMatch {
        RequestMatch {
            path: p,
            ..RequestMatch::default()
        }
    }

    fn header(name: &'static str, value: &str) -> HeaderMatch {
        HeaderMatch {
            name: HeaderName::from_static(name),
            value: ValueMatch::Exact(value.into()),
        }
    }

    fn query(name: &str, value: &str) -> QueryMatch {
        QueryMatch {
            name: name.into(),
            value: ValueMatch::Exact(value.into()),
        }
    }

    /// Which route/rule answers; `None` for no match.
    fn winner(
        table: &RouteTable,
        host: &str,
        method: Method,
        uri: &str,
        headers: &[(&'static str, &str)],
    ) -> Option<String> {
        let (p, q) = match uri.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (uri, None),
        };
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(HeaderName::from_static(k), v.parse().unwrap());
        }
        match table.lookup(bind(), host, &method, p, q, &h) {
            Lookup::Matched(m) => Some(format!("{}/{}", m.rule.id.route, m.rule.id.index)),
            _ => None,
        }
    }

    /// A table with one listener (no hostname) and the given rules, each
    /// `(route, created, rule index, matches)`.
    fn table(rules: Vec<(&str, i128, usize, Vec<RequestMatch>)>) -> RouteTable {
        let mut b = RouteTableBuilder::new();
        let l = b.add_listener(bind(), "gw/http".into(), HostPattern::Any);
        for (name, created, index, matches) in rules {
            b.add_rule(
                l,
                &[HostPattern::Any],
                &order(name, created),
                rule(name, index),
                matches,
            );
        }
        b.build()
    }

    #[test]
    fn exact_path_beats_prefix_of_the_same_length() {
        let t = table(vec![
            ("prefix", 0, 0, vec![path(PathMatch::prefix("/a"))]),
            ("exact", 1, 0, vec![path(PathMatch::Exact("/a".into()))]),
        ]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/a", &[]).as_deref(),
            Some("exact/0")
        );
        assert_eq!(
            winner(&t, "h", Method::GET, "/a/b", &[]).as_deref(),
            Some("prefix/0")
        );
    }

    #[test]
    fn longest_prefix_wins_whatever_the_order() {
        let t = table(vec![
            ("r", 0, 0, vec![path(PathMatch::prefix("/"))]),
            ("r", 0, 1, vec![path(PathMatch::prefix("/api"))]),
            ("r", 0, 2, vec![path(PathMatch::prefix("/api/v2"))]),
        ]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/api/v2/x", &[]).as_deref(),
            Some("r/2")
        );
        assert_eq!(
            winner(&t, "h", Method::GET, "/api/v1", &[]).as_deref(),
            Some("r/1")
        );
        assert_eq!(
            winner(&t, "h", Method::GET, "/apix", &[]).as_deref(),
            Some("r/0")
        );
    }

    #[test]
    fn regex_path_ranks_between_exact_and_prefix() {
        let t = table(vec![
            ("prefix", 0, 0, vec![path(PathMatch::prefix("/v1/users"))]),
            (
                "regex",
                1,
                0,
                vec![path(PathMatch::regex("/v[0-9]+/.*").unwrap())],
            ),
            (
                "exact",
                2,
                0,
                vec![path(PathMatch::Exact("/v1/users/me".into()))],
            ),
        ]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/v1/users/me", &[]).as_deref(),
            Some("exact/0")
        );
        assert_eq!(
            winner(&t, "h", Method::GET, "/v1/users/42", &[]).as_deref(),
            Some("regex/0")
        );
    }

    #[test]
    fn method_beats_headers_and_is_not_counted_as_a_header() {
        // Envoy Gateway counts the method as a header match and linkerd ranks
        // it after headers; the spec ranks "method match" right after the
        // path. The headered route is older, so a tie would pick it.
        let with_method = RequestMatch {
            method: Some(Method::GET),
            ..RequestMatch::default()
        };
        let with_headers = RequestMatch {
            headers: vec![header("x-a", "1"), header("x-b", "1")],
            ..RequestMatch::default()
        };
        let t = table(vec![
            ("headers", 0, 0, vec![with_headers]),
            ("method", 1, 0, vec![with_method]),
        ]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/", &[("x-a", "1"), ("x-b", "1")]).as_deref(),
            Some("method/0")
        );
        assert_eq!(
            winner(&t, "h", Method::POST, "/", &[("x-a", "1"), ("x-b", "1")]).as_deref(),
            Some("headers/0")
        );
    }

    #[test]
    fn more_headers_beat_fewer_and_more_query_params_beat_fewer() {
        let one = RequestMatch {
            headers: vec![header("x-a", "1")],
            ..RequestMatch::default()
        };
        let two = RequestMatch {
            headers: vec![header("x-a", "1"), header("x-b", "1")],
            ..RequestMatch::default()
        };
        let q1 = RequestMatch {
            query: vec![query("a", "1")],
            ..RequestMatch::default()
        };
        let q2 = RequestMatch {
            query: vec![query("a", "1"), query("b", "1")],
            ..RequestMatch::default()
        };
        let t = table(vec![("one", 0, 0, vec![one]), ("two", 1, 0, vec![two])]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/", &[("x-a", "1"), ("x-b", "1")]).as_deref(),
            Some("two/0")
        );
        assert_eq!(
            winner(&t, "h", Method::GET, "/", &[("x-a", "1")]).as_deref(),
            Some("one/0")
        );
        let t = table(vec![("q1", 0, 0, vec![q1]), ("q2", 1, 0, vec![q2])]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/?a=1&b=1", &[]).as_deref(),
            Some("q2/0")
        );
        assert_eq!(
            winner(&t, "h", Method::GET, "/?a=1", &[]).as_deref(),
            Some("q1/0")
        );
    }

    #[test]
    fn headers_rank_above_query_params() {
        let h = RequestMatch {
            headers: vec![header("x-a", "1")],
            ..RequestMatch::default()
        };
        let q = RequestMatch {
            query: vec![query("a", "1"), query("b", "1")],
            ..RequestMatch::default()
        };
        let t = table(vec![("query", 0, 0, vec![q]), ("header", 1, 0, vec![h])]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/?a=1&b=1", &[("x-a", "1")]).as_deref(),
            Some("header/0")
        );
    }

    #[test]
    fn ties_go_to_the_oldest_route_then_namespace_name_then_rule_order() {
        let same = || vec![path(PathMatch::prefix("/"))];
        let t = table(vec![
            ("b-newer", 20, 0, same()),
            ("a-newest", 30, 0, same()),
            ("z-oldest", 10, 0, same()),
        ]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/", &[]).as_deref(),
            Some("z-oldest/0")
        );
        let t = table(vec![("b", 10, 0, same()), ("a", 10, 0, same())]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/", &[]).as_deref(),
            Some("a/0")
        );
        let t = table(vec![("r", 10, 1, same()), ("r", 10, 0, same())]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/", &[]).as_deref(),
            Some("r/0")
        );
    }

    #[test]
    fn no_matches_means_prefix_slash() {
        let t = table(vec![("r", 0, 0, vec![])]);
        assert_eq!(
            winner(&t, "h", Method::DELETE, "/any/path", &[]).as_deref(),
            Some("r/0")
        );
    }

    #[test]
    fn most_specific_route_hostname_wins_and_falls_through_when_it_does_not_match() {
        let mut b = RouteTableBuilder::new();
        let l = b.add_listener(bind(), "gw/http".into(), HostPattern::Any);
        let p = |s: &str| HostPattern::parse(Some(s));
        // Oldest first, so the tie-breaks would favour the wrong answer.
        b.add_rule(
            l,
            &[HostPattern::Any],
            &order("any", 0),
            rule("any", 0),
            vec![],
        );
        b.add_rule(
            l,
            &[p("*.com")],
            &order("short-wild", 1),
            rule("short-wild", 0),
            vec![],
        );
        b.add_rule(
            l,
            &[p("*.example.com")],
            &order("long-wild", 2),
            rule("long-wild", 0),
            vec![],
        );
        b.add_rule(
            l,
            &[p("foo.example.com")],
            &order("exact", 3),
            rule("exact", 0),
            vec![path(PathMatch::prefix("/only"))],
        );
        let t = b.build();
        assert_eq!(
            winner(&t, "foo.example.com", Method::GET, "/only/x", &[]).as_deref(),
            Some("exact/0")
        );
        // The exact hostname's rules do not match: next most specific hostname.
        assert_eq!(
            winner(&t, "foo.example.com", Method::GET, "/other", &[]).as_deref(),
            Some("long-wild/0")
        );
        assert_eq!(
            winner(&t, "bar.example.com", Method::GET, "/", &[]).as_deref(),
            Some("long-wild/0")
        );
        assert_eq!(
            winner(&t, "a.b.example.com", Method::GET, "/", &[]).as_deref(),
            Some("long-wild/0")
        );
        assert_eq!(
            winner(&t, "other.com", Method::GET, "/", &[]).as_deref(),
            Some("short-wild/0")
        );
        assert_eq!(
            winner(&t, "example.org", Method::GET, "/", &[]).as_deref(),
            Some("any/0")
        );
        // `*.example.com` does not match `example.com` itself.
        assert_eq!(
            winner(&t, "example.com", Method::GET, "/", &[]).as_deref(),
            Some("short-wild/0")
        );
    }

    #[test]
    fn the_most_specific_listener_on_a_port_owns_its_hosts() {
        let mut b = RouteTableBuilder::new();
        let p = |s: &str| HostPattern::parse(Some(s));
        let catch_all = b.add_listener(bind(), "gw/any".into(), HostPattern::Any);
        let wild = b.add_listener(bind(), "gw/wild".into(), p("*.example.com"));
        let exact = b.add_listener(bind(), "gw/exact".into(), p("foo.example.com"));
        b.add_rule(
            catch_all,
            &[HostPattern::Any],
            &order("any", 0),
            rule("any", 0),
            vec![],
        );
        b.add_rule(
            wild,
            &[p("*.example.com")],
            &order("wild", 0),
            rule("wild", 0),
            vec![],
        );
        b.add_rule(
            exact,
            &[p("foo.example.com")],
            &order("exact", 0),
            rule("exact", 0),
            vec![path(PathMatch::Exact("/x".into()))],
        );
        let t = b.build();
        assert_eq!(
            winner(&t, "foo.example.com", Method::GET, "/x", &[]).as_deref(),
            Some("exact/0")
        );
        // Listener isolation: the exact listener owns foo.example.com even
        // where its routes do not match; less specific listeners never see it.
        assert_eq!(winner(&t, "foo.example.com", Method::GET, "/y", &[]), None);
        assert_eq!(
            winner(&t, "bar.example.com", Method::GET, "/y", &[]).as_deref(),
            Some("wild/0")
        );
        assert_eq!(
            winner(&t, "bar.example.org", Method::GET, "/y", &[]).as_deref(),
            Some("any/0")
        );
    }

    #[test]
    fn a_host_owned_by_another_listener_than_the_sni_one_is_misdirected() {
        // The listeners of the spec's misdirected-requests conformance test.
        let mut b = RouteTableBuilder::new();
        let p = |s: &str| HostPattern::parse(Some(s));
        b.add_listener(bind(), "gw/https".into(), HostPattern::Any);
        b.add_listener(bind(), "gw/second".into(), p("second-example.org"));
        b.add_listener(bind(), "gw/wild".into(), p("*.wildcard.org"));
        b.add_listener(bind(), "gw/fourth".into(), p("fourth-example.wildcard.org"));
        let t = b.build();
        let port = t.port(bind()).unwrap();
        let cases = [
            ("example.org", "example.org", false),
            ("example.org", "second-example.org", true),
            ("example.org", "unknown-example.org", false),
            ("second-example.org", "second-example.org", false),
            ("second-example.org", "example.org", true),
            ("second-example.org", "unknown-example.org", true),
            ("third.wildcard.org", "fifth.wildcard.org", false),
            ("third.wildcard.org", "fourth-example.wildcard.org", true),
            ("third.wildcard.org", "second-example.org", true),
            ("fourth-example.wildcard.org", "fifth.wildcard.org", true),
            (
                "Fourth-Example.wildcard.org",
                "fourth-example.wildcard.org",
                false,
            ),
            ("unknown-example.org", "example.org", false),
        ];
        for (sni, host, misdirected) in cases {
            assert_eq!(
                port.misdirected(sni, host),
                misdirected,
                "sni {sni}, host {host}"
            );
        }
    }

    #[test]
    fn a_port_without_certificates_is_cleartext() {
        let mut b = RouteTableBuilder::new();
        b.add_listener(bind(), "gw/http".into(), HostPattern::Any);
        let t = b.build();
        let port = t.port(bind()).unwrap();
        assert!(!port.is_tls());
        assert!(port.certificate_for(Some("a.example")).is_none());
        assert!(port.certificate_for(None).is_none());
    }

    #[test]
    fn unknown_socket_or_host_finds_no_listener() {
        let mut b = RouteTableBuilder::new();
        b.add_listener(
            bind(),
            "gw/only".into(),
            HostPattern::parse(Some("a.example.com")),
        );
        let t = b.build();
        let h = HeaderMap::new();
        assert!(matches!(
            t.lookup(bind(), "b.example.com", &Method::GET, "/", None, &h),
            Lookup::NoListener
        ));
        assert!(matches!(
            t.lookup(
                "127.0.0.1:1".parse().unwrap(),
                "a.example.com",
                &Method::GET,
                "/",
                None,
                &h
            ),
            Lookup::NoListener
        ));
        assert!(matches!(
            t.lookup(bind(), "a.example.com", &Method::GET, "/", None, &h),
            Lookup::NoRoute { .. }
        ));
    }
}
