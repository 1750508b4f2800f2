//! Entry points of the fuzz targets (`fuzz/`), kept in the library so that
//! the seed corpora also run as ordinary tests (`tests/fuzz_corpus.rs`)
//! without the fuzzer. Each one must never panic, whatever the input.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::OnceLock;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use k8s_openapi::jiff::Timestamp;

use crate::proxy::ProxyLimits;
use crate::proxy::h1::{self, ChunkedWalker, Framing, HeadLimits, ResponseFraming};
use crate::resources::crd::{Crds, is_crd};
use crate::resources::{Generations, Snapshot, parse_manifests_with};
use crate::route::{Lookup, RouteTable, normalize_host};
use crate::translate::{TranslateOptions, translate_at};

const BIND: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Requests every table built from fuzzed manifests must answer without
/// panicking.
const PROBES: [(&str, &str, &str); 4] = [
    ("GET", "example.com", "/"),
    ("POST", "a.b.example.com:8080", "/api/v1/x?y=1"),
    ("GET", "", ""),
    ("DELETE", "*.example.com", "/%ff/../x"),
];

/// The upstream standard CRDs, when the checkout has them (see
/// [`crate::testdata`]: without them the status checks are left out, and
/// with `SLUICE_REQUIRE_ALL=1` that is a failure); read once.
fn upstream_crds() -> Option<&'static Crds> {
    static CRDS: OnceLock<Option<Crds>> = OnceLock::new();
    CRDS.get_or_init(|| {
        let crds = crate::testdata::gateway_api_dir("crds").and_then(|dir| {
            let dir = dir.join("standard");
            let (crds, _) = crate::source::files::read_crds(std::slice::from_ref(&dir));
            std::sync::Arc::into_inner(crds)
                .filter(|c| !c.is_empty())
                .ok_or_else(|| format!("no CRDs read from {}", dir.display()))
        });
        crate::testdata::or_skip(
            crds.map_err(|why| {
                format!("{why}; fuzz inputs are validated without the upstream CRDs")
            }),
        )
    })
    .as_ref()
}

/// The CRDs of the input itself, if it has any (the fuzzer writes CRDs
/// too), else the upstream ones.
fn crds_for(text: &str) -> Option<Crds> {
    let docs = crate::yaml::documents(text).ok()?;
    let mut crds = Crds::new();
    for doc in docs.iter().filter(|d| is_crd(&d.value)) {
        let _ = crds.add(&doc.value, "fuzz.yaml");
    }
    (!crds.is_empty()).then_some(crds)
}

fn snapshot_from(text: &str, crds: &Crds) -> Snapshot {
    let parsed = parse_manifests_with(text, "fuzz.yaml", crds);
    Snapshot::from_loaded(parsed.objects, |objects| {
        Generations::new().assign(objects, Timestamp::UNIX_EPOCH);
    })
}

/// Arbitrary bytes as a manifest file: load, validate (by the CRDs the
/// input holds, else by the upstream CRDs when the checkout has them, else
/// by hand), translate, then serve a few requests from the table and
/// serialize the status. Checks that translate never produces a table the
/// proxy cannot serve, and that with the upstream CRDs every status body
/// fits their status schema.
pub fn manifests_then_translate(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let own = crds_for(text);
    let upstream = if own.is_none() { upstream_crds() } else { None };
    let empty = Crds::new();
    let crds = own.as_ref().or(upstream).unwrap_or(&empty);
    let snapshot = snapshot_from(text, crds);
    let options = TranslateOptions { default_bind: BIND };
    let translation = translate_at(&snapshot, &options, Timestamp::UNIX_EPOCH);
    serde_json::to_string(&translation.status).expect("a status report always serializes");
    if let Some(crds) = upstream {
        for object in &translation.status.objects {
            let mut status = object.status.clone();
            let errors = crds
                .admit_status(&object.api_version, &object.kind, &mut status)
                .unwrap_or_default();
            assert!(
                errors.is_empty(),
                "{} {}: status refused by its CRD: {errors:?}",
                object.kind,
                object.metadata.name
            );
        }
    }
    let binds: Vec<SocketAddr> = translation.table.binds().collect();
    for bind in binds {
        for (method, host, path) in PROBES {
            let method = Method::from_bytes(method.as_bytes()).expect("probe methods are valid");
            serve_lookup(
                &translation.table,
                bind,
                &method,
                host,
                path,
                &HeaderMap::new(),
            );
        }
    }
}

