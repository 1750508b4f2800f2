//! The checks of the GATEWAY-HTTP tests of Gateway API v1.6.1 on Gateways,
//! GatewayClasses and HTTPRoutes, one `async fn` each (some shared by
//! tests that differ only in their manifests); the registry
//! ([`crate::registry`]) names the test each one runs for.
//!
//! Expectations come from reading the upstream test code
//! (`conformance/tests/*.go` of kubernetes-sigs/gateway-api); the code here
//! is ours.

use anyhow::{anyhow, bail};

use anyhow::Context as _;

use crate::ctx::{APP, Ctx, INFRA, WEB, infra};
use crate::expect::{
    CONSECUTIVE_SUCCESSES, Case, MAX_TIME_TO_CONSISTENCY, backend_of, compare, converge, req,
    same_ns, within_five_points,
};
use crate::status::{ListenerExpect, listener, parent};

pub const SAME_NS: &str = "gateway-conformance-infra/same-namespace";

/// Accepted + ResolvedRefs for routes on a Gateway, as most tests start.
async fn ready(cx: &Ctx<'_>, gateway: &str, routes: &[&str]) -> anyhow::Result<()> {
    cx.accepted(gateway, routes).await?;
    for route in routes {
        cx.resolved(route, gateway).await?;
    }
    Ok(())
}

/// Expect every case, all at once (the suite runs a test's cases in
/// parallel); fail with all the mismatches.
async fn all(cx: &Ctx<'_>, cases: Vec<Case>) -> anyhow::Result<()> {
    let outcomes = futures_util::future::join_all(cases.iter().map(|case| cx.expect(case))).await;
    let errors: Vec<String> = outcomes
        .into_iter()
        .filter_map(|o| o.err().map(|e| format!("{e:#}")))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        bail!(
            "{} of {} requests: {}",
            errors.len(),
            cases.len(),
            errors.join("; ")
        )
    }
}

pub async fn simple_same_namespace(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let route = infra("gateway-conformance-infra-test");
    ready(cx, SAME_NS, &[&route]).await?;
    all(cx, vec![same_ns("/").infra("infra-backend-v1")]).await
}

pub async fn weight(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let route = infra("weighted-backends");
    ready(cx, SAME_NS, &[&route]).await?;
    let case = same_ns("/").status(200).to("", INFRA);
    cx.expect(&case).await?;
    // The suite sends 500 requests, 10 at a time, and wants 70/30/0 within
    // 5 points (retrying up to 10 times). Our split is exact: one run.
    const TOTAL: usize = 500;
    const BACKENDS: [&str; 3] = ["infra-backend-v1", "infra-backend-v2", "infra-backend-v3"];
    let mut counts = std::collections::BTreeMap::new();
    for chunk in 0..TOTAL / 10 {
        let sends = (0..10).map(|_| cx.send(&case));
        for exchange in futures_util::future::join_all(sends).await {
            let exchange = exchange?;
            compare(&case, &exchange).map_err(|e| e.context(format!("request batch {chunk}")))?;
            let pod = exchange.echo.map(|e| e.pod).unwrap_or_default();
            *counts.entry(backend_of(&pod, &BACKENDS)?).or_default() += 1;
        }
    }
    within_five_points(
        &counts,
        TOTAL,
        &[(BACKENDS[0], 0.7), (BACKENDS[1], 0.3), (BACKENDS[2], 0.0)],
    )
}

pub async fn matching(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("matching")]).await?;
    all(
        cx,
        vec![
            same_ns("/").infra("infra-backend-v1"),
            same_ns("/example").infra("infra-backend-v1"),
            same_ns("/")
                .header("Version", "one")
                .infra("infra-backend-v1"),
            same_ns("/v2").infra("infra-backend-v2"),
            same_ns("/v2/example").infra("infra-backend-v2"),
            same_ns("/")
                .header("Version", "two")
                .infra("infra-backend-v2"),
            same_ns("/v2/").infra("infra-backend-v2"),
            // Not a path segment prefix: does not match /v2.
            same_ns("/v2example").infra("infra-backend-v1"),
            same_ns("/foo/v2/example").infra("infra-backend-v1"),
        ],
    )
    .await
}

pub async fn header_matching(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("header-matching")]).await?;
    let h = |headers: &[(&str, &str)]| {
        headers
            .iter()
            .fold(same_ns("/"), |c, (k, v)| c.header(k, v))
    };
    all(
        cx,
        vec![
            h(&[("Version", "one")]).infra("infra-backend-v1"),
            h(&[("Version", "two")]).infra("infra-backend-v2"),
            h(&[("Version", "two"), ("Color", "orange")]).infra("infra-backend-v1"),
            h(&[("Version", "two"), ("Color", "blue")]).infra("infra-backend-v2"),
            h(&[("Color", "orange")]).status(404),
            h(&[("Some-Other-Header", "one")]).status(404),
            h(&[("Color", "blue")]).infra("infra-backend-v1"),
            h(&[("Color", "green")]).infra("infra-backend-v1"),
            h(&[("Color", "red")]).infra("infra-backend-v2"),
            h(&[("Color", "yellow")]).infra("infra-backend-v2"),
            h(&[("Color", "purple")]).status(404),
        ],
    )
    .await
}

pub async fn exact_path_matching(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("exact-matching")]).await?;
    all(
        cx,
        vec![
            same_ns("/one").infra("infra-backend-v1"),
            same_ns("/two").infra("infra-backend-v2"),
            same_ns("/").status(404),
            same_ns("/one/example").status(404),
            same_ns("/two/").status(404),
            same_ns("/Two").status(404),
        ],
    )
    .await
}

pub async fn path_match_order(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("path-matching-order")]).await?;
    all(
        cx,
        vec![
            same_ns("/match/exact/one").infra("infra-backend-v3"),
            same_ns("/match/exact").infra("infra-backend-v2"),
            same_ns("/match").infra("infra-backend-v1"),
            same_ns("/match/prefix/one/any").infra("infra-backend-v2"),
            same_ns("/match/prefix/any").infra("infra-backend-v1"),
            same_ns("/match/any").infra("infra-backend-v3"),
        ],
    )
    .await
}

pub async fn matching_across_routes(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let r1 = infra("matching-part1");
    let r2 = infra("matching-part2");
    ready(cx, SAME_NS, &[&r1, &r2]).await?;
    let c = |host: &str, path: &str| same_ns(path).host(host);
    all(
        cx,
        vec![
            c("example.com", "/").infra("infra-backend-v1"),
            c("example.com", "/example").infra("infra-backend-v1"),
            c("example.net", "/example").infra("infra-backend-v1"),
            c("example.com", "/example")
                .header("Version", "one")
                .infra("infra-backend-v1"),
            c("example.com", "/v2").infra("infra-backend-v2"),
            c("example.net", "/v2").infra("infra-backend-v1"),
            c("example.com", "/v2/example").infra("infra-backend-v2"),
            c("example.com", "/")
                .header("Version", "two")
                .infra("infra-backend-v2"),
        ],
    )
    .await
}

