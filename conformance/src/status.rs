//! Status expectations: read what sluice publishes for an object and check
//! it as the suite's `kubernetes` helpers do (`GatewayMustHaveCondition`,
//! `HTTPRouteMustHaveParents`, `ListenerSetStatusMustHaveListeners`, ...),
//! polling until the expectation holds, since a change to the manifests
//! reaches the status after a debounced reload.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use serde_json::Value as Json;

use crate::ctx::Ctx;

/// How long a status expectation may take to hold (reloads are
/// debounced); the first configuration is applied before a test starts.
const STATUS_DEADLINE: Duration = Duration::from_secs(10);

/// One object's published status.
#[derive(Debug, Clone)]
pub struct Status {
    pub generation: i64,
    pub status: Json,
}

/// `type` condition with `status` and (unless empty) `reason` in a list.
pub fn has_condition(conditions: &Json, ty: &str, status: &str, reason: &str) -> bool {
    conditions.as_array().is_some_and(|list| {
        list.iter().any(|c| {
            c["type"] == ty && c["status"] == status && (reason.is_empty() || c["reason"] == reason)
        })
    })
}

/// Every condition's observedGeneration is the object's generation.
pub fn fresh(s: &Status, conditions: &Json) -> anyhow::Result<()> {
    for c in conditions.as_array().into_iter().flatten() {
        if c["observedGeneration"].as_i64() != Some(s.generation) {
            bail!(
                "condition {} has observedGeneration {}, generation is {}",
                c["type"],
                c["observedGeneration"],
                s.generation
            );
        }
    }
    Ok(())
}

/// The route's parent status for `gateway` (`ns/name`), section optional.
pub fn route_parent<'a>(
    route_ns: &str,
    status: &'a Json,
    gateway: &str,
    section: Option<&str>,
) -> Option<&'a Json> {
    status["parents"].as_array()?.iter().find(|p| {
        let r = &p["parentRef"];
        let ns = r["namespace"].as_str().unwrap_or(route_ns);
        let id = format!("{ns}/{}", r["name"].as_str().unwrap_or(""));
        id == gateway
            && r["group"] == GATEWAY_GROUP
            && r["kind"] == "Gateway"
            && p["controllerName"] == sluice::resources::CONTROLLER_NAME
            && section.is_none_or(|s| r["sectionName"] == s)
    })
}

/// An expected `parents[]` entry of a route status.
#[derive(Debug, Clone)]
pub struct ParentExpect {
    pub gateway: String,
    pub section: Option<String>,
    pub port: Option<u16>,
    pub conditions: Vec<(String, String, String)>,
}

pub fn parent(gateway: &str) -> ParentExpect {
    ParentExpect {
        gateway: gateway.to_owned(),
        section: None,
        port: None,
        conditions: Vec::new(),
    }
}

impl ParentExpect {
    pub fn cond(mut self, ty: &str, status: bool, reason: &str) -> Self {
        let status = if status { "True" } else { "False" };
        self.conditions
            .push((ty.to_owned(), status.to_owned(), reason.to_owned()));
        self
    }
}

