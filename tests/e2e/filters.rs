//! Filters: RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect,
//! URLRewrite and RequestMirror, configured in manifests and observed on
//! both sides of the gateway.

use std::time::{Duration, Instant};

use crate::support::*;

async fn gateway_with(rules: &str, services: &[&str]) -> (Sluice, Vec<Pods>) {
    let mut manifests = gateway();
    let mut pods = Vec::new();
    for s in services {
        let p = Pods::start("default", s, 1).await;
        manifests += &p.manifests();
        pods.push(p);
    }
    manifests += &route("default", "filters", rules);
    (Sluice::start(&[("all.yaml", manifests)]).await, pods)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_modifiers_edit_the_request_and_the_response() {
    let rules = r#"  rules:
  - filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: X-Env, value: prod}]
        add: [{name: X-Added, value: "1"}]
        remove: [X-Secret]
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        set: [{name: X-Served-By, value: sluice}]
        add: [{name: X-Resp-Added, value: "a"}]
        remove: [X-Backend-Internal]
    backendRefs: [{name: app, port: 8080}]"#;
    let (gw, _pods) = gateway_with(rules, &["app"]).await;
    let mut c = gw.connect().await;
    let r = c
        .get_with(
            "h",
            "/",
            &[
                ("x-env", "staging"),
                ("x-added", "0"),
                ("x-secret", "token"),
                (
                    "x-echo-set-header",
                    "X-Backend-Internal:leak, X-Served-By:backend",
                ),
            ],
        )
        .await;
    assert_eq!(r.status, 200);
    let e = r.echo();
    assert_eq!(e.header("x-env"), Some(&["prod".to_string()][..]));
    assert_eq!(
        e.header("x-added").map(|v| v.len()),
        Some(2),
        "{:?}",
        e.headers
    );
    assert_eq!(e.header("x-secret"), None);
    assert_eq!(r.headers["x-served-by"], "sluice");
    assert_eq!(r.headers["x-resp-added"], "a");
    assert!(r.headers.get("x-backend-internal").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_redirect_builds_the_location_and_never_reaches_a_backend() {
    let rules = r#"  rules:
  - matches: [{path: {type: PathPrefix, value: /old}}]
    filters:
    - type: RequestRedirect
      requestRedirect:
        scheme: https
        hostname: new.example.com
        path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}
        statusCode: 301
  - matches: [{path: {type: PathPrefix, value: /port}}]
    filters:
    - type: RequestRedirect
      requestRedirect:
        port: 8443
  - matches: [{path: {type: PathPrefix, value: /full}}]
    filters:
    - type: RequestRedirect
      requestRedirect:
        path: {type: ReplaceFullPath, replaceFullPath: /elsewhere}"#;
    let (gw, _pods) = gateway_with(rules, &[]).await;
    let mut c = gw.connect().await;
    let r = c.get("old.example.com", "/old/page?x=1").await;
    assert_eq!(r.status, 301);
    assert_eq!(
        r.headers["location"],
        "https://new.example.com/new/page?x=1"
    );
    let r = c.get("a.example.com", "/port/x").await;
    assert_eq!(r.status, 302, "the spec's default status");
    assert_eq!(r.headers["location"], "http://a.example.com:8443/port/x");
    let r = c.get("a.example.com", "/full/x").await;
    assert_eq!(
        r.headers["location"],
        format!("http://a.example.com:{}/elsewhere", gw.port)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_rewrite_changes_host_and_path_before_forwarding() {
    let rules = r#"  rules:
  - matches: [{path: {type: PathPrefix, value: /api}}]
    filters:
    - type: URLRewrite
      urlRewrite:
        hostname: internal.example.com
        path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}
    backendRefs: [{name: app, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /strip}}]
    filters:
    - type: URLRewrite
      urlRewrite:
        path: {type: ReplacePrefixMatch, replacePrefixMatch: /}
    backendRefs: [{name: app, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /full}}]
    filters:
    - type: URLRewrite
      urlRewrite:
        path: {type: ReplaceFullPath, replaceFullPath: /one}
    backendRefs: [{name: app, port: 8080}]"#;
    let (gw, _pods) = gateway_with(rules, &["app"]).await;
    let mut c = gw.connect().await;
    let e = c.get("public.example.com", "/api/users?id=7").await.echo();
    assert_eq!(e.host, "internal.example.com");
    assert_eq!(e.path, "/v2/users?id=7");
    assert_eq!(c.get("h", "/strip/a/b").await.echo().path, "/a/b");
    assert_eq!(c.get("h", "/strip").await.echo().path, "/");
    assert_eq!(c.get("h", "/full/a/b").await.echo().path, "/one");
    assert_eq!(c.get("h", "/strip").await.echo().host, "h");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_get_a_copy_and_the_client_never_waits_for_them() {
    // A mirror backend that accepts connections and never answers.
    let hanging = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hanging_port = hanging.local_addr().unwrap().port();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let held2 = held.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = hanging.accept().await {
            held2.lock().unwrap().push(s);
        }
    });
    let hang_service = format!(
        r#"
---
apiVersion: v1
kind: Service
metadata: {{name: hang}}
spec:
  ports: [{{port: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: hang-0
  labels: {{kubernetes.io/service-name: hang}}
addressType: IPv4
ports: [{{port: {hanging_port}}}]
endpoints: [{{addresses: ["127.0.0.1"]}}]
"#
    );
    let rules = r#"  rules:
  - filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: copy, port: 8080}}
    - type: RequestMirror
      requestMirror: {backendRef: {name: half, port: 8080}, percent: 50}
    - type: RequestMirror
      requestMirror: {backendRef: {name: hang, port: 8080}}
    backendRefs: [{name: app, port: 8080}]"#;
    let mut manifests = gateway() + &hang_service;
    let mut pods = Vec::new();
    for s in ["app", "copy", "half"] {
        let p = Pods::start("default", s, 1).await;
        manifests += &p.manifests();
        pods.push(p);
    }
    manifests += &route("default", "mirrored", rules);
    let gw = Sluice::start(&[("all.yaml", manifests)]).await;
    let mut c = gw.connect().await;
    // Every request is answered by the primary backend even though one
    // mirror never answers; 400 requests would take hours if the client
    // waited for it.
    for _ in 0..400 {
        let r = c.get_with("h", "/m?x=1", &[("x-trace", "t1")]).await;
        assert_eq!(r.pod(), "app-0");
    }
    // The copies arrive (fire and forget, so poll).
    let deadline = Instant::now() + Duration::from_secs(15);
    while pods[1].requests() < 400 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pods[1].requests(), 400);
    let copy = pods[1].servers[0].recent().pop().unwrap();
    assert_eq!(copy.path, "/m?x=1");
    assert_eq!(copy.header("x-trace"), Some(&["t1".to_string()][..]));
    // percent: 50 mirrors exactly half: sluice samples mirrors like it
    // splits weights, not by a random draw.
    while pods[2].requests() < 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pods[2].requests(), 200);
    assert!(
        !held.lock().unwrap().is_empty(),
        "the hanging mirror was contacted"
    );
}
