use std::net::{IpAddr, Ipv4Addr};

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;

use super::*;
use crate::resources::parse_manifests;
use crate::translate::{TranslateOptions, translate_at};

const CLUSTER: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sluice, generation: 1, resourceVersion: '10'}
spec: {controllerName: sluice.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: default, generation: 2, resourceVersion: '11'}
spec:
  gatewayClassName: sluice
  listeners: [{name: http, protocol: HTTP, port: 8080}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: default, generation: 5, resourceVersion: '12'}
spec:
  parentRefs: [{name: gw}, {name: other-gw}]
  rules: [{backendRefs: [{name: web, port: 80}]}]
status:
  parents:
  - parentRef: {name: other-gw}
    controllerName: example.com/other
    conditions:
    - {type: Accepted, status: 'True', reason: Accepted, message: theirs,
       observedGeneration: 5, lastTransitionTime: '2020-01-01T00:00:00Z'}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: sluice, namespace: sluice-system}
spec: {type: LoadBalancer, clusterIP: 10.96.0.7, ports: [{port: 80}]}
";

fn snapshot(yaml: &str) -> Snapshot {
    let parsed = parse_manifests(yaml, "cluster.yaml");
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    Snapshot::from_objects(parsed.objects.into_iter().map(|o| o.object))
}

fn report(snapshot: &Snapshot, seconds: i64) -> StatusReport {
    let options = TranslateOptions {
        default_bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
    };
    let now = Timestamp::from_second(seconds).expect("a valid timestamp");
    translate_at(snapshot, &options, now).status
}

/// What the API server holds after the patches were applied.
fn applied(snapshot: &Snapshot, patches: &[StatusPatch]) -> Snapshot {
    let mut s = snapshot.clone();
    for p in patches {
        let status = p.body["status"].clone();
        let is = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            m.name.as_deref() == Some(p.name.as_str()) && m.namespace == p.namespace
        };
        match p.kind {
            "GatewayClass" => {
                for o in s.gateway_classes.iter_mut().filter(|o| is(&o.metadata)) {
                    o.status = serde_json::from_value(status.clone()).expect("valid status");
                }
            }
            "Gateway" => {
                for o in s.gateways.iter_mut().filter(|o| is(&o.metadata)) {
                    o.status = serde_json::from_value(status.clone()).expect("valid status");
                }
            }
            "ListenerSet" => {
                for o in s.listener_sets.iter_mut().filter(|o| is(&o.metadata)) {
                    o.status = serde_json::from_value(status.clone()).expect("valid status");
                }
            }
            "BackendTLSPolicy" => {
                for o in s
                    .backend_tls_policies
                    .iter_mut()
                    .filter(|o| is(&o.metadata))
                {
                    o.status = serde_json::from_value(status.clone()).expect("valid status");
                }
            }
            "RolloutPolicy" => {
                for o in s.rollout_policies.iter_mut().filter(|o| is(&o.metadata)) {
                    o.status = Some(status.clone());
                }
            }
            _ => {
                for o in s.http_routes.iter_mut().filter(|o| is(&o.metadata)) {
                    std::sync::Arc::make_mut(o).status =
                        serde_json::from_value(status.clone()).expect("valid status");
                }
            }
        }
    }
    s
}

