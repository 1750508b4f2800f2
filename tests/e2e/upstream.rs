//! The backend side of the lean HTTP/1.1 path (issue 13): sluice's own
//! client and keep-alive pool towards backends. Backends here are raw
//! sockets that count their connections, so reuse (and its absence) is
//! seen from the backend's side.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::*;

/// What the backend does with one request.
enum Reply {
    /// Write these bytes and wait for the next request.
    Keep(Vec<u8>),
    /// Write these bytes and close the connection.
    Close(Vec<u8>),
    /// Write these bytes (a 101 and what follows it), then echo what comes
    /// until the connection closes.
    Switch(Vec<u8>),
    /// Write this head (its Content-Length far beyond what follows), then
    /// body bytes until the connection fails: a body no buffer can hold,
    /// so only the gateway closing the connection ends it.
    Endless(Vec<u8>),
}

/// A keep-alive HTTP/1.1 backend written as raw bytes: `answer` gets each
/// request's head (lower-cased) and body (Content-Length only).
struct Backend {
    port: u16,
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

impl Backend {
    async fn start(answer: fn(&str, &[u8]) -> Reply) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let (a, c) = (accepted.clone(), closed.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let c = c.clone();
                tokio::spawn(async move {
                    serve(stream, answer).await;
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Backend {
            port,
            accepted,
            closed,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Wait (bounded) until `n` of its connections have closed.
    async fn wait_closed(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.closed.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < deadline, "{n} connections never closed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn serve(mut stream: TcpStream, answer: fn(&str, &[u8]) -> Reply) {
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        buf.drain(..end);
        if head.contains("expect: 100-continue") {
            let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
            if stream.write_all(interim).await.is_err() {
                return;
            }
        }
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        while buf.len() < length {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..length).collect();
        match answer(&head, &body) {
            Reply::Keep(bytes) => {
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Reply::Close(bytes) => {
                let _ = stream.write_all(&bytes).await;
                return;
            }
            Reply::Endless(head) => {
                if stream.write_all(&head).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; 64 << 10];
                while stream.write_all(&chunk).await.is_ok() {}
                return;
            }
            Reply::Switch(bytes) => {
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
                if !buf.is_empty() && stream.write_all(&buf).await.is_err() {
                    return;
                }
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                return;
            }
        }
    }
}

async fn gateway_to(backend: &Backend) -> Sluice {
    let routes = route(
        "default",
        "r",
        "  rules:\n  - backendRefs: [{name: raw, port: 8080}]",
    );
    let manifests = gateway() + &routes + &static_service("raw", None, 8080, None, backend.port);
    Sluice::start(&[("all.yaml", manifests)]).await
}

/// Send `request` on a new connection and read until the gateway closes
/// it (the request says `Connection: close`).
async fn exchange(gw: &Sluice, request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out))
        .await
        .expect("the gateway answers and closes")
        .expect("read");
    out
}

const CHUNKED_BODY: &[u8] = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-checksum: 42\r\n\r\n";

fn answers(head: &str, body: &[u8]) -> Reply {
    let target = head.split(' ').nth(1).unwrap_or("/").to_string();
    let ok = |body: &[u8]| {
        let mut r =
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
        r.extend_from_slice(body);
        r
    };
    match target.as_str() {
        "/chunked" => {
            let mut r = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            r.extend_from_slice(CHUNKED_BODY);
            Reply::Keep(r)
        }
        "/cl-and-te" => Reply::Keep(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(),
        ),
        "/cl-differ" => Reply::Keep(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!".to_vec(),
        ),
        "/bad-chunk" => Reply::Keep(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n".to_vec(),
        ),
        "/bare-lf" => Reply::Keep(b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok".to_vec()),
        "/close" => Reply::Close(
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok".to_vec(),
        ),
        // Answered as keep-alive, then closed anyway.
        "/closes-after" => Reply::Close(ok(b"ok")),
        // 4 MiB used to fit in loopback's socket buffers on a slow machine,
        // so the gateway could read it all and rightly keep the connection.
        "/big" => Reply::Endless(b"HTTP/1.1 200 OK\r\ncontent-length: 1099511627776\r\n\r\n".to_vec()),
        // The backend's first frame comes in the same write as its 101.
        "/ws" if head.contains("upgrade: websocket") => Reply::Switch(
            b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\nhello-from-backend;"
                .to_vec(),
        ),
        _ => Reply::Keep(ok(body)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_response_is_forwarded_byte_for_byte() {
    let backend = Backend::start(answers).await;
    let gw = gateway_to(&backend).await;
    let answer = exchange(
        &gw,
        b"GET /chunked HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    )
    .await;
    let (head, body) = split_answer(&answer);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    // Chunk sizes, the extension and the trailer as the backend sent them.
    assert_eq!(
        String::from_utf8_lossy(body),
        String::from_utf8_lossy(CHUNKED_BODY)
    );
    // An HTTP/1.0 client gets the body decoded, until the close.
    let answer = exchange(&gw, b"GET /chunked HTTP/1.0\r\nHost: h\r\n\r\n").await;
    let (head, body) = split_answer(&answer);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, b"hello world");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_could_be_framed_two_ways_is_a_502_and_never_forwarded() {
    let backend = Backend::start(answers).await;
    let gw = gateway_to(&backend).await;
    for path in ["/cl-and-te", "/cl-differ", "/bad-chunk", "/bare-lf"] {
        let request = format!("GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
        let answer = exchange(&gw, request.as_bytes()).await;
        let (head, body) = split_answer(&answer);
        assert!(head.starts_with("HTTP/1.1 502"), "{path}: {head}");
        assert!(
            !body.windows(5).any(|w| w == b"hello"),
            "{path}: the backend's body was forwarded"
        );
    }
    // The gateway goes on serving.
    let mut c = gw.connect().await;
    assert_eq!(c.get("h", "/fine").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_reused_but_not_after_close_or_an_unread_body() {
    let backend = Backend::start(answers).await;
    let gw = gateway_to(&backend).await;
    let mut c = gw.connect().await;
    for i in 0..5 {
        let r = c.get("h", &format!("/keep/{i}")).await;
        assert_eq!(r.status, 200);
    }
    assert_eq!(
        backend.accepted(),
        1,
        "sequential requests share a connection"
    );

    // `Connection: close` from the backend: that connection is not reused.
    assert_eq!(c.get("h", "/close").await.status, 200);
    backend.wait_closed(1).await;
    assert_eq!(c.get("h", "/after-close").await.status, 200);
    assert_eq!(backend.accepted(), 2);
    assert_eq!(c.get("h", "/again").await.status, 200);
    assert_eq!(backend.accepted(), 2, "the new connection is kept");

    // A client that goes away before the body's end: the backend's
    // connection is closed, not reused with bytes of that body on it.
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    s.write_all(b"GET /big HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 1024];
    let n = s.read(&mut first).await.unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"));
    drop(s);
    backend.wait_closed(2).await;
    let before = backend.accepted();
    assert_eq!(c.get("h", "/after-unread").await.status, 200);
    assert!(
        backend.accepted() <= before + 1,
        "one new connection at most"
    );
    let r = c.get("h", "/after-unread-2").await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_the_backend_closed_does_not_fail_the_next_request() {
    let backend = Backend::start(answers).await;
    let gw = gateway_to(&backend).await;
    let mut c = gw.connect().await;
    // The close has arrived before the next request: that connection is
    // never written to (a POST too).
    for i in 0..4 {
        assert_eq!(c.get("h", "/closes-after").await.status, 200, "try {i}");
        backend.wait_closed(i + 1).await;
        let req = http::Request::post("/echo")
            .header("host", "h")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                b"data",
            )))
            .unwrap();
        let r = c.send(req).await;
        assert_eq!(r.status, 200, "POST after a close {i}");
        assert_eq!(&r.body[..], b"data");
    }
    // The close may race the next request: a GET is sent again on a new
    // connection when its connection closes before a byte of answer.
    for i in 0..20 {
        let r = c.get("h", "/closes-after").await;
        assert_eq!(r.status, 200, "request {i} after a racing close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_goes_through_and_the_backends_interim_answer_is_dropped() {
    let backend = Backend::start(answers).await;
    let gw = gateway_to(&backend).await;
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    s.write_all(
        b"POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut interim = Vec::new();
    while !interim.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut byte))
            .await
            .expect("100 Continue in time")
            .unwrap();
        assert_eq!(n, 1, "closed before 100 Continue");
        interim.push(byte[0]);
    }
    assert!(interim.starts_with(b"HTTP/1.1 100"), "{interim:?}");
    s.write_all(b"hello").await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut rest))
        .await
        .expect("answered")
        .unwrap();
    let (head, body) = split_answer(&rest);
    // The backend's own 100 is not passed on a second time.
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, b"hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_hands_both_connections_over_with_the_bytes_after_the_101() {
    let backend = Backend::start(answers).await;
    let gw = gateway_to(&backend).await;
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await
    .unwrap();
    let want = b"hello-from-backend;ping";
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sent = false;
    while !got.ends_with(want) {
        assert!(
            Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&got)
        );
        if !sent && got.windows(4).any(|w| w == b"\r\n\r\n") {
            s.write_all(b"ping").await.unwrap();
            sent = true;
        }
        let mut chunk = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut chunk))
            .await
            .expect("bytes in time")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    let (head, rest) = split_answer(&got);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );
    assert_eq!(rest, want);
}
