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
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, mpsc};

use http::{HeaderMap, Method};
use rustls::sign::CertifiedKey;

use super::Rule;
use super::grpc::GrpcRank;
use super::hostname::HostPattern;
use super::matching::{Mismatch, PathMatch, RequestMatch, first_segment};
use super::stream::{StreamBuild, StreamCandidate, StreamRoutes, TlsMode};
use crate::FastMap;

/// What identifies a route for the precedence tie-breaks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RouteOrder {
    /// `metadata.creationTimestamp` as Unix nanoseconds (older sorts first).
    pub created: i128,
    pub namespace: String,
    pub name: String,
}

/// The sort key that ranks every (rule, match) on a listener, after the
/// route hostname (which depends on the request's host: see
/// [`HostRoutes`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct PrecedenceKey {
    rank: MatchRank,
    route: Arc<RouteOrder>,
    rule_index: usize,
    match_index: usize,
}

/// The part of the precedence each route kind defines itself. HTTPRoute
/// and GRPCRoute rules never compete for one request host (translate
/// accepts only one of two routes of the two kinds whose hostnames
/// intersect on a listener, as the spec says), so the order between the
/// two variants never decides a request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum MatchRank {
    /// HTTPRoute: path kind (Exact, RegularExpression, PathPrefix), longest
    /// path, method present, most headers, most query parameters.
    Http {
        path_kind: u8,
        path_len: Reverse<usize>,
        method: Reverse<bool>,
        headers: Reverse<usize>,
        query: Reverse<usize>,
    },
    /// GRPCRoute: most characters of service, then of method, then most
    /// header matches.
    Grpc {
        method: GrpcRank,
        headers: Reverse<usize>,
    },
}

impl PrecedenceKey {
    fn new(
        m: &RequestMatch,
        route: &Arc<RouteOrder>,
        rule_index: usize,
        match_index: usize,
    ) -> Self {
        let (path_kind, path_len) = match &m.path {
            PathMatch::Exact(p) => (0, p.len()),
            PathMatch::RegularExpression(re) => (1, re.as_str().len()),
            PathMatch::Prefix(p) => (2, p.len()),
            PathMatch::Grpc(g) => {
                return PrecedenceKey {
                    rank: MatchRank::Grpc {
                        method: g.rank(),
                        headers: Reverse(m.headers.len()),
                    },
                    route: route.clone(),
                    rule_index,
                    match_index,
                };
            }
        };
        PrecedenceKey {
            rank: MatchRank::Http {
                path_kind,
                path_len: Reverse(path_len),
                method: Reverse(m.method.is_some()),
                headers: Reverse(m.headers.len()),
                query: Reverse(m.query.len()),
            },
            route: route.clone(),
            rule_index,
            match_index,
        }
    }
}

/// One (rule, match) pair on a listener, as a request tries it.
#[derive(Debug)]
struct Candidate {
    matcher: RequestMatch,
    rule: Arc<Rule>,
    /// The route hostname it is listed under and its precedence among the
    /// others: what [`RouteTable::explain`] says decided between two.
    host: HostPattern,
    key: PrecedenceKey,
}

/// A candidate while the table is built (it carries its route hostname
/// and precedence key).
struct CandidateBuild {
    candidate: Candidate,
    /// Its route's place in the order routes were added in (see
    /// [`RouteSeq`]): compared instead of the route's names.
    route_seq: u32,
}

/// Numbers the routes in the order [`RouteTableBuilder::add_rule`] meets
/// them. Translate adds routes oldest first, which is [`RouteOrder`]'s
/// order: each new route is then greater than the last, and comparing two
/// candidates' numbers is comparing their routes, without the string
/// compares of 10,000 routes' names in the sort of every build. Added out
/// of order (another caller), the numbers are not used.
#[derive(Default)]
struct RouteSeq {
    last: Option<Arc<RouteOrder>>,
    seq: u32,
    in_order: bool,
}

impl RouteSeq {
    /// The number of `route`, the same for routes equal to the last.
    fn of(&mut self, route: &Arc<RouteOrder>) -> u32 {
        match &self.last {
            None => self.in_order = true,
            Some(last) if Arc::ptr_eq(last, route) => return self.seq,
            Some(last) => match (**route).cmp(last) {
                std::cmp::Ordering::Greater => self.seq += 1,
                std::cmp::Ordering::Equal => {}
                std::cmp::Ordering::Less => self.in_order = false,
            },
        }
        self.last = Some(route.clone());
        self.seq
    }
}

/// Host lists shorter than this are scanned in full: cheaper than an
/// index lookup.
const INDEX_MIN_CANDIDATES: usize = 8;

/// The candidates that apply to one request host, in precedence order, and
/// an index of them by the request path's first segment.
///
/// The index never changes the answer, only how many candidates are tried:
/// every candidate whose path match can only accept paths starting with
/// `/<segment>` (Exact, PathPrefix other than `/`, a RegularExpression
/// with a literal first segment) is listed under that segment, every other
/// one in `fallback`. A request tries the candidates of its segment's list
/// and of `fallback` merged in precedence order, and takes the first that
/// matches: the first in the full order that can match at all.
#[derive(Debug)]
struct HostRoutes {
    /// Indexes into the listener's candidates, in precedence order.
    order: Box<[u32]>,
    index: Option<Box<PathIndex>>,
}

struct PathIndex {
    /// Range of `listed` holding the positions (in `order`) of the
    /// candidates under each first segment, ascending.
    by_segment: FastMap<Box<str>, Range<u32>>,
    listed: Box<[u32]>,
    /// Positions (in `order`) of the candidates that may accept any
    /// first segment, ascending.
    fallback: Box<[u32]>,
}

