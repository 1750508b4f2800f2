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
//! A route's attachments ([`super::routes::attach`]: its parentRefs to
//! listeners, hostnames intersected) are kept the same way, reused for a
//! route whose spec is equal while what attaching reads of the Gateways
//! ([`AttachKey`]) and the Namespaces (label selectors) are equal too.
//!
//! BackendTLSPolicies: while there are any, nothing is reused. Compiling
//! against them also records which Gateways use each policy (their
//! status), and a route's TLS settings depend on the Gateways it attaches
//! to; reusing would have to replay that. Not done yet: with policies, a
//! change compiles every route, as before.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::FastMap;
use crate::resources::Snapshot;
use crate::rollout::ServedShares;
use crate::route::RouteKind;

use super::gateways::{AllowedNamespaces, GatewayView};
use super::meta::namespace_of;
use super::routes::{CompiledRoute, ParentResult};
use crate::route::HostPattern;
use crate::translate::conditions::Reason;

/// Compiled routes by kind (HTTP, gRPC, TLS), each list indexed like the
/// kind's list in the snapshot they were compiled from (`None`: a route
/// that attached nowhere). A route found at the same index again (the
/// usual case: one file changed, nothing added before it) costs a name
/// compare, no key built and no map.
type ByIndex = [Vec<Option<Arc<CompiledRoute>>>; 3];

/// Each route's attachments, indexed as [`ByIndex`].
type ParentsByIndex = [Vec<Option<Arc<Vec<ParentResult>>>>; 3];

/// What [`super::routes::attach`] reads of the Gateways: for each (in the
/// order translate lists them, as attachments name them by index) its
/// name, its ListenerSets' names and whether each was rejected, and each
/// listener's name, port, hostname, kinds, allowed namespaces and owner.
/// Equal keys (and equal Namespaces) attach an equal route the same way.
#[derive(Debug, Default, PartialEq)]
pub(super) struct AttachKey(Vec<GatewayKey>);

#[derive(Debug, PartialEq)]
struct GatewayKey {
    namespace: String,
    name: String,
    /// (namespace, name, why rejected) of each ListenerSet.
    listener_sets: Vec<ListenerSetKey>,
    listeners: Vec<ListenerKey>,
}

type ListenerSetKey = (String, String, Option<(Reason, String)>);

#[derive(Debug, PartialEq)]
struct ListenerKey {
    name: String,
    port: i32,
    hostname: HostPattern,
    kinds: Vec<RouteKind>,
    namespaces: AllowedNamespaces,
    owner: Option<usize>,
}

impl AttachKey {
    pub(super) fn of(views: &[GatewayView]) -> Self {
        AttachKey(
            views
                .iter()
                .map(|v| GatewayKey {
                    namespace: v.namespace.clone(),
                    name: v.name.clone(),
                    listener_sets: v
                        .listener_sets
                        .iter()
                        .map(|s| (s.namespace.clone(), s.name.clone(), s.rejected.clone()))
                        .collect(),
                    listeners: v
                        .listeners
                        .iter()
                        .map(|l| ListenerKey {
                            name: l.name.clone(),
                            port: l.port,
                            hostname: l.hostname.clone(),
                            kinds: l.kinds.clone(),
                            namespaces: l.namespaces.clone(),
                            owner: l.owner,
                        })
                        .collect(),
                })
                .collect(),
        )
    }
}

fn slot(kind: RouteKind) -> usize {
    match kind {
        RouteKind::Http => 0,
        RouteKind::Grpc => 1,
        RouteKind::Tls => 2,
    }
}

/// The metadata of route `i` of `kind` in `snapshot`.
fn meta_of(snapshot: &Snapshot, kind: RouteKind, i: usize) -> Option<&ObjectMeta> {
    match kind {
        RouteKind::Http => snapshot.http_routes.get(i).map(|r| &r.metadata),
        RouteKind::Grpc => snapshot.grpc_routes.get(i).map(|r| &r.metadata),
        RouteKind::Tls => snapshot.tls_routes.get(i).map(|r| &r.metadata),
    }
}

/// (namespace, name) of route `i` of `kind`, as translate names it.
fn name_of(snapshot: &Snapshot, kind: RouteKind, i: usize) -> Option<(&str, &str)> {
    meta_of(snapshot, kind, i).map(|m| (namespace_of(m), m.name.as_deref().unwrap_or("")))
}

/// The compiled routes of the last translation, for the next one.
#[derive(Default)]
pub struct CompiledRoutes {
    /// The snapshot and served shares they were compiled from.
    inputs: Option<(Arc<Snapshot>, ServedShares)>,
    /// By kind and index in `inputs`' snapshot.
    routes: ByIndex,
    /// Their attachments, and what of the Gateways they were made with.
    parents: ParentsByIndex,
    attach_key: AttachKey,
    /// How many routes the last translation compiled, and reused.
    counts: (usize, usize),
    /// The order the last translation attached its routes in (kind, index
    /// in its kind's list), which the next one checks before sorting.
    order: Vec<(RouteKind, u32)>,
}

