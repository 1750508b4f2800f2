//! When a backend's own endpoints misbehave: passive outlier ejection
//! within the backend (its share never moves to another backend), and the
//! per-backend cap on requests in flight that answers 503 at once instead
//! of piling requests up behind a stalled backend.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::support::*;

/// A backend that answers every request with `status`, and counts them.
struct Answering {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
}

impl Answering {
    async fn start(status: StatusCode) -> Answering {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("backend binds");
        let addr = listener.local_addr().expect("local addr");
        let requests = Arc::new(AtomicU64::new(0));
        let count = requests.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |_: Request<Incoming>| {
                        count.fetch_add(1, Ordering::Relaxed);
                        let mut resp = Response::new(Full::new(Bytes::from_static(b"no\n")));
                        *resp.status_mut() = status;
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Answering { addr, requests }
    }
}

/// A backend that accepts connections and never answers; it counts them.
struct Stalled {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
}

impl Stalled {
    async fn start() -> Stalled {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("backend binds");
        let addr = listener.local_addr().expect("local addr");
        let accepted = Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::Relaxed);
                held.push(stream);
            }
        });
        Stalled { addr, accepted }
    }
}

/// Issue #15's scenario: of five endpoints, one answers 503 and another
/// refuses connections. Both are ejected after five failed tries in a row,
/// and the backend's requests succeed again, while the backend keeps
/// exactly its share of the route (nothing moves to the other backend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_endpoints_are_ejected_within_their_backend_and_its_share_stays() {
    let good = Pods::start("default", "app", 3).await;
    let failing = Answering::start(StatusCode::SERVICE_UNAVAILABLE).await;
    let refused = free_port();
    let other = Pods::start("default", "other", 1).await;
    let mut ports: Vec<u16> = good.servers.iter().map(|s| s.local_addr().port()).collect();
    ports.extend([failing.addr.port(), refused]);
    let r = route(
        "default",
        "r",
        "  rules:\n  - backendRefs:\n    - {name: app, port: 8080, weight: 1}\n    - {name: other, port: 8080, weight: 1}",
    );
    let manifests = gateway()
        + &static_service_endpoints("app", None, 8080, None, &ports)
        + &other.manifests()
        + &r;
    // Ejections last long enough that a slow machine cannot see one end.
    let gw = Sluice::start_with(
        &[("all.yaml", manifests)],
        &["--outlier-ejection-time", "10m"],
    )
    .await;
    let app = r#"{backend="default/app:8080"}"#;
    let mut c = gw.connect().await;
    poll_until(
        "both failing endpoints ejected",
        || gw.log(),
        async || {
            c.tally(20, "h", "/", &[]).await;
            metric(
                &gw.metrics().await,
                &format!("sluice_endpoints_ejected{app}"),
            ) == Some(2.0)
        },
    )
    .await;

    let seen_by_failing = failing.requests.load(Ordering::Relaxed);
    let tally = c.tally(400, "h", "/", &[]).await;
    let to_other = tally.get("other-0").copied().unwrap_or(0);
    let app_share = 400 - to_other;
    let app_ok: usize = (0..3)
        .map(|i| tally.get(&format!("app-{i}")).copied().unwrap_or(0))
        .sum();
    assert_eq!(app_share, 200, "the backend keeps its share: {tally:?}");
    assert!(
        app_ok * 100 > app_share * 99,
        "success rate of the backend above 99%: {tally:?}"
    );
    assert_eq!(
        failing.requests.load(Ordering::Relaxed),
        seen_by_failing,
        "the ejected endpoint gets no new requests"
    );

    let m = gw.metrics().await;
    for reason in ["5xx", "connect_failure"] {
        let series = format!(
            r#"sluice_outlier_ejections_total{{backend="default/app:8080",reason="{reason}"}}"#
        );
        assert_eq!(metric(&m, &series), Some(1.0), "{series} in\n{m}");
    }
    let (code, body) = admin_get(gw.admin, "/endpoints")
        .await
        .expect("admin answers");
    assert_eq!(code, StatusCode::OK);
    let endpoints: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    let mut ejected: Vec<(String, String)> = endpoints
        .as_array()
        .expect("an array")
        .iter()
        .filter(|e| e["ejected"] == true)
        .map(|e| {
            assert_eq!(e["backend"], "default/app:8080", "{e:#}");
            assert!(e["since"].is_string(), "{e:#}");
            assert!(
                e["remainingSeconds"].as_u64().is_some_and(|s| s > 0),
                "{e:#}"
            );
            (
                e["endpoint"].as_str().expect("address").to_string(),
                e["lastFailure"].as_str().expect("why").to_string(),
            )
        })
        .collect();
    ejected.sort();
    let mut want = vec![
        (failing.addr.to_string(), "5xx".to_string()),
        (
            format!("127.0.0.1:{refused}"),
            "connect_failure".to_string(),
        ),
    ];
    want.sort();
    assert_eq!(ejected, want, "{endpoints:#}");
    let log = gw.log();
    assert_eq!(log.matches("endpoint ejected").count(), 2, "{log}");
}