/// Look a request up and choose its backend and endpoint, as the proxy does.
fn serve_lookup(
    table: &RouteTable,
    bind: SocketAddr,
    method: &Method,
    host: &str,
    target: &str,
    headers: &HeaderMap,
) {
    let host = normalize_host(host);
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    if let Lookup::Matched(m) = table.lookup(bind, &host, method, path, query, headers)
        && let crate::route::BackendChoice::Backend(b) = m.rule.backends.choose_for(headers)
        && let crate::route::BackendTarget::Endpoints(set) = &b.target
    {
        let _ = set.pick();
    }
}

/// A table with every kind of match and hostname, built once.
fn fixed_table() -> &'static (RouteTable, SocketAddr) {
    static TABLE: OnceLock<(RouteTable, SocketAddr)> = OnceLock::new();
    TABLE.get_or_init(|| {
        let snapshot = snapshot_from(MATCHING_MANIFESTS, &Crds::new());
        let options = TranslateOptions { default_bind: BIND };
        let t = translate_at(&snapshot, &options, Timestamp::UNIX_EPOCH);
        let bind = t
            .table
            .binds()
            .next()
            .expect("the fixed manifests bind one socket");
        (t.table, bind)
    })
}

/// Arbitrary bytes as a request against a fixed table: the first line is
/// the method, the second the Host, the third the path and query, the rest
/// `name: value` headers.
pub fn match_request(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let method = lines.next().unwrap_or_default();
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return;
    };
    let host = lines.next().unwrap_or_default();
    let target = lines.next().unwrap_or_default();
    let mut headers = HeaderMap::new();
    for line in lines {
        if let Some((name, value)) = line.split_once(':')
            && let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.trim().as_bytes()),
                HeaderValue::from_str(value.trim()),
            )
        {
            headers.append(name, value);
        }
    }
    let (table, bind) = fixed_table();
    serve_lookup(table, *bind, &method, host, target, &headers);
}

const MATCHING_MANIFESTS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sluice}
spec: {controllerName: sluice.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: sluice
  listeners:
  - {name: any, protocol: HTTP, port: 8080}
  - {name: wild, protocol: HTTP, port: 8080, hostname: "*.example.com"}
---
apiVersion: v1
kind: Service
metadata: {name: app}
spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: app-1, labels: {kubernetes.io/service-name: app}}
addressType: IPv4
ports: [{port: 9}]
endpoints: [{addresses: ["127.0.0.1", "127.0.0.2"]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: mixed}
spec:
  parentRefs: [{name: gw}]
  hostnames: ["foo.example.com", "*.a.example.com", "plain.org"]
  rules:
  - matches:
    - path: {type: Exact, value: /exact}
    - path: {type: PathPrefix, value: /api/v1}
      method: POST
    - path: {type: RegularExpression, value: "/re/[a-z]+/[0-9]{1,4}"}
      headers: [{type: RegularExpression, name: x-version, value: "v[0-9]+(-beta)?"}]
    - headers: [{name: x-canary, value: always}]
      queryParams: [{name: debug, value: "1"}, {type: RegularExpression, name: v, value: ".*"}]
    backendRefs: [{name: app, port: 80, weight: 995}, {name: missing, port: 80, weight: 5}]
  - backendRefs: [{name: app, port: 80}]
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_table_routes_a_plain_request() {
        let (table, bind) = fixed_table();
        let found = table.lookup(
            *bind,
            "foo.example.com",
            &Method::GET,
            "/exact",
            None,
            &HeaderMap::new(),
        );
        assert!(
            matches!(found, Lookup::Matched(m) if m.rule.id.route == "mixed" && m.rule.id.index == 0)
        );
    }
}