impl Ctx<'_> {
    /// The status of `kind` `ns/name`, if sluice reports it.
    pub fn status_of(&self, kind: &str, id: &str) -> Option<Status> {
        let published = self.gateway.published();
        published.status.objects.iter().find_map(|o| {
            let ns = o.metadata.namespace.as_deref().unwrap_or("");
            let this = if ns.is_empty() {
                o.metadata.name.clone()
            } else {
                format!("{ns}/{}", o.metadata.name)
            };
            (o.kind == kind && this == id).then(|| Status {
                generation: o.metadata.generation,
                status: o.status.clone(),
            })
        })
    }

    /// Poll `check` until it holds or the deadline passes (its last error).
    pub async fn eventually<F>(&self, what: &str, mut check: F) -> anyhow::Result<()>
    where
        F: FnMut(&Self) -> anyhow::Result<()>,
    {
        let deadline = Instant::now() + STATUS_DEADLINE;
        loop {
            match check(self) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!("{what} (waited {STATUS_DEADLINE:?})")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
            }
        }
    }

    pub fn require(&self, kind: &str, id: &str) -> anyhow::Result<Status> {
        self.status_of(kind, id)
            .ok_or_else(|| anyhow!("no status for {kind} {id}"))
    }

    /// `GatewayAndHTTPRoutesMustBeAccepted`: the Gateway's conditions are
    /// fresh and it has an address; each route has a parent status for it
    /// from our controller with `Accepted=True`.
    pub async fn accepted(&self, gateway: &str, routes: &[&str]) -> anyhow::Result<()> {
        self.accepted_kind("HTTPRoute", gateway, routes).await
    }

    /// [`Self::accepted`] for routes of `kind` (`GatewayAndRoutesMustBeAccepted`
    /// with a GRPCRoute, `GatewayAndTLSRoutesMustBeAccepted`).
    pub async fn accepted_kind(
        &self,
        kind: &str,
        gateway: &str,
        routes: &[&str],
    ) -> anyhow::Result<()> {
        self.eventually(&format!("Gateway and {kind}s accepted"), |cx| {
            let gw = cx.require("Gateway", gateway)?;
            fresh(&gw, &gw.status["conditions"])?;
            let has_address = gw.status["addresses"]
                .as_array()
                .is_some_and(|a| a.iter().any(|a| a["type"].is_string()));
            if !has_address {
                bail!("Gateway {gateway} has no address in status");
            }
            for route in routes {
                let r = cx.require(kind, route)?;
                let ns = route.split('/').next().unwrap_or("");
                let p = route_parent(ns, &r.status, gateway, None)
                    .ok_or_else(|| anyhow!("{kind} {route} has no parent status for {gateway}"))?;
                if !has_condition(&p["conditions"], "Accepted", "True", "") {
                    bail!(
                        "{kind} {route} not Accepted by {gateway}: {}",
                        p["conditions"]
                    );
                }
                fresh(&r, &p["conditions"])?;
            }
            Ok(())
        })
        .await
    }

    /// `HTTPRouteMustHaveCondition` for the route's parent `gateway`.
    pub async fn route_condition(
        &self,
        route: &str,
        gateway: &str,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        self.route_condition_kind("HTTPRoute", route, gateway, ty, status, reason)
            .await
    }

    /// [`Self::route_condition`] for a route of `kind`
    /// (`TLSRouteMustHaveCondition`, ...).
    pub async fn route_condition_kind(
        &self,
        kind: &str,
        route: &str,
        gateway: &str,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let want = if status { "True" } else { "False" };
        self.eventually(&format!("{kind} {route} {ty}={want} {reason}"), |cx| {
            let r = cx.require(kind, route)?;
            let ns = route.split('/').next().unwrap_or("");
            let p = route_parent(ns, &r.status, gateway, None)
                .ok_or_else(|| anyhow!("{kind} {route} has no parent status for {gateway}"))?;
            fresh(&r, &p["conditions"])?;
            if !has_condition(&p["conditions"], ty, want, reason) {
                bail!("conditions are {}", p["conditions"]);
            }
            Ok(())
        })
        .await
    }

    /// `HTTPRouteMustHaveNoAcceptedParents`, `TLSRouteMustHaveNoAcceptedParents`:
    /// the route of `kind` has no parent status (judged after a second
    /// look, as the suite waits one poll for a status not yet written), or
    /// exactly one, fresh, with `Accepted=False`.
    pub async fn no_accepted_parents(&self, kind: &str, route: &str) -> anyhow::Result<()> {
        let mut seen_empty = false;
        let deadline = Instant::now() + STATUS_DEADLINE;
        loop {
            let outcome = (|| {
                let r = self.require(kind, route)?;
                let parents = r.status["parents"].as_array().cloned().unwrap_or_default();
                match parents.as_slice() {
                    [] if seen_empty => Ok(true),
                    [] => {
                        seen_empty = true;
                        Ok(false)
                    }
                    [p] => {
                        fresh(&r, &p["conditions"])?;
                        if has_condition(&p["conditions"], "Accepted", "False", "") {
                            Ok(true)
                        } else {
                            bail!("{kind} {route} parent conditions are {}", p["conditions"])
                        }
                    }
                    _ => bail!("{kind} {route} has {} parents: {}", parents.len(), r.status),
                }
            })();
            match outcome {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!("{kind} {route} has no accepted parents")));
                }
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// `GatewayMustHaveZeroRoutes`: fresh conditions, and no listener in
    /// status, or exactly one with no attached route.
    pub async fn zero_routes(&self, gateway: &str) -> anyhow::Result<()> {
        self.eventually(&format!("Gateway {gateway} has zero routes"), |cx| {
            let gw = cx.require("Gateway", gateway)?;
            fresh(&gw, &gw.status["conditions"])?;
            let listeners = gw.status["listeners"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            match listeners.as_slice() {
                [] => Ok(()),
                [l] if l["attachedRoutes"].as_i64() == Some(0) => Ok(()),
                _ => bail!("listeners are {}", gw.status["listeners"]),
            }
        })
        .await
    }

    /// `HTTPRouteMustHaveResolvedRefsConditionsTrue`.
    pub async fn resolved(&self, route: &str, gateway: &str) -> anyhow::Result<()> {
        self.route_condition(route, gateway, "ResolvedRefs", true, "ResolvedRefs")
            .await
    }

    /// `TLSRouteMustHaveResolvedRefsConditionsTrue` and its kin.
    pub async fn resolved_kind(
        &self,
        kind: &str,
        route: &str,
        gateway: &str,
    ) -> anyhow::Result<()> {
        self.route_condition_kind(kind, route, gateway, "ResolvedRefs", true, "ResolvedRefs")
            .await
    }

    /// `HTTPRouteMustHaveParents`: exactly these parents (Gateways: group
    /// and kind compared by value, as `parentsForRouteMatch` does), each
    /// with at least the given conditions.
    pub async fn route_parents(&self, route: &str, want: &[ParentExpect]) -> anyhow::Result<()> {
        self.eventually(&format!("HTTPRoute {route} parents"), |cx| {
            let r = cx.require("HTTPRoute", route)?;
            let ns = route.split('/').next().unwrap_or("");
            let got = r.status["parents"].as_array().cloned().unwrap_or_default();
            if got.len() != want.len() {
                bail!(
                    "{} parents, expected {}: {}",
                    got.len(),
                    want.len(),
                    r.status
                );
            }
            for w in want {
                let found = got.iter().any(|p| {
                    let rf = &p["parentRef"];
                    let pns = rf["namespace"].as_str().unwrap_or(ns);
                    let id = format!("{pns}/{}", rf["name"].as_str().unwrap_or(""));
                    let port_ok = match w.port {
                        None => rf["port"].is_null(),
                        Some(port) => {
                            rf["port"].as_u64().and_then(|p| {
                                u16::try_from(p)
                                    .ok()
                                    .and_then(|p| cx.ports.original(p).or(Some(p)))
                            }) == Some(port)
                        }
                    };
                    id == w.gateway
                        && rf["group"] == GATEWAY_GROUP
                        && rf["kind"] == "Gateway"
                        && p["controllerName"] == sluice::resources::CONTROLLER_NAME
                        && rf["sectionName"].as_str() == w.section.as_deref()
                        && port_ok
                        && fresh(&r, &p["conditions"]).is_ok()
                        && w.conditions
                            .iter()
                            .all(|(t, s, re)| has_condition(&p["conditions"], t, s, re))
                });
                if !found {
                    bail!("no parent matching {w:?} in {}", r.status);
                }
            }
            Ok(())
        })
        .await
    }

    /// `GatewayMustHaveCondition`.
    pub async fn gateway_condition(
        &self,
        gateway: &str,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let want = if status { "True" } else { "False" };
        self.eventually(&format!("Gateway {gateway} {ty}={want} {reason}"), |cx| {
            let gw = cx.require("Gateway", gateway)?;
            fresh(&gw, &gw.status["conditions"])?;
            if !has_condition(&gw.status["conditions"], ty, want, reason) {
                bail!("conditions are {}", gw.status["conditions"]);
            }
            Ok(())
        })
        .await
    }

    /// `GatewayListenersMustHaveConditions` for one listener (all when None).
    pub async fn listener_condition(
        &self,
        gateway: &str,
        listener: Option<&str>,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let want = if status { "True" } else { "False" };
        self.eventually(
            &format!("Gateway {gateway} listener {listener:?} {ty}={want} {reason}"),
            |cx| {
                let gw = cx.require("Gateway", gateway)?;
                let listeners = gw.status["listeners"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let mut seen = false;
                for l in &listeners {
                    if listener.is_some_and(|n| l["name"] != n) {
                        continue;
                    }
                    seen = true;
                    fresh(&gw, &l["conditions"])?;
                    if !has_condition(&l["conditions"], ty, want, reason) {
                        bail!("listener {} conditions are {}", l["name"], l["conditions"]);
                    }
                }
                if !seen {
                    bail!("no listener status for {listener:?}");
                }
                Ok(())
            },
        )
        .await
    }

    /// A listener's `attachedRoutes`.
    pub async fn attached_routes(
        &self,
        gateway: &str,
        listener: &str,
        want: i64,
    ) -> anyhow::Result<()> {
        self.eventually(
            &format!("Gateway {gateway} listener {listener} attachedRoutes"),
            |cx| {
                let gw = cx.require("Gateway", gateway)?;
                let l = gw.status["listeners"]
                    .as_array()
                    .and_then(|ls| ls.iter().find(|l| l["name"] == listener))
                    .ok_or_else(|| anyhow!("no listener status {listener}"))?;
                if l["attachedRoutes"].as_i64() != Some(want) {
                    bail!("attachedRoutes is {}, expected {want}", l["attachedRoutes"]);
                }
                Ok(())
            },
        )
        .await
    }

    /// A listener's `supportedKinds` hold at least these kinds (in the
    /// Gateway API group), as `GatewayStatusMustHaveListeners` compares
    /// them: an implementation may support more kinds than a test names.
    pub async fn supported_kinds(
        &self,
        gateway: &str,
        listener: &str,
        want: &[&str],
    ) -> anyhow::Result<()> {
        self.eventually(
            &format!("Gateway {gateway} listener {listener} supportedKinds"),
            |cx| {
                let gw = cx.require("Gateway", gateway)?;
                let l = gw.status["listeners"]
                    .as_array()
                    .and_then(|ls| ls.iter().find(|l| l["name"] == listener))
                    .ok_or_else(|| anyhow!("no listener status {listener}"))?;
                let w = ListenerExpect {
                    name: listener.to_owned(),
                    kinds: want.iter().map(|k| (*k).to_owned()).collect(),
                    attached: 0,
                    conditions: Vec::new(),
                };
                supported_kinds_match(l, &w)
            },
        )
        .await
    }
}

/// An expected `status.listeners[]` entry (`GatewayStatusMustHaveListeners`).
#[derive(Debug, Clone)]
pub struct ListenerExpect {
    pub name: String,
    pub kinds: Vec<String>,
    pub attached: i64,
    pub conditions: Vec<(String, String, String)>,
}

/// A listener with kinds `[HTTPRoute]`, `attached` routes, Accepted and
/// ResolvedRefs True (any reason): the suite's usual expectation.
pub fn listener(name: &str, attached: i64) -> ListenerExpect {
    ListenerExpect {
        name: name.to_owned(),
        kinds: vec!["HTTPRoute".to_owned()],
        attached,
        conditions: vec![
            ("Accepted".into(), "True".into(), String::new()),
            ("ResolvedRefs".into(), "True".into(), String::new()),
        ],
    }
}

/// `status.listeners` (`listeners`) are exactly `want`: each with at
/// least the expected supportedKinds, the attachedRoutes count and at
/// least the expected conditions.
fn listeners_match(listeners: &Json, want: &[ListenerExpect]) -> anyhow::Result<()> {
    let got = listeners.as_array().cloned().unwrap_or_default();
    if got.len() != want.len() {
        bail!(
            "{} listeners in status, expected {}: {listeners}",
            got.len(),
            want.len()
        );
    }
    for w in want {
        let l = got
            .iter()
            .find(|l| l["name"] == w.name.as_str())
            .ok_or_else(|| anyhow!("no listener status {}", w.name))?;
        supported_kinds_match(l, w)?;
        if l["attachedRoutes"].as_i64() != Some(w.attached) {
            bail!(
                "listener {}: attachedRoutes {}, expected {}",
                w.name,
                l["attachedRoutes"],
                w.attached
            );
        }
        for (t, s, r) in &w.conditions {
            if !has_condition(&l["conditions"], t, s, r) {
                bail!(
                    "listener {}: no {t}={s} {r} in {}",
                    w.name,
                    conditions_brief(&l["conditions"])
                );
            }
        }
    }
    Ok(())
}

/// Listener status `l`'s `supportedKinds` hold `w.kinds` (group
/// defaulted to Gateway API's), and none at all when none are expected:
/// the suite's rule for `GatewayStatusMustHaveListeners` and
/// `ListenerSetStatusMustHaveListeners` ("the implementation might support
/// more Kinds than defined in the test").
fn supported_kinds_match(l: &Json, w: &ListenerExpect) -> anyhow::Result<()> {
    let kinds: Vec<(&str, &str)> = l["supportedKinds"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|k| {
            (
                k["group"].as_str().unwrap_or(GATEWAY_GROUP),
                k["kind"].as_str().unwrap_or(""),
            )
        })
        .collect();
    if w.kinds.is_empty() && !kinds.is_empty() {
        bail!(
            "listener {}: supportedKinds {kinds:?}, expected none",
            w.name
        );
    }
    for kind in &w.kinds {
        if !kinds.contains(&(GATEWAY_GROUP, kind.as_str())) {
            bail!(
                "listener {}: supportedKinds {kinds:?} lack {GATEWAY_GROUP}/{kind} (expected at least {:?})",
                w.name,
                w.kinds
            );
        }
    }
    Ok(())
}

impl Ctx<'_> {
    /// `GatewayStatusMustHaveListeners`: exactly these listeners.
    pub async fn listeners(&self, gateway: &str, want: &[ListenerExpect]) -> anyhow::Result<()> {
        self.eventually(&format!("Gateway {gateway} listeners"), |cx| {
            let gw = cx.require("Gateway", gateway)?;
            listeners_match(&gw.status["listeners"], want)
        })
        .await
    }

    /// Generation of an object's published status.
    pub fn generation(&self, kind: &str, id: &str) -> anyhow::Result<i64> {
        Ok(self.require(kind, id)?.generation)
    }

    /// `*MustHaveLatestConditions`: all the object's conditions (top level,
    /// listeners, route parents) carry its generation, which is not `old`.
    pub async fn latest_conditions(
        &self,
        kind: &str,
        id: &str,
        old: Option<i64>,
    ) -> anyhow::Result<()> {
        self.eventually(
            &format!("{kind} {id} conditions at the latest generation"),
            |cx| {
                let s = cx.require(kind, id)?;
                if old == Some(s.generation) {
                    bail!("generation is still {}", s.generation);
                }
                fresh(&s, &s.status["conditions"])?;
                for l in s.status["listeners"].as_array().into_iter().flatten() {
                    fresh(&s, &l["conditions"])?;
                }
                for p in s.status["parents"].as_array().into_iter().flatten() {
                    fresh(&s, &p["conditions"])?;
                }
                for a in s.status["ancestors"].as_array().into_iter().flatten() {
                    fresh(&s, &a["conditions"])?;
                }
                Ok(())
            },
        )
        .await
    }

    /// `BackendTLSPolicyMustHaveCondition`: an ancestor of the policy naming
    /// `gateway` has the condition, and every ancestor's conditions carry the
    /// policy's generation.
    pub async fn policy_condition(
        &self,
        policy: &str,
        gateway: &str,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let want = if status { "True" } else { "False" };
        let (gw_ns, gw_name) = gateway.split_once('/').unwrap_or(("", gateway));
        self.eventually(
            &format!("BackendTLSPolicy {policy} {ty}={want} {reason} for {gateway}"),
            |cx| {
                let s = cx
                    .status_of("BackendTLSPolicy", policy)
                    .ok_or_else(|| anyhow!("no status for BackendTLSPolicy {policy}"))?;
                let ancestors = s.status["ancestors"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for a in &ancestors {
                    fresh(&s, &a["conditions"])?;
                }
                let found = ancestors.iter().any(|a| {
                    let r = &a["ancestorRef"];
                    r["name"] == gw_name
                        && r["namespace"].as_str().is_none_or(|ns| ns == gw_ns)
                        && has_condition(&a["conditions"], ty, want, reason)
                });
                if !found {
                    bail!("ancestors are {}", s.status["ancestors"]);
                }
                Ok(())
            },
        )
        .await
    }
}

// ---- ListenerSet status (GEP-1713), as the suite's kubernetes helpers read it ----

/// The API group of Gateway API kinds: what an omitted group means in a
/// parentRef or a supportedKinds entry.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// An expected condition: type, status, reason ("" means any reason).
pub type Cond = (&'static str, bool, &'static str);

fn status_word(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Conditions as `type=status reason` items (what a failure shows).
pub fn conditions_brief(conditions: &Json) -> String {
    let items: Vec<String> = conditions
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={} {}",
                c["type"].as_str().unwrap_or("?"),
                c["status"].as_str().unwrap_or("?"),
                c["reason"].as_str().unwrap_or("")
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}

/// The first of `conds` missing from `conditions`, as `type=status reason`.
fn missing_condition(conditions: &Json, conds: &[Cond]) -> Option<String> {
    conds.iter().find_map(|(ty, status, reason)| {
        (!has_condition(conditions, ty, status_word(*status), reason))
            .then(|| format!("{ty}={} {reason}", status_word(*status)))
    })
}

/// Whether a route status `parentRef` names `kind` `parent` (`ns/name`) as
/// the suite's `parentsForRouteMatch` compares them: group and kind by
/// value (the suite's expected parents spell them out, and a cluster's
/// stored parentRefs carry them: the CRD defaults them, so an omitted one
/// does not match), name, and namespace; an omitted namespace matches only
/// when `namespace_required` is false. The sectionName is not compared.
pub fn parent_ref_is(
    parent_ref: &Json,
    kind: &str,
    parent: &str,
    namespace_required: bool,
) -> bool {
    let (ns, name) = parent.split_once('/').unwrap_or(("", parent));
    let ns_ok = match parent_ref["namespace"].as_str() {
        Some(actual) => actual == ns,
        None => !namespace_required,
    };
    parent_ref["group"] == GATEWAY_GROUP
        && parent_ref["kind"] == kind
        && parent_ref["name"] == name
        && ns_ok
}

impl Ctx<'_> {
    /// `ListenerSetMustHaveCondition`: the ListenerSet's conditions are
    /// fresh and include this one.
    pub async fn listener_set_condition(
        &self,
        listener_set: &str,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let want = status_word(status);
        self.eventually(
            &format!("ListenerSet {listener_set} {ty}={want} {reason}"),
            |cx| {
                let ls = cx.require("ListenerSet", listener_set)?;
                fresh(&ls, &ls.status["conditions"])?;
                if !has_condition(&ls.status["conditions"], ty, want, reason) {
                    bail!(
                        "conditions are {}",
                        conditions_brief(&ls.status["conditions"])
                    );
                }
                Ok(())
            },
        )
        .await
    }

    /// `ListenerSetListenersMustHaveConditions`: the ListenerSet's
    /// conditions are fresh, and each of `listeners` (every listener in
    /// status when empty) has all of `conds`.
    pub async fn listener_set_listener_conditions(
        &self,
        listener_set: &str,
        listeners: &[&str],
        conds: &[Cond],
    ) -> anyhow::Result<()> {
        self.eventually(
            &format!("ListenerSet {listener_set} listeners {listeners:?}"),
            |cx| {
                let ls = cx.require("ListenerSet", listener_set)?;
                fresh(&ls, &ls.status["conditions"])?;
                listeners_have(&ls.status, listeners, conds)
            },
        )
        .await
    }

    /// `GatewayListenersMustHaveConditions` with several conditions: each
    /// of `listeners` (every listener when empty) has all of `conds`.
    pub async fn gateway_listener_conditions(
        &self,
        gateway: &str,
        listeners: &[&str],
        conds: &[Cond],
    ) -> anyhow::Result<()> {
        self.eventually(
            &format!("Gateway {gateway} listeners {listeners:?}"),
            |cx| {
                let gw = cx.require("Gateway", gateway)?;
                listeners_have(&gw.status, listeners, conds)
            },
        )
        .await
    }

    /// `ListenerSetStatusMustHaveListeners`: the ListenerSet's conditions
    /// are fresh and its `status.listeners` are exactly these: each with
    /// at least the expected supportedKinds (group defaulted), the
    /// attachedRoutes count and at least the expected conditions.
    pub async fn listener_set_listeners(
        &self,
        listener_set: &str,
        want: &[ListenerExpect],
    ) -> anyhow::Result<()> {
        self.eventually(&format!("ListenerSet {listener_set} listeners"), |cx| {
            let ls = cx.require("ListenerSet", listener_set)?;
            fresh(&ls, &ls.status["conditions"])?;
            listeners_match(&ls.status["listeners"], want)
        })
        .await
    }

    /// `GatewayMustHaveAttachedListeners`: the Gateway's conditions are
    /// fresh and `status.attachedListenerSets` (absent: 0) is `want`.
    pub async fn attached_listener_sets(&self, gateway: &str, want: i64) -> anyhow::Result<()> {
        self.eventually(
            &format!("Gateway {gateway} attachedListenerSets {want}"),
            |cx| {
                let gw = cx.require("Gateway", gateway)?;
                fresh(&gw, &gw.status["conditions"])?;
                let got = gw.status["attachedListenerSets"].as_i64().unwrap_or(0);
                if got != want {
                    bail!(
                        "attachedListenerSets is {}, expected {want}",
                        gw.status["attachedListenerSets"]
                    );
                }
                Ok(())
            },
        )
        .await
    }

    /// `HTTPRouteMustHaveCondition` as the suite makes it: every parent's
    /// conditions are fresh, and a parent named like `parent` (`ns/name`,
    /// any kind; an omitted namespace matches) has the condition.
    pub async fn route_parent_condition(
        &self,
        route: &str,
        parent: &str,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let want = status_word(status);
        let (ns, name) = parent.split_once('/').unwrap_or(("", parent));
        self.eventually(
            &format!("HTTPRoute {route} parent {parent} {ty}={want} {reason}"),
            |cx| {
                let r = cx.require("HTTPRoute", route)?;
                let parents = r.status["parents"].as_array().cloned().unwrap_or_default();
                for p in &parents {
                    fresh(&r, &p["conditions"])?;
                }
                let named: Vec<&Json> = parents
                    .iter()
                    .filter(|p| {
                        let rf = &p["parentRef"];
                        rf["name"] == name && rf["namespace"].as_str().is_none_or(|n| n == ns)
                    })
                    .collect();
                if named.is_empty() {
                    bail!("no parent status named {parent} in {}", r.status);
                }
                if !named
                    .iter()
                    .any(|p| has_condition(&p["conditions"], ty, want, reason))
                {
                    let got: Vec<String> = named
                        .iter()
                        .map(|p| conditions_brief(&p["conditions"]))
                        .collect();
                    bail!("parent {parent} conditions are {}", got.join("; "));
                }
                Ok(())
            },
        )
        .await
    }

    /// `HTTPRouteMustHaveParents` for one expected parent: the route's
    /// status has a parent from our controller for `kind` `parent` with
    /// at least `conds` (more parents may be there, as upstream allows).
    pub async fn route_has_parent(
        &self,
        route: &str,
        kind: &str,
        parent: &str,
        namespace_required: bool,
        conds: &[Cond],
    ) -> anyhow::Result<()> {
        self.eventually(&format!("HTTPRoute {route} parent {kind} {parent}"), |cx| {
            let r = cx.require("HTTPRoute", route)?;
            let parents = r.status["parents"].as_array().cloned().unwrap_or_default();
            for p in &parents {
                fresh(&r, &p["conditions"])?;
            }
            let ok = parents.iter().any(|p| {
                p["controllerName"] == sluice::resources::CONTROLLER_NAME
                    && parent_ref_is(&p["parentRef"], kind, parent, namespace_required)
                    && missing_condition(&p["conditions"], conds).is_none()
            });
            if !ok {
                bail!("no parent {kind} {parent} with {conds:?} in {}", r.status);
            }
            Ok(())
        })
        .await
    }

    /// `RoutesAndParentMustBeAccepted` for a Gateway or a ListenerSet
    /// (`kind`): each route has a parent from our controller for it,
    /// `Accepted=True` reason `Accepted` (namespace required when the
    /// route lives elsewhere), and every listener of the parent is
    /// ResolvedRefs, Accepted and Programmed.
    pub async fn routes_and_parent_accepted(
        &self,
        kind: &str,
        parent: &str,
        routes: &[&str],
    ) -> anyhow::Result<()> {
        let parent_ns = parent.split('/').next().unwrap_or("");
        for route in routes {
            let route_ns = route.split('/').next().unwrap_or("");
            self.route_has_parent(
                route,
                kind,
                parent,
                route_ns != parent_ns,
                &[("Accepted", true, "Accepted")],
            )
            .await?;
        }
        const READY: &[Cond] = &[
            ("ResolvedRefs", true, ""),
            ("Accepted", true, ""),
            ("Programmed", true, ""),
        ];
        if kind == "ListenerSet" {
            self.listener_set_listener_conditions(parent, &[], READY)
                .await
        } else {
            self.gateway_listener_conditions(parent, &[], READY).await
        }
    }
}

/// Each of `listeners` (every one when empty) in `status.listeners` has
/// all of `conds`; a named listener missing from status is an error.
fn listeners_have(status: &Json, listeners: &[&str], conds: &[Cond]) -> anyhow::Result<()> {
    let got = status["listeners"].as_array().cloned().unwrap_or_default();
    for name in listeners {
        if !got.iter().any(|l| l["name"] == *name) {
            bail!("no listener status {name} in {}", status["listeners"]);
        }
    }
    for l in &got {
        let selected = listeners.is_empty() || listeners.iter().any(|n| l["name"] == *n);
        if !selected {
            continue;
        }
        if let Some(missing) = missing_condition(&l["conditions"], conds) {
            bail!(
                "listener {} has no {missing}: conditions are {}",
                l["name"],
                conditions_brief(&l["conditions"])
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_refs_compare_group_kind_and_namespace_like_the_suite() {
        let omitted = serde_json::json!({"name": "gw"});
        assert!(
            !parent_ref_is(&omitted, "Gateway", "infra/gw", false),
            "group and kind compare by value: omitted ones do not match"
        );
        let gateway = serde_json::json!({"group": GATEWAY_GROUP, "kind": "Gateway", "name": "gw"});
        assert!(
            parent_ref_is(&gateway, "Gateway", "infra/gw", false),
            "an omitted namespace matches when not required"
        );
        assert!(!parent_ref_is(&gateway, "Gateway", "infra/gw", true));
        assert!(!parent_ref_is(&gateway, "ListenerSet", "infra/gw", false));
        let ls = serde_json::json!({
            "group": GATEWAY_GROUP, "kind": "ListenerSet", "name": "ls", "namespace": "infra",
            "sectionName": "any",
        });
        assert!(parent_ref_is(&ls, "ListenerSet", "infra/ls", true));
        assert!(!parent_ref_is(&ls, "ListenerSet", "other/ls", false));
        assert!(!parent_ref_is(&ls, "Gateway", "infra/ls", false));
        let other_group =
            serde_json::json!({"group": "example.com", "kind": "ListenerSet", "name": "ls"});
        assert!(!parent_ref_is(
            &other_group,
            "ListenerSet",
            "infra/ls",
            false
        ));
    }

    #[test]
    fn listener_conditions_are_checked_on_the_named_listeners_or_all() {
        let status = serde_json::json!({"listeners": [
            {"name": "a", "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]},
            {"name": "b", "conditions": [{"type": "Accepted", "status": "False", "reason": "HostnameConflict"}]},
        ]});
        let accepted: &[Cond] = &[("Accepted", true, "")];
        assert!(listeners_have(&status, &["a"], accepted).is_ok());
        assert!(
            listeners_have(&status, &[], accepted).is_err(),
            "b is not accepted"
        );
        assert!(
            listeners_have(&status, &["b"], &[("Accepted", false, "HostnameConflict")]).is_ok()
        );
        assert!(
            listeners_have(&status, &["b"], &[("Accepted", false, "ProtocolConflict")]).is_err()
        );
        assert!(
            listeners_have(&status, &["c"], accepted).is_err(),
            "a named listener must be in status"
        );
        assert!(
            listeners_have(&serde_json::json!({}), &[], accepted).is_ok(),
            "no listeners: nothing to check, as upstream"
        );
    }
}
