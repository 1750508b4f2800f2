//! GRPCRoute's method match, compiled: a gRPC call is a request for
//! `/<service>/<method>` (the gRPC over HTTP/2 spec's `:path`), and a
//! GRPCMethodMatch compares each part on its own.
//!
//! Per the spec: "Exact: matches the method or service exactly and with
//! case sensitivity"; "RegularExpression: matches if the method or service
//! matches the given regular expression with case sensitivity" (a whole
//! match here, as for HTTPRoute's regexes); an omitted service or method
//! matches any. A match with neither (no `method` at all) matches every
//! request, as "If no matches are specified, the implementation MUST match
//! every gRPC request".
//!
//! Precedence among GRPCRoute rules is the spec's own (not HTTPRoute's):
//! after the hostname, "Characters in a matching service. Characters in a
//! matching method. Header matches." For a regular expression the
//! characters are its pattern's (the spec is silent; HTTPRoute's regex
//! paths are ranked the same way), and at equal length an Exact value
//! comes before a regular expression.

use std::cmp::Reverse;

use super::matching::ValueMatch;

/// The service and method conditions of one GRPCRoute match.
#[derive(Debug, Clone, Default)]
pub struct GrpcMethodMatch {
    pub service: Option<ValueMatch>,
    pub method: Option<ValueMatch>,
}

impl GrpcMethodMatch {
    /// Does a request for `path` call a matching service and method?
    pub fn matches(&self, path: &str) -> bool {
        if self.service.is_none() && self.method.is_none() {
            return true;
        }
        let Some((service, method)) = split_path(path) else {
            return false;
        };
        self.service
            .as_ref()
            .is_none_or(|s| s.matches(service.as_bytes()))
            && self
                .method
                .as_ref()
                .is_none_or(|m| m.matches(method.as_bytes()))
    }

    /// The first path segment of every request this match accepts: the
    /// service, when it is exact (the route table's index).
    pub(crate) fn first_segments(&self) -> Option<Vec<&str>> {
        match &self.service {
            Some(ValueMatch::Exact(s)) => Some(vec![s.as_str()]),
            _ => None,
        }
    }

    /// The precedence rank after the hostname: more characters of service,
    /// then of method, first (smaller sorts first).
    pub(crate) fn rank(&self) -> GrpcRank {
        fn part(m: &Option<ValueMatch>) -> (Reverse<usize>, bool) {
            match m {
                None => (Reverse(0), false),
                Some(ValueMatch::Exact(v)) => (Reverse(v.len()), false),
                Some(ValueMatch::RegularExpression(re)) => (Reverse(re.as_str().len()), true),
                // gRPC service and method matches are never cookie matches.
                Some(ValueMatch::Cookie(_)) => (Reverse(0), true),
            }
        }
        let (service_chars, service_regex) = part(&self.service);
        let (method_chars, method_regex) = part(&self.method);
        GrpcRank {
            service_chars,
            service_regex,
            method_chars,
            method_regex,
        }
    }
}

/// What ranks one GRPCRoute match before another, after the hostname and
/// before the header count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct GrpcRank {
    service_chars: Reverse<usize>,
    service_regex: bool,
    method_chars: Reverse<usize>,
    method_regex: bool,
}

/// `(service, method)` of a gRPC request path `/<service>/<method>`;
/// `None` for a path of another shape.
pub fn split_path(path: &str) -> Option<(&str, &str)> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    (!service.is_empty() && !method.is_empty() && !method.contains('/'))
        .then_some((service, method))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(s: &str) -> Option<ValueMatch> {
        Some(ValueMatch::Exact(s.into()))
    }

    fn regex(s: &str) -> Option<ValueMatch> {
        Some(ValueMatch::regex(s).expect("valid regex"))
    }

    #[test]
    fn service_and_method_are_matched_apart() {
        let m = GrpcMethodMatch {
            service: exact("grpc.Echo"),
            method: exact("Echo"),
        };
        assert!(m.matches("/grpc.Echo/Echo"));
        assert!(!m.matches("/grpc.Echo/EchoTwo"));
        assert!(!m.matches("/grpc.echo/Echo"), "case sensitive");
        assert!(!m.matches("/grpc.Echo/Echo/x"));
        assert!(!m.matches("/grpc.Echo"));
        let service_only = GrpcMethodMatch {
            service: exact("grpc.Echo"),
            method: None,
        };
        assert!(service_only.matches("/grpc.Echo/Anything"));
        assert!(!service_only.matches("/grpc.EchoX/Echo"));
        let method_only = GrpcMethodMatch {
            service: None,
            method: exact("Echo"),
        };
        assert!(method_only.matches("/any.Service/Echo"));
        assert!(!method_only.matches("/any.Service/EchoTwo"));
    }

    #[test]
    fn regexes_match_whole_parts_and_cannot_reach_across_the_slash() {
        let m = GrpcMethodMatch {
            service: regex(r"grpc\..*"),
            method: regex("Echo(Two)?"),
        };
        assert!(m.matches("/grpc.Echo/Echo"));
        assert!(m.matches("/grpc.x.y/EchoTwo"));
        assert!(!m.matches("/grpc.Echo/EchoThree"));
        assert!(!m.matches("/xgrpc.Echo/Echo"));
        // `.*` in the service cannot eat the method part.
        let greedy = GrpcMethodMatch {
            service: regex(".*"),
            method: exact("Echo"),
        };
        assert!(greedy.matches("/a.B/Echo"));
        assert!(!greedy.matches("/a/b/Echo"));
    }

    #[test]
    fn no_service_nor_method_matches_every_request() {
        let all = GrpcMethodMatch::default();
        assert!(all.matches("/"));
        assert!(all.matches("/a.B/C"));
        assert_eq!(split_path("/a.B/C"), Some(("a.B", "C")));
        assert_eq!(split_path("//C"), None);
        assert_eq!(split_path("a.B/C"), None);
    }

    #[test]
    fn more_service_characters_then_more_method_characters_rank_first() {
        let rank = |service, method| GrpcMethodMatch { service, method }.rank();
        assert!(rank(exact("grpc.Echo"), None) < rank(exact("grpc.Ech"), exact("EchoTwo")));
        assert!(rank(exact("a.B"), exact("Long")) < rank(exact("a.B"), exact("Sh")));
        assert!(rank(exact("a.B"), None) < rank(None, exact("Method")));
        // Equal lengths: exact before regular expression.
        assert!(rank(exact("abc"), None) < rank(regex("a.c"), None));
    }
}
