//! TLS listeners: which TLSRoute rule a TLS connection reaches, chosen by
//! the server name (SNI) of its ClientHello.
//!
//! Per the spec, a TLSRoute's `hostnames` "should match against the SNI
//! attribute of TLS ClientHello message", intersected with the listener's
//! hostname as for HTTPRoute. A connection is routed by the most specific
//! route hostname that matches its SNI (an exact name before any wildcard,
//! a longer wildcard before a shorter one); among routes with the same
//! hostname the oldest route wins, then `namespace/name`, as the spec's
//! tie-breaks for HTTPRoute rules (the spec gives none for TLSRoute).
//! A connection without SNI, or whose SNI no route hostname matches, is
//! refused.

use std::collections::HashMap;
use std::sync::Arc;

use super::Rule;
use super::hostname::HostPattern;
use super::table::RouteOrder;

/// What a TLS listener does with the TLS it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// `tls.mode: Passthrough`: the TLS stream goes to the backend as it
    /// is, ClientHello included; the backend terminates it.
    Passthrough,
    /// `tls.mode: Terminate`: the gateway terminates TLS with the
    /// listener's certificate and relays the decrypted bytes.
    Terminate,
}

/// A TLS listener's routes by SNI.
pub struct StreamRoutes {
    pub mode: TlsMode,
    exact: HashMap<String, Arc<Rule>>,
    /// Keyed by the wildcard's suffix (`.example.com`).
    wildcard: HashMap<String, Arc<Rule>>,
}

// Debug with the maps in key order, as `ListenerRoutes`.
impl std::fmt::Debug for StreamRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::collections::BTreeMap;
        f.debug_struct("StreamRoutes")
            .field("mode", &self.mode)
            .field("exact", &self.exact.iter().collect::<BTreeMap<_, _>>())
            .field(
                "wildcard",
                &self.wildcard.iter().collect::<BTreeMap<_, _>>(),
            )
            .finish()
    }
}

impl StreamRoutes {
    /// The rule for a connection whose SNI is `server_name` (normalized:
    /// lower case, no trailing dot).
    pub fn route(&self, server_name: &str) -> Option<&Arc<Rule>> {
        if let Some(r) = self.exact.get(server_name) {
            return Some(r);
        }
        // Longest wildcard first: try suffixes starting at each dot.
        server_name
            .match_indices('.')
            .filter(|(i, _)| *i > 0)
            .find_map(|(i, _)| self.wildcard.get(&server_name[i..]))
    }

    /// Does no route hostname lead anywhere?
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty()
    }
}

/// A rule on a route hostname, while the table is built.
#[derive(Debug)]
pub(super) struct StreamCandidate {
    pub host: HostPattern,
    pub order: RouteOrder,
    pub rule: Arc<Rule>,
}

/// One TLS listener while the table is built.
#[derive(Debug)]
pub(super) struct StreamBuild {
    pub mode: TlsMode,
    pub candidates: Vec<StreamCandidate>,
}

impl StreamBuild {
    pub fn build(mut self) -> StreamRoutes {
        // The first candidate of each hostname in precedence order wins.
        self.candidates
            .sort_by(|a, b| (&a.order, a.rule.id.index).cmp(&(&b.order, b.rule.id.index)));
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        for c in self.candidates {
            match c.host {
                HostPattern::Exact(h) => {
                    exact.entry(h).or_insert(c.rule);
                }
                HostPattern::Wildcard(suffix) => {
                    wildcard.entry(suffix).or_insert(c.rule);
                }
                // TLSRoutes always name hostnames: an intersection with a
                // listener never widens them to any.
                HostPattern::Any => {}
            }
        }
        StreamRoutes {
            mode: self.mode,
            exact,
            wildcard,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::{BackendSplit, RouteKind, RuleId, Timeouts};

    fn rule(route: &str) -> Arc<Rule> {
        Arc::new(Rule {
            id: RuleId {
                kind: RouteKind::Tls,
                namespace: "ns".into(),
                route: route.into(),
                index: 0,
                name: None,
            },
            filters: Vec::new(),
            backends: BackendSplit::new(Vec::new()),
            timeouts: Timeouts::default(),
            retry: None,
            session: None,
        })
    }

    fn candidate(host: &str, route: &str, created: i128) -> StreamCandidate {
        StreamCandidate {
            host: HostPattern::parse(Some(host)),
            order: RouteOrder {
                created,
                namespace: "ns".into(),
                name: route.into(),
            },
            rule: rule(route),
        }
    }

    fn routes(candidates: Vec<StreamCandidate>) -> StreamRoutes {
        StreamBuild {
            mode: TlsMode::Passthrough,
            candidates,
        }
        .build()
    }

    fn name(r: &StreamRoutes, sni: &str) -> Option<String> {
        r.route(sni).map(|r| r.id.route.clone())
    }

    #[test]
    fn exact_beats_wildcard_and_longer_wildcards_beat_shorter() {
        let r = routes(vec![
            candidate("*.example.com", "wide", 0),
            candidate("*.a.example.com", "narrow", 0),
            candidate("x.a.example.com", "exact", 0),
        ]);
        assert_eq!(name(&r, "x.a.example.com").as_deref(), Some("exact"));
        assert_eq!(name(&r, "y.a.example.com").as_deref(), Some("narrow"));
        assert_eq!(name(&r, "b.example.com").as_deref(), Some("wide"));
        assert_eq!(name(&r, "deep.b.example.com").as_deref(), Some("wide"));
        assert_eq!(name(&r, "example.com"), None);
        assert_eq!(name(&r, "other.org"), None);
    }

    #[test]
    fn the_oldest_route_owns_a_shared_hostname_whatever_the_order() {
        for candidates in [
            vec![candidate("a.b", "newer", 20), candidate("a.b", "older", 10)],
            vec![candidate("a.b", "older", 10), candidate("a.b", "newer", 20)],
        ] {
            assert_eq!(name(&routes(candidates), "a.b").as_deref(), Some("older"));
        }
        let tie = routes(vec![candidate("a.b", "zz", 10), candidate("a.b", "aa", 10)]);
        assert_eq!(name(&tie, "a.b").as_deref(), Some("aa"));
    }
}
