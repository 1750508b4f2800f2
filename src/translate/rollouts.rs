//! RolloutPolicies in translate: which rules each policy governs (GEP-713
//! attachment, the oldest policy winning a rule), what the rollout state
//! machine needs to know of them ([`rollout_inputs`]), the served shares
//! applied to a governed rule's split ([`served_split`]), and each policy's
//! status (`ancestors`, [`policy_statuses`]).
//!
//! Translate never decides a step: the serve loop runs the state machine
//! on [`rollout_inputs`] and hands the [`ServedShares`] back to translate,
//! so a step is a new table like any reload.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gateway_api::experimental::httproutes::{HttpRoute, HttpRouteRules};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::backends::{BackendRefFields, BackendResolver, Resolution, backend_target};
use super::conditions::{ConditionMaker, ConditionType, Reason};
use super::gateways::GatewayView;
use super::meta::{namespace_of, sort_key};
use super::output::{
    BackendOutcome, BackendSummary, ObjectStatus, RuleRollout, RuleSummary, StatusMetadata,
};
use super::routes::AttachedRoute;
use crate::resources::{
    CONTROLLER_NAME, ConsistentKey, GATEWAY_GROUP, ROLLOUT_POLICY_API_VERSION, RolloutPolicy,
    RolloutSettings, Snapshot,
};
use crate::rollout::{
    BackendKey, GovernedRule, PolicyKey, Readiness, RolloutInputs, RuleKey, ServedShares, Weights,
};
use crate::route::{Backend, BackendSplit, Consistent, KeySource, RouteKind};

/// What one policy's targetRefs came to.
struct PolicyTargets<'a> {
    policy: &'a RolloutPolicy,
    key: PolicyKey,
    settings: RolloutSettings,
    /// Rules this policy governs.
    governs: Vec<(RuleKey, &'a HttpRoute, usize)>,
    /// Rules an older policy governs: (rule, that policy).
    conflicts: Vec<(RuleKey, PolicyKey)>,
    /// Targets that do not exist: (route name, why).
    not_found: Vec<(String, String)>,
}

/// The CRD's default for an absent `rules`: one rule without backends.
const DEFAULT_RULES: &[HttpRouteRules] = &[];

fn rules_of(route: &HttpRoute) -> usize {
    route.spec.rules.as_ref().map_or(1, Vec::len)
}

/// Resolve every valid policy's targetRefs, oldest policy first (by
/// creationTimestamp, then namespace/name): a rule already governed by an
/// older policy is a conflict for the newer one.
fn targets(snapshot: &Snapshot) -> Vec<PolicyTargets<'_>> {
    let mut policies: Vec<&RolloutPolicy> = snapshot.rollout_policies.iter().collect();
    policies.sort_by_key(|p| sort_key(&p.metadata));
    let mut claimed: BTreeMap<RuleKey, PolicyKey> = BTreeMap::new();
    let mut out = Vec::new();
    for policy in policies {
        // Loaded policies are valid; one that is not governs nothing.
        let Ok(settings) = policy.settings() else {
            continue;
        };
        let ns = namespace_of(&policy.metadata);
        let key = PolicyKey {
            namespace: ns.to_string(),
            name: policy.metadata.name.clone().unwrap_or_default(),
        };
        let mut t = PolicyTargets {
            policy,
            key: key.clone(),
            settings,
            governs: Vec::new(),
            conflicts: Vec::new(),
            not_found: Vec::new(),
        };
        for target in &policy.spec.target_refs {
            let route = snapshot.http_routes.iter().find(|r| {
                r.metadata.name.as_deref() == Some(target.name.as_str())
                    && namespace_of(&r.metadata) == ns
            });
            let Some(route) = route else {
                t.not_found.push((
                    target.name.clone(),
                    format!("HTTPRoute {ns}/{} does not exist", target.name),
                ));
                continue;
            };
            let route: &HttpRoute = route;
            let indices: Vec<usize> = match &target.section_name {
                None => (0..rules_of(route)).collect(),
                Some(section) => {
                    let found = route
                        .spec
                        .rules
                        .iter()
                        .flatten()
                        .position(|r| r.name.as_deref() == Some(section.as_str()));
                    match found {
                        Some(i) => vec![i],
                        None => {
                            t.not_found.push((
                                target.name.clone(),
                                format!(
                                    "HTTPRoute {ns}/{} has no rule named {section:?}",
                                    target.name
                                ),
                            ));
                            continue;
                        }
                    }
                }
            };
            for rule in indices {
                let rule_key = RuleKey {
                    kind: RouteKind::Http,
                    namespace: ns.to_string(),
                    route: target.name.clone(),
                    rule,
                };
                match claimed.get(&rule_key) {
                    Some(owner) if *owner == key => {} // listed twice
                    Some(owner) => t.conflicts.push((rule_key, owner.clone())),
                    None => {
                        claimed.insert(rule_key.clone(), key.clone());
                        t.governs.push((rule_key, route, rule));
                    }
                }
            }
        }
        out.push(t);
    }
    out
}

