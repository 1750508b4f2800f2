//! translate: the pure function from a [`Snapshot`] to what sluice serves
//! ([`RouteTable`](crate::route::RouteTable)) and what it reports
//! ([`StatusReport`]).
//!
//! All Gateway API semantics of *configuration* live here: which Gateways
//! are ours, which routes attach to which listeners, hostname intersection,
//! ReferenceGrant checks, backend resolution, status conditions and reasons.
//! No I/O: manifests in, table and status out.

mod backend_tls;
mod backends;
mod bind_failures;
mod certificates;
mod conditions;
mod filters;
mod gateways;
mod grpcroutes;
mod listenersets;
mod matches;
mod meta;
mod output;
mod references;
mod reuse;
mod rollouts;
mod routes;
mod tlsroutes;

pub(crate) use conditions::ConditionType;
pub use output::{
    BackendOutcome, BackendSummary, ListenerBind, ObjectStatus, RuleRollout, RuleSummary,
    StatusMetadata, StatusReport, Translation,
};
pub use reuse::CompiledRoutes;
pub use rollouts::rollout_inputs;
pub use routes::COOKIE_MATCHES_ANNOTATION;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;

use crate::resources::{CONTROLLER_NAME, Snapshot};
use crate::rollout::ServedShares;
use crate::route::{HostPattern, ListenerHandle, RouteKind, RouteTable, RouteTableBuilder};

use backends::BackendResolver;
use conditions::Reason;
use gateways::GatewayView;
use meta::{created_nanos, sort_key_ref};
use reuse::Reuse;
use routes::{AttachedRoute, CompiledRoute, RouteHead};

/// Settings that are not part of the manifests.
#[derive(Debug, Clone)]
pub struct TranslateOptions {
    /// Address listeners bind on when their Gateway has no `spec.addresses`.
    pub default_bind: IpAddr,
}

/// Build the route table and status for a snapshot, with conditions
/// stamped with the current time.
pub fn translate(snapshot: &Snapshot, options: &TranslateOptions) -> Translation {
    translate_at(snapshot, options, Timestamp::now())
}

/// [`translate`] with the time conditions are stamped with
/// (`lastTransitionTime`) given: the pure form, for tests.
///
/// Translation runs in phases, each owning one step: our Gateways with
/// their listeners and conflicts (`gateways::gateways`), then
/// `bind_listeners`, `attach_routes`, the routes' status
/// (`routes::route_status`) and `assemble_status`.
pub fn translate_at(
    snapshot: &Snapshot,
    options: &TranslateOptions,
    now: Timestamp,
) -> Translation {
    translate_served_at(snapshot, options, &ServedShares::default(), now)
}

/// [`translate`] with the shares rollouts serve: a governed rule's split
/// uses its served weights instead of its spec weights.
pub fn translate_served(
    snapshot: &Snapshot,
    options: &TranslateOptions,
    served: &ServedShares,
) -> Translation {
    translate_served_at(snapshot, options, served, Timestamp::now())
}

/// [`translate_served`] stamped with `now`: the pure form.
pub fn translate_served_at(
    snapshot: &Snapshot,
    options: &TranslateOptions,
    served: &ServedShares,
    now: Timestamp,
) -> Translation {
    let mut routing = None;
    let status = translate_phased(snapshot, options, served, now, |r| routing = Some(r));
    let Routing {
        table,
        rules,
        warnings,
    } = routing.expect("translate_phased hands the table over before the status");
    Translation {
        table,
        status,
        rules,
        warnings,
    }
}

/// What serving a configuration needs, before its status is known: the
/// route table, the rule summaries and the warnings.
#[derive(Debug)]
pub struct Routing {
    pub table: RouteTable,
    /// As [`Translation::rules`].
    pub rules: Vec<Arc<RuleSummary>>,
    /// As [`Translation::warnings`].
    pub warnings: Vec<String>,
}

