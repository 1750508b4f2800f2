//! ListenerSet tests (`ListenerSet*`, GEP-1713): listeners that a
//! ListenerSet attaches to a parent Gateway, their status, and routes
//! attached to them.
//!
//! Expectations come from the upstream v1.6.1 tests
//! (`conformance/tests/listenerset-*.go`); each fn here makes the same
//! status checks and requests, in the same order, failing at the first
//! expectation that does not hold. The requests go to the parent Gateway's
//! address (a ListenerSet's listeners are served there, see `env`).

use anyhow::anyhow;

use crate::ctx::{Ctx, infra};
use crate::expect::{Case, req};
use crate::status::{Cond, ListenerExpect};

/// The suite's `generateAcceptedListenerConditions`.
const LISTENER_READY: &[Cond] = &[
    ("ResolvedRefs", true, ""),
    ("Accepted", true, ""),
    ("Programmed", true, ""),
];

/// A listener that lost a conflict (`reason` HostnameConflict or
/// ProtocolConflict) to a listener of higher precedence.
fn conflicted(reason: &'static str) -> [Cond; 3] {
    [
        ("Accepted", false, reason),
        ("Programmed", false, reason),
        ("Conflicted", true, reason),
    ]
}

/// An expected ListenerSet listener status: supportedKinds including
/// HTTPRoute (the suite's `generateSupportedRouteKinds`), `attached`
/// routes, and the ready conditions.
///
/// Earlier revisions of the suite also required GRPCRoute in
/// supportedKinds; kubernetes-sigs/gateway-api#4805 (merged before v1.6,
/// backported to release-1.5) dropped it, since these tests use no
/// GRPCRoute and a listener must not list a kind its implementation does
/// not support.
fn ready_listener(name: &str, attached: i64) -> ListenerExpect {
    ListenerExpect {
        name: name.to_owned(),
        kinds: vec!["HTTPRoute".to_owned()],
        attached,
        conditions: LISTENER_READY
            .iter()
            .map(|(t, s, r)| {
                let s = if *s { "True" } else { "False" };
                ((*t).to_owned(), s.to_owned(), (*r).to_owned())
            })
            .collect(),
    }
}

/// A request through `gateway` for `host` and `path`, answered by
/// `backend` in the infra namespace.
fn to(gateway: &str, host: &str, path: &str, backend: &str) -> Case {
    req(gateway, path).host(host).infra(backend)
}

/// A request through `gateway` for `host` and `path` that no route serves.
fn not_found(gateway: &str, host: &str, path: &str) -> Case {
    req(gateway, path).host(host).status(404)
}

/// Expect every case, all at once (as the suite's parallel subtests);
/// fail with all the mismatches.
async fn requests(cx: &Ctx<'_>, cases: &[Case]) -> anyhow::Result<()> {
    let errors: Vec<String> =
        futures_util::future::join_all(cases.iter().map(|case| cx.expect(case)))
            .await
            .into_iter()
            .filter_map(|o| o.err().map(|e| format!("{e:#}")))
            .collect();
    if errors.is_empty() {
        return Ok(());
    }
    Err(anyhow!(
        "{} of {} requests: {}",
        errors.len(),
        cases.len(),
        errors.join("; ")
    ))
}

/// `WaitForGatewayAddress` then `GatewayMustHaveCondition` Accepted=True.
async fn gateway_accepted(cx: &Ctx<'_>, gateway: &str, address: bool) -> anyhow::Result<()> {
    if address {
        cx.accepted(gateway, &[]).await?;
    }
    cx.gateway_condition(gateway, "Accepted", true, "").await
}

/// A ListenerSet the Gateway does not allow: both of its conditions are
/// False with reason NotAllowed.
async fn rejected_not_allowed(cx: &Ctx<'_>, listener_set: &str) -> anyhow::Result<()> {
    cx.listener_set_condition(listener_set, "Accepted", false, "NotAllowed")
        .await?;
    cx.listener_set_condition(listener_set, "Programmed", false, "NotAllowed")
        .await
}