#[test]
fn plan_writes_our_status_and_keeps_other_controllers_parents() {
    let s = snapshot(CLUSTER);
    let patches = plan(&s, &report(&s, 1000), None, &RolloutReport::default());
    let ids: Vec<String> = patches.iter().map(StatusPatch::id).collect();
    assert_eq!(
        ids,
        [
            "GatewayClass sluice",
            "Gateway default/gw",
            "HTTPRoute default/web"
        ]
    );
    let route = &patches[2];
    assert_eq!(route.resource_version.as_deref(), Some("12"));
    assert_eq!(route.body["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(route.body["kind"], "HTTPRoute");
    // Other controllers write the route's parents too: the apply holds
    // only over the version read (a precondition), the Gateway's needs none.
    assert_eq!(
        route.body["metadata"],
        json!({"name": "web", "namespace": "default", "resourceVersion": "12"})
    );
    assert_eq!(
        patches[1].body["metadata"],
        json!({"name": "gw", "namespace": "default"})
    );
    let parents = route.body["status"]["parents"]
        .as_array()
        .expect("parents is a list");
    assert_eq!(parents.len(), 2, "{parents:#?}");
    assert_eq!(parents[0]["controllerName"], "example.com/other");
    assert_eq!(parents[0]["conditions"][0]["message"], "theirs");
    assert_eq!(parents[1]["controllerName"], CONTROLLER_NAME);
    assert_eq!(parents[1]["parentRef"]["name"], "gw");
    for c in parents[1]["conditions"].as_array().expect("conditions") {
        assert_eq!(c["observedGeneration"], 5, "{c}");
    }
    let class = &patches[0].body["status"]["conditions"][0];
    assert_eq!(
        (&class["type"], &class["status"]),
        (&json!("Accepted"), &json!("True"))
    );
}

#[test]
fn an_unchanged_status_is_not_written_again() {
    let s = snapshot(CLUSTER);
    let first = plan(&s, &report(&s, 1000), None, &RolloutReport::default());
    let written = applied(&s, &first);
    // Translated again later: the same conditions, a newer clock.
    let again = plan(
        &written,
        &report(&written, 2000),
        None,
        &RolloutReport::default(),
    );
    assert!(again.is_empty(), "{again:#?}");
}

#[test]
fn a_status_change_keeps_transition_times_of_unchanged_conditions() {
    let s = snapshot(CLUSTER);
    let written = applied(
        &s,
        &plan(&s, &report(&s, 1000), None, &RolloutReport::default()),
    );
    // The backend Service goes away: ResolvedRefs turns False.
    let mut changed = written.clone();
    changed
        .services
        .retain(|svc| svc.metadata.name.as_deref() != Some("web"));
    let patches = plan(
        &changed,
        &report(&changed, 2000),
        None,
        &RolloutReport::default(),
    );
    let ids: Vec<String> = patches.iter().map(StatusPatch::id).collect();
    assert_eq!(ids, ["HTTPRoute default/web"]);
    let ours = &patches[0].body["status"]["parents"][1]["conditions"];
    let condition = |ty: &str| {
        ours.as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == ty))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(condition("ResolvedRefs")["status"], "False");
    assert_eq!(condition("ResolvedRefs")["reason"], "BackendNotFound");
    assert_eq!(
        condition("ResolvedRefs")["lastTransitionTime"],
        "1970-01-01T00:33:20Z"
    );
    assert_eq!(
        condition("Accepted")["lastTransitionTime"],
        "1970-01-01T00:16:40Z",
        "Accepted stayed True: its time is kept"
    );
}

#[test]
fn a_route_detached_from_our_gateways_loses_only_our_parents() {
    let s = snapshot(CLUSTER);
    let mut written = applied(
        &s,
        &plan(&s, &report(&s, 1000), None, &RolloutReport::default()),
    );
    for route in &mut written.http_routes {
        std::sync::Arc::make_mut(route).spec.parent_refs = Some(Vec::new());
    }
    let patches = plan(
        &written,
        &report(&written, 2000),
        None,
        &RolloutReport::default(),
    );
    let ids: Vec<String> = patches.iter().map(StatusPatch::id).collect();
    // The Gateway's listener counts one attached route less.
    assert_eq!(ids, ["Gateway default/gw", "HTTPRoute default/web"]);
    let parents = &patches[1].body["status"]["parents"];
    assert_eq!(parents.as_array().map(Vec::len), Some(1));
    assert_eq!(parents[0]["controllerName"], "example.com/other");
}

#[test]
fn gateway_addresses_prefer_load_balancer_ingress_over_cluster_ip() {
    let mut s = snapshot(CLUSTER);
    let cluster_ip = gateway_addresses(&s, "sluice-system", "sluice").expect("a ClusterIP");
    assert_eq!(cluster_ip.len(), 1);
    assert_eq!(
        (
            cluster_ip[0].r#type.as_deref(),
            cluster_ip[0].value.as_str()
        ),
        (Some("IPAddress"), "10.96.0.7")
    );
    let svc = s
        .services
        .iter_mut()
        .find(|svc| svc.metadata.name.as_deref() == Some("sluice"))
        .expect("the gateway Service");
    svc.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [
        {"ip": "203.0.113.9"}, {"hostname": "lb.example.com"}]}}))
    .expect("a valid Service status");
    let lb = gateway_addresses(&s, "sluice-system", "sluice").expect("ingress addresses");
    let got: Vec<(Option<&str>, &str)> = lb
        .iter()
        .map(|a| (a.r#type.as_deref(), a.value.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (Some("IPAddress"), "203.0.113.9"),
            (Some("Hostname"), "lb.example.com")
        ]
    );
    assert!(gateway_addresses(&s, "sluice-system", "missing").is_none());

    let patches = plan(&s, &report(&s, 1000), Some(&lb), &RolloutReport::default());
    let gateway = patches
        .iter()
        .find(|p| p.kind == "Gateway")
        .expect("a Gateway patch");
    assert_eq!(
        gateway.body["status"]["addresses"],
        json!([{"type": "IPAddress", "value": "203.0.113.9"},
               {"type": "Hostname", "value": "lb.example.com"}])
    );
}

