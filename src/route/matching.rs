//! HTTPRouteMatch, compiled: path, headers, query parameters and method.
//!
//! Per the spec, the conditions of one match are ANDed; the entries of a
//! rule's `matches` are ORed (each becomes its own candidate in the table);
//! "If no matches are specified, the default is a prefix path match on '/'".

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use http::{HeaderMap, HeaderName, Method};
use regex_automata::meta;
use regex_automata::nfa::thompson::WhichCaptures;
use regex_syntax::hir::literal::{ExtractKind, Extractor};
use regex_syntax::hir::{Hir, Look};

use super::grpc::GrpcMethodMatch;

/// A path condition.
#[derive(Debug, Clone)]
pub enum PathMatch {
    Exact(String),
    /// Whole path segments: `/foo` matches `/foo`, `/foo/` and `/foo/bar`,
    /// never `/foobar`. Stored without a trailing slash (except `/`).
    Prefix(String),
    /// Anchored at both ends: the whole path must match.
    RegularExpression(AnchoredRegex),
    /// A GRPCRoute match's service and method, compared with the two parts
    /// of a gRPC request path `/<service>/<method>`.
    Grpc(GrpcMethodMatch),
}

impl PathMatch {
    /// A `PathPrefix` match; the trailing slash of the value is ignored.
    pub fn prefix(value: &str) -> Self {
        let trimmed = value.trim_end_matches('/');
        PathMatch::Prefix(if trimmed.is_empty() {
            "/".into()
        } else {
            trimmed.into()
        })
    }

    /// A `RegularExpression` match over the whole path.
    pub fn regex(pattern: &str) -> Result<Self, RegexError> {
        AnchoredRegex::new(pattern).map(PathMatch::RegularExpression)
    }

    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => {
                p == "/"
                    || (path.starts_with(p.as_str())
                        && matches!(path.as_bytes().get(p.len()), None | Some(b'/')))
            }
            PathMatch::RegularExpression(re) => re.is_match(path),
            PathMatch::Grpc(m) => m.matches(path),
        }
    }

    /// The first segments of every path this match accepts (`api` for
    /// `/api/v1`), or `None` when it may accept paths with any first
    /// segment (PathPrefix `/`, a regex without a literal first segment).
    /// The route table indexes candidates by it.
    pub(crate) fn first_segments(&self) -> Option<Vec<&str>> {
        match self {
            PathMatch::Exact(p) => first_segment(p).map(|s| vec![s]),
            // `/a/b` and `/abc` accept only paths whose first segment is
            // `a` or `abc`: the prefix ends at a segment boundary.
            PathMatch::Prefix(p) if p != "/" => first_segment(p).map(|s| vec![s]),
            PathMatch::Prefix(_) => None,
            PathMatch::RegularExpression(re) => {
                let mut segments = Vec::new();
                for literal in re.prefixes()? {
                    let text = std::str::from_utf8(&literal.bytes).ok()?;
                    let rest = text.strip_prefix('/')?;
                    let segment = match rest.find('/') {
                        Some(end) => &rest[..end],
                        // The literal is the whole match: its one segment.
                        None if literal.exact => rest,
                        // `/r1` may go on as `/r12`: the segment is open.
                        None => return None,
                    };
                    if !segments.contains(&segment) {
                        segments.push(segment);
                    }
                }
                Some(segments)
            }
            PathMatch::Grpc(m) => m.first_segments(),
        }
    }
}

/// The first segment of a path (`api` for `/api/v1`, `` for `/`), or
/// `None` for a path that does not start with `/`.
pub(crate) fn first_segment(path: &str) -> Option<&str> {
    let rest = path.strip_prefix('/')?;
    Some(rest.find('/').map_or(rest, |end| &rest[..end]))
}

/// How a header or query parameter value is compared.
#[derive(Debug, Clone)]
pub enum ValueMatch {
    Exact(String),
    /// Anchored at both ends: the whole value must match.
    RegularExpression(AnchoredRegex),
    /// sluice's cookie condition (the `sluice.dev/cookie-matches` route
    /// annotation, docs/migrating-from-ingress-nginx.md): the value of the
    /// request's first cookie of this name, across its `Cookie` headers,
    /// equals the given value exactly. Only on a `cookie` header match.
    Cookie(CookieMatch),
}