/// ListenerSetAllowedNamespaceNone and ListenerSetDefaultNotAllowed: a
/// Gateway whose `allowedListeners` is None (or unset, which means None)
/// attaches no ListenerSet, and the ListenerSet says NotAllowed.
pub async fn not_allowed(cx: &Ctx<'_>, gateway: &str, listener_set: &str) -> anyhow::Result<()> {
    let gw = infra(gateway);
    gateway_accepted(cx, &gw, false).await?;
    cx.attached_listener_sets(&gw, 0).await?;
    rejected_not_allowed(cx, listener_set).await
}

/// ListenerSetAllowedNamespaceSame and ListenerSetAllowedNamespaceSelector:
/// the ListenerSet in an allowed namespace is attached, Accepted and
/// Programmed with a ready listener; the one elsewhere is NotAllowed.
pub async fn allowed_namespaces(
    cx: &Ctx<'_>,
    gateway: &str,
    (allowed, listener): (&str, &str),
    disallowed: &str,
) -> anyhow::Result<()> {
    let gw = infra(gateway);
    gateway_accepted(cx, &gw, false).await?;
    cx.attached_listener_sets(&gw, 1).await?;
    cx.listener_set_condition(allowed, "Accepted", true, "Accepted")
        .await?;
    cx.listener_set_condition(allowed, "Programmed", true, "Programmed")
        .await?;
    cx.listener_set_listener_conditions(allowed, &[listener], LISTENER_READY)
        .await?;
    rejected_not_allowed(cx, disallowed).await
}

pub async fn allowed_routes_namespaces(cx: &Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-with-listener-sets-test-allowed-routes");
    gateway_accepted(cx, &gw, true).await?;
    cx.attached_listener_sets(&gw, 2).await?;

    // Same-namespace ListenerSet: one listener per allowedRoutes.namespaces.from.
    let ls = infra("listenerset-test-allowed-routes-namespaces");
    cx.routes_and_parent_accepted(
        "ListenerSet",
        &ls,
        &[
            &infra("route-in-same-namespace"),
            "gateway-api-routes-allowed-ns/route-in-selected-namespace",
            "gateway-api-routes-not-allowed-ns/route-not-in-selected-namespace",
        ],
    )
    .await?;
    cx.listener_set_listeners(
        &ls,
        &[
            ready_listener("listener-set-listener-allowed-routes-all", 3),
            ready_listener("listener-set-listener-allowed-routes-same", 1),
            ready_listener("listener-set-listener-allowed-routes-selector", 1),
        ],
    )
    .await?;
    let all = "listener-set-listener-allowed-routes-all.com";
    let same = "listener-set-listener-allowed-routes-same.com";
    let selector = "listener-set-listener-allowed-routes-selector.com";
    requests(
        cx,
        &[
            to(&gw, all, "/route-in-same-namespace", "infra-backend-v1"),
            to(&gw, all, "/route-in-selected-namespace", "infra-backend-v2"),
            to(
                &gw,
                all,
                "/route-not-in-selected-namespace",
                "infra-backend-v3",
            ),
            to(&gw, same, "/route-in-same-namespace", "infra-backend-v1"),
            not_found(&gw, same, "/route-in-selected-namespace"),
            not_found(&gw, same, "/route-not-in-selected-namespace"),
            not_found(&gw, selector, "/route-in-same-namespace"),
            to(
                &gw,
                selector,
                "/route-in-selected-namespace",
                "infra-backend-v2",
            ),
            not_found(&gw, selector, "/route-not-in-selected-namespace"),
        ],
    )
    .await?;

    // Cross-namespace ListenerSet: `from: Same` means the ListenerSet's
    // namespace, not the Gateway's.
    let ls = "gateway-api-ls-cross-ns/listenerset-test-allowed-routes-cross-ns";
    cx.routes_and_parent_accepted(
        "ListenerSet",
        ls,
        &["gateway-api-ls-cross-ns/route-in-listenerset-namespace"],
    )
    .await?;
    cx.route_parent_condition(
        &infra("route-in-gateway-namespace"),
        ls,
        "Accepted",
        false,
        "NotAllowedByListeners",
    )
    .await?;
    cx.listener_set_listeners(
        ls,
        &[ready_listener(
            "listener-set-listener-allowed-routes-cross-ns-same",
            1,
        )],
    )
    .await?;
    let host = "listener-set-listener-allowed-routes-cross-ns-same.com";
    requests(
        cx,
        &[
            to(
                &gw,
                host,
                "/route-in-listenerset-namespace",
                "infra-backend-v1",
            ),
            not_found(&gw, host, "/route-in-gateway-namespace"),
        ],
    )
    .await
}