/// [`CLUSTER`] plus a ListenerSet the Gateway admits and a
/// BackendTLSPolicy on the route's Service that another controller also
/// reports on. The CA ConfigMap is missing, so the policy is not accepted:
/// its status is still ours to write.
fn cluster_with_listener_set_and_policy() -> String {
    let gateway = "  listeners: [{name: http, protocol: HTTP, port: 8080}]\n";
    let admitting = "  allowedListeners: {namespaces: {from: Same}}\n  listeners: [{name: http, protocol: HTTP, port: 8080}]\n";
    assert!(CLUSTER.contains(gateway));
    CLUSTER.replacen(gateway, admitting, 1)
        + "---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: extra, namespace: default, generation: 3, resourceVersion: '13'}
spec:
  parentRef: {name: gw}
  listeners: [{name: admin, protocol: HTTP, port: 9090}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: web-tls, namespace: default, generation: 4, resourceVersion: '14'}
spec:
  targetRefs: [{group: '', kind: Service, name: web}]
  validation:
    hostname: web.default
    caCertificateRefs: [{group: '', kind: ConfigMap, name: web-ca}]
status:
  ancestors:
  - ancestorRef: {group: gateway.networking.k8s.io, kind: Gateway, name: mesh, namespace: default}
    controllerName: example.com/other
    conditions:
    - {type: Accepted, status: 'True', reason: Accepted, message: theirs,
       observedGeneration: 4, lastTransitionTime: '2020-01-01T00:00:00Z'}
"
}