/// The identity of a backendRef of a route in namespace `ns`.
pub(crate) fn backend_key(ns: &str, r: &BackendRefFields<'_>) -> BackendKey {
    BackendKey {
        group: r.group.unwrap_or("").to_string(),
        kind: r.kind.unwrap_or("Service").to_string(),
        namespace: r.namespace.unwrap_or(ns).to_string(),
        name: r.name.to_string(),
        port: r.port,
    }
}

fn fields_of(key: &BackendKey) -> BackendRefFields<'_> {
    BackendRefFields {
        group: Some(key.group.as_str()),
        kind: Some(key.kind.as_str()),
        name: &key.name,
        namespace: Some(&key.namespace),
        port: key.port,
    }
}

/// The spec weight of a backendRef as translate serves it (an invalid
/// weight serves 0).
pub(crate) fn spec_weight(weight: Option<i32>) -> u32 {
    match weight.map(u32::try_from) {
        None => 1,
        Some(Ok(w)) if w <= 1_000_000 => w,
        Some(_) => 0,
    }
}

/// What the rollout state machine needs: every governed rule with its
/// spec weights, its backends' readiness and what the table in service
/// (`previous`, the rule summaries of the last translation) serves.
pub fn rollout_inputs(snapshot: &Snapshot, previous: &[Arc<RuleSummary>]) -> RolloutInputs {
    if snapshot.rollout_policies.is_empty() {
        return RolloutInputs::default();
    }
    let resolver = BackendResolver::new(snapshot);
    let mut rules = Vec::new();
    for t in targets(snapshot) {
        let fingerprint = t.policy.spec_fingerprint();
        for (rule_key, route, index) in t.governs {
            let rule = route
                .spec
                .rules
                .as_deref()
                .unwrap_or(DEFAULT_RULES)
                .get(index);
            let mut spec = Weights::new();
            let mut readiness = Vec::new();
            for b in rule
                .and_then(|r| r.backend_refs.as_deref())
                .unwrap_or_default()
            {
                let fields = BackendRefFields::of(b);
                let key = backend_key(&rule_key.namespace, &fields);
                spec.add(key.clone(), u64::from(spec_weight(b.weight)));
                let ready = match resolver.resolve(rule_key.kind, &rule_key.namespace, &fields) {
                    Resolution::Endpoints { .. } => Readiness::Ready,
                    Resolution::NoReadyEndpoints => Readiness::NoReadyEndpoints,
                    Resolution::Unresolved { reason, .. } => Readiness::Unresolved {
                        reason: reason.to_string(),
                    },
                };
                if !readiness.iter().any(|(k, _)| *k == key) {
                    readiness.push((key, ready));
                }
            }
            // Summaries are sorted by (kind, route, rule): an HTTPRoute's
            // rule is found by all three, never a GRPCRoute's of its name.
            let kind = rule_key.kind.as_str();
            let route_name = format!("{}/{}", rule_key.namespace, rule_key.route);
            let previously_served = previous
                .binary_search_by(|s| {
                    (s.kind.as_str(), s.route.as_str(), s.rule).cmp(&(
                        kind,
                        route_name.as_str(),
                        index,
                    ))
                })
                .ok()
                .map(|i| {
                    let mut w = Weights::new();
                    for b in &previous[i].backends {
                        w.add(
                            b.key.clone(),
                            b.served_weight.unwrap_or(u64::from(b.weight)),
                        );
                    }
                    w
                });
            rules.push(GovernedRule {
                policy: t.key.clone(),
                settings: t.settings.clone(),
                fingerprint,
                rule: rule_key,
                rule_name: rule.and_then(|r| r.name.clone()),
                spec,
                readiness,
                previously_served,
            });
        }
    }
    RolloutInputs { rules }
}

