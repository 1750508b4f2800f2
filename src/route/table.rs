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
    candidates: Vec<Candidate>,
}

/// Collects listeners and rules, then sorts everything once in [`build`].
///
/// [`build`]: RouteTableBuilder::build
#[derive(Default)]
pub struct RouteTableBuilder {
    binds: BTreeMap<SocketAddr, Vec<ListenerBuild>>,
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
            candidates: Vec::new(),
        });
        ListenerHandle {
            bind,
            index: listeners.len() - 1,
        }
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

    pub fn build(self) -> RouteTable {
        let binds = self
            .binds
            .into_iter()
            .map(|(bind, listeners)| {
                let mut listeners: Vec<ListenerRoutes> =
                    listeners.into_iter().map(build_listener).collect();
                listeners.sort_by(|a, b| a.hostname.precedence().cmp(&b.hostname.precedence()));
                (bind, PortRoutes { listeners })
            })
            .collect();
        RouteTable { binds }
    }
}

fn build_listener(l: ListenerBuild) -> ListenerRoutes {
    let sorted = |applies: &dyn Fn(&HostPattern) -> bool| -> Candidates {
        let mut v: Vec<(PrecedenceKey, &Candidate)> = l
            .candidates
            .iter()
            .filter(|c| applies(&c.host))
            .map(|c| {
                let mut key = c.key_without_host.clone();
                key.host = c.host.precedence();
                (key, c)
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.into_iter().map(|(_, c)| c.clone()).collect()
    };
    let mut exact = HashMap::new();
    let mut wildcard = HashMap::new();
    for c in &l.candidates {
        match &c.host {
            HostPattern::Exact(h) if !exact.contains_key(h) => {
                let host = h.clone();
                exact.insert(
                    host.clone(),
                    sorted(&|p: &HostPattern| p.matches(&host) || p == &HostPattern::Any),
                );
            }
            HostPattern::Wildcard(suffix) if !wildcard.contains_key(suffix) => {
                let suffix = suffix.clone();
                let list = sorted(&|p: &HostPattern| match p {
                    HostPattern::Any => true,
                    HostPattern::Wildcard(s) => suffix.ends_with(s.as_str()),
                    HostPattern::Exact(_) => false,
                });
                wildcard.insert(suffix, list);
            }
            _ => {}
        }
    }
    let any = sorted(&|p: &HostPattern| p == &HostPattern::Any);
    ListenerRoutes {
        id: l.id,
        hostname: l.hostname,
        exact,
        wildcard,
        any,
    }
}
