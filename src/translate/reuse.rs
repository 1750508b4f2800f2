//! Reusing compiled routes across translations: a change to one route
//! compiles that route, not the 10,000 others.
//!
//! Compiling a route (its matches, filters, backends and their endpoints,
//! shares) is a pure function of the route's kind, namespace, name and
//! `spec`, and of a few inputs shared by every route: the Services,
//! EndpointSlices and ReferenceGrants, the weights the manifests omitted,
//! the shares rollouts serve, and the BackendTLSPolicies (with the
//! Gateways' client certificates, Secrets and ConfigMaps they read, and
//! the Gateways the route attaches to). [`CompiledRoutes`] keeps each
//! route's compiled form with the snapshot it came from; the next
//! translation takes it for every route whose `spec` is equal, as long as
//! the shared inputs are all equal. Anything else compiles afresh, so the
//! table and status are the ones a full translation gives
//! (`reusing_gives_what_a_full_translation_gives` below).
//!
//! BackendTLSPolicies: while there are any, nothing is reused. Compiling
//! against them also records which Gateways use each policy (their
//! status), and a route's TLS settings depend on the Gateways it attaches
//! to; reusing would have to replay that. Not done yet: with policies, a
//! change compiles every route, as before.

use std::collections::HashMap;
use std::sync::Arc;

use crate::resources::Snapshot;
use crate::rollout::ServedShares;
use crate::route::RouteKind;

use super::routes::CompiledRoute;

/// (kind, namespace, name) of a route.
type RouteKey = (RouteKind, String, String);

/// Compiled routes by route: the index of each in its kind's list of the
/// snapshot they were compiled from, and its compiled form.
type ByRoute = HashMap<RouteKey, (usize, Arc<CompiledRoute>)>;

/// The compiled routes of the last translation, for the next one.
#[derive(Default)]
pub struct CompiledRoutes {
    /// The snapshot and served shares they were compiled from.
    inputs: Option<(Arc<Snapshot>, ServedShares)>,
    /// By route: its index in its kind's list of `inputs`' snapshot, and
    /// its compiled form.
    routes: ByRoute,
    /// How many routes the last translation compiled, and reused.
    counts: (usize, usize),
}

impl std::fmt::Debug for CompiledRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledRoutes")
            .field("routes", &self.routes.len())
            .field("compiled_reused", &self.counts)
            .finish()
    }
}

impl CompiledRoutes {
    pub fn new() -> Self {
        Self::default()
    }

    /// (compiled, reused) routes at the last translation.
    pub fn last_counts(&self) -> (usize, usize) {
        self.counts
    }
}

/// One translation's view of [`CompiledRoutes`]: what it may reuse, and
/// what it compiled, for the next.
pub(super) struct Reuse<'c> {
    /// The previous snapshot and its routes, when the shared inputs are
    /// unchanged.
    previous: Option<(&'c Snapshot, &'c ByRoute)>,
    /// What this translation compiled, for the next; `None` when nothing
    /// is kept (a full translation).
    next: Option<ByRoute>,
    compiled: usize,
    reused: usize,
}

impl<'c> Reuse<'c> {
    /// Nothing to reuse, nothing kept: a full translation.
    pub fn none() -> Reuse<'static> {
        Reuse {
            previous: None,
            next: None,
            compiled: 0,
            reused: 0,
        }
    }

    /// What `cache` offers a translation of `snapshot` with `served`.
    pub fn of(cache: &'c CompiledRoutes, snapshot: &Snapshot, served: &ServedShares) -> Self {
        let previous = cache.inputs.as_ref().and_then(|(prev, prev_served)| {
            shared_inputs_equal(prev, snapshot, prev_served, served)
                .then_some((&**prev, &cache.routes))
        });
        Reuse {
            previous,
            next: Some(HashMap::with_capacity(cache.routes.len())),
            compiled: 0,
            reused: 0,
        }
    }

    /// The compiled form of route number `index` of its kind in
    /// `snapshot`: the previous one when its spec is unchanged, else
    /// `compile()`.
    pub fn route(
        &mut self,
        snapshot: &Snapshot,
        kind: RouteKind,
        namespace: &str,
        name: &str,
        index: usize,
        compile: impl FnOnce() -> CompiledRoute,
    ) -> Arc<CompiledRoute> {
        let Some(next) = &mut self.next else {
            // A full translation: nothing to look up, nothing to keep.
            self.compiled += 1;
            return Arc::new(compile());
        };
        let key = (kind, namespace.to_string(), name.to_string());
        let kept = self.previous.and_then(|(prev, routes)| {
            let (old, compiled) = routes.get(&key)?;
            same_spec(kind, prev, *old, snapshot, index).then(|| compiled.clone())
        });
        let compiled = match kept {
            Some(c) => {
                self.reused += 1;
                c
            }
            None => {
                self.compiled += 1;
                Arc::new(compile())
            }
        };
        next.insert(key, (index, compiled.clone()));
        compiled
    }

    /// Keep what this translation compiled (of `snapshot`, with `served`)
    /// in `cache`, for the next.
    pub fn keep(self, cache: &mut CompiledRoutes, snapshot: Arc<Snapshot>, served: &ServedShares) {
        cache.inputs = Some((snapshot, served.clone()));
        cache.routes = self.next.unwrap_or_default();
        cache.counts = (self.compiled, self.reused);
    }
}

