//! A small echo backend: answers every request with a JSON description of
//! what it received, the way the Gateway API conformance echo server
//! (`echo-basic`) does. Used by `sluice demo` and by the tests as the backend
//! behind the gateway, so that what a backend *received* can be counted and
//! inspected on the backend side, not inferred by the client.
//!
//! The response body has echo-basic's shape:
//!
//! ```json
//! {"path": "/a?b=c", "host": "example.com", "method": "GET", "proto": "HTTP/1.1",
//!  "headers": {"User-Agent": ["curl"]}, "namespace": "default", "ingress": "",
//!  "service": "web", "pod": "web-1", "bodyBytes": 0}
//! ```
//!
//! Header names are canonicalised as Go's `net/http` does (`x-foo-bar` is
//! `X-Foo-Bar`), and `Host` is reported in `host`, not among the headers.
//! Behaviours for tests, all borrowed from echo-basic except `delay_ms`:
//! - `X-Echo-Set-Header: name:value[, name2:value2]` sets response headers;
//! - `GET /status/NNN` answers with status `NNN` and no body;
//! - `?delay=250ms` (or `1s`) or `?delay_ms=250` waits before answering.
//!
//! A server can also be told, while it runs, to answer every request with
//! a status of its choice ([`EchoServer::fail_with`], the echo body kept)
//! or after a delay ([`EchoServer::delay_by`]): a canary that starts
//! failing or slows down.
//!
//! Both HTTP/1.1 (keep-alive) and HTTP/2 with prior knowledge (h2c) are
//! served on the same port.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Who this backend claims to be: the `namespace`, `service` and `pod` fields
/// of every response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EchoIdentity {
    pub pod: String,
    pub namespace: String,
    pub service: String,
}

/// The JSON body of an echo response (echo-basic's `RequestAssertions`,
/// plus `bodyBytes`). Tests deserialize responses into it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EchoResponse {
    /// The request target as received: path and query.
    pub path: String,
    pub host: String,
    pub method: String,
    /// `HTTP/1.1`, `HTTP/2.0`, ...
    pub proto: String,
    /// Request headers by canonical name, values in the order received.
    pub headers: BTreeMap<String, Vec<String>>,
    pub namespace: String,
    pub ingress: String,
    pub service: String,
    pub pod: String,
    /// Length of the request body, which the echo server reads fully.
    #[serde(default)]
    pub body_bytes: u64,
}

impl EchoResponse {
    /// The values of a request header, looked up case-insensitively.
    pub fn header(&self, name: &str) -> Option<&[String]> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// How many received requests an [`EchoServer`] keeps for [`EchoServer::recent`].
const RECENT_CAPACITY: usize = 256;

struct EchoState {
    identity: EchoIdentity,
    requests: AtomicU64,
    recent: Mutex<VecDeque<EchoResponse>>,
    /// Status every request is answered with (0: the usual).
    forced_status: AtomicU16,
    /// With `forced_status`: only every `forced_every`th request (0 or 1:
    /// every request).
    forced_every: AtomicU64,
    /// Delay before every answer, in milliseconds.
    delay_ms: AtomicU64,
}

/// A running echo backend. Dropping it (or calling [`EchoServer::shutdown`])
/// stops accepting and closes its connections once in-flight requests end.
pub struct EchoServer {
    local_addr: SocketAddr,
    state: Arc<EchoState>,
    stop: watch::Sender<()>,
    accept_loop: Option<JoinHandle<()>>,
}

impl EchoServer {
    /// The address it listens on (the real port when port 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn identity(&self) -> &EchoIdentity {
        &self.state.identity
    }