/// One request of a byte stream as a parser saw it, for
/// [`h1_framing`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A whole request: its method, target and decoded body length.
    Request {
        method: String,
        target: String,
        body: u64,
    },
    /// A request whose head was accepted and whose body failed (malformed
    /// or cut short by the end of the bytes).
    BodyFailed { method: String, target: String },
    /// The head was refused.
    Refused,
    /// No further request: the bytes ended, or ended within a head.
    End,
    /// The parser stops here (an upgrade or CONNECT hands the connection
    /// over): nothing after it is compared.
    HandedOver,
}

/// The limits both parsers get in [`h1_framing`]: the head limit is hyper's
/// buffer (whose boundary is not byte-exact), far above fuzz input sizes.
const FUZZ_HEAD_BYTES: usize = 64 * 1024;

fn fuzz_limits() -> ProxyLimits {
    ProxyLimits {
        max_request_header_bytes: FUZZ_HEAD_BYTES,
        max_uri_bytes: 8 * 1024,
        ..ProxyLimits::default()
    }
}

/// What sluice's own HTTP/1.1 parser ([`h1`]) makes of `data`.
pub fn h1_requests(data: &[u8]) -> Vec<Seen> {
    let limits = HeadLimits::from_limits(&fuzz_limits());
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let head = match h1::parse_request(&data[at..], &limits) {
            Err(_) => {
                out.push(Seen::Refused);
                return out;
            }
            Ok(None) => break,
            Ok(Some(head)) => head,
        };
        at += head.len;
        let rest = &data[at..];
        let body = match head.framing {
            Framing::None => Some((0, 0)),
            Framing::Length(n) => usize::try_from(n)
                .ok()
                .filter(|n| *n <= rest.len())
                .map(|n| (n, n as u64)),
            Framing::Chunked => {
                let mut walker = ChunkedWalker::default();
                match walker.walk(rest) {
                    Ok(n) if walker.is_done() => Some((n, walker.decoded)),
                    _ => None,
                }
            }
        };
        let (method, target) = (head.method.to_string(), head.uri.to_string());
        let Some((raw, decoded)) = body else {
            out.push(Seen::BodyFailed { method, target });
            return out;
        };
        at += raw;
        out.push(Seen::Request {
            method,
            target,
            body: decoded,
        });
        if head.upgrade || head.method == http::Method::CONNECT {
            out.push(Seen::HandedOver);
            return out;
        }
        if !head.keep_alive {
            break;
        }
    }
    out.push(Seen::End);
    out
}