#[test]
fn listener_sets_and_policy_ancestors_are_written_keeping_other_controllers_ancestors() {
    let s = snapshot(&cluster_with_listener_set_and_policy());
    let patches = plan(&s, &report(&s, 1000), None, &RolloutReport::default());
    let find = |kind: &str| {
        patches
            .iter()
            .find(|p| p.kind == kind)
            .unwrap_or_else(|| panic!("a {kind} patch in {patches:#?}"))
    };

    let set = find("ListenerSet");
    assert_eq!(set.id(), "ListenerSet default/extra");
    assert_eq!(set.resource_version.as_deref(), Some("13"));
    assert_eq!(set.body["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(set.body["kind"], "ListenerSet");
    let conditions = set.body["status"]["conditions"]
        .as_array()
        .expect("ListenerSet conditions");
    let accepted = conditions
        .iter()
        .find(|c| c["type"] == "Accepted")
        .expect("Accepted");
    assert_eq!(accepted["status"], "True", "{accepted}");
    assert_eq!(accepted["observedGeneration"], 3);
    assert_eq!(set.body["status"]["listeners"][0]["name"], "admin");

    let policy = find("BackendTLSPolicy");
    assert_eq!(policy.id(), "BackendTLSPolicy default/web-tls");
    let ancestors = policy.body["status"]["ancestors"]
        .as_array()
        .expect("ancestors is a list");
    assert_eq!(ancestors.len(), 2, "{ancestors:#?}");
    assert_eq!(ancestors[0]["controllerName"], "example.com/other");
    assert_eq!(ancestors[0]["conditions"][0]["message"], "theirs");
    assert_eq!(ancestors[1]["controllerName"], CONTROLLER_NAME);
    assert_eq!(ancestors[1]["ancestorRef"]["name"], "gw");
    for c in ancestors[1]["conditions"].as_array().expect("conditions") {
        assert_eq!(c["observedGeneration"], 4, "{c}");
    }

    // Written once, the same status is not written again.
    let written = applied(&s, &patches);
    let again = plan(
        &written,
        &report(&written, 2000),
        None,
        &RolloutReport::default(),
    );
    assert!(again.is_empty(), "{again:#?}");
}

#[test]
fn a_policy_no_gateway_of_ours_uses_loses_only_our_ancestors() {
    let s = snapshot(&cluster_with_listener_set_and_policy());
    let mut written = applied(
        &s,
        &plan(&s, &report(&s, 1000), None, &RolloutReport::default()),
    );
    // The route stops using the Service the policy targets.
    for policy in &mut written.backend_tls_policies {
        policy.spec.target_refs[0].name = "elsewhere".into();
    }
    let patches = plan(
        &written,
        &report(&written, 2000),
        None,
        &RolloutReport::default(),
    );
    let policy = patches
        .iter()
        .find(|p| p.kind == "BackendTLSPolicy")
        .unwrap_or_else(|| panic!("a policy patch in {patches:#?}"));
    assert_eq!(
        policy.body["status"]["ancestors"].as_array().map(|a| a
            .iter()
            .map(|e| e["controllerName"].clone())
            .collect::<Vec<_>>()),
        Some(vec![json!("example.com/other")])
    );
}

#[test]
fn ancestors_keep_their_transition_times_by_ancestor_and_controller() {
    let old = json!({"ancestors": [
        {"ancestorRef": {"name": "gw"}, "controllerName": CONTROLLER_NAME,
         "conditions": [{"type": "Accepted", "status": "True", "lastTransitionTime": "old"}]},
        {"ancestorRef": {"name": "gw"}, "controllerName": "example.com/other",
         "conditions": [{"type": "Accepted", "status": "True", "lastTransitionTime": "theirs"}]},
    ]});
    let mut new = json!({"ancestors": [
        {"ancestorRef": {"name": "gw"}, "controllerName": CONTROLLER_NAME,
         "conditions": [{"type": "Accepted", "status": "True", "lastTransitionTime": "new"}]},
        {"ancestorRef": {"name": "other"}, "controllerName": CONTROLLER_NAME,
         "conditions": [{"type": "Accepted", "status": "True", "lastTransitionTime": "new"}]},
    ]});
    keep_transition_times(&mut new, &old);
    assert_eq!(
        new["ancestors"][0]["conditions"][0]["lastTransitionTime"],
        "old"
    );
    assert_eq!(
        new["ancestors"][1]["conditions"][0]["lastTransitionTime"], "new",
        "another ancestor is another entry"
    );
}

#[tokio::test]
async fn listener_set_and_policy_status_go_to_their_status_subresources() {
    let (client, mut handle) = mock_client();
    let s = snapshot(&cluster_with_listener_set_and_policy());
    let report = report(&s, 1000);
    let expected: Vec<StatusPatch> = plan(&s, &report, None, &RolloutReport::default())
        .into_iter()
        .filter(|p| matches!(p.kind, "ListenerSet" | "BackendTLSPolicy"))
        .collect();
    assert_eq!(expected.len(), 2);
    let writer = StatusWriter::new(client);
    let verifier = tokio::spawn(async move { answer_applies(&mut handle, 2).await });
    for patch in &expected {
        writer.apply(patch).await.expect("the patch is applied");
    }
    let seen = verifier.await.expect("the verifier does not panic");
    let uris: Vec<&str> = seen.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!(
        uris,
        [
            "/apis/gateway.networking.k8s.io/v1/namespaces/default/listenersets/extra/status?&force=true&fieldManager=sluice.dev%2Fgateway-controller",
            "/apis/gateway.networking.k8s.io/v1/namespaces/default/backendtlspolicies/web-tls/status?&force=true&fieldManager=sluice.dev%2Fgateway-controller",
        ]
    );
    for ((_, body), patch) in seen.iter().zip(&expected) {
        assert_eq!(body, &patch.body);
    }
}

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A mocked API server (the kube-rs `ApiServerVerifier` pattern).
fn mock_client() -> (Client, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), handle)
}

