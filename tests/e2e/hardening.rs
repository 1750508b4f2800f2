//! Hostile requests, as raw bytes on a socket: request smuggling through
//! ambiguous framing, malformed headers. Each must get 400 with the
//! connection closed, the backend must never see it, and a request
//! pipelined behind it must never be answered.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// A gateway whose own timeouts are an hour long, so that a connection it
/// closes within [`CLOSE_GUARD`] was closed by the refusal, not by a
/// timeout.
async fn start() -> (Sluice, Pods) {
    let app = Pods::start("default", "app", 1).await;
    let r = route(
        "default",
        "app",
        "  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let timeouts = [
        "--request-header-timeout",
        "1h",
        "--keepalive-timeout",
        "1h",
        "--request-body-timeout",
        "1h",
    ];
    (
        Sluice::start_with(
            &[("all.yaml", gateway() + &app.manifests() + &r)],
            &timeouts,
        )
        .await,
        app,
    )
}

/// How long the test waits for the gateway to close a connection it must
/// close at once (a guard against a hang, far below the gateway's hour
/// long timeouts: no close by then means it kept the connection open).
const CLOSE_GUARD: Duration = Duration::from_secs(30);

/// What the gateway answered on one connection, and whether it closed it.
struct Answer {
    text: String,
    closed: bool,
}

/// Send raw bytes followed by a well-formed pipelined request, and read
/// everything the gateway answers until it closes the connection (or
/// [`CLOSE_GUARD`] passes).
async fn raw(gw: &Sluice, bytes: &[u8]) -> Answer {
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    let mut all = bytes.to_vec();
    all.extend_from_slice(b"GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n");
    s.write_all(&all).await.unwrap();
    let mut out = Vec::new();
    // End of stream, or a reset (the pipelined bytes may be unread when
    // the gateway closes): either way the gateway ended the connection.
    let closed = tokio::time::timeout(CLOSE_GUARD, s.read_to_end(&mut out))
        .await
        .is_ok();
    Answer {
        text: String::from_utf8_lossy(&out).into_owned(),
        closed,
    }
}