/// Whether everything a route's compiled form depends on, other than the
/// route itself, is equal in both snapshots (and no BackendTLSPolicy is
/// involved: see the module docs).
fn shared_inputs_equal(
    a: &Snapshot,
    b: &Snapshot,
    a_served: &ServedShares,
    b_served: &ServedShares,
) -> bool {
    a.backend_tls_policies.is_empty()
        && b.backend_tls_policies.is_empty()
        && a_served == b_served
        && a.services == b.services
        && a.endpoint_slices == b.endpoint_slices
        && a.reference_grants == b.reference_grants
        && a.omitted_weights == b.omitted_weights
}

fn cookie_matches(route: &gateway_api::experimental::httproutes::HttpRoute) -> Option<&String> {
    route
        .metadata
        .annotations
        .as_ref()?
        .get(super::routes::COOKIE_MATCHES_ANNOTATION)
}

/// Whether route `i` of `kind` in `a` has the same spec as route `j` in `b`.
fn same_spec(kind: RouteKind, a: &Snapshot, i: usize, b: &Snapshot, j: usize) -> bool {
    match kind {
        // An HTTPRoute's cookie-match annotation is compiled with its spec.
        RouteKind::Http => match (a.http_routes.get(i), b.http_routes.get(j)) {
            (Some(x), Some(y)) => x.spec == y.spec && cookie_matches(x) == cookie_matches(y),
            _ => false,
        },
        RouteKind::Grpc => match (a.grpc_routes.get(i), b.grpc_routes.get(j)) {
            (Some(x), Some(y)) => x.spec == y.spec,
            _ => false,
        },
        RouteKind::Tls => match (a.tls_routes.get(i), b.tls_routes.get(j)) {
            (Some(x), Some(y)) => x.spec == y.spec,
            _ => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    use k8s_openapi::jiff::Timestamp;

    use super::CompiledRoutes;
    use crate::resources::Snapshot;
    use crate::rollout::ServedShares;
    use crate::translate::testing::{CLASS, snapshot};
    use crate::translate::{Routing, TranslateOptions, translate_phased, translate_reusing};

    const GATEWAY: &str = "---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: sluice
  listeners:
  - {name: http, port: 8080, protocol: HTTP, hostname: '*.example.com', allowedRoutes: {namespaces: {from: All}}}
";

    const API: &str = "---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: api-1, namespace: shop, labels: {kubernetes.io/service-name: api}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.0.0.2]}]
";

    const GRANT: &str = "---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: g, namespace: shop}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}]
  to: [{group: '', kind: Service}]
";

    /// HTTPRoute `name` on `name.example.com`: `web` and `shop/api` with
    /// weights `w` and `100 - w`.
    fn route(name: &str, w: u32) -> String {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: [{name}.example.com]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /{name}}}}}]
    backendRefs:
    - {{name: web, port: 80, weight: {w}}}
    - {{name: api, namespace: shop, port: 80, weight: {}}}
",
            100 - w
        )
    }

    fn grpc_route(name: &str) -> String {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: {name}}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: [{name}.example.com]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