pub async fn query_param_matching(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("query-param-matching")]).await?;
    let v = |n: u8| format!("infra-backend-v{n}");
    all(
        cx,
        vec![
            same_ns("/?animal=whale").infra(&v(1)),
            same_ns("/?animal=dolphin").infra(&v(2)),
            same_ns("/?animal=dolphin&color=blue").infra(&v(3)),
            same_ns("/?ANIMAL=Whale").infra(&v(3)),
            same_ns("/?animal=whale&otherparam=irrelevant").infra(&v(1)),
            same_ns("/?animal=dolphin&color=yellow").infra(&v(2)),
            same_ns("/?color=blue").status(404),
            same_ns("/?animal=dog").status(404),
            same_ns("/?animal=whaledolphin").status(404),
            same_ns("/").status(404),
            same_ns("/path1?animal=whale").infra(&v(1)),
            same_ns("/?animal=whale")
                .header("version", "one")
                .infra(&v(2)),
            same_ns("/path2?animal=whale")
                .header("version", "two")
                .infra(&v(3)),
            same_ns("/path3?animal=shark").infra(&v(1)),
            same_ns("/path4?animal=kraken")
                .header("version", "three")
                .infra(&v(1)),
            same_ns("/?animal=shark").status(404),
            same_ns("/path4?animal=kraken").status(404),
            same_ns("/path5?animal=hydra").infra(&v(1)),
            same_ns("/?animal=hydra")
                .header("version", "four")
                .infra(&v(3)),
        ],
    )
    .await
}

pub async fn method_matching(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("method-matching")]).await?;
    let v = |n: u8| format!("infra-backend-v{n}");
    all(
        cx,
        vec![
            same_ns("/").method("POST").infra(&v(1)),
            same_ns("/").method("GET").infra(&v(2)),
            same_ns("/").method("HEAD").status(404),
            same_ns("/path1").method("GET").infra(&v(1)),
            same_ns("/")
                .method("PUT")
                .header("version", "one")
                .infra(&v(2)),
            same_ns("/path2")
                .method("POST")
                .header("version", "two")
                .infra(&v(3)),
            same_ns("/path3").method("PATCH").infra(&v(1)),
            same_ns("/path4")
                .method("DELETE")
                .header("version", "three")
                .infra(&v(1)),
            same_ns("/").method("PUT").status(404),
            same_ns("/path4").method("DELETE").status(404),
            same_ns("/path5").method("PATCH").infra(&v(1)),
            same_ns("/")
                .method("PATCH")
                .header("version", "four")
                .infra(&v(2)),
        ],
    )
    .await
}

/// The cases of the request and response header modifier tests: request
/// headers sent, headers expected (at the backend or on the response),
/// headers expected absent.
type HeaderCase = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
);

const HEADER_MODIFIER_CASES: &[HeaderCase] = &[
    (
        "/set",
        &[("Some-Other-Header", "val")],
        &[
            ("Some-Other-Header", "val"),
            ("X-Header-Set", "set-overwrites-values"),
        ],
        &[],
    ),
    (
        "/set",
        &[
            ("Some-Other-Header", "val"),
            ("X-Header-Set", "some-other-value"),
        ],
        &[
            ("Some-Other-Header", "val"),
            ("X-Header-Set", "set-overwrites-values"),
        ],
        &[],
    ),
    (
        "/add",
        &[("Some-Other-Header", "val")],
        &[
            ("Some-Other-Header", "val"),
            ("X-Header-Add", "add-appends-values"),
        ],
        &[],
    ),
    (
        "/add",
        &[
            ("Some-Other-Header", "val"),
            ("X-Header-Add", "some-other-value"),
        ],
        &[
            ("Some-Other-Header", "val"),
            ("X-Header-Add", "some-other-value,add-appends-values"),
        ],
        &[],
    ),
    (
        "/remove",
        &[("X-Header-Remove", "val")],
        &[],
        &["X-Header-Remove"],
    ),
    (
        "/multiple",
        &[
            ("X-Header-Set-2", "set-val-2"),
            ("X-Header-Add-2", "add-val-2"),
            ("X-Header-Remove-2", "remove-val-2"),
            ("Another-Header", "another-header-val"),
        ],
        &[
            ("X-Header-Set-1", "header-set-1"),
            ("X-Header-Set-2", "header-set-2"),
            ("X-Header-Add-1", "header-add-1"),
            ("X-Header-Add-2", "add-val-2,header-add-2"),
            ("X-Header-Add-3", "header-add-3"),
            ("Another-Header", "another-header-val"),
        ],
        &["X-Header-Remove-1", "X-Header-Remove-2"],
    ),
    (
        "/case-insensitivity",
        &[
            ("x-header-set", "original-val-set"),
            ("x-header-add", "original-val-add"),
            ("x-header-remove", "original-val-remove"),
            ("Another-Header", "another-header-val"),
        ],
        &[
            ("X-Header-Set", "header-set"),
            ("X-Header-Add", "original-val-add,header-add"),
            ("Another-Header", "another-header-val"),
        ],
        &["x-header-remove", "X-Header-Remove"],
    ),
];

/// The request header modifier cases, with the filters on the rule
/// (HTTPRouteRequestHeaderModifier) or on the backendRef
/// (HTTPRouteBackendRequestHeaderModifier, same route name and cases).
pub async fn request_header_modifier(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("request-header-modifier")]).await?;
    let cases = HEADER_MODIFIER_CASES
        .iter()
        .map(|(path, sent, want, absent)| {
            let mut c = same_ns(path).infra("infra-backend-v1").exp_no_headers();
            for (k, v) in *sent {
                c = c.header(k, v);
            }
            for (k, v) in *want {
                c = c.exp_header(k, v);
            }
            absent.iter().fold(c, |c, h| c.absent(h))
        })
        .collect();
    all(cx, cases).await
}

pub async fn response_header_modifier(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("response-header-modifier")]).await?;
    // The suite has the backend set these headers on its response
    // (`BackendSetResponseHeaders`, carried by `X-Echo-Set-Header`) and
    // checks the path the backend saw, not its request headers.
    let cases = HEADER_MODIFIER_CASES
        .iter()
        .map(|(path, backend_sets, want, absent)| {
            let set: Vec<String> = backend_sets
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            let mut c = same_ns(path)
                .header("X-Echo-Set-Header", &set.join(","))
                .infra("infra-backend-v1")
                .exp_no_headers();
            for (k, v) in *want {
                c = c.resp_header(k, v);
            }
            absent.iter().fold(c, |c, h| c.absent_resp(h))
        })
        .collect();
    all(cx, cases).await
}

pub async fn redirect_host_and_status(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("redirect-host-and-status")]).await?;
    all(
        cx,
        vec![
            same_ns("/hostname-redirect")
                .redirect(302)
                .r_host("example.org"),
            same_ns("/host-and-status")
                .redirect(301)
                .r_host("example.org"),
        ],
    )
    .await
}

pub async fn redirect_path(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("redirect-path")]).await?;
    all(
        cx,
        vec![
            same_ns("/original-prefix/lemon")
                .redirect(302)
                .r_path("/replacement-prefix/lemon"),
            same_ns("/full/path/original")
                .redirect(302)
                .r_path("/full-path-replacement"),
            same_ns("/path-and-host")
                .redirect(302)
                .r_host("example.org")
                .r_path("/replacement-prefix"),
            same_ns("/path-and-status")
                .redirect(301)
                .r_path("/replacement-prefix"),
            same_ns("/full-path-and-host")
                .redirect(302)
                .r_host("example.org")
                .r_path("/replacement-full"),
            same_ns("/full-path-and-status")
                .redirect(301)
                .r_path("/replacement-full"),
        ],
    )
    .await
}

pub async fn redirect_port(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("redirect-port")]).await?;
    all(
        cx,
        vec![
            same_ns("/port").redirect(302).r_port("8083"),
            same_ns("/port-and-host")
                .redirect(302)
                .r_host("example.org")
                .r_port("8083"),
            same_ns("/port-and-status").redirect(301).r_port("8083"),
            same_ns("/port-and-host-and-status")
                .redirect(302)
                .r_host("example.org")
                .r_port("8083"),
        ],
    )
    .await
}