/// [`translate_served_at`] in two steps: `routing` is called with the
/// table as soon as it is built, and the status (everything in it is
/// computed from what built the table, after it) is returned afterwards.
/// serve swaps the table in from `routing`, so that a flip does not wait
/// for the status of every object: the status is computed while the new
/// table already serves. One code path for both forms, so the two give
/// the same table and status.
pub fn translate_phased(
    snapshot: &Snapshot,
    options: &TranslateOptions,
    served: &ServedShares,
    now: Timestamp,
    routing: impl FnOnce(Routing),
) -> StatusReport {
    translate_core(snapshot, options, served, now, &mut Reuse::none(), routing)
}

/// [`translate_phased`] reusing the compiled routes of the previous
/// translation kept in `compiled` where nothing they depend on changed
/// (see [`CompiledRoutes`]), and keeping this one's for the next. Gives
/// what [`translate_phased`] gives.
pub fn translate_reusing(
    snapshot: &Arc<Snapshot>,
    options: &TranslateOptions,
    served: &ServedShares,
    now: Timestamp,
    compiled: &mut CompiledRoutes,
    routing: impl FnOnce(Routing),
) -> StatusReport {
    let previous = std::mem::take(compiled);
    let mut reuse = Reuse::of(&previous, snapshot, served);
    let status = translate_core(snapshot, options, served, now, &mut reuse, routing);
    reuse.keep(compiled, snapshot.clone(), served);
    status
}

/// The phases of a translation, compiled routes taken from `reuse` where
/// it has them.
fn translate_core(
    snapshot: &Snapshot,
    options: &TranslateOptions,
    served: &ServedShares,
    now: Timestamp,
    reuse: &mut Reuse<'_>,
    routing: impl FnOnce(Routing),
) -> StatusReport {
    let mut warnings = Vec::new();
    let labels = namespace_labels(snapshot);
    let (class_statuses, classes) = gateways::gateway_classes(snapshot, now);
    let mut views = gateways::gateways(snapshot, &classes, options, &labels, now, &mut warnings);
    let mut listeners = bind_listeners(&views);
    reuse.set_attach_key(reuse::AttachKey::of(&views), snapshot);
    let resolver = BackendResolver::new(snapshot);
    let (attached, rules) = attach_routes(
        snapshot,
        &mut views,
        &mut listeners,
        &resolver,
        served,
        &labels,
        reuse,
        &mut warnings,
    );
    let BoundListeners {
        builder,
        binds: listener_binds,
        ..
    } = listeners;
    routing(Routing {
        table: builder.build(),
        rules,
        warnings,
    });
    // Kept per route for the next translation, which reuses the status of
    // a route where nothing it is built from changed.
    let stamp = conditions::time_json(now);
    let route_statuses: Vec<ObjectStatus> = attached
        .iter()
        .map(|route| {
            reuse.status(route, &stamp, || {
                routes::route_status(route, &views, &stamp)
            })
        })
        .collect();
    let mut objects = assemble_status(
        class_statuses,
        &views,
        route_statuses.into_iter(),
        &resolver,
        now,
    );
    if !snapshot.rollout_policies.is_empty() {
        let route_gateways = rollouts::route_gateways(&attached, &views);
        objects.extend(rollouts::policy_statuses(snapshot, &route_gateways, now));
    }
    StatusReport {
        objects,
        listener_binds,
    }
}

/// Each namespace's labels, for `allowedRoutes` and `allowedListeners`
/// selectors. Every namespace has `kubernetes.io/metadata.name` (Kubernetes
/// sets it), even one the snapshot holds no Namespace object for.
fn namespace_labels(snapshot: &Snapshot) -> impl Fn(&str) -> BTreeMap<String, String> + '_ {
    let by_name: BTreeMap<&str, &BTreeMap<String, String>> = snapshot
        .namespaces
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n.metadata.labels.as_ref()?)))
        .collect();
    move |ns: &str| {
        let mut l = by_name.get(ns).map(|l| (*l).clone()).unwrap_or_default();
        l.insert("kubernetes.io/metadata.name".into(), ns.to_string());
        l
    }
}