/// Answer a request of the mocked API server with `code` and `body`.
fn answer(respond: tower_test::mock::SendResponse<Response<Body>>, code: u16, body: &Value) {
    respond.send_response(
        Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("a response"),
    );
}

/// The `Status` the API server answers a failure with.
fn failure(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

async fn body_json(request: Request<Body>) -> Value {
    let bytes = request
        .into_body()
        .collect()
        .await
        .expect("the request body arrives")
        .to_bytes();
    serde_json::from_slice(&bytes).expect("a JSON body")
}

/// Answer `n` requests, each a server-side apply (PATCH,
/// `application/apply-patch+yaml`), with their own body: their URIs and
/// bodies.
async fn answer_applies(handle: &mut Handle, n: usize) -> Vec<(String, Value)> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let (request, respond) = handle.next_request().await.expect("a request");
        assert_eq!(request.method(), Method::PATCH);
        assert_eq!(
            request
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("application/apply-patch+yaml")
        );
        let uri = request.uri().to_string();
        let body = body_json(request).await;
        respond.send_response(
            Response::builder()
                .body(Body::from(serde_json::to_vec(&body).expect("json")))
                .expect("a response"),
        );
        seen.push((uri, body));
    }
    seen
}

#[tokio::test]
async fn status_is_server_side_applied_to_the_status_subresource() {
    let (client, mut handle) = mock_client();
    let s = snapshot(CLUSTER);
    let report = report(&s, 1000);
    let expected = plan(&s, &report, None, &RolloutReport::default());
    let verifier = tokio::spawn(async move { answer_applies(&mut handle, 3).await });
    let mut writer = StatusWriter::new(client);
    let outcome = writer
        .sync(&s, &report, None, &RolloutReport::default())
        .await;
    assert_eq!(
        outcome,
        SyncOutcome {
            written: 3,
            failed: 0,
            conflicts: 0,
        }
    );
    let seen = verifier.await.expect("the verifier does not panic");
    let uris: Vec<&str> = seen.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!(
        uris,
        [
            "/apis/gateway.networking.k8s.io/v1/gatewayclasses/sluice/status?&force=true&fieldManager=sluice.dev%2Fgateway-controller",
            "/apis/gateway.networking.k8s.io/v1/namespaces/default/gateways/gw/status?&force=true&fieldManager=sluice.dev%2Fgateway-controller",
            "/apis/gateway.networking.k8s.io/v1/namespaces/default/httproutes/web/status?&force=true&fieldManager=sluice.dev%2Fgateway-controller",
        ]
    );
    for ((_, body), patch) in seen.iter().zip(&expected) {
        assert_eq!(body, &patch.body);
    }

    // The watch has not delivered the new objects yet: nothing is re-sent.
    let again = writer
        .sync(&s, &report, None, &RolloutReport::default())
        .await;
    assert_eq!(again, SyncOutcome::default());
}