/// A cookie condition: the first cookie named `name` (ASCII
/// case-insensitive, as nginx's `$cookie_NAME` finds it) has exactly
/// `value`. A request without that cookie does not match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CookieMatch {
    pub name: String,
    pub value: String,
}

impl CookieMatch {
    /// Does the first cookie of this name across `values` (the request's
    /// `Cookie` header fields, in order) have this value?
    pub fn matches<'a>(&self, values: impl IntoIterator<Item = &'a [u8]>) -> bool {
        values
            .into_iter()
            .find_map(|v| first_cookie(v, self.name.as_bytes()))
            .is_some_and(|v| v == self.value.as_bytes())
    }
}

/// The value of the first cookie named `name` in one `Cookie` field.
///
/// Pairs are separated by `;` (or `,`, which older clients used);
/// spaces may surround the `=`; the value runs to the next `;`. The name
/// is compared without regard to ASCII case. These are the rules nginx's
/// `$cookie_NAME` variable follows, which ingress-nginx's cookie canaries
/// read.
pub fn first_cookie<'v>(field: &'v [u8], name: &[u8]) -> Option<&'v [u8]> {
    let mut rest = field;
    while !rest.is_empty() {
        rest = trim_spaces(rest);
        let pair_end = rest
            .iter()
            .position(|&b| b == b';' || b == b',')
            .unwrap_or(rest.len());
        if rest.len() >= name.len() && rest[..name.len()].eq_ignore_ascii_case(name) {
            let after = trim_spaces(&rest[name.len()..]);
            if let Some(value) = after.strip_prefix(b"=") {
                let value = trim_spaces(value);
                let end = value.iter().position(|&b| b == b';').unwrap_or(value.len());
                return Some(&value[..end]);
            }
        }
        rest = rest.get(pair_end + 1..).unwrap_or_default();
    }
    None
}

fn trim_spaces(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|&c| c != b' ').unwrap_or(b.len());
    &b[start..]
}

impl ValueMatch {
    pub fn regex(pattern: &str) -> Result<Self, RegexError> {
        AnchoredRegex::new(pattern).map(ValueMatch::RegularExpression)
    }

    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            ValueMatch::Exact(v) => v.as_bytes() == value,
            ValueMatch::RegularExpression(re) => {
                std::str::from_utf8(value).is_ok_and(|v| re.is_match(v))
            }
            ValueMatch::Cookie(c) => c.matches([value]),
        }
    }
}

/// A `RegularExpression` match value, compiled to match whole values only
/// (the spec's path, header and query regexes are full matches).
///
/// Built with `regex-automata`'s meta engine directly, with the syntax and
/// limits of the `regex` crate but without its fully compiled DFA: that
/// DFA is built eagerly for every small pattern and made up most of the
/// cost of translating a table with thousands of regexes (and tens of KiB
/// of memory each). Searches use the lazy DFA, built as paths are seen.
///
/// Compiled once per pattern for the whole process: a clone shares the
/// compiled form, and compiling a pattern that a live table already holds
/// (every reload recompiles every route) returns that table's regex. Reloads
/// then cost no regex compilation, old and new tables share the memory,
/// and the lazy DFA's cache stays warm across reloads.
#[derive(Clone)]
pub struct AnchoredRegex(Arc<Compiled>);

struct Compiled {
    regex: meta::Regex,
    /// The pattern as the route gave it (without the anchors).
    source: Box<str>,
    /// Every path this pattern matches starts with one of these literals
    /// (`None` when no finite set of literal prefixes is known).
    prefixes: Option<Box<[PrefixLiteral]>>,
}

/// The regexes some table still holds, by pattern. Entries whose regex was
/// dropped are swept whenever the map has doubled since the last sweep.
struct RegexCache {
    live: HashMap<Box<str>, Weak<Compiled>>,
    sweep_at: usize,
}

static REGEX_CACHE: LazyLock<Mutex<RegexCache>> = LazyLock::new(|| {
    Mutex::new(RegexCache {
        live: HashMap::new(),
        sweep_at: 1024,
    })
});

/// A literal that starts every match of a regex; `exact` when it is the
/// whole match.
#[derive(Debug, Clone)]
pub(crate) struct PrefixLiteral {
    pub bytes: Box<[u8]>,
    pub exact: bool,
}