impl std::fmt::Debug for CompiledRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept: usize = self.routes.iter().flatten().flatten().count();
        f.debug_struct("CompiledRoutes")
            .field("routes", &kept)
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

/// Index of each route of the previous snapshot by (namespace, name), per
/// kind: built only when a route is not at its previous index.
type ByName<'c> = [FastMap<(&'c str, &'c str), usize>; 3];

/// One translation's view of [`CompiledRoutes`]: what it may reuse, and
/// what it compiled, for the next.
pub(super) struct Reuse<'c> {
    /// The previous snapshot and its routes, when the shared inputs are
    /// unchanged.
    previous: Option<(&'c Snapshot, &'c ByIndex)>,
    /// The previous snapshot's routes by name, once needed.
    by_name: Option<ByName<'c>>,
    /// What this translation compiled, for the next; `None` when nothing
    /// is kept (a full translation).
    next: Option<ByIndex>,
    /// The last translation's attach order, whatever its inputs, and this
    /// one's for the next.
    previous_order: &'c [(RouteKind, u32)],
    next_order: Vec<(RouteKind, u32)>,
    /// The last translation's attachments, until [`Reuse::set_attach_key`]
    /// finds they may not be reused, and this one's.
    previous_parents: Option<&'c ParentsByIndex>,
    next_parents: Option<ParentsByIndex>,
    /// The previous attach key, then this translation's.
    previous_attach_key: Option<&'c AttachKey>,
    attach_key: AttachKey,
    compiled: usize,
    reused: usize,
}

impl<'c> Reuse<'c> {
    /// Nothing to reuse, nothing kept: a full translation.
    pub fn none() -> Reuse<'static> {
        Reuse {
            previous: None,
            by_name: None,
            next: None,
            previous_order: &[],
            next_order: Vec::new(),
            previous_parents: None,
            next_parents: None,
            previous_attach_key: None,
            attach_key: AttachKey::default(),
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
            by_name: None,
            next: Some([
                vec![None; snapshot.http_routes.len()],
                vec![None; snapshot.grpc_routes.len()],
                vec![None; snapshot.tls_routes.len()],
            ]),
            previous_order: &cache.order,
            next_order: Vec::new(),
            previous_parents: Some(&cache.parents),
            next_parents: Some([
                vec![None; snapshot.http_routes.len()],
                vec![None; snapshot.grpc_routes.len()],
                vec![None; snapshot.tls_routes.len()],
            ]),
            previous_attach_key: Some(&cache.attach_key),
            attach_key: AttachKey::default(),
            compiled: 0,
            reused: 0,
        }
    }

    /// The index of route (`kind`, `namespace`, `name`) in the previous
    /// snapshot: `index` when it is there still, else by name.
    fn previous_index(
        &mut self,
        prev: &'c Snapshot,
        kind: RouteKind,
        namespace: &str,
        name: &str,
        index: usize,
    ) -> Option<usize> {
        if name_of(prev, kind, index) == Some((namespace, name)) {
            return Some(index);
        }
        let by_name = self.by_name.get_or_insert_with(|| {
            [RouteKind::Http, RouteKind::Grpc, RouteKind::Tls].map(|kind| {
                let count = match kind {
                    RouteKind::Http => prev.http_routes.len(),
                    RouteKind::Grpc => prev.grpc_routes.len(),
                    RouteKind::Tls => prev.tls_routes.len(),
                };
                // Sources refuse duplicated names; were there one, any
                // route of the name will do: reuse still needs an equal
                // spec.
                let mut names = FastMap::default();
                for i in 0..count {
                    if let Some(key) = name_of(prev, kind, i) {
                        names.entry(key).or_insert(i);
                    }
                }
                names
            })
        });
        by_name[slot(kind)].get(&(namespace, name)).copied()
    }

    /// The index of route number `index` of its kind in `snapshot` in the
    /// previous snapshot, when it is there with an equal spec and the
    /// shared inputs are unchanged: what [`Reuse::route`] and
    /// [`Reuse::parents`] may take from the last translation. Looked up
    /// once per route for both.
    pub fn unchanged(
        &mut self,
        snapshot: &Snapshot,
        kind: RouteKind,
        namespace: &str,
        name: &str,
        index: usize,
    ) -> Option<usize> {
        let (prev, _) = self.previous?;
        let old = self.previous_index(prev, kind, namespace, name, index)?;
        same_spec(kind, prev, old, snapshot, index).then_some(old)
    }

    /// The compiled form of route number `index` of its kind: the
    /// previous one when it is [`Reuse::unchanged`] (`unchanged`, its
    /// previous index), else `compile()`.
    pub fn route(
        &mut self,
        kind: RouteKind,
        index: usize,
        unchanged: Option<usize>,
        compile: impl FnOnce() -> CompiledRoute,
    ) -> Arc<CompiledRoute> {
        let kept = self
            .previous
            .and_then(|(_, routes)| kept(routes, kind, unchanged));
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
        keep_at(self.next.as_mut(), kind, index, &compiled);
        compiled
    }

    /// What this translation's Gateways give attaching ([`AttachKey`]):
    /// the last translation's attachments are reused only when it is equal
    /// to the last one's, as are the Namespaces and the shared inputs of
    /// compiled routes.
    pub fn set_attach_key(&mut self, key: AttachKey, snapshot: &Snapshot) {
        let same = self
            .previous
            .is_some_and(|(prev, _)| prev.namespaces == snapshot.namespaces)
            && self.previous_attach_key.is_some_and(|k| *k == key);
        if !same {
            self.previous_parents = None;
        }
        self.attach_key = key;
    }

    /// The attachments of route number `index` of its kind: the previous
    /// translation's when it is [`Reuse::unchanged`] and they may be
    /// reused, else `attach()`.
    pub fn parents(
        &mut self,
        kind: RouteKind,
        index: usize,
        unchanged: Option<usize>,
        attach: impl FnOnce() -> Vec<ParentResult>,
    ) -> Arc<Vec<ParentResult>> {
        let parents = self
            .previous_parents
            .and_then(|parents| kept(parents, kind, unchanged))
            .unwrap_or_else(|| Arc::new(attach()));
        keep_at(self.next_parents.as_mut(), kind, index, &parents);
        parents
    }

    /// The order the last translation attached routes in (kind, index):
    /// a guess for this one's, to be checked (empty when there is none).
    pub fn previous_order(&self) -> &'c [(RouteKind, u32)] {
        self.previous_order
    }

    /// This translation's attach order, kept for the next when anything
    /// is kept.
    pub fn keep_order(&mut self, order: impl FnOnce() -> Vec<(RouteKind, u32)>) {
        if self.next.is_some() {
            self.next_order = order();
        }
    }

    /// Keep what this translation compiled (of `snapshot`, with `served`)
    /// in `cache`, for the next.
    pub fn keep(self, cache: &mut CompiledRoutes, snapshot: Arc<Snapshot>, served: &ServedShares) {
        cache.inputs = Some((snapshot, served.clone()));
        cache.routes = self.next.unwrap_or_default();
        cache.counts = (self.compiled, self.reused);
        cache.order = self.next_order;
        cache.parents = self.next_parents.unwrap_or_default();
        cache.attach_key = self.attach_key;
    }
}

