//! `/status`: the Kubernetes status of every object, with generations kept
//! by sluice (1 when first seen, +1 per spec change, or the file's value).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

fn cond<'a>(conditions: &'a Value, kind: &str) -> &'a Value {
    conditions
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind))
        .unwrap_or_else(|| panic!("no {kind} in {conditions:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_has_the_kubernetes_shape_for_every_object() {
    let app = Pods::start("default", "app", 1).await;
    let r = route(
        "default",
        "app",
        "  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let gw = Sluice::start(&[("all.yaml", gateway() + &app.manifests() + &r)]).await;

    let class = gw.object_status("GatewayClass", None, "sluice").await;
    assert_eq!(class["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(
        cond(&class["status"]["conditions"], "Accepted")["status"],
        "True"
    );

    let g = gw.object_status("Gateway", Some("default"), "gw").await;
    for t in ["Accepted", "Programmed"] {
        let c = cond(&g["status"]["conditions"], t);
        assert_eq!(c["status"], "True", "{g:#}");
        assert_eq!(c["observedGeneration"], 1);
        assert!(c["lastTransitionTime"].is_string());
        assert!(c["reason"].is_string() && c["message"].is_string());
    }
    let listener = &g["status"]["listeners"][0];
    assert_eq!(listener["name"], "http");
    assert_eq!(listener["attachedRoutes"], 1);
    assert_eq!(listener["supportedKinds"][0]["kind"], "HTTPRoute");
    for t in ["Accepted", "Programmed", "ResolvedRefs"] {
        assert_eq!(
            cond(&listener["conditions"], t)["status"],
            "True",
            "{listener:#}"
        );
    }

    let hr = gw.object_status("HTTPRoute", Some("default"), "app").await;
    let parent = &hr["status"]["parents"][0];
    assert_eq!(parent["parentRef"]["name"], "gw");
    assert_eq!(parent["controllerName"], "sluice.dev/gateway-controller");
    assert_eq!(cond(&parent["conditions"], "Accepted")["status"], "True");
    assert_eq!(
        cond(&parent["conditions"], "ResolvedRefs")["status"],
        "True"
    );
    assert_eq!(hr["metadata"]["generation"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_counts_spec_changes_only_and_conditions_observe_it() {
    let app = Pods::start("default", "app", 1).await;
    let v1 = route(
        "default",
        "app",
        "  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let gw = Sluice::start(&[
        ("base.yaml", gateway() + &app.manifests()),
        ("route.yaml", v1.clone()),
    ])
    .await;

    async fn generation(gw: &Sluice) -> (i64, i64) {
        let hr = gw.object_status("HTTPRoute", Some("default"), "app").await;
        let observed =
            cond(&hr["status"]["parents"][0]["conditions"], "Accepted")["observedGeneration"]
                .as_i64()
                .unwrap();
        (hr["metadata"]["generation"].as_i64().unwrap(), observed)
    }
    async fn wait_for(gw: &Sluice, want: (i64, i64)) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while generation(gw).await != want {
            assert!(
                Instant::now() < deadline,
                "generation never became {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(generation(&gw).await, (1, 1));
    // A spec change: +1.
    let v2 = v1.replace("port: 8080}]", "port: 8080, weight: 3}]");
    gw.write("route.yaml", &v2);
    wait_for(&gw, (2, 2)).await;
    // A label change only: unchanged (and an unrelated edit forces a reload).
    let v2_labels = v2.replace("  name: app\n", "  name: app\n  labels: {team: shop}\n");
    gw.write("route.yaml", &v2_labels);
    gw.write(
        "base.yaml",
        &(gateway() + &app.manifests() + "\n# touched\n"),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(generation(&gw).await, (2, 2));
    // The file's own generation wins.
    gw.write(
        "route.yaml",
        &v2.replace("  name: app\n", "  name: app\n  generation: 7\n"),
    );
    wait_for(&gw, (7, 7)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_listeners_are_reported_and_the_rest_still_serve() {
    let app = Pods::start("default", "app", 1).await;
    let conflicted = format!(
        r#"{}  - name: dup-a
    protocol: HTTP
    port: {{{{PORT}}}}
    hostname: dup.example.com
  - name: dup-b
    protocol: HTTP
    port: {{{{PORT}}}}
    hostname: dup.example.com
"#,
        gateway()
    );
    let r = route(
        "default",
        "app",
        "  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let gw = Sluice::start(&[("all.yaml", conflicted + &app.manifests() + &r)]).await;
    let g = gw.object_status("Gateway", Some("default"), "gw").await;
    let listeners = g["status"]["listeners"].as_array().unwrap();
    let by_name = |n: &str| listeners.iter().find(|l| l["name"] == n).unwrap();
    for n in ["dup-a", "dup-b"] {
        let c = cond(&by_name(n)["conditions"], "Conflicted");
        assert_eq!(c["status"], "True", "{g:#}");
        assert_eq!(c["reason"], "HostnameConflict");
    }
    assert_eq!(
        cond(&by_name("http")["conditions"], "Conflicted")["status"],
        "False"
    );
    assert_eq!(
        gw.connect().await.get("other.example.com", "/").await.pod(),
        "app-0"
    );
}
