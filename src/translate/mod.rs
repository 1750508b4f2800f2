//! translate: the pure function from a [`Snapshot`] to what sluice serves
//! ([`RouteTable`]) and what it reports ([`StatusReport`]).
//!
//! All Gateway API semantics of *configuration* live here: which Gateways
//! are ours, which routes attach to which listeners, hostname intersection,
//! ReferenceGrant checks, backend resolution, status conditions and reasons.
//! No I/O: manifests in, table and status out.

mod backend_tls;
mod backends;
mod certificates;
mod conditions;
mod filters;
mod gateways;
mod listenersets;
mod matches;
mod references;
mod rollouts;
mod routes;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use gateway_api::experimental::gateways::GatewayStatus;
use gateway_api::experimental::httproutes::{
    HttpRouteStatus, HttpRouteStatusParents, HttpRouteStatusParentsParentRef,
};
use gateway_api::experimental::listenersets::ListenerSetStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::resources::{CONTROLLER_NAME, DEFAULT_NAMESPACE, GATEWAY_GROUP, Snapshot};
use crate::rollout::{BackendKey, ServedShares};
use crate::route::{BackendTarget, EndpointSet, RouteOrder, RouteTable, RouteTableBuilder};

use backends::{BackendResolver, Resolution};
use conditions::{ConditionMaker, set_condition};

pub use rollouts::rollout_inputs;

/// Settings that are not part of the manifests.
#[derive(Debug, Clone)]
pub struct TranslateOptions {
    /// Address listeners bind on when their Gateway has no `spec.addresses`.
    pub default_bind: IpAddr,
}

/// Everything translate produces.
#[derive(Debug)]
pub struct Translation {
    pub table: RouteTable,
    pub status: StatusReport,
    /// Every HTTPRoute rule that is attached somewhere, with its backends'
    /// shares (what `sluice check` prints), in (namespace, name, rule) order.
    pub rules: Vec<RuleSummary>,
    /// Traps worth a warning that are not errors (an omitted weight next to
    /// explicit ones, a backend whose share will get 500 or 503, ...).
    pub warnings: Vec<String>,
}

/// The status of every object, in the shape Kubernetes would hold it.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(transparent)]
pub struct StatusReport {
    pub objects: Vec<ObjectStatus>,
    /// Which socket each Gateway listener is served on, so that runtime bind
    /// failures can be reported against the right listener.
    #[serde(skip)]
    pub listener_binds: Vec<ListenerBind>,
}

/// `{apiVersion, kind, metadata, status}` of one object.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStatus {
    pub api_version: String,
    pub kind: String,
    pub metadata: StatusMetadata,
    pub status: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StatusMetadata {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub generation: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListenerBind {
    pub gateway_namespace: String,
    pub gateway_name: String,
    /// `(namespace, name)` of the ListenerSet that defines the listener;
    /// `None` for one of the Gateway's own listeners.
    pub listener_set: Option<(String, String)>,
    pub listener: String,
    pub bind: SocketAddr,
}

/// One rule's backends and their shares, for `sluice check`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuleSummary {
    /// `<namespace>/<name>` of the HTTPRoute.
    pub route: String,
    pub rule: usize,
    pub backends: Vec<BackendSummary>,
    /// The RolloutPolicy governing the rule, when one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RuleRollout>,
}

