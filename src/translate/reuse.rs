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
//! Attaching reads nothing compiling reads, so attachments are reused even
//! when the Services or other shared inputs changed.
//!
//! A route's status ([`super::routes::route_status`], a JSON value: most
//! of a translation's cost after the table) is kept too, and reused, with
//! the new time in its conditions, for an unchanged route while the
//! Gateways and Namespaces are equal and its generation, what compiling
//! found (values it cannot honour, references that do not resolve, which
//! is where the Services, ReferenceGrants and ports show) and its
//! attachments after the HTTPRoute/GRPCRoute hostname conflicts are equal
//! to what that status was built from ([`Reuse::status`]). Its key in the
//! route table ([`RouteOrder`]) is kept while its creation time is equal.
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
use crate::route::{RouteKind, RouteOrder};

use super::gateways::{AllowedNamespaces, GatewayView};
use super::meta::namespace_of;
use super::output::ObjectStatus;
use super::routes::{AttachedRoute, CompiledRoute, ParentResult};
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

/// Each route's tie-break key in the route table, indexed as [`ByIndex`].
type OrdersByIndex = [Vec<Option<Arc<RouteOrder>>>; 3];

/// Each route's status, indexed as [`ByIndex`].
type StatusesByIndex = [Vec<Option<Arc<KeptStatus>>>; 3];

/// A route's status as a translation built it, with what it was built
/// from other than the route's spec (which [`Reuse::unchanged`] compares)
/// and the Gateways' listener names (in the [`AttachKey`]): the
/// generation, the compiled form (what it cannot honour, the references
/// that do not resolve) and the attachments after the HTTPRoute/GRPCRoute
/// hostname conflicts. [`super::routes::route_status`] reads nothing
/// else but the time, which a reused status is stamped with again.
#[derive(Debug)]
struct KeptStatus {
    status: Arc<ObjectStatus>,
    generation: Option<i64>,
    compiled: Arc<CompiledRoute>,
    parents: Arc<Vec<ParentResult>>,
}

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
    /// Their statuses (made with the same Gateways).
    statuses: StatusesByIndex,
    /// Their tie-break keys in the route table.
    orders: OrdersByIndex,
    /// How many routes the last translation compiled, and reused; how
    /// many route statuses it built, and reused.
    counts: (usize, usize),
    status_counts: (usize, usize),
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

    /// (built, reused) route statuses at the last translation.
    pub fn last_status_counts(&self) -> (usize, usize) {
        self.status_counts
    }
}

/// Index of each route of the previous snapshot by (namespace, name), per
/// kind: built only when a route is not at its previous index.
type ByName<'c> = [FastMap<(&'c str, &'c str), usize>; 3];

/// One translation's view of [`CompiledRoutes`]: what it may reuse, and
/// what it compiled, for the next.
pub(super) struct Reuse<'c> {
    /// The previous snapshot, whatever changed since.
    previous: Option<&'c Snapshot>,
    /// Its compiled routes, when the shared inputs are unchanged.
    previous_routes: Option<&'c ByIndex>,
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
    /// The last translation's route table keys, and this one's.
    previous_orders: Option<&'c OrdersByIndex>,
    next_orders: Option<OrdersByIndex>,
    /// The last translation's route statuses, while the attachments may be
    /// reused, and this one's.
    previous_statuses: Option<&'c StatusesByIndex>,
    next_statuses: Option<StatusesByIndex>,
    compiled: usize,
    reused: usize,
    statuses_built: usize,
    statuses_reused: usize,
}

