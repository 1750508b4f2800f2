//! `sluice convert ingress-nginx`, end to end: Ingress sets converted by
//! the real binary, the output served by the real binary to echo
//! backends, and every request answered by the backend ingress-nginx's
//! balancer (balancer.lua, `route_to_alternative_balancer`) picks for it.
//! The expected backends are written out by hand from that code, not
//! computed by the conversion.

use std::process::Command;

use crate::support::*;

/// A main Ingress on host `shop.example.com` with paths `/` and `/api`
/// (both Prefix) to Service `primary`, and a canary Ingress on `/api` to
/// `canary` with these annotations (without the prefix).
fn ingress_pair(canary_annotations: &[(&str, &str)]) -> String {
    let annotations: String = canary_annotations
        .iter()
        .map(|(k, v)| format!("    nginx.ingress.kubernetes.io/{k}: {v:?}\n"))
        .collect();
    format!(
        r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: shop, namespace: default, creationTimestamp: "2026-01-01T00:00:00Z"}}
spec:
  ingressClassName: nginx
  rules:
  - host: shop.example.com
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: primary, port: {{name: http}}}}}}}}
      - {{path: /api, pathType: Prefix, backend: {{service: {{name: primary, port: {{number: 8080}}}}}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop-canary
  namespace: default
  annotations:
    nginx.ingress.kubernetes.io/canary: "true"
{annotations}spec:
  ingressClassName: nginx
  rules:
  - host: shop.example.com
    http:
      paths:
      - {{path: /api, pathType: Prefix, backend: {{service: {{name: canary, port: {{number: 8080}}}}}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: primary, namespace: default}}
spec:
  ports:
  - {{name: http, port: 8080}}
"#
    )
}

/// Run `sluice convert ingress-nginx` on `yaml`: (exit code, stdout, stderr).
fn convert(yaml: &str, args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("ingresses.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["convert", "ingress-nginx", "-f"])
        .arg(&file)
        .args(args)
        .output()
        .expect("sluice runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A request and the Service ingress-nginx sends it to.
struct Case {
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    backend: &'static str,
}

const fn case(
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    backend: &'static str,
) -> Case {
    Case {
        path,
        headers,
        backend,
    }
}

/// Convert the pair, serve the output, and check every case.
async fn replay(canary_annotations: &[(&str, &str)], cases: &[Case]) {
    let (code, routes, report) = convert(
        &ingress_pair(canary_annotations),
        &["--gateway", "default/gw"],
    );
    assert!(code == 0 || code == 1, "exit {code}: {report}");
    let primary = Pods::start("default", "primary", 1).await;
    let canary = Pods::start("default", "canary", 1).await;
    // The converted output names the Service `primary` already; the pods'
    // manifests bring it again with its EndpointSlices (same spec).
    let manifests = gateway() + &primary.manifests() + &canary.manifests();
    let gw = Sluice::start(&[("base.yaml", manifests), ("routes.yaml", routes.clone())]).await;
    let mut conn = gw.connect().await;
    for c in cases {
        let got = conn
            .get_with("shop.example.com", c.path, c.headers)
            .await
            .pod();
        let service = got.rsplit_once('-').map_or(got.as_str(), |(s, _)| s);
        assert_eq!(
            service, c.backend,
            "{canary_annotations:?}: GET {} {:?}\n{routes}",
            c.path, c.headers
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_always_never_then_cookie_then_weight() {
    replay(
        &[
            ("canary-by-header", "X-Canary"),
            ("canary-by-cookie", "beta"),
            ("canary-weight", "0"),
        ],
        &[
            case("/api", &[], "primary"),
            case("/api/x", &[("x-canary", "always")], "canary"),
            // The canary is only on /api: / stays on the primary.
            case("/", &[("x-canary", "always")], "primary"),
            // "never" ends the ladder: the cookie is not read.
            case(
                "/api",
                &[("x-canary", "never"), ("cookie", "beta=always")],
                "primary",
            ),
            // Any other value falls through to the cookie.
            case(
                "/api",
                &[("x-canary", "other"), ("cookie", "beta=always")],
                "canary",
            ),
            // Case-sensitive: "Always" is another value, then weight 0.
            case("/api", &[("x-canary", "Always")], "primary"),
            case("/api", &[("cookie", "beta=always")], "canary"),
            case("/api", &[("cookie", "a=1; beta=always; b=2")], "canary"),
            case("/api", &[("cookie", "beta=never")], "primary"),
            // nginx's $cookie_beta is the first cookie of that name.
            case("/api", &[("cookie", "beta=never; beta=always")], "primary"),
            case("/api", &[("cookie", "beta=maybe")], "primary"),
            case("/api", &[("cookie", "xbeta=always")], "primary"),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_value_makes_always_and_never_plain_values() {
    replay(
        &[
            ("canary-by-header", "X-Canary"),
            ("canary-by-header-value", "blue"),
            ("canary-by-cookie", "beta"),
        ],
        &[
            case("/api", &[("x-canary", "blue")], "canary"),
            case("/api", &[("x-canary", "Blue")], "primary"),
            case("/api", &[("x-canary", "always")], "primary"),
            // "never" is a plain value now: it falls through to the cookie.
            case(
                "/api",
                &[("x-canary", "never"), ("cookie", "beta=always")],
                "canary",
            ),
            case(
                "/api",
                &[("x-canary", "blue"), ("cookie", "beta=never")],
                "canary",
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_pattern_is_unanchored_and_ignored_beside_a_value() {
    replay(
        &[
            ("canary-by-header", "X-Canary"),
            ("canary-by-header-pattern", "b[0-9]+"),
        ],
        &[
            case("/api", &[("x-canary", "b12")], "canary"),
            case("/api", &[("x-canary", "xxb7yy")], "canary"),
            case("/api", &[("x-canary", "b")], "primary"),
            // With a pattern, "always" is matched against it like any value.
            case("/api", &[("x-canary", "always")], "primary"),
        ],
    )
    .await;
    replay(
        &[
            ("canary-by-header", "X-Canary"),
            ("canary-by-header-value", "exact"),
            ("canary-by-header-pattern", ".*"),
        ],
        &[
            case("/api", &[("x-canary", "exact")], "canary"),
            case("/api", &[("x-canary", "other")], "primary"),
        ],
    )
    .await;
}

/// Requests to /api answered by the canary, out of `n`.
async fn canary_share(canary_annotations: &[(&str, &str)], n: usize) -> usize {
    let (code, routes, report) = convert(
        &ingress_pair(canary_annotations),
        &["--gateway", "default/gw"],
    );
    assert_eq!(code, 0, "{report}");
    let primary = Pods::start("default", "primary", 1).await;
    let canary = Pods::start("default", "canary", 1).await;
    let manifests = gateway() + &primary.manifests() + &canary.manifests();
    let gw = Sluice::start(&[("base.yaml", manifests), ("routes.yaml", routes)]).await;
    let mut conn = gw.connect().await;
    let tally = by_service(&conn.tally(n, "shop.example.com", "/api", &[]).await);
    assert_eq!(
        tally.values().sum::<usize>(),
        n,
        "only the two backends answer: {tally:?}"
    );
    tally.get("canary").copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_by_share_with_and_without_weight_total() {
    // (annotations, ingress-nginx's canary share in percent:
    // math.random(total) <= weight, total only when above 100)
    type Pairs<'a> = &'a [(&'a str, &'a str)];
    let table: &[(Pairs<'_>, usize)] = &[
        (&[("canary-weight", "30")], 30),
        // ingress2gateway gives this one 50%; nginx ignores a total <= 100.
        (
            &[("canary-weight", "25"), ("canary-weight-total", "50")],
            25,
        ),
        (
            &[("canary-weight", "250"), ("canary-weight-total", "1000")],
            25,
        ),
        (&[("canary-weight", "100")], 100),
        (&[("canary-weight", "150")], 100),
    ];
    let n = 400;
    for (annotations, percent) in table {
        let got = canary_share(annotations, n).await;
        let want = n * percent / 100;
        // The balancer draws at random; sluice's split is exact per
        // request: 5 points either side is far beyond either's error.
        assert!(
            got.abs_diff(want) <= n / 20,
            "{annotations:?}: canary got {got} of {n}, ingress-nginx gives {want}"
        );
    }
}

#[test]
fn the_report_names_each_annotation_and_the_exit_code_says_how_exact() {
    let (code, out, err) = convert(
        &ingress_pair(&[
            ("canary-by-header", "X-Canary"),
            ("canary-by-cookie", "beta"),
        ]),
        &["--gateway", "default/gw"],
    );
    assert_eq!(
        code, 0,
        "cookie canaries are exact through sluice's extension: {err}"
    );
    assert!(out.contains("kind: HTTPRoute"), "{out}");
    assert!(
        err.contains(
            "Ingress default/shop-canary: nginx.ingress.kubernetes.io/canary-by-cookie: extension ("
        ) && err.contains(
            "Ingress default/shop-canary: nginx.ingress.kubernetes.io/canary-by-header: converted"
        ),
        "{err}"
    );

    // A canary on a path no main Ingress serves: named, and exit 1.
    let unmatched = ingress_pair(&[("canary-weight", "10")]).replace(
        "{path: /api, pathType: Prefix, backend: {service: {name: canary",
        "{path: /other, pathType: Prefix, backend: {service: {name: canary",
    );
    let (code, out, err) = convert(&unmatched, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("Ingress default/shop-canary: spec.rules[0].http.paths[0]: error (no main Ingress serves host \"shop.example.com\" path \"/other\" (Prefix)"),
        "{err}"
    );
    // Without --gateway the output brings its GatewayClass and Gateway.
    assert!(
        out.contains("kind: GatewayClass") && out.contains("kind: Gateway\n"),
        "{out}"
    );

    // An unsupported annotation is named, and exit 1.
    let snippet = ingress_pair(&[]).replace(
        "metadata: {name: shop, namespace: default, creationTimestamp: \"2026-01-01T00:00:00Z\"}",
        "metadata:\n  name: shop\n  annotations: {nginx.ingress.kubernetes.io/configuration-snippet: \"more_set_headers x;\"}",
    );
    let (code, _, err) = convert(&snippet, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "Ingress default/shop: nginx.ingress.kubernetes.io/configuration-snippet: unsupported ("
        ),
        "{err}"
    );

    // Input that cannot be read: exit 2, naming the file.
    let (code, out, err) = convert("kind: [unclosed", &[]);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty() && err.contains("ingresses.yaml"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_ingress_class_serves_the_ingresses_as_converted() {
    let primary = Pods::start("default", "primary", 1).await;
    let canary = Pods::start("default", "canary", 1).await;
    // The pods' manifests bring Service `primary` with an unnamed port, and
    // the first manifest of a Service wins: name the port by number here.
    let pair = ingress_pair(&[
        ("canary-by-header", "X-Canary"),
        ("canary-by-cookie", "beta"),
    ])
    .replace("port: {name: http}", "port: {number: 8080}");
    // Another class, not served.
    let other = "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: other}\nspec:\n  ingressClassName: traefik\n  rules:\n  - host: other.example.com\n    http:\n      paths:\n      - {path: /, pathType: Prefix, backend: {service: {name: canary, port: {number: 8080}}}}\n";
    let manifests = gateway() + &primary.manifests() + &canary.manifests();
    let gw = Sluice::start_with(
        &[("base.yaml", manifests), ("ingresses.yaml", pair + other)],
        &[
            "--ingress-class",
            "nginx",
            "--ingress-gateway",
            "default/gw",
        ],
    )
    .await;
    let mut conn = gw.connect().await;
    for (path, headers, backend) in [
        ("/api", &[("x-canary", "always")][..], "canary"),
        (
            "/api",
            &[("x-canary", "never"), ("cookie", "beta=always")][..],
            "primary",
        ),
        ("/api", &[("cookie", "beta=always")][..], "canary"),
        ("/api", &[][..], "primary"),
        ("/", &[("x-canary", "always")][..], "primary"),
    ] {
        let pod = conn.get_with("shop.example.com", path, headers).await.pod();
        assert!(
            pod.starts_with(&format!("{backend}-")),
            "{path} {headers:?}: {pod}"
        );
    }
    assert_eq!(
        conn.get("other.example.com", "/").await.status.as_u16(),
        404
    );
    let status = gw.status().await;
    let route = status
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "HTTPRoute" && o["metadata"]["name"] == "shop")
        .expect("the converted route is in /status");
    assert_eq!(
        route["status"]["parents"][0]["conditions"][0]["status"], "True",
        "{route}"
    );
}

/// `enable-cors` with one origin listed and the other settings at
/// ingress-nginx's defaults, converted and served: a preflight from the
/// origin is answered by the gateway with ingress-nginx's lists (written
/// out by the conversion), one from another origin gets no CORS headers,
/// and a plain request from the origin reaches the backend and carries the
/// origin back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enable_cors_is_served_with_ingress_nginx_s_defaults() {
    let ingress = r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: app
  namespace: default
  annotations:
    nginx.ingress.kubernetes.io/enable-cors: "true"
    nginx.ingress.kubernetes.io/cors-allow-origin: "https://web.example"
spec:
  ingressClassName: nginx
  rules:
  - host: app.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: app, port: {number: 8080}}}}
"#;
    let (code, routes, report) = convert(ingress, &["--gateway", "default/gw"]);
    assert_eq!(code, 0, "every CORS annotation converts exactly: {report}");
    assert!(
        report.contains("nginx.ingress.kubernetes.io/enable-cors: converted"),
        "{report}"
    );
    let (app, gw) = serve_on_app(&routes).await;
    let mut conn = gw.connect().await;
    let options = |origin: &str| {
        hyper::Request::options("/cart")
            .header("host", "app.example.com")
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .expect("request")
    };
    let header = |r: &Resp, name: &str| {
        r.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let r = conn.send(options("https://web.example")).await;
    assert!(r.status.is_success(), "{}: {routes}", r.status);
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some("https://web.example")
    );
    assert_eq!(
        header(&r, "access-control-allow-methods").as_deref(),
        Some("GET, PUT, POST, DELETE, PATCH, OPTIONS")
    );
    assert_eq!(
        header(&r, "access-control-max-age").as_deref(),
        Some("1728000")
    );
    assert_eq!(
        header(&r, "access-control-allow-credentials").as_deref(),
        Some("true")
    );
    assert_eq!(app.requests(), 0, "the gateway answers preflights itself");

    let r = conn.send(options("https://elsewhere.example")).await;
    assert_eq!(header(&r, "access-control-allow-origin"), None);

    let r = conn
        .get_with(
            "app.example.com",
            "/cart",
            &[("origin", "https://web.example")],
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.pod(), "app-0");
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some("https://web.example")
    );
}

/// `backend-protocol: GRPC` on a main Ingress with a header canary:
/// converted to a GRPCRoute (a path per service or method), served by
/// the binary to gRPC echo backends over h2c: calls with the canary
/// header reach the canary, others the primary. An HTTP-only annotation
/// beside it is an
/// error in the report (exit 1), and the rest is still converted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_protocol_grpc_becomes_a_grpcroute() {
    use crate::grpc::{grpc_server, pod};
    use sluice::grpc_echo::code;
    const SERVICE: &str = "gateway_api_conformance.echo_basic.grpcecho.GrpcEcho";
    let ingresses = format!(
        r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: rpc
  namespace: default
  annotations:
    nginx.ingress.kubernetes.io/backend-protocol: GRPC
spec:
  ingressClassName: nginx
  rules:
  - host: rpc.example.com
    http:
      paths:
      - {{path: /{SERVICE}, pathType: Prefix, backend: {{service: {{name: primary, port: {{number: 8080}}}}}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: rpc-canary
  namespace: default
  annotations:
    nginx.ingress.kubernetes.io/canary: "true"
    nginx.ingress.kubernetes.io/canary-by-header: X-Canary
spec:
  ingressClassName: nginx
  rules:
  - host: rpc.example.com
    http:
      paths:
      - {{path: /{SERVICE}, pathType: Prefix, backend: {{service: {{name: canary, port: {{number: 8080}}}}}}}}
"#
    );
    let (code, routes, report) = convert(&ingresses, &["--gateway", "default/gw"]);
    assert_eq!(code, 0, "{report}");
    assert!(routes.contains("kind: GRPCRoute"), "{routes}");
    assert!(!routes.contains("kind: HTTPRoute"), "{routes}");

    let with_rewrite = ingresses.replacen(
        "backend-protocol: GRPC\n",
        "backend-protocol: GRPC\n    nginx.ingress.kubernetes.io/rewrite-target: /other\n",
        1,
    );
    let (code, again, report) = convert(&with_rewrite, &["--gateway", "default/gw"]);
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains("nginx.ingress.kubernetes.io/rewrite-target: error"),
        "{report}"
    );
    assert!(
        !again.contains("URLRewrite") && again.contains("kind: GRPCRoute"),
        "{again}"
    );

    let (primary, canary) = (grpc_server("primary").await, grpc_server("canary").await);
    let manifests = gateway()
        + &static_service("primary", None, 8080, None, primary.local_addr().port())
        + &static_service("canary", None, 8080, None, canary.local_addr().port());
    let gw = Sluice::start(&[("base.yaml", manifests), ("routes.yaml", routes.clone())]).await;
    let call = |md: &[(&str, &str)]| {
        let md: Vec<(String, String)> = md
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let addr = gw.addr();
        async move {
            sluice::grpc_echo::call_h2c(addr, "rpc.example.com", "Echo", &md)
                .await
                .expect("the gateway answers the call")
        }
    };
    for (md, backend) in [
        (&[][..], "primary"),
        (&[("x-canary", "always")][..], "canary"),
        (&[("x-canary", "never")][..], "primary"),
    ] {
        let reply = call(md).await;
        assert_eq!(reply.code, code::OK, "{md:?}: {reply:?}\n{routes}");
        assert_eq!(pod(&reply), backend, "{md:?}\n{routes}");
    }
}

/// ingress-nginx's prefix-stripping idiom (path `/api(/|$)(.*)`,
/// `rewrite-target: /$2`, and `/v2/$2` for a new prefix), converted and
/// served: the backend sees the path with the prefix stripped (or
/// replaced), and a path that only starts with the same letters is not
/// taken. Reported approximated (nginx's regex location is
/// case-insensitive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_target_prefix_stripping_becomes_replace_prefix_match() {
    let ingress = |name: &str, prefix: &str, target: &str| {
        format!(
            r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: {name}
  namespace: default
  annotations:
    nginx.ingress.kubernetes.io/use-regex: "true"
    nginx.ingress.kubernetes.io/rewrite-target: "{target}"
spec:
  ingressClassName: nginx
  rules:
  - host: app.example.com
    http:
      paths:
      - {{path: "{prefix}(/|$)(.*)", pathType: ImplementationSpecific, backend: {{service: {{name: app, port: {{number: 8080}}}}}}}}
"#
        )
    };
    let input = ingress("strip", "/api", "/$2") + "---\n" + &ingress("moved", "/old", "/v2/$2");
    let (code, routes, report) = convert(&input, &["--gateway", "default/gw"]);
    assert_eq!(code, 1, "approximated: {report}");
    assert!(
        report.contains("nginx.ingress.kubernetes.io/rewrite-target: approximated"),
        "{report}"
    );
    assert!(routes.contains("ReplacePrefixMatch"), "{routes}");
    let (_app, gw) = serve_on_app(&routes).await;
    let mut conn = gw.connect().await;
    for (path, seen) in [
        ("/api/cart/1?x=1", "/cart/1?x=1"),
        ("/api", "/"),
        ("/api/", "/"),
        ("/old/items", "/v2/items"),
    ] {
        let r = conn.get("app.example.com", path).await;
        assert_eq!(r.status, 200, "{path}\n{routes}");
        assert_eq!(r.echo().path, seen, "{path}\n{routes}");
    }
    assert_eq!(
        conn.get("app.example.com", "/apis").await.status,
        404,
        "/apis is not under /api\n{routes}"
    );
}

/// An Ingress with TLS for one of its hosts, converted without --gateway
/// (the generated Gateway's ports 80 and 443 moved to the test's) and
/// served: plain HTTP to the TLS host gets ingress-nginx's 308 to https
/// with path and query kept and no port, HTTPS to it reaches the backend,
/// and the host without TLS is served on plain HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_hosts_redirect_plain_http_to_https_with_308() {
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::rt::TokioIo;

    let ingress = r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  namespace: default
  annotations:
    nginx.ingress.kubernetes.io/preserve-trailing-slash: "true"
spec:
  ingressClassName: nginx
  tls:
  - {hosts: [secure.example.com], secretName: shop-cert}
  rules:
  - host: secure.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: shop, port: {number: 8080}}}}
  - host: plain.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: shop, port: {number: 8080}}}}
"#;
    let (code, out, report) = convert(ingress, &[]);
    assert_eq!(code, 0, "the redirect is written exactly: {report}");
    assert!(
        report.contains("Ingress default/shop: default ssl-redirect: converted"),
        "{report}"
    );
    assert!(
        out.contains("name: shop-secure-example-com-https-redirect"),
        "{out}"
    );
    let http_port = free_port();
    let out = out
        .replace("port: 80\n", &format!("port: {http_port}\n"))
        .replace("port: 443\n", "port: {{PORT}}\n");
    let ca = TestCa::new();
    let leaf = ca.issue(&["secure.example.com"]);
    let shop = Pods::start("default", "shop", 1).await;
    let gw = Sluice::start(&[
        (
            "base.yaml",
            shop.manifests() + &tls_secret("default", "shop-cert", &leaf),
        ),
        ("routes.yaml", out.clone()),
    ])
    .await;

    let mut plain = Conn::open(std::net::SocketAddr::from(([127, 0, 0, 1], http_port))).await;
    // The Host's port is dropped, and none added (443).
    let with_port = format!("secure.example.com:{http_port}");
    for (host, path, location) in [
        (
            "secure.example.com",
            "/cart?id=7",
            "https://secure.example.com/cart?id=7",
        ),
        (
            with_port.as_str(),
            "/docs/",
            "https://secure.example.com/docs/",
        ),
    ] {
        let r = plain.get(host, path).await;
        assert_eq!(r.status, 308, "{host} {path}\n{out}");
        assert_eq!(
            r.headers.get("location").and_then(|v| v.to_str().ok()),
            Some(location),
            "{host} {path}"
        );
    }
    assert_eq!(shop.requests(), 0, "the gateway answers the redirects");
    let r = plain.get("plain.example.com", "/cart?id=7").await;
    assert_eq!(r.status, 200, "the host without TLS stays on http\n{out}");
    assert_eq!(r.echo().path, "/cart?id=7");

    let tls = tls_connect(&gw, &ca.connector(&[b"http/1.1"]), "secure.example.com")
        .await
        .expect("TLS handshake with the Secret's certificate");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("http/1.1 over TLS");
    tokio::spawn(conn);
    let req = hyper::Request::get("/cart?id=7")
        .header("host", "secure.example.com")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let r = Resp::read(send.send_request(req).await.expect("gateway answers"))
        .await
        .expect("whole body");
    assert_eq!(r.status, 200, "{out}");
    assert_eq!(r.pod(), "shop-0");
}

/// Pods of Service `app` and the binary serving them with the converted
/// `routes` on the test Gateway.
async fn serve_on_app(routes: &str) -> (Pods, Sluice) {
    let app = Pods::start("default", "app", 1).await;
    let gw = Sluice::start(&[
        ("base.yaml", gateway() + &app.manifests()),
        ("routes.yaml", routes.to_string()),
    ])
    .await;
    (app, gw)
}

/// `backend-protocol: HTTPS` converted and served to a TLS backend the
/// test runs. With `proxy-ssl-verify: on`, `proxy-ssl-name` and the CA in
/// the `proxy-ssl-secret` Secret: exact (exit 0), the CA written as a
/// ConfigMap, and the backend reached over TLS with that name as SNI.
/// With ingress-nginx's default (no verification, no CA): approximated
/// (exit 1), and the strict form fails the requests (502) until the
/// ConfigMap the policy names is given, then reaches the backend with
/// the Service's cluster DNS name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_protocol_https_reaches_a_tls_backend_through_a_backend_tls_policy() {
    use crate::backend_tls::TlsBackend;
    let ca = TestCa::new();
    let leaf = ca.issue(&["app.internal", "app.default.svc.cluster.local"]);
    let backend = TlsBackend::start(&leaf, &TestCa::named("client CA, unused")).await;
    let ingress = |annotations: &str| {
        format!(
            r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: app
  namespace: default
  annotations:
    nginx.ingress.kubernetes.io/backend-protocol: HTTPS
{annotations}spec:
  ingressClassName: nginx
  rules:
  - host: app.example.com
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: app, port: {{number: 443}}}}}}}}
"#
        )
    };
    let secret = format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: backend-ca, namespace: default}}\ndata:\n  ca.crt: {}\n",
        base64(ca.pem.as_bytes())
    );
    let base = gateway() + &static_service("app", Some("https"), 443, None, backend.addr.port());

    let verified = ingress(
        "    nginx.ingress.kubernetes.io/proxy-ssl-verify: \"on\"\n    nginx.ingress.kubernetes.io/proxy-ssl-secret: default/backend-ca\n    nginx.ingress.kubernetes.io/proxy-ssl-name: app.internal\n",
    ) + &secret;
    let (code, routes, report) = convert(&verified, &["--gateway", "default/gw"]);
    assert_eq!(code, 0, "verified with the Secret's CA is exact: {report}");
    assert!(
        routes.contains("kind: BackendTLSPolicy") && routes.contains("\nkind: ConfigMap\n"),
        "{routes}"
    );
    let gw = Sluice::start(&[("base.yaml", base.clone()), ("routes.yaml", routes.clone())]).await;
    let r = gw.connect().await.get("app.example.com", "/cart").await;
    assert_eq!(r.status, 200, "{routes}");
    assert_eq!(&r.body[..], b"hello over TLS");
    assert_eq!(
        backend.seen().last().and_then(|s| s.sni.clone()).as_deref(),
        Some("app.internal")
    );
    drop(gw);

    let (code, routes, report) = convert(&ingress(""), &["--gateway", "default/gw"]);
    assert_eq!(code, 1, "{report}");
    assert!(
        report.contains(
            "Ingress default/app: nginx.ingress.kubernetes.io/backend-protocol: approximated ("
        ) && report.contains("does not verify the backend's certificate"),
        "{report}"
    );
    assert!(!routes.contains("\nkind: ConfigMap\n"), "{routes}");
    let gw = Sluice::start(&[("base.yaml", base.clone()), ("routes.yaml", routes.clone())]).await;
    let r = gw.connect().await.get("app.example.com", "/cart").await;
    assert_eq!(r.status, 502, "no CA yet: the requests fail\n{routes}");
    drop(gw);
    let gw = Sluice::start(&[
        ("base.yaml", base + &ca_config_map("app-backend-ca", &ca)),
        ("routes.yaml", routes.clone()),
    ])
    .await;
    let r = gw.connect().await.get("app.example.com", "/cart").await;
    assert_eq!(r.status, 200, "{routes}");
    assert_eq!(
        backend.seen().last().and_then(|s| s.sni.clone()).as_deref(),
        Some("app.default.svc.cluster.local")
    );
}