/// What hyper's HTTP/1.1 server, configured as the proxy configured it
/// before the lean path, plus the checks the proxy made after hyper's
/// parse (`refuse` for target length and `_`, `check_request_head`),
/// makes of `data`: the reference of [`h1_framing`].
pub fn hyper_requests(data: &[u8]) -> Vec<Seen> {
    use std::sync::{Arc, Mutex};

    use http_body_util::BodyExt;
    use hyper::body::Incoming;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime");
    }
    let limits = fuzz_limits();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let record = seen.clone();
    let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
        let record = record.clone();
        let limits = limits.clone();
        async move {
            let push = |s: Seen| record.lock().expect("not poisoned").push(s);
            let refused = crate::proxy::refuses_parsed_head(&limits, &req);
            let mut resp = http::Response::new(http_body_util::Empty::<bytes::Bytes>::new());
            if refused {
                push(Seen::Refused);
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
                return Ok::<_, std::convert::Infallible>(resp);
            }
            let method = req.method().to_string();
            let target = req.uri().to_string();
            match req.into_body().collect().await {
                Ok(body) => push(Seen::Request {
                    method,
                    target,
                    body: body.to_bytes().len() as u64,
                }),
                Err(_) => push(Seen::BodyFailed { method, target }),
            }
            Ok(resp)
        }
    });
    let output = RUNTIME.with(|rt| {
        rt.block_on(async {
            let (client, server) = tokio::io::duplex(1 << 20);
            let mut builder = hyper::server::conn::http1::Builder::new();
            // The input is written whole and then the write side shut: with
            // half-closes, hyper still answers every request before that
            // end (without, it drops the one in progress).
            builder
                .half_close(true)
                .max_buf_size(FUZZ_HEAD_BYTES)
                .max_headers(ProxyLimits::default().max_request_headers);
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(server), service);
            let (mut read, mut write) = tokio::io::split(client);
            let send = async {
                let _ = write.write_all(data).await;
                let _ = write.shutdown().await;
            };
            let receive = async {
                let mut out = Vec::new();
                let _ = read.read_to_end(&mut out).await;
                out
            };
            let (_, _, out) = tokio::join!(send, conn, receive);
            out
        })
    });
    let mut seen = std::mem::take(&mut *seen.lock().expect("not poisoned"));
    if matches!(seen.last(), Some(Seen::Refused | Seen::BodyFailed { .. })) {
        return seen;
    }
    // Final responses beyond the requests served: hyper refused a head
    // itself (400, 431, ...).
    let text = String::from_utf8_lossy(&output);
    let finals = text.matches("HTTP/1.1 ").count() - text.matches("HTTP/1.1 100 ").count();
    seen.push(if finals > seen.len() {
        Seen::Refused
    } else {
        Seen::End
    });
    seen
}

/// The differential fuzz target: the same bytes to sluice's HTTP/1.1
/// parser and to hyper's. Panics when they disagree about framing: which
/// requests a byte stream holds and where each body ends, or when sluice
/// accepts a request hyper refuses. sluice may refuse where hyper accepts
/// (it refuses what it would otherwise forward ambiguously; see [`h1`]).
pub fn h1_framing(data: &[u8]) {
    let ours = h1_requests(data);
    let theirs = hyper_requests(data);
    for (i, mine) in ours.iter().enumerate() {
        let reference = theirs.get(i).unwrap_or(&Seen::End);
        match (mine, reference) {
            (Seen::HandedOver, _) => return,
            // Stricter than hyper, or both stop here.
            (Seen::Refused | Seen::BodyFailed { .. }, _) => return,
            (a, b) if a == b => {
                if *a == Seen::End {
                    return;
                }
            }
            _ => panic!(
                "framing disagrees at request {i}:\n  sluice: {ours:?}\n  hyper:  {theirs:?}\n  input:  {:?}",
                String::from_utf8_lossy(data)
            ),
        }
    }
}

/// What a parser made of a response, in [`h1_response`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeenResponse {
    /// A whole response: its status and decoded body length.
    Response { status: u16, body: u64 },
    /// The head was accepted and the body failed (malformed, cut short).
    BodyFailed { status: u16 },
    /// The head was refused.
    Refused,
    /// The bytes ended within the head.
    Incomplete,
}