/// Why a `RegularExpression` value does not compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegexError(String);

impl std::fmt::Display for RegexError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RegexError {}

/// The `regex` crate's limits: compiled program size and lazy DFA cache.
const NFA_SIZE_LIMIT: usize = 10 << 20;
const LAZY_DFA_CACHE_CAPACITY: usize = 2 << 20;
/// More literal prefixes than this are not worth indexing.
const MAX_PREFIX_LITERALS: usize = 16;

impl AnchoredRegex {
    /// Compile `pattern` (the `regex` crate's syntax, Unicode on) to match
    /// whole values. The pattern is parsed on its own and anchored as a
    /// syntax tree, so a pattern such as `a)|(b` cannot escape the anchors.
    pub fn new(pattern: &str) -> Result<Self, RegexError> {
        // A poisoned lock only means another thread panicked mid-insert:
        // the map itself is still a valid cache.
        let mut cache = REGEX_CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(compiled) = cache.live.get(pattern).and_then(Weak::upgrade) {
            return Ok(AnchoredRegex(compiled));
        }
        let compiled = Arc::new(Self::compile(pattern)?);
        if cache.live.len() >= cache.sweep_at {
            cache.live.retain(|_, w| w.strong_count() > 0);
            cache.sweep_at = (2 * cache.live.len()).max(1024);
        }
        cache.live.insert(pattern.into(), Arc::downgrade(&compiled));
        Ok(AnchoredRegex(compiled))
    }

    fn compile(pattern: &str) -> Result<Compiled, RegexError> {
        let hir = regex_syntax::ParserBuilder::new()
            .build()
            .parse(pattern)
            .map_err(|e| RegexError(e.to_string()))?;
        let prefixes = prefix_literals(&hir);
        let anchored = Hir::concat(vec![Hir::look(Look::Start), hir, Hir::look(Look::End)]);
        let config = meta::Config::new()
            .match_kind(regex_automata::MatchKind::LeftmostFirst)
            .utf8_empty(true)
            .nfa_size_limit(Some(NFA_SIZE_LIMIT))
            .hybrid_cache_capacity(LAZY_DFA_CACHE_CAPACITY)
            .which_captures(WhichCaptures::None)
            .dfa(false)
            .onepass(false);
        let regex = meta::Builder::new()
            .configure(config)
            .build_from_hir(&anchored)
            .map_err(|e| match e.size_limit() {
                Some(limit) => RegexError(format!(
                    "the compiled expression exceeds the size limit of {limit} bytes"
                )),
                None => RegexError(e.to_string()),
            })?;
        Ok(Compiled {
            regex,
            source: pattern.into(),
            prefixes,
        })
    }

    /// The pattern as the route gave it.
    pub fn as_str(&self) -> &str {
        &self.0.source
    }

    /// Does the whole of `value` match?
    pub fn is_match(&self, value: &str) -> bool {
        self.0.regex.is_match(value)
    }

    pub(crate) fn prefixes(&self) -> Option<&[PrefixLiteral]> {
        self.0.prefixes.as_deref()
    }
}

impl std::fmt::Debug for AnchoredRegex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AnchoredRegex")
            .field(&self.0.source)
            .finish()
    }
}

/// The literals every match of `hir` starts with, when they are few.
fn prefix_literals(hir: &Hir) -> Option<Box<[PrefixLiteral]>> {
    let seq = Extractor::new().kind(ExtractKind::Prefix).extract(hir);
    let literals = seq.literals()?;
    if literals.is_empty() || literals.len() > MAX_PREFIX_LITERALS {
        return None;
    }
    Some(
        literals
            .iter()
            .map(|l| PrefixLiteral {
                bytes: l.as_bytes().into(),
                exact: l.is_exact(),
            })
            .collect(),
    )
}

/// A header condition. Header names are case-insensitive (`HeaderName` is
/// always lower case); a request carrying the header several times matches
/// when any of its values does.
#[derive(Debug, Clone)]
pub struct HeaderMatch {
    pub name: HeaderName,
    pub value: ValueMatch,
}