pub async fn redirect_scheme(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("redirect-scheme")]).await?;
    all(
        cx,
        vec![
            same_ns("/scheme")
                .redirect(302)
                .r_scheme("https")
                .r_port(""),
            same_ns("/scheme-and-host")
                .redirect(302)
                .r_scheme("https")
                .r_host("example.org")
                .r_port(""),
            same_ns("/scheme-and-status")
                .redirect(301)
                .r_scheme("https")
                .r_port(""),
            same_ns("/scheme-and-host-and-status")
                .redirect(302)
                .r_scheme("https")
                .r_host("example.org")
                .r_port(""),
        ],
    )
    .await
}

pub async fn redirect_port_and_scheme(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw8080 = infra("same-namespace-with-http-listener-on-8080");
    let gw443 = infra("same-namespace-with-https-listener");
    ready(cx, SAME_NS, &[&infra("http-route-for-listener-on-port-80")]).await?;
    ready(
        cx,
        &gw8080,
        &[&infra("http-route-for-listener-on-port-8080")],
    )
    .await?;
    ready(cx, &gw443, &[&infra("http-route-for-listener-on-port-443")]).await?;
    let r = |c: Case, scheme: &str, port: &str| {
        c.redirect(302)
            .r_scheme(scheme)
            .r_host("example.org")
            .r_port(port)
    };
    let on80 = |p: &str| same_ns(p);
    let on8080 = |p: &str| req(&gw8080, p);
    all(
        cx,
        vec![
            r(on80("/scheme-nil-and-port-nil"), "http", ""),
            r(on80("/scheme-nil-and-port-80"), "http", ""),
            r(on80("/scheme-nil-and-port-8080"), "http", "8080"),
            r(on80("/scheme-https-and-port-nil"), "https", ""),
            r(on80("/scheme-https-and-port-443"), "https", ""),
            r(on80("/scheme-https-and-port-8443"), "https", "8443"),
            r(on8080("/scheme-nil-and-port-nil"), "http", "8080"),
            r(on8080("/scheme-nil-and-port-80"), "http", ""),
            r(on8080("/scheme-https-and-port-nil"), "https", ""),
        ],
    )
    .await?;
    let on443 = |p: &str| req(&gw443, p).host("example.org").tls("example.org");
    all(
        cx,
        vec![
            r(on443("/scheme-nil-and-port-nil"), "https", ""),
            r(on443("/scheme-nil-and-port-443"), "https", ""),
            r(on443("/scheme-nil-and-port-8443"), "https", "8443"),
            r(on443("/scheme-http-and-port-nil"), "http", ""),
            r(on443("/scheme-http-and-port-80"), "http", ""),
            r(on443("/scheme-http-and-port-8080"), "http", "8080"),
        ],
    )
    .await
}

pub async fn redirect_status(
    cx: &mut Ctx<'_>,
    route: &str,
    path: &str,
    status: u16,
) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra(route)]).await?;
    all(cx, vec![same_ns(path).redirect(status).r_path(path)]).await
}

pub async fn rewrite_path(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("rewrite-path")]).await?;
    let v1 = "infra-backend-v1";
    let with_headers = |path: &str, want: &str| {
        same_ns(path)
            .header("X-Header-Remove", "remove-val")
            .header("X-Header-Add-Append", "append-val-1")
            .header("X-Header-Set", "set-val")
            .exp_path(want)
            .exp_header("X-Header-Add", "header-val-1")
            .exp_header("X-Header-Add-Append", "append-val-1,header-val-2")
            .exp_header("X-Header-Set", "set-overwrites-values")
            .absent("X-Header-Remove")
            .infra(v1)
    };
    all(
        cx,
        vec![
            same_ns("/prefix/one/two").exp_path("/one/two").infra(v1),
            same_ns("/strip-prefix/three").exp_path("/three").infra(v1),
            same_ns("/strip-prefix").exp_path("/").infra(v1),
            same_ns("/full/one/two").exp_path("/one").infra(v1),
            with_headers("/full/rewrite-path-and-modify-headers/test", "/test"),
            with_headers("/prefix/rewrite-path-and-modify-headers/one", "/prefix/one"),
        ],
    )
    .await
}

pub async fn rewrite_host(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("rewrite-host")]).await?;
    let h = |path: &str| same_ns(path).host("rewrite.example");
    all(
        cx,
        vec![
            h("/one")
                .exp_host("one.example.org")
                .infra("infra-backend-v1"),
            h("/two").exp_host("example.org").infra("infra-backend-v2"),
            h("/rewrite-host-and-modify-headers")
                .header("X-Header-Remove", "remove-val")
                .header("X-Header-Add-Append", "append-val-1")
                .exp_host("test.example.org")
                .exp_header("X-Header-Add", "header-val-1")
                .exp_header("X-Header-Add-Append", "append-val-1,header-val-2")
                .exp_header("X-Header-Set", "set-overwrites-values")
                .absent("X-Header-Remove")
                .infra("infra-backend-v2"),
        ],
    )
    .await
}

/// A route whose only backend does not resolve: Accepted, ResolvedRefs
/// False with `reason`, and its requests answered 500.
pub async fn invalid_backend(
    cx: &mut Ctx<'_>,
    route: &str,
    path: &str,
    reason: &str,
) -> anyhow::Result<()> {
    let route = infra(route);
    cx.accepted(SAME_NS, &[&route]).await?;
    cx.route_condition(&route, SAME_NS, "ResolvedRefs", false, reason)
        .await?;
    all(cx, vec![same_ns(path).status(500)]).await
}

pub async fn reference_grant(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("reference-grant")]).await?;
    all(cx, vec![same_ns("/").to("web-backend", WEB)]).await
}

pub async fn partially_invalid(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let route = infra("invalid-reference-grant");
    cx.accepted(SAME_NS, &[&route]).await?;
    cx.route_condition(&route, SAME_NS, "ResolvedRefs", false, "RefNotPermitted")
        .await?;
    all(
        cx,
        vec![
            same_ns("/v2").status(500),
            same_ns("/").to("app-backend-v1", APP),
        ],
    )
    .await
}

pub async fn cross_namespace(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("backend-namespaces");
    let route = format!("{WEB}/cross-namespace");
    ready(cx, &gw, &[&route]).await?;
    all(cx, vec![req(&gw, "/").to("web-backend", WEB)]).await
}

pub async fn invalid_cross_namespace_parent_ref(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let route = format!("{WEB}/invalid-cross-namespace-parent-ref");
    cx.attached_routes(SAME_NS, "http", 0).await?;
    cx.route_condition(&route, SAME_NS, "Accepted", false, "NotAllowedByListeners")
        .await
}

pub async fn not_matching_section_name(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let route = infra("httproute-listener-not-matching-section-name");
    cx.attached_routes(SAME_NS, "http", 0).await?;
    cx.route_condition(&route, SAME_NS, "Accepted", false, "NoMatchingParent")
        .await
}

