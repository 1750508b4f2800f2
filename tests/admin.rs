//! The admin listener through real sockets: `/status`, `/errors`,
//! `/metrics`, `/healthz`, `/readyz`, and how bad manifests show there while
//! the good ones keep serving.

mod serve_harness;

use http::StatusCode;
use serde_json::Value;
use serve_harness::{Fixture, route_yaml, write};

fn find<'a>(status: &'a Value, kind: &str, name: &str) -> &'a Value {
    status
        .as_array()
        .expect("/status is an array")
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} not in /status: {status:#}"))
}

fn condition<'a>(conditions: &'a Value, type_: &str) -> &'a Value {
    conditions
        .as_array()
        .expect("conditions is an array")
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conditions:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_has_the_kubernetes_shape() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    let status = fx.status().await;
    for object in status.as_array().expect("/status is an array") {
        let keys: Vec<&str> = object
            .as_object()
            .expect("each entry is an object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            ["apiVersion", "kind", "metadata", "status"],
            "{object:#}"
        );
    }

    let gateway = find(&status, "Gateway", "gw");
    assert_eq!(gateway["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(gateway["metadata"]["namespace"], "default");
    assert_eq!(gateway["metadata"]["generation"], 1);
    for type_ in ["Accepted", "Programmed"] {
        let c = condition(&gateway["status"]["conditions"], type_);
        assert_eq!(c["status"], "True", "{gateway:#}");
        assert_eq!(c["observedGeneration"], 1, "{gateway:#}");
    }
    let listener = &gateway["status"]["listeners"][0];
    assert_eq!(listener["name"], "http");
    assert_eq!(listener["attachedRoutes"], 1, "{gateway:#}");

    let route = find(&status, "HTTPRoute", "web");
    let parent = &route["status"]["parents"][0];
    assert_eq!(parent["parentRef"]["name"], "gw", "{route:#}");
    assert_eq!(parent["controllerName"], "sluice.dev/gateway-controller");
    for type_ in ["Accepted", "ResolvedRefs"] {
        let c = condition(&parent["conditions"], type_);
        assert_eq!(c["status"], "True", "{route:#}");
        assert_eq!(c["observedGeneration"], 1, "{route:#}");
    }
    fx.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_metrics_and_unknown_paths() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    assert_eq!(fx.admin("/healthz").await, (StatusCode::OK, "ok\n".into()));
    // `start` returns once the first table is applied: ready from then on.
    assert_eq!(fx.admin("/readyz").await.0, StatusCode::OK);
    assert_eq!(fx.admin("/nothing-here").await.0, StatusCode::NOT_FOUND);

    const SENT: usize = 7;
    for _ in 0..SENT {
        assert_eq!(fx.request("/").await, (StatusCode::OK, "blue".into()));
    }
    let (code, metrics) = fx.admin("/metrics").await;
    assert_eq!(code, StatusCode::OK);
    let counted: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("sluice_requests_total{")
                && l.contains(r#"route="default/web""#)
                && l.contains(r#"code="200""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(counted, SENT as f64, "{metrics}");
    assert!(
        metrics.contains("sluice_config_reloads_total 1"),
        "{metrics}"
    );
    fx.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yaml_syntax_error_is_reported_and_the_files_last_good_objects_keep_serving() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    assert!(fx.errors().await.is_empty());
    let applied = fx.generation().await;

    // Line 4 opens a flow sequence that never closes.
    let broken = "apiVersion: gateway.networking.k8s.io/v1\n\
                  kind: HTTPRoute\n\
                  metadata:\n  name: [web\n\
                  spec:\n  parentRefs:\n  - name: gw\n";
    write(fx.dir.path(), "route.yaml", broken);
    fx.wait_for_generation_after(applied).await;

    let errors = fx.errors().await;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let file = fx.path("route.yaml").display().to_string();
    assert_eq!(errors[0]["file"], file.as_str());
    let line = errors[0]["line"].as_u64().expect("a line number");
    assert!((4..=5).contains(&line), "{errors:#?}");
    assert!(
        errors[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("YAML")),
        "{errors:#?}"
    );

    let (_, metrics) = fx.admin("/metrics").await;
    let counted = format!("sluice_config_errors_total{{file=\"{file}\"}} 1");
    assert!(metrics.contains(&counted), "{counted} not in {metrics}");

    // The route loaded from that file before the error still serves.
    assert_eq!(fx.request("/").await, (StatusCode::OK, "blue".into()));
    find(&fx.status().await, "HTTPRoute", "web");

    // Fixing the file applies the new version and clears the error.
    write(fx.dir.path(), "route.yaml", &route_yaml("web", "/", 0, 1));
    fx.wait_for_backend("/", "green").await;
    assert!(fx.errors().await.is_empty());
    fx.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_object_is_refused_alone() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    let applied = fx.generation().await;
    let text = format!(
        "{}---\n{}",
        route_yaml("fine", "/fine", 0, 1),
        route_yaml("bad", "/bad", 1, 1_000_001)
    );
    write(fx.dir.path(), "more.yaml", &text);
    fx.wait_for_generation_after(applied).await;

    // The valid route of the same file is applied...
    fx.wait_for_backend("/fine", "green").await;
    // ...the invalid one is not: `/bad` falls to the `/` route.
    assert_eq!(fx.request("/bad").await, (StatusCode::OK, "blue".into()));

    let errors = fx.errors().await;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let error = &errors[0];
    assert_eq!(error["file"], fx.path("more.yaml").display().to_string());
    assert_eq!(error["object"], "HTTPRoute default/bad");
    assert!(
        error["field"]
            .as_str()
            .is_some_and(|f| f.contains("backendRefs[1].weight")),
        "{error:#}"
    );
    assert!(error["line"].as_u64().is_some_and(|l| l > 1), "{error:#}");

    let status = fx.status().await;
    find(&status, "HTTPRoute", "fine");
    assert!(
        !status
            .as_array()
            .expect("array")
            .iter()
            .any(|o| o["metadata"]["name"] == "bad"),
        "{status:#}"
    );
    fx.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_object_is_served_from_the_first_file_and_reported() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    let applied = fx.generation().await;
    // `z-route.yaml` sorts after `route.yaml`: its copy of `web` loses.
    write(fx.dir.path(), "z-route.yaml", &route_yaml("web", "/", 0, 1));
    fx.wait_for_generation_after(applied).await;

    let errors = fx.errors().await;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0]["file"],
        fx.path("z-route.yaml").display().to_string()
    );
    assert_eq!(errors[0]["object"], "HTTPRoute default/web");
    assert_eq!(fx.request("/").await, (StatusCode::OK, "blue".into()));
    fx.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_answers_in_json_from_the_table_in_service() {
    let fx = Fixture::start(&route_yaml("web", "/app", 3, 1)).await;
    let port = fx.listener.port();
    let (code, body) = fx
        .admin(&format!(
            "/explain?method=GET&url=http://anything:{port}/app/x&header=x-a:%201"
        ))
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let e: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(e["listener"], "gateway/default/gw/listener/http", "{e:#}");
    assert_eq!(e["winner"]["route"], "HTTPRoute default/web", "{e:#}");
    assert_eq!(e["candidates"][0]["wins"], true, "{e:#}");
    assert_eq!(e["candidates"][0]["match"], "PathPrefix /app", "{e:#}");
    let backends = e["winner"]["backends"].as_array().expect("backends");
    assert_eq!(backends[0]["name"], "default/blue:80");
    assert_eq!(backends[0]["sharePercent"], 75.0);
    assert_eq!(backends[1]["sharePercent"], 25.0);
    assert_eq!(backends[0]["outcome"]["outcome"], "serves", "{e:#}");
    // A path no rule matches: no winner, a 404 outcome.
    let (code, body) = fx
        .admin(&format!("/explain?url=http://anything:{port}/other"))
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let e: Value = serde_json::from_str(&body).expect("JSON");
    assert!(e.get("winner").is_none(), "{e:#}");
    assert!(e["outcome"].as_str().unwrap().starts_with("404"), "{e:#}");
    // No URL, a bad header: 400.
    assert_eq!(fx.admin("/explain").await.0, StatusCode::BAD_REQUEST);
    let (code, _) = fx
        .admin(&format!("/explain?url=http://a:{port}/&header=nocolon"))
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    fx.gateway.shutdown().await;
}

/// What `/overview` (the dashboard's JSON) says about a rule before and
/// after its weights change: spec and served shares follow the manifest,
/// observed shares follow the traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_shows_spec_served_and_observed_shares() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    for _ in 0..5 {
        assert_eq!(fx.request("/").await, (StatusCode::OK, "blue".into()));
    }
    let o = overview(&fx).await;
    assert_eq!(o["rulesTotal"], 1, "{o:#}");
    let rule = &o["rules"][0];
    assert_eq!(rule["route"], "default/web", "{o:#}");
    let blue = &rule["backends"][0];
    assert_eq!(blue["name"], "default/blue:80");
    assert_eq!(blue["specShare"], 1.0, "{o:#}");
    assert_eq!(blue["servedShare"], 1.0, "{o:#}");
    assert_eq!(blue["observedShare"], 1.0, "{o:#}");
    assert_eq!(blue["requests"], 5, "{o:#}");
    assert_eq!(rule["backends"][1]["specShare"], 0.0, "{o:#}");
    assert_eq!(o["gateways"][0]["kind"], "Gateway", "{o:#}");
    assert_eq!(
        o["gateways"][0]["status"]["listeners"][0]["attachedRoutes"],
        1
    );

    let generation = fx.generation().await;
    write(fx.dir.path(), "route.yaml", &route_yaml("web", "/", 1, 3));
    fx.wait_for_generation_after(generation).await;
    let o = overview(&fx).await;
    let green = &o["rules"][0]["backends"][1];
    assert_eq!(green["specShare"], 0.75, "{o:#}");
    assert_eq!(green["servedShare"], 0.75, "{o:#}");
    // The dashboard page itself: one HTML document without external assets.
    let (code, page) = fx.admin("/").await;
    assert_eq!(code, StatusCode::OK);
    assert!(page.contains("fetch(\"overview\""), "{page}");
    assert!(!page.contains("http://") && !page.contains("https://"));
    fx.gateway.shutdown().await;
}

async fn overview(fx: &Fixture) -> Value {
    let (code, body) = fx.admin("/overview").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    serde_json::from_str(&body).expect("JSON")
}
