//! The proxy's data path through real sockets: route tables built by hand,
//! test backends started here on `127.0.0.1:0`, requests sent with hyper.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};

use sluice::metrics::Metrics;
use sluice::proxy::{Proxy, ProxyLimits};
use sluice::route::{
    AppProtocol, Backend, BackendSplit, BackendTarget, EndpointSet, Filter, HeaderModifier,
    HostPattern, Mirror, PathMatch, PathModifier, Redirect, RequestMatch, RouteKind, RouteOrder,
    RouteTable, RouteTableBuilder, Rule, RuleId, Timeouts, UrlRewrite,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type TestBody = BoxBody<Bytes, BoxError>;

/// Upper bound for anything a test waits on; reaching it is a failure.
const DEADLINE: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Poll `check` until it holds, failing the test at the deadline.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    within(what, async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// A loopback address with a port nothing listens on right now.
fn free_addr() -> SocketAddr {
    let port = sluice::ports::free_loopback_port().expect("a free loopback port");
    SocketAddr::from(([127, 0, 0, 1], port))
}

// ---------------------------------------------------------------- backends

/// What a test backend does with a request.
#[derive(Clone)]
enum Mode {
    /// Answer 200 and stream the request body back as the response body.
    Echo,
    /// Read the whole body, record it, answer 200.
    Record,
    /// Record the request and never answer.
    Hang,
    /// Answer 200 once the notify fires.
    Gate(Arc<Notify>),
    /// Answer with a body of two chunks; the second once the notify fires.
    Stream(Arc<Notify>),
}

#[derive(Clone, Debug)]
struct Seen {
    method: Method,
    /// Path and query as the backend received them.
    target: String,
    headers: HeaderMap,
    version: Version,
    body: Bytes,
}

#[derive(Clone)]
struct TestBackend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicUsize>,
}

impl TestBackend {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
    fn last(&self) -> Seen {
        self.seen().pop().expect("backend saw a request")
    }
}

async fn backend(name: &'static str, mode: Mode) -> TestBackend {
    start_backend(name, mode, false).await
}

async fn start_backend(name: &'static str, mode: Mode, h2: bool) -> TestBackend {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = TestBackend {
        addr: listener.local_addr().unwrap(),
        seen: Arc::default(),
        connections: Arc::default(),
    };
    let state = b.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            state.connections.fetch_add(1, Ordering::SeqCst);
            let state = state.clone();
            let mode = mode.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| serve(name, mode.clone(), state.clone(), req));
                let io = TokioIo::new(stream);
                if h2 {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                }
            });
        }
    });
    b
}

async fn serve(
    name: &'static str,
    mode: Mode,
    state: TestBackend,
    req: Request<Incoming>,
) -> Result<Response<TestBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let mut seen = Seen {
        method: parts.method.clone(),
        target: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts.headers.clone(),
        version: parts.version,
        body: Bytes::new(),
    };
    let mut resp_body: TestBody = empty();
    match &mode {
        Mode::Echo => resp_body = body.map_err(Into::into).boxed(),
        Mode::Record => seen.body = body.collect().await.unwrap().to_bytes(),
        Mode::Hang => {
            state.seen.lock().unwrap().push(seen);
            std::future::pending::<()>().await;
            unreachable!()
        }
        Mode::Gate(n) => {
            // Recorded on arrival, so a test can see the request in flight.
            state.seen.lock().unwrap().push(seen.clone());
            n.notified().await;
            return Ok(Response::new(empty()));
        }
        Mode::Stream(n) => {
            let n = n.clone();
            let chunks = futures_util::stream::unfold(0, move |i| {
                let n = n.clone();
                async move {
                    match i {
                        0 => Some((Ok(Frame::data(Bytes::from("first;"))), 1)),
                        1 => {
                            n.notified().await;
                            Some((Ok(Frame::data(Bytes::from("second"))), 2))
                        }
                        _ => None,
                    }
                }
            });
            resp_body = BodyExt::boxed(StreamBody::new(chunks));
        }
    }
    let target = seen.target.clone();
    let host = seen
        .headers
        .get("host")
        .cloned()
        .unwrap_or(HeaderValue::from_static(""));
    state.seen.lock().unwrap().push(seen);
    let mut resp = Response::new(resp_body);
    let h = resp.headers_mut();
    h.insert("x-backend", HeaderValue::from_static(name));
    h.insert("x-seen-target", HeaderValue::from_str(&target).unwrap());
    h.insert("x-seen-host", host);
    if target.starts_with("/hop") {
        h.insert("connection", HeaderValue::from_static("x-resp-hop"));
        h.insert("x-resp-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("proxy-authenticate", HeaderValue::from_static("Basic"));
        h.insert("x-resp-end-to-end", HeaderValue::from_static("kept"));
    }
    Ok(resp)
}

fn empty() -> TestBody {
    Full::new(Bytes::new()).map_err(|e| match e {}).boxed()
}