/// A rule's backend split: the spec weights, or the weights its rollout
/// serves. Backends a rollout still serves that the spec no longer lists
/// are added (without their filters: the spec no longer has them).
/// `summaries` (one per backend, in order) get the served weights.
pub(crate) fn served_split(
    (kind, ns, route, index): (RouteKind, &str, &str, usize),
    mut backends: Vec<Backend>,
    summaries: &mut Vec<BackendSummary>,
    served: &ServedShares,
    resolver: &BackendResolver<'_>,
    id_prefix: &str,
) -> (BackendSplit, Option<RuleRollout>) {
    // Most rules are governed by no rollout: no key built for them.
    if served.rules.is_empty() {
        return (BackendSplit::new(backends), None);
    }
    let rule = RuleKey {
        kind,
        namespace: ns.to_string(),
        route: route.to_string(),
        rule: index,
    };
    let Some(s) = served.rules.get(&rule) else {
        return (BackendSplit::new(backends), None);
    };
    let mut weights = Vec::with_capacity(backends.len());
    let mut seen = BTreeSet::new();
    for summary in summaries.iter() {
        // A backend listed twice gets its served share on its first entry.
        let first = seen.insert(summary.key.clone());
        weights.push(if first {
            s.weights.get(&summary.key)
        } else {
            0
        });
    }
    for (key, weight) in s.weights.iter() {
        if weight == 0 || seen.contains(key) {
            continue;
        }
        let resolution = resolver.resolve(kind, ns, &fields_of(key));
        let outcome = outcome_of(&resolution);
        backends.push(Backend {
            id: format!("{id_prefix}/removed/{}", backends.len()),
            service: key.to_string(),
            weight: 0,
            target: backend_target(resolution),
            filters: Vec::new(),
        });
        summaries.push(BackendSummary {
            name: key.to_string(),
            weight: 0,
            share_percent: 0.0,
            outcome,
            key: key.clone(),
            served_weight: None,
            served_percent: None,
            removed_from_spec: true,
        });
        weights.push(weight);
    }
    let total: u128 = weights.iter().map(|w| u128::from(*w)).sum();
    for (summary, weight) in summaries.iter_mut().zip(&weights) {
        summary.served_weight = Some(*weight);
        summary.served_percent = Some(if total == 0 {
            0.0
        } else {
            100.0 * *weight as f64 / total as f64
        });
    }
    let consistent = s.consistent_by.as_ref().map(|by| {
        // Like the served weights: a backend listed twice has its share on
        // its first entry.
        let per_backend = |w: &Weights| -> Vec<u64> {
            (0..summaries.len())
                .map(|i| {
                    if seen_before(summaries, i) {
                        0
                    } else {
                        w.get(&summaries[i].key)
                    }
                })
                .collect()
        };
        let key = match by {
            ConsistentKey::Header(h) => KeySource::Header(h.clone()),
            ConsistentKey::Cookie(c) => KeySource::Cookie(c.clone()),
        };
        Consistent::new(key, &per_backend(&s.from), &per_backend(&s.to), &weights)
    });
    let rollout = RuleRollout {
        policy: s.policy.to_string(),
        phase: s.phase.as_str().to_string(),
        step: s.step.map(|p| p.to_string()),
    };
    (
        BackendSplit::served(backends, &weights, consistent),
        Some(rollout),
    )
}

/// Whether summary `i` repeats the backend of an earlier one.
fn seen_before(summaries: &[BackendSummary], i: usize) -> bool {
    summaries[..i].iter().any(|s| s.key == summaries[i].key)
}

pub(crate) fn outcome_of(resolution: &Resolution) -> BackendOutcome {
    match resolution {
        Resolution::Endpoints { addrs, .. } => BackendOutcome::Serves {
            ready_endpoints: addrs.len(),
        },
        Resolution::NoReadyEndpoints => BackendOutcome::NoReadyEndpoints,
        Resolution::Unresolved { reason, message } => BackendOutcome::Unresolved {
            reason: reason.to_string(),
            message: message.clone(),
        },
    }
}

