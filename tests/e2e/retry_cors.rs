//! HTTPRoute `retry` and the `CORS` filter through the real binary: tries
//! counted on the backend side (a flaky backend that fails a request's
//! first N tries), connection failures retried on the next endpoint,
//! backoff as a lower bound between tries; preflights answered by the
//! gateway without reaching a backend, CORS headers on actual responses.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::support::*;

/// A backend whose answer to `?id=ID&fail=N&code=C` is `C` for the first
/// N tries of that id and 200 afterwards. It records when each try of each
/// id arrived.
struct FlakyBackend {
    addr: SocketAddr,
    tries: Arc<Mutex<HashMap<String, Vec<Instant>>>>,
}

impl FlakyBackend {
    async fn start() -> FlakyBackend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("flaky backend binds");
        let addr = listener.local_addr().expect("local addr");
        let tries: Arc<Mutex<HashMap<String, Vec<Instant>>>> = Arc::default();
        let seen = tries.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let seen = seen.clone();
                        async move { Ok::<_, Infallible>(answer(&seen, &req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FlakyBackend { addr, tries }
    }

    /// When each try of request `id` arrived.
    fn tries(&self, id: &str) -> Vec<Instant> {
        self.tries
            .lock()
            .expect("tries lock")
            .get(id)
            .cloned()
            .unwrap_or_default()
    }

    /// Service `flaky` (port 8080) with this backend and `dead` (ports that
    /// refuse connections) as endpoints, in that order.
    fn manifests(&self, dead: &[u16]) -> String {
        let mut ports = vec![self.addr.port()];
        ports.extend_from_slice(dead);
        let mut out = "\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: flaky\n  namespace: default\nspec:\n  ports:\n  - port: 8080\n".to_string();
        for (i, port) in ports.iter().enumerate() {
            out.push_str(&format!(
                r#"
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: flaky-{i}
  namespace: default
  labels:
    kubernetes.io/service-name: flaky
addressType: IPv4
ports:
- port: {port}
endpoints:
- addresses: ["127.0.0.1"]
"#
            ));
        }
        out
    }
}

fn answer(
    seen: &Mutex<HashMap<String, Vec<Instant>>>,
    req: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let query = req.uri().query().unwrap_or_default();
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_default()
            .to_string()
    };
    let id = param("id");
    let fail: usize = param("fail").parse().unwrap_or(0);
    let code = param("code").parse().unwrap_or(500);
    let tries = {
        let mut seen = seen.lock().expect("tries lock");
        let t = seen.entry(id).or_default();
        t.push(Instant::now());
        t.len()
    };
    let mut resp = Response::new(Full::new(Bytes::from(format!("try {tries}\n"))));
    if tries <= fail {
        *resp.status_mut() = StatusCode::from_u16(code).expect("test code");
    }
    resp
}

/// A port nothing listens on (connections to it are refused).
fn refused_port() -> u16 {
    free_port()
}

const RETRY_ROUTE: &str = r#"  rules:
  - matches: [{path: {type: PathPrefix, value: /retry/code-500-attempts-3}}]
    retry: {codes: [500], attempts: 3, backoff: 10ms}
    backendRefs: [{name: flaky, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /retry/all-attempts-2}}]
    retry: {codes: [500, 502, 503, 504], attempts: 2, backoff: 200ms}
    backendRefs: [{name: flaky, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /no-retry}}]
    backendRefs: [{name: flaky, port: 8080}]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_by_code_up_to_attempts_counted_on_the_backend() {
    let flaky = FlakyBackend::start().await;
    let gw = Sluice::start(&[(
        "all.yaml",
        gateway() + &flaky.manifests(&[]) + &route("default", "retries", RETRY_ROUTE),
    )])
    .await;
    let parent = &gw
        .object_status("HTTPRoute", Some("default"), "retries")
        .await["status"]["parents"][0];
    assert_eq!(parent["conditions"][0]["type"], "Accepted", "{parent:#}");
    assert_eq!(parent["conditions"][0]["status"], "True", "{parent:#}");

    let mut c = gw.connect().await;
    // (path, id, fail, code) -> (status, tries the backend saw)
    let cases = [
        ("/retry/code-500-attempts-3", "a", 2, 500, 200, 3),
        ("/retry/code-500-attempts-3", "b", 3, 500, 200, 4),
        ("/retry/code-500-attempts-3", "c", 4, 500, 500, 4),
        ("/retry/code-500-attempts-3", "d", 2, 503, 503, 1),
        ("/retry/code-500-attempts-3", "e", 0, 500, 200, 1),
        ("/no-retry", "f", 1, 500, 500, 1),
    ];
    for (path, id, fail, code, want, tries) in cases {
        let r = c
            .get("h", &format!("{path}?id={id}&fail={fail}&code={code}"))
            .await;
        assert_eq!(r.status, want, "{path} {id}: {r:?}");
        assert_eq!(flaky.tries(id).len(), tries, "{path} {id}");
        if want == 200 {
            assert_eq!(r.body, format!("try {tries}\n"), "the last try answers");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_wait_at_least_the_backoff_and_it_grows() {
    let flaky = FlakyBackend::start().await;
    let gw = Sluice::start(&[(
        "all.yaml",
        gateway() + &flaky.manifests(&[]) + &route("default", "retries", RETRY_ROUTE),
    )])
    .await;
    let mut c = gw.connect().await;
    for (id, code) in [("g502", 502), ("g504", 504)] {
        let r = c
            .get(
                "h",
                &format!("/retry/all-attempts-2?id={id}&fail=3&code={code}"),
            )
            .await;
        assert_eq!(r.status, code, "the last try's error surfaces");
        let t = flaky.tries(id);
        assert_eq!(t.len(), 3, "{id}: one try and 2 retries");
        // Lower bounds only: the spec forbids retrying before the backoff.
        assert!(t[1] - t[0] >= Duration::from_millis(200), "{id}: {t:?}");
        assert!(t[2] - t[1] >= Duration::from_millis(400), "{id}: doubled");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_retried_on_the_next_endpoint() {
    let flaky = FlakyBackend::start().await;
    let dead = refused_port();
    let routes = r#"  rules:
  - matches: [{path: {type: PathPrefix, value: /retry}}]
    retry: {attempts: 1, backoff: 1ms}
    backendRefs: [{name: flaky, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /no-retry}}]
    backendRefs: [{name: flaky, port: 8080}]"#;
    let gw = Sluice::start(&[(
        "all.yaml",
        gateway() + &flaky.manifests(&[dead]) + &route("default", "retries", routes),
    )])
    .await;
    let mut c = gw.connect().await;
    // Endpoints are taken round robin: every other first try meets the
    // refusing endpoint, and its retry goes to the live one.
    for i in 0..10 {
        let r = c.get("h", &format!("/retry?id=r{i}")).await;
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert_eq!(flaky.tries(&format!("r{i}")).len(), 1);
    }
    let mut refused = 0;
    for i in 0..10 {
        if c.get("h", &format!("/no-retry?id=n{i}")).await.status == 502 {
            refused += 1;
        }
    }
    assert_eq!(
        refused, 5,
        "without retry every other request meets the dead endpoint"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_a_body_is_sent_once() {
    let flaky = FlakyBackend::start().await;
    let gw = Sluice::start(&[(
        "all.yaml",
        gateway() + &flaky.manifests(&[]) + &route("default", "retries", RETRY_ROUTE),
    )])
    .await;
    let mut c = gw.connect().await;
    let req = Request::post("/retry/code-500-attempts-3?id=body&fail=1&code=500")
        .header("host", "h")
        .body(Full::new(Bytes::from_static(b"payload")))
        .expect("request");
    let r = c.send(req).await;
    assert_eq!(r.status, 500, "the streamed body cannot be sent again");
    assert_eq!(flaky.tries("body").len(), 1);
}

const CORS_ROUTE: &str = r#"  rules:
  - matches: [{path: {type: PathPrefix, value: /cors-1}}]
    filters:
    - type: CORS
      cors:
        allowOrigins: ["https://www.foo.com", "https://*.bar.com"]
        allowMethods: [GET, OPTIONS]
        allowHeaders: [x-header-1, x-header-2]
        exposeHeaders: [x-header-3, x-header-4]
        allowCredentials: true
        maxAge: 3600
    backendRefs: [{name: app, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /cors-wildcard}}]
    filters:
    - type: CORS
      cors:
        allowOrigins: ["*"]
        allowMethods: ["*"]
        allowHeaders: ["*"]
    backendRefs: [{name: app, port: 8080}]"#;

fn header<'a>(r: &'a Resp, name: &str) -> Option<&'a str> {
    r.headers
        .get(name)
        .map(|v| v.to_str().expect("ascii header"))
}

async fn preflight(c: &mut Conn, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut req = Request::options(path).header("host", "h");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    c.send(req.body(Full::new(Bytes::new())).expect("request"))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_are_answered_by_the_gateway() {
    let app = Pods::start("default", "app", 1).await;
    let gw = Sluice::start(&[(
        "all.yaml",
        gateway() + &app.manifests() + &route("default", "cors", CORS_ROUTE),
    )])
    .await;
    let parent =
        &gw.object_status("HTTPRoute", Some("default"), "cors").await["status"]["parents"][0];
    assert_eq!(parent["conditions"][0]["status"], "True", "{parent:#}");
    let mut c = gw.connect().await;

    let r = preflight(
        &mut c,
        "/cors-1",
        &[
            ("origin", "https://xpto.www.bar.com"),
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "x-header-1, x-header-2"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        Some("https://xpto.www.bar.com")
    );
    assert_eq!(
        header(&r, "access-control-allow-methods"),
        Some("GET, OPTIONS")
    );
    assert_eq!(
        header(&r, "access-control-allow-headers"),
        Some("x-header-1, x-header-2")
    );
    assert_eq!(
        header(&r, "access-control-expose-headers"),
        Some("x-header-3, x-header-4")
    );
    assert_eq!(header(&r, "access-control-max-age"), Some("3600"));
    assert_eq!(header(&r, "access-control-allow-credentials"), Some("true"));

    let r = preflight(
        &mut c,
        "/cors-1",
        &[
            ("origin", "https://foobar.com"),
            ("access-control-request-method", "GET"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    assert_eq!(header(&r, "access-control-allow-credentials"), None);

    let r = preflight(
        &mut c,
        "/cors-wildcard",
        &[
            ("origin", "https://foobar.com:12345"),
            ("access-control-request-method", "PUT"),
        ],
    )
    .await;
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        Some("https://foobar.com:12345")
    );
    assert_eq!(header(&r, "access-control-allow-methods"), Some("PUT"));
    assert_eq!(header(&r, "access-control-allow-credentials"), None);
    assert_eq!(header(&r, "access-control-max-age"), Some("5"));

    assert_eq!(app.requests(), 0, "no preflight reached the backend");

    // OPTIONS without Access-Control-Request-Method is not a preflight.
    let r = preflight(&mut c, "/cors-1", &[("origin", "https://www.foo.com")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.echo().method, "OPTIONS");
    assert_eq!(app.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actual_requests_get_cors_headers_for_allowed_origins_only() {
    let app = Pods::start("default", "app", 1).await;
    let gw = Sluice::start(&[(
        "all.yaml",
        gateway() + &app.manifests() + &route("default", "cors", CORS_ROUTE),
    )])
    .await;
    let mut c = gw.connect().await;

    let r = c
        .get_with("h", "/cors-1", &[("origin", "https://www.foo.com")])
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.echo().path, "/cors-1", "forwarded to the backend");
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        Some("https://www.foo.com")
    );
    assert_eq!(header(&r, "access-control-allow-credentials"), Some("true"));
    assert_eq!(
        header(&r, "access-control-expose-headers"),
        Some("x-header-3, x-header-4")
    );
    assert_eq!(
        header(&r, "access-control-allow-methods"),
        None,
        "preflight only"
    );

    let r = c
        .get_with("h", "/cors-1", &[("origin", "https://foobar.com")])
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    assert_eq!(header(&r, "access-control-allow-credentials"), None);

    // `*` without credentials still echoes the origin, never credentials.
    let r = c
        .get_with(
            "h",
            "/cors-wildcard",
            &[
                ("origin", "https://other.foo.com"),
                ("authorization", "Bearer test"),
            ],
        )
        .await;
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        Some("https://other.foo.com")
    );
    assert_eq!(header(&r, "access-control-allow-credentials"), None);

    let r = c.get("h", "/cors-1").await;
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        None,
        "no Origin, no CORS"
    );
    assert_eq!(app.requests(), 4);
}