pub async fn hostname_intersection(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("httproute-hostname-intersection");
    let routes = [
        infra("specific-host-matches-listener-specific-host"),
        infra("specific-host-matches-listener-wildcard-host"),
        infra("wildcard-host-matches-listener-specific-host"),
        infra("wildcard-host-matches-listener-wildcard-host"),
    ];
    let refs: Vec<&str> = routes.iter().map(String::as_str).collect();
    ready(cx, &gw, &refs).await?;
    let c = |host: &str, path: &str| req(&gw, path).host(host);
    let (v1, v2, v3) = ("infra-backend-v1", "infra-backend-v2", "infra-backend-v3");
    all(
        cx,
        vec![
            c("very.specific.com", "/s1").infra(v1),
            c("very.specific.com:1234", "/s1").infra(v1),
            c("non.matching.com", "/s1").status(404),
            c("foo.nonmatchingwildcard.io", "/s1").status(404),
            c("foo.wildcard.io", "/s1").status(404),
            c("very.specific.com", "/non-matching-prefix").status(404),
            c("foo.wildcard.io", "/s2").infra(v2),
            c("bar.wildcard.io", "/s2").infra(v2),
            c("foo.bar.wildcard.io", "/s2").infra(v2),
            c("non.matching.com", "/s2").status(404),
            c("wildcard.io", "/s2").status(404),
            c("very.specific.com", "/s2").status(404),
            c("foo.wildcard.io", "/non-matching-prefix").status(404),
            c("very.specific.com", "/s3").infra(v3),
            c("non.matching.com", "/s3").status(404),
            c("foo.specific.com", "/s3").status(404),
            c("foo.wildcard.io", "/s3").status(404),
            c("very.specific.com", "/non-matching-prefix").status(404),
            c("foo.anotherwildcard.io", "/s4").infra(v1),
            c("bar.anotherwildcard.io", "/s4").infra(v1),
            c("foo.bar.anotherwildcard.io", "/s4").infra(v1),
            c("anotherwildcard.io", "/s4").status(404),
            c("foo.wildcard.io", "/s4").status(404),
            c("very.specific.com", "/s4").status(404),
            c("foo.anotherwildcard.io", "/non-matching-prefix").status(404),
        ],
    )
    .await?;

    // A route whose hostnames intersect no listener is not accepted.
    cx.route_parents(
        &infra("no-intersecting-hosts"),
        &[parent(&gw).cond("Accepted", false, "NoMatchingListenerHostname")],
    )
    .await?;
    all(
        cx,
        vec![
            c("specific.but.wrong.com", "/s5").status(404),
            c("wildcard.io", "/s5").status(404),
        ],
    )
    .await?;

    // attachedRoutes counts accepted routes only.
    for (listener, attached) in [("listener-1", 2), ("listener-2", 1), ("listener-3", 1)] {
        cx.attached_routes(&gw, listener, attached).await?;
        cx.supported_kinds(&gw, listener, &["HTTPRoute"]).await?;
        cx.listener_condition(&gw, Some(listener), "Accepted", true, "")
            .await?;
        cx.listener_condition(&gw, Some(listener), "ResolvedRefs", true, "")
            .await?;
    }

    // A listener without hostname takes every route hostname.
    let all_gw = infra("httproute-hostname-intersection-all");
    ready(
        cx,
        &all_gw,
        &[&infra("httproute-hostname-intersection-all")],
    )
    .await?;
    let a = |host: &str| req(&all_gw, "/").host(host);
    all(
        cx,
        vec![
            a("first.com").infra(v2),
            a("sub.first.com").infra(v2),
            a("second.com").infra(v2),
            a("sub.second.com").infra(v2),
            a("third.com").status(404),
            a("sub.third.com").status(404),
        ],
    )
    .await
}

pub async fn listener_hostname_matching(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("httproute-listener-hostname-matching");
    for route in ["backend-v1", "backend-v2", "backend-v3"] {
        ready(cx, &gw, &[&infra(route)]).await?;
    }
    let c = |host: &str| req(&gw, "/").host(host);
    all(
        cx,
        vec![
            c("bar.com").infra("infra-backend-v1"),
            c("foo.bar.com").infra("infra-backend-v2"),
            c("baz.bar.com").infra("infra-backend-v3"),
            c("boo.bar.com").infra("infra-backend-v3"),
            c("multiple.prefixes.bar.com").infra("infra-backend-v3"),
            c("multiple.prefixes.foo.com").infra("infra-backend-v3"),
            c("foo.com").status(404),
            c("no.matching.host").status(404),
        ],
    )
    .await
}

pub async fn route_generation_bump(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let route = infra("observed-generation-bump");
    cx.latest_conditions("HTTPRoute", &route, None).await?;
    let before = cx.generation("HTTPRoute", &route)?;
    cx.modify("HTTPRoute", &route, |r| {
        r["spec"]["rules"][0]["backendRefs"][0]["name"] = "infra-backend-v2".into();
    })?;
    cx.route_condition(&route, SAME_NS, "Accepted", true, "")
        .await?;
    cx.resolved(&route, SAME_NS).await?;
    cx.latest_conditions("HTTPRoute", &route, Some(before))
        .await
}

/// A listener as the suite appends it in the generation and modify tests.
fn appended_listener(name: &str, hostname: &str) -> serde_json::Value {
    sluice::yaml::from_str(&format!(
        "{{name: {name}, hostname: {hostname}, port: 80, protocol: HTTP, allowedRoutes: {{namespaces: {{from: All}}}}}}"
    ))
    .expect("the listener template is valid YAML")
}

fn push_listener(gateway: &mut serde_json::Value, listener: serde_json::Value) {
    if let Some(listeners) = gateway["spec"]["listeners"].as_array_mut() {
        listeners.push(listener);
    }
}

pub async fn gateway_generation_bump(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-observed-generation-bump");
    cx.latest_conditions("Gateway", &gw, None).await?;
    let before = cx.generation("Gateway", &gw)?;
    cx.modify("Gateway", &gw, |g| {
        push_listener(g, appended_listener("alternate", "foo.com"))
    })?;
    cx.latest_conditions("Gateway", &gw, Some(before)).await?;
    cx.gateway_condition(&gw, "Accepted", true, "").await?;
    cx.gateway_condition(&gw, "Programmed", true, "").await
}

pub async fn class_generation_bump(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let class = "gatewayclass-observed-generation-bump";
    let accepted = |cx: &Ctx<'_>| -> anyhow::Result<()> {
        let s = cx
            .status_of("GatewayClass", class)
            .ok_or_else(|| anyhow!("no status for GatewayClass {class}"))?;
        crate::status::fresh(&s, &s.status["conditions"])?;
        if !crate::status::has_condition(&s.status["conditions"], "Accepted", "True", "") {
            bail!("GatewayClass not Accepted: {}", s.status["conditions"]);
        }
        Ok(())
    };
    cx.eventually("GatewayClass accepted", accepted).await?;
    let before = cx.generation("GatewayClass", class)?;
    cx.modify("GatewayClass", &format!("default/{class}"), |c| {
        c["spec"]["description"] = "new".into();
    })?;
    cx.latest_conditions("GatewayClass", class, Some(before))
        .await?;
    cx.eventually("GatewayClass accepted after the change", accepted)
        .await
}

pub async fn with_attached_routes(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    cx.listeners(
        &infra("gateway-with-one-attached-route"),
        &[listener("http", 1)],
    )
    .await?;
    cx.listeners(
        &infra("gateway-with-two-attached-routes"),
        &[listener("http", 2)],
    )
    .await?;
    // A route whose backend does not resolve still counts as attached.
    let unresolved = infra("unresolved-gateway-with-one-attached-unresolved-route");
    cx.attached_routes(&unresolved, "tls", 1).await?;
    cx.route_condition(
        &infra("http-route-4"),
        &unresolved,
        "ResolvedRefs",
        false,
        "BackendNotFound",
    )
    .await
}

pub async fn with_attached_routes_8080(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    cx.listeners(
        &infra("gateway-with-two-listeners-and-one-attached-route"),
        &[listener("http-unattached", 0), listener("http", 1)],
    )
    .await
}

