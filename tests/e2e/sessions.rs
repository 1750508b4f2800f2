//! Session persistence (GEP-1619) through the binary: the gateway starts
//! a session on the backend and pod the weighted choice picks and hands
//! the client a cookie (or a header); requests carrying it stay on that
//! pod, even when its backend's weight drops to 0, and move to another pod
//! of the same backend when the pod goes away. Sessions end with their
//! `absoluteTimeout`, a permanent cookie carries its expiry, sessions are
//! never shared between rules, and GRPCRoute rules keep sessions by
//! header. No upstream conformance test exists yet: these follow the
//! GEP's text and its planned conformance cases.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::Full;
use sluice::echo::EchoIdentity;
use sluice::grpc_echo::{self, GrpcEchoServer, code};

use crate::support::{
    Conn, Pods, Resp, Sluice, gateway, poll_until, route, static_service_endpoints,
};

/// `Set-Cookie` values of a response.
pub(crate) fn set_cookies(r: &Resp) -> Vec<String> {
    r.headers
        .get_all(http::header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().expect("ASCII").to_owned())
        .collect()
}

/// The `name=value` a client sends back for a `Set-Cookie`.
pub(crate) fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().expect("a pair").to_owned()
}

async fn get(conn: &mut Conn, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut req = Request::get(path).header("host", "shop.example.com");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    conn.send(req.body(Full::new(Bytes::new())).expect("request"))
        .await
}

fn split(a: &str, b: &str, wa: u32, wb: u32) -> String {
    route(
        "default",
        "shop",
        &format!(
            "  hostnames: [shop.example.com]
  rules:
  - sessionPersistence: {{}}
    backendRefs:
    - {{name: {a}, port: 8080, weight: {wa}}}
    - {{name: {b}, port: 8080, weight: {wb}}}
"
        ),
    )
}

/// Poll until `check` holds for requests without a session, or panic.
async fn until(sluice: &Sluice, what: &str, mut check: impl AsyncFnMut(&mut Conn) -> bool) {
    poll_until(
        what,
        || sluice.log(),
        async || {
            let mut conn = sluice.connect().await;
            check(&mut conn).await
        },
    )
    .await
}

#[tokio::test]
async fn a_cookie_session_stays_on_its_pod_even_at_weight_0_and_follows_its_backend() {
    let blue = Pods::start("default", "blue", 2).await;
    let green = Pods::start("default", "green", 2).await;
    let pods = format!("{}{}", blue.manifests(), green.manifests());
    let sluice = Sluice::start(&[
        ("gw.yaml", gateway()),
        ("pods.yaml", pods.clone()),
        ("route.yaml", split("blue", "green", 1, 1)),
    ])
    .await;
    let mut conn = sluice.connect().await;

    // A first request starts a session: a cookie the gateway made.
    let first = get(&mut conn, "/cart", &[]).await;
    let cookies = set_cookies(&first);
    assert_eq!(cookies.len(), 1, "{:?}", first.headers);
    let set = &cookies[0];
    assert!(set.starts_with("sluice-session-"), "{set}");
    assert!(set.contains("; Path=/; HttpOnly; SameSite=Strict"), "{set}");
    assert!(
        !set.contains("Max-Age") && !set.contains("Expires"),
        "a session cookie: {set}"
    );
    assert!(!set.contains("Secure"), "cleartext listener: {set}");
    let cookie = cookie_pair(set);
    let pod = first.pod();

    // Requests with the cookie stay on that pod, and get no new cookie.
    for _ in 0..50 {
        let r = get(&mut conn, "/cart", &[("cookie", &format!("a=1; {cookie}"))]).await;
        assert_eq!(r.pod(), pod);
        assert!(set_cookies(&r).is_empty());
    }
    // Requests without one are split by weight, exactly, each starting
    // a session.
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..40 {
        let r = get(&mut conn, "/", &[]).await;
        assert_eq!(set_cookies(&r).len(), 1);
        *tally.entry(r.echo().service).or_default() += 1;
    }
    assert_eq!(
        tally,
        BTreeMap::from([("blue".into(), 20), ("green".into(), 20)])
    );

    // The session's backend drops to weight 0: new clients never reach it,
    // the session still does ("even if the weight is set to 0").
    let (ours, theirs) = if pod.starts_with("blue") {
        ("blue", "green")
    } else {
        ("green", "blue")
    };
    sluice.write("route.yaml", &split(ours, theirs, 0, 1));
    until(&sluice, "weight 0 served", async |c| {
        let mut all_theirs = true;
        for _ in 0..10 {
            all_theirs &= get(c, "/", &[]).await.echo().service == theirs;
        }
        all_theirs
    })
    .await;
    for _ in 0..20 {
        let r = get(&mut conn, "/", &[("cookie", &cookie)]).await;
        assert_eq!(r.pod(), pod, "the session survives weight 0");
    }

    // Its pod goes away: the session stays on its backend, on another pod,
    // with a new cookie naming it.
    let ours_pods = if ours == "blue" { &blue } else { &green };
    let gone = ours_pods
        .servers
        .iter()
        .position(|s| s.identity().pod == pod)
        .expect("the pod is one of its backend's");
    let without: String = [&blue, &green]
        .iter()
        .map(|p| {
            if p.service == ours {
                p.manifests_with_readiness(|i| Some(i != gone))
            } else {
                p.manifests()
            }
        })
        .collect();
    sluice.write("pods.yaml", &without);
    let moved = {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let r = get(&mut conn, "/", &[("cookie", &cookie)]).await;
            if r.pod() != pod {
                break r;
            }
            assert!(Instant::now() < deadline, "the pod never went away");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    assert_eq!(moved.echo().service, ours, "still its backend, at weight 0");
    let renewed = set_cookies(&moved);
    assert_eq!(renewed.len(), 1, "the moved session gets a new cookie");
    let new_cookie = cookie_pair(&renewed[0]);
    let new_pod = moved.pod();
    for _ in 0..10 {
        let r = get(&mut conn, "/", &[("cookie", &new_cookie)]).await;
        assert_eq!(r.pod(), new_pod);
    }
}

#[tokio::test]
async fn headers_permanent_cookies_timeouts_and_sessions_per_rule() {
    let app = Pods::start("default", "app", 3).await;
    let spec = "  hostnames: [shop.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /h}}]
    sessionPersistence: {type: Header, sessionName: x-session}
    backendRefs: [{name: app, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /p}}]
    sessionPersistence:
      sessionName: keep
      absoluteTimeout: 1h
      cookieConfig: {lifetimeType: Permanent}
    backendRefs: [{name: app, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /t}}]
    sessionPersistence: {sessionName: short, absoluteTimeout: 1s}
    backendRefs: [{name: app, port: 8080}]
