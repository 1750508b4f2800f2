//! A gRPC echo backend and client: the conformance suite's `echo-basic` in
//! gRPC mode (`GRPC_ECHO_SERVER`), for the tests and the conformance
//! runner, as [`crate::echo`] is its HTTP mode.
//!
//! The service is echo-basic's (`grpcecho.proto`):
//! `gateway_api_conformance.echo_basic.grpcecho.GrpcEcho` with `Echo` and
//! `EchoTwo`, which answer an `EchoResponse` whose `assertions` describe the
//! call (fully qualified method, request headers, `:authority`, the pod's
//! namespace and name, the TLS connection), and `EchoThree`, which is
//! intentionally unimplemented (`UNIMPLEMENTED`, as is any other method).
//!
//! gRPC over HTTP/2 is hyper's HTTP/2 with gRPC's framing on top: a
//! message is a 5-byte prefix (compressed flag, big-endian length) and the
//! protobuf bytes; the status travels in trailers (`grpc-status`,
//! `grpc-message`), or in the only HEADERS frame of a "Trailers-Only"
//! answer. The messages are a few strings and nested messages, encoded
//! and decoded here by hand (protobuf's wire format: a varint tag
//! `field << 3 | wire type`, then for strings and messages a varint length
//! and the bytes); no code generator or gRPC crate is needed for that.

use std::convert::Infallible;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::echo::EchoIdentity;

/// The echo service's full name.
pub const SERVICE: &str = "gateway_api_conformance.echo_basic.grpcecho.GrpcEcho";

/// gRPC status codes (the ones the tests name).
pub mod code {
    pub const OK: u32 = 0;
    pub const UNKNOWN: u32 = 2;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const INTERNAL: u32 = 13;
    pub const UNAVAILABLE: u32 = 14;
}

/// `Context`: who answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    pub namespace: String,
    pub ingress: String,
    pub service_name: String,
    pub pod: String,
}

/// `TLSAssertions`: the TLS connection the call came on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsAssertions {
    pub version: String,
    pub negotiated_protocol: String,
    pub server_name: String,
    pub cipher_suite: String,
}

/// `Assertions`: what the backend saw of the call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assertions {
    /// `/<service>/<method>`.
    pub fully_qualified_method: String,
    /// Request headers (metadata), lower-case names, in the order received.
    pub headers: Vec<(String, String)>,
    pub authority: String,
    pub context: Context,
    pub tls: Option<TlsAssertions>,
}

impl Assertions {
    /// The values of header `name` (lower case).
    pub fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// `EchoResponse` (its `request` field is the empty `EchoRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EchoResponse {
    pub assertions: Assertions,
}

/// Protobuf wire types used here.
const LEN: u8 = 2;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_varint(out, u64::from(field << 3 | u32::from(LEN)));
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A string field, left out when empty (proto3's default).
fn put_str(out: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        put_bytes(out, field, s.as_bytes());
    }
}

impl EchoResponse {
    /// The protobuf encoding.
    pub fn encode(&self) -> Vec<u8> {
        let a = &self.assertions;
        let mut assertions = Vec::new();
        put_str(&mut assertions, 1, &a.fully_qualified_method);
        for (k, v) in &a.headers {
            let mut header = Vec::new();
            put_str(&mut header, 1, k);
            put_str(&mut header, 2, v);
            put_bytes(&mut assertions, 2, &header);
        }
        put_str(&mut assertions, 3, &a.authority);
        let mut context = Vec::new();
        put_str(&mut context, 1, &a.context.namespace);
        put_str(&mut context, 2, &a.context.ingress);
        put_str(&mut context, 3, &a.context.service_name);
        put_str(&mut context, 4, &a.context.pod);
        put_bytes(&mut assertions, 4, &context);
        if let Some(t) = &a.tls {
            let mut tls = Vec::new();
            put_str(&mut tls, 1, &t.version);
            put_str(&mut tls, 2, &t.negotiated_protocol);
            put_str(&mut tls, 3, &t.server_name);
            put_str(&mut tls, 4, &t.cipher_suite);
            put_bytes(&mut assertions, 5, &tls);
        }
        let mut out = Vec::new();
        put_bytes(&mut out, 1, &assertions);
        put_bytes(&mut out, 2, &[]);
        out
    }

    /// Decode the protobuf encoding (unknown fields are skipped).
    pub fn decode(bytes: &[u8]) -> Result<EchoResponse, DecodeError> {
        let mut r = EchoResponse::default();
        for field in fields(bytes) {
            let (number, value) = field?;
            if number == 1 {
                r.assertions = decode_assertions(value)?;
            }
        }
        Ok(r)
    }
}