/// A TLS Passthrough listener that only allows HTTPRoute has no route kind
/// it can carry: ResolvedRefs=False InvalidRouteKinds.
pub async fn allowed_routes_supported_kinds(cx: &Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-with-listener-sets-test-supported-route-kinds");
    gateway_accepted(cx, &gw, false).await?;
    cx.listener_set_listener_conditions(
        &infra("listenerset-test-allowed-routes-supported-kinds"),
        &["listener-set-listener-allowed-routes-tls-only"],
        &[("ResolvedRefs", false, "InvalidRouteKinds")],
    )
    .await
}

/// A route with a Gateway and a ListenerSet parentRef gets each accepted
/// on its own: a sectionName that only the ListenerSet has rejects the
/// Gateway parentRef and not the other.
pub async fn dual_parent_ref_independence(cx: &Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-dual-parentref");
    gateway_accepted(cx, &gw, true).await?;
    cx.attached_listener_sets(&gw, 1).await?;
    let ls = infra("ls-dual-parentref");
    cx.listener_set_listeners(&ls, &[ready_listener("ls-dual-parentref-listener", 2)])
        .await?;

    let both = infra("route-dual-parentref-both");
    cx.route_parent_condition(&both, &gw, "Accepted", true, "")
        .await?;
    cx.route_parent_condition(&both, &ls, "Accepted", true, "")
        .await?;
    requests(
        cx,
        &[
            to(&gw, "gw-dual.com", "/dualboth", "infra-backend-v1"),
            to(&gw, "ls-dual.com", "/dualboth", "infra-backend-v1"),
        ],
    )
    .await?;

    let one = infra("route-dual-parentref-one");
    cx.route_parent_condition(&one, &gw, "Accepted", false, "NoMatchingParent")
        .await?;
    cx.route_parent_condition(&one, &ls, "Accepted", true, "")
        .await?;
    cx.routes_and_parent_accepted("ListenerSet", &ls, &[&one])
        .await?;
    requests(
        cx,
        &[
            to(&gw, "ls-dual.com", "/dualone", "infra-backend-v2"),
            not_found(&gw, "gw-dual.com", "/dualone"),
        ],
    )
    .await
}

/// A Gateway parentRef never reaches a ListenerSet's listener by
/// sectionName: NoMatchingParent.
pub async fn gateway_parent_section_not_found(cx: &Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-section-name");
    gateway_accepted(cx, &gw, true).await?;
    cx.attached_listener_sets(&gw, 1).await?;
    cx.routes_and_parent_accepted(
        "ListenerSet",
        &infra("listenerset-section-name"),
        &[&infra("route-via-listenerset")],
    )
    .await?;
    cx.route_parent_condition(
        &infra("route-via-gateway"),
        &gw,
        "Accepted",
        false,
        "NoMatchingParent",
    )
    .await?;
    requests(
        cx,
        &[
            to(
                &gw,
                "ls-section-name.com",
                "/goodsection",
                "infra-backend-v1",
            ),
            not_found(&gw, "gw-section.com", "/badsection"),
        ],
    )
    .await
}