/// With one endpoint answering 503 out of two, the backend keeps one:
/// at most half of a backend's endpoints are ever ejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_always_keeps_at_least_half_of_its_endpoints() {
    let failing = Answering::start(StatusCode::INTERNAL_SERVER_ERROR).await;
    let failing_too = Answering::start(StatusCode::BAD_GATEWAY).await;
    let manifests = gateway()
        + &static_service_endpoints(
            "app",
            None,
            8080,
            None,
            &[failing.addr.port(), failing_too.addr.port()],
        )
        + &route(
            "default",
            "r",
            "  rules:\n  - backendRefs: [{name: app, port: 8080}]",
        );
    let gw = Sluice::start(&[("all.yaml", manifests)]).await;
    let mut c = gw.connect().await;
    let tally = c.tally(40, "h", "/", &[]).await;
    assert_eq!(tally.values().sum::<usize>(), 40, "{tally:?}");
    // One is ejected after its fifth failure; the other keeps every
    // request since.
    assert_eq!(
        metric(
            &gw.metrics().await,
            r#"sluice_endpoints_ejected{backend="default/app:8080"}"#
        ),
        Some(1.0)
    );
    let (a, b) = (
        failing.requests.load(Ordering::Relaxed),
        failing_too.requests.load(Ordering::Relaxed),
    );
    assert_eq!(a + b, 40);
    assert!(
        a.min(b) >= 5 && a.min(b) <= 6,
        "the first ejected at its fifth failure: {a} {b}"
    );
}

/// A backend that never answers fills its cap of requests in flight; past
/// the cap its requests get 503 at once, counted with the reason, and the
/// other backend of the gateway is served all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_backend_fills_its_cap_and_the_others_are_served() {
    let stalled = Stalled::start().await;
    let app = Pods::start("default", "app", 1).await;
    let routes = route(
        "default",
        "stalled",
        "  hostnames: [stalled.example]\n  rules:\n  - backendRefs: [{name: stalled, port: 8080}]",
    ) + &route(
        "default",
        "app",
        "  hostnames: [app.example]\n  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let manifests = gateway()
        + &static_service("stalled", None, 8080, None, stalled.addr.port())
        + &app.manifests()
        + &routes;
    let gw = Sluice::start_with(
        &[("all.yaml", manifests)],
        &[
            "--max-requests-per-backend",
            "4",
            "--backend-timeout",
            "10m",
        ],
    )
    .await;
    let addr = gw.addr();
    let waiting: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move { Conn::open(addr).await.get("stalled.example", "/").await })
        })
        .collect();
    poll_until(
        "four requests held by the stalled backend",
        || gw.log(),
        async || stalled.accepted.load(Ordering::Relaxed) == 4,
    )
    .await;

    let mut c = gw.connect().await;
    for i in 0..5 {
        let r = c.get("stalled.example", "/").await;
        assert_eq!(
            r.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "over the cap {i}"
        );
        assert_eq!(r.body, "backend overloaded\n");
    }
    let tally = c.tally(100, "app.example", "/", &[]).await;
    assert_eq!(tally.get("app-0"), Some(&100), "{tally:?}");
    let m = gw.metrics().await;
    assert_eq!(
        metric(
            &m,
            r#"sluice_requests_rejected_total{backend="default/stalled:8080",reason="backend_overloaded"}"#
        ),
        Some(5.0),
        "{m}"
    );
    assert_eq!(
        stalled.accepted.load(Ordering::Relaxed),
        4,
        "nothing more reached it"
    );
    assert!(waiting.iter().all(|w| !w.is_finished()), "still waiting");
    for w in waiting {
        w.abort();
    }
    // Their places are given back when the clients give up: a new request
    // reaches the stalled backend again.
    poll_until(
        "the stalled backend's cap frees",
        || gw.log(),
        async || {
            tokio::spawn(async move { Conn::open(addr).await.get("stalled.example", "/").await });
            stalled.accepted.load(Ordering::Relaxed) > 4
        },
    )
    .await;
}