fn decode_assertions(bytes: &[u8]) -> Result<Assertions, DecodeError> {
    let mut a = Assertions::default();
    for field in fields(bytes) {
        match field? {
            (1, v) => a.fully_qualified_method = string(v)?,
            (2, v) => {
                let (mut key, mut value) = (String::new(), String::new());
                for f in fields(v) {
                    match f? {
                        (1, k) => key = string(k)?,
                        (2, x) => value = string(x)?,
                        _ => {}
                    }
                }
                a.headers.push((key, value));
            }
            (3, v) => a.authority = string(v)?,
            (4, v) => {
                for f in fields(v) {
                    match f? {
                        (1, x) => a.context.namespace = string(x)?,
                        (2, x) => a.context.ingress = string(x)?,
                        (3, x) => a.context.service_name = string(x)?,
                        (4, x) => a.context.pod = string(x)?,
                        _ => {}
                    }
                }
            }
            (5, v) => {
                let mut t = TlsAssertions::default();
                for f in fields(v) {
                    match f? {
                        (1, x) => t.version = string(x)?,
                        (2, x) => t.negotiated_protocol = string(x)?,
                        (3, x) => t.server_name = string(x)?,
                        (4, x) => t.cipher_suite = string(x)?,
                        _ => {}
                    }
                }
                a.tls = Some(t);
            }
            _ => {}
        }
    }
    Ok(a)
}

/// Why a message does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed protobuf message: {0}")]
pub struct DecodeError(&'static str);

fn string(v: &[u8]) -> Result<String, DecodeError> {
    String::from_utf8(v.to_vec()).map_err(|_| DecodeError("a string is not UTF-8"))
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, DecodeError> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at).ok_or(DecodeError("truncated varint"))?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(DecodeError("varint too long"))
}

/// The length-delimited fields of a message, `(number, bytes)`; fields of
/// other wire types are skipped.
fn fields(bytes: &[u8]) -> impl Iterator<Item = Result<(u32, &[u8]), DecodeError>> {
    let mut at = 0;
    std::iter::from_fn(move || {
        loop {
            if at >= bytes.len() {
                return None;
            }
            let item = (|| {
                let tag = varint(bytes, &mut at)?;
                let number = u32::try_from(tag >> 3).map_err(|_| DecodeError("field number"))?;
                let skip = match tag & 7 {
                    0 => {
                        varint(bytes, &mut at)?;
                        return Ok(None);
                    }
                    1 => 8,
                    5 => 4,
                    2 => {
                        let len = usize::try_from(varint(bytes, &mut at)?)
                            .map_err(|_| DecodeError("length"))?;
                        let end = at.checked_add(len).filter(|e| *e <= bytes.len());
                        let end = end.ok_or(DecodeError("truncated field"))?;
                        let value = &bytes[at..end];
                        at = end;
                        return Ok(Some((number, value)));
                    }
                    _ => return Err(DecodeError("unsupported wire type")),
                };
                at += skip;
                if at > bytes.len() {
                    return Err(DecodeError("truncated field"));
                }
                Ok(None)
            })();
            match item {
                Ok(None) => continue,
                Ok(Some(f)) => return Some(Ok(f)),
                Err(e) => {
                    at = bytes.len();
                    return Some(Err(e));
                }
            }
        }
    })
}

/// gRPC's length-prefixed message framing (uncompressed).
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