/// The route table's listeners, before any route is attached.
struct BoundListeners {
    builder: RouteTableBuilder,
    /// Which socket each listener is served on, for bind failures.
    binds: Vec<ListenerBind>,
    /// `handles[gateway][listener]`: one per socket the listener is served
    /// on (none when it is not served).
    handles: Vec<Vec<Vec<ListenerHandle>>>,
}

/// Phase: bind listeners. Every listener that is served
/// ([`GatewayView::serves`]) gets a route table listener on each of its
/// sockets, with its certificate and client validation, and a
/// [`ListenerBind`] so that a socket that cannot be bound is reported on
/// it. Listeners that are not served get no socket.
fn bind_listeners(views: &[GatewayView]) -> BoundListeners {
    let mut builder = RouteTableBuilder::new();
    let mut binds = Vec::new();
    let mut handles = Vec::new();
    for view in views {
        let mut per_listener = Vec::new();
        for (l, listener) in view.listeners.iter().enumerate() {
            let mut hs = Vec::new();
            if view.serves(l) {
                for bind in &listener.binds {
                    let handle =
                        builder.add_listener(*bind, view.listener_id(l), listener.hostname.clone());
                    if let Some(certificate) = view.certificate(l) {
                        builder.set_listener_tls(handle, certificate);
                    }
                    if let Some(mode) = listener.tls_mode {
                        builder.set_listener_stream(handle, mode);
                    }
                    if let Some(v) = &listener.frontend.validation {
                        builder.set_port_client_validation(*bind, v.clone());
                    }
                    hs.push(handle);
                    binds.push(ListenerBind {
                        gateway_namespace: view.namespace.clone(),
                        gateway_name: view.name.clone(),
                        listener_set: listener.owner.map(|s| {
                            let set = &view.listener_sets[s];
                            (set.namespace.clone(), set.name.clone())
                        }),
                        listener: listener.name.clone(),
                        bind: *bind,
                    });
                }
            }
            per_listener.push(hs);
        }
        handles.push(per_listener);
    }
    BoundListeners {
        builder,
        binds,
        handles,
    }
}