"
        )
    }

    /// The table (canonical Debug: maps in key order), status, rule
    /// summaries and warnings of a translation.
    fn parts(status: crate::translate::StatusReport, routing: Routing) -> String {
        format!(
            "{:#?}\n{:#?}\n{:#?}\n{:#?}\n{:#?}",
            routing.table, status.objects, status.listener_binds, routing.rules, routing.warnings
        )
    }

    #[test]
    fn reusing_gives_what_a_full_translation_gives() {
        let routes =
            |ws: &[(&str, u32)]| -> String { ws.iter().map(|(n, w)| route(n, *w)).collect() };
        let base = format!("{CLASS}{API}{GRANT}");
        let gateway = GATEWAY.to_string();
        let other_listener = GATEWAY.replace("'*.example.com'", "'*.example.org'");
        let some = routes(&[("a", 10), ("b", 20), ("c", 30)]);
        // (what changed, the configuration, whether anything is reused)
        let steps: Vec<(&str, String, bool)> = vec![
            (
                "first",
                format!("{base}{gateway}{some}{}", grpc_route("g")),
                false,
            ),
            (
                "route added",
                format!("{base}{gateway}{some}{}{}", grpc_route("g"), route("d", 40)),
                true,
            ),
            (
                "weight changed",
                format!(
                    "{base}{gateway}{}{}{}",
                    routes(&[("a", 10), ("b", 90), ("c", 30)]),
                    grpc_route("g"),
                    route("d", 40)
                ),
                true,
            ),
            (
                "nothing changed",
                format!(
                    "{base}{gateway}{}{}{}",
                    routes(&[("a", 10), ("b", 90), ("c", 30)]),
                    grpc_route("g"),
                    route("d", 40)
                ),
                true,
            ),
            (
                "backend Service removed",
                format!("{CLASS}{GRANT}{gateway}{some}{}", grpc_route("g")),
                false,
            ),
            (
                "backend Service back",
                format!("{base}{gateway}{some}{}", grpc_route("g")),
                false,
            ),
            (
                "ReferenceGrant removed",
                format!("{CLASS}{API}{gateway}{some}{}", grpc_route("g")),
                false,
            ),
            (
                "ReferenceGrant back",
                format!("{base}{gateway}{some}{}", grpc_route("g")),
                false,
            ),
            (
                "listener changed",
                format!("{base}{other_listener}{some}{}", grpc_route("g")),
                true,
            ),
            (
                "listener back",
                format!("{base}{gateway}{some}{}", grpc_route("g")),
                true,
            ),
            (
                "route deleted",
                format!(
                    "{base}{gateway}{}{}",
                    routes(&[("a", 10), ("c", 30)]),
                    grpc_route("g")
                ),
                true,
            ),
            (
                "GRPCRoute deleted",
                format!("{base}{gateway}{}", routes(&[("a", 10), ("c", 30)])),
                true,
            ),
        ];
        let options = TranslateOptions {
            default_bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        let served = ServedShares::default();
        let now = Timestamp::UNIX_EPOCH;
        let mut compiled = CompiledRoutes::new();
        for (what, yaml, reuses) in steps {
            let snap: Arc<Snapshot> = Arc::new(snapshot(&yaml));
            let mut full = None;
            let full_status = translate_phased(&snap, &options, &served, now, |r| full = Some(r));
            let mut reused = None;
            let reused_status =
                translate_reusing(&snap, &options, &served, now, &mut compiled, |r| {
                    reused = Some(r)
                });
            let (full, reused) = (
                parts(full_status, full.expect("routing handed over")),
                parts(reused_status, reused.expect("routing handed over")),
            );
            assert!(
                full == reused,
                "{what}: reusing differs from a full translation:\nfull:\n{full}\nreusing:\n{reused}"
            );
            let (fresh, kept) = compiled.last_counts();
            assert_eq!(kept > 0, reuses, "{what}: {fresh} compiled, {kept} reused");
        }
    }

    #[test]
    fn only_the_changed_route_is_compiled_again() {
        let yaml = |w: u32| {
            format!(
                "{CLASS}{API}{GRANT}{GATEWAY}{}{}{}",
                route("a", 10),
                route("b", w),
                route("c", 30)
            )
        };
        let options = TranslateOptions {
            default_bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        let served = ServedShares::default();
        let mut compiled = CompiledRoutes::new();
        for (w, counts) in [(20, (3, 0)), (90, (1, 2)), (90, (0, 3))] {
            let snap = Arc::new(snapshot(&yaml(w)));
            translate_reusing(
                &snap,
                &options,
                &served,
                Timestamp::UNIX_EPOCH,
                &mut compiled,
                |_| {},
            );
            assert_eq!(compiled.last_counts(), counts, "weight {w}");
        }
    }
}