/// route -> the Gateways that accepted it, from the attached routes (a
/// route asking for something sluice cannot honour is accepted nowhere).
pub(crate) fn route_gateways(
    attached: &[AttachedRoute<'_>],
    views: &[GatewayView],
) -> BTreeMap<(String, String), BTreeSet<(String, String)>> {
    let mut out: BTreeMap<(String, String), BTreeSet<(String, String)>> = BTreeMap::new();
    let http = attached
        .iter()
        .filter(|r| r.head.kind == RouteKind::Http && r.compiled.unsupported.is_empty());
    for route in http {
        for attachments in route
            .parents
            .iter()
            .filter_map(|p| p.accepted.as_ref().ok())
        {
            for a in attachments {
                let view = &views[a.gateway];
                let key = (
                    route.head.namespace.to_string(),
                    route.head.name.to_string(),
                );
                out.entry(key)
                    .or_default()
                    .insert((view.namespace.clone(), view.name.clone()));
            }
        }
    }
    out
}

/// The status of every valid RolloutPolicy (`ancestors`; `rollouts` is
/// the serve loop's, see [`crate::rollout::RolloutReport::complete`]).
///
/// Ancestors are the Gateways the targeted routes are attached to
/// (`route_gateways`: route -> Gateways that accepted it). A target that
/// does not exist, or a route attached to none of our Gateways, is
/// reported with the HTTPRoute itself as ancestorRef.
pub(crate) fn policy_statuses(
    snapshot: &Snapshot,
    route_gateways: &BTreeMap<(String, String), BTreeSet<(String, String)>>,
    now: Timestamp,
) -> Vec<ObjectStatus> {
    let mut out = Vec::new();
    for t in targets(snapshot) {
        let cond = ConditionMaker {
            generation: t.policy.metadata.generation.unwrap_or(0),
            now,
        };
        let ns = t.key.namespace.as_str();
        let list = |rules: &mut dyn Iterator<Item = &RuleKey>| {
            rules.map(RuleKey::to_string).collect::<Vec<_>>().join(", ")
        };
        let mut notes = Vec::new();
        if !t.conflicts.is_empty() {
            let lost: Vec<String> = t
                .conflicts
                .iter()
                .map(|(r, owner)| format!("{r} is governed by the older RolloutPolicy {owner}"))
                .collect();
            notes.push(lost.join("; "));
        }
        notes.extend(t.not_found.iter().map(|(_, why)| why.clone()));
        let governs = !t.governs.is_empty();
        let (reason, message) = if governs {
            let mut message = format!("governs {}", list(&mut t.governs.iter().map(|(r, _, _)| r)));
            for note in &notes {
                message.push_str("; ");
                message.push_str(note);
            }
            (Reason::Accepted, message)
        } else if !t.conflicts.is_empty() {
            (Reason::Conflicted, notes.join("; "))
        } else {
            (Reason::TargetNotFound, notes.join("; "))
        };
        let accepted = cond.make(ConditionType::Accepted, governs, reason, message.clone());

        let mut gateways: BTreeSet<(String, String)> = BTreeSet::new();
        let mut unattached: BTreeSet<String> = BTreeSet::new();
        let targeted: BTreeSet<&str> = t
            .governs
            .iter()
            .map(|(r, _, _)| r.route.as_str())
            .chain(t.conflicts.iter().map(|(r, _)| r.route.as_str()))
            .collect();
        for route in targeted {
            match route_gateways.get(&(ns.to_string(), route.to_string())) {
                Some(gws) if !gws.is_empty() => gateways.extend(gws.iter().cloned()),
                _ => {
                    unattached.insert(route.to_string());
                }
            }
        }
        let mut ancestors: Vec<serde_json::Value> = gateways
            .iter()
            .map(|(gw_ns, gw)| {
                json!({
                    "ancestorRef": {"group": GATEWAY_GROUP, "kind": "Gateway", "namespace": gw_ns, "name": gw},
                    "controllerName": CONTROLLER_NAME,
                    "conditions": [accepted],
                })
            })
            .collect();
        for route in &unattached {
            let condition = cond.make(
                ConditionType::Accepted,
                governs,
                reason,
                format!(
                    "{message}; HTTPRoute {ns}/{route} is not attached to a Gateway of {CONTROLLER_NAME}, so it carries no traffic"
                ),
            );
            ancestors.push(route_ancestor(ns, route, condition));
        }
        for (route, why) in &t.not_found {
            let condition = cond.make(
                ConditionType::Accepted,
                false,
                Reason::TargetNotFound,
                why.clone(),
            );
            ancestors.push(route_ancestor(ns, route, condition));
        }
        out.push(ObjectStatus {
            api_version: ROLLOUT_POLICY_API_VERSION.into(),
            kind: "RolloutPolicy".into(),
            metadata: StatusMetadata {
                name: t.key.name.clone(),
                namespace: Some(ns.to_string()),
                generation: cond.generation,
            },
            status: json!({"ancestors": ancestors, "rollouts": []}),
        });
    }
    out
}

fn route_ancestor(
    ns: &str,
    route: &str,
    condition: k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
) -> serde_json::Value {
    json!({
        "ancestorRef": {"group": GATEWAY_GROUP, "kind": "HTTPRoute", "namespace": ns, "name": route},
        "controllerName": CONTROLLER_NAME,
        "conditions": [condition],
    })
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    use http::{HeaderMap, HeaderValue, Method};
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::rollout::{Phase, ServedRule};
    use crate::route::{BackendChoice, Lookup};
    use crate::translate::testing::snapshot;
    use crate::translate::{TranslateOptions, Translation, translate_served_at};

    const MANIFESTS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sluice}
spec: {controllerName: sluice.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: sluice
  listeners: [{name: http, port: 8080, protocol: HTTP}]
---
apiVersion: v1
kind: Service
metadata: {name: stable}
spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: stable-1, labels: {kubernetes.io/service-name: stable}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.0.0.1]}]
---
apiVersion: v1
kind: Service
metadata: {name: old}
spec: {ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: canary}
spec: {ports: [{port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: shop}
spec:
  parentRefs: [{name: gw}]
  rules:
  - backendRefs:
    - {name: stable, port: 80, weight: 3}
    - {name: canary, port: 80, weight: 1}
---
apiVersion: sluice.dev/v1alpha1
kind: RolloutPolicy
metadata: {name: p}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: shop}]
  steps: ['50%', '100%']
  interval: 1m
  consistentBy: {header: x-user}