impl HostRoutes {
    fn empty() -> Self {
        HostRoutes {
            order: Box::new([]),
            index: None,
        }
    }

    /// The first candidate, in precedence order, that matches the request.
    fn first_match<'a>(
        &self,
        candidates: &'a [Candidate],
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Option<&'a Candidate> {
        let at = |position: u32| &candidates[self.order[position as usize] as usize];
        let matches = |c: &Candidate| c.matcher.matches(method, path, query, headers);
        let Some(index) = &self.index else {
            return self
                .order
                .iter()
                .map(|&i| &candidates[i as usize])
                .find(|c| matches(c));
        };
        let listed: &[u32] = first_segment(path)
            .and_then(|segment| index.by_segment.get(segment))
            .map_or(&[], |r| &index.listed[r.start as usize..r.end as usize]);
        // Merge the two ascending position lists.
        let (mut a, mut b) = (listed.iter().peekable(), index.fallback.iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&&x), Some(&&y)) if x < y => a.next(),
                (Some(_), Some(_)) | (None, Some(_)) => b.next(),
                (Some(_), None) => a.next(),
                (None, None) => return None,
            };
            let c = at(*next.expect("peeked"));
            if matches(c) {
                return Some(c);
            }
        }
    }

    /// The precedence-ordered list `order` (indexes into `candidates`),
    /// with its index when it is long enough to pay for one.
    fn new(order: Vec<u32>, segments: &[Option<Vec<&str>>]) -> Self {
        let index = (order.len() >= INDEX_MIN_CANDIDATES).then(|| {
            let mut by_segment: FastMap<&str, Vec<u32>> = FastMap::default();
            let mut fallback = Vec::new();
            for (position, &i) in order.iter().enumerate() {
                let position = u32::try_from(position).expect("fewer than 2^32 candidates");
                match &segments[i as usize] {
                    Some(list) => {
                        for segment in list {
                            by_segment.entry(segment).or_default().push(position);
                        }
                    }
                    None => fallback.push(position),
                }
            }
            let mut listed = Vec::new();
            let by_segment = by_segment
                .into_iter()
                .map(|(segment, positions)| {
                    let start = listed.len() as u32;
                    listed.extend(positions);
                    (Box::from(segment), start..listed.len() as u32)
                })
                .collect();
            Box::new(PathIndex {
                by_segment,
                listed: listed.into(),
                fallback: fallback.into(),
            })
        });
        HostRoutes {
            order: order.into(),
            index,
        }
    }
}

/// The routes attached to one Gateway listener.
pub struct ListenerRoutes {
    /// `gateway/<ns>/<name>/listener/<listener name>`.
    pub id: String,
    pub hostname: HostPattern,
    /// The certificate TLS is terminated with: an HTTPS listener, or a TLS
    /// listener in `Terminate` mode; `None` for a cleartext HTTP listener
    /// and a `Passthrough` one.
    pub tls: Option<Arc<CertifiedKey>>,
    /// A TLS listener (protocol `TLS`): its TLSRoutes by SNI. `None` for
    /// HTTP and HTTPS listeners, whose requests are matched below.
    pub stream: Option<StreamRoutes>,
    /// Every (rule, match) attached to the listener, once per route
    /// hostname; the lists below index into it.
    candidates: Box<[Candidate]>,
    exact: FastMap<String, HostRoutes>,
    /// Keyed by the wildcard's suffix (`.example.com`).
    wildcard: FastMap<String, HostRoutes>,
    any: HostRoutes,
}

// Debug with the hash maps in key order: two tables built from the same
// configuration print the same (translate's tests compare them so).
impl fmt::Debug for PathIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PathIndex")
            .field(
                "by_segment",
                &self.by_segment.iter().collect::<BTreeMap<_, _>>(),
            )
            .field("listed", &self.listed)
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl fmt::Debug for ListenerRoutes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListenerRoutes")
            .field("id", &self.id)
            .field("hostname", &self.hostname)
            .field("tls", &self.tls)
            .field("stream", &self.stream)
            .field("candidates", &self.candidates)
            .field("exact", &self.exact.iter().collect::<BTreeMap<_, _>>())
            .field(
                "wildcard",
                &self.wildcard.iter().collect::<BTreeMap<_, _>>(),
            )
            .field("any", &self.any)
            .finish()
    }
}