/// Why the answer is wrong, if it is: it must be one 400, and the
/// connection closed after it.
fn rejection_problem(case: &str, answer: &Answer) -> Option<String> {
    if !answer.text.starts_with("HTTP/1.1 400") {
        return Some(format!(
            "{case}: expected 400, got {:?}",
            answer.text.lines().next()
        ));
    }
    if answer.text.matches("HTTP/1.1 ").count() != 1 {
        return Some(format!("{case}: the pipelined request was answered"));
    }
    if !answer.closed {
        return Some(format!(
            "{case}: the connection was still open {CLOSE_GUARD:?} after the 400"
        ));
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_is_rejected_and_never_reaches_the_backend() {
    let (gw, app) = start().await;
    let cases: &[(&str, &[u8])] = &[
        ("TE chunked, identity", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n"),
        ("TE xchunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n"),
        ("differing duplicate CL", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde"),
        ("signed CL", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +4\r\n\r\nabcd"),
        ("hex CL", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x4\r\n\r\nabcd"),
        ("overflowing CL", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\nabcd"),
        ("TE on HTTP/1.0", b"POST / HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ("malformed chunk size", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabcd\r\n0\r\n\r\n"),
    ];
    let mut problems = Vec::new();
    for (case, bytes) in cases {
        let answer = raw(&gw, bytes).await;
        problems.extend(rejection_problem(case, &answer));
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(app.requests(), 0, "a rejected request reached the backend");
}

/// Content-Length together with Transfer-Encoding: RFC 9112 section 6.1
/// lets a server reject such a request or frame it by Transfer-Encoding
/// alone, and either way close the connection after answering. sluice
/// forwards heads and bodies as the bytes they are (`proxy::h1`), so a
/// backend could frame them by the Content-Length: it rejects them, 400
/// and the connection closed, and the backend never sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_with_transfer_encoding_is_rejected_and_closed() {
    let (gw, app) = start().await;
    let cases: &[(&str, &[u8])] = &[
        ("CL and TE", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 30\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ("CL and TE with leading space", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 30\r\nTransfer-Encoding:  chunked\r\n\r\n0\r\n\r\n"),
        ("CL and TE with tab", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 30\r\nTransfer-Encoding:\tchunked\r\n\r\n0\r\n\r\n"),
        ("TE before CL", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 30\r\n\r\n0\r\n\r\n"),
    ];
    let mut problems = Vec::new();
    for (case, bytes) in cases {
        let answer = raw(&gw, bytes).await;
        problems.extend(rejection_problem(case, &answer));
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(app.requests(), 0, "a rejected request reached the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_headers_are_rejected() {
    let (gw, app) = start().await;
    let cases: &[(&str, &[u8])] = &[
        ("missing Host", b"GET / HTTP/1.1\r\nX-A: 1\r\n\r\n"),
        (
            "duplicate Host",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        ),
        (
            "space before colon",
            b"GET / HTTP/1.1\r\nHost: h\r\nX-A : 1\r\n\r\n",
        ),
        (
            "obs-fold",
            b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n  folded\r\n\r\n",
        ),
        ("bare CR", b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r2\r\n\r\n"),
        (
            "NUL in a value",
            b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\x002\r\n\r\n",
        ),
    ];
    let mut problems = Vec::new();
    for (case, bytes) in cases {
        let answer = raw(&gw, bytes).await;
        problems.extend(rejection_problem(case, &answer));
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(app.requests(), 0, "a rejected request reached the backend");
    // A well-formed request on a fresh connection still works.
    assert_eq!(gw.connect().await.get("h", "/").await.pod(), "app-0");
}

/// Host is `host[:port]` (RFC 3986), nothing a backend could read as
/// another host, a path or credentials; the same for the authority of an
/// absolute-form target, which takes the Host's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_that_are_not_host_and_port_are_refused() {
    let (gw, app) = start().await;
    let cases: &[(&str, &[u8])] = &[
        ("a space", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n"),
        ("a path", b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n"),
        ("userinfo", b"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n"),
        (
            "a port that is no number",
            b"GET / HTTP/1.1\r\nHost: a:xyz\r\n\r\n",
        ),
        (
            "userinfo in an absolute-form target",
            b"GET http://user@a/ HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
    ];
    let mut problems = Vec::new();
    for (case, bytes) in cases {
        let answer = raw(&gw, bytes).await;
        problems.extend(rejection_problem(case, &answer));
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(app.requests(), 0, "a rejected request reached the backend");
}

/// An absolute-form target names the host whatever the Host field says
/// (RFC 9112 section 3.2.2): it picks the route, and the backend gets it as
/// Host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absolute_form_target_wins_over_the_host_field() {
    let a = Pods::start("default", "a", 1).await;
    let b = Pods::start("default", "b", 1).await;
    let routes = route(
        "default",
        "a",
        "  hostnames: [a.example]\n  rules:\n  - backendRefs: [{name: a, port: 8080}]",
    ) + &route(
        "default",
        "b",
        "  hostnames: [b.example]\n  rules:\n  - backendRefs: [{name: b, port: 8080}]",
    );
    let gw = Sluice::start(&[(
        "all.yaml",
        gateway() + &a.manifests() + &b.manifests() + &routes,
    )])
    .await;
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    s.write_all(b"GET http://b.example/x HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let answer = String::from_utf8_lossy(&out);
    let (head, body) = answer.split_once("\r\n\r\n").expect("a whole answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{answer}");
    let echo: sluice::echo::EchoResponse = serde_json::from_str(body).expect("echo JSON");
    assert_eq!(echo.service, "b");
    assert_eq!(echo.host, "b.example");
    assert_eq!(a.requests(), 0);
}