/// ListenerSetHostnameConflict and ListenerSetProtocolConflict (same
/// layout, `what` is "hostname" or "protocol"): listener precedence is
/// Gateway listeners first, then ListenerSets by creation time and name.
/// A losing listener is Conflicted; a ListenerSet keeps Accepted while one
/// of its listeners is valid and is ListenersNotValid when none is.
pub async fn conflict(cx: &Ctx<'_>, what: &str, reason: &'static str) -> anyhow::Result<()> {
    let lost = conflicted(reason);
    let gw = infra(&format!("gateway-with-listenerset-{what}-conflict"));
    let with_gateway = format!("{what}-conflict-with-gateway-listener");
    let with_set = format!("{what}-conflict-with-listener-set-listener");
    gateway_accepted(cx, &gw, false).await?;
    cx.gateway_listener_conditions(&gw, &["gateway-listener"], LISTENER_READY)
        .await?;
    cx.gateway_listener_conditions(&gw, &[&with_gateway], LISTENER_READY)
        .await?;
    cx.attached_listener_sets(&gw, 2).await?;

    let ls = infra(&format!("listenerset-with-{what}-conflict-with-gateway-1"));
    keeps_valid_listeners(cx, &ls).await?;
    cx.listener_set_listener_conditions(&ls, &["listener-set-1-listener"], LISTENER_READY)
        .await?;
    cx.listener_set_listener_conditions(&ls, &[&with_gateway], &lost)
        .await?;
    cx.listener_set_listener_conditions(&ls, &[&with_set], LISTENER_READY)
        .await?;

    let ls = infra(&format!("listenerset-with-{what}-conflict-with-gateway-2"));
    no_valid_listener(cx, &ls).await?;
    cx.listener_set_listener_conditions(&ls, &[&with_gateway], &lost)
        .await?;

    let ls = infra(&format!(
        "listenerset-with-{what}-conflict-with-listener-set-1"
    ));
    keeps_valid_listeners(cx, &ls).await?;
    cx.listener_set_listener_conditions(&ls, &["listener-set-2-listener"], LISTENER_READY)
        .await?;
    cx.listener_set_listener_conditions(&ls, &[&with_set], &lost)
        .await?;

    let ls = infra(&format!(
        "listenerset-with-{what}-conflict-with-listener-set-2"
    ));
    no_valid_listener(cx, &ls).await?;
    cx.listener_set_listener_conditions(&ls, &[&with_set], &lost)
        .await
}

/// A ListenerSet with at least one valid listener: Accepted=True (any
/// reason), Programmed=True Programmed.
async fn keeps_valid_listeners(cx: &Ctx<'_>, listener_set: &str) -> anyhow::Result<()> {
    cx.listener_set_condition(listener_set, "Accepted", true, "")
        .await?;
    cx.listener_set_condition(listener_set, "Programmed", true, "Programmed")
        .await
}

/// A ListenerSet none of whose listeners is valid: Accepted and
/// Programmed False, ListenersNotValid.
async fn no_valid_listener(cx: &Ctx<'_>, listener_set: &str) -> anyhow::Result<()> {
    cx.listener_set_condition(listener_set, "Accepted", false, "ListenersNotValid")
        .await?;
    cx.listener_set_condition(listener_set, "Programmed", false, "ListenersNotValid")
        .await
}

