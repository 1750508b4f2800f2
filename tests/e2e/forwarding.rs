//! Forwarding: bodies streamed both ways, hop-by-hop headers removed,
//! X-Forwarded-For / X-Forwarded-Proto appended.

use bytes::Bytes;
use http_body_util::Full;

use crate::support::*;

async fn simple() -> (Sluice, Pods) {
    let app = Pods::start("default", "app", 1).await;
    let r = route(
        "default",
        "app",
        "  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    (
        Sluice::start(&[("all.yaml", gateway() + &app.manifests() + &r)]).await,
        app,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_request_body_reaches_the_backend_whole() {
    let (gw, _app) = simple().await;
    let mut c = gw.connect().await;
    let body = vec![b'x'; 8 * 1024 * 1024];
    let req = http::Request::post("/upload")
        .header("host", "h")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let r = c.send(req).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.echo().body_bytes, 8 * 1024 * 1024);
    // The connection is still usable afterwards (keep-alive).
    assert_eq!(c.get("h", "/after").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_are_removed_and_forwarded_headers_appended() {
    let (gw, _app) = simple().await;
    let mut c = gw.connect().await;
    let r = c
        .get_with(
            "h",
            "/",
            &[
                ("connection", "keep-alive, x-private-hop"),
                ("x-private-hop", "secret"),
                ("keep-alive", "timeout=5"),
                ("proxy-connection", "keep-alive"),
                ("te", "trailers"),
                ("x-forwarded-for", "203.0.113.7"),
                ("x-end-to-end", "kept"),
            ],
        )
        .await;
    let e = r.echo();
    for hop in ["x-private-hop", "keep-alive", "proxy-connection", "te"] {
        assert_eq!(
            e.header(hop),
            None,
            "{hop} crossed the gateway: {:?}",
            e.headers
        );
    }
    assert_eq!(e.header("x-end-to-end"), Some(&["kept".to_string()][..]));
    let xff = e
        .header("x-forwarded-for")
        .expect("X-Forwarded-For")
        .join(", ");
    assert_eq!(xff, "203.0.113.7, 127.0.0.1");
    assert_eq!(
        e.header("x-forwarded-proto"),
        Some(&["http".to_string()][..])
    );
    assert_eq!(e.host, "h");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_matching_route_get_404() {
    let (gw, app) = simple().await;
    let gw2 = route(
        "default",
        "only-a",
        "  hostnames: [a.example.com]\n  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    gw.write("all.yaml", &(gateway() + &app.manifests() + &gw2));
    gw.eventually("b.example.com", "/", |r| r.status == 404)
        .await;
    assert_eq!(
        gw.connect().await.get("a.example.com", "/").await.status,
        200
    );
}
