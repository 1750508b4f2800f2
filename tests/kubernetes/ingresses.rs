//! ingress-nginx Ingresses served as they are in Kubernetes mode
//! (`serve --kubernetes --ingress-class nginx --ingress-gateway
//! default/gw`), through the real binary: the Ingresses of the class in the
//! API server are converted and served, a change to one is served, the
//! Ingresses of another class are not, and the leader writes the served
//! Ingresses' `status.loadBalancer` from the Gateway's addresses.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::fake_apiserver::FakeApiServer;
use super::{Replica, answered_by, cluster, echo, eventually, free_port, get};

const SHOP: &str = "shop.example.com";
const CANARY: &str = "nginx.ingress.kubernetes.io/canary";
const BY_HEADER: &str = "nginx.ingress.kubernetes.io/canary-by-header";

fn ingress(name: &str, class: &str, host: &str, service: &str, annotations: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"ingressClassName": class, "rules": [{"host": host, "http": {"paths": [
            {"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": service, "port": {"number": 80}}}}]}}]}})
}

/// The canary Ingress of `web`, chosen by the header `header`.
fn canary(header: &str) -> Value {
    ingress(
        "web-canary",
        "nginx",
        SHOP,
        "web-canary",
        json!({CANARY: "true", BY_HEADER: header}),
    )
}

/// One GET through the gateway with `headers`: who answered.
async fn who(addr: SocketAddr, host: &str, headers: &[(&str, &str)]) -> Option<String> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    let mut req = Request::get("/cart").header("host", host);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = send
        .send_request(req.body(Full::new(Bytes::new())).ok()?)
        .await
        .ok()?;
    let status: StatusCode = resp.status();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some(answered_by(status, &body))
}

/// Wait until `host` with `headers` is answered by `expected`.
async fn answered(addr: SocketAddr, host: &str, headers: &[(&str, &str)], expected: &str) {
    eventually(
        &format!("{host} {headers:?} answered by {expected}"),
        async || (who(addr, host, headers).await.as_deref() == Some(expected)).then_some(()),
    )
    .await;
}