/// Phase: attach routes. Every route of every kind, oldest first, is
/// attached through its parentRefs ([`routes::attach`]) and compiled (by
/// its kind's module). Unless it asks for something sluice cannot honour,
/// its rules are added to every listener it attached to, and each such
/// listener counts it once however many parentRefs reach it. A route that
/// names none of our Gateways only gets a warning.
///
/// HTTPRoutes and GRPCRoutes on one listener follow the spec's rule: "If
/// a Route (A) of type HTTPRoute or GRPCRoute is attached to a Listener
/// and that listener already has another Route (B) of the other type
/// attached and the intersection of the hostnames of A and B is
/// non-empty, then the implementation MUST accept exactly one of these two
/// routes": the oldest, then the first by `namespace/name`, which is the
/// order routes attach in here, so the later route loses that listener
/// (`Accepted=False`, reason `HostnameConflict`, when its parentRef
/// reaches no other listener).
///
/// Returns the routes to report on, in that order, and the rule summaries
/// of those accepted somewhere, by (kind, route, rule).
// The translation's phases hand their state down one by one, as
// translate_core's other phases do; a struct for one call would only
// rename them.
#[allow(clippy::too_many_arguments)]
fn attach_routes<'a>(
    snapshot: &'a Snapshot,
    views: &mut [GatewayView],
    listeners: &mut BoundListeners,
    resolver: &BackendResolver<'_>,
    served: &'a ServedShares,
    labels: &dyn Fn(&str) -> BTreeMap<String, String>,
    reuse: &mut Reuse<'_>,
    warnings: &mut Vec<String>,
) -> (Vec<AttachedRoute<'a>>, Vec<Arc<RuleSummary>>) {
    let routes = routes_by_age(snapshot, reuse);
    let mut attached_routes = Vec::new();
    let mut rules = Vec::new();
    // Hostnames HTTPRoutes and GRPCRoutes hold on each (gateway, listener),
    // by kind: a route looks only at the other kind's claims, so that
    // 10,000 HTTPRoutes on one listener are not compared pairwise.
    // Only read when both kinds are there: otherwise not kept at all.
    let mixed_kinds = !snapshot.http_routes.is_empty() && !snapshot.grpc_routes.is_empty();
    let mut claims: Claims<'a> = BTreeMap::new();
    for (head, index) in routes {
        let unchanged = reuse.unchanged(snapshot, head.kind, head.namespace, head.name, index);
        let mut parents = reuse.parents(head.kind, index, unchanged, || {
            routes::attach(&head, views, labels)
        });
        if parents.is_empty() {
            warnings.push(format!(
                "{}: no parentRef names a Gateway of {CONTROLLER_NAME}, or a ListenerSet whose parent is one; the route is ignored",
                head.id()
            ));
            continue;
        }
        // The Gateways the route is accepted by, which BackendTLSPolicies
        // are checked against while the route compiles. Set only when it
        // compiles: a reused route is not compiled (reuse needs a snapshot
        // without BackendTLSPolicies), and with 10,000 routes reused the
        // list was 30,000 allocations a flip for nothing.
        let views_ref = &*views;
        let compiled = reuse.route(head.kind, index, unchanged, || {
            resolver.tls.set_route_gateways(
                parents
                    .iter()
                    .filter_map(|p| p.accepted.as_ref().ok())
                    .flatten()
                    .map(|a| {
                        (
                            views_ref[a.gateway].namespace.clone(),
                            views_ref[a.gateway].name.clone(),
                        )
                    })
                    .collect(),
            );
            compile(snapshot, &head, index, resolver, served)
        });
        // Shared by every (rule, match) the route adds to the table, and
        // kept for the next translation.
        let order = reuse.route_order(
            head.kind,
            index,
            unchanged,
            created_nanos(head.meta),
            head.namespace,
            head.name,
        );
        // (gateway, listener) pairs the route is attached to already.
        let mut attached: BTreeSet<(usize, usize)> = BTreeSet::new();
        let mut accepted_anywhere = false;
        if compiled.unsupported.is_empty() {
            if mixed_kinds && head.kind != RouteKind::Tls {
                // Other routes decide it: the attachments kept for the next
                // translation are the ones before it (copied here).
                resolve_kind_conflicts(
                    &head,
                    Arc::make_mut(&mut parents).as_mut_slice(),
                    &mut claims,
                    views,
                );
            }
            for attachments in parents.iter().filter_map(|p| p.accepted.as_ref().ok()) {
                accepted_anywhere = true;
                for a in attachments {
                    if !attached.insert((a.gateway, a.listener)) {
                        continue; // attached here through another parentRef
                    }
                    views[a.gateway].listeners[a.listener].attached_routes += 1;
                    for handle in &listeners.handles[a.gateway][a.listener] {
                        for r in &compiled.rules {
                            if head.kind == RouteKind::Tls {
                                listeners.builder.add_stream_rule(
                                    *handle,
                                    &a.hostnames,
                                    &order,
                                    r.rule.clone(),
                                );
                            } else {
                                listeners.builder.add_rule(
                                    *handle,
                                    &a.hostnames,
                                    &order,
                                    r.rule.clone(),
                                    r.matches.clone(),
                                );
                            }
                        }
                    }
                }
            }
        }
        if accepted_anywhere {
            rules.extend(compiled.summaries.iter().cloned());
            warnings.extend(compiled.warnings.iter().cloned());
        }
        attached_routes.push(AttachedRoute {
            head,
            parents,
            compiled,
            index,
            unchanged,
        });
    }
    rules.sort_by(|a, b| (&a.kind, &a.route, a.rule).cmp(&(&b.kind, &b.route, b.rule)));
    (attached_routes, rules)
}

/// The order routes attach in: oldest first, then by namespace, name and
/// kind.
fn by_age(a: &RouteHead<'_>, b: &RouteHead<'_>) -> std::cmp::Ordering {
    (sort_key_ref(a.meta), a.kind).cmp(&(sort_key_ref(b.meta), b.kind))
}

