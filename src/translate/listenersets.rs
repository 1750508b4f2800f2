//! ListenerSets (GEP-1713): listeners defined in their own object, merged
//! into a Gateway that allows them.
//!
//! Per the spec: a Gateway admits ListenerSets through
//! `spec.allowedListeners.namespaces.from` (`None`, the default, admits
//! none; `Same`; `All`; `Selector` on the ListenerSet's namespace labels).
//! "Implementations MUST treat the parent Gateway as having the merged list
//! of all listeners from itself and attached ListenerSets", in the order:
//! the parent Gateway, then ListenerSets oldest first, then by
//! `{namespace}/{name}`. A ListenerSet listener that conflicts with an
//! earlier one is `Conflicted` and not served; the earlier one keeps
//! serving. Routes reach a ListenerSet's listeners only through a parentRef
//! of kind ListenerSet, and a ListenerSet is `Accepted` while at least one
//! of its listeners is. Its TLS certificateRefs resolve from its own
//! namespace: "ReferenceGrants applied to a Gateway are not inherited by
//! child ListenerSets".

use std::collections::BTreeMap;

use gateway_api::experimental::gateways::{
    GatewayAllowedListenersNamespacesFrom, GatewayListeners,
    GatewayListenersAllowedRoutesNamespacesSelector,
};
use gateway_api::experimental::listenersets::{ListenerSet, ListenerSetStatus};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::conditions::{ConditionMaker, ConditionType, Reason};
use super::gateways::{
    AllowedNamespaces, GatewayView, listener_status, listener_tls, listener_view, namespace_allowed,
};
use super::meta::sort_key;
use super::output::{ObjectStatus, StatusMetadata, api_version};
use super::references::Referrer;
use crate::resources::{DEFAULT_NAMESPACE, GATEWAY_GROUP, Gateway, Snapshot};

/// One ListenerSet whose parentRef names one of our Gateways.
#[derive(Debug)]
pub(crate) struct ListenerSetView {
    pub namespace: String,
    pub name: String,
    /// Its index in its Gateway's `listener_sets` (the listeners' `owner`).
    pub index: usize,
    pub cond: ConditionMaker,
    /// `(reason, message)` of `Accepted=False` when the Gateway does not
    /// take it (`NotAllowed`, `ParentNotAccepted`): none of its listeners
    /// are merged.
    pub rejected: Option<(Reason, String)>,
}

impl ListenerSetView {
    /// Can this listener of the set be served: accepted, and an HTTPS
    /// listener has a certificate.
    fn listener_valid(view: &GatewayView, l: usize) -> bool {
        let l = &view.listeners[l];
        l.valid() && !l.lacks_certificate()
    }

    /// Admitted by its Gateway with at least one valid listener: what the
    /// Gateway's `attachedListenerSets` counts.
    pub fn accepted(&self, view: &GatewayView) -> bool {
        self.rejected.is_none()
            && view
                .listeners_of(Some(self.index))
                .any(|l| Self::listener_valid(view, l))
    }
}

/// The same JSON under another generated type (the ListenerSet types
/// repeat the Gateway's field for field).
fn convert<A: Serialize, B: DeserializeOwned>(a: &A) -> Result<B, String> {
    serde_json::to_value(a)
        .and_then(serde_json::from_value)
        .map_err(|e| e.to_string())
}

