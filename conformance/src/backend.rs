//! The runner's echo pod: what the suite's `echo-basic` image does, for
//! the behaviours the GATEWAY-HTTP tests rely on.
//!
//! `sluice::echo` covers the plain echo; the suite needs more of echo-basic
//! than the gateway's own tests do, so the runner keeps its own copy:
//! - two ports, as echo-basic: the HTTP port (3000 in the manifests,
//!   HTTP/1.1 only, with WebSocket on `/ws`) and the h2c port (3001, HTTP/2
//!   with prior knowledge only), so that a Service port's `appProtocol:
//!   kubernetes.io/h2c` is really needed to reach it;
//! - the echo JSON body (`sluice::echo::EchoResponse`), `X-Echo-Set-Header`,
//!   `/status/NNN` and `?delay=`;
//! - the retry simulation of the retry test: `?responseCode=C&succeedAfter=N
//!   &uuid=U` answers `C` to the first `N` requests carrying `U`, then echoes;
//! - WebSocket on `/ws`: the handshake, then every text or binary message
//!   is sent back (echo-basic's `io.Copy(ws, ws)`).
//!
//! Every request is counted by path, so that tests can see what a pod
//! received (the suite reads the pods' logs for the mirror tests).
//!
//! A pod started with [`EchoPod::start_tls`] also serves echo-basic's HTTPS
//! port (8443 in the manifests, `TLS_SERVER_CERT`): TLS with the given
//! server settings (client certificates required when `TLS_CLIENT_CACERTS`
//! is set), recording each connection's SNI and client certificate
//! ([`TlsSeen`]), which echo-basic reports in its `tls` field.
//!
//! Two more modes of echo-basic, each serving on the pod's ports instead:
//! - gRPC (`GRPC_ECHO_SERVER`, [`EchoPod::start_grpc`]): the `GrpcEcho`
//!   service over h2c ([`sluice::grpc_echo`]) on its HTTP port;
//! - TCP (`TCP_ECHO_SERVER`, [`EchoPod::start_tcp`]): echo-basic's
//!   `tcpserver` on 3000 in cleartext and on 8443 over TLS: a welcome line,
//!   then `PING` answers `PONG`, `IS_TLS` whether the connection is TLS,
//!   and `TEST` the pod's context and TLS details as JSON.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice::echo::EchoIdentity;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::ws;

/// One echo pod: its two ports and what it has received.
pub struct EchoPod {
    http: SocketAddr,
    h2c: SocketAddr,
    /// The HTTPS port, when started with [`EchoPod::start_tls`].
    https: Option<SocketAddr>,
    /// gRPC mode: the gRPC server every port of the pod leads to.
    grpc: Option<sluice::grpc_echo::GrpcEchoServer>,
    /// TCP mode: the cleartext (3000) and TLS (8443) ports.
    tcp: Option<(SocketAddr, SocketAddr)>,
    state: Arc<State>,
    tasks: Vec<JoinHandle<()>>,
}

struct State {
    identity: EchoIdentity,
    /// Requests received, by path with query.
    seen: Mutex<HashMap<String, usize>>,
    /// Retry simulation: requests seen per `uuid`.
    retries: Mutex<HashMap<String, u32>>,
    /// The TLS connections of the HTTPS port.
    tls_seen: Mutex<Vec<TlsSeen>>,
}

/// What the HTTPS port saw of one TLS connection.
#[derive(Debug, Clone)]
pub struct TlsSeen {
    /// The server name the client sent (SNI).
    pub sni: Option<String>,
    /// The client certificate (DER), when one was presented.
    pub client_cert: Option<Vec<u8>>,
}

impl EchoPod {
    /// Start a pod on two free loopback ports.
    pub async fn start(identity: EchoIdentity) -> io::Result<EchoPod> {
        let http = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let h2c = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let state = Arc::new(State {
            identity,
            seen: Mutex::new(HashMap::new()),
            retries: Mutex::new(HashMap::new()),
            tls_seen: Mutex::new(Vec::new()),
        });
        Ok(EchoPod {
            http: http.local_addr()?,
            h2c: h2c.local_addr()?,
            https: None,
            grpc: None,
            tcp: None,
            tasks: vec![
                tokio::spawn(accept(http, Arc::clone(&state), Port::Http)),
                tokio::spawn(accept(h2c, Arc::clone(&state), Port::H2c)),
            ],
            state,
        })
    }