/// Which rollout governs a rule, and where it is.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuleRollout {
    /// `<namespace>/<name>` of the RolloutPolicy.
    pub policy: String,
    pub phase: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackendSummary {
    /// `<namespace>/<name>:<port>` (kind prefixed when not a Service).
    pub name: String,
    pub weight: u32,
    /// The weight was omitted in the manifest (so it is 1).
    pub weight_omitted: bool,
    /// Percentage of the rule's traffic, `100 * weight / sum`.
    pub share_percent: f64,
    pub outcome: BackendOutcome,
    /// What the backendRef points at (its identity across reorderings).
    #[serde(skip)]
    pub key: BackendKey,
    /// The weight served when a rollout governs the rule (the spec's
    /// `weight` otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_weight: Option<u64>,
    /// Percentage of the rule's traffic served, when a rollout governs it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_percent: Option<f64>,
    /// The spec no longer lists the backend; a rollout still serves it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub removed_from_spec: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(
    tag = "outcome",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum BackendOutcome {
    /// Resolved, with this many ready endpoints.
    Serves { ready_endpoints: usize },
    /// Resolved but no ready endpoint: its share gets 503.
    NoReadyEndpoints,
    /// Does not resolve: its share gets 500. `reason` is the spec's
    /// (`BackendNotFound`, `InvalidKind`, `RefNotPermitted`).
    Unresolved { reason: String, message: String },
}

/// A backendRef (or mirror backendRef) that did not resolve.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RefFailure {
    pub reason: &'static str,
    pub message: String,
}

pub(crate) fn backend_target(resolution: Resolution) -> BackendTarget {
    match resolution {
        Resolution::Endpoints {
            addrs,
            protocol,
            tls,
        } => BackendTarget::Endpoints(EndpointSet::new(addrs, protocol).with_tls(tls.map(|t| t.0))),
        Resolution::NoReadyEndpoints => BackendTarget::NoReadyEndpoints,
        Resolution::Unresolved { reason, .. } => BackendTarget::Unresolved {
            reason: reason.to_string(),
        },
    }
}

pub(crate) fn api_version() -> String {
    format!("{GATEWAY_GROUP}/v1")
}