/// The first message of a gRPC body.
fn unframe(body: &[u8]) -> Result<&[u8], DecodeError> {
    let (head, rest) = body
        .split_first_chunk::<5>()
        .ok_or(DecodeError("no message"))?;
    if head[0] != 0 {
        return Err(DecodeError("compressed message"));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    rest.get(..len).ok_or(DecodeError("truncated message"))
}

type GrpcBody = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

/// A running gRPC echo backend; dropping it stops it.
pub struct GrpcEchoServer {
    local_addr: SocketAddr,
    calls: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Drop for GrpcEchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GrpcEchoServer {
    /// Serve gRPC over HTTP/2 with prior knowledge (h2c) on a free
    /// loopback port.
    pub async fn start(identity: EchoIdentity) -> io::Result<GrpcEchoServer> {
        Self::start_with(identity, None).await
    }

    /// Serve gRPC over TLS (ALPN `h2`) with `tls`'s certificate.
    pub async fn start_tls(
        identity: EchoIdentity,
        tls: Arc<rustls::ServerConfig>,
    ) -> io::Result<GrpcEchoServer> {
        let mut config = (*tls).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Self::start_with(
            identity,
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
        )
        .await
    }

    async fn start_with(
        identity: EchoIdentity,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> io::Result<GrpcEchoServer> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let local_addr = listener.local_addr()?;
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        let identity = Arc::new(identity);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (identity, calls, tls) = (identity.clone(), counted.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        None => serve_connection(stream, None, identity, calls).await,
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let c = stream.get_ref().1;
                            let seen = TlsAssertions {
                                version: match c.protocol_version() {
                                    Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".into(),
                                    Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".into(),
                                    _ => String::new(),
                                },
                                negotiated_protocol: c
                                    .alpn_protocol()
                                    .map(|p| String::from_utf8_lossy(p).into_owned())
                                    .unwrap_or_default(),
                                server_name: c.server_name().unwrap_or_default().to_owned(),
                                cipher_suite: c
                                    .negotiated_cipher_suite()
                                    .map(|s| format!("{:?}", s.suite()))
                                    .unwrap_or_default(),
                            };
                            serve_connection(stream, Some(seen), identity, calls).await;
                        }
                    }
                });
            }
        });
        Ok(GrpcEchoServer {
            local_addr,
            calls,
            task,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Calls received (any method).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

async fn serve_connection<S>(
    stream: S,
    tls: Option<TlsAssertions>,
    identity: Arc<EchoIdentity>,
    calls: Arc<AtomicU64>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<Incoming>| {
        let (identity, calls, tls) = (identity.clone(), calls.clone(), tls.clone());
        async move { Ok::<_, Infallible>(answer(req, &identity, tls, &calls).await) }
    });
    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// The answer to one call: `Echo` and `EchoTwo` echo, anything else is
/// UNIMPLEMENTED.
async fn answer(
    req: Request<Incoming>,
    identity: &EchoIdentity,
    tls: Option<TlsAssertions>,
    calls: &AtomicU64,
) -> Response<GrpcBody> {
    calls.fetch_add(1, Ordering::Relaxed);
    let path = req.uri().path().to_owned();
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    // The request message (EchoRequest is empty) is read and dropped.
    let _ = req.into_body().collect().await;
    let method = path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .filter(|(service, _)| *service == SERVICE)
        .map(|(_, m)| m);
    if !matches!(method, Some("Echo" | "EchoTwo")) {
        return status_only(code::UNIMPLEMENTED, &format!("unknown method {path}"));
    }
    let response = EchoResponse {
        assertions: Assertions {
            fully_qualified_method: path,
            headers,
            authority,
            context: Context {
                namespace: identity.namespace.clone(),
                ingress: String::new(),
                service_name: identity.service.clone(),
                pod: identity.pod.clone(),
            },
            tls,
        },
    };
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(code::OK));
    let frames = vec![
        Ok(Frame::data(frame(&response.encode()))),
        Ok(Frame::trailers(trailers)),
    ];
    let mut resp = Response::new(StreamBody::new(stream::iter(frames)).boxed_unsync());
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    resp
}

/// A Trailers-Only answer with `code`.
fn status_only(code: u32, message: &str) -> Response<GrpcBody> {
    let mut resp = Response::new(Full::new(Bytes::new()).boxed_unsync());
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert("grpc-status", HeaderValue::from(code));
    if let Ok(v) = HeaderValue::from_str(message) {
        h.insert("grpc-message", v);
    }
    resp
}

/// The outcome of one call.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `grpc-status`, from the trailers or a Trailers-Only answer; without
    /// one, the gRPC project's mapping of the HTTP status (a proxy that
    /// answered in HTTP).
    pub code: u32,
    pub message: String,
    /// The HTTP status (200 for every gRPC answer).
    pub http_status: u16,
    /// Response headers (initial metadata).
    pub headers: HeaderMap,
    pub response: Option<EchoResponse>,
}