pub async fn invalid_route_kind(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let invalid = |kinds: &[&str]| ListenerExpect {
        name: "http".to_owned(),
        kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
        attached: 0,
        conditions: vec![(
            "ResolvedRefs".into(),
            "False".into(),
            "InvalidRouteKinds".into(),
        )],
    };
    cx.listeners(&infra("gateway-only-invalid-route-kind"), &[invalid(&[])])
        .await?;
    cx.listeners(
        &infra("gateway-supported-and-invalid-route-kind"),
        &[invalid(&["HTTPRoute"])],
    )
    .await
}

/// An HTTPRoute whose only parent allows TLSRoutes alone: its references
/// resolve, but no listener takes it.
pub async fn disallowed_kind(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gateway = infra("tlsroutes-only");
    let route = infra("disallowed-kind");
    cx.resolved(&route, &gateway).await?;
    cx.route_condition(&route, &gateway, "Accepted", false, "NotAllowedByListeners")
        .await?;
    cx.eventually(&format!("HTTPRoute {route} has no accepted parent"), |cx| {
        let r = cx.require("HTTPRoute", &route)?;
        let parents = r.status["parents"].as_array().cloned().unwrap_or_default();
        if let Some(p) = parents
            .iter()
            .find(|p| crate::status::has_condition(&p["conditions"], "Accepted", "True", ""))
        {
            bail!("parent {} is accepted", p["parentRef"]);
        }
        Ok(())
    })
    .await?;
    cx.attached_routes(&gateway, "tls", 0).await
}

pub async fn modify_listeners(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let add = infra("gateway-add-listener");
    cx.latest_conditions("Gateway", &add, None).await?;
    let before = cx.generation("Gateway", &add)?;
    cx.modify("Gateway", &add, |g| {
        push_listener(g, appended_listener("http", "data.test.com"))
    })?;
    cx.listeners(&add, &[listener("https", 1), listener("http", 1)])
        .await?;
    cx.latest_conditions("Gateway", &add, Some(before)).await?;

    let remove = infra("gateway-remove-listener");
    cx.latest_conditions("Gateway", &remove, None).await?;
    let before = cx.generation("Gateway", &remove)?;
    cx.modify("Gateway", &remove, |g| {
        if let Some(listeners) = g["spec"]["listeners"].as_array_mut() {
            listeners.retain(|l| l["name"] == "http");
        }
    })?;
    cx.listeners(&remove, &[listener("http", 1)]).await?;
    cx.latest_conditions("Gateway", &remove, Some(before)).await
}

pub async fn listener_port_matching(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("httproute-listener-port-matching");
    for route in ["backend-v1", "backend-v2", "backend-v3"] {
        ready(cx, &gw, &[&infra(route)]).await?;
    }
    // The suite sends each request to the listener port its Host names.
    let c = |host: &str, port: u16| req(&gw, "/").port(port).host(host);
    all(
        cx,
        vec![
            c("foo.com", 80).infra("infra-backend-v1"),
            c("foo.com:8080", 8080).infra("infra-backend-v2"),
            c("bar.com:8080", 8080).infra("infra-backend-v2"),
            c("foo.com:8090", 8090).infra("infra-backend-v3"),
            c("bar.com:8090", 8090).status(404),
        ],
    )
    .await
}

/// A parentRef whose port no listener has: ResolvedRefs True, Accepted
/// False NoMatchingParent, no accepted parent, nothing attached.
pub async fn parent_port_not_matching(
    cx: &mut Ctx<'_>,
    gw: &str,
    route: &str,
) -> anyhow::Result<()> {
    let route = infra(route);
    cx.resolved(&route, gw).await?;
    cx.route_condition(&route, gw, "Accepted", false, "NoMatchingParent")
        .await?;
    cx.eventually("no accepted parents", |cx| {
        let r = cx
            .status_of("HTTPRoute", &route)
            .ok_or_else(|| anyhow!("no status for {route}"))?;
        let accepted = r.status["parents"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| crate::status::has_condition(&p["conditions"], "Accepted", "True", ""));
        if accepted {
            bail!("a parent accepted the route: {}", r.status);
        }
        Ok(())
    })
    .await?;
    cx.eventually("the Gateway has zero routes", |cx| {
        let g = cx
            .status_of("Gateway", gw)
            .ok_or_else(|| anyhow!("no status for {gw}"))?;
        for l in g.status["listeners"].as_array().into_iter().flatten() {
            if l["attachedRoutes"].as_i64() != Some(0) {
                bail!(
                    "listener {} has attachedRoutes {}",
                    l["name"],
                    l["attachedRoutes"]
                );
            }
        }
        Ok(())
    })
    .await
}

/// Requests reach `infra-backend-v1`, and a copy of each reaches a pod of
/// every mirror backend (the suite reads the mirror pods' logs; we read
/// what the echo pods received).
pub async fn request_mirror(
    cx: &mut Ctx<'_>,
    route: &str,
    paths: &[&str],
    mirrors: &[&str],
) -> anyhow::Result<()> {
    cx.accepted(SAME_NS, &[&infra(route)]).await?;
    let seen = |cx: &Ctx<'_>, backend: &str, path: &str| -> usize {
        cx.pods
            .of(INFRA, backend)
            .iter()
            .map(|p| p.server.seen(path))
            .sum()
    };
    for path in paths {
        let before: Vec<usize> = mirrors.iter().map(|m| seen(cx, m, path)).collect();
        cx.expect(&same_ns(path).infra("infra-backend-v1")).await?;
        for (mirror, before) in mirrors.iter().zip(before) {
            cx.eventually(&format!("{path} mirrored to {mirror}"), |cx| {
                if seen(cx, mirror, path) > before {
                    Ok(())
                } else {
                    bail!("{mirror} did not receive a copy of {path}")
                }
            })
            .await?;
        }
    }
    Ok(())
}

/// A rule with a 500ms timeout answers 504 for a backend that takes 1s; a
/// rule with the timeout disabled (`0s`) waits for it.
pub async fn timeouts(
    cx: &mut Ctx<'_>,
    route: &str,
    limited: &str,
    unlimited: &str,
) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra(route)]).await?;
    all(
        cx,
        vec![
            same_ns(limited).to("", INFRA),
            same_ns(&format!("{limited}?delay=1s")).status(504),
            same_ns(&format!("{unlimited}?delay=1s")).to("", INFRA),
        ],
    )
    .await
}

pub async fn named_rule(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("http-named-rules")]).await?;
    all(
        cx,
        vec![
            same_ns("/named").infra("infra-backend-v1"),
            same_ns("/unnamed").infra("infra-backend-v2"),
        ],
    )
    .await
}

pub async fn multiple_gateways(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let all_ns = infra("all-namespaces");
    let shared = infra("multiple-gateways-shared-route");
    ready(
        cx,
        SAME_NS,
        &[&shared, &infra("same-namespace-dedicated-route")],
    )
    .await?;
    ready(
        cx,
        &all_ns,
        &[&shared, &infra("all-namespaces-dedicated-route")],
    )
    .await?;
    all(
        cx,
        vec![
            same_ns("/shared").infra("infra-backend-v1"),
            same_ns("/").infra("infra-backend-v2"),
            req(&all_ns, "/shared").infra("infra-backend-v1"),
            req(&all_ns, "/").infra("infra-backend-v3"),
        ],
    )
    .await
}

const HTTPS_GW: &str = "gateway-conformance-infra/same-namespace-with-https-listener";