/// CLUSTER's report synced twice against a mock API server that answers
/// write `i` (of `writes`) to `uri` with `answer_for(i, uri, body)`: what
/// the two syncs did.
async fn sync_twice<F>(writes: usize, answer_for: F) -> [SyncOutcome; 2]
where
    F: Fn(usize, &str, Value) -> (u16, Value) + Send + 'static,
{
    let (client, mut handle) = mock_client();
    let s = snapshot(CLUSTER);
    let report = report(&s, 1000);
    let server = tokio::spawn(async move {
        for i in 0..writes {
            let (request, respond) = handle.next_request().await.expect("a request");
            let uri = request.uri().to_string();
            let body = body_json(request).await;
            let (code, reply) = answer_for(i, &uri, body);
            answer(respond, code, &reply);
        }
    });
    let mut writer = StatusWriter::new(client);
    let mut outcomes = [SyncOutcome::default(); 2];
    for outcome in &mut outcomes {
        *outcome = writer
            .sync(&s, &report, None, &RolloutReport::default())
            .await;
    }
    server.await.expect("the mock does not panic");
    outcomes
}

#[tokio::test]
async fn failed_writes_are_counted_and_retried() {
    // The first round fails everything (a 500 from the API server).
    let outcomes = sync_twice(6, |i, _, body| match i {
        0..3 => (500, failure(500, "InternalError", "etcd is sad")),
        _ => (200, body),
    })
    .await;
    let failed = SyncOutcome {
        written: 0,
        failed: 3,
        conflicts: 0,
    };
    let written = SyncOutcome {
        written: 3,
        failed: 0,
        conflicts: 0,
    };
    assert_eq!(outcomes, [failed, written]);
}

#[tokio::test]
async fn a_write_refused_for_a_newer_version_is_a_conflict_and_sent_again() {
    // The route changed since it was read: 409, as the API server answers
    // an apply whose resourceVersion is not the object's.
    let outcomes = sync_twice(4, |i, uri, body| {
        if uri.contains("/httproutes/") && i < 3 {
            (
                409,
                failure(409, "Conflict", "the object has been modified"),
            )
        } else {
            (200, body)
        }
    })
    .await;
    let conflict = SyncOutcome {
        written: 2,
        failed: 0,
        conflicts: 1,
    };
    // Not remembered as sent: the next sync (the watch's newer route, or
    // the retry) writes it.
    let again = SyncOutcome {
        written: 1,
        failed: 0,
        conflicts: 0,
    };
    assert_eq!(outcomes, [conflict, again]);
}

/// CLUSTER plus a RolloutPolicy on the route, on whose status another
/// controller reports too.
fn cluster_with_rollout_policy() -> String {
    format!(
        "{CLUSTER}---
apiVersion: sluice.dev/v1alpha1
kind: RolloutPolicy
metadata: {{name: web, namespace: default, generation: 3, resourceVersion: '20'}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: web}}]
  steps: ['5%', '100%']
  interval: 1m
status:
  ancestors:
  - ancestorRef: {{name: other-gw}}
    controllerName: example.com/other
    conditions:
    - {{type: Accepted, status: 'True', reason: Accepted, message: theirs,
       observedGeneration: 3, lastTransitionTime: '2020-01-01T00:00:00Z'}}
"
    )
}

/// A rollout of `default/web` rule 0 at its first step.
fn rollouts_at_first_step() -> RolloutReport {
    use crate::resources::Percent;
    use crate::rollout::{BackendKey, Phase, Rollout, Rollouts, RuleKey, Weights};
    let key = |name: &str| BackendKey::service("default", name, Some(80));
    let mut from = Weights::new();
    from.add(key("web"), 1);
    from.add(key("web-v2"), 0);
    let mut to = Weights::new();
    to.add(key("web"), 0);
    to.add(key("web-v2"), 1);
    let rollout = Rollout {
        policy: PolicyKey {
            namespace: "default".into(),
            name: "web".into(),
        },
        rule: RuleKey {
            kind: crate::route::RouteKind::Http,
            namespace: "default".into(),
            route: "web".into(),
            rule: 0,
        },
        rule_name: None,
        phase: Phase::Progressing,
        step: Percent::parse("5%").ok(),
        step_started_at: "2024-05-01T10:00:00.5Z".parse().ok(),
        from,
        to,
        held_for: None,
        message: "started: step 5%".into(),
    };
    RolloutReport::new(&Rollouts::restore([rollout]), None)
}