/// Every route of the snapshot, with its index in its kind's list, in
/// attach order ([`by_age`]). The last translation's order is tried first:
/// when it is still strictly in order (one pass of comparisons, where a
/// sort of 10,000 routes makes fourteen), it is the order a sort gives.
fn routes_by_age<'a>(snapshot: &'a Snapshot, reuse: &mut Reuse<'_>) -> Vec<(RouteHead<'a>, usize)> {
    let mut routes = all_routes(snapshot);
    let base = |kind| match kind {
        RouteKind::Http => (0, snapshot.http_routes.len()),
        RouteKind::Grpc => (snapshot.http_routes.len(), snapshot.grpc_routes.len()),
        RouteKind::Tls => (
            snapshot.http_routes.len() + snapshot.grpc_routes.len(),
            snapshot.tls_routes.len(),
        ),
    };
    // Positions in `routes` of the last order's routes: every index in
    // range for its kind and as many as there are routes, so the same
    // (kind, index) pairs, each once.
    let previous = reuse.previous_order();
    let positions: Option<Vec<usize>> = (previous.len() == routes.len())
        .then(|| {
            previous
                .iter()
                .map(|&(kind, i)| {
                    let (start, count) = base(kind);
                    ((i as usize) < count).then_some(start + i as usize)
                })
                .collect()
        })
        .flatten();
    let kept = positions.filter(|p| {
        p.windows(2)
            .all(|w| by_age(&routes[w[0]].0, &routes[w[1]].0) == std::cmp::Ordering::Less)
    });
    match kept {
        Some(positions) => {
            let mut slots: Vec<Option<(RouteHead<'a>, usize)>> =
                routes.into_iter().map(Some).collect();
            routes = positions.iter().filter_map(|&p| slots[p].take()).collect();
        }
        None => routes.sort_by(|(a, _), (b, _)| by_age(a, b)),
    }
    reuse.keep_order(|| {
        routes
            .iter()
            .map(|(head, i)| (head.kind, *i as u32))
            .collect()
    });
    routes
}

/// Every route of the snapshot, with its index in its kind's list.
fn all_routes(snapshot: &Snapshot) -> Vec<(RouteHead<'_>, usize)> {
    let http = snapshot.http_routes.iter().enumerate().map(|(i, r)| {
        let head = RouteHead::new(
            RouteKind::Http,
            &r.metadata,
            r.spec.hostnames.as_deref().unwrap_or_default(),
            r.spec.parent_refs.as_deref().unwrap_or_default(),
        );
        (head, i)
    });
    let grpc = snapshot.grpc_routes.iter().enumerate().map(|(i, r)| {
        let head = RouteHead::new(
            RouteKind::Grpc,
            &r.metadata,
            r.spec.hostnames.as_deref().unwrap_or_default(),
            r.spec.parent_refs.as_deref().unwrap_or_default(),
        );
        (head, i)
    });
    let tls = snapshot.tls_routes.iter().enumerate().map(|(i, r)| {
        let head = RouteHead::new(
            RouteKind::Tls,
            &r.metadata,
            &r.spec.hostnames,
            r.spec.parent_refs.as_deref().unwrap_or_default(),
        );
        (head, i)
    });
    http.chain(grpc).chain(tls).collect()
}

/// Compile route `head` (number `index` of its kind in `snapshot`) by its
/// kind's module, with the shares rollouts serve.
fn compile(
    snapshot: &Snapshot,
    head: &RouteHead<'_>,
    index: usize,
    resolver: &BackendResolver<'_>,
    served: &ServedShares,
) -> CompiledRoute {
    let (ns, name) = (head.namespace, head.name);
    match head.kind {
        RouteKind::Http => {
            routes::compile_route(&snapshot.http_routes[index], ns, name, resolver, served)
        }
        RouteKind::Grpc => {
            grpcroutes::compile_route(&snapshot.grpc_routes[index], ns, name, resolver, served)
        }
        RouteKind::Tls => {
            tlsroutes::compile_route(&snapshot.tls_routes[index], ns, name, resolver, served)
        }
    }
}

/// The hostnames accepted HTTPRoutes and GRPCRoutes hold, by (gateway,
/// listener, route kind), in the order they were claimed.
type Claims<'a> = BTreeMap<(usize, usize, RouteKind), Vec<Claim<'a>>>;

/// A hostname an accepted HTTPRoute or GRPCRoute holds on a listener.
struct Claim<'a> {
    host: HostPattern,
    /// The route's kind, namespace and name, for the loser's message.
    route: (RouteKind, &'a str, &'a str),
}

