//! Path (Exact, PathPrefix by whole segments, RegularExpression), headers
//! (Exact, RegularExpression, names case-insensitive), query params and
//! method; ANDed within a match, ORed across matches; no matches = `/`.

use crate::support::*;

async fn pods() -> Vec<Pods> {
    let mut v = Vec::new();
    for name in [
        "exact", "prefix", "regex", "header", "headerre", "query", "method", "and", "or",
    ] {
        v.push(Pods::start("default", name, 1).await);
    }
    v
}

const RULES: &str = r#"  hostnames: ["match.example.com"]
  rules:
  - matches:
    - path: {type: Exact, value: /exact}
    backendRefs: [{name: exact, port: 8080}]
  - matches:
    - path: {type: PathPrefix, value: /prefix}
    backendRefs: [{name: prefix, port: 8080}]
  - matches:
    - path: {type: RegularExpression, value: "/re/[0-9]+"}
    backendRefs: [{name: regex, port: 8080}]
  - matches:
    - path: {type: PathPrefix, value: /h}
      headers:
      - {name: X-Env, value: canary}
    backendRefs: [{name: header, port: 8080}]
  - matches:
    - path: {type: PathPrefix, value: /h}
      headers:
      - {type: RegularExpression, name: x-version, value: "v[0-9]+"}
    backendRefs: [{name: headerre, port: 8080}]
  - matches:
    - path: {type: PathPrefix, value: /q}
      queryParams:
      - {name: debug, value: "1"}
    backendRefs: [{name: query, port: 8080}]
  - matches:
    - path: {type: PathPrefix, value: /m}
      method: POST
    backendRefs: [{name: method, port: 8080}]
  - matches:
    - path: {type: Exact, value: /and}
      method: PUT
      headers: [{name: x-a, value: "1"}]
      queryParams: [{name: b, value: "2"}]
    backendRefs: [{name: and, port: 8080}]
  - matches:
    - path: {type: Exact, value: /or1}
    - headers: [{name: x-or, value: "yes"}]
    backendRefs: [{name: or, port: 8080}]"#;

async fn start() -> (Sluice, Vec<Pods>) {
    let pods = pods().await;
    let mut manifests = gateway();
    for p in &pods {
        manifests += &p.manifests();
    }
    manifests += &route("default", "matching", RULES);
    manifests += &route(
        "default",
        "catch-all",
        "  hostnames: [\"default.example.com\"]\n  rules:\n  - backendRefs: [{name: exact, port: 8080}]",
    );
    (Sluice::start(&[("all.yaml", manifests)]).await, pods)
}

async fn who(conn: &mut Conn, method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "match.example.com");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    conn.send(
        req.body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await
    .pod()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_match_routes_as_the_spec_says() {
    let (gw, _pods) = start().await;
    let mut c = gw.connect().await;

    // Path: Exact is the whole path; PathPrefix is whole segments.
    assert_eq!(who(&mut c, "GET", "/exact", &[]).await, "exact-0");
    assert_eq!(who(&mut c, "GET", "/exact/", &[]).await, "<404>");
    assert_eq!(who(&mut c, "GET", "/exact?x=1", &[]).await, "exact-0");
    assert_eq!(who(&mut c, "GET", "/prefix", &[]).await, "prefix-0");
    assert_eq!(who(&mut c, "GET", "/prefix/", &[]).await, "prefix-0");
    assert_eq!(
        who(&mut c, "GET", "/prefix/deeper/x", &[]).await,
        "prefix-0"
    );
    assert_eq!(who(&mut c, "GET", "/prefixed", &[]).await, "<404>");
    // RegularExpression matches the whole path.
    assert_eq!(who(&mut c, "GET", "/re/123", &[]).await, "regex-0");
    assert_eq!(who(&mut c, "GET", "/re/12a", &[]).await, "<404>");

    // Headers: names case-insensitive, Exact and RegularExpression values.
    assert_eq!(
        who(&mut c, "GET", "/h", &[("x-env", "canary")]).await,
        "header-0"
    );
    assert_eq!(
        who(&mut c, "GET", "/h", &[("X-ENV", "canary")]).await,
        "header-0"
    );
    assert_eq!(
        who(&mut c, "GET", "/h", &[("x-env", "Canary")]).await,
        "<404>"
    );
    assert_eq!(
        who(&mut c, "GET", "/h", &[("X-Version", "v42")]).await,
        "headerre-0"
    );
    assert_eq!(
        who(&mut c, "GET", "/h", &[("X-Version", "v42-beta")]).await,
        "<404>"
    );

    // Query params.
    assert_eq!(who(&mut c, "GET", "/q?debug=1", &[]).await, "query-0");
    assert_eq!(who(&mut c, "GET", "/q?x=2&debug=1", &[]).await, "query-0");
    assert_eq!(who(&mut c, "GET", "/q?debug=2", &[]).await, "<404>");
    assert_eq!(who(&mut c, "GET", "/q", &[]).await, "<404>");

    // Method.
    assert_eq!(who(&mut c, "POST", "/m", &[]).await, "method-0");
    assert_eq!(who(&mut c, "GET", "/m", &[]).await, "<404>");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_are_anded_within_a_match_and_ored_across_matches() {
    let (gw, _pods) = start().await;
    let mut c = gw.connect().await;
    let all = [("x-a", "1")];
    assert_eq!(who(&mut c, "PUT", "/and?b=2", &all).await, "and-0");
    assert_eq!(who(&mut c, "GET", "/and?b=2", &all).await, "<404>");
    assert_eq!(who(&mut c, "PUT", "/and?b=3", &all).await, "<404>");
    assert_eq!(who(&mut c, "PUT", "/and?b=2", &[]).await, "<404>");

    assert_eq!(who(&mut c, "GET", "/or1", &[]).await, "or-0");
    assert_eq!(
        who(&mut c, "GET", "/anything/else", &[("x-or", "yes")]).await,
        "or-0"
    );
    assert_eq!(who(&mut c, "GET", "/anything/else", &[]).await, "<404>");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_without_matches_is_a_prefix_match_on_slash() {
    let (gw, _pods) = start().await;
    let mut c = gw.connect().await;
    for path in ["/", "/a/b/c", "/exact?q=1"] {
        let r = c.get_with("default.example.com", path, &[]).await;
        assert_eq!(r.pod(), "exact-0", "{path}");
        assert_eq!(r.echo().path, path);
    }
}