    /// How many requests this backend has received (counted when the request
    /// head arrives, whatever the outcome).
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }

    /// The last requests received (at most 256), oldest first.
    pub fn recent(&self) -> Vec<EchoResponse> {
        match self.state.recent.lock() {
            Ok(recent) => recent.iter().cloned().collect(),
            Err(poisoned) => poisoned.into_inner().iter().cloned().collect(),
        }
    }

    /// Answer every request from now on with `status` (the echo body
    /// kept), or as usual again with `None`.
    pub fn fail_with(&self, status: Option<StatusCode>) {
        self.state.forced_every.store(0, Ordering::Relaxed);
        self.state
            .forced_status
            .store(status.map_or(0, |s| s.as_u16()), Ordering::Relaxed);
    }

    /// Answer every `n`th request from now on with `status` (the others as
    /// usual): a deterministic error rate of `1/n`.
    pub fn fail_every(&self, n: u64, status: StatusCode) {
        self.state.forced_every.store(n, Ordering::Relaxed);
        self.state
            .forced_status
            .store(status.as_u16(), Ordering::Relaxed);
    }

    /// Wait `delay` before every answer from now on.
    pub fn delay_by(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.state.delay_ms.store(ms, Ordering::Relaxed);
    }

    /// Stop accepting and wait until the listening socket is closed, so that
    /// a connection attempt made after this returns is refused.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(());
        if let Some(accept_loop) = self.accept_loop.take() {
            let _ = accept_loop.await;
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.stop.send(());
    }
}

/// Bind `addr` and serve echo responses until the returned server is dropped.
pub async fn start(addr: SocketAddr, identity: EchoIdentity) -> io::Result<EchoServer> {
    let listener = TcpListener::bind(addr).await?;
    Ok(serve_on(listener, identity))
}

/// Serve echo responses on an already bound listener.
pub fn serve_on(listener: TcpListener, identity: EchoIdentity) -> EchoServer {
    let local_addr = listener
        .local_addr()
        .expect("a bound TCP listener has a local address");
    let state = Arc::new(EchoState {
        identity,
        requests: AtomicU64::new(0),
        recent: Mutex::new(VecDeque::with_capacity(RECENT_CAPACITY)),
        forced_status: AtomicU16::new(0),
        forced_every: AtomicU64::new(0),
        delay_ms: AtomicU64::new(0),
    });
    let (stop, stopped) = watch::channel(());
    let accept_loop = tokio::spawn(accept_loop(listener, Arc::clone(&state), stopped));
    EchoServer {
        local_addr,
        state,
        stop,
        accept_loop: Some(accept_loop),
    }
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<EchoState>,
    mut stopped: watch::Receiver<()>,
) {
    loop {
        let (stream, _peer) = tokio::select! {
            _ = stopped.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Too many open files and the like: back off and keep serving.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(echo(&state, request).await) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stopped.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
}

async fn echo(state: &EchoState, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let number = state.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let (parts, mut body) = request.into_parts();

    let mut body_bytes = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    body_bytes += data.len() as u64;
                }
            }
            Err(_) => return plain(StatusCode::BAD_REQUEST, "request body could not be read"),
        }
    }

    let echoed = describe(&parts, body_bytes, &state.identity);
    {
        let mut recent = match state.recent.lock() {
            Ok(recent) => recent,
            Err(poisoned) => poisoned.into_inner(),
        };
        if recent.len() == RECENT_CAPACITY {
            recent.pop_front();
        }
        recent.push_back(echoed.clone());
    }

    match parts.uri.query().map(requested_delay) {
        Some(Ok(Some(delay))) => tokio::time::sleep(delay).await,
        Some(Err(message)) => return plain(StatusCode::BAD_REQUEST, &message),
        Some(Ok(None)) | None => {}
    }
    let delay = state.delay_ms.load(Ordering::Relaxed);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let forced = state.forced_status.load(Ordering::Relaxed);
    let every = state.forced_every.load(Ordering::Relaxed).max(1);
    if let Ok(status) = StatusCode::from_u16(forced)
        && number.is_multiple_of(every)
    {
        let mut response = json_response(&parts, &echoed);
        *response.status_mut() = status;
        return response;
    }

    if parts.method == Method::GET
        && let Some(code) = parts.uri.path().strip_prefix("/status/")
    {
        let status = (code.len() == 3)
            .then(|| code.parse::<u16>().ok())
            .flatten()
            .and_then(|c| StatusCode::from_u16(c).ok());
        let Some(status) = status else {
            return plain(StatusCode::BAD_REQUEST, "expected /status/NNN");
        };
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = status;
        return response;
    }

    json_response(&parts, &echoed)
}

