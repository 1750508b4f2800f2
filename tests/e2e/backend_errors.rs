//! The spec's error semantics for backends: an invalid backendRef keeps its
//! share and that share gets 500 (never redistributed); a Service without
//! ready endpoints gets 503; a backend that refuses the connection gets 502.
//! Status conditions say why.

use crate::support::*;

fn condition<'a>(parent: &'a serde_json::Value, kind: &str) -> &'a serde_json::Value {
    parent["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind))
        .unwrap_or_else(|| panic!("no {kind} condition in {parent:#}"))
}

/// The route's single `parents[]` entry.
async fn route_parent(gw: &Sluice, ns: &str, name: &str) -> serde_json::Value {
    let route = gw.object_status("HTTPRoute", Some(ns), name).await;
    let parents = route["status"]["parents"]
        .as_array()
        .expect("parents[]")
        .clone();
    assert_eq!(parents.len(), 1, "{route:#}");
    assert_eq!(
        parents[0]["controllerName"],
        "sluice.dev/gateway-controller"
    );
    parents[0].clone()
}

fn two_backends(name: &str, host: &str, second: &str) -> String {
    route(
        "default",
        name,
        &format!(
            r#"  hostnames: ["{host}"]
  rules:
  - backendRefs:
    - name: good
      port: 8080
{second}"#
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_service_keeps_its_share_and_that_share_gets_500() {
    let good = Pods::start("default", "good", 1).await;
    let r = two_backends(
        "r",
        "app.example.com",
        "    - name: does-not-exist\n      port: 8080",
    );
    let gw = Sluice::start(&[("all.yaml", gateway() + &good.manifests() + &r)]).await;
    let tally = gw
        .connect()
        .await
        .tally(200, "app.example.com", "/", &[])
        .await;
    assert_eq!(tally.get("good-0"), Some(&100), "{tally:?}");
    assert_eq!(tally.get("<500>"), Some(&100), "{tally:?}");

    let parent = route_parent(&gw, "default", "r").await;
    assert_eq!(condition(&parent, "Accepted")["status"], "True");
    let resolved = condition(&parent, "ResolvedRefs");
    assert_eq!(resolved["status"], "False");
    assert_eq!(resolved["reason"], "BackendNotFound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_kind_gets_500_and_invalid_kind() {
    let good = Pods::start("default", "good", 1).await;
    let r = two_backends(
        "r",
        "app.example.com",
        "    - name: some-bucket\n      group: storage.example.com\n      kind: Bucket\n      port: 8080",
    );
    let gw = Sluice::start(&[("all.yaml", gateway() + &good.manifests() + &r)]).await;
    let tally = gw
        .connect()
        .await
        .tally(100, "app.example.com", "/", &[])
        .await;
    assert_eq!(tally.get("<500>"), Some(&50), "{tally:?}");
    assert_eq!(tally.get("good-0"), Some(&50), "{tally:?}");
    let parent = route_parent(&gw, "default", "r").await;
    assert_eq!(condition(&parent, "ResolvedRefs")["reason"], "InvalidKind");
    assert_eq!(condition(&parent, "Accepted")["status"], "True");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_namespace_backend_needs_a_reference_grant() {
    let good = Pods::start("default", "good", 1).await;
    let other = Pods::start("other", "shared", 1).await;
    let r = two_backends(
        "r",
        "app.example.com",
        "    - name: shared\n      namespace: other\n      port: 8080",
    );
    let grant = r#"
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata:
  name: allow-default-routes
  namespace: other
spec:
  from:
  - group: gateway.networking.k8s.io
    kind: HTTPRoute
    namespace: default
  to:
  - group: ""
    kind: Service
"#;
    let gw = Sluice::start(&[(
        "all.yaml",
        gateway() + &good.manifests() + &other.manifests() + &r,
    )])
    .await;
    let tally = gw
        .connect()
        .await
        .tally(100, "app.example.com", "/", &[])
        .await;
    assert_eq!(tally.get("<500>"), Some(&50), "{tally:?}");
    assert_eq!(other.requests(), 0);
    let parent = route_parent(&gw, "default", "r").await;
    assert_eq!(
        condition(&parent, "ResolvedRefs")["reason"],
        "RefNotPermitted"
    );

    // The grant arrives in a file of its own: the reference resolves.
    gw.write("grant.yaml", grant);
    gw.eventually("app.example.com", "/", |r| {
        r.status == 200 && r.echo().namespace == "other"
    })
    .await;
    let tally = gw
        .connect()
        .await
        .tally(100, "app.example.com", "/", &[])
        .await;
    assert_eq!(tally.get("<500>"), None, "{tally:?}");
    assert_eq!(by_service(&tally).get("shared"), Some(&50), "{tally:?}");
    let parent = route_parent(&gw, "default", "r").await;
    assert_eq!(condition(&parent, "ResolvedRefs")["status"], "True");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_without_ready_endpoints_gets_503_and_stays_resolved() {
    let good = Pods::start("default", "good", 1).await;
    let empty = Pods::start("default", "empty", 2).await;
    let r = two_backends(
        "r",
        "app.example.com",
        "    - name: empty\n      port: 8080",
    );
    let manifests =
        gateway() + &good.manifests() + &empty.manifests_with_readiness(|_| Some(false)) + &r;
    let gw = Sluice::start(&[("all.yaml", manifests)]).await;
    let tally = gw
        .connect()
        .await
        .tally(100, "app.example.com", "/", &[])
        .await;
    assert_eq!(tally.get("<503>"), Some(&50), "{tally:?}");
    assert_eq!(tally.get("good-0"), Some(&50), "{tally:?}");
    assert_eq!(empty.requests(), 0);
    let parent = route_parent(&gw, "default", "r").await;
    assert_eq!(condition(&parent, "ResolvedRefs")["status"], "True");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_refusing_the_connection_gets_502_for_that_request_only() {
    let good = Pods::start("default", "good", 1).await;
    let dead_port = free_port(); // nothing listens here
    let dead = format!(
        r#"
---
apiVersion: v1
kind: Service
metadata:
  name: dead
spec:
  ports:
  - port: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dead-0
  labels:
    kubernetes.io/service-name: dead
addressType: IPv4
ports:
- port: {dead_port}
endpoints:
- addresses: ["127.0.0.1"]
"#
    );
    let r = two_backends("r", "app.example.com", "    - name: dead\n      port: 8080");
    let gw = Sluice::start(&[("all.yaml", gateway() + &good.manifests() + &dead + &r)]).await;
    let mut conn = gw.connect().await;
    let tally = conn.tally(40, "app.example.com", "/", &[]).await;
    assert_eq!(tally.get("<502>"), Some(&20), "{tally:?}");
    assert_eq!(tally.get("good-0"), Some(&20), "{tally:?}");
}