impl HeaderMatch {
    /// Does the request's header map satisfy this condition? A cookie
    /// condition reads the first cookie of its name across all the fields;
    /// any other condition holds when any one value matches.
    pub fn matches(&self, headers: &HeaderMap) -> bool {
        let values = headers.get_all(&self.name);
        match &self.value {
            ValueMatch::Cookie(c) => c.matches(values.iter().map(|v| v.as_bytes())),
            value => values.iter().any(|v| value.matches(v.as_bytes())),
        }
    }
}

/// A query parameter condition. Names are case-sensitive; values are
/// compared after percent-decoding; the first occurrence counts.
#[derive(Debug, Clone)]
pub struct QueryMatch {
    pub name: String,
    pub value: ValueMatch,
}

/// One entry of a rule's `matches`, all conditions ANDed.
#[derive(Debug, Clone)]
pub struct RequestMatch {
    pub path: PathMatch,
    pub method: Option<Method>,
    pub headers: Vec<HeaderMatch>,
    pub query: Vec<QueryMatch>,
}

impl Default for RequestMatch {
    /// The spec's default: a prefix match on `/`.
    fn default() -> Self {
        RequestMatch {
            path: PathMatch::prefix("/"),
            method: None,
            headers: Vec::new(),
            query: Vec::new(),
        }
    }
}