/// Take every ListenerSet whose parentRef names one of our Gateways into
/// that Gateway's view: admitted ones add their listeners (after those
/// already there, so in precedence order), the others are recorded with
/// the reason.
pub(crate) fn admit(
    snapshot: &Snapshot,
    views: &mut [GatewayView],
    labels: &dyn Fn(&str) -> BTreeMap<String, String>,
    now: Timestamp,
    warnings: &mut Vec<String>,
) {
    let mut sets: Vec<&ListenerSet> = snapshot.listener_sets.iter().collect();
    sets.sort_by_key(|s| sort_key(&s.metadata));
    for set in sets {
        let ns = set
            .metadata
            .namespace
            .as_deref()
            .unwrap_or(DEFAULT_NAMESPACE);
        let name = set.metadata.name.as_deref().unwrap_or("");
        let parent = &set.spec.parent_ref;
        let group = parent.group.as_deref().unwrap_or(GATEWAY_GROUP);
        let kind = parent.kind.as_deref().unwrap_or("Gateway");
        if group != GATEWAY_GROUP || kind != "Gateway" {
            warnings.push(format!(
                "ListenerSet {ns}/{name}: spec.parentRef names a {kind}.{group}, not a Gateway; the ListenerSet is ignored"
            ));
            continue;
        }
        let gw_ns = parent.namespace.as_deref().unwrap_or(ns);
        let Some(view) = views
            .iter_mut()
            .find(|v| v.namespace == gw_ns && v.name == parent.name)
        else {
            // Not one of our Gateways: not ours to report on.
            continue;
        };
        let gateway = snapshot.gateways.iter().find(|g| {
            g.metadata.name.as_deref() == Some(parent.name.as_str())
                && g.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE) == gw_ns
        });
        let index = view.listener_sets.len();
        let cond = ConditionMaker {
            generation: set.metadata.generation.unwrap_or(0),
            now,
        };
        let rejected = if let Some((reason, _)) = &view.rejected {
            Some((
                Reason::ParentNotAccepted,
                format!("Gateway {gw_ns}/{} is not accepted ({reason})", parent.name),
            ))
        } else {
            not_allowed(gateway, gw_ns, &parent.name, ns, labels).map(|m| (Reason::NotAllowed, m))
        };
        if rejected.is_none() {
            for (i, l) in set.spec.listeners.iter().enumerate() {
                let listener = match convert::<_, GatewayListeners>(l) {
                    Ok(listener) => listener,
                    Err(e) => {
                        // The fields are the Gateway's; this cannot fail for
                        // a parsed ListenerSet, but say so if it does.
                        warnings.push(format!(
                            "ListenerSet {ns}/{name}: spec.listeners[{i}] cannot be read as a listener ({e}); it is ignored"
                        ));
                        continue;
                    }
                };
                // Certificates resolve from the ListenerSet's namespace, with
                // ReferenceGrants to ListenerSets ("ReferenceGrants applied
                // to a Gateway are not inherited by child ListenerSets").
                let from = Referrer {
                    kind: "ListenerSet",
                    namespace: ns,
                };
                // Client certificate validation is the Gateway's, per port
                // (`spec.tls.frontend`), whoever defines the listener.
                let tls = listener_tls(snapshot, from, &listener, gateway.map(|gw| (gw, gw_ns)));
                let addresses = view.addresses.clone();
                view.listeners
                    .push(listener_view(&listener, &addresses, tls, Some(index)));
            }
        }
        view.listener_sets.push(ListenerSetView {
            namespace: ns.to_string(),
            name: name.to_string(),
            index,
            cond,
            rejected,
        });
    }
}

/// Why Gateway `gw_ns/gw_name` (`gateway`, its object) does not take
/// ListenerSets from `set_ns` (`None` when it does), per its
/// `spec.allowedListeners`.
fn not_allowed(
    gateway: Option<&Gateway>,
    gw_ns: &str,
    gw_name: &str,
    set_ns: &str,
    labels: &dyn Fn(&str) -> BTreeMap<String, String>,
) -> Option<String> {
    let namespaces = gateway
        .and_then(|g| g.spec.allowed_listeners.as_ref())
        .and_then(|a| a.namespaces.as_ref());
    let gateway = format!("Gateway {gw_ns}/{gw_name}");
    let Some(namespaces) = namespaces else {
        return Some(format!(
            "{gateway} allows no ListenerSets (spec.allowedListeners is not set)"
        ));
    };
    let allowed = match &namespaces.from {
        None | Some(GatewayAllowedListenersNamespacesFrom::None) => {
            return Some(format!(
                "{gateway} allows no ListenerSets (spec.allowedListeners.namespaces.from is None)"
            ));
        }
        Some(GatewayAllowedListenersNamespacesFrom::Same) => AllowedNamespaces::Same,
        Some(GatewayAllowedListenersNamespacesFrom::All) => AllowedNamespaces::All,
        Some(GatewayAllowedListenersNamespacesFrom::Selector) => {
            AllowedNamespaces::Selector(namespaces.selector.as_ref().and_then(|s| {
                convert::<_, GatewayListenersAllowedRoutesNamespacesSelector>(s).ok()
            }))
        }
    };
    (!namespace_allowed(&allowed, gw_ns, set_ns, labels)).then(|| match allowed {
        AllowedNamespaces::Same => format!(
            "{gateway} allows ListenerSets from its own namespace only, not from {set_ns}"
        ),
        _ => format!(
            "{gateway} allows ListenerSets from the namespaces its selector matches; {set_ns} does not match"
        ),
    })
}