/// `affinity: cookie` on the main Ingress of a 50% weight canary
/// (`affinity-canary-behavior` at its default, sticky), converted and
/// served: each new client is balanced and gets ingress-nginx's cookie
/// name, and every later request with the cookie stays on the pod it
/// first reached, on the primary and on the canary alike, as ingress-nginx
/// checks the session before the weight. Reported approximated (the
/// default affinity-mode balanced, SameSite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_pins_sessions_on_primary_and_canary_before_the_weight() {
    let pair = ingress_pair(&[("canary-weight", "50")]).replace(
        "metadata: {name: shop, namespace: default, creationTimestamp: \"2026-01-01T00:00:00Z\"}",
        "metadata:\n  name: shop\n  namespace: default\n  annotations: {nginx.ingress.kubernetes.io/affinity: cookie}",
    );
    let (code, routes, report) = convert(&pair, &["--gateway", "default/gw"]);
    assert_eq!(code, 1, "{report}");
    assert!(
        report
            .contains("Ingress default/shop: nginx.ingress.kubernetes.io/affinity: approximated (")
            && report.contains("balanced"),
        "{report}"
    );
    let primary = Pods::start("default", "primary", 2).await;
    let canary = Pods::start("default", "canary", 2).await;
    let manifests = gateway() + &primary.manifests() + &canary.manifests();
    let gw = Sluice::start(&[("base.yaml", manifests), ("routes.yaml", routes.clone())]).await;
    let mut first_pods = std::collections::BTreeSet::new();
    for client in 0..16 {
        let mut conn = gw.connect().await;
        let r = conn.get("shop.example.com", "/api").await;
        assert_eq!(r.status, 200, "{routes}");
        let pod = r.pod();
        let cookie = r
            .headers
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .unwrap_or_else(|| panic!("client {client}: no session cookie\n{routes}"))
            .to_string();
        assert!(cookie.starts_with("INGRESSCOOKIE="), "{cookie}");
        for _ in 0..5 {
            let again = conn
                .get_with("shop.example.com", "/api", &[("cookie", &cookie)])
                .await
                .pod();
            assert_eq!(again, pod, "client {client} with {cookie}");
        }
        first_pods.insert(pod);
    }
    let services: std::collections::BTreeSet<&str> = first_pods
        .iter()
        .map(|p| p.rsplit_once('-').map_or(p.as_str(), |(s, _)| s))
        .collect();
    assert_eq!(
        services.into_iter().collect::<Vec<_>>(),
        ["canary", "primary"],
        "new clients follow the weight: {first_pods:?}"
    );
}