/// Drop the attachments of `route` (an HTTPRoute or GRPCRoute) to
/// listeners where a route of the other kind, attached before it, holds an
/// intersecting hostname; a parentRef left with none is not accepted
/// (`HostnameConflict`). The attachments kept claim their hostnames.
fn resolve_kind_conflicts<'a>(
    route: &RouteHead<'a>,
    parents: &mut [routes::ParentResult],
    claims: &mut Claims<'a>,
    views: &[GatewayView],
) {
    for parent in parents.iter_mut() {
        let Ok(attachments) = &mut parent.accepted else {
            continue;
        };
        let mut lost = Vec::new();
        attachments.retain(|a| {
            let held = [RouteKind::Http, RouteKind::Grpc]
                .into_iter()
                .filter(|kind| *kind != route.kind)
                .filter_map(|kind| claims.get(&(a.gateway, a.listener, kind)))
                .find_map(|cs| {
                    cs.iter().find(|c| {
                        a.hostnames.iter().any(|h| h.intersect(&c.host).is_some())
                    })
                });
            match held {
                Some(Claim {
                    host,
                    route: (kind, namespace, name),
                }) => {
                    lost.push(format!(
                        "{kind} {namespace}/{name} holds hostname {host} on listener {} (the older route wins: the spec lets only one of an HTTPRoute and a GRPCRoute serve a hostname on a listener)",
                        views[a.gateway].listeners[a.listener].name
                    ));
                    false
                }
                None => true,
            }
        });
        if attachments.is_empty() && !lost.is_empty() {
            parent.accepted = Err((Reason::HostnameConflict, lost.join("; ")));
            continue;
        }
        for a in attachments.iter() {
            let held = claims
                .entry((a.gateway, a.listener, route.kind))
                .or_default();
            for h in &a.hostnames {
                held.push(Claim {
                    host: h.clone(),
                    route: (route.kind, route.namespace, route.name),
                });
            }
        }
    }
}

/// Phase: assemble the status, in this order: GatewayClasses, Gateways
/// (their listeners now count the routes attached), ListenerSets,
/// HTTPRoutes; then what only the compiled routes tell: the Gateways'
/// `ResolvedRefs` for their backend client certificate, and the
/// BackendTLSPolicies the attached routes' backends use. (RolloutPolicies
/// come last, from the attached routes: [`rollouts::policy_statuses`].)
fn assemble_status(
    class_statuses: Vec<ObjectStatus>,
    views: &[GatewayView],
    route_statuses: impl Iterator<Item = ObjectStatus>,
    resolver: &BackendResolver<'_>,
    now: Timestamp,
) -> Vec<ObjectStatus> {
    let mut objects = class_statuses;
    objects.extend(views.iter().map(gateways::gateway_status));
    for view in views {
        for set in &view.listener_sets {
            objects.push(listenersets::listener_set_status(view, set));
        }
    }
    objects.extend(route_statuses);
    resolver.tls.apply_gateway_conditions(&mut objects, now);
    objects.extend(resolver.tls.policy_statuses(now));
    objects
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers the module tests share: manifests in, a snapshot or a
    //! translation out.

    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    use k8s_openapi::jiff::Timestamp;

    use super::{TranslateOptions, Translation, translate_at};
    use crate::resources::{Generations, Object, Snapshot, parse_manifests};

    /// Our GatewayClass `sluice`, and Service `web` (port 80) with one
    /// ready endpoint.
    pub(crate) const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sluice}