impl<'c> Reuse<'c> {
    /// Nothing to reuse, nothing kept: a full translation.
    pub fn none() -> Reuse<'static> {
        Reuse {
            previous: None,
            previous_routes: None,
            by_name: None,
            next: None,
            previous_order: &[],
            next_order: Vec::new(),
            previous_parents: None,
            next_parents: None,
            previous_attach_key: None,
            attach_key: AttachKey::default(),
            previous_orders: None,
            next_orders: None,
            previous_statuses: None,
            next_statuses: None,
            compiled: 0,
            reused: 0,
            statuses_built: 0,
            statuses_reused: 0,
        }
    }

    /// What `cache` offers a translation of `snapshot` with `served`.
    pub fn of(cache: &'c CompiledRoutes, snapshot: &Snapshot, served: &ServedShares) -> Self {
        let previous = cache.inputs.as_ref().map(|(prev, _)| &**prev);
        let previous_routes = cache.inputs.as_ref().and_then(|(prev, prev_served)| {
            shared_inputs_equal(prev, snapshot, prev_served, served).then_some(&cache.routes)
        });
        Reuse {
            previous,
            previous_routes,
            by_name: None,
            next: Some(per_route(snapshot)),
            previous_order: &cache.order,
            next_order: Vec::new(),
            previous_parents: Some(&cache.parents),
            next_parents: Some(per_route(snapshot)),
            previous_attach_key: Some(&cache.attach_key),
            attach_key: AttachKey::default(),
            previous_orders: Some(&cache.orders),
            next_orders: Some(per_route(snapshot)),
            previous_statuses: Some(&cache.statuses),
            next_statuses: Some(per_route(snapshot)),
            compiled: 0,
            reused: 0,
            statuses_built: 0,
            statuses_reused: 0,
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
    /// previous snapshot, when it is there with an equal spec: what
    /// [`Reuse::route`] (when the shared inputs are unchanged too),
    /// [`Reuse::parents`] and [`Reuse::status`] (when the Gateways and
    /// Namespaces are) may take from the last translation. Looked up once
    /// per route for all three.
    pub fn unchanged(
        &mut self,
        snapshot: &Snapshot,
        kind: RouteKind,
        namespace: &str,
        name: &str,
        index: usize,
    ) -> Option<usize> {
        let prev = self.previous?;
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
            .previous_routes
            .and_then(|routes| kept(routes, kind, unchanged));
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
    /// the last translation's attachments and route statuses are reused
    /// only when it is equal to the last one's, as are the Namespaces.
    /// (Attaching reads neither the Services nor anything else compiling
    /// does.)
    pub fn set_attach_key(&mut self, key: AttachKey, snapshot: &Snapshot) {
        let same = self
            .previous
            .is_some_and(|prev| prev.namespaces == snapshot.namespaces)
            && self.previous_attach_key.is_some_and(|k| *k == key);
        if !same {
            self.previous_parents = None;
            self.previous_statuses = None;
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

    /// The route table's tie-break key of route number `index` of its
    /// kind, created at `created` (Unix nanoseconds) as `namespace/name`:
    /// the previous translation's when the route is [`Reuse::unchanged`]
    /// and was created at the same time (its name is the same, or it would
    /// not be found), else a new one (two strings).
    pub fn route_order(
        &mut self,
        kind: RouteKind,
        index: usize,
        unchanged: Option<usize>,
        created: i128,
        namespace: &str,
        name: &str,
    ) -> Arc<RouteOrder> {
        let order = self
            .previous_orders
            .and_then(|orders| kept(orders, kind, unchanged))
            .filter(|o| o.created == created && o.namespace == namespace && o.name == name)
            .unwrap_or_else(|| {
                Arc::new(RouteOrder {
                    created,
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                })
            });
        keep_at(self.next_orders.as_mut(), kind, index, &order);
        order
    }

    /// The status of `route`: the previous translation's, stamped with
    /// `stamp` (this translation's time, as conditions write it), when the route is [`Reuse::unchanged`], the Gateways and
    /// Namespaces are equal ([`Reuse::set_attach_key`]), and its
    /// generation, what compiling found (unsupported values, references
    /// that do not resolve) and its attachments (after the hostname
    /// conflicts) are equal to what that status was built from
    /// ([`KeptStatus`]); else `build()`.
    pub fn status(
        &mut self,
        route: &AttachedRoute<'_>,
        stamp: &serde_json::Value,
        build: impl FnOnce() -> ObjectStatus,
    ) -> ObjectStatus {
        let kind = route.head.kind;
        let generation = route.head.meta.generation;
        let kept = self
            .previous_statuses
            .and_then(|statuses| kept(statuses, kind, route.unchanged))
            .filter(|k| {
                k.generation == generation
                    && same_findings(&k.compiled, &route.compiled)
                    && (Arc::ptr_eq(&k.parents, &route.parents) || k.parents == route.parents)
            });
        let status = match &kept {
            Some(k) => {
                self.statuses_reused += 1;
                let mut status = (*k.status).clone();
                restamp(&mut status.status, stamp);
                status
            }
            None => {
                self.statuses_built += 1;
                build()
            }
        };
        if self.next_statuses.is_some() {
            // Kept with this translation's compiled form and attachments
            // (equal to the ones it was built from), not the older ones,
            // which would stay allocated for it.
            let kept = match kept {
                Some(k)
                    if Arc::ptr_eq(&k.compiled, &route.compiled)
                        && Arc::ptr_eq(&k.parents, &route.parents) =>
                {
                    k
                }
                k => Arc::new(KeptStatus {
                    status: k.map_or_else(|| Arc::new(status.clone()), |k| k.status.clone()),
                    generation,
                    compiled: route.compiled.clone(),
                    parents: route.parents.clone(),
                }),
            };
            keep_at(self.next_statuses.as_mut(), kind, route.index, &kept);
        }
        status
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
        cache.statuses = self.next_statuses.unwrap_or_default();
        cache.orders = self.next_orders.unwrap_or_default();
        cache.status_counts = (self.statuses_built, self.statuses_reused);
    }
}

/// One empty slot per route of `snapshot`, by kind.
fn per_route<T>(snapshot: &Snapshot) -> [Vec<Option<Arc<T>>>; 3] {
    [
        vec![None; snapshot.http_routes.len()],
        vec![None; snapshot.grpc_routes.len()],
        vec![None; snapshot.tls_routes.len()],
    ]
}

/// Whether two compiled forms of a route found the same for its status:
/// the values it cannot honour and the references that do not resolve.
fn same_findings(a: &Arc<CompiledRoute>, b: &Arc<CompiledRoute>) -> bool {
    Arc::ptr_eq(a, b) || (a.unsupported == b.unsupported && a.ref_failures == b.ref_failures)
}

/// Stamp every condition of a route's status (`parents[].conditions[]`)
/// with `time`, as a status built now would be.
fn restamp(status: &mut serde_json::Value, time: &serde_json::Value) {
    let Some(serde_json::Value::Array(parents)) = status.get_mut("parents") else {
        return;
    };
    for parent in parents {
        let Some(serde_json::Value::Array(conditions)) = parent.get_mut("conditions") else {
            continue;
        };
        for condition in conditions {
            if let Some(t) = condition.get_mut("lastTransitionTime") {
                t.clone_from(time);
            }
        }
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
        // Route `a` again with an equal spec, a generation later.
        let some_a_later = routes(&[("a", 10), ("b", 20), ("c", 30)]).replacen(
            "metadata: {name: a}",
            "metadata: {name: a, generation: 2}",
            1,
        );
        // Route `a` deleted and created again, with an equal spec: it is
        // now the newest, which the table's tie-breaks read.
        let some_a_recreated = routes(&[("a", 10), ("b", 20), ("c", 30)]).replacen(
            "metadata: {name: a}",
            "metadata: {name: a, creationTimestamp: '2026-12-03T00:00:00Z'}",
            1,
        );
        // Service `shop/api` on another port than the routes ask for.
        let api_moved = API.replace("ports: [{port: 80}]", "ports: [{port: 81}]");
        // A GRPCRoute sorted before HTTPRoute `a` (`0a` < `a`) on its
        // hostname: `a` loses the listener (HostnameConflict).
        let conflicting = grpc_route("0a").replace("[0a.example.com]", "[a.example.com]");
        let renamed = GATEWAY.replace("{name: http,", "{name: web,");
        // (what changed, the configuration, whether any compiled route is
        // reused, whether any route status is)
        let steps: Vec<(&str, String, bool, bool)> = vec![
            (
                "first",
                format!("{base}{gateway}{some}{}", grpc_route("g")),
                false,
                false,
            ),
            (
                "route added",
                format!("{base}{gateway}{some}{}{}", grpc_route("g"), route("d", 40)),
                true,
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
                true,
            ),
            (
                "backend Service removed",
                format!("{CLASS}{GRANT}{gateway}{some}{}", grpc_route("g")),
                false,
                true,
            ),
            (
                "backend Service back",
                format!("{base}{gateway}{some}{}", grpc_route("g")),
                false,
                true,
            ),
            (
                "ReferenceGrant removed",
                format!("{CLASS}{API}{gateway}{some}{}", grpc_route("g")),
                false,
                true,
            ),
            (
                "ReferenceGrant back",
                format!("{base}{gateway}{some}{}", grpc_route("g")),
                false,
                true,
            ),
            (
                "listener changed",
                format!("{base}{other_listener}{some}{}", grpc_route("g")),
                true,
                false,
            ),
            (
                "listener back",
                format!("{base}{gateway}{some}{}", grpc_route("g")),
                true,
                false,
            ),
            (
                "route deleted",
                format!(
                    "{base}{gateway}{}{}",
                    routes(&[("a", 10), ("c", 30)]),
                    grpc_route("g")
                ),
                true,
                true,
            ),
            (
                "GRPCRoute deleted",
                format!("{base}{gateway}{}", routes(&[("a", 10), ("c", 30)])),
                true,
                true,
            ),
            // Attachments kept while the Gateways are equal must follow
            // the Namespaces' labels.
            (
                "listener selects namespaces by label",
                format!("{base}{selecting}{}", routes(&[("a", 10), ("c", 30)])),
                true,
                false,
            ),
            (
                "namespace labelled",
                format!(
                    "{base}{selecting}{labelled}{}",
                    routes(&[("a", 10), ("c", 30)])
                ),
                true,
                false,
            ),
            (
                "label removed",
                format!(
                    "{base}{selecting}{unlabelled}{}",
                    routes(&[("a", 10), ("c", 30)])
                ),
                true,
                false,
            ),
            // Each input of a route's status, changed and back.
            (
                "listeners admit all namespaces again",
                format!("{base}{gateway}{some}{}", grpc_route("g")),
                true,
                false,
            ),
            (
                "route generation bumped, spec equal",
                format!("{base}{gateway}{some_a_later}{}", grpc_route("g")),
                true,
                true,
            ),
            (
                "route created again, spec equal",
                format!("{base}{gateway}{some_a_recreated}{}", grpc_route("g")),
                true,
                true,
            ),
            (
                "backend port changed",
                format!(
                    "{CLASS}{api_moved}{GRANT}{gateway}{some}{}",
                    grpc_route("g")
                ),
                false,
                true,
            ),
            (
                "backend port back",
                format!("{base}{gateway}{some}{}", grpc_route("g")),
                false,
                true,
            ),
            (
                "conflicting GRPCRoute added",
                format!("{base}{gateway}{some}{}{conflicting}", grpc_route("g")),
                true,
                true,
            ),
            (
                "conflicting GRPCRoute removed",
                format!("{base}{gateway}{some}{}", grpc_route("g")),
                true,
                true,
            ),
            (
                "listener renamed",
                format!("{base}{renamed}{some}{}", grpc_route("g")),
                true,
                false,
            ),
        ];
        let options = TranslateOptions {
            default_bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        let served = ServedShares::default();
        let mut compiled = CompiledRoutes::new();
        for (step, (what, yaml, reuses, reuses_status)) in steps.into_iter().enumerate() {
            // A later time at each step: a reused status is stamped with it.
            let now = Timestamp::from_second(step as i64).expect("a valid time");
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
            let (built, kept) = compiled.last_status_counts();
            assert_eq!(
                kept > 0,
                reuses_status,
                "{what}: {built} route statuses built, {kept} reused"
            );
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