/// What a request looked like to the backend, in echo-basic's shape.
pub fn describe(
    parts: &http::request::Parts,
    body_bytes: u64,
    identity: &EchoIdentity,
) -> EchoResponse {
    let path = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    let host = parts
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| parts.uri.authority().map(|a| a.as_str().to_owned()))
        .unwrap_or_default();
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in &parts.headers {
        if name == http::header::HOST {
            continue;
        }
        headers
            .entry(canonical_header_name(name.as_str()))
            .or_default()
            .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
    }
    EchoResponse {
        path,
        host,
        method: parts.method.to_string(),
        proto: proto(parts.version).to_owned(),
        headers,
        namespace: identity.namespace.clone(),
        ingress: String::new(),
        service: identity.service.clone(),
        pod: identity.pod.clone(),
        body_bytes,
    }
}

/// The 200 JSON response for `echoed`, with the headers the request asked
/// for in `X-Echo-Set-Header: name:value[, name2:value2]`.
pub fn json_response(parts: &http::request::Parts, echoed: &EchoResponse) -> Response<Full<Bytes>> {
    let body = match serde_json::to_vec_pretty(echoed) {
        Ok(body) => body,
        Err(_) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "could not encode response",
            );
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    let response_headers = response.headers_mut();
    for value in parts.headers.get_all("x-echo-set-header") {
        let Ok(value) = value.to_str() else { continue };
        for pair in value.split(',') {
            let Some((name, value)) = pair.trim().split_once(':') else {
                continue;
            };
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.trim().as_bytes()),
                HeaderValue::from_str(value.trim()),
            ) {
                response_headers.append(name, value);
            }
        }
    }
    response_headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response_headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

fn plain(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{message}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain"),
    );
    response
}

fn proto(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/?",
    }
}

/// The delay a query string asks for: `delay=250ms` / `delay=2s` (as
/// echo-basic) or `delay_ms=250`. Capped at one minute.
fn requested_delay(query: &str) -> Result<Option<Duration>, String> {
    const MAX: Duration = Duration::from_secs(60);
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let delay = match key.as_ref() {
            "delay_ms" => value
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| format!("delay_ms={value} is not a number of milliseconds"))?,
            "delay" => parse_go_duration(&value)
                .ok_or_else(|| format!("delay={value} is not a duration like 250ms or 2s"))?,
            _ => continue,
        };
        return Ok(Some(delay.min(MAX)));
    }
    Ok(None)
}

/// The small subset of Go's `time.ParseDuration` echo-basic's tests use:
/// one number followed by `ms` or `s`.
fn parse_go_duration(text: &str) -> Option<Duration> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse::<u64>().ok().map(Duration::from_millis);
    }
    let seconds = text.strip_suffix('s')?;
    let seconds = seconds.parse::<f64>().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(60.0)))
}

/// A header name as Go's `textproto.CanonicalMIMEHeaderKey` writes it: the
/// first letter and every letter after a hyphen upper case, the rest lower.
pub fn canonical_header_name(name: &str) -> String {
    let mut upper = true;
    name.chars()
        .map(|c| {
            let out = if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            upper = c == '-';
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_are_canonical_like_go() {
        assert_eq!(canonical_header_name("x-forwarded-for"), "X-Forwarded-For");
        assert_eq!(canonical_header_name("CONTENT-TYPE"), "Content-Type");
        assert_eq!(canonical_header_name("accept"), "Accept");
        assert_eq!(canonical_header_name("x--y"), "X--Y");
    }

    #[test]
    fn delays_parse_like_echo_basic() {
        assert_eq!(requested_delay("a=b"), Ok(None));
        assert_eq!(
            requested_delay("delay=250ms"),
            Ok(Some(Duration::from_millis(250)))
        );
        assert_eq!(
            requested_delay("x=1&delay=1.5s"),
            Ok(Some(Duration::from_millis(1500)))
        );
        assert_eq!(
            requested_delay("delay_ms=20"),
            Ok(Some(Duration::from_millis(20)))
        );
        assert_eq!(
            requested_delay("delay=2h"),
            Err("delay=2h is not a duration like 250ms or 2s".to_owned())
        );
        assert!(requested_delay("delay_ms=soon").is_err());
        assert_eq!(
            requested_delay("delay=100000s"),
            Ok(Some(Duration::from_secs(60)))
        );
    }
}