fn full(b: impl Into<Bytes>) -> TestBody {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

// ---------------------------------------------------------------- client

/// One keep-alive HTTP/1.1 connection to the proxy.
struct Conn {
    send: SendRequest<TestBody>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Conn {
        let stream = within("connect", TcpStream::connect(addr)).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        Conn { send }
    }

    async fn send(&mut self, req: Request<TestBody>) -> Response<Incoming> {
        within("response", async {
            self.send.ready().await.expect("connection still open");
            self.send.send_request(req).await.expect("response")
        })
        .await
    }

    /// GET `path` with `Host: host`; status, headers, whole body.
    async fn get(&mut self, host: &str, path: &str) -> (StatusCode, HeaderMap, Bytes) {
        let req = Request::get(path)
            .header("host", host)
            .body(empty())
            .unwrap();
        read(self.send(req).await).await
    }
}

async fn read(resp: Response<Incoming>) -> (StatusCode, HeaderMap, Bytes) {
    let (parts, body) = resp.into_parts();
    let body = within("body", body.collect()).await.unwrap().to_bytes();
    (parts.status, parts.headers, body)
}

// ---------------------------------------------------------------- tables

fn endpoints(backends: &[&TestBackend]) -> BackendTarget {
    BackendTarget::Endpoints(EndpointSet::new(
        backends.iter().map(|b| b.addr).collect(),
        AppProtocol::Http1,
    ))
}

fn be(service: &str, weight: u32, target: BackendTarget) -> Backend {
    Backend {
        id: format!("test/{service}"),
        service: format!("test/{service}:80"),
        weight,
        target,
        filters: Vec::new(),
    }
}

struct RuleSpec {
    route: &'static str,
    matches: Vec<RequestMatch>,
    filters: Vec<Filter>,
    backends: Vec<Backend>,
    timeouts: Timeouts,
}

fn rule(route: &'static str, path: PathMatch, backends: Vec<Backend>) -> RuleSpec {
    RuleSpec {
        route,
        matches: vec![RequestMatch {
            path,
            ..RequestMatch::default()
        }],
        filters: Vec::new(),
        backends,
        timeouts: Timeouts::default(),
    }
}

fn table(bind: SocketAddr, rules: Vec<RuleSpec>) -> RouteTable {
    tables(&[bind], rules)
}

/// One listener (any hostname) per bind, every rule on every listener.
fn tables(binds: &[SocketAddr], rules: Vec<RuleSpec>) -> RouteTable {
    let mut b = RouteTableBuilder::new();
    let listeners: Vec<_> = binds
        .iter()
        .map(|bind| b.add_listener(*bind, format!("listener/{bind}"), HostPattern::Any))
        .collect();
    for spec in rules {
        let order = Arc::new(RouteOrder {
            created: 0,
            namespace: "test".into(),
            name: spec.route.into(),
        });
        let rule = Arc::new(Rule {
            id: RuleId {
                kind: RouteKind::Http,
                namespace: "test".into(),
                route: spec.route.into(),
                index: 0,
                name: None,
            },
            filters: spec.filters,
            backends: BackendSplit::new(spec.backends),
            timeouts: spec.timeouts,
            retry: None,
            session: None,
        });
        for l in &listeners {
            b.add_rule(
                *l,
                &[HostPattern::Any],
                &order,
                rule.clone(),
                spec.matches.clone(),
            );
        }
    }
    b.build()
}

async fn start_proxy(table: RouteTable) -> (Proxy, Arc<Metrics>) {
    let metrics = Metrics::shared();
    let proxy = Proxy::new(metrics.clone());
    let failures = proxy.apply(table).await;
    assert!(failures.is_empty(), "{failures:?}");
    (proxy, metrics)
}

fn header(h: &HeaderMap, name: &str) -> String {
    h.get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect::<Vec<_>>()
        .join(",")
}

fn hm(
    set: &[(&'static str, &'static str)],
    add: &[(&'static str, &'static str)],
    remove: &[&'static str],
) -> HeaderModifier {
    let pairs = |v: &[(&'static str, &'static str)]| {
        v.iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    };
    HeaderModifier {
        set: pairs(set),
        add: pairs(add),
        remove: remove.iter().map(|k| HeaderName::from_static(k)).collect(),
    }
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn forwards_on_keep_alive_and_streams_bodies_both_ways() {
    let echo = backend("echo", Mode::Echo).await;
    let release = Arc::new(Notify::new());
    let streamer = backend("streamer", Mode::Stream(release.clone())).await;
    let bind = free_addr();
    let (_proxy, _) = start_proxy(table(
        bind,
        vec![
            rule(
                "echo",
                PathMatch::prefix("/echo"),
                vec![be("echo", 1, endpoints(&[&echo]))],
            ),
            rule(
                "stream",
                PathMatch::prefix("/stream"),
                vec![be("streamer", 1, endpoints(&[&streamer]))],
            ),
        ],
    ))
    .await;
    let mut conn = Conn::open(bind).await;

    // Request body streamed: the backend echoes the first chunk back before
    // the client has sent the second.
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, BoxError>(Frame::data(b)), rx))
    });
    let req = Request::post("/echo/up?x=1")
        .header("host", "Echo.Example:8080")
        .body(BodyExt::boxed(StreamBody::new(chunks)))
        .unwrap();
    tx.send(Bytes::from("one;")).await.unwrap();
    let resp = conn.send(req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-seen-target"], "/echo/up?x=1");
    assert_eq!(resp.headers()["x-seen-host"], "Echo.Example:8080");
    let mut body = resp.into_body();
    let first = within("first echoed chunk", body.frame())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "one;");
    tx.send(Bytes::from("two")).await.unwrap();
    drop(tx);
    let rest = within("rest", body.collect()).await.unwrap().to_bytes();
    assert_eq!(rest, "two");

    // Response body streamed: the first chunk arrives before the backend
    // has produced the second.
    let req = Request::get("/stream")
        .header("host", "x")
        .body(empty())
        .unwrap();
    let resp = conn.send(req).await;
    let mut body = resp.into_body();
    let first = within("first streamed chunk", body.frame())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first;");
    release.notify_one();
    let rest = within("rest", body.collect()).await.unwrap().to_bytes();
    assert_eq!(rest, "second");

    // A large body round trip on the same connection.
    let big: Vec<u8> = (0..4 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let req = Request::post("/echo/big")
        .header("host", "x")
        .body(full(big.clone()))
        .unwrap();
    let (status, _, body) = read(conn.send(req).await).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.len(), big.len());
    assert!(body == big, "echoed body differs");
    assert_eq!(echo.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keep_alive_client_is_spread_exactly_over_backends_and_endpoints() {
    let a1 = backend("a1", Mode::Echo).await;
    let a2 = backend("a2", Mode::Echo).await;
    let b = backend("b", Mode::Echo).await;
    let bind = free_addr();
    let (_proxy, metrics) = start_proxy(table(
        bind,
        vec![rule(
            "split",
            PathMatch::prefix("/"),
            vec![
                be("a", 3, endpoints(&[&a1, &a2])),
                be("b", 1, endpoints(&[&b])),
            ],
        )],
    ))
    .await;
    let mut conn = Conn::open(bind).await;
    let mut got: HashMap<String, usize> = HashMap::new();
    for _ in 0..400 {
        let (status, headers, _) = conn.get("shop.example", "/").await;
        assert_eq!(status, StatusCode::OK);
        *got.entry(header(&headers, "x-backend")).or_default() += 1;
    }
    assert_eq!(got["a1"], 150, "{got:?}");
    assert_eq!(got["a2"], 150, "{got:?}");
    assert_eq!(got["b"], 100, "{got:?}");
    // Connections to the endpoints are pooled, not one per request.
    for b in [&a1, &a2, &b] {
        assert!(b.connections.load(Ordering::SeqCst) < 20);
    }
    let text = metrics.encode();
    assert!(
        text.contains(r#"sluice_requests_total{route="test/split",rule="0",backend="test/a:80",backend_namespace="test",backend_name="a",backend_port="80",code="200"} 300"#),
        "{text}"
    );
    assert!(
        text.contains(r#"sluice_requests_total{route="test/split",rule="0",backend="test/b:80",backend_namespace="test",backend_name="b",backend_port="80",code="200"} 100"#),
        "{text}"
    );
}

#[tokio::test]
async fn error_statuses_follow_the_spec() {
    let ok = backend("ok", Mode::Echo).await;
    let refused = free_addr();
    let bind = free_addr();
    let mut hosted = rule(
        "hosted",
        PathMatch::Exact("/ok".into()),
        vec![be("ok", 1, endpoints(&[&ok]))],
    );
    hosted.matches[0].method = Some(Method::GET);
    let (_proxy, metrics) = start_proxy(table(
        bind,
        vec![
            hosted,
            rule(
                "unresolved",
                PathMatch::prefix("/unresolved"),
                vec![be(
                    "missing",
                    1,
                    BackendTarget::Unresolved {
                        reason: "BackendNotFound".into(),
                    },
                )],
            ),
            rule(
                "zero",
                PathMatch::prefix("/zero"),
                vec![
                    be("ok", 0, endpoints(&[&ok])),
                    be("ok2", 0, endpoints(&[&ok])),
                ],
            ),
            rule("none", PathMatch::prefix("/none"), vec![]),
            rule(
                "empty",
                PathMatch::prefix("/empty"),
                vec![be("empty", 1, BackendTarget::NoReadyEndpoints)],
            ),
            rule(
                "refused",
                PathMatch::prefix("/refused"),
                vec![be(
                    "refused",
                    1,
                    BackendTarget::Endpoints(EndpointSet::new(vec![refused], AppProtocol::Http1)),
                )],
            ),
        ],
    ))
    .await;
    let mut conn = Conn::open(bind).await;
    for (path, code) in [
        ("/ok", 200),
        ("/unresolved/x", 500),
        ("/zero", 500),
        ("/none", 500),
        ("/empty", 503),
        ("/refused", 502),
        ("/nothing-here", 404),
        ("/ok/", 404),
    ] {
        let (status, headers, body) = conn.get("any.example", path).await;
        assert_eq!(status.as_u16(), code, "{path}");
        if code != 200 {
            assert_eq!(
                header(&headers, "content-type"),
                "text/plain; charset=utf-8"
            );
            assert!(!body.is_empty(), "{path}: error responses have a text body");
        }
    }
    // Method is part of the match: POST /ok has no route.
    let req = Request::post("/ok")
        .header("host", "x")
        .body(empty())
        .unwrap();
    assert_eq!(conn.send(req).await.status(), StatusCode::NOT_FOUND);
    let text = metrics.encode();
    for line in [
        r#"sluice_requests_total{route="test/empty",rule="0",backend="test/empty:80",backend_namespace="test",backend_name="empty",backend_port="80",code="503"} 1"#,
        r#"sluice_requests_total{route="test/unresolved",rule="0",backend="test/missing:80",backend_namespace="test",backend_name="missing",backend_port="80",code="500"} 1"#,
        r#"sluice_requests_total{route="test/zero",rule="0",backend="",backend_namespace="",backend_name="",backend_port="",code="500"} 1"#,
        r#"sluice_requests_total{route="",rule="",backend="",backend_namespace="",backend_name="",backend_port="",code="404"} 3"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

#[tokio::test]
async fn request_redirect_builds_location_from_the_request() {
    let bind = free_addr();
    let redirect = |scheme: Option<&str>, hostname: Option<&str>, port, path, status| {
        Filter::RequestRedirect(Redirect {
            scheme: scheme.map(Into::into),
            hostname: hostname.map(Into::into),
            path,
            port,
            status,
        })
    };
    let mut rules = Vec::new();
    for (route, prefix, filter) in [
        (
            "scheme",
            "/scheme",
            redirect(
                Some("https"),
                None,
                None,
                None,
                StatusCode::MOVED_PERMANENTLY,
            ),
        ),
        (
            "host-port",
            "/host-port",
            redirect(
                None,
                Some("other.example"),
                Some(8080),
                None,
                StatusCode::FOUND,
            ),
        ),
        (
            "listener-port",
            "/listener-port",
            redirect(None, None, None, None, StatusCode::FOUND),
        ),
        (
            "http-80",
            "/http-80",
            redirect(Some("http"), None, Some(80), None, StatusCode::SEE_OTHER),
        ),
        (
            "prefix",
            "/old",
            redirect(
                None,
                None,
                None,
                Some(PathModifier::ReplacePrefixMatch("/new".into())),
                StatusCode::TEMPORARY_REDIRECT,
            ),
        ),
        (
            "full",
            "/full",
            redirect(
                None,
                None,
                None,
                Some(PathModifier::ReplaceFullPath("/replaced".into())),
                StatusCode::PERMANENT_REDIRECT,
            ),
        ),
    ] {
        let mut r = rule(route, PathMatch::prefix(prefix), vec![]);
        r.filters = vec![
            filter,
            Filter::ResponseHeaderModifier(hm(&[("x-redirected", "yes")], &[], &[])),
        ];
        rules.push(r);
    }
    let (_proxy, _) = start_proxy(table(bind, rules)).await;
    let mut conn = Conn::open(bind).await;
    let port = bind.port();
    for (path, code, location) in [
        (
            "/scheme/a?q=1",
            301,
            "https://shop.example/scheme/a?q=1".to_string(),
        ),
        (
            "/host-port",
            302,
            "http://other.example:8080/host-port".to_string(),
        ),
        (
            "/listener-port/x",
            302,
            format!("http://shop.example:{port}/listener-port/x"),
        ),
        ("/http-80", 303, "http://shop.example/http-80".to_string()),
        (
            "/old/x/y?z=2",
            307,
            format!("http://shop.example:{port}/new/x/y?z=2"),
        ),
        ("/old", 307, format!("http://shop.example:{port}/new")),
        (
            "/full/x",
            308,
            format!("http://shop.example:{port}/replaced"),
        ),
    ] {
        let (status, headers, _) = conn.get(&format!("Shop.Example:{port}"), path).await;
        assert_eq!(status.as_u16(), code, "{path}");
        assert_eq!(header(&headers, "location"), location, "{path}");
        assert_eq!(header(&headers, "x-redirected"), "yes", "{path}");
    }
}

#[tokio::test]
async fn header_modifiers_apply_to_requests_and_responses_rule_then_backend() {
    let echo = backend("echo", Mode::Echo).await;
    let bind = free_addr();
    let mut target = be("echo", 1, endpoints(&[&echo]));
    target.filters = vec![
        Filter::RequestHeaderModifier(hm(&[("x-backend-level", "b")], &[], &[])),
        Filter::ResponseHeaderModifier(hm(&[("x-resp-order", "backend")], &[], &[])),
    ];
    let mut r = rule("headers", PathMatch::prefix("/"), vec![target]);
    r.filters = vec![
        Filter::RequestHeaderModifier(hm(
            &[("x-set", "set-overwrites"), ("x-backend-level", "rule")],
            &[("x-add", "added")],
            &["x-remove"],
        )),
        Filter::ResponseHeaderModifier(hm(
            &[("x-resp-set", "set"), ("x-resp-order", "rule")],
            &[("x-resp-add", "added")],
            &[("x-seen-host")],
        )),
    ];
    let (_proxy, _) = start_proxy(table(bind, vec![r])).await;
    let mut conn = Conn::open(bind).await;
    let req = Request::get("/h")
        .header("host", "x")
        .header("X-Set", "original")
        .header("X-Add", "first")
        .header("X-REMOVE", "gone")
        .body(empty())
        .unwrap();
    let (status, headers, _) = read(conn.send(req).await).await;
    assert_eq!(status, StatusCode::OK);
    let seen = echo.last();
    assert_eq!(header(&seen.headers, "x-set"), "set-overwrites");
    assert_eq!(header(&seen.headers, "x-add"), "first,added");
    assert!(!seen.headers.contains_key("x-remove"));
    assert_eq!(header(&seen.headers, "x-backend-level"), "b");
    assert_eq!(header(&headers, "x-resp-set"), "set");
    assert_eq!(header(&headers, "x-resp-add"), "added");
    assert_eq!(header(&headers, "x-resp-order"), "backend");
    assert!(!headers.contains_key("x-seen-host"));
}

#[tokio::test]
async fn url_rewrite_changes_host_and_path() {
    let echo = backend("echo", Mode::Echo).await;
    let bind = free_addr();
    let rewrite = |hostname: Option<&str>, path: Option<PathModifier>| {
        Filter::UrlRewrite(UrlRewrite {
            hostname: hostname.map(Into::into),
            path,
        })
    };
    let mut rules = Vec::new();
    for (route, prefix, filter) in [
        ("host", "/host", rewrite(Some("rewritten.example"), None)),
        (
            "to-bar",
            "/foo",
            rewrite(None, Some(PathModifier::ReplacePrefixMatch("/bar".into()))),
        ),
        (
            "to-root",
            "/strip",
            rewrite(None, Some(PathModifier::ReplacePrefixMatch("/".into()))),
        ),
        (
            "full",
            "/full",
            rewrite(
                Some("full.example"),
                Some(PathModifier::ReplaceFullPath("/one".into())),
            ),
        ),
    ] {
        let mut r = rule(
            route,
            PathMatch::prefix(prefix),
            vec![be("echo", 1, endpoints(&[&echo]))],
        );
        r.filters = vec![filter];
        rules.push(r);
    }
    let (_proxy, _) = start_proxy(table(bind, rules)).await;
    let mut conn = Conn::open(bind).await;
    for (path, target, host) in [
        ("/host/a?q=1", "/host/a?q=1", "rewritten.example"),
        ("/foo/x?q=1", "/bar/x?q=1", "orig.example"),
        ("/foo", "/bar", "orig.example"),
        ("/strip/x", "/x", "orig.example"),
        ("/strip", "/", "orig.example"),
        ("/full/one/two?k=v", "/one?k=v", "full.example"),
    ] {
        let (status, headers, _) = conn.get("orig.example", path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(header(&headers, "x-seen-target"), target, "{path}");
        assert_eq!(header(&headers, "x-seen-host"), host, "{path}");
    }
}

#[tokio::test]
async fn mirrors_get_a_copy_and_never_delay_the_client() {
    let main = backend("main", Mode::Echo).await;
    let mirror = backend("mirror", Mode::Record).await;
    let hanging = backend("hanging", Mode::Hang).await;
    let never = backend("never", Mode::Record).await;
    let bind = free_addr();
    let mirror_to = |b: &TestBackend, name: &str, numerator| {
        Filter::RequestMirror(Mirror::new(
            Arc::new(be(name, 1, endpoints(&[b]))),
            numerator,
            100,
        ))
    };
    let mut r = rule(
        "mirrored",
        PathMatch::prefix("/"),
        vec![be("main", 1, endpoints(&[&main]))],
    );
    r.filters = vec![
        Filter::RequestHeaderModifier(hm(&[("x-before-mirror", "1")], &[], &[])),
        mirror_to(&hanging, "hanging", 100),
        mirror_to(&mirror, "mirror", 100),
        mirror_to(&never, "never", 0),
    ];
    // A large body mirrored to a backend that never reads it: the mirror
    // falls behind and is cut off; the client gets its whole answer.
    let mut big = rule(
        "mirrored-big",
        PathMatch::prefix("/big"),
        vec![be("main", 1, endpoints(&[&main]))],
    );
    big.filters = vec![mirror_to(&hanging, "hanging", 100)];
    let (_proxy, metrics) = start_proxy(table(bind, vec![r, big])).await;
    let mut conn = Conn::open(bind).await;
    let payload: Vec<u8> = (0..8 * 1024 * 1024).map(|i| (i % 241) as u8).collect();
    let req = Request::post("/big")
        .header("host", "mirror.example")
        .body(full(payload.clone()))
        .unwrap();
    let (status, _, body) = read(conn.send(req).await).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body == payload, "echoed body differs");
    eventually("big copy reached the hanging mirror", || {
        hanging.count() == 1
    })
    .await;
    const N: usize = 5;
    for i in 0..N {
        let req = Request::post(format!("/m/{i}?q=1"))
            .header("host", "mirror.example")
            .body(full(format!("payload-{i}")))
            .unwrap();
        // The hanging mirror never answers; the client is served anyway.
        let (status, headers, body) = read(conn.send(req).await).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, "x-backend"), "main");
        assert_eq!(body, format!("payload-{i}"));
    }
    eventually("mirror copies", || mirror.count() == N).await;
    eventually("hanging mirror copies", || hanging.count() == N + 1).await;
    let mut copies = mirror.seen();
    copies.sort_by(|a, b| a.target.cmp(&b.target));
    for (i, copy) in copies.iter().enumerate() {
        assert_eq!(copy.method, Method::POST);
        assert_eq!(copy.target, format!("/m/{i}?q=1"));
        assert_eq!(copy.body, format!("payload-{i}"));
        assert_eq!(header(&copy.headers, "host"), "mirror.example");
        assert_eq!(header(&copy.headers, "x-before-mirror"), "1");
    }
    // The completed mirrors are counted; the 0% mirror never got one.
    eventually("mirror metric", || {
        metrics
            .encode()
            .contains(&format!("sluice_mirror_requests_total {N}"))
    })
    .await;
    assert_eq!(never.count(), 0);
}

#[tokio::test]
async fn hop_by_hop_headers_are_removed_both_ways_and_forwarded_headers_appended() {
    let echo = backend("echo", Mode::Echo).await;
    let bind = free_addr();
    let (_proxy, _) = start_proxy(table(
        bind,
        vec![rule(
            "hop",
            PathMatch::prefix("/"),
            vec![be("echo", 1, endpoints(&[&echo]))],
        )],
    ))
    .await;
    let mut conn = Conn::open(bind).await;
    let req = Request::get("/hop")
        .header("host", "hop.example")
        .header("connection", "x-hop")
        .header("x-hop", "1")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "secret")
        .header("proxy-connection", "keep-alive")
        .header("te", "trailers")
        .header("x-end-to-end", "kept")
        .header("x-forwarded-for", "203.0.113.7")
        .body(empty())
        .unwrap();
    let (status, headers, _) = read(conn.send(req).await).await;
    assert_eq!(status, StatusCode::OK);
    let seen = echo.last();
    for name in [
        "x-hop",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
    ] {
        assert!(
            !seen.headers.contains_key(name),
            "{name} reached the backend"
        );
    }
    // hyper writes its own `connection` only to close; ours never passes.
    assert_ne!(header(&seen.headers, "connection"), "x-hop");
    assert_eq!(header(&seen.headers, "x-end-to-end"), "kept");
    assert_eq!(
        header(&seen.headers, "x-forwarded-for"),
        "203.0.113.7, 127.0.0.1"
    );
    assert_eq!(header(&seen.headers, "x-forwarded-proto"), "http");
    assert_eq!(header(&seen.headers, "host"), "hop.example");
    for name in ["x-resp-hop", "keep-alive", "proxy-authenticate"] {
        assert!(!headers.contains_key(name), "{name} reached the client");
    }
    assert_ne!(header(&headers, "connection"), "x-resp-hop");
    assert_eq!(header(&headers, "x-resp-end-to-end"), "kept");
    // The connection is still usable afterwards.
    let (status, _, _) = conn.get("hop.example", "/again").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapping_tables_under_keep_alive_load_fails_no_request() {
    let blue = backend("blue", Mode::Echo).await;
    let green = backend("green", Mode::Echo).await;
    let bind = free_addr();
    let split = |w_blue, w_green| {
        table(
            bind,
            vec![rule(
                "bluegreen",
                PathMatch::prefix("/"),
                vec![
                    be("blue", w_blue, endpoints(&[&blue])),
                    be("green", w_green, endpoints(&[&green])),
                ],
            )],
        )
    };
    let (proxy, _) = start_proxy(split(1, 0)).await;
    let binds_before = proxy.active_binds();
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicUsize::new(0));
    let client = {
        let done = done.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut conn = Conn::open(bind).await;
            let mut failures = Vec::new();
            while stop.load(Ordering::SeqCst) == 0 {
                let req = Request::post("/load")
                    .header("host", "bg.example")
                    .body(full("body"))
                    .unwrap();
                let (status, _, body) = read(conn.send(req).await).await;
                if status != StatusCode::OK || body != "body" {
                    failures.push((status, body));
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            failures
        })
    };
    for i in 1..=20u32 {
        // Let the client make progress between swaps.
        let target = done.load(Ordering::SeqCst) + 10;
        eventually("client progress", || done.load(Ordering::SeqCst) >= target).await;
        let failures = if i % 2 == 0 {
            proxy.apply(split(1, 0)).await
        } else {
            proxy.apply(split(0, 1)).await
        };
        assert!(failures.is_empty());
    }
    let target = done.load(Ordering::SeqCst) + 10;
    eventually("client progress", || done.load(Ordering::SeqCst) >= target).await;
    stop.store(1, Ordering::SeqCst);
    let failures = within("client", client).await.unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    assert!(blue.count() > 0 && green.count() > 0);
    assert_eq!(blue.count() + green.count(), done.load(Ordering::SeqCst));
    assert_eq!(
        proxy.active_binds(),
        binds_before,
        "same binds never rebind"
    );
}

#[tokio::test]
async fn timeouts_answer_504() {
    let hang = backend("hang", Mode::Hang).await;
    let bind = free_addr();
    let mut backend_timeout = rule(
        "backend-timeout",
        PathMatch::prefix("/backend"),
        vec![be("hang", 1, endpoints(&[&hang]))],
    );
    backend_timeout.timeouts.backend_request = Some(Duration::from_millis(50));
    let mut request_timeout = rule(
        "request-timeout",
        PathMatch::prefix("/request"),
        vec![be("hang", 1, endpoints(&[&hang]))],
    );
    request_timeout.timeouts.request = Some(Duration::from_millis(50));
    let (_proxy, _) = start_proxy(table(bind, vec![backend_timeout, request_timeout])).await;
    let mut conn = Conn::open(bind).await;
    let (status, _, _) = conn.get("x", "/backend").await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    let (status, _, _) = conn.get("x", "/request").await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
}

#[tokio::test]
async fn a_removed_bind_stops_accepting_and_its_open_requests_finish() {
    let gate = Arc::new(Notify::new());
    let gated = backend("gated", Mode::Gate(gate.clone())).await;
    let keep = free_addr();
    let drop_me = free_addr();
    let rules = || {
        vec![rule(
            "gated",
            PathMatch::prefix("/"),
            vec![be("gated", 1, endpoints(&[&gated]))],
        )]
    };
    let (proxy, _) = start_proxy(tables(&[keep, drop_me], rules())).await;
    assert_eq!(proxy.active_binds(), {
        let mut v = vec![keep, drop_me];
        v.sort();
        v
    });
    // A request in flight on the socket about to be removed.
    let mut conn = Conn::open(drop_me).await;
    let req = Request::get("/slow")
        .header("host", "x")
        .body(empty())
        .unwrap();
    conn.send.ready().await.unwrap();
    let in_flight = tokio::spawn(conn.send.send_request(req));
    eventually("request reached the backend", || gated.count() == 1).await;

    let failures = proxy.apply(table(keep, rules())).await;
    assert!(failures.is_empty());
    assert_eq!(proxy.active_binds(), vec![keep]);
    eventually("removed socket refuses connections", || {
        std::net::TcpStream::connect(drop_me).is_err()
    })
    .await;
    gate.notify_one();
    let resp = within("in-flight request", in_flight)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // The kept socket still serves (its gate opens as soon as asked).
    let mut conn = Conn::open(keep).await;
    let req = Request::get("/").header("host", "x").body(empty()).unwrap();
    let pending = tokio::spawn(async move { conn.send(req).await.status() });
    eventually("second request reached the backend", || gated.count() == 2).await;
    gate.notify_one();
    assert_eq!(
        within("kept socket", pending).await.unwrap(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_taken_port_is_reported_and_the_other_binds_serve() {
    let echo = backend("echo", Mode::Echo).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    let free = free_addr();
    let rules = || {
        vec![rule(
            "echo",
            PathMatch::prefix("/"),
            vec![be("echo", 1, endpoints(&[&echo]))],
        )]
    };
    let proxy = Proxy::new(Metrics::shared());
    let failures = proxy.apply(tables(&[taken_addr, free], rules())).await;
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].bind, taken_addr);
    assert!(!failures[0].error.is_empty());
    assert_eq!(proxy.active_binds(), vec![free]);
    let (status, _, _) = Conn::open(free).await.get("x", "/").await;
    assert_eq!(status, StatusCode::OK);
    // Once the port is released, applying again binds it.
    drop(taken);
    let failures = proxy.apply(tables(&[taken_addr, free], rules())).await;
    assert!(failures.is_empty(), "{failures:?}");
    let (status, _, _) = Conn::open(taken_addr).await.get("x", "/").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn h2c_endpoints_get_http2_and_h2c_clients_are_served() {
    let h2 = start_backend("h2", Mode::Echo, true).await;
    let bind = free_addr();
    let (_proxy, _) = start_proxy(table(
        bind,
        vec![rule(
            "h2",
            PathMatch::prefix("/"),
            vec![be(
                "h2",
                1,
                BackendTarget::Endpoints(EndpointSet::new(vec![h2.addr], AppProtocol::H2c)),
            )],
        )],
    ))
    .await;
    // HTTP/1.1 client, HTTP/2 backend.
    let (status, _, _) = Conn::open(bind).await.get("h2.example", "/one").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h2.last().version, Version::HTTP_2);
    // HTTP/2 (prior knowledge) client.
    let stream = TcpStream::connect(bind).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, TestBody>(
        TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = Request::post("http://h2.example/two")
        .version(Version::HTTP_2)
        .body(full("over h2"))
        .unwrap();
    let (status, _, body) =
        read(within("h2 response", send.send_request(req)).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "over h2");
    assert_eq!(h2.last().target, "/two");
}

// ------------------------------------------------------- idle connections

/// One request on a raw HTTP/1.1 connection; the response's status line
/// and body (by Content-Length).
async fn raw_get(s: &mut TcpStream, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    within("write", s.write_all(req.as_bytes())).await.unwrap();
    let mut got = Vec::new();
    within("response", async {
        loop {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed before the response: {got:?}");
            got.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().unwrap())
                    })
                    .expect("a content-length");
                if body.len() >= length {
                    let status = head.lines().next().unwrap().to_string();
                    return (status, body.to_string());
                }
            }
        }
    })
    .await
}

