//! Inputs: directories read recursively (`*.yaml`, `*.yml`, `*.json`,
//! multi-document) but never sluice's own state directory, Gateway addresses, sockets that cannot be bound, and
//! Gateways of other classes; plus the admin listener's metrics.

use std::net::{SocketAddr, TcpListener};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directories_are_read_recursively_in_yaml_yml_and_json() {
    let app = Pods::start("default", "app", 1).await;
    let other = Pods::start("default", "other", 1).await;
    let json_route = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "from-json"},
        "spec": {
            "parentRefs": [{"name": "gw"}],
            "hostnames": ["json.example.com"],
            "rules": [{"backendRefs": [{"name": "other", "port": 8080}]}]
        }
    });
    let gw = Sluice::start(&[
        ("gateway.yaml", gateway()),
        ("ignored.txt", "not: [yaml".into()),
    ])
    .await;
    std::fs::create_dir_all(gw.path("nested/deeper")).unwrap();
    gw.write(
        "nested/services.yml",
        &(app.manifests() + &other.manifests()),
    );
    gw.write(
        "nested/deeper/route.json",
        &serde_json::to_string_pretty(&json_route).unwrap(),
    );
    gw.write(
        "nested/deeper/yaml-route.yaml",
        &route(
            "default",
            "from-yaml",
            "  hostnames: [yaml.example.com]\n  rules:\n  - backendRefs: [{name: app, port: 8080}]",
        ),
    );
    gw.eventually("json.example.com", "/", |r| r.status == 200)
        .await;
    let mut c = gw.connect().await;
    assert_eq!(c.get("json.example.com", "/").await.pod(), "other-0");
    assert_eq!(c.get("yaml.example.com", "/").await.pod(), "app-0");
    // The .txt file is not a manifest: nothing reports it.
    assert!(!gw.errors().await.to_string().contains("ignored.txt"));
}

/// A state directory inside the manifest directory (`--state-dir
/// DIR/state`) is sluice's own: its files are never read as manifests,
/// at start or on a reload, and so never listed among refused objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_dir_inside_the_manifests_is_not_read_as_manifests() {
    let app = Pods::start("default", "app", 1).await;
    // Recorded by an earlier run (for other manifests: set aside, too).
    let recorded = r#"{"version": 1, "manifests": ["/elsewhere"], "rollouts": []}"#;
    let gw = Sluice::start_with(
        &[
            ("gateway.yaml", gateway()),
            ("app.yaml", app.manifests()),
            ("state/rollouts.json", recorded.into()),
        ],
        &["--state-dir", "{{DIR}}/state"],
    )
    .await;
    gw.write(
        "route.yaml",
        &route(
            "default",
            "app",
            "  hostnames: [app.example.com]\n  rules:\n  - backendRefs: [{name: app, port: 8080}]",
        ),
    );
    gw.eventually("app.example.com", "/", |r| r.status == 200)
        .await;
    // A write into the state directory after start is not read either.
    std::fs::write(gw.path("state/later.yaml"), "not: [a manifest").unwrap();
    gw.write("route.yaml", &route(
        "default",
        "app",
        "  hostnames: [app.example.com, www.app.example.com]\n  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    ));
    gw.eventually("www.app.example.com", "/", |r| r.status == 200)
        .await;
    let errors = gw.errors().await.to_string();
    assert!(!errors.contains("state"), "{errors}");
    assert!(!errors.contains("apiVersion"), "{errors}");
    assert!(
        gw.path("state/.sluice-state").is_file(),
        "the directory is marked"
    );
    assert!(
        gw.path("state/rollouts.json.other-configuration").is_file(),
        "another configuration's records are set aside"
    );
    assert!(
        gw.log().contains("set aside"),
        "a log line says so: {}",
        gw.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_bind_on_the_gateway_addresses() {
    let app = Pods::start("default", "app", 1).await;
    let with_address = gateway().replace(
        "  gatewayClassName: sluice\n",
        "  gatewayClassName: sluice\n  addresses:\n  - type: IPAddress\n    value: 127.0.0.2\n",
    );
    let r = route(
        "default",
        "app",
        "  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let gw = Sluice::start(&[("all.yaml", with_address + &app.manifests() + &r)]).await;
    let on_address: SocketAddr = format!("127.0.0.2:{}", gw.port).parse().unwrap();
    assert_eq!(
        Conn::open(on_address).await.get("h", "/").await.pod(),
        "app-0"
    );
    // Not on --bind (127.0.0.1): the Gateway named its address.
    assert!(tokio::net::TcpStream::connect(gw.addr()).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_whose_port_is_taken_is_reported_and_the_others_serve() {
    let app = Pods::start("default", "app", 1).await;
    let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = squatter.local_addr().unwrap().port();
    let two_listeners = format!(
        "{}  - name: taken\n    protocol: HTTP\n    port: {taken}\n",
        gateway()
    );
    let r = route(
        "default",
        "app",
        "  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let gw = Sluice::start(&[("all.yaml", two_listeners + &app.manifests() + &r)]).await;
    assert_eq!(gw.connect().await.get("h", "/").await.pod(), "app-0");
    let g = gw.object_status("Gateway", Some("default"), "gw").await;
    let taken_listener = g["status"]["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "taken")
        .cloned()
        .unwrap();
    let programmed = taken_listener["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Programmed")
        .cloned()
        .unwrap();
    assert_eq!(programmed["status"], "False", "{g:#}");
    assert!(
        programmed["message"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("address"),
        "{programmed}"
    );
    drop(squatter);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_of_other_classes_are_ignored() {
    let app = Pods::start("default", "app", 1).await;
    let foreign_port = free_port();
    let foreign = format!(
        r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: someone-else}}
spec: {{controllerName: example.com/other-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: foreign}}
spec:
  gatewayClassName: someone-else
  listeners: [{{name: http, protocol: HTTP, port: {foreign_port}}}]
"#
    );
    let r = route(
        "default",
        "app",
        "  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let gw = Sluice::start(&[("all.yaml", gateway() + &foreign + &app.manifests() + &r)]).await;
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", foreign_port))
            .await
            .is_err()
    );
    let all = gw.status().await.to_string();
    assert!(!all.contains("\"foreign\""), "{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_by_route_rule_backend_and_code() {
    let app = Pods::start("default", "app", 1).await;
    let r = route(
        "default",
        "shop",
        "  rules:\n  - matches: [{path: {type: PathPrefix, value: /missing}}]\n    backendRefs: [{name: nope, port: 8080}]\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let gw = Sluice::start(&[("all.yaml", gateway() + &app.manifests() + &r)]).await;
    let mut c = gw.connect().await;
    c.tally(3, "h", "/", &[]).await;
    c.tally(2, "h", "/missing", &[]).await;
    let m = gw.metrics().await;
    assert!(
        m.contains(r#"sluice_requests_total{route="default/shop",rule="1",backend="default/app:8080",backend_namespace="default",backend_name="app",backend_port="8080",code="200"} 3"#),
        "{m}"
    );
    assert!(
        m.contains(r#"route="default/shop",rule="0""#) && m.contains(r#"code="500"} 2"#),
        "{m}"
    );
    assert!(m.contains("sluice_request_duration_seconds_bucket"), "{m}");
    let (code, body) = admin_get(gw.admin, "/healthz").await.unwrap();
    assert_eq!(code.as_u16(), 200);
    assert_eq!(String::from_utf8_lossy(&body).trim(), "ok");
}