impl ListenerRoutes {
    /// The candidates for a request host: those of the most specific
    /// route hostname that matches it, and of every less specific one.
    fn host_routes(&self, host: &str) -> &HostRoutes {
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

    /// Does no (rule, match) candidate apply to any hostname?
    pub fn is_empty(&self) -> bool {
        self.candidates.is_empty()
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
    /// Is TLS terminated on this socket for HTTP? (Listeners of different
    /// protocols never share a socket: translate marks them conflicted.)
    pub fn is_tls(&self) -> bool {
        !self.is_stream() && self.listeners.iter().any(|l| l.tls.is_some())
    }

    /// Is this a socket of TLS listeners, whose connections are routed by
    /// SNI to TLSRoutes rather than served as HTTP?
    pub fn is_stream(&self) -> bool {
        self.listeners.iter().any(|l| l.stream.is_some())
    }

    /// The TLS listener that owns `server_name` (normalized) and the
    /// TLSRoute rule its connections reach.
    pub fn stream_route(&self, server_name: &str) -> StreamLookup<'_> {
        let Some(listener) = self
            .listener_for(server_name)
            .filter(|l| l.stream.is_some())
        else {
            return StreamLookup::NoListener;
        };
        match listener.stream.as_ref().and_then(|s| s.route(server_name)) {
            Some(rule) => StreamLookup::Matched { listener, rule },
            None => StreamLookup::NoRoute { listener },
        }
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

/// Where a TLS connection goes, by its SNI.
#[derive(Debug)]
pub enum StreamLookup<'a> {
    /// No TLS listener on this socket owns the name.
    NoListener,
    /// The listener owns the name but no TLSRoute hostname matches it.
    NoRoute { listener: &'a ListenerRoutes },
    Matched {
        listener: &'a ListenerRoutes,
        rule: &'a Arc<Rule>,
    },
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

/// Tables with at least this many candidates are freed on a background
/// thread (see [`RouteTable`]'s `Drop`).
const FREE_IN_BACKGROUND_CANDIDATES: usize = 4096;

type TableContents = BTreeMap<SocketAddr, PortRoutes>;

/// The thread that frees large replaced tables; `None` if it could not be
/// started (tables are then freed where they are dropped).
static TABLE_FREER: LazyLock<Option<Mutex<mpsc::Sender<TableContents>>>> = LazyLock::new(|| {
    let (tx, rx) = mpsc::channel::<TableContents>();
    std::thread::Builder::new()
        .name("sluice-table-free".into())
        .spawn(move || {
            for contents in rx {
                drop(contents);
                *lock(&TABLES_BEING_FREED) -= 1;
                TABLES_FREED.notify_all();
            }
        })
        .ok()
        .map(|_| Mutex::new(tx))
});

/// Tables sent to the freeing thread and not yet freed.
static TABLES_BEING_FREED: Mutex<usize> = Mutex::new(0);
static TABLES_FREED: Condvar = Condvar::new();

/// A poisoned lock here only means a panic elsewhere; the data (a counter,
/// a sender) is still valid.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RouteTable {
    /// Wait until every replaced table handed to the background freeing
    /// thread is freed. A reload calls it (off the async workers) before
    /// building the next table, so that the memory of the table it
    /// replaced last time is free to build the new one in: otherwise the
    /// allocator grows by up to one more table while the two overlap.
    pub fn wait_for_freed_tables() {
        let mut pending = lock(&TABLES_BEING_FREED);
        while *pending > 0 {
            pending = TABLES_FREED
                .wait(pending)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for RouteTable {
    /// A table of 10,000 routes takes tens of milliseconds to free. The
    /// last holder of a replaced table is the reload or a request in
    /// flight on an async worker, and every request on that worker would
    /// wait for the free: a large table's contents go to a thread that
    /// does nothing else.
    fn drop(&mut self) {
        let candidates: usize = self
            .binds
            .values()
            .flat_map(|port| &port.listeners)
            .map(|listener| listener.candidates.len())
            .sum();
        if candidates < FREE_IN_BACKGROUND_CANDIDATES {
            return;
        }
        let Some(freer) = TABLE_FREER.as_ref() else {
            return;
        };
        let contents = std::mem::take(&mut self.binds);
        *lock(&TABLES_BEING_FREED) += 1;
        let sent = lock(freer).send(contents);
        // Sending only fails when the thread is gone: free it here then.
        if let Err(mpsc::SendError(contents)) = sent {
            drop(contents);
            *lock(&TABLES_BEING_FREED) -= 1;
        }
    }
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
        let Some(listener) = self.listener(bind, host) else {
            return Lookup::NoListener;
        };
        match listener.host_routes(host).first_match(
            &listener.candidates,
            method,
            path,
            query,
            headers,
        ) {
            Some(c) => Lookup::Matched(RouteMatch {
                listener,
                rule: &c.rule,
                matched: &c.matcher,
            }),
            None => Lookup::NoRoute { listener },
        }
    }
}

impl RouteTable {
    /// The listener on the socket bound at `bind` that owns `host`
    /// (listener isolation): where [`lookup`](Self::lookup) and
    /// [`explain`](Self::explain) start.
    fn listener(&self, bind: SocketAddr, host: &str) -> Option<&ListenerRoutes> {
        self.binds.get(&bind)?.listener_for(host)
    }

    /// [`lookup`](Self::lookup), explained: every candidate for the
    /// request's host in precedence order, whether it matches (and which
    /// condition it fails), and what ranks it before or after the winner.
    /// The winner is the first candidate that matches, as `lookup` takes it
    /// (`lookup` skips candidates through the path index; the index never
    /// changes the answer, which a test checks against this walk).
    pub fn explain<'a>(
        &'a self,
        bind: SocketAddr,
        host: &str,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Explained<'a> {
        let Some(listener) = self.listener(bind, host) else {
            return Explained {
                listener: None,
                candidates: Vec::new(),
                winner: None,
            };
        };
        let routes = listener.host_routes(host);
        let mut candidates: Vec<ExplainedCandidate<'a>> = routes
            .order
            .iter()
            .map(|&i| {
                let c = &listener.candidates[i as usize];
                ExplainedCandidate {
                    rule: &c.rule,
                    matcher: &c.matcher,
                    hostname: &c.host,
                    created: c.key.route.created,
                    mismatch: c.matcher.mismatch(method, path, query, headers),
                    decided_by: None,
                }
            })
            .collect();
        let winner = candidates.iter().position(|c| c.mismatch.is_none());
        if let Some(w) = winner {
            let won = &listener.candidates[routes.order[w] as usize];
            for (position, explained) in candidates.iter_mut().enumerate() {
                if position != w {
                    let c = &listener.candidates[routes.order[position] as usize];
                    explained.decided_by = Some(criterion(c, won));
                }
            }
        }
        Explained {
            listener: Some(listener),
            candidates,
            winner,
        }
    }
}

/// What [`RouteTable::explain`] found for one request.
#[derive(Debug)]
pub struct Explained<'a> {
    /// The listener that owns the host; `None` when none does (404).
    pub listener: Option<&'a ListenerRoutes>,
    /// Every candidate for the host, in precedence order.
    pub candidates: Vec<ExplainedCandidate<'a>>,
    /// The position of the winner in `candidates`; `None`: 404.
    pub winner: Option<usize>,
}

/// One (rule, match) candidate for a request, explained.
#[derive(Debug)]
pub struct ExplainedCandidate<'a> {
    pub rule: &'a Arc<Rule>,
    pub matcher: &'a RequestMatch,
    /// The route hostname it is listed under.
    pub hostname: &'a HostPattern,
    /// The route's `creationTimestamp` (Unix nanoseconds).
    pub created: i128,
    /// The first condition the request fails; `None` when it matches.
    pub mismatch: Option<Mismatch<'a>>,
    /// The first precedence criterion (spec order) in which it differs
    /// from the winner; `None` for the winner and when nothing matches.
    pub decided_by: Option<Criterion>,
}

/// The precedence criteria, in the spec's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Criterion {
    /// The more specific route hostname (exact before wildcard, longer
    /// first).
    Hostname,
    /// Exact path before any other path match.
    ExactPath,
    /// RegularExpression before PathPrefix (sluice's order; the spec
    /// leaves it to implementations).
    PathKind,
    /// The longer path or prefix.
    PrefixLength,
    /// A method match before none.
    Method,
    /// More header matches.
    HeaderCount,
    /// More query parameter matches.
    QueryCount,
    /// GRPCRoute: more characters of service, then of method.
    GrpcMethod,
    /// The older route (`creationTimestamp`).
    Age,
    /// `namespace/name` alphabetically.
    Name,
    /// Rule order within the route.
    RuleOrder,
    /// Match order within the rule.
    MatchOrder,
}

impl Criterion {
    pub fn as_str(self) -> &'static str {
        match self {
            Criterion::Hostname => "hostname",
            Criterion::ExactPath => "exact path",
            Criterion::PathKind => "path kind",
            Criterion::PrefixLength => "prefix length",
            Criterion::Method => "method",
            Criterion::HeaderCount => "header count",
            Criterion::QueryCount => "query count",
            Criterion::GrpcMethod => "gRPC service and method",
            Criterion::Age => "age",
            Criterion::Name => "name",
            Criterion::RuleOrder => "rule order",
            Criterion::MatchOrder => "match order",
        }
    }
}

