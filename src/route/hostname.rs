//! Hostnames as the Gateway API uses them: exact names, `*.` wildcards
//! (a suffix match over one or more labels), and "any".
//!
//! Per the spec: "`*.example.com` would match both `test.example.com`, and
//! `foo.test.example.com`, but not `example.com`."

use std::borrow::Cow;
use std::cmp::Reverse;

/// A hostname pattern of a listener or of an HTTPRoute.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostPattern {
    /// No hostname given: matches every host.
    Any,
    /// `*.example.com`, stored as the suffix `.example.com`.
    Wildcard(String),
    Exact(String),
}

impl HostPattern {
    /// Parse a Gateway API hostname (lower-cased; `*.x` is a wildcard).
    pub fn parse(hostname: Option<&str>) -> Self {
        match hostname {
            None | Some("") => HostPattern::Any,
            Some(h) => {
                let h = h.to_ascii_lowercase();
                match h.strip_prefix('*') {
                    Some(suffix) => HostPattern::Wildcard(suffix.to_string()),
                    None => HostPattern::Exact(h),
                }
            }
        }
    }

    /// Does this pattern match a request host (already normalized)?
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Any => true,
            HostPattern::Exact(h) => h == host,
            HostPattern::Wildcard(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
        }
    }

    /// The hostnames both patterns accept, as one pattern, or `None` when
    /// they do not intersect. The more specific pattern wins.
    pub fn intersect(&self, other: &HostPattern) -> Option<HostPattern> {
        use HostPattern::*;
        match (self, other) {
            (Any, p) | (p, Any) => Some(p.clone()),
            (Exact(a), Exact(b)) => (a == b).then(|| self.clone()),
            (Exact(h), w @ Wildcard(_)) | (w @ Wildcard(_), Exact(h)) => {
                w.matches(h).then(|| Exact(h.clone()))
            }
            (Wildcard(a), Wildcard(b)) => {
                if a.ends_with(b.as_str()) {
                    Some(self.clone())
                } else if b.ends_with(a.as_str()) {
                    Some(other.clone())
                } else {
                    None
                }
            }
        }
    }

    /// Rank for "precedence must be given to rules from the HTTPRoute with
    /// the largest number of: characters in a matching non-wildcard
    /// hostname; characters in a matching hostname". Smaller sorts first.
    pub fn precedence(&self) -> (Reverse<usize>, Reverse<usize>) {
        match self {
            HostPattern::Exact(h) => (Reverse(h.len()), Reverse(h.len())),
            HostPattern::Wildcard(s) => (Reverse(0), Reverse(s.len() + 1)),
            HostPattern::Any => (Reverse(0), Reverse(0)),
        }
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPattern::Any => f.write_str("*"),
            HostPattern::Wildcard(s) => write!(f, "*{s}"),
            HostPattern::Exact(h) => f.write_str(h),
        }
    }
}

/// The host a request is for, as hostnames are matched: without the port,
/// lower case, without a trailing dot. Per the spec, "Implementations MUST
/// ignore any port value specified in the HTTP Host header".
///
/// Borrowed when the host is already in that form (the usual case), so
/// that matching a request allocates nothing.
pub fn normalize_host(host: &str) -> Cow<'_, str> {
    // Byte scans (every cut is at an ASCII byte, so at a char boundary):
    // `rfind(':')` and the char-pattern trims cost about 330 instructions
    // per request (docs/performance.md, issue 23 item 2).
    let bytes = host.as_bytes();
    let mut end = if bytes.first() == Some(&b'[') {
        // IPv6 literal: keep up to the closing bracket.
        bytes
            .iter()
            .position(|&b| b == b']')
            .map_or(bytes.len(), |i| i + 1)
    } else {
        // A port: the digits after the last `:` (none is a port too).
        let digits = bytes
            .iter()
            .rev()
            .take_while(|b| b.is_ascii_digit())
            .count();
        match bytes.len() - digits {
            colon if colon > 0 && bytes[colon - 1] == b':' => colon - 1,
            _ => bytes.len(),
        }
    };
    while end > 0 && bytes[end - 1] == b'.' {
        end -= 1;
    }
    let trimmed = &host[..end];
    if trimmed.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(trimmed.to_ascii_lowercase())
    } else {
        Cow::Borrowed(trimmed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> HostPattern {
        HostPattern::parse(Some(s))
    }

    #[test]
    fn wildcard_is_a_suffix_match_over_one_or_more_labels() {
        let w = p("*.example.com");
        assert!(w.matches("test.example.com"));
        assert!(w.matches("foo.test.example.com"));
        assert!(!w.matches("example.com"));
        assert!(!w.matches("test.example.net"));
    }

    #[test]
    fn intersections_follow_the_spec_examples() {
        let listener = p("*.example.com");
        assert_eq!(
            listener.intersect(&p("test.example.com")),
            Some(p("test.example.com"))
        );
        assert_eq!(
            listener.intersect(&p("foo.test.example.com")),
            Some(p("foo.test.example.com"))
        );
        assert_eq!(
            listener.intersect(&p("*.example.com")),
            Some(p("*.example.com"))
        );
        assert_eq!(
            listener.intersect(&p("*.test.example.com")),
            Some(p("*.test.example.com"))
        );
        assert_eq!(listener.intersect(&p("*.com")), Some(p("*.example.com")));
        assert_eq!(listener.intersect(&p("example.com")), None);
        assert_eq!(listener.intersect(&p("test.example.net")), None);
        assert_eq!(HostPattern::Any.intersect(&p("a.b")), Some(p("a.b")));
        assert_eq!(
            p("test.example.com").intersect(&p("test.example.com")),
            Some(p("test.example.com"))
        );
    }

    #[test]
    fn exact_beats_wildcard_and_longer_wildcard_beats_shorter() {
        let mut v = vec![
            HostPattern::Any,
            p("*.com"),
            p("a.example.com"),
            p("*.example.com"),
        ];
        v.sort_by_key(|h| h.precedence());
        assert_eq!(
            v,
            vec![
                p("a.example.com"),
                p("*.example.com"),
                p("*.com"),
                HostPattern::Any
            ]
        );
    }

    #[test]
    fn host_header_is_normalized() {
        // Only digits after the last `:` are a port (none at all too); a
        // bracketed IPv6 literal keeps its brackets; trailing dots go.
        for (host, want) in [
            ("example.com:", "example.com"),
            (":80", ""),
            ("", ""),
            ("80", "80"),
            ("a:b:80", "a:b"),
            ("example.com:80a", "example.com:80a"),
            ("example.com:8.0", "example.com:8.0"),
            ("example.com.:80", "example.com"),
            ("example.com..", "example.com"),
            ("...", ""),
            ("::1", ":"),
            ("[::1]", "[::1]"),
            ("[::1", "[::1"),
            ("[::1]:", "[::1]"),
            ("[FE80::1]:443", "[fe80::1]"),
            ("bücher.example:80", "bücher.example"),
            ("ÄB.example", "Äb.example"),
        ] {
            assert_eq!(normalize_host(host), want, "{host:?}");
        }
        assert_eq!(normalize_host("Example.COM:8080"), "example.com");
        assert_eq!(normalize_host("example.com."), "example.com");
        assert_eq!(normalize_host("[::1]:80"), "[::1]");
        assert_eq!(normalize_host("10.0.0.1"), "10.0.0.1");
        // Already normalized but for the port: borrowed, nothing allocated.
        assert!(matches!(
            normalize_host("example.com:8080"),
            Cow::Borrowed("example.com")
        ));
        assert!(matches!(normalize_host("Example.com"), Cow::Owned(_)));
    }
}