/// Call `/<SERVICE>/<method>` of the echo service over `io`, an open
/// connection (cleartext or TLS) on which HTTP/2 starts with the client
/// preface, with `:authority` `authority` and `metadata` as request
/// headers.
pub async fn call<S>(
    io: S,
    authority: &str,
    method: &str,
    metadata: &[(String, String)],
) -> Result<Reply, CallError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .map_err(CallError::Http2)?;
    tokio::spawn(connection);
    let mut request = Request::post(format!("http://{authority}/{SERVICE}/{method}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers");
    for (k, v) in metadata {
        request = request.header(k.as_str(), v.as_str());
    }
    let request = request
        .body(Full::new(frame(&[])))
        .map_err(|e| CallError::Request(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(CallError::Http2)?;
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.map_err(CallError::Http2)?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let data = collected.to_bytes();
    let status_of = |h: &HeaderMap| {
        h.get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok())
    };
    let code = status_of(&parts.headers)
        .or_else(|| status_of(&trailers))
        .unwrap_or(match parts.status.as_u16() {
            400 => code::INTERNAL,
            404 => code::UNIMPLEMENTED,
            429 | 502 | 503 | 504 => code::UNAVAILABLE,
            _ => code::UNKNOWN,
        });
    let message = parts
        .headers
        .get("grpc-message")
        .or_else(|| trailers.get("grpc-message"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let response = if code == code::OK && !data.is_empty() {
        Some(
            EchoResponse::decode(unframe(&data).map_err(CallError::Decode)?)
                .map_err(CallError::Decode)?,
        )
    } else {
        None
    };
    Ok(Reply {
        code,
        message,
        http_status: parts.status.as_u16(),
        headers: parts.headers,
        response,
    })
}

/// [`call`] over a new cleartext connection to `addr` (h2c).
pub async fn call_h2c(
    addr: SocketAddr,
    authority: &str,
    method: &str,
    metadata: &[(String, String)],
) -> Result<Reply, CallError> {
    let stream = TcpStream::connect(addr).await.map_err(CallError::Connect)?;
    let _ = stream.set_nodelay(true);
    call(stream, authority, method, metadata).await
}

/// Why a call got no gRPC answer at all.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot connect: {0}")]
    Connect(#[source] io::Error),
    #[error("HTTP/2: {0}")]
    Http2(#[source] hyper::Error),
    #[error("cannot build the request: {0}")]
    Request(String),
    #[error("{0}")]
    Decode(#[source] DecodeError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_responses_round_trip_through_the_wire_format() {
        let r = EchoResponse {
            assertions: Assertions {
                fully_qualified_method: format!("/{SERVICE}/Echo"),
                headers: vec![
                    ("version".into(), "one".into()),
                    ("x".into(), String::new()),
                ],
                authority: "foo.bar.com".into(),
                context: Context {
                    namespace: "infra".into(),
                    ingress: String::new(),
                    service_name: "svc".into(),
                    pod: "grpc-infra-backend-v1-0".into(),
                },
                tls: Some(TlsAssertions {
                    version: "TLSv1.3".into(),
                    server_name: "abc.example.com".into(),
                    ..TlsAssertions::default()
                }),
            },
        };
        assert_eq!(EchoResponse::decode(&r.encode()), Ok(r));
    }

    #[test]
    fn the_encoding_is_protobufs() {
        // A hand-checked encoding: field 1 (Assertions) holding field 3
        // (authority) "ab", an empty Context (4), then field 2, empty.
        let r = EchoResponse {
            assertions: Assertions {
                authority: "ab".into(),
                ..Assertions::default()
            },
        };
        assert_eq!(
            r.encode(),
            [0x0a, 0x06, 0x1a, 0x02, b'a', b'b', 0x22, 0x00, 0x12, 0x00]
        );
        // Unknown fields of every wire type are skipped.
        let mut with_unknown = vec![0x08, 0x96, 0x01, 0x11];
        with_unknown.extend([0; 8]);
        with_unknown.extend([0x1d, 0, 0, 0, 0]);
        with_unknown.extend(r.encode());
        assert_eq!(EchoResponse::decode(&with_unknown), Ok(r));
        assert!(EchoResponse::decode(&[0x0a, 0x05, 0x01]).is_err());
        assert_eq!(unframe(&frame(b"xyz")), Ok(&b"xyz"[..]));
        assert!(unframe(&[0, 0, 0, 0, 9, 1]).is_err());
    }

    #[tokio::test]
    async fn echo_and_echo_two_answer_and_echo_three_is_unimplemented() {
        let server = GrpcEchoServer::start(EchoIdentity {
            pod: "p-1".into(),
            namespace: "ns".into(),
            service: "s".into(),
        })
        .await
        .expect("server");
        let md = vec![("version".to_owned(), "two".to_owned())];
        let reply = call_h2c(server.local_addr(), "a.example.com", "EchoTwo", &md)
            .await
            .expect("answered");
        assert_eq!(reply.code, code::OK);
        let a = reply.response.expect("a response").assertions;
        assert_eq!(a.fully_qualified_method, format!("/{SERVICE}/EchoTwo"));
        assert_eq!(a.authority, "a.example.com");
        assert_eq!(a.header("version"), ["two"]);
        assert_eq!(a.context.pod, "p-1");
        let three = call_h2c(server.local_addr(), "a", "EchoThree", &[])
            .await
            .expect("answered");
        assert_eq!(three.code, code::UNIMPLEMENTED);
        assert!(three.response.is_none());
        assert_eq!(server.calls(), 2);
    }
}