";
    let sluice = Sluice::start(&[
        ("gw.yaml", gateway()),
        ("app.yaml", app.manifests()),
        ("route.yaml", route("default", "shop", spec)),
    ])
    .await;
    let mut conn = sluice.connect().await;

    // Header sessions: the token comes in the session header and goes
    // back in it.
    let first = get(&mut conn, "/h", &[]).await;
    let token = first.headers["x-session"]
        .to_str()
        .expect("ASCII")
        .to_owned();
    assert!(set_cookies(&first).is_empty());
    for _ in 0..20 {
        let r = get(&mut conn, "/h/x", &[("x-session", &token)]).await;
        assert_eq!(r.pod(), first.pod());
    }

    // A permanent cookie expires with the session: Max-Age and Expires.
    let permanent = get(&mut conn, "/p", &[]).await;
    let set = set_cookies(&permanent).pop().expect("a cookie");
    assert!(set.starts_with("keep="), "{set}");
    assert!(set.contains("; Path=/p;"), "the matched path: {set}");
    let max_age: u64 = set
        .split("; ")
        .find_map(|a| a.strip_prefix("Max-Age="))
        .and_then(|v| v.parse().ok())
        .expect("Max-Age");
    assert!((3590..=3600).contains(&max_age), "{set}");
    assert!(set.contains("; Expires="), "{set}");

    // Sessions are per rule: /p's token is no session for /t, even under
    // /t's cookie name.
    let borrowed = format!("short={}", cookie_pair(&set).trim_start_matches("keep="));
    let r = get(&mut conn, "/t", &[("cookie", &borrowed)]).await;
    let fresh = set_cookies(&r).pop().expect("a new session for /t");
    assert!(fresh.starts_with("short="), "{fresh}");

    // absoluteTimeout 1s: the session ends, and the next request starts a
    // new one (a new cookie).
    let short = cookie_pair(&fresh);
    let started = Instant::now();
    loop {
        let r = get(&mut conn, "/t", &[("cookie", &short)]).await;
        if !set_cookies(&r).is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the session never ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn grpc_calls_keep_a_session_by_header() {
    let mut servers = Vec::new();
    for i in 0..3 {
        servers.push(
            GrpcEchoServer::start(EchoIdentity {
                pod: format!("rpc-{i}"),
                namespace: "default".into(),
                service: "rpc".into(),
            })
            .await
            .expect("gRPC backend"),
        );
    }
    let ports: Vec<u16> = servers.iter().map(|s| s.local_addr().port()).collect();
    let manifests = format!(
        r#"{}{}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: rpc, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
  - sessionPersistence: {{type: Header, sessionName: x-rpc-session}}
    backendRefs: [{{name: rpc, port: 8080}}]
"#,
        gateway(),
        static_service_endpoints("rpc", None, 8080, None, &ports),
    );
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;
    let first = grpc_echo::call_h2c(sluice.addr(), "x", "Echo", &[])
        .await
        .expect("answered");
    assert_eq!(first.code, code::OK, "{first:?}");
    let pod = first.response.expect("response").assertions.context.pod;
    let token = session_header(&first.headers);
    let md = vec![("x-rpc-session".to_owned(), token)];
    for _ in 0..20 {
        let r = grpc_echo::call_h2c(sluice.addr(), "x", "Echo", &md)
            .await
            .expect("answered");
        assert_eq!(r.response.expect("response").assertions.context.pod, pod);
    }
    // Without the header, the calls spread over the three pods.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let r = grpc_echo::call_h2c(sluice.addr(), "x", "Echo", &[])
            .await
            .expect("answered");
        seen.insert(r.response.expect("response").assertions.context.pod);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
}

fn session_header(headers: &HeaderMap) -> String {
    headers["x-rpc-session"].to_str().expect("ASCII").to_owned()
}