/// What the last translation kept of route `unchanged` (its previous
/// index) of `kind`.
fn kept<T>(
    by_index: &[Vec<Option<Arc<T>>>; 3],
    kind: RouteKind,
    unchanged: Option<usize>,
) -> Option<Arc<T>> {
    by_index[slot(kind)].get(unchanged?)?.clone()
}

/// Keep `value` for route `index` of `kind`, for the next translation
/// (nothing is kept when `next` is `None`: a full translation).
fn keep_at<T>(
    next: Option<&mut [Vec<Option<Arc<T>>>; 3]>,
    kind: RouteKind,
    index: usize,
    value: &Arc<T>,
) {
    if let Some(cell) = next.and_then(|next| next[slot(kind)].get_mut(index)) {
        *cell = Some(value.clone());
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
            // A route the source handed again is the same allocation.
            (Some(x), Some(y)) => {
                Arc::ptr_eq(x, y) || (x.spec == y.spec && cookie_matches(x) == cookie_matches(y))
            }
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
        let selecting = GATEWAY.replace(
            "from: All",
            "from: Selector, selector: {matchLabels: {team: web}}",
        );
        let labelled = "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: default, labels: {team: web}}\n";
        let unlabelled = "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: default}\n";
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
            // Attachments kept while the Gateways are equal must follow
            // the Namespaces' labels.
            (
                "listener selects namespaces by label",
                format!("{base}{selecting}{}", routes(&[("a", 10), ("c", 30)])),
                true,
            ),
            (
                "namespace labelled",
                format!(
                    "{base}{selecting}{labelled}{}",
                    routes(&[("a", 10), ("c", 30)])
                ),
                true,
            ),
            (
                "label removed",
                format!(
                    "{base}{selecting}{unlabelled}{}",
                    routes(&[("a", 10), ("c", 30)])
                ),
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
        // The last step deletes the first route: the others move down one
        // index in the snapshot and are found by name.
        let without_a = format!(
            "{CLASS}{API}{GRANT}{GATEWAY}{}{}",
            route("b", 90),
            route("c", 30)
        );
        let steps = [
            (yaml(20), (3, 0)),
            (yaml(90), (1, 2)),
            (yaml(90), (0, 3)),
            (without_a, (0, 2)),
            (yaml(90), (1, 2)),
        ];
        for (i, (text, counts)) in steps.into_iter().enumerate() {
            let snap = Arc::new(snapshot(&text));
            translate_reusing(
                &snap,
                &options,
                &served,
                Timestamp::UNIX_EPOCH,
                &mut compiled,
                |_| {},
            );
            assert_eq!(compiled.last_counts(), counts, "step {i}");
        }
    }
}