pub async fn https_listener(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let routes = [
        infra("httproute-https-test"),
        infra("httproute-https-test-no-hostname"),
    ];
    ready(cx, HTTPS_GW, &[&routes[0], &routes[1]]).await?;
    // The server name is the Host.
    let c = |host: &str| req(HTTPS_GW, "/").host(host).tls(host);
    all(
        cx,
        vec![
            c("example.org").infra("infra-backend-v1"),
            c("unknown-example.org").status(404),
            c("second-example.org").infra("infra-backend-v2"),
        ],
    )
    .await
}

pub async fn misdirected_requests(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let routes: Vec<String> = (1..=4)
        .map(|i| {
            infra(&format!(
                "https-listener-detect-misdirected-requests-test-{i}"
            ))
        })
        .collect();
    let refs: Vec<&str> = routes.iter().map(String::as_str).collect();
    ready(cx, HTTPS_GW, &refs).await?;
    let (v1, v2, v3) = ("infra-backend-v1", "infra-backend-v2", "infra-backend-v3");
    // (server name, Host, status, backend)
    let table: &[(&str, &str, u16, &str)] = &[
        ("example.org", "example.org", 200, v1),
        ("example.org", "second-example.org", 421, ""),
        ("example.org", "unknown-example.org", 404, ""),
        ("second-example.org", "second-example.org", 200, v2),
        ("second-example.org", "example.org", 421, ""),
        ("second-example.org", "unknown-example.org", 421, ""),
        (
            "third-example.wildcard.org",
            "third-example.wildcard.org",
            200,
            v3,
        ),
        (
            "third-example.wildcard.org",
            "fith-example.wildcard.org",
            200,
            v3,
        ),
        (
            "third-example.wildcard.org",
            "fourth-example.wildcard.org",
            421,
            "",
        ),
        ("third-example.wildcard.org", "second-example.org", 421, ""),
        ("third-example.wildcard.org", "unknown-example.org", 421, ""),
        (
            "fourth-example.wildcard.org",
            "fourth-example.wildcard.org",
            200,
            v1,
        ),
        (
            "fourth-example.wildcard.org",
            "fith-example.wildcard.org",
            421,
            "",
        ),
        ("unknown-example.org", "example.org", 200, v1),
        ("unknown-example.org", "unknown-example.org", 404, ""),
    ];
    let cases = table
        .iter()
        .map(|(sni, host, status, backend)| {
            req(HTTPS_GW, "/detect-misdirected-requests")
                .tls(sni)
                .host(host)
                .status(*status)
                .to(backend, INFRA)
        })
        .collect();
    all(cx, cases).await
}

/// A listener `name` with kinds `[HTTPRoute]`, nothing attached and these
/// conditions.
fn listener_with(name: &str, kinds: &[&str], conditions: &[(&str, bool, &str)]) -> ListenerExpect {
    ListenerExpect {
        name: name.to_owned(),
        kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
        attached: 0,
        conditions: conditions
            .iter()
            .map(|(t, s, r)| {
                let s = if *s { "True" } else { "False" };
                ((*t).to_owned(), s.to_owned(), (*r).to_owned())
            })
            .collect(),
    }
}

pub async fn invalid_tls_configuration(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let want = [listener_with(
        "https",
        &["HTTPRoute"],
        &[("ResolvedRefs", false, "InvalidCertificateRef")],
    )];
    for gw in [
        "gateway-certificate-nonexistent-secret",
        "gateway-certificate-unsupported-group",
        "gateway-certificate-unsupported-kind",
        "gateway-certificate-malformed-secret",
    ] {
        cx.listeners(&infra(gw), &want).await?;
    }
    Ok(())
}

/// The GatewaySecret* tests: each named listener refers to a Secret in
/// another namespace; with a ReferenceGrant (`permitted`) it is Programmed
/// and resolved, without one ResolvedRefs is False with RefNotPermitted.
pub async fn secret_listeners(
    cx: &mut Ctx<'_>,
    gateway: &str,
    listeners: &[&str],
    permitted: bool,
) -> anyhow::Result<()> {
    let conditions: &[(&str, bool, &str)] = if permitted {
        &[
            ("Programmed", true, "Programmed"),
            ("ResolvedRefs", true, ""),
        ]
    } else {
        &[("ResolvedRefs", false, "RefNotPermitted")]
    };
    let want: Vec<ListenerExpect> = listeners
        .iter()
        .map(|l| listener_with(l, &["HTTPRoute"], conditions))
        .collect();
    cx.listeners(&infra(gateway), &want).await
}

pub async fn listener_isolation(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let v1 = "infra-backend-v1";
    // (Host, path, backend or "" for a 404)
    let table: &[(&str, &str, &str)] = &[
        ("bar.com", "/empty-hostname", v1),
        ("bar.com", "/wildcard-example-com", ""),
        ("bar.com", "/wildcard-foo-example-com", ""),
        ("bar.com", "/abc-foo-example-com", ""),
        ("bar.example.com", "/empty-hostname", ""),
        ("bar.example.com", "/wildcard-example-com", v1),
        ("bar.example.com", "/wildcard-foo-example-com", ""),
        ("bar.example.com", "/abc-foo-example-com", ""),
        ("bar.foo.example.com", "/empty-hostname", ""),
        ("bar.foo.example.com", "/wildcard-example-com", ""),
        ("bar.foo.example.com", "/wildcard-foo-example-com", v1),
        ("bar.foo.example.com", "/abc-foo-example-com", ""),
        ("abc.foo.example.com", "/empty-hostname", ""),
        ("abc.foo.example.com", "/wildcard-example-com", ""),
        ("abc.foo.example.com", "/wildcard-foo-example-com", ""),
        ("abc.foo.example.com", "/abc-foo-example-com", v1),
    ];
    for suffix in ["", "-with-hostname-intersection"] {
        let gw = infra(&format!("http-listener-isolation{suffix}"));
        let routes: Vec<String> = [
            "empty-hostname",
            "wildcard-example-com",
            "wildcard-foo-example-com",
            "abc-foo-example-com",
        ]
        .iter()
        .map(|r| infra(&format!("attaches-to-{r}{suffix}")))
        .collect();
        let refs: Vec<&str> = routes.iter().map(String::as_str).collect();
        ready(cx, &gw, &refs).await?;
        let cases = table
            .iter()
            .map(|(host, path, backend)| {
                let c = req(&gw, path).host(host);
                if backend.is_empty() {
                    c.status(404)
                } else {
                    c.infra(backend)
                }
            })
            .collect();
        all(cx, cases)
            .await
            .with_context(|| format!("Gateway {gw}"))?;
    }
    Ok(())
}

pub async fn backend_protocol_h2c(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    cx.accepted(SAME_NS, &[&infra("backend-protocol-h2c")])
        .await?;
    all(cx, vec![same_ns("/").h2c().infra("infra-backend-v1")]).await
}

pub async fn backend_protocol_websocket(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    cx.accepted(SAME_NS, &[&infra("backend-protocol-ws")])
        .await?;
    cx.websocket_echo(SAME_NS).await
}