pub async fn http_routing(cx: &Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-with-listener-sets-http-routing");
    let all_listeners = infra("attaches-to-all-listeners");
    // GatewayAndHTTPRoutesMustBeAccepted.
    cx.accepted(&gw, &[]).await?;
    cx.routes_and_parent_accepted(
        "Gateway",
        &gw,
        &[
            &all_listeners,
            &infra("gateway-route"),
            &infra("gateway-section-route"),
        ],
    )
    .await?;
    cx.attached_listener_sets(&gw, 2).await?;

    let ls1 = infra("listener-set-http-routing-1");
    cx.routes_and_parent_accepted(
        "ListenerSet",
        &ls1,
        &[
            &all_listeners,
            &infra("listener-set-http-routing-1-route"),
            &infra("listener-set-http-routing-1-section-route"),
        ],
    )
    .await?;
    cx.listener_set_listeners(
        &ls1,
        &[
            ready_listener("listener-set-http-routing-1-listener-1", 3),
            ready_listener("listener-set-http-routing-1-listener-2", 2),
        ],
    )
    .await?;

    let ls2 = infra("listener-set-http-routing-2");
    cx.routes_and_parent_accepted(
        "ListenerSet",
        &ls2,
        &[&all_listeners, &infra("listener-set-http-routing-2-route")],
    )
    .await?;
    cx.listener_set_listeners(
        &ls2,
        &[
            ready_listener("listener-set-http-routing-2-listener-1", 2),
            ready_listener("listener-set-http-routing-2-listener-2", 2),
        ],
    )
    .await?;

    // Each path is served on the hosts of the listeners its route attaches
    // to, and is a 404 on the others.
    let hosts = [
        "gateway-listener-1.com",
        "gateway-listener-2.com",
        "listener-set-http-routing-1-listener-1.com",
        "listener-set-http-routing-1-listener-2.com",
        "listener-set-http-routing-2-listener-1.com",
        "listener-set-http-routing-2-listener-2.com",
    ];
    let routes: [(&str, &str, &[usize]); 6] = [
        ("/route", "infra-backend-v1", &[0, 1, 2, 3, 4, 5]),
        ("/gateway-route", "infra-backend-v2", &[0, 1]),
        ("/gateway-section-route", "infra-backend-v3", &[0]),
        (
            "/listener-set-http-routing-1-route",
            "infra-backend-v2",
            &[2, 3],
        ),
        (
            "/listener-set-http-routing-1-section-route",
            "infra-backend-v3",
            &[2],
        ),
        (
            "/listener-set-http-routing-2-route",
            "infra-backend-v2",
            &[4, 5],
        ),
    ];
    let mut cases = Vec::new();
    for (path, backend, served) in routes {
        for (i, host) in hosts.iter().enumerate() {
            cases.push(if served.contains(&i) {
                to(&gw, host, path, backend)
            } else {
                not_found(&gw, host, path)
            });
        }
    }
    requests(cx, &cases).await
}

/// A ListenerSet listener's certificateRef to another namespace needs a
/// ReferenceGrant from ListenerSet; without one the listener is
/// RefNotPermitted and the ListenerSet has no valid listener.
pub async fn reference_grant(cx: &Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-with-listener-sets-test-reference-grant");
    gateway_accepted(cx, &gw, false).await?;
    let ls = infra("listenerset-with-reference-grant");
    cx.listener_set_condition(&ls, "Accepted", true, "").await?;
    cx.listener_set_condition(&ls, "Programmed", true, "")
        .await?;
    cx.listener_set_listener_conditions(
        &ls,
        &["listenerset-with-reference-grant-listener"],
        &[("ResolvedRefs", true, "")],
    )
    .await?;
    let ls =
        "gateway-api-listener-sets-test-reference-grant-ns/listenerset-without-reference-grant";
    no_valid_listener(cx, ls).await?;
    cx.listener_set_listener_conditions(
        ls,
        &["listenerset-without-reference-grant-listener"],
        &[("ResolvedRefs", false, "RefNotPermitted")],
    )
    .await
}

/// A route's status has parents for the parentRefs it declares only: a
/// Gateway parentRef does not reach the Gateway's ListenerSets, nor a
/// ListenerSet parentRef its Gateway.
pub async fn route_status_scoped_to_parent_ref(cx: &Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-parentref");
    gateway_accepted(cx, &gw, false).await?;
    cx.attached_listener_sets(&gw, 1).await?;
    let ls = infra("listenerset-parentref");
    cx.listener_set_listeners(&ls, &[ready_listener("listenerset-parentref-listener", 1)])
        .await?;

    let accepted: &[Cond] = &[("Accepted", true, "")];
    let gw_only = infra("route-parentref-gwonly");
    cx.route_parent_condition(&gw_only, &gw, "Accepted", true, "")
        .await?;
    cx.route_has_parent(&gw_only, "Gateway", &gw, true, accepted)
        .await?;

    let ls_only = infra("route-parentref-lsonly");
    cx.routes_and_parent_accepted("ListenerSet", &ls, &[&ls_only])
        .await?;
    cx.route_has_parent(&ls_only, "ListenerSet", &ls, true, accepted)
        .await
}