/// What sluice's own response parser ([`h1::parse_response`]) makes of
/// `data`, the answer to a GET (or a HEAD when `head_request`), the
/// connection closed after it.
pub fn h1_response_ours(data: &[u8], head_request: bool) -> SeenResponse {
    let mut at = 0;
    let head = loop {
        match h1::parse_response(&data[at..], head_request) {
            Err(_) => return SeenResponse::Refused,
            Ok(None) => return SeenResponse::Incomplete,
            // The proxy refuses a 101 it did not ask for.
            Ok(Some(h)) if h.status == http::StatusCode::SWITCHING_PROTOCOLS => {
                return SeenResponse::Refused;
            }
            Ok(Some(h)) if h.status.is_informational() => at += h.len,
            Ok(Some(h)) => break h,
        }
    };
    at += head.len;
    let rest = &data[at..];
    let status = head.status.as_u16();
    let body = match head.framing {
        ResponseFraming::None => Some(0),
        ResponseFraming::Length(n) => Some(n).filter(|n| *n <= rest.len() as u64),
        ResponseFraming::UntilClose => Some(rest.len() as u64),
        ResponseFraming::Chunked => {
            let mut walker = ChunkedWalker::default();
            match walker.walk(rest) {
                Ok(_) if walker.is_done() => Some(walker.decoded),
                _ => None,
            }
        }
    };
    match body {
        Some(body) => SeenResponse::Response { status, body },
        None => SeenResponse::BodyFailed { status },
    }
}

/// What hyper's HTTP/1.1 client (as the proxy used it before its own)
/// makes of the same bytes: the reference of [`h1_response`].
pub fn h1_response_hyper(data: &[u8], head_request: bool) -> SeenResponse {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime");
    }
    RUNTIME.with(|rt| {
        rt.block_on(async {
            let (client, mut server) = tokio::io::duplex(1 << 20);
            let Ok((mut send, conn)) = hyper::client::conn::http1::handshake::<
                _,
                http_body_util::Empty<bytes::Bytes>,
            >(hyper_util::rt::TokioIo::new(client))
            .await
            else {
                return SeenResponse::Refused;
            };
            let driver = tokio::spawn(conn);
            let serve = async {
                // The request first (so the answer is to it), then the bytes.
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match server.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let _ = server.write_all(data).await;
                let _ = server.shutdown().await;
                // Keep reading so the client's writes never block.
                let mut sink = Vec::new();
                let _ = server.read_to_end(&mut sink).await;
            };
            let method = if head_request {
                http::Method::HEAD
            } else {
                http::Method::GET
            };
            let req = http::Request::builder()
                .method(method)
                .uri("/")
                .header(http::header::HOST, "h")
                .body(http_body_util::Empty::new())
                .expect("a valid request");
            let exchange = async {
                let resp = match send.send_request(req).await {
                    Ok(resp) => resp,
                    Err(_) => return SeenResponse::Refused,
                };
                let status = resp.status().as_u16();
                match resp.into_body().collect().await {
                    Ok(body) => SeenResponse::Response {
                        status,
                        body: body.to_bytes().len() as u64,
                    },
                    Err(_) => SeenResponse::BodyFailed { status },
                }
            };
            let (_, seen) = tokio::join!(serve, exchange);
            driver.abort();
            seen
        })
    })
}

/// Differential fuzz target: the same bytes as the answer to a GET and to
/// a HEAD, to sluice's response parser and to hyper's client. Fails when
/// sluice accepts a response hyper refuses, or when both accept and
/// disagree on its status or where (and with how many bytes) its body
/// ends. (hyper refusing a head that sluice refuses too, or sluice being
/// the stricter, is fine.)
pub fn h1_response(data: &[u8]) {
    for head_request in [false, true] {
        let ours = h1_response_ours(data, head_request);
        let theirs = h1_response_hyper(data, head_request);
        let agree = match (&ours, &theirs) {
            (SeenResponse::Refused, _) => true,
            // The bytes ended within the head: hyper says so as an error.
            (SeenResponse::Incomplete, SeenResponse::Refused | SeenResponse::Incomplete) => true,
            (SeenResponse::BodyFailed { status: a }, SeenResponse::BodyFailed { status: b }) => {
                a == b
            }
            (a, b) => a == b,
        };
        assert!(
            agree,
            "response framing disagrees (HEAD: {head_request}):\n  sluice: {ours:?}\n  hyper:  {theirs:?}\n  input:  {:?}",
            String::from_utf8_lossy(data)
        );
    }
}