/// Read until the proxy closes `s` (end of stream or a reset).
async fn closed_by_proxy(s: &mut TcpStream) {
    use tokio::io::AsyncReadExt;
    within("the proxy to close the connection", async {
        let mut rest = [0u8; 64];
        while let Ok(n) = s.read(&mut rest).await
            && n > 0
        {}
    })
    .await;
}

/// A proxy held to `limits`, every path of one listener sent to one
/// recording backend: the proxy, its address and the backend.
async fn one_backend_proxy(limits: ProxyLimits) -> (Proxy, SocketAddr, TestBackend) {
    let app = backend("app", Mode::Record).await;
    let bind = free_addr();
    let rules = vec![rule(
        "app",
        PathMatch::prefix("/"),
        vec![be("app", 1, endpoints(&[&app]))],
    )];
    let proxy = Proxy::with_limits(Metrics::shared(), limits);
    let failures = proxy.apply(table(bind, rules)).await;
    assert!(failures.is_empty(), "{failures:?}");
    (proxy, bind, app)
}

/// A keep-alive connection quiet for a second waits for its next request
/// without a task of its own (parked, issue 23 item 6): it is served again
/// when that request comes, parked again, and closed when its keep-alive
/// timeout runs out, counted from its last response, not from its parking
/// or waking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_parked_served_again_and_closed_at_its_keep_alive_deadline() {
    let (proxy, bind, app) = one_backend_proxy(ProxyLimits {
        keepalive_timeout: Duration::from_secs(3),
        ..ProxyLimits::default()
    })
    .await;
    let mut s = within("connect", TcpStream::connect(bind)).await.unwrap();
    let (status, _) = raw_get(&mut s, "/first").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    eventually("the idle connection parked", || {
        proxy.parked_connections() == 1
    })
    .await;
    assert_eq!(proxy.open_connections(), 1, "a parked connection is open");

    let (status, _) = raw_get(&mut s, "/second").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(app.count(), 2);
    assert_eq!(app.last().target, "/second");
    let answered = std::time::Instant::now();
    eventually("parked again", || proxy.parked_connections() == 1).await;

    closed_by_proxy(&mut s).await;
    let after = answered.elapsed();
    assert!(
        after >= Duration::from_millis(2500),
        "closed {after:?} after its last response, before its keep-alive timeout (3 s)"
    );
    eventually("the closed connection gone", || {
        proxy.parked_connections() == 0 && proxy.open_connections() == 0
    })
    .await;
}

/// Draining closes parked connections at once, as it does idle ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_closes_parked_connections_at_once() {
    let (proxy, bind, _app) = one_backend_proxy(ProxyLimits {
        keepalive_timeout: Duration::from_secs(3600),
        drain_timeout: Duration::from_secs(3600),
        ..ProxyLimits::default()
    })
    .await;
    let mut conns = Vec::new();
    for i in 0..3 {
        let mut s = within("connect", TcpStream::connect(bind)).await.unwrap();
        let (status, _) = raw_get(&mut s, &format!("/{i}")).await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        conns.push(s);
    }
    eventually("all three parked", || proxy.parked_connections() == 3).await;
    let open = within("drain", proxy.drain()).await;
    assert_eq!(open, 0, "parked connections left open after the drain");
    for s in &mut conns {
        closed_by_proxy(s).await;
    }
    assert_eq!(proxy.parked_connections(), 0);
}