/// `sluice check --ingress-class nginx --ingress-gateway default/gw`
/// through the binary: the converted routes are checked with the other
/// objects and the conversion report is printed; an exact pair exits 0,
/// an unsupported annotation is a problem (exit 1), and without the flags
/// the Ingresses are not checked.
#[test]
fn check_with_ingress_class_shows_the_converted_routes_and_the_report() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = gateway().replace("{{PORT}}", "8080")
        + &static_service("primary", Some("http"), 8080, None, 9)
        + &static_service("canary", None, 8080, None, 9);
    std::fs::write(dir.path().join("base.yaml"), base).unwrap();
    let check = |ingresses: &str, flags: bool| {
        std::fs::write(dir.path().join("ingresses.yaml"), ingresses).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("check").arg("-f").arg(dir.path());
        if flags {
            cmd.args([
                "--ingress-class",
                "nginx",
                "--ingress-gateway",
                "default/gw",
            ]);
        }
        let out = cmd.output().expect("sluice runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stdout).unwrap(),
        )
    };
    // The pair's own Service `primary` would be a duplicate of base.yaml's.
    let pair = ingress_pair(&[("canary-by-header", "X-Canary")]);
    let pair = &pair[..pair.rfind("---\napiVersion: v1\nkind: Service").unwrap()];
    let (code, out) = check(pair, true);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("HTTPRoute default/shop "), "{out}");
    assert!(
        out.contains(
            "ingress-nginx conversion (Ingresses of class nginx, routes on Gateway default/gw"
        ) && out.contains(
            "  Ingress default/shop-canary: nginx.ingress.kubernetes.io/canary-by-header: converted"
        ),
        "{out}"
    );

    let snippet = pair.replace(
        "metadata: {name: shop, namespace: default, creationTimestamp: \"2026-01-01T00:00:00Z\"}",
        "metadata:\n  name: shop\n  namespace: default\n  annotations: {nginx.ingress.kubernetes.io/configuration-snippet: \"more_set_headers x;\"}",
    );
    let (code, out) = check(&snippet, true);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "Ingress default/shop: nginx.ingress.kubernetes.io/configuration-snippet: unsupported ("
        ) && out.contains("FAIL"),
        "{out}"
    );

    let (code, out) = check(pair, false);
    assert_eq!(code, 0, "{out}");
    assert!(
        !out.contains("HTTPRoute default/shop") && !out.contains("ingress-nginx conversion"),
        "{out}"
    );
}