";

    fn key(name: &str) -> BackendKey {
        BackendKey::service("default", name, Some(80))
    }

    fn rule() -> RuleKey {
        RuleKey {
            kind: RouteKind::Http,
            namespace: "default".into(),
            route: "shop".into(),
            rule: 0,
        }
    }

    /// HTTPRoute shop's rule 0 served `weights`, by policy `p` half way
    /// from `from` to `to`.
    fn at_half_way(
        weights: Weights,
        from: Weights,
        to: Weights,
        consistent_by: Option<ConsistentKey>,
    ) -> ServedShares {
        let mut served = ServedShares::default();
        served.rules.insert(
            rule(),
            ServedRule {
                policy: PolicyKey {
                    namespace: "default".into(),
                    name: "p".into(),
                },
                phase: Phase::Progressing,
                step: crate::resources::Percent::parse("50%").ok(),
                weights,
                from,
                to,
                consistent_by,
            },
        );
        served
    }

    fn translate(served: &ServedShares) -> Translation {
        let options = TranslateOptions {
            default_bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        translate_served_at(
            &snapshot(MANIFESTS),
            &options,
            served,
            Timestamp::UNIX_EPOCH,
        )
    }

    #[test]
    fn inputs_carry_spec_weights_readiness_and_what_was_served() {
        let s = snapshot(MANIFESTS);
        let first = rollout_inputs(&s, &[]);
        assert_eq!(first.rules.len(), 1);
        let g = &first.rules[0];
        assert_eq!(g.rule, rule());
        assert_eq!(g.spec.get(&key("stable")), 3);
        assert_eq!(g.spec.get(&key("canary")), 1);
        assert_eq!(
            g.readiness,
            [
                (key("stable"), Readiness::Ready),
                (key("canary"), Readiness::NoReadyEndpoints)
            ]
        );
        assert_eq!(g.previously_served, None, "a first start");
        let t = translate(&ServedShares::default());
        let again = rollout_inputs(&s, &t.rules);
        let before = again.rules[0].previously_served.clone().expect("served");
        assert_eq!(
            (before.get(&key("stable")), before.get(&key("canary"))),
            (3, 1)
        );
    }

    #[test]
    fn a_governed_rule_is_served_its_rollout_weights_removed_backends_included() {
        let mut from = Weights::new();
        from.add(key("stable"), 1);
        from.add(key("old"), 1);
        let mut to = Weights::new();
        to.add(key("stable"), 3);
        to.add(key("canary"), 1);
        let mut weights = Weights::new();
        weights.add(key("stable"), 5);
        weights.add(key("canary"), 1);
        weights.add(key("old"), 2);
        let served = at_half_way(
            weights,
            from,
            to,
            Some(ConsistentKey::Header(http::HeaderName::from_static(
                "x-user",
            ))),
        );
        let t = translate(&served);
        let summary = &t.rules[0];
        let rollout = summary.rollout.as_ref().expect("governed");
        assert_eq!(
            (rollout.policy.as_str(), rollout.phase.as_str()),
            ("default/p", "Progressing")
        );
        let got: Vec<(&str, u32, Option<u64>, bool)> = summary
            .backends
            .iter()
            .map(|b| {
                (
                    b.name.as_str(),
                    b.weight,
                    b.served_weight,
                    b.removed_from_spec,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("default/stable:80", 3, Some(5), false),
                ("default/canary:80", 1, Some(1), false),
                ("default/old:80", 0, Some(2), true),
            ]
        );
        assert_eq!(summary.backends[2].served_percent, Some(25.0));
        // The table picks by the served weights, the removed backend too.
        let bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 8080);
        let Lookup::Matched(m) =
            t.table
                .lookup(bind, "x", &Method::GET, "/", None, &HeaderMap::new())
        else {
            panic!("the route matches");
        };
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..8 {
            if let BackendChoice::Backend(b) = m.rule.backends.choose() {
                *counts.entry(b.service.clone()).or_insert(0) += 1;
            }
        }
        assert_eq!(
            counts,
            [
                ("default/canary:80".to_string(), 1),
                ("default/old:80".to_string(), 2),
                ("default/stable:80".to_string(), 5)
            ]
            .into()
        );
        assert!(m.rule.backends.consistent().is_some());
        // A keyed request lands where its hash does, always the same.
        let mut keyed = HeaderMap::new();
        keyed.insert("x-user", HeaderValue::from_static("alice"));
        let pick = |h: &HeaderMap| match m.rule.backends.choose_for(h) {
            BackendChoice::Backend(b) => b.service.clone(),
            _ => String::new(),
        };
        let first = pick(&keyed);
        assert!((0..20).all(|_| pick(&keyed) == first));
    }

    /// A GRPCRoute `shop` (on a Gateway of its own) next to HTTPRoute
    /// `shop`, with other weights.
    const GRPC_SHOP: &str = "
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: grpc}
spec:
  gatewayClassName: sluice
  listeners: [{name: grpc, port: 9090, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: shop}
spec:
  parentRefs: [{name: grpc}]
  rules:
  - backendRefs:
    - {name: stable, port: 80, weight: 1}
    - {name: old, port: 80, weight: 7}
";

    #[test]
    fn a_grpcroute_of_the_same_name_is_neither_governed_nor_read_as_served() {
        let s = snapshot(&format!("{MANIFESTS}{GRPC_SHOP}"));
        let options = TranslateOptions {
            default_bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        let t = translate_served_at(
            &s,
            &options,
            &ServedShares::default(),
            Timestamp::UNIX_EPOCH,
        );
        let kinds: Vec<(&str, &str)> = t
            .rules
            .iter()
            .map(|r| (r.kind.as_str(), r.route.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [("GRPCRoute", "default/shop"), ("HTTPRoute", "default/shop")]
        );
        // What the HTTPRoute's rule served is read from its own summary.
        let inputs = rollout_inputs(&s, &t.rules);
        assert_eq!(inputs.rules.len(), 1);
        assert_eq!(inputs.rules[0].rule, rule());
        let before = inputs.rules[0].previously_served.clone().expect("served");
        assert_eq!(
            (
                before.get(&key("stable")),
                before.get(&key("canary")),
                before.get(&key("old"))
            ),
            (3, 1, 0)
        );
        // The HTTPRoute rule's served shares are not the GRPCRoute's.
        let mut weights = Weights::new();
        weights.add(key("stable"), 1);
        weights.add(key("canary"), 1);
        let served = at_half_way(weights.clone(), Weights::new(), weights, None);
        let t = translate_served_at(&s, &options, &served, Timestamp::UNIX_EPOCH);
        let (grpc, http) = (&t.rules[0], &t.rules[1]);
        assert!(grpc.rollout.is_none());
        assert!(grpc.backends.iter().all(|b| b.served_weight.is_none()));
        assert!(http.rollout.is_some());
        let served: Vec<Option<u64>> = http.backends.iter().map(|b| b.served_weight).collect();
        assert_eq!(served, [Some(1), Some(1)]);
    }

    #[test]
    fn ungoverned_rules_keep_their_spec_split() {
        let t = translate(&ServedShares::default());
        assert!(t.rules[0].rollout.is_none());
        assert!(
            t.rules[0]
                .backends
                .iter()
                .all(|b| b.served_weight.is_none())
        );
    }
}