/// The first condition of a match a request fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch<'a> {
    Method,
    Path,
    /// The header of this name is missing or has no matching value.
    Header(&'a HeaderName),
    /// The query parameter of this name is missing or does not match.
    Query(&'a str),
}

impl RequestMatch {
    /// Does a request with this method, path, query and headers match?
    pub fn matches(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> bool {
        self.mismatch(method, path, query, headers).is_none()
    }

    /// The first condition the request fails (method, path, headers, then
    /// query parameters), `None` when it matches: what
    /// [`matches`](Self::matches) decides with.
    #[inline]
    pub fn mismatch(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Option<Mismatch<'_>> {
        if self.method.as_ref().is_some_and(|m| m != method) {
            return Some(Mismatch::Method);
        }
        if !self.path.matches(path) {
            return Some(Mismatch::Path);
        }
        if let Some(h) = self.headers.iter().find(|h| !h.matches(headers)) {
            return Some(Mismatch::Header(&h.name));
        }
        self.query
            .iter()
            .find(|q| {
                !query
                    .and_then(|qs| {
                        form_urlencoded::parse(qs.as_bytes())
                            .find(|(k, _)| k == q.name.as_str())
                            .map(|(_, v)| q.value.matches(v.as_bytes()))
                    })
                    .unwrap_or(false)
            })
            .map(|q| Mismatch::Query(q.name.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn prefix_matches_whole_segments_only() {
        let m = PathMatch::prefix("/foo");
        for ok in ["/foo", "/foo/", "/foo/bar"] {
            assert!(m.matches(ok), "{ok}");
        }
        assert!(!m.matches("/foobar"));
        assert!(!m.matches("/fo"));
        let with_slash = PathMatch::prefix("/foo/");
        assert!(with_slash.matches("/foo"));
        assert!(with_slash.matches("/foo/bar"));
        assert!(!with_slash.matches("/foobar"));
        assert!(PathMatch::prefix("/").matches("/anything"));
    }

    #[test]
    fn exact_and_regex_paths_match_the_whole_path() {
        assert!(PathMatch::Exact("/a".into()).matches("/a"));
        assert!(!PathMatch::Exact("/a".into()).matches("/a/"));
        let re = PathMatch::regex("/v[0-9]+/.*").unwrap();
        assert!(re.matches("/v2/users"));
        assert!(!re.matches("/api/v2/users"));
    }

    #[test]
    fn a_regex_cannot_escape_its_anchors() {
        // Wrapped as text (`^(?:a)|(b)$`) this pattern would compile into
        // two unanchored halves; parsed on its own it is unbalanced.
        assert!(PathMatch::regex("a)|(b").is_err());
        let re = PathMatch::regex("/a|/b").unwrap();
        assert!(re.matches("/a") && re.matches("/b"));
        assert!(!re.matches("/a/x") && !re.matches("/x/b"));
        assert!(
            PathMatch::regex("/a(")
                .unwrap_err()
                .to_string()
                .contains("unclosed")
        );
        let v = ValueMatch::regex("v[0-9]+").unwrap();
        assert!(v.matches(b"v12") && !v.matches(b"xv12") && !v.matches(b"v1\xff"));
    }

    #[test]
    fn one_compiled_regex_per_live_pattern() {
        let a = AnchoredRegex::new("/cache-test/[0-9]+").unwrap();
        let b = AnchoredRegex::new("/cache-test/[0-9]+").unwrap();
        assert!(
            Arc::ptr_eq(&a.0, &b.0),
            "a live pattern is not compiled twice"
        );
        let c = AnchoredRegex::new("/cache-test/[a-z]+").unwrap();
        assert!(!Arc::ptr_eq(&a.0, &c.0));
        assert!(b.is_match("/cache-test/12") && !c.is_match("/cache-test/12"));
        let weak = Arc::downgrade(&a.0);
        drop((a, b));
        assert!(
            weak.upgrade().is_none(),
            "the cache does not keep regexes alive"
        );
        let again = AnchoredRegex::new("/cache-test/[0-9]+").unwrap();
        assert!(again.is_match("/cache-test/7"));
    }

    #[test]
    fn conditions_are_anded_and_header_names_are_case_insensitive() {
        let m = RequestMatch {
            path: PathMatch::prefix("/"),
            method: Some(Method::POST),
            headers: vec![
                HeaderMatch {
                    name: HeaderName::from_static("x-canary"),
                    value: ValueMatch::Exact("yes".into()),
                },
                HeaderMatch {
                    name: HeaderName::from_static("x-ver"),
                    value: ValueMatch::regex("v[12]").unwrap(),
                },
            ],
            query: vec![QueryMatch {
                name: "debug".into(),
                value: ValueMatch::Exact("a b".into()),
            }],
        };
        let h = headers(&[("X-Canary", "yes"), ("X-VER", "v2")]);
        assert!(m.matches(&Method::POST, "/x", Some("debug=a%20b"), &h));
        assert!(!m.matches(&Method::GET, "/x", Some("debug=a%20b"), &h));
        assert!(!m.matches(&Method::POST, "/x", Some("debug=ab"), &h));
        assert!(!m.matches(&Method::POST, "/x", None, &h));
        assert!(!m.matches(
            &Method::POST,
            "/x",
            Some("debug=a%20b"),
            &headers(&[("x-canary", "yes"), ("x-ver", "v3")])
        ));
        // Query parameter names are case-sensitive.
        assert!(!m.matches(&Method::POST, "/x", Some("DEBUG=a%20b"), &h));
    }

    #[test]
    fn a_cookie_condition_reads_the_first_cookie_of_its_name() {
        let m = HeaderMatch {
            name: HeaderName::from_static("cookie"),
            value: ValueMatch::Cookie(CookieMatch {
                name: "canary".into(),
                value: "always".into(),
            }),
        };
        let cases: &[(&[&str], bool)] = &[
            (&["canary=always"], true),
            (&["a=1; canary=always; b=2"], true),
            (&["a=1;canary = always"], true),
            (&["CANARY=always"], true),
            (&["canary=Always"], false),
            (&["canary=always "], false),
            (&["canaryx=always"], false),
            (&["xcanary=always"], false),
            (&["a=canary=always"], false),
            // The first cookie of the name decides, across fields too.
            (&["canary=never; canary=always"], false),
            (&["a=1", "canary=always"], true),
            (&["canary=never", "canary=always"], false),
            (&["other=1"], false),
            (&[], false),
        ];
        for (fields, want) in cases {
            let pairs: Vec<(&str, &str)> = fields.iter().map(|f| ("cookie", *f)).collect();
            assert_eq!(m.matches(&headers(&pairs)), *want, "{fields:?}");
        }
        assert_eq!(first_cookie(b"a=1; b=", b"b"), Some(&b""[..]));
    }

    #[test]
    fn repeated_header_matches_when_any_value_does() {
        let m = RequestMatch {
            headers: vec![HeaderMatch {
                name: HeaderName::from_static("x-env"),
                value: ValueMatch::Exact("canary".into()),
            }],
            ..RequestMatch::default()
        };
        assert!(m.matches(
            &Method::GET,
            "/",
            None,
            &headers(&[("x-env", "prod"), ("x-env", "canary")])
        ));
    }
}
