//! Precedence across all routes on a listener, as DESIGN.md lists it, with
//! routes in separate files in the *opposite* order of their precedence so
//! that file or YAML order cannot be what decides.

use crate::support::*;

fn routed(name: &str, created: &str, host: &str, matches: &str, backend: &str) -> String {
    format!(
        r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: {name}
  namespace: default
  creationTimestamp: "{created}"
spec:
  parentRefs: [{{name: gw}}]
  hostnames: ["{host}"]
  rules:
  - matches:
{matches}
    backendRefs: [{{name: {backend}, port: 8080}}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precedence_is_the_spec_ladder_not_file_order() {
    let names = [
        "exact",
        "longprefix",
        "shortprefix",
        "method",
        "headers2",
        "headers1",
        "query",
        "oldest",
        "newest",
        "alpha",
        "beta",
    ];
    let mut pods = Vec::new();
    let mut base = gateway();
    for n in names {
        let p = Pods::start("default", n, 1).await;
        base += &p.manifests();
        pods.push(p);
    }
    let t = "2026-01-01T00:00:00Z";
    let h = "p.example.com";
    // Files are read in name order: a_ first. Each a_ route would win if
    // order decided; each z_ route must win by the spec.
    let files = vec![
        ("base.yaml", base),
        (
            "a1.yaml",
            routed(
                "a1",
                t,
                h,
                "    - path: {type: PathPrefix, value: /x}",
                "shortprefix",
            ),
        ),
        (
            "z1.yaml",
            routed(
                "z1",
                t,
                h,
                "    - path: {type: PathPrefix, value: /x/y}",
                "longprefix",
            ),
        ),
        (
            "z2.yaml",
            routed(
                "z2",
                t,
                h,
                "    - path: {type: Exact, value: /x/y}",
                "exact",
            ),
        ),
        (
            "a3.yaml",
            routed(
                "a3",
                t,
                h,
                "    - path: {type: PathPrefix, value: /m}\n      headers: [{name: x-a, value: \"1\"}, {name: x-b, value: \"1\"}]",
                "headers2",
            ),
        ),
        (
            "z3.yaml",
            routed(
                "z3",
                t,
                h,
                "    - path: {type: PathPrefix, value: /m}\n      method: GET",
                "method",
            ),
        ),
        (
            "a4.yaml",
            routed(
                "a4",
                t,
                h,
                "    - path: {type: PathPrefix, value: /h}\n      headers: [{name: x-a, value: \"1\"}]",
                "headers1",
            ),
        ),
        (
            "z4.yaml",
            routed(
                "z4",
                t,
                h,
                "    - path: {type: PathPrefix, value: /h}\n      headers: [{name: x-a, value: \"1\"}, {name: x-b, value: \"1\"}]",
                "headers2",
            ),
        ),
        (
            "a5.yaml",
            routed(
                "a5",
                t,
                h,
                "    - path: {type: PathPrefix, value: /q}\n      queryParams: [{name: a, value: \"1\"}]",
                "oldest",
            ),
        ),
        (
            "z5.yaml",
            routed(
                "z5",
                t,
                h,
                "    - path: {type: PathPrefix, value: /q}\n      queryParams: [{name: a, value: \"1\"}, {name: b, value: \"1\"}]",
                "query",
            ),
        ),
        // Equal matches: the oldest route wins, whatever its name.
        (
            "a6.yaml",
            routed(
                "a6",
                "2026-03-01T00:00:00Z",
                h,
                "    - path: {type: PathPrefix, value: /t}",
                "newest",
            ),
        ),
        (
            "z6.yaml",
            routed(
                "z6",
                "2025-03-01T00:00:00Z",
                h,
                "    - path: {type: PathPrefix, value: /t}",
                "oldest",
            ),
        ),
        // Equal matches and age: namespace/name alphabetically ("a7" < "b7").
        (
            "a7.yaml",
            routed(
                "b7",
                t,
                h,
                "    - path: {type: PathPrefix, value: /n}",
                "beta",
            ),
        ),
        (
            "z7.yaml",
            routed(
                "a7",
                t,
                h,
                "    - path: {type: PathPrefix, value: /n}",
                "alpha",
            ),
        ),
    ];
    let gw = Sluice::start(&files).await;
    let mut c = gw.connect().await;
    let who = |r: Resp| r.pod();
    assert_eq!(who(c.get(h, "/x/y").await), "exact-0");
    assert_eq!(who(c.get(h, "/x/y/z").await), "longprefix-0");
    assert_eq!(who(c.get(h, "/x/z").await), "shortprefix-0");
    assert_eq!(
        who(c.get_with(h, "/m", &[("x-a", "1"), ("x-b", "1")]).await),
        "method-0"
    );
    assert_eq!(
        who(c.get_with(h, "/h", &[("x-a", "1"), ("x-b", "1")]).await),
        "headers2-0"
    );
    assert_eq!(
        who(c.get_with(h, "/h", &[("x-a", "1")]).await),
        "headers1-0"
    );
    assert_eq!(who(c.get(h, "/q?a=1&b=1").await), "query-0");
    assert_eq!(who(c.get(h, "/t").await), "oldest-0");
    assert_eq!(who(c.get(h, "/n").await), "alpha-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_order_within_a_route_breaks_the_last_tie() {
    let first = Pods::start("default", "first", 1).await;
    let second = Pods::start("default", "second", 1).await;
    let r = route(
        "default",
        "r",
        r#"  rules:
  - matches: [{path: {type: PathPrefix, value: /same}}]
    backendRefs: [{name: first, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /same}}]
    backendRefs: [{name: second, port: 8080}]"#,
    );
    let gw = Sluice::start(&[(
        "all.yaml",
        gateway() + &first.manifests() + &second.manifests() + &r,
    )])
    .await;
    let tally = gw.connect().await.tally(10, "any", "/same", &[]).await;
    assert_eq!(tally.get("first-0"), Some(&10), "{tally:?}");
}