/// `backend-protocol: GRPCS` with the backend's CA in `proxy-ssl-secret`,
/// `proxy-ssl-verify: on` and `proxy-ssl-name`: a GRPCRoute and a
/// BackendTLSPolicy (exact, exit 0), served: a call reaches the TLS gRPC
/// backend over HTTP/2 with that name as SNI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_protocol_grpcs_reaches_a_tls_grpc_backend() {
    use sluice::echo::EchoIdentity;
    use sluice::grpc_echo::{GrpcEchoServer, code};
    const SERVICE: &str = "gateway_api_conformance.echo_basic.grpcecho.GrpcEcho";
    let ca = TestCa::new();
    let backend = GrpcEchoServer::start_tls(
        EchoIdentity {
            pod: "primary".into(),
            namespace: "default".into(),
            service: "primary".into(),
        },
        ca.issue(&["rpc.internal"]).server_config(),
    )
    .await
    .expect("TLS gRPC backend");
    let ingress = format!(
        r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: rpc
  namespace: default
  annotations:
    nginx.ingress.kubernetes.io/backend-protocol: GRPCS
    nginx.ingress.kubernetes.io/proxy-ssl-verify: "on"
    nginx.ingress.kubernetes.io/proxy-ssl-secret: default/rpc-ca
    nginx.ingress.kubernetes.io/proxy-ssl-name: rpc.internal
spec:
  ingressClassName: nginx
  rules:
  - host: rpc.example.com
    http:
      paths:
      - {{path: /{SERVICE}, pathType: Prefix, backend: {{service: {{name: primary, port: {{number: 8443}}}}}}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: rpc-ca, namespace: default}}
data:
  ca.crt: {}
"#,
        base64(ca.pem.as_bytes())
    );
    let (code, routes, report) = convert(&ingress, &["--gateway", "default/gw"]);
    assert_eq!(code, 0, "{report}");
    assert!(
        routes.contains("kind: GRPCRoute") && routes.contains("kind: BackendTLSPolicy"),
        "{routes}"
    );
    let manifests =
        gateway() + &static_service("primary", None, 8443, None, backend.local_addr().port());
    let gw = Sluice::start(&[("base.yaml", manifests), ("routes.yaml", routes.clone())]).await;
    let reply = sluice::grpc_echo::call_h2c(gw.addr(), "rpc.example.com", "Echo", &[])
        .await
        .expect("the gateway answers the call");
    assert_eq!(reply.code, code::OK, "{reply:?}\n{routes}");
    let a = reply.response.expect("a response").assertions;
    assert_eq!(a.context.pod, "primary");
    let tls = a.tls.expect("the backend saw TLS");
    assert_eq!(tls.server_name, "rpc.internal");
    assert_eq!(tls.negotiated_protocol, "h2");
}
