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
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::support::*;

/// A backend whose answer to `?id=ID&fail=N&code=C` is `C` for the first
/// N tries of that id and 200 afterwards (with `&slow=N&delay=MS`, the
/// first N tries answer after MS milliseconds). It records when each try
/// of each id arrived, with the request body it read whole.
struct FlakyBackend {
    addr: SocketAddr,
    tries: Tries,
}

type Tries = Arc<Mutex<HashMap<String, Vec<(Instant, Bytes)>>>>;

impl FlakyBackend {
    async fn start() -> FlakyBackend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("flaky backend binds");
        let addr = listener.local_addr().expect("local addr");
        let tries: Tries = Arc::default();
        let seen = tries.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let seen = seen.clone();
                        async move { Ok::<_, Infallible>(answer(&seen, req).await) }
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
        self.tries_with_bodies(id)
            .into_iter()
            .map(|t| t.0)
            .collect()
    }

    /// When each try of request `id` arrived, and the body it carried.
    fn tries_with_bodies(&self, id: &str) -> Vec<(Instant, Bytes)> {
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

async fn answer(seen: &Tries, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => Bytes::from_static(b"<the body broke>"),
    };
    let query = parts.uri.query().unwrap_or_default();
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
    let slow: usize = param("slow").parse().unwrap_or(0);
    let delay = Duration::from_millis(param("delay").parse().unwrap_or(0));
    let tries = {
        let mut seen = seen.lock().expect("tries lock");
        let t = seen.entry(id).or_default();
        t.push((Instant::now(), body));
        t.len()
    };
    if tries <= slow {
        tokio::time::sleep(delay).await;
    }
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
    // Outlier ejection off: it would take the dead endpoint out of the
    // rotation after its fifth refusal (tests/e2e/outliers.rs).
    let gw = Sluice::start_with(
        &[(
            "all.yaml",
            gateway() + &flaky.manifests(&[dead]) + &route("default", "retries", routes),
        )],
        &["--outlier-consecutive-failures", "0"],
    )
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

const BODY_ROUTE: &str = r#"  rules:
  - matches: [{path: {type: PathPrefix, value: /retry}}]
    retry: {codes: [500], attempts: 2, backoff: 1ms}
    backendRefs: [{name: flaky, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /slow}}]
    timeouts: {backendRequest: 300ms}
    retry: {attempts: 1, backoff: 1ms}
    backendRefs: [{name: flaky, port: 8080}]"#;

/// The gateway with `--retry-buffer-bytes 1024` in front of a flaky backend.
async fn body_gateway(flaky: &FlakyBackend) -> Sluice {
    Sluice::start_with(
        &[(
            "all.yaml",
            gateway() + &flaky.manifests(&[]) + &route("default", "retries", BODY_ROUTE),
        )],
        &["--retry-buffer-bytes", "1024"],
    )
    .await
}

fn post(method: &str, path: &str, body: &'static [u8]) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "h")
        .body(Full::new(Bytes::from_static(body)))
        .expect("request")
}

/// A chunked request written on a fresh connection, its body in `chunks`;
/// the answer's status line.
async fn chunked(gw: &Sluice, path: &str, chunks: &[Vec<u8>]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    let mut bytes = format!(
        "POST {path} HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for c in chunks {
        bytes.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        bytes.extend_from_slice(c);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"0\r\n\r\n");
    s.write_all(&bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let answer = String::from_utf8_lossy(&out).into_owned();
    answer.lines().next().unwrap_or_default().to_string()
}

/// A body that fits the replay buffer is sent again, whole, on every try,
/// whether it came with a Content-Length or chunked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_fits_the_buffer_is_sent_again_whole() {
    let flaky = FlakyBackend::start().await;
    let gw = body_gateway(&flaky).await;
    let mut c = gw.connect().await;
    let r = c
        .send(post("POST", "/retry?id=small&fail=2&code=500", b"payload"))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let tries = flaky.tries_with_bodies("small");
    assert_eq!(tries.len(), 3, "one try and two retries");
    assert!(tries.iter().all(|t| t.1 == "payload"), "{tries:?}");

    let chunks = vec![vec![b'a'; 300], vec![b'b'; 300], vec![b'c'; 300]];
    let status = chunked(&gw, "/retry?id=chunked&fail=1&code=500", &chunks).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let tries = flaky.tries_with_bodies("chunked");
    assert_eq!(tries.len(), 2);
    assert!(tries.iter().all(|t| t.1 == chunks.concat()), "{tries:?}");
}

/// A body larger than the buffer is streamed to the backend once: the
/// first try's answer is the answer, whatever the retry policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_over_the_buffer_is_streamed_once() {
    let flaky = FlakyBackend::start().await;
    let gw = body_gateway(&flaky).await;
    let mut c = gw.connect().await;
    static LARGE: [u8; 4096] = [b'x'; 4096];
    let r = c
        .send(post("POST", "/retry?id=large&fail=1&code=500", &LARGE))
        .await;
    assert_eq!(r.status, 500, "the first try's answer: {r:?}");
    let tries = flaky.tries_with_bodies("large");
    assert_eq!(tries.len(), 1);
    assert_eq!(tries[0].1.len(), 4096, "streamed whole");

    // Chunked: the gateway learns the size on the way, past the buffer.
    let chunks = vec![vec![b'a'; 600], vec![b'b'; 600], vec![b'c'; 600]];
    let status = chunked(&gw, "/retry?id=large-chunked&fail=1&code=500", &chunks).await;
    assert!(status.starts_with("HTTP/1.1 500"), "{status}");
    let tries = flaky.tries_with_bodies("large-chunked");
    assert_eq!(tries.len(), 1);
    assert_eq!(tries[0].1, chunks.concat());
}

/// A try that timed out after its body reached the backend may be acted on
/// there: a POST is not sent again, an idempotent PUT is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_body_is_sent_again_only_when_the_method_is_idempotent() {
    let flaky = FlakyBackend::start().await;
    let gw = body_gateway(&flaky).await;
    let mut c = gw.connect().await;
    let r = c
        .send(post("POST", "/slow?id=post&slow=1&delay=3000", b"order"))
        .await;
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(
        flaky.tries("post").len(),
        1,
        "a POST that may have acted is not retried"
    );

    let mut c = gw.connect().await;
    let r = c
        .send(post("PUT", "/slow?id=put&slow=1&delay=3000", b"state"))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let tries = flaky.tries_with_bodies("put");
    assert_eq!(tries.len(), 2);
    assert!(tries.iter().all(|t| t.1 == "state"), "{tries:?}");
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
