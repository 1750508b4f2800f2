//! `--io-uring` (cargo feature `io-uring`): cleartext HTTP/1.1 client
//! connections read and written through the worker's io_uring, the same
//! loop and handler as on epoll. Run with
//! `cargo test --features io-uring --test e2e io_uring`.
//!
//! Skips, saying why, where io_uring is refused (a container's seccomp
//! filter, `kernel.io_uring_disabled`): the gateway then says so and
//! serves with epoll. With `SLUICE_REQUIRE_ALL=1` that is a failure.

use std::collections::BTreeSet;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::protocols::{UpgradeBackend, echo, upgrade};
use crate::support::*;

/// Completions taken from the gateway's io_uring rings so far (each
/// ring counted once: the driver's registration is a second descriptor
/// of the same ring), from the kernel's own count in /proc.
fn uring_completions(pid: u32) -> u64 {
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the gateway's descriptors") {
        let fd = fd.unwrap();
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        if target.to_string_lossy() != "anon_inode:[io_uring]" {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        let (Some(ino), Some(head)) = (field("ino:"), field("CqHead:")) else {
            continue;
        };
        if seen.insert(ino) {
            total += head.parse::<u64>().expect("CqHead is a number");
        }
    }
    total
}

/// The gateway with `--io-uring` (and `more` arguments), or `None`
/// (skipped) where io_uring is refused.
async fn with_io_uring(files: &[(&str, String)], more: &[&str]) -> Option<Sluice> {
    let args = [&["--workers", "1", "--io-uring"], more].concat();
    let gw = Sluice::start_with(files, &args).await;
    let log = gw.log();
    if log.contains("io_uring unavailable") {
        let why = log
            .lines()
            .find(|l| l.contains("io_uring unavailable"))
            .unwrap_or_default()
            .to_string();
        sluice::testdata::or_skip::<()>(Err(format!("io_uring is refused here: {why}")))?;
    }
    assert!(
        log.contains("read and written through io_uring"),
        "the gateway does not say it serves through io_uring; log:\n{log}"
    );
    Some(gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_requests_through_io_uring_are_split_by_weight() {
    let stable = Pods::start("default", "stable", 3).await;
    let canary = Pods::start("default", "canary", 1).await;
    let r = route(
        "default",
        "split",
        "  hostnames: [app.example]\n  rules:\n  - backendRefs:\n    - {name: stable, port: 8080, weight: 3}\n    - {name: canary, port: 8080, weight: 1}",
    );
    let manifests = gateway() + &stable.manifests() + &canary.manifests() + &r;
    let Some(gw) = with_io_uring(&[("all.yaml", manifests)], &[]).await else {
        return;
    };
    let before = uring_completions(gw.pid());

    // 8 keep-alive connections at once, 100 requests each.
    let mut clients = Vec::new();
    for _ in 0..8 {
        let mut conn = gw.connect().await;
        clients.push(tokio::spawn(async move {
            conn.tally(100, "app.example", "/", &[]).await
        }));
    }
    let mut services = std::collections::BTreeMap::new();
    for client in clients {
        for (service, n) in by_service(&client.await.unwrap()) {
            *services.entry(service).or_insert(0) += n;
        }
    }
    assert_eq!(
        services.values().sum::<usize>(),
        800,
        "every request answered by a backend: {services:?}"
    );
    // 3/1 over 800 requests: the canary's 200, within the split's spread.
    let canary_count = services.get("canary").copied().unwrap_or(0);
    assert!(
        (190..=210).contains(&canary_count),
        "canary got {canary_count}: {services:?}"
    );
    assert_eq!(canary.requests() as usize, canary_count);
    assert_eq!(stable.requests() as usize, 800 - canary_count);
    // Through the ring: at least a receive and a send per request.
    let completions = uring_completions(gw.pid()) - before;
    assert!(
        completions >= 1_600,
        "{completions} io_uring completions for 800 requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_upgrade_through_io_uring_is_spliced_and_idle_connections_close() {
    let ws = UpgradeBackend::start().await;
    let app = Pods::start("default", "app", 1).await;
    let mut routes = route(
        "default",
        "ws",
        "  hostnames: [ws.example]\n  rules:\n  - backendRefs: [{name: ws, port: 8080}]",
    );
    routes += &route(
        "default",
        "app",
        "  hostnames: [app.example]\n  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let manifests = gateway() + &ws.manifests("ws", None) + &app.manifests() + &routes;
    let Some(gw) = with_io_uring(&[("all.yaml", manifests)], &["--keepalive-timeout", "1s"]).await
    else {
        return;
    };
    // The upgraded connection keeps its ring's receive in flight.
    let (head, mut conn) = upgrade(&gw, "ws.example", "/chat").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert_eq!(echo(&mut conn, b"hello").await, b"hello");
    assert_eq!(echo(&mut conn, &[7u8; 100_000]).await, vec![7u8; 100_000]);
    // A client that closes mid-wait: its receive is cancelled and the
    // worker goes on serving others.
    let mut other = gw.connect().await;
    assert_eq!(other.get("app.example", "/").await.status, 200);
    drop(other);
    let mut again = gw.connect().await;
    assert_eq!(again.get("app.example", "/").await.status, 200);
    assert_eq!(echo(&mut conn, b"still there").await, b"still there");

    // A kept-alive connection left idle past the keep-alive timeout is
    // closed by the gateway, though its receive was in flight (cancelled
    // when the connection ends: otherwise the socket would stay open
    // until the client sent something).
    let mut idle = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: app.example\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    let closed = tokio::time::timeout(std::time::Duration::from_secs(15), async {
        loop {
            match idle.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the idle connection was not closed");
    assert!(
        String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&seen)
    );
}