#[test]
fn a_rollout_policy_gets_its_ancestors_and_rollouts_in_one_apply() {
    let s = snapshot(&cluster_with_rollout_policy());
    let rollouts = rollouts_at_first_step();
    let patches = plan(&s, &report(&s, 1000), None, &rollouts);
    let policy = patches
        .iter()
        .find(|p| p.kind == "RolloutPolicy")
        .expect("the policy's status is written");
    assert_eq!(policy.id(), "RolloutPolicy default/web");
    assert_eq!(policy.resource_version.as_deref(), Some("20"));
    assert_eq!(policy.body["apiVersion"], "sluice.dev/v1alpha1");
    assert_eq!(policy.body["kind"], "RolloutPolicy");
    // Its ancestors are a list other controllers write too: the apply
    // holds only over the version read.
    assert_eq!(
        policy.body["metadata"],
        json!({"name": "web", "namespace": "default", "resourceVersion": "20"})
    );
    let status = &policy.body["status"];
    let ancestors = status["ancestors"].as_array().expect("ancestors");
    assert_eq!(ancestors.len(), 2, "{ancestors:#?}");
    assert_eq!(ancestors[0]["controllerName"], "example.com/other");
    assert_eq!(ancestors[0]["conditions"][0]["message"], "theirs");
    assert_eq!(ancestors[1]["controllerName"], CONTROLLER_NAME);
    assert_eq!(ancestors[1]["conditions"][0]["observedGeneration"], 3);
    let rollout = &status["rollouts"][0];
    assert_eq!(rollout["route"], "web");
    assert_eq!(rollout["rule"], 0);
    assert_eq!(rollout["phase"], "Progressing");
    assert_eq!(rollout["step"], "5%");
    assert_eq!(rollout["stepStartedAt"], "2024-05-01T10:00:00.5Z");
    assert_eq!(rollout["served"][0]["name"], "web");
    assert_eq!(rollout["served"][0]["share"], "95%");
    assert_eq!(rollout["served"][1]["share"], "5%");
    // What a replica reads back is the rollout written.
    let written = applied(&s, &patches);
    let (records, _, problems) = crate::rollout::recorded(&written.rollout_policies);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].step.map(|p| p.to_string()).as_deref(),
        Some("5%")
    );
    // Written once: translated again, nothing moved, nothing to write.
    let again = plan(&written, &report(&written, 2000), None, &rollouts);
    assert!(again.is_empty(), "{again:#?}");
    // The rollout moves: the policy is written again, the others are not.
    let moved = plan(
        &written,
        &report(&written, 2000),
        None,
        &RolloutReport::default(),
    );
    let ids: Vec<String> = moved.iter().map(StatusPatch::id).collect();
    assert_eq!(ids, ["RolloutPolicy default/web"]);
    assert_eq!(moved[0].body["status"]["rollouts"], json!([]));
}

#[tokio::test]
async fn a_rollout_policy_status_is_applied_to_its_sluice_dev_status_subresource() {
    let (client, mut handle) = mock_client();
    let s = snapshot(&cluster_with_rollout_policy());
    let expected: Vec<StatusPatch> = plan(&s, &report(&s, 1000), None, &rollouts_at_first_step())
        .into_iter()
        .filter(|p| p.kind == "RolloutPolicy")
        .collect();
    assert_eq!(expected.len(), 1);
    let verifier = tokio::spawn(async move { answer_applies(&mut handle, 1).await });
    let writer = StatusWriter::new(client);
    writer
        .apply(&expected[0])
        .await
        .expect("the patch is applied");
    let (uri, body) = verifier
        .await
        .expect("the verifier does not panic")
        .remove(0);
    assert_eq!(
        uri,
        "/apis/sluice.dev/v1alpha1/namespaces/default/rolloutpolicies/web/status?&force=true&fieldManager=sluice.dev%2Fgateway-controller"
    );
    assert_eq!(body, expected[0].body);
}

fn served_ingress(name: &str, load_balancer: Value) -> ServedIngress {
    ServedIngress {
        namespace: "shop".into(),
        name: name.into(),
        resource_version: Some("7".into()),
        load_balancer,
    }
}

