//! The echo backend over real sockets: what it reports, what it counts, and
//! that shutting it down closes its port.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice::echo::{self, EchoIdentity, EchoResponse};
use tokio::net::TcpStream;

fn identity() -> EchoIdentity {
    EchoIdentity {
        pod: "web-7d9f-abcde".to_owned(),
        namespace: "shop".to_owned(),
        service: "web".to_owned(),
    }
}

async fn start() -> echo::EchoServer {
    echo::start("127.0.0.1:0".parse().expect("literal address"), identity())
        .await
        .expect("bind an ephemeral loopback port")
}

/// One HTTP/1.1 keep-alive connection.
async fn h1(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect to echo");
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("http1 handshake");
    tokio::spawn(connection);
    sender
}

async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> (http::response::Parts, Bytes) {
    let response = sender.send_request(request).await.expect("response");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("response body").to_bytes();
    (parts, body)
}

#[tokio::test]
async fn echoes_request_like_echo_basic() {
    let server = start().await;
    let mut sender = h1(server.local_addr()).await;
    let request = Request::post("/shop/cart?item=42&qty=2")
        .header("host", "shop.example.com")
        .header("x-request-id", "one")
        .header("X-Multi", "a")
        .header("x-multi", "b")
        .body(Full::new(Bytes::from_static(b"hello body")))
        .expect("valid request");
    let (parts, body) = send(&mut sender, request).await;

    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(parts.headers["content-type"], "application/json");
    let echoed: EchoResponse = serde_json::from_slice(&body).expect("echo JSON");
    assert_eq!(echoed.path, "/shop/cart?item=42&qty=2");
    assert_eq!(echoed.host, "shop.example.com");
    assert_eq!(echoed.method, "POST");
    assert_eq!(echoed.proto, "HTTP/1.1");
    assert_eq!(echoed.pod, "web-7d9f-abcde");
    assert_eq!(echoed.namespace, "shop");
    assert_eq!(echoed.service, "web");
    assert_eq!(echoed.ingress, "");
    assert_eq!(echoed.body_bytes, 10);
    assert_eq!(
        echoed.headers.get("X-Request-Id"),
        Some(&vec!["one".to_owned()])
    );
    assert_eq!(
        echoed.headers.get("X-Multi"),
        Some(&vec!["a".to_owned(), "b".to_owned()])
    );
    assert!(!echoed.headers.contains_key("Host"), "{:?}", echoed.headers);
    assert_eq!(
        echoed.header("content-length"),
        Some(&["10".to_owned()][..])
    );

    // The raw JSON uses echo-basic's field names.
    let raw: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    for field in [
        "path",
        "host",
        "method",
        "proto",
        "headers",
        "namespace",
        "ingress",
        "service",
        "pod",
    ] {
        assert!(raw.get(field).is_some(), "missing {field} in {raw}");
    }
}

#[tokio::test]
async fn counts_every_request_on_one_keep_alive_connection() {
    let server = start().await;
    let mut sender = h1(server.local_addr()).await;
    for i in 0..25 {
        let request = Request::get(format!("/n/{i}"))
            .header("host", "a")
            .body(Full::new(Bytes::new()))
            .expect("valid request");
        let (parts, _) = send(&mut sender, request).await;
        assert_eq!(parts.status, StatusCode::OK);
    }
    assert_eq!(server.requests(), 25);
    let recent = server.recent();
    assert_eq!(recent.len(), 25);
    assert_eq!(recent[0].path, "/n/0");
    assert_eq!(recent[24].path, "/n/24");
}

#[tokio::test]
async fn sets_response_headers_and_status_on_request() {
    let server = start().await;
    let mut sender = h1(server.local_addr()).await;
    let request = Request::get("/")
        .header("host", "a")
        .header(
            "x-echo-set-header",
            "X-Header-Set-1: one, x-header-set-2:two",
        )
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let (parts, _) = send(&mut sender, request).await;
    assert_eq!(parts.headers["x-header-set-1"], "one");
    assert_eq!(parts.headers["x-header-set-2"], "two");

    let request = Request::get("/status/503")
        .header("host", "a")
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let (parts, body) = send(&mut sender, request).await;
    assert_eq!(parts.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.is_empty());

    let request = Request::get("/status/abc")
        .header("host", "a")
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let (parts, _) = send(&mut sender, request).await;
    assert_eq!(parts.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn delays_when_asked() {
    let server = start().await;
    let mut sender = h1(server.local_addr()).await;
    let started = Instant::now();
    let request = Request::get("/slow?delay_ms=150")
        .header("host", "a")
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let (parts, _) = send(&mut sender, request).await;
    assert_eq!(parts.status, StatusCode::OK);
    // A lower bound only: the server must not answer before the delay.
    assert!(started.elapsed() >= Duration::from_millis(150));

    let request = Request::get("/slow?delay=forever")
        .header("host", "a")
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let (parts, _) = send(&mut sender, request).await;
    assert_eq!(parts.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn can_be_told_to_fail_or_slow_down_while_running() {
    let server = start().await;
    let mut sender = h1(server.local_addr()).await;
    let get = || {
        Request::get("/x")
            .header("host", "a")
            .body(Full::new(Bytes::new()))
            .expect("valid request")
    };
    server.fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    let (parts, body) = send(&mut sender, get()).await;
    assert_eq!(parts.status, StatusCode::INTERNAL_SERVER_ERROR);
    let echoed: EchoResponse = serde_json::from_slice(&body).expect("echo body kept");
    assert_eq!(echoed.pod, "web-7d9f-abcde");
    server.fail_with(None);
    server.delay_by(Duration::from_millis(120));
    let started = Instant::now();
    let (parts, _) = send(&mut sender, get()).await;
    assert_eq!(parts.status, StatusCode::OK);
    // A lower bound only: the server must not answer before the delay.
    assert!(started.elapsed() >= Duration::from_millis(120));
    assert_eq!(server.requests(), 2);
}

#[tokio::test]
async fn serves_h2c_with_prior_knowledge() {
    let server = start().await;
    let stream = TcpStream::connect(server.local_addr())
        .await
        .expect("connect to echo");
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(connection);
    let request = Request::get("http://h2.example.com/x?y=1")
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let response = sender.send_request(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let echoed: EchoResponse = serde_json::from_slice(&body).expect("echo JSON");
    assert_eq!(echoed.proto, "HTTP/2.0");
    assert_eq!(echoed.host, "h2.example.com");
    assert_eq!(echoed.path, "/x?y=1");
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn shutdown_closes_the_port() {
    let server = start().await;
    let addr = server.local_addr();
    let mut sender = h1(addr).await;
    let request = Request::get("/")
        .header("host", "a")
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let (parts, _) = send(&mut sender, request).await;
    assert_eq!(parts.status, StatusCode::OK);

    server.shutdown().await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "connection to a shut down echo server was accepted"
    );
    // The idle keep-alive connection is closed too (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sender.is_closed() {
        assert!(
            Instant::now() < deadline,
            "keep-alive connection still open after shutdown"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