pub async fn service_types(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let route = infra("service-types");
    ready(cx, SAME_NS, &[&route]).await?;
    // The test fills the manual EndpointSlices with infra-backend-v1's pods.
    cx.fill_endpoint_slices(
        &[
            "gateway-conformance-infra/manual-endpointslices-ip4",
            "gateway-conformance-infra/headless-manual-endpointslices-ip4",
        ],
        INFRA,
        "infra-backend-v1",
    )?;
    let cases = [
        "manual-endpointslices",
        "headless",
        "headless-manual-endpointslices",
    ]
    .iter()
    .map(|p| same_ns(&format!("/{p}")).infra("infra-backend-v1"))
    .collect::<Vec<_>>();
    // The filled slices reach the gateway with the next reload.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match all(cx, cases.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}

pub async fn no_backend_refs(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let route = infra("omitted-backendrefs");
    cx.resolved(&route, SAME_NS).await?;
    cx.route_parents(&route, &[parent(SAME_NS).cond("Accepted", true, "")])
        .await?;
    all(
        cx,
        vec![
            same_ns("/forward").infra("infra-backend-v1"),
            same_ns("/omitted-no-forward").status(500),
            same_ns("/empty-no-forward").status(500),
        ],
    )
    .await
}

pub async fn unsupported_protocol(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let only = infra("gateway-only-unsupported-protocols");
    cx.latest_conditions("Gateway", &only, None).await?;
    cx.gateway_condition(&only, "Accepted", false, "ListenersNotValid")
        .await?;
    let invalid = listener_with(
        "invalid",
        &[],
        &[("Accepted", false, "UnsupportedProtocol")],
    );
    cx.listeners(&only, std::slice::from_ref(&invalid)).await?;

    let mixed = infra("gateway-supported-and-unsupported-protocols");
    cx.latest_conditions("Gateway", &mixed, None).await?;
    cx.gateway_condition(&mixed, "Accepted", true, "ListenersNotValid")
        .await?;
    cx.listeners(
        &mixed,
        &[
            listener_with("http", &["HTTPRoute"], &[("Accepted", true, "Accepted")]),
            invalid,
        ],
    )
    .await
}

pub async fn invalid_parameters_ref(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-invalid-parameters-ref");
    cx.latest_conditions("Gateway", &gw, None).await?;
    cx.gateway_condition(&gw, "Accepted", false, "InvalidParameters")
        .await
}

pub async fn static_addresses(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-static-addresses");
    cx.latest_conditions("Gateway", &gw, None).await?;
    cx.gateway_condition(&gw, "Accepted", false, "UnsupportedAddress")
        .await?;

    let remove = |value: &'static str| {
        move |g: &mut serde_json::Value| {
            if let Some(a) = g["spec"]["addresses"].as_array_mut() {
                a.retain(|a| a["value"].as_str() != Some(value));
            }
        }
    };
    let before = cx.generation("Gateway", &gw)?;
    cx.modify("Gateway", &gw, remove("fake address teehee!"))?;
    cx.latest_conditions("Gateway", &gw, Some(before)).await?;
    cx.gateway_condition(&gw, "Accepted", true, "Accepted")
        .await?;
    cx.gateway_condition(&gw, "Programmed", false, "AddressNotUsable")
        .await?;

    let before = cx.generation("Gateway", &gw)?;
    cx.modify("Gateway", &gw, remove(crate::env::UNUSABLE_ADDRESS))?;
    cx.latest_conditions("Gateway", &gw, Some(before)).await?;
    cx.gateway_condition(&gw, "Accepted", true, "Accepted")
        .await?;
    cx.gateway_condition(&gw, "Programmed", true, "Programmed")
        .await?;
    cx.listeners(&gw, &[listener("http", 0)]).await?;
    cx.eventually("the usable address in status", |cx| {
        let s = cx
            .status_of("Gateway", &gw)
            .ok_or_else(|| anyhow!("no status for {gw}"))?;
        let addresses = s.status["addresses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let ok = addresses.len() == 1
            && addresses[0]["type"] == "IPAddress"
            && addresses[0]["value"] == crate::env::USABLE_ADDRESS;
        if !ok {
            bail!("status.addresses is {:?}", addresses);
        }
        Ok(())
    })
    .await
}

pub async fn optional_address_value(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-without-address-value");
    cx.latest_conditions("Gateway", &gw, None).await?;
    cx.eventually("an address in status", |cx| {
        let s = cx
            .status_of("Gateway", &gw)
            .ok_or_else(|| anyhow!("no status for {gw}"))?;
        let has = s.status["addresses"].as_array().is_some_and(|a| {
            a.iter()
                .any(|a| a["value"].as_str().is_some_and(|v| !v.is_empty()))
        });
        if !has {
            bail!("status.addresses is {}", s.status["addresses"]);
        }
        Ok(())
    })
    .await?;
    // WaitForGatewayAddress with the `http` listener: it must serve.
    let c = req(&gw, "/").status(404);
    cx.send(&c).await.map(|_| ())
}

pub async fn percentage_mirror(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("request-percentage-mirror")]).await?;
    let v1 = "infra-backend-v1";
    let cases = [
        (same_ns("/percent-mirror").infra(v1), 20.0),
        (same_ns("/percent-mirror-fraction").infra(v1), 50.0),
        (
            same_ns("/percent-mirror-and-modify-headers")
                .header("X-Header-Remove", "remove-val")
                .header("X-Header-Add-Append", "append-val-1")
                .exp_header("X-Header-Add", "header-val-1")
                .exp_header("X-Header-Add-Append", "append-val-1,header-val-2")
                .exp_header("X-Header-Set", "set-overwrites-values")
                .absent("X-Header-Remove")
                .infra(v1),
            35.0,
        ),
    ];
    // As the suite: 500 requests (10 at a time), the mirror backend must
    // see percent% of them within 5% (relative); up to 5 distribution checks.
    const TOTAL: usize = 500;
    for (case, percent) in cases {
        cx.expect(&case).await?;
        let mut failures = Vec::new();
        for run in 0..5 {
            // Each distribution check tags its requests (`?check=N`), so a
            // late copy of an earlier check is never counted in this one.
            let mut batch = case.clone();
            batch.path = format!("{}?check={run}", case.path);
            for _ in 0..TOTAL / 10 {
                // One success each (the suite's dedicated config), so
                // that no more requests are sent than the check counts.
                let sends = (0..10).map(|_| cx.expect_in_a_row(&batch, 1));
                for r in futures_util::future::join_all(sends).await {
                    r?;
                }
            }
            let mirrored = settled(cx, &|cx: &Ctx<'_>| -> usize {
                cx.pods
                    .of(INFRA, "infra-backend-v2")
                    .iter()
                    .map(|p| p.server.seen(&batch.path))
                    .sum()
            })
            .await;
            let expected = TOTAL as f64 * percent / 100.0;
            let (min, max) = (expected * 0.95, expected * 1.05);
            if (min..=max).contains(&(mirrored as f64)) {
                failures.clear();
                break;
            }
            failures.push(format!(
                "{} mirrored {mirrored} of {TOTAL} (want {min}..={max})",
                case.path
            ));
        }
        if !failures.is_empty() {
            bail!("{}", failures.join("; "));
        }
    }
    Ok(())
}

/// The value of `count` once it has not changed for 250 ms (mirrors are
/// sent in the background), within 5 s.
async fn settled(cx: &Ctx<'_>, count: &impl Fn(&Ctx<'_>) -> usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut last = count(cx);
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let now = count(cx);
        if now == last || std::time::Instant::now() >= deadline {
            return now;
        }
        last = now;
    }
}

pub async fn backend_weights(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(
        cx,
        SAME_NS,
        &[&infra("request-header-modifier-backend-weights")],
    )
    .await?;
    let case = same_ns("/").to("", INFRA);
    cx.expect(&case).await?;
    for i in 0..100 {
        let ex = cx.send(&case).await?;
        let echo = ex
            .echo
            .ok_or_else(|| anyhow!("request {i}: status {} without an echo body", ex.status))?;
        let backends = echo.header("Backend").unwrap_or_default();
        if backends.len() != 1 {
            bail!("request {i}: expected one Backend header, got {backends:?}");
        }
        if !echo.pod.starts_with(backends[0].as_str()) {
            bail!(
                "request {i}: Backend header {:?} set, but served by pod {}",
                backends[0],
                echo.pod
            );
        }
    }
    Ok(())
}