    /// Start a pod that also serves HTTPS with `tls` (echo-basic with
    /// `TLS_SERVER_CERT`).
    pub async fn start_tls(
        identity: EchoIdentity,
        tls: Arc<rustls::ServerConfig>,
    ) -> io::Result<EchoPod> {
        let mut pod = EchoPod::start(identity).await?;
        let https = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        pod.https = Some(https.local_addr()?);
        pod.tasks.push(tokio::spawn(accept_tls(
            https,
            Arc::clone(&pod.state),
            tokio_rustls::TlsAcceptor::from(tls),
        )));
        Ok(pod)
    }

    /// A pod in gRPC mode (`GRPC_ECHO_SERVER`).
    pub async fn start_grpc(identity: EchoIdentity) -> io::Result<EchoPod> {
        let mut pod = EchoPod::start(identity.clone()).await?;
        pod.grpc = Some(sluice::grpc_echo::GrpcEchoServer::start(identity).await?);
        Ok(pod)
    }

    /// A pod in TCP mode (`TCP_ECHO_SERVER`), serving TLS with `tls` on
    /// its 8443 port.
    pub async fn start_tcp(
        identity: EchoIdentity,
        tls: Arc<rustls::ServerConfig>,
    ) -> io::Result<EchoPod> {
        let mut pod = EchoPod::start(identity).await?;
        let plain = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let secure = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        pod.tcp = Some((plain.local_addr()?, secure.local_addr()?));
        let context = tcp_context(&pod.state.identity, pod.tcp);
        pod.tasks
            .push(tokio::spawn(accept_tcp(plain, context.clone(), None)));
        pod.tasks.push(tokio::spawn(accept_tcp(
            secure,
            context,
            Some(tokio_rustls::TlsAcceptor::from(tls)),
        )));
        Ok(pod)
    }

    /// The TLS connections the HTTPS port accepted so far.
    pub fn tls_seen(&self) -> Vec<TlsSeen> {
        lock(&self.state.tls_seen).clone()
    }

    pub fn identity(&self) -> &EchoIdentity {
        &self.state.identity
    }

    /// The loopback port standing for the container port `target` (3001 is
    /// echo-basic's h2c port, 8443 its HTTPS port when it serves one; every
    /// other port is its HTTP port).
    pub fn port_for(&self, target: Option<u16>) -> u16 {
        if let Some(grpc) = &self.grpc {
            return grpc.local_addr().port();
        }
        if let Some((plain, secure)) = self.tcp {
            return match target {
                Some(8443) => secure.port(),
                _ => plain.port(),
            };
        }
        match (target, self.https) {
            (Some(3001), _) => self.h2c.port(),
            (Some(8443), Some(https)) => https.port(),
            _ => self.http.port(),
        }
    }

    /// How many requests for `path` (with query) this pod received.
    pub fn seen(&self, path: &str) -> usize {
        lock(&self.state.seen).get(path).copied().unwrap_or(0)
    }
}

impl Drop for EchoPod {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[derive(Clone, Copy)]
enum Port {
    Http,
    H2c,
}

async fn accept(listener: TcpListener, state: Arc<State>, port: Port) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(handle(&state, request, None).await) }
            });
            let io = TokioIo::new(stream);
            match port {
                Port::Http => {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .with_upgrades()
                        .await;
                }
                Port::H2c => {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await;
                }
            }
        });
    }
}

