//! ListenerSets (GEP-1713) end to end: the listeners of a ListenerSet the
//! Gateway admits are served on the Gateway's address (on a port of their
//! own, or beside the Gateway's listener on its port); a route reaches them
//! through a parentRef of kind ListenerSet only; a ListenerSet the Gateway
//! does not admit gets `Accepted=False NotAllowed` and its port is never
//! opened.

use std::net::SocketAddr;

use crate::support::*;

fn condition(conditions: &serde_json::Value, ty: &str) -> (String, String) {
    let c = conditions
        .as_array()
        .unwrap_or_else(|| panic!("no conditions in {conditions:#}"))
        .iter()
        .find(|c| c["type"] == ty)
        .unwrap_or_else(|| panic!("no {ty} condition in {conditions:#}"));
    (
        c["status"].as_str().unwrap_or("").to_string(),
        c["reason"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_listener_set_is_served_and_a_not_allowed_one_is_not() {
    let set_port = free_port();
    let refused_port = free_port();
    let app = Pods::start("default", "app", 1).await;
    let main = Pods::start("default", "main", 1).await;
    let manifests = format!(
        r#"
{GATEWAY_HEAD}  allowedListeners: {{namespaces: {{from: Same}}}}
  listeners:
  - {{name: http, protocol: HTTP, port: {{{{PORT}}}}, hostname: gw.example.com}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {{name: team, namespace: default}}
spec:
  parentRef: {{name: gw}}
  listeners:
  - {{name: own-port, protocol: HTTP, port: {set_port}}}
  - {{name: shared-port, protocol: HTTP, port: {{{{PORT}}}}, hostname: team.example.com}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: elsewhere}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {{name: outsider, namespace: elsewhere}}
spec:
  parentRef: {{name: gw, namespace: default}}
  listeners:
  - {{name: refused, protocol: HTTP, port: {refused_port}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: to-set, namespace: default}}
spec:
  parentRefs: [{{group: gateway.networking.k8s.io, kind: ListenerSet, name: team}}]
  rules:
  - backendRefs: [{{name: app, port: 8080}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: to-gateway, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /main}}}}]
    backendRefs: [{{name: main, port: 8080}}]
"#
    ) + &app.manifests()
        + &main.manifests();
    let gw = Sluice::start(&[("all.yaml", manifests)]).await;

    // The ListenerSet's own port and its listener on the Gateway's port.
    let set_addr = SocketAddr::from(([127, 0, 0, 1], set_port));
    let mut on_set_port = Conn::open(set_addr).await;
    assert_eq!(on_set_port.get("any.host", "/x").await.pod(), "app-0");
    let mut c = gw.connect().await;
    assert_eq!(c.get("team.example.com", "/x").await.pod(), "app-0");
    // The Gateway's own listener has only the Gateway's route, and the
    // Gateway's route never reaches the ListenerSet's listeners.
    assert_eq!(c.get("gw.example.com", "/main").await.pod(), "main-0");
    assert_eq!(c.get("gw.example.com", "/x").await.status, 404);
    assert_eq!(on_set_port.get("any.host", "/main").await.pod(), "app-0");
    assert_eq!(c.get("team.example.com", "/main").await.pod(), "app-0");

    // The ListenerSet outside the Gateway's namespace is not admitted: its
    // port is not listened on.
    let refused = tokio::net::TcpStream::connect(("127.0.0.1", refused_port)).await;
    assert!(
        refused.is_err(),
        "port {refused_port} of a ListenerSet the Gateway does not admit accepted a connection"
    );

    let team = gw
        .object_status("ListenerSet", Some("default"), "team")
        .await;
    assert_eq!(
        condition(&team["status"]["conditions"], "Accepted"),
        ("True".into(), "Accepted".into())
    );
    assert_eq!(
        condition(&team["status"]["conditions"], "Programmed"),
        ("True".into(), "Programmed".into())
    );
    let listeners = team["status"]["listeners"].as_array().expect("listeners");
    assert_eq!(listeners.len(), 2, "{team:#}");
    for l in listeners {
        assert_eq!(l["attachedRoutes"], 1, "{l:#}");
        assert_eq!(
            condition(&l["conditions"], "Programmed"),
            ("True".into(), "Programmed".into())
        );
    }
    let outsider = gw
        .object_status("ListenerSet", Some("elsewhere"), "outsider")
        .await;
    assert_eq!(
        condition(&outsider["status"]["conditions"], "Accepted"),
        ("False".into(), "NotAllowed".into())
    );
    let gateway = gw.object_status("Gateway", Some("default"), "gw").await;
    assert_eq!(gateway["status"]["attachedListenerSets"], 1);
    // The Gateway lists its own listener only.
    assert_eq!(
        gateway["status"]["listeners"].as_array().map(|l| l.len()),
        Some(1),
        "{gateway:#}"
    );
}
