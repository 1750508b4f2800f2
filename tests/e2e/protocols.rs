//! Protocols through the binary: WebSocket upgrades passed through (to a
//! Service port with `appProtocol: kubernetes.io/ws` and to an ordinary
//! one), an upgraded connection that outlives a reload, HTTP/2 with prior
//! knowledge to `kubernetes.io/h2c` backends and from h2c clients.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{Pods, Sluice, gateway, route, static_service};

/// Upper bound for one step of a test; reaching it is a failure.
const STEP: Duration = Duration::from_secs(15);

/// A tiny upgrade backend: answers any request that asks for
/// `Upgrade: websocket` with 101 and then echoes every byte back; anything
/// else gets 400. Records the request heads it saw.
struct UpgradeBackend {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl UpgradeBackend {
    async fn start() -> UpgradeBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Ok(head) = read_head(&mut stream).await else {
                        return;
                    };
                    let lower = head.to_ascii_lowercase();
                    seen.lock().unwrap().push(head);
                    if !lower.contains("\r\nupgrade: websocket\r\n") {
                        let _ = stream
                            .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                            .await;
                        return;
                    }
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                        )
                        .await;
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        UpgradeBackend { addr, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }

    /// Service `name` (port 8080, with `appProtocol` when given) and its
    /// EndpointSlice.
    fn manifests(&self, name: &str, app_protocol: Option<&str>) -> String {
        static_service(name, None, 8080, app_protocol, self.addr.port())
    }
}

/// Read an HTTP head (up to the blank line) byte by byte, so nothing after
/// it is consumed.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// Open a connection to the gateway and ask to upgrade `path` on `host`.
/// Returns the response head and the connection.
async fn upgrade(sluice: &Sluice, host: &str, path: &str) -> (String, TcpStream) {
    let mut stream = TcpStream::connect(sluice.addr()).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    let head = tokio::time::timeout(STEP, read_head(&mut stream))
        .await
        .expect("response head in time")
        .expect("a response head");
    (head, stream)
}

/// Write `msg` and read back exactly as many bytes.
async fn echo(stream: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    stream.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(STEP, stream.read_exact(&mut back))
        .await
        .expect("echo in time")
        .expect("echoed bytes");
    back
}

fn ws_routes() -> String {
    let mut out = route(
        "default",
        "ws",
        "  hostnames: [ws.example]\n  rules:\n  - matches: [{path: {type: PathPrefix, value: /ws}}]\n    backendRefs: [{name: ws, port: 8080}]\n  - matches: [{path: {type: PathPrefix, value: /plain}}]\n    backendRefs: [{name: plain-upgrade, port: 8080}]",
    );
    out.push_str(&route(
        "default",
        "echo",
        "  hostnames: [echo.example]\n  rules:\n  - backendRefs: [{name: echo, port: 8080}]",
    ));
    out
}

#[tokio::test]
async fn websocket_upgrades_pass_through_and_outlive_a_reload() {
    let ws = UpgradeBackend::start().await;
    let plain = UpgradeBackend::start().await;
    let pods = Pods::start("default", "echo", 1).await;
    let backends = format!(
        "{}{}{}",
        ws.manifests("ws", Some("kubernetes.io/ws")),
        plain.manifests("plain-upgrade", None),
        pods.manifests()
    );
    let sluice = Sluice::start(&[
        ("gateway.yaml", gateway()),
        ("routes.yaml", ws_routes()),
        ("backends.yaml", backends),
    ])
    .await;

    // appProtocol kubernetes.io/ws, and an ordinary Service port: the same.
    let (head, mut conn) = upgrade(&sluice, "ws.example", "/ws/chat").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("\r\nupgrade: websocket\r\n"), "{head}");
    assert!(lower.contains("\r\nconnection: upgrade\r\n"), "{head}");
    assert_eq!(echo(&mut conn, b"hello over ws").await, b"hello over ws");
    let seen = ws.heads().pop().expect("the ws backend saw the request");
    assert!(seen.starts_with("GET /ws/chat HTTP/1.1\r\n"), "{seen}");
    assert!(
        seen.to_ascii_lowercase()
            .contains("sec-websocket-key: dghlihnhbxbszsbub25jzq=="),
        "{seen}"
    );

    let (head, mut other) = upgrade(&sluice, "ws.example", "/plain").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert_eq!(echo(&mut other, b"plain backend").await, b"plain backend");

    // Reload: a new rule appears; the upgraded connection keeps working.
    let mut routes = ws_routes();
    routes.push_str(&route(
        "default",
        "after-reload",
        "  hostnames: [new.example]\n  rules:\n  - backendRefs: [{name: echo, port: 8080}]",
    ));
    sluice.write("routes.yaml", &routes);
    sluice
        .eventually("new.example", "/", |r| r.status == StatusCode::OK)
        .await;
    for i in 0..3 {
        let msg = format!("after reload {i}");
        assert_eq!(echo(&mut conn, msg.as_bytes()).await, msg.as_bytes());
    }

    // A request without Upgrade to the same backend is an ordinary one.
    let mut c = sluice.connect().await;
    assert_eq!(
        c.get("ws.example", "/ws/x").await.status,
        StatusCode::BAD_REQUEST
    );
    let last = ws.heads().pop().unwrap().to_ascii_lowercase();
    assert!(!last.contains("upgrade"), "hop-by-hop stripped: {last}");
}

#[tokio::test]
async fn h2c_backends_get_http2_and_h2c_clients_are_served() {
    let pods = Pods::start("default", "grpcish", 1).await;
    let backends = pods.manifests().replacen(
        "  - port: 8080\n",
        "  - port: 8080\n    appProtocol: kubernetes.io/h2c\n",
        1,
    );
    assert!(backends.contains("kubernetes.io/h2c"));
    let plain = Pods::start("default", "plain", 1).await;
    let routes = format!(
        "{}{}",
        route(
            "default",
            "h2c",
            "  hostnames: [h2c.example]\n  rules:\n  - backendRefs: [{name: grpcish, port: 8080}]",
        ),
        route(
            "default",
            "plain",
            "  hostnames: [plain.example]\n  rules:\n  - backendRefs: [{name: plain, port: 8080}]",
        )
    );
    let sluice = Sluice::start(&[
        ("gateway.yaml", gateway()),
        ("routes.yaml", routes),
        ("backends.yaml", format!("{backends}{}", plain.manifests())),
    ])
    .await;

    // HTTP/1.1 client, h2c backend.
    let mut c = sluice.connect().await;
    let r = c.get("h2c.example", "/over-h2").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.echo().proto, "HTTP/2.0");
    assert_eq!(r.echo().path, "/over-h2");
    // ... and an ordinary backend still gets HTTP/1.1.
    assert_eq!(c.get("plain.example", "/").await.echo().proto, "HTTP/1.1");

    // h2c client (prior knowledge) on the plain listener.
    let stream = TcpStream::connect(sluice.addr()).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .expect("h2c handshake");
    tokio::spawn(conn);
    let deadline = Instant::now() + STEP;
    for (host, proto) in [("h2c.example", "HTTP/2.0"), ("plain.example", "HTTP/1.1")] {
        let req = Request::get(format!("http://{host}/from-h2c"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.expect("gateway answers");
        assert_eq!(resp.version(), Version::HTTP_2);
        assert_eq!(resp.status(), StatusCode::OK);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let echo: sluice::echo::EchoResponse = serde_json::from_slice(&body).unwrap();
        assert_eq!(echo.proto, proto, "{host}");
        assert_eq!(echo.host, host);
        assert!(Instant::now() < deadline);
    }
}