/// echo-basic's HTTPS port: the TLS handshake, then HTTP/1.1 as on the
/// HTTP port.
async fn accept_tls(listener: TcpListener, state: Arc<State>, acceptor: tokio_rustls::TlsAcceptor) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(stream).await else {
                return;
            };
            let conn = stream.get_ref().1;
            let seen = Arc::new(TlsSeen {
                sni: conn.server_name().map(str::to_owned),
                client_cert: conn
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| c.as_ref().to_vec()),
            });
            lock(&state.tls_seen).push(TlsSeen::clone(&seen));
            let service = service_fn(move |request| {
                let (state, seen) = (Arc::clone(&state), Arc::clone(&seen));
                async move { Ok::<_, Infallible>(handle(&state, request, Some(&seen)).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Answer one request; `tls` is what the HTTPS port saw of its connection.
async fn handle(
    state: &State,
    mut request: Request<Incoming>,
    tls: Option<&TlsSeen>,
) -> Response<Full<Bytes>> {
    let path = request
        .uri()
        .path_and_query()
        .map(|pq| pq.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    *lock(&state.seen).entry(path.clone()).or_default() += 1;

    if request.uri().path() == "/ws" && ws::is_upgrade(request.headers()) {
        return match ws::accept_key(request.headers()) {
            Some(accept) => {
                let upgrade = hyper::upgrade::on(&mut request);
                tokio::spawn(async move {
                    if let Ok(upgraded) = upgrade.await {
                        let _ = echo_messages(TokioIo::new(upgraded)).await;
                    }
                });
                let mut response = Response::new(Full::new(Bytes::new()));
                *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                let h = response.headers_mut();
                h.insert(
                    http::header::CONNECTION,
                    HeaderValue::from_static("Upgrade"),
                );
                h.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
                if let Ok(v) = HeaderValue::from_str(&accept) {
                    h.insert("sec-websocket-accept", v);
                }
                response
            }
            None => plain(StatusCode::BAD_REQUEST, "bad WebSocket handshake"),
        };
    }

    let (parts, body) = request.into_parts();
    let body_bytes = match body.collect().await {
        Ok(b) => b.to_bytes().len() as u64,
        Err(_) => return plain(StatusCode::BAD_REQUEST, "unreadable body"),
    };
    let query: HashMap<String, String> = parts
        .uri
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();

    if let Some(delay) = query.get("delay") {
        match parse_duration(delay) {
            Some(d) => tokio::time::sleep(d.min(Duration::from_secs(60))).await,
            None => return plain(StatusCode::INTERNAL_SERVER_ERROR, "bad delay"),
        }
    }
    if let (Some(code), Some(after), Some(uuid)) = (
        query.get("responseCode"),
        query.get("succeedAfter"),
        query.get("uuid"),
    ) {
        let (Some(code), Ok(after)) = (
            code.parse::<u16>()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok()),
            after.parse::<u32>(),
        ) else {
            return plain(StatusCode::BAD_REQUEST, "bad retry simulation parameters");
        };
        let attempt = {
            let mut retries = lock(&state.retries);
            let n = retries.entry(uuid.clone()).or_default();
            *n += 1;
            *n
        };
        if attempt <= after {
            return plain(code, &format!("simulated failure {attempt} of {after}"));
        }
    }
    if let Some(code) = parts.uri.path().strip_prefix("/status/") {
        let status = code
            .parse::<u16>()
            .ok()
            .filter(|_| code.len() == 3)
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap_or(StatusCode::BAD_REQUEST);
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = status;
        return response;
    }

    let echoed = sluice::echo::describe(&parts, body_bytes, &state.identity);
    let response = sluice::echo::json_response(&parts, &echoed);
    match tls {
        Some(tls) => with_tls_details(response, &echoed, tls),
        None => response,
    }
}

/// echo-basic's `tls` field of the echo body on its HTTPS port: the
/// connection's server name (what the suite compares with a request's
/// expected SNI).
fn with_tls_details(
    response: Response<Full<Bytes>>,
    echoed: &sluice::echo::EchoResponse,
    tls: &TlsSeen,
) -> Response<Full<Bytes>> {
    let Ok(mut body) = serde_json::to_value(echoed) else {
        return response;
    };
    body["tls"] = serde_json::json!({ "serverName": tls.sni.as_deref().unwrap_or_default() });
    match serde_json::to_vec_pretty(&body) {
        Ok(bytes) => response.map(|_| Full::new(Bytes::from(bytes))),
        Err(_) => response,
    }
}

/// echo-basic's `tcpserver` welcome line.
pub const TCP_WELCOME: &str = "Gateway API Test TCP Server\n";

/// The `Context` part of the `TEST` answer.
fn tcp_context(
    identity: &EchoIdentity,
    ports: Option<(SocketAddr, SocketAddr)>,
) -> serde_json::Value {
    let (plain, secure) = ports.map_or((0, 0), |(p, s)| (p.port(), s.port()));
    serde_json::json!({
        "namespace": identity.namespace,
        "ingress": "",
        "service": "",
        "pod": identity.pod,
        "tcpport": plain.to_string(),
        "tlsport": secure.to_string(),
    })
}

/// echo-basic's `tcpserver` on one port (TLS with `tls`).
async fn accept_tcp(
    listener: TcpListener,
    context: serde_json::Value,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (context, tls) = (context.clone(), tls.clone());
        tokio::spawn(async move {
            match tls {
                None => {
                    let _ = tcp_session(stream, context, None).await;
                }
                Some(acceptor) => {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let c = stream.get_ref().1;
                    let details = serde_json::json!({
                        "version": match c.protocol_version() {
                            Some(rustls::ProtocolVersion::TLSv1_3) => "TLS 1.3",
                            Some(rustls::ProtocolVersion::TLSv1_2) => "TLS 1.2",
                            _ => "",
                        },
                        "serverName": c.server_name().unwrap_or_default(),
                        "negotiatedProtocol": c.alpn_protocol().map(|p| String::from_utf8_lossy(p).into_owned()).unwrap_or_default(),
                        "cipherSuite": c.negotiated_cipher_suite().map(|s| format!("{:?}", s.suite())).unwrap_or_default(),
                    });
                    let _ = tcp_session(stream, context, Some(details)).await;
                }
            }
        });
    }
}

/// One connection of the TCP echo server: the welcome line, then an answer
/// per known command line.
async fn tcp_session<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    mut context: serde_json::Value,
    tls: Option<serde_json::Value>,
) -> io::Result<()> {
    use tokio::io::AsyncBufReadExt;
    let is_tls = tls.is_some();
    context["isTLS"] = is_tls.into();
    if let Some(t) = tls {
        context["tls"] = t;
    }
    let mut stream = tokio::io::BufReader::new(stream);
    stream.get_mut().write_all(TCP_WELCOME.as_bytes()).await?;
    stream.get_mut().flush().await?;
    let mut line = String::new();
    loop {
        line.clear();
        if stream.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let answer = match line.trim_end_matches(['\r', '\n']) {
            "TEST" => format!("{context}\n"),
            "IS_TLS" => format!("{is_tls}\n"),
            "PING" => "PONG\n".to_owned(),
            _ => continue,
        };
        stream.get_mut().write_all(answer.as_bytes()).await?;
        stream.get_mut().flush().await?;
    }
}

fn plain(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{message}\n"))));
    *response.status_mut() = status;
    response
}

/// Go's `time.ParseDuration` for the forms the suite sends (`1s`, `250ms`).
fn parse_duration(text: &str) -> Option<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = number.parse().ok()?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return None,
    };
    (secs >= 0.0 && secs.is_finite()).then(|| Duration::from_secs_f64(secs))
}

/// Send every WebSocket message back until the peer closes.
async fn echo_messages<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) -> io::Result<()> {
    loop {
        let Some(frame) = ws::read_frame(&mut stream).await? else {
            return Ok(());
        };
        match frame.opcode {
            ws::CLOSE => {
                stream.write_all(&ws::encode(ws::CLOSE, &[], None)).await?;
                return Ok(());
            }
            ws::PING => {
                stream
                    .write_all(&ws::encode(ws::PONG, &frame.payload, None))
                    .await?
            }
            op => {
                stream
                    .write_all(&ws::encode(op, &frame.payload, None))
                    .await?
            }
        }
        stream.flush().await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_go() {
        assert_eq!(parse_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(parse_duration("5h"), None);
    }
}