fn address(ty: Option<&str>, value: &str) -> GatewayStatusAddresses {
    GatewayStatusAddresses {
        r#type: ty.map(str::to_string),
        value: value.into(),
    }
}

#[test]
fn ingresses_get_the_gateway_addresses_as_ips_and_hostnames_only_when_they_differ() {
    let addresses = [
        address(Some("IPAddress"), "203.0.113.7"),
        address(None, "2001:db8::7"),
        address(Some("Hostname"), "lb.example.com"),
        address(Some("example.com/named"), "internal-pool"),
    ];
    let desired = json!({"ingress": [
        {"ip": "203.0.113.7"}, {"ip": "2001:db8::7"}, {"hostname": "lb.example.com"}]});
    let ingresses = [
        served_ingress("new", Value::Null),
        served_ingress("old", json!({"ingress": [{"ip": "192.0.2.1"}]})),
        served_ingress("done", desired.clone()),
    ];
    let patches = ingress_plan(&ingresses, &addresses);
    let ids: Vec<String> = patches.iter().map(StatusPatch::id).collect();
    assert_eq!(ids, ["Ingress shop/new", "Ingress shop/old"]);
    assert_eq!(
        patches[0].body,
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
               "metadata": {"name": "new", "namespace": "shop"},
               "status": {"loadBalancer": desired}})
    );
    assert_eq!(
        patches[0].resource_version.as_deref(),
        Some("7"),
        "remembered, not a precondition"
    );

    // A Gateway without addresses (or only named ones) leaves the
    // Ingresses' status as it is.
    assert!(ingress_plan(&ingresses, &[]).is_empty());
    assert!(ingress_plan(&ingresses, &addresses[3..]).is_empty());
}

#[test]
fn gateway_status_addresses_are_the_gateways_own() {
    let s = snapshot(CLUSTER);
    assert_eq!(gateway_status_addresses(&s, "default", "gw"), None);
    let with_addresses = CLUSTER.replace(
        "listeners: [{name: http, protocol: HTTP, port: 8080}]",
        "listeners: [{name: http, protocol: HTTP, port: 8080}]\nstatus:\n  addresses: [{type: Hostname, value: lb.example.com}]",
    );
    let s = snapshot(&with_addresses);
    assert_eq!(
        gateway_status_addresses(&s, "default", "gw"),
        Some(vec![address(Some("Hostname"), "lb.example.com")])
    );
    assert_eq!(gateway_status_addresses(&s, "other", "gw"), None);
}

#[tokio::test]
async fn ingress_status_is_applied_to_its_subresource_and_objects_not_in_the_cluster_are_skipped() {
    let (client, mut handle) = mock_client();
    let s = snapshot(CLUSTER);
    let report = report(&s, 1000);
    let verifier = tokio::spawn(async move { answer_applies(&mut handle, 3).await });
    let mut writer = StatusWriter::new(client);
    // The route was converted from an Ingress: the API server has no such
    // HTTPRoute.
    writer.set_not_in_cluster(["HTTPRoute default/web".to_string()]);
    let outcome = writer
        .sync(&s, &report, None, &RolloutReport::default())
        .await;
    assert_eq!(outcome.written, 2);
    let patches = ingress_plan(
        &[served_ingress("web", Value::Null)],
        &[address(None, "203.0.113.7")],
    );
    assert_eq!(writer.send(patches.clone()).await.written, 1);
    assert_eq!(
        writer.send(patches).await,
        SyncOutcome::default(),
        "sent already"
    );
    let seen = verifier.await.expect("the verifier does not panic");
    let uris: Vec<&str> = seen.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!(
        uris,
        [
            "/apis/gateway.networking.k8s.io/v1/gatewayclasses/sluice/status?&force=true&fieldManager=sluice.dev%2Fgateway-controller",
            "/apis/gateway.networking.k8s.io/v1/namespaces/default/gateways/gw/status?&force=true&fieldManager=sluice.dev%2Fgateway-controller",
            "/apis/networking.k8s.io/v1/namespaces/shop/ingresses/web/status?&force=true&fieldManager=sluice.dev%2Fgateway-controller",
        ]
    );
}