/// The first criterion in which `c` and `winner` differ, in the order the
/// table sorts by.
fn criterion(c: &Candidate, winner: &Candidate) -> Criterion {
    if c.host.precedence() != winner.host.precedence() {
        return Criterion::Hostname;
    }
    let (a, b) = (&c.key, &winner.key);
    match (&a.rank, &b.rank) {
        (
            MatchRank::Http {
                path_kind: ka,
                path_len: la,
                method: ma,
                headers: ha,
                query: qa,
            },
            MatchRank::Http {
                path_kind: kb,
                path_len: lb,
                method: mb,
                headers: hb,
                query: qb,
            },
        ) => {
            if ka != kb {
                return if *ka == 0 || *kb == 0 {
                    Criterion::ExactPath
                } else {
                    Criterion::PathKind
                };
            }
            if la != lb {
                return Criterion::PrefixLength;
            }
            if ma != mb {
                return Criterion::Method;
            }
            if ha != hb {
                return Criterion::HeaderCount;
            }
            if qa != qb {
                return Criterion::QueryCount;
            }
        }
        (
            MatchRank::Grpc {
                method: ma,
                headers: ha,
            },
            MatchRank::Grpc {
                method: mb,
                headers: hb,
            },
        ) => {
            if ma != mb {
                return Criterion::GrpcMethod;
            }
            if ha != hb {
                return Criterion::HeaderCount;
            }
        }
        _ => return Criterion::PathKind,
    }
    if a.route.created != b.route.created {
        Criterion::Age
    } else if (&a.route.namespace, &a.route.name) != (&b.route.namespace, &b.route.name) {
        Criterion::Name
    } else if a.rule_index != b.rule_index {
        Criterion::RuleOrder
    } else {
        Criterion::MatchOrder
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
    stream: Option<StreamBuild>,
    candidates: Vec<CandidateBuild>,
}

/// Collects listeners and rules, then sorts everything once in [`build`].
///
/// [`build`]: RouteTableBuilder::build
#[derive(Default)]
pub struct RouteTableBuilder {
    binds: BTreeMap<SocketAddr, Vec<ListenerBuild>>,
    client_validation: BTreeMap<SocketAddr, Arc<ClientValidation>>,
    route_seq: RouteSeq,
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
            stream: None,
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

    /// Make a listener a TLS one (protocol `TLS`): its connections are
    /// routed by SNI to the rules added with [`Self::add_stream_rule`]. In
    /// `Terminate` mode, [`Self::set_listener_tls`] gives its certificate.
    pub fn set_listener_stream(&mut self, listener: ListenerHandle, mode: TlsMode) {
        self.binds
            .get_mut(&listener.bind)
            .expect("handle from this builder")[listener.index]
            .stream = Some(StreamBuild {
            mode,
            candidates: Vec::new(),
        });
    }

    /// Attach a TLSRoute rule to a TLS listener under the route's
    /// hostnames (already intersected with the listener's). Ignored on a
    /// listener that is not a TLS one.
    pub fn add_stream_rule(
        &mut self,
        listener: ListenerHandle,
        hostnames: &[HostPattern],
        route: &RouteOrder,
        rule: Arc<Rule>,
    ) {
        let listener = &mut self
            .binds
            .get_mut(&listener.bind)
            .expect("handle from this builder")[listener.index];
        let Some(stream) = &mut listener.stream else {
            return;
        };
        for host in hostnames {
            stream.candidates.push(StreamCandidate {
                host: host.clone(),
                order: route.clone(),
                rule: rule.clone(),
            });
        }
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
        route: &Arc<RouteOrder>,
        rule: Arc<Rule>,
        matches: Vec<RequestMatch>,
    ) {
        let listener = &mut self
            .binds
            .get_mut(&listener.bind)
            .expect("handle from this builder")[listener.index];
        let matches = if matches.is_empty() {
            vec![RequestMatch::default()]
        } else {
            matches
        };
        let Some((last, others)) = hostnames.split_last() else {
            return;
        };
        let route_seq = self.route_seq.of(route);
        let mut push = |host: &HostPattern, matches: Vec<RequestMatch>| {
            for (match_index, m) in matches.into_iter().enumerate() {
                listener.candidates.push(CandidateBuild {
                    candidate: Candidate {
                        key: PrecedenceKey::new(&m, route, rule.id.index, match_index),
                        matcher: m,
                        rule: rule.clone(),
                        host: host.clone(),
                    },
                    route_seq,
                });
            }
        };
        for host in others {
            push(host, matches.clone());
        }
        push(last, matches);
    }

    pub fn build(mut self) -> RouteTable {
        let in_order = self.route_seq.in_order;
        let binds = self
            .binds
            .into_iter()
            .map(|(bind, listeners)| {
                let mut listeners: Vec<ListenerRoutes> = listeners
                    .into_iter()
                    .map(|l| build_listener(l, in_order))
                    .collect();
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

/// `routes_in_order`: the candidates' [`RouteSeq`] numbers order their
/// routes, so the precedence keys compare by them.
fn build_listener(l: ListenerBuild, routes_in_order: bool) -> ListenerRoutes {
    let count = u32::try_from(l.candidates.len()).expect("fewer than 2^32 candidates");
    // Rank every candidate once by everything but the route hostname; a
    // host's list is then sorted by (hostname precedence, rank): integers.
    let mut by_key: Vec<u32> = (0..count).collect();
    let at = |i: u32| &l.candidates[i as usize];
    if routes_in_order {
        by_key.sort_by(|&a, &b| {
            let (a, b) = (at(a), at(b));
            let (ka, kb) = (&a.candidate.key, &b.candidate.key);
            (&ka.rank, a.route_seq, ka.rule_index, ka.match_index).cmp(&(
                &kb.rank,
                b.route_seq,
                kb.rule_index,
                kb.match_index,
            ))
        });
    } else {
        by_key.sort_by(|&a, &b| at(a).candidate.key.cmp(&at(b).candidate.key));
    }
    let mut rank = vec![0u32; by_key.len()];
    for (r, &i) in by_key.iter().enumerate() {
        rank[i as usize] = r as u32;
    }
    let segments: Vec<Option<Vec<&str>>> = l
        .candidates
        .iter()
        .map(|c| c.candidate.matcher.path.first_segments())
        .collect();

    // Group the candidates by route hostname first, so that each host's
    // list is assembled from the groups that apply to it: linear in the
    // candidates (times the few wildcard groups), not hosts x candidates.
    let mut groups: FastMap<&HostPattern, Vec<u32>> = FastMap::default();
    for (i, c) in l.candidates.iter().enumerate() {
        groups.entry(&c.candidate.host).or_default().push(i as u32);
    }
    let wildcards: Vec<(&HostPattern, &Vec<u32>)> = groups
        .iter()
        .filter(|(p, _)| matches!(p, HostPattern::Wildcard(_)))
        .map(|(p, g)| (*p, g))
        .collect();
    let any_group: &[u32] = groups
        .get(&HostPattern::Any)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let host_routes = |parts: Vec<&[u32]>| -> HostRoutes {
        let mut order: Vec<u32> = parts.into_iter().flatten().copied().collect();
        order.sort_by_key(|&i| {
            (
                l.candidates[i as usize].candidate.host.precedence(),
                rank[i as usize],
            )
        });
        HostRoutes::new(order, &segments)
    };
    let mut exact = FastMap::default();
    let mut wildcard = FastMap::default();
    for (pattern, group) in &groups {
        match pattern {
            HostPattern::Exact(h) => {
                let mut parts: Vec<&[u32]> = vec![group.as_slice(), any_group];
                parts.extend(
                    wildcards
                        .iter()
                        .filter(|(w, _)| w.matches(h))
                        .map(|(_, g)| g.as_slice()),
                );
                exact.insert(h.clone(), host_routes(parts));
            }
            HostPattern::Wildcard(suffix) => {
                let mut parts: Vec<&[u32]> = vec![any_group];
                parts.extend(
                    wildcards
                        .iter()
                        .filter(|(w, _)| match w {
                            HostPattern::Wildcard(s) => suffix.ends_with(s.as_str()),
                            _ => false,
                        })
                        .map(|(_, g)| g.as_slice()),
                );
                wildcard.insert(suffix.clone(), host_routes(parts));
            }
            HostPattern::Any => {}
        }
    }
    let any = if any_group.is_empty() {
        HostRoutes::empty()
    } else {
        host_routes(vec![any_group])
    };
    drop(segments);
    drop(groups);
    ListenerRoutes {
        id: l.id,
        hostname: l.hostname,
        tls: l.tls,
        stream: l.stream.map(StreamBuild::build),
        candidates: l.candidates.into_iter().map(|c| c.candidate).collect(),
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
                kind: Default::default(),
                namespace: "default".into(),
                route: route.into(),
                index,
                name: None,
            },
            filters: vec![],
            backends: BackendSplit::new(vec![]),
            timeouts: Timeouts::default(),
            retry: None,
            session: None,
        })
    }

    fn order(name: &str, created: i128) -> Arc<RouteOrder> {
        Arc::new(RouteOrder {
            created,
            namespace: "default".into(),
            name: name.into(),
        })
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
    fn a_large_table_is_freed_in_the_background_and_a_small_one_at_once() {
        let big = rule("big", 0);
        let small = rule("small", 0);
        let build = |rule: &Arc<Rule>, n: usize| {
            let mut b = RouteTableBuilder::new();
            let l = b.add_listener(bind(), "gw/http".into(), HostPattern::Any);
            let matches = (0..n)
                .map(|i| path(PathMatch::Exact(format!("/{i}"))))
                .collect();
            b.add_rule(
                l,
                &[HostPattern::Any],
                &order("r", 0),
                rule.clone(),
                matches,
            );
            b.build()
        };
        drop(build(&small, 10));
        assert_eq!(Arc::strong_count(&small), 1);
        let table = build(&big, FREE_IN_BACKGROUND_CANDIDATES);
        assert_eq!(Arc::strong_count(&big), FREE_IN_BACKGROUND_CANDIDATES + 1);
        drop(table);
        RouteTable::wait_for_freed_tables();
        assert_eq!(Arc::strong_count(&big), 1, "freed once the wait returns");
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
        // Added oldest first, as translate adds them: the routes are then
        // compared by the order they came in (`RouteSeq`), to the same
        // answers.
        let t = table(vec![
            ("z-oldest", 10, 0, same()),
            ("b-newer", 20, 0, same()),
            ("a-newest", 30, 0, same()),
        ]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/", &[]).as_deref(),
            Some("z-oldest/0")
        );
        let t = table(vec![
            ("a", 10, 1, same()),
            ("a", 10, 0, same()),
            ("b", 10, 0, same()),
        ]);
        assert_eq!(
            winner(&t, "h", Method::GET, "/", &[]).as_deref(),
            Some("a/0")
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

    /// Indexed lookup against the plain precedence order, on random
    /// tables: every candidate whose route hostname matches the host,
    /// ranked by the spec's key (computed here on its own), first match
    /// wins. Segments, hosts and conditions are drawn from small pools so
    /// that candidates collide often.
    mod against_the_precedence_scan {
        use super::*;

        const SEGMENTS: &[&str] = &["", "a", "b", "ab", "api", "API", "v1", "x-y"];
        const HOSTS: &[&str] = &[
            "foo.example.com",
            "bar.example.com",
            "baz.example.com",
            "a.b.example.com",
            "x.com",
            "other.org",
        ];
        const REGEXES: &[&str] = &[
            "/a/[0-9]+",
            "/(a|b)/.*",
            "(?i)/api/.*",
            ".*",
            "/a.*",
            "/ab?/x",
            "/v1",
            "/[ab]/v1",
            "/api(/.*)?",
            "/x-y/.*|/a",
            "/",
            "[/a]+",
            "/a|/b/",
        ];

        fn pick<'a, T>(rng: &mut fastrand::Rng, from: &'a [T]) -> &'a T {
            &from[rng.usize(..from.len())]
        }

        fn random_path(rng: &mut fastrand::Rng) -> String {
            match rng.usize(..12) {
                0 => "/".into(),
                1 => pick(rng, &["", "*", "a/b", "//a", "/a/123", "/b/v1/"]).to_string(),
                _ => {
                    let mut p = String::new();
                    for _ in 0..rng.usize(1..4) {
                        p.push('/');
                        p.push_str(pick::<&str>(rng, SEGMENTS));
                    }
                    if rng.bool() {
                        p.push_str(pick::<&str>(rng, &["/", "/x", "/7", "x"]));
                    }
                    p
                }
            }
        }

        fn random_value(rng: &mut fastrand::Rng) -> ValueMatch {
            if rng.usize(..4) == 0 {
                ValueMatch::regex("[12]").unwrap()
            } else {
                ValueMatch::Exact(pick(rng, &["1", "2"]).to_string())
            }
        }

        fn random_match(rng: &mut fastrand::Rng) -> RequestMatch {
            let path = match rng.usize(..3) {
                0 => PathMatch::Exact(random_path(rng)),
                1 => PathMatch::prefix(&random_path(rng)),
                _ => PathMatch::regex(pick::<&str>(rng, REGEXES)).unwrap(),
            };
            let method = match rng.usize(..4) {
                0 => Some(Method::GET),
                1 => Some(Method::POST),
                _ => None,
            };
            let mut headers = Vec::new();
            for name in ["x-a", "x-b"] {
                if rng.usize(..3) == 0 {
                    headers.push(HeaderMatch {
                        name: HeaderName::from_static(name),
                        value: random_value(rng),
                    });
                }
            }
            let query = if rng.usize(..4) == 0 {
                vec![QueryMatch {
                    name: "q".into(),
                    value: random_value(rng),
                }]
            } else {
                vec![]
            };
            RequestMatch {
                path,
                method,
                headers,
                query,
            }
        }

        struct Entry {
            hostnames: Vec<HostPattern>,
            order: Arc<RouteOrder>,
            rule: Arc<Rule>,
            matches: Vec<RequestMatch>,
        }

        /// The spec's order, spelled out independently of `PrecedenceKey`.
        #[allow(clippy::type_complexity)]
        fn reference(
            entries: &[Entry],
            host: &str,
            method: &Method,
            path: &str,
            query: Option<&str>,
            headers: &HeaderMap,
        ) -> Option<String> {
            let defaults = [RequestMatch::default()];
            let mut ranked = Vec::new();
            for e in entries {
                let matches = if e.matches.is_empty() {
                    &defaults[..]
                } else {
                    &e.matches[..]
                };
                for h in e.hostnames.iter().filter(|h| h.matches(host)) {
                    let (exact_chars, chars) = match h {
                        HostPattern::Exact(x) => (x.len(), x.len()),
                        HostPattern::Wildcard(s) => (0, s.len() + 1),
                        HostPattern::Any => (0, 0),
                    };
                    for (j, m) in matches.iter().enumerate() {
                        let (kind, len) = match &m.path {
                            PathMatch::Exact(p) => (0, p.len()),
                            PathMatch::RegularExpression(r) => (1, r.as_str().len()),
                            PathMatch::Prefix(p) => (2, p.len()),
                            PathMatch::Grpc(_) => unreachable!("only HTTPRoute matches here"),
                        };
                        let key = (
                            (Reverse(exact_chars), Reverse(chars)),
                            (kind, Reverse(len)),
                            Reverse(m.method.is_some()),
                            Reverse(m.headers.len()),
                            Reverse(m.query.len()),
                            (e.order.clone(), e.rule.id.index, j),
                        );
                        ranked.push((key, e, m));
                    }
                }
            }
            ranked.sort_by(|a, b| a.0.cmp(&b.0));
            ranked
                .into_iter()
                .find(|(_, _, m)| m.matches(method, path, query, headers))
                .map(|(_, e, m)| format!("{} {m:?}", e.rule.id))
        }

        #[test]
        fn indexed_lookup_agrees_with_the_full_scan() {
            let patterns = [
                HostPattern::Any,
                HostPattern::parse(Some("foo.example.com")),
                HostPattern::parse(Some("bar.example.com")),
                HostPattern::parse(Some("*.example.com")),
                HostPattern::parse(Some("*.b.example.com")),
                HostPattern::parse(Some("*.com")),
            ];
            let mut rng = fastrand::Rng::with_seed(0x5eed);
            let (mut compared, mut matched, mut indexed) = (0, 0, 0);
            for table_no in 0..300 {
                let routes = 1 + rng.usize(..if table_no % 3 == 0 { 80 } else { 20 });
                let mut entries = Vec::new();
                for r in 0..routes {
                    let name = format!("r{}", rng.usize(..routes));
                    let mut hostnames: Vec<HostPattern> = patterns
                        .iter()
                        .filter(|_| rng.usize(..4) == 0)
                        .cloned()
                        .collect();
                    if hostnames.is_empty() {
                        hostnames.push(pick(&mut rng, &patterns).clone());
                    }
                    let matches = (0..rng.usize(..3))
                        .map(|_| random_match(&mut rng))
                        .collect();
                    entries.push(Entry {
                        hostnames,
                        order: order(&name, rng.i128(0..4)),
                        rule: rule(&name, r),
                        matches,
                    });
                }
                let mut b = RouteTableBuilder::new();
                let l = b.add_listener(bind(), "gw/http".into(), HostPattern::Any);
                for e in &entries {
                    b.add_rule(l, &e.hostnames, &e.order, e.rule.clone(), e.matches.clone());
                }
                let t = b.build();
                let listener = &t.port(bind()).unwrap().listeners[0];
                for _ in 0..200 {
                    let host = *pick(&mut rng, HOSTS);
                    let method = if rng.bool() {
                        Method::GET
                    } else {
                        Method::POST
                    };
                    let path = random_path(&mut rng);
                    let query = match rng.usize(..3) {
                        0 => Some(format!("q={}", pick(&mut rng, &["1", "2", "3"]))),
                        _ => None,
                    };
                    let mut headers = HeaderMap::new();
                    for name in ["x-a", "x-b"] {
                        if rng.bool() {
                            let v = *pick(&mut rng, &["1", "2"]);
                            headers.insert(HeaderName::from_static(name), v.parse().unwrap());
                        }
                    }
                    let want =
                        reference(&entries, host, &method, &path, query.as_deref(), &headers);
                    let got =
                        match t.lookup(bind(), host, &method, &path, query.as_deref(), &headers) {
                            Lookup::Matched(m) => Some(format!("{} {:?}", m.rule.id, m.matched)),
                            _ => None,
                        };
                    assert_eq!(
                        got, want,
                        "table {table_no}, {method} {host}{path} ?{query:?} {headers:?}"
                    );
                    // explain's winner is lookup's, and every candidate it
                    // ranks before the winner fails to match.
                    let explained =
                        t.explain(bind(), host, &method, &path, query.as_deref(), &headers);
                    let explained_winner = explained.winner.map(|w| {
                        let c = &explained.candidates[w];
                        format!("{} {:?}", c.rule.id, c.matcher)
                    });
                    assert_eq!(explained_winner, want, "explain, table {table_no}");
                    let before = explained.winner.unwrap_or(explained.candidates.len());
                    assert!(
                        explained.candidates[..before]
                            .iter()
                            .all(|c| c.mismatch.is_some())
                    );
                    assert!(explained.candidates.iter().enumerate().all(|(i, c)| {
                        c.decided_by.is_some() == (explained.winner.is_some_and(|w| w != i))
                    }));
                    compared += 1;
                    matched += usize::from(got.is_some());
                    indexed += usize::from(listener.host_routes(host).index.is_some());
                }
            }
            // The comparison means something only if both outcomes and both
            // ways of looking up occurred often.
            for (what, n) in [("matched", matched), ("indexed", indexed)] {
                assert!(
                    n > compared / 20 && n < compared * 19 / 20,
                    "{what}: {n} of {compared}"
                );
            }
        }

        #[test]
        fn explain_says_which_criterion_decided() {
            // The seeds' case: a header rule written below a plain rule of
            // the same route wins by header count, not by rule order.
            let t = table(vec![
                ("search", 0, 0, vec![]),
                (
                    "search",
                    0,
                    1,
                    vec![RequestMatch {
                        headers: vec![header("x-canary", "always")],
                        ..RequestMatch::default()
                    }],
                ),
                ("older", -1, 0, vec![path(PathMatch::prefix("/api"))]),
                ("exact", 5, 0, vec![path(PathMatch::Exact("/api".into()))]),
            ]);
            let mut headers = HeaderMap::new();
            headers.insert("x-canary", "always".parse().unwrap());
            let e = t.explain(bind(), "h", &Method::GET, "/", None, &headers);
            let w = e.winner.expect("a rule matches");
            assert_eq!(e.candidates[w].rule.id.route, "search");
            assert_eq!(e.candidates[w].rule.id.index, 1);
            let decided = |route: &str, index: usize| {
                e.candidates
                    .iter()
                    .find(|c| c.rule.id.route == route && c.rule.id.index == index)
                    .and_then(|c| c.decided_by)
            };
            assert_eq!(decided("search", 0), Some(Criterion::HeaderCount));
            assert_eq!(decided("exact", 0), Some(Criterion::ExactPath));
            assert_eq!(decided("older", 0), Some(Criterion::PrefixLength));
            assert_eq!(
                e.candidates
                    .iter()
                    .find(|c| c.rule.id.route == "exact")
                    .and_then(|c| c.mismatch.clone()),
                Some(Mismatch::Path)
            );
            // Without the header the plain rule wins; the header rule
            // ranks before it and fails its header.
            let e = t.explain(bind(), "h", &Method::GET, "/", None, &HeaderMap::new());
            let w = e.winner.expect("a rule matches");
            assert_eq!(e.candidates[w].rule.id.index, 0);
            let header_rule = e
                .candidates
                .iter()
                .find(|c| c.rule.id.route == "search" && c.rule.id.index == 1)
                .expect("listed");
            assert_eq!(
                header_rule.mismatch,
                Some(Mismatch::Header(&HeaderName::from_static("x-canary")))
            );
            // Two equal matches: the older route, then the name, decides.
            let t = table(vec![
                ("b", 1, 0, vec![path(PathMatch::prefix("/x"))]),
                ("a", 1, 0, vec![path(PathMatch::prefix("/x"))]),
                ("c", 0, 0, vec![path(PathMatch::prefix("/x"))]),
            ]);
            let e = t.explain(bind(), "h", &Method::GET, "/x", None, &HeaderMap::new());
            let names: Vec<_> = e
                .candidates
                .iter()
                .map(|c| (c.rule.id.route.as_str(), c.decided_by))
                .collect();
            assert_eq!(
                names,
                vec![
                    ("c", None),
                    ("a", Some(Criterion::Age)),
                    ("b", Some(Criterion::Age))
                ]
            );
            // No listener, no rule: nothing wins.
            let e = t.explain(bind(), "h", &Method::GET, "/y", None, &HeaderMap::new());
            assert_eq!(e.winner, None);
            assert!(e.candidates.iter().all(|c| c.decided_by.is_none()));
        }

        #[test]
        fn first_segments_of_path_matches() {
            let segs = |m: PathMatch| {
                m.first_segments().map(|mut v| {
                    v.sort();
                    v.join(",")
                })
            };
            assert_eq!(segs(PathMatch::Exact("/a/b".into())).as_deref(), Some("a"));
            assert_eq!(segs(PathMatch::Exact("/".into())).as_deref(), Some(""));
            assert_eq!(segs(PathMatch::Exact("a".into())), None);
            assert_eq!(segs(PathMatch::prefix("/abc/")).as_deref(), Some("abc"));
            assert_eq!(segs(PathMatch::prefix("/")), None);
            let re = |p: &str| segs(PathMatch::regex(p).unwrap());
            assert_eq!(re("/r1/[0-9]+").as_deref(), Some("r1"));
            assert_eq!(re("/(a|b)/.*").as_deref(), Some("a,b"));
            assert_eq!(re("/v1").as_deref(), Some("v1"));
            assert_eq!(re("/x-y/.*|/a").as_deref(), Some("a,x-y"));
            // The first segment is not closed by a literal `/`.
            assert_eq!(re("/r1[0-9]*/x"), None);
            assert_eq!(re("/a.*"), None);
            assert_eq!(re(".*"), None);
            assert_eq!(re("[/a]+"), None);
            assert!(re("(?i)/api/.*").is_some_and(|s| s.contains("API") && s.contains("api")));
        }
    }
}