/// Inputs are ordered by (creationTimestamp, namespace, name) so that the
/// output never depends on file order.
pub(crate) fn sort_key(meta: &ObjectMeta) -> (i128, String, String) {
    (
        created_nanos(meta),
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn created_nanos(meta: &ObjectMeta) -> i128 {
    meta.creation_timestamp
        .as_ref()
        .map(|t| t.0.as_nanosecond())
        .unwrap_or(0)
}

/// Build the route table and status for a snapshot, with conditions
/// stamped with the current time.
pub fn translate(snapshot: &Snapshot, options: &TranslateOptions) -> Translation {
    translate_at(snapshot, options, Timestamp::now())
}

/// [`translate`] with the time conditions are stamped with
/// (`lastTransitionTime`) given: the pure form, for tests.
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
    let mut warnings = Vec::new();
    let (mut objects, classes) = gateways::gateway_classes(snapshot, now);
    let namespace_labels: BTreeMap<&str, &BTreeMap<String, String>> = snapshot
        .namespaces
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n.metadata.labels.as_ref()?)))
        .collect();
    let labels = |ns: &str| -> BTreeMap<String, String> {
        let mut l = namespace_labels
            .get(ns)
            .map(|l| (*l).clone())
            .unwrap_or_default();
        l.insert("kubernetes.io/metadata.name".into(), ns.to_string());
        l
    };

    let mut views = gateways::gateways(snapshot, &classes, options, &labels, now, &mut warnings);

    let mut builder = RouteTableBuilder::new();
    let mut listener_binds = Vec::new();
    // handles[gateway][listener]: one per socket the listener is served on.
    let mut handles = Vec::new();
    for view in &views {
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
                    if let Some(v) = &listener.frontend.validation {
                        builder.set_port_client_validation(*bind, v.clone());
                    }
                    hs.push(handle);
                    listener_binds.push(ListenerBind {
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

    let resolver = BackendResolver::new(snapshot);
    let mut routes: Vec<_> = snapshot.http_routes.iter().collect();
    routes.sort_by_key(|r| sort_key(&r.metadata));
    let mut route_statuses = Vec::new();
    let mut rules = Vec::new();
    // route -> the Gateways that accepted it (RolloutPolicy ancestors).
    let mut route_gateways: BTreeMap<(String, String), BTreeSet<(String, String)>> =
        BTreeMap::new();
    for route in routes {
        let ns = route
            .metadata
            .namespace
            .as_deref()
            .unwrap_or(DEFAULT_NAMESPACE);
        let name = route.metadata.name.as_deref().unwrap_or("");
        let parents = routes::attach(route, ns, &views, &labels);
        if parents.is_empty() {
            warnings.push(format!(
                "HTTPRoute {ns}/{name}: no parentRef names a Gateway of {CONTROLLER_NAME}, or a ListenerSet whose parent is one; the route is ignored"
            ));
            continue;
        }
        resolver.tls.set_route_gateways(
            parents
                .iter()
                .filter_map(|p| p.accepted.as_ref().ok())
                .flatten()
                .map(|a| {
                    (
                        views[a.gateway].namespace.clone(),
                        views[a.gateway].name.clone(),
                    )
                })
                .collect(),
        );
        let compiled = routes::compile_route(route, ns, name, &resolver, served);
        let cond = ConditionMaker {
            generation: route.metadata.generation.unwrap_or(0),
            now,
        };
        let order = RouteOrder {
            created: created_nanos(&route.metadata),
            namespace: ns.to_string(),
            name: name.to_string(),
        };
        let resolved = match compiled.ref_failures.first() {
            None => cond.make(
                "ResolvedRefs",
                true,
                "ResolvedRefs",
                "all references resolved",
            ),
            Some(first) => cond.make(
                "ResolvedRefs",
                false,
                first.reason,
                compiled
                    .ref_failures
                    .iter()
                    .map(|f| f.message.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        };
        let mut attached: BTreeSet<(usize, usize)> = BTreeSet::new();
        let mut status_parents = Vec::new();
        let mut accepted_anywhere = false;
        for parent in &parents {
            let accepted = if !compiled.unsupported.is_empty() {
                cond.make(
                    "Accepted",
                    false,
                    "UnsupportedValue",
                    compiled.unsupported.join("; "),
                )
            } else {
                match &parent.accepted {
                    Err((reason, message)) => cond.make("Accepted", false, reason, message.clone()),
                    Ok(attachments) => {
                        accepted_anywhere = true;
                        let mut names = Vec::new();
                        for a in attachments {
                            route_gateways
                                .entry((ns.to_string(), name.to_string()))
                                .or_default()
                                .insert((
                                    views[a.gateway].namespace.clone(),
                                    views[a.gateway].name.clone(),
                                ));
                            names.push(views[a.gateway].listeners[a.listener].name.clone());
                            if !attached.insert((a.gateway, a.listener)) {
                                continue; // attached here through another parentRef
                            }
                            views[a.gateway].listeners[a.listener].attached_routes += 1;
                            for handle in &handles[a.gateway][a.listener] {
                                for r in &compiled.rules {
                                    builder.add_rule(
                                        *handle,
                                        &a.hostnames,
                                        &order,
                                        r.rule.clone(),
                                        r.matches.clone(),
                                    );
                                }
                            }
                        }
                        cond.make(
                            "Accepted",
                            true,
                            "Accepted",
                            format!("attached to listener(s) {}", names.join(", ")),
                        )
                    }
                }
            };
            let p = parent.parent_ref;
            status_parents.push(HttpRouteStatusParents {
                conditions: vec![accepted, resolved.clone()],
                controller_name: CONTROLLER_NAME.to_string(),
                parent_ref: HttpRouteStatusParentsParentRef {
                    group: p.group.clone(),
                    kind: p.kind.clone(),
                    name: p.name.clone(),
                    namespace: p.namespace.clone(),
                    port: p.port,
                    section_name: p.section_name.clone(),
                },
            });
        }
        if accepted_anywhere {
            rules.extend(compiled.summaries);
            warnings.extend(compiled.warnings);
        }
        route_statuses.push(ObjectStatus {
            api_version: api_version(),
            kind: "HTTPRoute".into(),
            metadata: StatusMetadata {
                name: name.to_string(),
                namespace: Some(ns.to_string()),
                generation: cond.generation,
            },
            status: serde_json::to_value(HttpRouteStatus {
                parents: status_parents,
            })
            .unwrap_or_default(),
        });
    }
    rules.sort_by(|a, b| (&a.route, a.rule).cmp(&(&b.route, b.rule)));

    views
        .iter()
        .for_each(|v| objects.push(gateways::gateway_status(v)));
    for view in &views {
        for set in &view.listener_sets {
            objects.push(listenersets::listener_set_status(view, set));
        }
    }
    objects.extend(route_statuses);
    resolver.tls.apply_gateway_conditions(&mut objects, now);
    objects.extend(resolver.tls.policy_statuses(now));
    objects.extend(rollouts::policy_statuses(snapshot, &route_gateways, now));
    Translation {
        table: builder.build(),
        status: StatusReport {
            objects,
            listener_binds,
        },
        rules,
        warnings,
    }
}

impl StatusReport {
    /// Report sockets the proxy could not listen on: their listeners get
    /// `Accepted=False` (reason `PortUnavailable`, "the port is already in
    /// use") and `Programmed=False` (reason `Pending`), with the OS error
    /// as message; a Gateway none of whose listeners is programmed any more
    /// gets `Programmed=False` with reason `AddressNotUsable`, a ListenerSet
    /// likewise with reason `PortUnavailable`.
    pub fn apply_bind_failures(&mut self, failures: &[(SocketAddr, String)]) {
        // (kind, ns, name) of the object defining the listener -> listener
        // -> errors
        let mut failed: BTreeMap<(&str, &str, &str), BTreeMap<&str, Vec<String>>> = BTreeMap::new();
        for b in &self.listener_binds {
            for (addr, error) in failures {
                if *addr == b.bind {
                    let owner = match &b.listener_set {
                        None => (
                            "Gateway",
                            b.gateway_namespace.as_str(),
                            b.gateway_name.as_str(),
                        ),
                        Some((ns, name)) => ("ListenerSet", ns.as_str(), name.as_str()),
                    };
                    failed
                        .entry(owner)
                        .or_default()
                        .entry(&b.listener)
                        .or_default()
                        .push(format!("cannot listen on {addr}: {error}"));
                }
            }
        }
        for ((kind, ns, name), listeners) in failed {
            let Some(object) = self.objects.iter_mut().find(|o| {
                o.kind == kind
                    && o.metadata.namespace.as_deref() == Some(ns)
                    && o.metadata.name == name
            }) else {
                continue;
            };
            let cond = ConditionMaker {
                generation: object.metadata.generation,
                now: Timestamp::now(),
            };
            let mark = |listener: &str, conditions: &mut Vec<Condition>| {
                if let Some(errors) = listeners.get(listener) {
                    let message = errors.join("; ");
                    set_condition(
                        conditions,
                        cond.make("Accepted", false, "PortUnavailable", message.clone()),
                    );
                    set_condition(
                        conditions,
                        cond.make("Programmed", false, "Pending", message),
                    );
                }
            };
            let message = listeners
                .iter()
                .map(|(l, e)| format!("listener {l}: {}", e.join("; ")))
                .collect::<Vec<_>>()
                .join("; ");
            let updated = if kind == "Gateway" {
                let Ok(mut status) = serde_json::from_value::<GatewayStatus>(object.status.clone())
                else {
                    continue;
                };
                mark_listeners(
                    status
                        .listeners
                        .iter_mut()
                        .flatten()
                        .map(|l| (l.name.as_str(), &mut l.conditions)),
                    mark,
                    &mut status.conditions,
                    cond.make("Programmed", false, "AddressNotUsable", message),
                );
                serde_json::to_value(status)
            } else {
                let Ok(mut status) =
                    serde_json::from_value::<ListenerSetStatus>(object.status.clone())
                else {
                    continue;
                };
                mark_listeners(
                    status
                        .listeners
                        .iter_mut()
                        .flatten()
                        .map(|l| (l.name.as_str(), &mut l.conditions)),
                    mark,
                    &mut status.conditions,
                    cond.make("Programmed", false, "PortUnavailable", message),
                );
                serde_json::to_value(status)
            };
            if let Ok(v) = updated {
                object.status = v;
            }
        }
    }
}

/// Apply `mark` to each (name, conditions) of one Gateway's or
/// ListenerSet's listener statuses; when none of them is programmed
/// afterwards, `not_programmed` is set among the object's `conditions`.
fn mark_listeners<'a>(
    listeners: impl Iterator<Item = (&'a str, &'a mut Vec<Condition>)>,
    mark: impl Fn(&str, &mut Vec<Condition>),
    conditions: &mut Option<Vec<Condition>>,
    not_programmed: Condition,
) {
    let mut any_programmed = false;
    for (name, listener_conditions) in listeners {
        mark(name, listener_conditions);
        any_programmed |= listener_conditions
            .iter()
            .any(|c| c.type_ == "Programmed" && c.status == "True");
    }
    if !any_programmed {
        set_condition(conditions.get_or_insert_with(Vec::new), not_programmed);
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers the module tests share: manifests in, a snapshot or a
    //! translation out.

    use std::net::{IpAddr, Ipv4Addr};

    use k8s_openapi::jiff::Timestamp;

    use super::{TranslateOptions, Translation, translate_at};
    use crate::resources::{Generations, Object, Snapshot, parse_manifests};

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Lookup;
    use http::{HeaderMap, Method};
    use std::net::Ipv4Addr;

    const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1
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

    fn translate_yaml(yaml: &str) -> Translation {
        testing::translate_manifests(&format!("{CLASS}---\n{yaml}"))
    }

    fn bind(port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)
    }

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

    const TWO_LISTENERS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: sluice
  listeners:
  - {name: foo, port: 8080, protocol: HTTP, hostname: foo.example.com}
  - {name: wild, port: 8080, protocol: HTTP, hostname: '*.example.com'}
  - {name: other, port: 9090, protocol: HTTP}
";

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
    fn bind_failures_mark_listeners_and_the_gateway() {
        let mut t = translate_yaml(TWO_LISTENERS);
        t.status
            .apply_bind_failures(&[(bind(9090), "Address already in use (os error 98)".into())]);
        let gw = t
            .status
            .objects
            .iter()
            .find(|o| o.kind == "Gateway")
            .expect("the Gateway has status");
        let listener = |name: &str| {
            gw.status["listeners"]
                .as_array()
                .expect("listeners")
                .iter()
                .find(|l| l["name"] == name)
                .expect("listener")
                .clone()
        };
        let cond = |v: &serde_json::Value, ty: &str| {
            v["conditions"]
                .as_array()
                .expect("conditions")
                .iter()
                .find(|c| c["type"] == ty)
                .map(|c| {
                    (
                        c["status"].as_str().unwrap_or("").to_string(),
                        c["reason"].as_str().unwrap_or("").to_string(),
                    )
                })
        };
        let other = listener("other");
        assert_eq!(
            cond(&other, "Programmed"),
            Some(("False".into(), "Pending".into()))
        );
        assert_eq!(
            cond(&other, "Accepted"),
            Some(("False".into(), "PortUnavailable".into()))
        );
        assert_eq!(
            cond(&listener("foo"), "Programmed"),
            Some(("True".into(), "Programmed".into()))
        );
        // Other listeners still serve: the Gateway stays programmed.
        assert_eq!(
            cond(&gw.status, "Programmed"),
            Some(("True".into(), "Programmed".into()))
        );

        t.status
            .apply_bind_failures(&[(bind(8080), "denied".into())]);
        let gw = t
            .status
            .objects
            .iter()
            .find(|o| o.kind == "Gateway")
            .expect("status");
        assert_eq!(
            cond(&gw.status, "Programmed"),
            Some(("False".into(), "AddressNotUsable".into()))
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