/// The status of one ListenerSet, once routes are attached.
pub(crate) fn listener_set_status(view: &GatewayView, set: &ListenerSetView) -> ObjectStatus {
    let c = &set.cond;
    let mut status = ListenerSetStatus::default();
    match &set.rejected {
        Some((reason, message)) => {
            let programmed = if *reason == Reason::ParentNotAccepted {
                Reason::ParentNotProgrammed
            } else {
                *reason
            };
            status.conditions = Some(vec![
                c.make(ConditionType::Accepted, false, *reason, message.clone()),
                c.make(
                    ConditionType::Programmed,
                    false,
                    programmed,
                    format!("not merged into its Gateway: {message}"),
                ),
            ]);
        }
        None => {
            let own: Vec<usize> = view.listeners_of(Some(set.index)).collect();
            let invalid: Vec<&str> = own
                .iter()
                .filter(|&&l| !ListenerSetView::listener_valid(view, l))
                .map(|&l| view.listeners[l].name.as_str())
                .collect();
            let any_served = own.iter().any(|&l| view.serves(l));
            let gateway = format!("Gateway {}/{}", view.namespace, view.name);
            status.conditions = Some(if invalid.len() == own.len() {
                let message = format!("no listener is valid: {}", invalid.join(", "));
                vec![
                    c.make(
                        ConditionType::Accepted,
                        false,
                        Reason::ListenersNotValid,
                        message.clone(),
                    ),
                    c.make(
                        ConditionType::Programmed,
                        false,
                        Reason::ListenersNotValid,
                        message,
                    ),
                ]
            } else {
                vec![
                    if invalid.is_empty() {
                        c.make(
                            ConditionType::Accepted,
                            true,
                            Reason::Accepted,
                            format!("merged into {gateway}"),
                        )
                    } else {
                        c.make(
                            ConditionType::Accepted,
                            true,
                            Reason::ListenersNotValid,
                            format!(
                                "merged into {gateway}; listeners not valid: {}; the others are served",
                                invalid.join(", ")
                            ),
                        )
                    },
                    if any_served {
                        c.make(
                            ConditionType::Programmed,
                            true,
                            Reason::Programmed,
                            "ListenerSet programmed",
                        )
                    } else {
                        c.make(
                            ConditionType::Programmed,
                            false,
                            Reason::Invalid,
                            "no listener can be served",
                        )
                    },
                ]
            });
            let listeners: Vec<_> = own
                .iter()
                .map(|&l| listener_status(view, l, c, true))
                .collect();
            status.listeners = convert(&listeners).ok();
        }
    }
    ObjectStatus {
        api_version: api_version(),
        kind: "ListenerSet".into(),
        metadata: StatusMetadata {
            name: set.name.clone(),
            namespace: Some(set.namespace.clone()),
            generation: c.generation,
        },
        status: serde_json::to_value(status).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use crate::translate::Translation;
    use crate::translate::testing::{bind, condition, listener, status, translate_manifests};

    const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sluice}
spec: {controllerName: sluice.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: sluice
  allowedListeners: {namespaces: {from: Same}}
  listeners: [{name: http, port: 8080, protocol: HTTP, hostname: gw.example.com}]
";

    fn translate_yaml(yaml: &str) -> Translation {
        translate_manifests(&format!("{GATEWAY}---\n{yaml}"))
    }

    const TWO_PORTS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: set}
spec:
  parentRef: {name: gw}
  listeners:
  - {name: a, port: 9090, protocol: HTTP}
  - {name: b, port: 9091, protocol: HTTP}
";

    #[test]
    fn bind_failures_mark_the_listener_set_that_defines_the_listener() {
        let mut t = translate_yaml(TWO_PORTS);
        t.status
            .apply_bind_failures(&[(bind(9090), "Address already in use".into())]);
        let set = status(&t, "ListenerSet", "set");
        assert_eq!(
            condition(&listener(set, "a")["conditions"], "Accepted"),
            ("False".into(), "PortUnavailable".into())
        );
        assert_eq!(
            condition(&listener(set, "b")["conditions"], "Programmed"),
            ("True".into(), "Programmed".into())
        );
        assert_eq!(
            condition(&set["conditions"], "Programmed"),
            ("True".into(), "Programmed".into())
        );
        // The Gateway's own listener is another one and keeps serving.
        let gw = status(&t, "Gateway", "gw");
        assert_eq!(
            condition(&gw["listeners"][0]["conditions"], "Programmed"),
            ("True".into(), "Programmed".into())
        );

        t.status
            .apply_bind_failures(&[(bind(9091), "Address already in use".into())]);
        let set = status(&t, "ListenerSet", "set");
        assert_eq!(
            condition(&set["conditions"], "Programmed"),
            ("False".into(), "PortUnavailable".into())
        );
        assert_eq!(
            condition(&status(&t, "Gateway", "gw")["conditions"], "Programmed"),
            ("True".into(), "Programmed".into())
        );
    }

    #[test]
    fn listener_names_may_repeat_across_the_gateway_and_its_listener_sets() {
        // Both define a listener named http; a route to the ListenerSet's
        // http attaches there only, and each counts its own routes.
        let t = translate_yaml(
            "apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: set}
spec:
  parentRef: {name: gw}
  listeners: [{name: http, port: 8080, protocol: HTTP, hostname: set.example.com}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r}
spec:
  parentRefs: [{kind: ListenerSet, name: set, sectionName: http}]
  rules: [{}]
",
        );
        assert_eq!(
            status(&t, "ListenerSet", "set")["listeners"][0]["attachedRoutes"],
            1
        );
        assert_eq!(
            status(&t, "Gateway", "gw")["listeners"][0]["attachedRoutes"],
            0
        );
        assert_eq!(status(&t, "Gateway", "gw")["attachedListenerSets"], 1);
    }
}