/// Whether `value` holds, anywhere, an object of `kind` named `name`.
fn holds(value: &Value, kind: &str, name: &str) -> bool {
    match value {
        Value::Object(map) => {
            (map.get("kind").and_then(Value::as_str) == Some(kind)
                && value["metadata"]["name"].as_str() == Some(name))
                || map.values().any(|v| holds(v, kind, name))
        }
        Value::Array(items) => items.iter().any(|v| holds(v, kind, name)),
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingresses_of_the_class_are_served_converted_and_get_the_gateway_address() {
    let api = FakeApiServer::start().await;
    let (web, web_canary, other) = (
        echo("web", "web-0").await,
        echo("web-canary", "web-canary-0").await,
        echo("other", "other-0").await,
    );
    let port = free_port();
    cluster(
        &api,
        port,
        &[
            ("web", &web),
            ("web-canary", &web_canary),
            ("other", &other),
        ],
    );
    api.apply(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": "nginx"}, "spec": {"controller": "k8s.io/ingress-nginx"}}),
    );
    api.apply(ingress("web", "nginx", SHOP, "web", json!({})));
    api.apply(canary("X-Canary"));
    api.apply(ingress(
        "other",
        "traefik",
        "other.example.com",
        "other",
        json!({}),
    ));

    let replica = Replica::start_with_args(
        &api,
        "replica-a",
        "127.0.0.1",
        port,
        &[],
        &[
            "--ingress-class",
            "nginx",
            "--ingress-gateway",
            "default/gw",
        ],
    );
    replica.wait_ready().await;
    let addr = replica.listener;

    // canary-by-header: `always` goes to the canary, anything else (or no
    // header) to the primary.
    answered(addr, SHOP, &[("X-Canary", "always")], "web-canary").await;
    assert_eq!(who(addr, SHOP, &[]).await.as_deref(), Some("web"));
    assert_eq!(
        who(addr, SHOP, &[("X-Canary", "never")]).await.as_deref(),
        Some("web")
    );
    // The Ingress of another class is not served.
    assert_eq!(
        who(addr, "other.example.com", &[]).await.as_deref(),
        Some("<404>")
    );

    // `/status` shows the converted route.
    let (code, body) = get(replica.admin, "admin", "/status")
        .await
        .expect("/status answers");
    assert_eq!(code, StatusCode::OK);
    let status: Value = serde_json::from_slice(&body).expect("/status is JSON");
    assert!(holds(&status, "HTTPRoute", "web"), "{status}");

    // The leader writes the Gateway's address (from the gateway's Service,
    // 203.0.113.7) to every served Ingress, main and canary.
    let expected = json!({"ingress": [{"ip": "203.0.113.7"}]});
    for name in ["web", "web-canary"] {
        eventually(&format!("Ingress {name} status.loadBalancer"), async || {
            let ingress = api.get("Ingress", Some("default"), name)?;
            (ingress["status"]["loadBalancer"] == expected).then_some(())
        })
        .await;
    }

    // The canary's header changes: routing follows (and the status
    // written stays: nothing is written again for it).
    api.apply(canary("X-Beta"));
    answered(addr, SHOP, &[("X-Beta", "always")], "web-canary").await;
    assert_eq!(
        who(addr, SHOP, &[("X-Canary", "always")]).await.as_deref(),
        Some("web")
    );

    let patches = api.patches();
    let of = |plural: &str, name: &str| {
        patches
            .iter()
            .filter(|p| p.plural == plural && p.name == name)
            .collect::<Vec<_>>()
    };
    for name in ["web", "web-canary"] {
        let ingress_patches = of("ingresses", name);
        assert_eq!(
            ingress_patches.len(),
            1,
            "written once: {ingress_patches:?}"
        );
        assert_eq!(
            ingress_patches[0].field_manager,
            "sluice.dev/gateway-controller"
        );
        assert_eq!(ingress_patches[0].body["kind"], "Ingress");
    }
    assert!(
        of("ingresses", "other").is_empty(),
        "another class's Ingress is not ours"
    );
    assert!(
        of("httproutes", "web").is_empty(),
        "the converted route is not in the API server: no status for it"
    );
    // Another writer (an ingress-nginx controller still running) puts its
    // own address back: the leader writes the Gateway's again.
    let mut web_ingress = api
        .get("Ingress", Some("default"), "web")
        .expect("the Ingress exists");
    web_ingress["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.99"}]}});
    api.apply(web_ingress);
    eventually(
        "Ingress web status.loadBalancer written again",
        async || {
            let ingress = api.get("Ingress", Some("default"), "web")?;
            (ingress["status"]["loadBalancer"] == expected).then_some(())
        },
    )
    .await;
    assert_eq!(
        api.patches()
            .iter()
            .filter(|p| p.plural == "ingresses" && p.name == "web")
            .count(),
        2
    );

    let log = replica.log();
    assert!(
        log.contains("ingress-nginx conversion: Ingress default/web-canary"),
        "the report is logged:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingresses_without_a_class_are_served_when_the_class_is_the_default() {
    let api = FakeApiServer::start().await;
    let web = echo("web", "web-0").await;
    let port = free_port();
    cluster(&api, port, &[("web", &web)]);
    let mut bare = ingress("web", "", SHOP, "web", json!({}));
    bare["spec"]
        .as_object_mut()
        .expect("a spec")
        .remove("ingressClassName");
    api.apply(bare);
    api.apply(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": "nginx"}, "spec": {"controller": "k8s.io/ingress-nginx"}}),
    );

    let replica = Replica::start_with_args(
        &api,
        "replica-a",
        "127.0.0.1",
        port,
        &[],
        &[
            "--ingress-class",
            "nginx",
            "--ingress-gateway",
            "default/gw",
        ],
    );
    replica.wait_ready().await;
    let addr = replica.listener;
    answered(addr, SHOP, &[], "<404>").await;

    // The class becomes the cluster's default: the class-less Ingress is
    // ingress-nginx's, and now sluice's.
    api.apply(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": "nginx",
                     "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
        "spec": {"controller": "k8s.io/ingress-nginx"}}),
    );
    answered(addr, SHOP, &[], "web").await;
}
