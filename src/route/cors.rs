//! The HTTPRoute `CORS` filter (GEP-1767), compiled: which origins may read
//! the rule's responses, and the lists the gateway answers preflights with.
//!
//! Origins are matched as the spec says: "`<scheme>://<host>(:<port>)`",
//! with port 80 assumed for `http` and 443 for `https` ("this may affect
//! origin matching"); in the host, "`*` is a greedy match to the _left_,
//! including any number of DNS labels"; "An origin value that includes
//! _only_ the `*` character indicates requests from all `Origin`s are
//! allowed". Scheme and host compare case-insensitively.

use http::HeaderValue;

/// A rule's CORS policy.
#[derive(Debug, Clone)]
pub struct CorsPolicy {
    pub allow_origins: Vec<OriginPattern>,
    pub allow_credentials: bool,
    pub allow_methods: CorsList,
    pub allow_headers: CorsList,
    pub expose_headers: CorsList,
    /// `Access-Control-Max-Age` (seconds; the spec's default is 5).
    pub max_age: HeaderValue,
}

/// `allowMethods`, `allowHeaders` or `exposeHeaders`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsList {
    /// Not configured: the header is not sent.
    Unset,
    /// `["*"]`.
    Wildcard,
    /// The configured names, joined with `", "` as the header value.
    Names(HeaderValue),
}

/// One entry of `allowOrigins`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginPattern {
    /// `*`: every origin.
    Any,
    Origin {
        /// `http` or `https`.
        scheme: String,
        host: OriginHost,
        /// The port, or the scheme's default when the pattern has none.
        port: u16,
    },
}

/// The host part of an origin pattern (lowercase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginHost {
    /// `http://*`: any host.
    Any,
    Exact(String),
    /// `*.example.com`, kept as `.example.com`: any host ending with it
    /// (one or more labels to its left).
    Subdomains(String),
}

impl CorsPolicy {
    /// Does `origin` (the request's `Origin` header) match `allowOrigins`?
    pub fn allows_origin(&self, origin: &str) -> bool {
        self.allow_origins.iter().any(|p| p.matches(origin))
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// Split `scheme://authority` into lowercase scheme, lowercase host and
/// the explicit port text, if any.
fn split_origin(s: &str) -> Option<(String, String, Option<&str>)> {
    let (scheme, authority) = s.split_once("://")?;
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return None;
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        // An IPv6 literal: `[::1]` or `[::1]:8080`.
        let (addr, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{addr}]"), port)
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return None;
    }
    Some((scheme.to_ascii_lowercase(), host.to_ascii_lowercase(), port))
}

fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok().filter(|&p| p > 0)
}

impl OriginPattern {
    /// Parse one `allowOrigins` entry; the error says what is wrong.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "*" {
            return Ok(OriginPattern::Any);
        }
        let (scheme, host, port) = split_origin(s)
            .ok_or_else(|| format!("{s:?} is not `*` or `<scheme>://<host>(:<port>)`"))?;
        let Some(default) = default_port(&scheme) else {
            return Err(format!("{s:?}: the scheme must be http or https"));
        };
        let port = match port {
            None => default,
            Some(p) => parse_port(p)
                .ok_or_else(|| format!("{s:?}: the port must be a number in 1..=65535"))?,
        };
        let label_chars = |h: &str| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
                && !h.starts_with('.')
                && !h.ends_with('.')
                && !h.contains("..")
        };
        let host = if host == "*" {
            OriginHost::Any
        } else if let Some(rest) = host.strip_prefix("*.") {
            if !label_chars(rest) {
                return Err(format!("{s:?}: {host:?} is not a valid wildcard host"));
            }
            OriginHost::Subdomains(format!(".{rest}"))
        } else if label_chars(&host) {
            OriginHost::Exact(host)
        } else {
            return Err(format!(
                "{s:?}: {host:?} is not a host name (a `*` may only be the first label)"
            ));
        };
        Ok(OriginPattern::Origin { scheme, host, port })
    }

    /// Does the request's `Origin` value match this pattern?
    pub fn matches(&self, origin: &str) -> bool {
        let OriginPattern::Origin { scheme, host, port } = self else {
            return true;
        };
        let Some((o_scheme, o_host, o_port)) = split_origin(origin) else {
            return false;
        };
        if &o_scheme != scheme {
            return false;
        }
        let o_port = match o_port {
            None => default_port(&o_scheme),
            Some(p) => parse_port(p),
        };
        if o_port != Some(*port) {
            return false;
        }
        match host {
            OriginHost::Any => true,
            OriginHost::Exact(h) => &o_host == h,
            OriginHost::Subdomains(suffix) => {
                o_host.len() > suffix.len() && o_host.ends_with(suffix.as_str())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> OriginPattern {
        OriginPattern::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn exact_origins_with_default_ports() {
        let foo = p("https://www.foo.com");
        assert!(foo.matches("https://www.foo.com"));
        assert!(
            foo.matches("https://www.foo.com:443"),
            "443 is https's port"
        );
        assert!(foo.matches("HTTPS://WWW.FOO.COM"), "case-insensitive");
        assert!(!foo.matches("http://www.foo.com"), "scheme differs");
        assert!(!foo.matches("https://www.foo.com:8443"));
        assert!(!foo.matches("https://foo.com"));
        assert!(!foo.matches("https://www.foo.com.evil.com"));
        assert!(!foo.matches("null"));
        let with_port = p("http://localhost:8080");
        assert!(with_port.matches("http://localhost:8080"));
        assert!(!with_port.matches("http://localhost"));
        assert!(p("http://a.example:80").matches("http://a.example"));
    }

    #[test]
    fn wildcard_hosts_match_any_labels_to_the_left() {
        let bar = p("https://*.bar.com");
        assert!(bar.matches("https://www.bar.com"));
        assert!(
            bar.matches("https://xpto.www.bar.com"),
            "greedy to the left"
        );
        assert!(!bar.matches("https://bar.com"), "at least one label");
        assert!(!bar.matches("https://foobar.com"));
        assert!(!bar.matches("http://www.bar.com"));
        assert!(!bar.matches("https://www.bar.com:8443"));
        let any_host = p("https://*:8443");
        assert!(any_host.matches("https://anything.example:8443"));
        assert!(!any_host.matches("https://anything.example"));
    }

    #[test]
    fn star_alone_matches_every_origin() {
        let any = p("*");
        for o in [
            "https://foobar.com",
            "https://foobar.com:12345",
            "http://[::1]:3000",
            "null",
        ] {
            assert!(any.matches(o), "{o}");
        }
    }

    #[test]
    fn ipv6_origins_parse() {
        let v6 = p("http://*");
        assert!(v6.matches("http://[::1]"));
        assert!(!v6.matches("http://[::1]:3000"));
    }

    #[test]
    fn invalid_patterns_are_refused() {
        for bad in [
            "",
            "www.foo.com",
            "ftp://foo.com",
            "https://",
            "https://foo.com/path",
            "https://foo.*.com",
            "https://foo.com:0",
            "https://foo.com:99999",
            "https://foo.com:x",
            "https://user@foo.com",
        ] {
            assert!(
                OriginPattern::parse(bad).is_err(),
                "{bad:?} should not parse"
            );
        }
    }
}