spec: {controllerName: sluice.dev/gateway-controller}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.0.0.1]}]
";

    /// Gateway `gw` of class `sluice`: listeners `foo` (foo.example.com)
    /// and `wild` (*.example.com) on port 8080, `other` on 9090.
    pub(crate) const TWO_LISTENERS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: sluice
  listeners:
  - {name: foo, port: 8080, protocol: HTTP, hostname: foo.example.com}
  - {name: wild, port: 8080, protocol: HTTP, hostname: '*.example.com'}
  - {name: other, port: 9090, protocol: HTTP}
";

    fn objects(yaml: &str) -> Vec<Object> {
        let parsed = parse_manifests(yaml, "t.yaml");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        parsed.objects.into_iter().map(|o| o.object).collect()
    }

    /// The snapshot of `yaml`, which must parse without errors.
    pub(crate) fn snapshot(yaml: &str) -> Snapshot {
        Snapshot::from_objects(objects(yaml))
    }

    /// `yaml` translated at the Unix epoch, with generations assigned and
    /// listeners bound on 0.0.0.0 by default.
    pub(crate) fn translate_manifests(yaml: &str) -> Translation {
        let mut objects = objects(yaml);
        Generations::new().assign(&mut objects, Timestamp::UNIX_EPOCH);
        let options = TranslateOptions {
            default_bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        translate_at(
            &Snapshot::from_objects(objects),
            &options,
            Timestamp::UNIX_EPOCH,
        )
    }

    /// `0.0.0.0:port`, where listeners bind by default.
    pub(crate) fn bind(port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)
    }

    /// `yaml` after [`CLASS`], translated with [`translate_manifests`].
    pub(crate) fn translate_yaml(yaml: &str) -> Translation {
        translate_manifests(&format!("{CLASS}---\n{yaml}"))
    }

    /// The `status` of object `kind` `name`.
    pub(crate) fn status<'a>(t: &'a Translation, kind: &str, name: &str) -> &'a serde_json::Value {
        &t.status
            .objects
            .iter()
            .find(|o| o.kind == kind && o.metadata.name == name)
            .unwrap_or_else(|| panic!("{kind} {name} has a status"))
            .status
    }

    /// The entry of listener `name` in a Gateway's or ListenerSet's
    /// `status`.
    pub(crate) fn listener<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
        status["listeners"]
            .as_array()
            .expect("listeners")
            .iter()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("no listener {name} in {status}"))
    }

    /// `(status, reason)` of the condition of type `ty` among `conditions`.
    pub(crate) fn condition(conditions: &serde_json::Value, ty: &str) -> (String, String) {
        let c = conditions
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == ty)
            .unwrap_or_else(|| panic!("no {ty} in {conditions}"));
        (
            c["status"].as_str().unwrap_or("").into(),
            c["reason"].as_str().unwrap_or("").into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{TWO_LISTENERS, bind, translate_yaml};
    use super::*;
    use crate::route::Lookup;
    use http::{HeaderMap, Method};

    /// `route ns/name` of the rule a GET for `host` + `path` reaches.
    fn route_for(t: &Translation, port: u16, host: &str, path: &str) -> Option<String> {
        match t.table.lookup(
            bind(port),
            host,
            &Method::GET,
            path,
            None,
            &HeaderMap::new(),
        ) {
            Lookup::Matched(m) => Some(format!("{}/{}", m.rule.id.namespace, m.rule.id.route)),
            _ => None,
        }
    }

    fn route(name: &str, extra: &str) -> String {
        format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}}}\n\
             spec:\n{extra}  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n"
        )
    }

    #[test]
    fn section_name_attaches_to_that_listener_only() {
        let t = translate_yaml(&format!(
            "{TWO_LISTENERS}{}",
            route("r", "  parentRefs: [{name: gw, sectionName: other}]\n")
        ));
        assert_eq!(
            route_for(&t, 9090, "any.host", "/x").as_deref(),
            Some("default/r")
        );
        assert_eq!(route_for(&t, 8080, "bar.example.com", "/x"), None);
    }

    #[test]
    fn listener_isolation_keeps_the_more_specific_listener() {
        // Attached to the wildcard listener only: foo.example.com belongs to
        // the foo listener, which has no routes, so it is not routed.
        let t = translate_yaml(&format!(
            "{TWO_LISTENERS}{}",
            route("r", "  parentRefs: [{name: gw, sectionName: wild}]\n")
        ));
        assert_eq!(
            route_for(&t, 8080, "bar.example.com", "/").as_deref(),
            Some("default/r")
        );
        assert!(matches!(
            t.table.lookup(bind(8080), "foo.example.com", &Method::GET, "/", None, &HeaderMap::new()),
            Lookup::NoRoute { listener } if listener.id == "gateway/default/gw/listener/foo"
        ));
    }

    #[test]
    fn route_hostnames_intersect_listener_hostnames() {
        let t = translate_yaml(&format!(
            "{TWO_LISTENERS}{}",
            route(
                "r",
                "  parentRefs: [{name: gw, sectionName: wild}]\n  hostnames: [a.example.com, other.org]\n"
            )
        ));
        assert_eq!(
            route_for(&t, 8080, "a.example.com", "/").as_deref(),
            Some("default/r")
        );
        // Inside the listener's hostname but not the route's.
        assert_eq!(route_for(&t, 8080, "b.example.com", "/"), None);
        // The route's other hostname is outside the listener's: ignored.
        assert_eq!(route_for(&t, 8080, "other.org", "/"), None);
    }

    #[test]
    fn older_route_wins_a_tie_whatever_the_file_order() {
        let newer = route(
            "aaa-newer",
            "  parentRefs: [{name: gw, sectionName: other}]\n",
        )
        .replace(
            "{name: aaa-newer}",
            "{name: aaa-newer, creationTimestamp: '2024-02-01T00:00:00Z'}",
        );
        let older = route(
            "zzz-older",
            "  parentRefs: [{name: gw, sectionName: other}]\n",
        )
        .replace(
            "{name: zzz-older}",
            "{name: zzz-older, creationTimestamp: '2024-01-01T00:00:00Z'}",
        );
        for yaml in [
            format!("{TWO_LISTENERS}{newer}{older}"),
            format!("{TWO_LISTENERS}{older}{newer}"),
        ] {
            let t = translate_yaml(&yaml);
            assert_eq!(
                route_for(&t, 9090, "x", "/").as_deref(),
                Some("default/zzz-older")
            );
        }
    }

    #[test]
    fn gateways_of_other_controllers_serve_nothing() {
        let t = translate_yaml(
            "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: theirs}
spec: {controllerName: example.com/x}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: theirs
  listeners: [{name: http, port: 8080, protocol: HTTP}]
",
        );
        assert_eq!(t.table.binds().count(), 0);
        assert!(
            t.status
                .objects
                .iter()
                .all(|o| o.kind == "GatewayClass" && o.metadata.name == "sluice")
        );
    }

    #[test]
    fn a_gateway_with_a_parameters_ref_is_not_accepted() {
        let t = translate_yaml(
            &("apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: sluice
  listeners: [{name: http, port: 8080, protocol: HTTP}]
  infrastructure:
    parametersRef: {group: invalid.io, kind: InvalidParameters, name: invalid}
"
            .to_owned()
                + &route("r", "  parentRefs: [{name: gw}]\n")),
        );
        let gw = t
            .status
            .objects
            .iter()
            .find(|o| o.kind == "Gateway")
            .expect("the Gateway has status");
        let accepted = gw.status["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == "Accepted")
            .expect("Accepted condition");
        assert_eq!(accepted["status"], "False");
        assert_eq!(accepted["reason"], "InvalidParameters");
        assert!(
            accepted["message"]
                .as_str()
                .is_some_and(|m| m.contains("InvalidParameters")),
            "{accepted}"
        );
        assert!(
            route_for(&t, 8080, "example.com", "/").is_none(),
            "a rejected Gateway serves nothing"
        );
    }
}