pub async fn retry(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    ready(cx, SAME_NS, &[&infra("retries")]).await?;
    let attempts3 = "/retry/code-500-attempts-3";
    let all2 = "/retry/code-all-attempts-2";
    // (path, simulated code, succeed after N failures, expected status)
    let table: &[(&str, u16, u32, u16)] = &[
        (attempts3, 500, 2, 200),
        (attempts3, 500, 4, 500),
        (attempts3, 503, 2, 503),
        (all2, 500, 1, 200),
        (all2, 500, 3, 500),
        (all2, 502, 1, 200),
        (all2, 502, 3, 502),
        (all2, 503, 1, 200),
        (all2, 503, 3, 503),
        (all2, 504, 1, 200),
        (all2, 504, 3, 504),
    ];
    // Each row must hold for three requests in a row, each with a fresh
    // uuid (the echo pod counts a request's attempts by it).
    let cx: &Ctx<'_> = cx;
    let rows = table.iter().map(|(path, code, after, status)| async move {
        let fresh = || {
            let uuid = format!("{:032x}", fastrand::u128(..));
            same_ns(&format!(
                "{path}?responseCode={code}&succeedAfter={after}&uuid={uuid}"
            ))
            .status(*status)
            .infra("infra-backend-v3")
        };
        converge(CONSECUTIVE_SUCCESSES, MAX_TIME_TO_CONSISTENCY, || async {
            let case = fresh();
            compare(&case, &cx.send(&case).await?).with_context(|| case.describe())
        })
        .await
    });
    let errors: Vec<String> = futures_util::future::join_all(rows)
        .await
        .into_iter()
        .filter_map(|o| o.err().map(|e| format!("{e:#}")))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        bail!(
            "{} of {} rows: {}",
            errors.len(),
            table.len(),
            errors.join("; ")
        )
    }
}

pub async fn cors(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let routes = [
        infra("cors-multiple-origins-methods-headers"),
        infra("cors-wildcard-methods"),
        infra("cors-wildcard-origin"),
        infra("cors-wildcard-methods-headers"),
    ];
    cx.accepted(SAME_NS, &[&routes[0], &routes[1]]).await?;
    for r in &routes {
        cx.resolved(r, SAME_NS).await?;
    }
    // A preflight: answered by the gateway itself (no backend namespace).
    let pre = |path: &str, origin: &str, method: &str, headers: Option<&str>| {
        let c = same_ns(path)
            .method("OPTIONS")
            .header("Origin", origin)
            .header("access-control-request-method", method);
        let c = match headers {
            Some(h) => c.header("access-control-request-headers", h),
            None => c,
        };
        c.to("", "")
    };
    let simple = |path: &str, method: &str, origin: &str| {
        same_ns(path)
            .method(method)
            .header("Origin", origin)
            .to("", INFRA)
    };
    let h12 = Some("x-header-1, x-header-2");
    let full = |c: Case, origin: &str| {
        c.resp_header_one_of("access-control-allow-origin", &[origin])
            .resp_header_one_of(
                "access-control-allow-methods",
                &["GET, OPTIONS", "OPTIONS, GET"],
            )
            .resp_header_one_of(
                "access-control-allow-headers",
                &["x-header-1, x-header-2", "x-header-2, x-header-1"],
            )
            .resp_header_one_of(
                "access-control-expose-headers",
                &["x-header-3, x-header-4", "x-header-4, x-header-3"],
            )
            .resp_header_one_of("access-control-max-age", &["3600"])
            .resp_header_one_of("access-control-allow-credentials", &["true"])
    };
    let acao = "access-control-allow-origin";
    let acac = "access-control-allow-credentials";
    let cases = vec![
        full(
            pre("/cors-1", "https://www.foo.com", "GET", h12).statuses(&[200, 204]),
            "https://www.foo.com",
        ),
        full(
            pre("/cors-1", "https://www.bar.com", "GET", h12),
            "https://www.bar.com",
        ),
        full(
            pre("/cors-1", "https://xpto.www.bar.com", "GET", h12),
            "https://xpto.www.bar.com",
        ),
        pre("/cors-1", "https://foobar.com", "GET", None)
            .statuses(&[200, 204, 403])
            .absent_resp(acao),
        simple("/cors-1", "GET", "https://www.foo.com")
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "x-header-1, x-header-2")
            .statuses(&[200, 204])
            .resp_header(acao, "https://www.foo.com"),
        simple("/cors-1", "GET", "https://www.bar.com")
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "x-header-1, x-header-2")
            .statuses(&[200, 204])
            .resp_header(acao, "https://www.bar.com"),
        simple("/cors-1", "GET", "https://foobar.com")
            .header("access-control-request-method", "GET")
            .absent_resp(acao),
        pre("/cors-2", "https://www.foo.com", "POST", None)
            .statuses(&[200, 204])
            .resp_header_one_of("access-control-allow-methods", &["POST", "*"])
            .resp_header(acao, "https://www.foo.com")
            .absent_resp(acac),
        pre("/cors-2", "https://www.foo.com", "POST", None).absent_resp(acac),
        pre("/cors-wildcard-origin", "https://foobar.com", "PUT", None)
            .statuses(&[200, 204])
            .resp_header_one_of(acao, &["https://foobar.com", "*"])
            .resp_header_one_of("access-control-allow-methods", &["PUT"])
            .absent_resp(acac),
        pre(
            "/cors-wildcard-origin",
            "https://foobar.com:12345",
            "PUT",
            None,
        )
        .statuses(&[200, 204])
        .resp_header_one_of(acao, &["https://foobar.com:12345", "*"])
        .resp_header_one_of("access-control-allow-methods", &["PUT"])
        .absent_resp(acac),
        simple("/cors-wildcard-origin", "PUT", "https://foobar.com:12345")
            .resp_header_one_of(acao, &["https://foobar.com:12345", "*"]),
        simple("/cors-wildcard-origin", "PUT", "https://foobar.com")
            .statuses(&[200, 204])
            .resp_header_one_of(acao, &["https://foobar.com", "*"])
            .absent_resp(acac),
        pre(
            "/cors-wildcard-methods-headers",
            "https://other.foo.com",
            "PUT",
            h12,
        )
        .resp_header_one_of(acao, &["https://other.foo.com"])
        .resp_header_one_of("access-control-allow-methods", &["PUT"])
        .resp_header_one_of(
            "access-control-allow-headers",
            &["x-header-1, x-header-2", "x-header-2, x-header-1"],
        )
        .resp_header_one_of(acac, &["true"]),
        pre(
            "/cors-wildcard-methods-headers-unauth",
            "https://other.foo.com",
            "PUT",
            h12,
        )
        .resp_header_one_of(acao, &["https://other.foo.com", "*"])
        .resp_header_one_of("access-control-allow-methods", &["PUT", "*"])
        .resp_header_one_of(
            "access-control-allow-headers",
            &["x-header-1, x-header-2", "x-header-2, x-header-1", "*"],
        )
        .absent_resp(acac),
        simple(
            "/cors-wildcard-methods-headers",
            "GET",
            "https://other.foo.com",
        )
        .header("Authorization", "Bearer test")
        .resp_header_one_of(acao, &["https://other.foo.com"])
        .resp_header_one_of(acac, &["true"]),
        simple(
            "/cors-wildcard-methods-headers-unauth",
            "GET",
            "https://other.foo.com",
        )
        .header("Authorization", "Bearer test")
        .resp_header_one_of(acao, &["https://other.foo.com"])
        .absent_resp(acac),
    ];
    all(cx, cases).await
}
