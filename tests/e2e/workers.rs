//! Thread per core (`--workers`): client connections served by worker
//! threads of their own, each with its own pool of backend connections;
//! `--workers 0` serves them on the control plane's runtime.

use crate::support::*;

/// The names of the gateway's threads that are proxy workers.
fn worker_threads(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the gateway's threads")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .filter(|name| name.starts_with("sluice-worker-"))
        .collect();
    names.sort();
    names
}

async fn served_by(workers: &str) -> (Sluice, Pods) {
    let app = Pods::start("default", "app", 2).await;
    let r = route(
        "default",
        "app",
        "  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let gw = Sluice::start_with(
        &[("all.yaml", gateway() + &app.manifests() + &r)],
        &["--workers", workers],
    )
    .await;
    (gw, app)
}

/// 16 client connections at once, 10 requests each, all answered 200 by
/// the backend (counted there).
async fn many_connections_are_served(gw: &Sluice, app: &Pods) {
    let before: u64 = app.per_pod().iter().sum();
    let mut clients = Vec::new();
    for c in 0..16 {
        let mut conn = gw.connect().await;
        clients.push(tokio::spawn(async move {
            for i in 0..10 {
                let r = conn.get("h", &format!("/c{c}/r{i}")).await;
                assert_eq!(r.status, 200, "connection {c}, request {i}");
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
    let after: u64 = app.per_pod().iter().sum();
    assert_eq!(after - before, 160);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_three_workers_three_threads_serve_the_connections() {
    let (gw, app) = served_by("3").await;
    assert_eq!(
        worker_threads(gw.pid()),
        ["sluice-worker-1", "sluice-worker-2", "sluice-worker-3"]
    );
    many_connections_are_served(&gw, &app).await;
    // A reload that keeps the listener keeps every worker accepting.
    gw.write(
        "extra.yaml",
        &route(
            "default",
            "other",
            "  hostnames: [other.example]\n  rules:\n  - backendRefs: [{name: app, port: 8080}]",
        ),
    );
    gw.eventually("other.example", "/", |r| r.status == 200)
        .await;
    many_connections_are_served(&gw, &app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_workers_the_main_runtime_serves_the_connections() {
    let (gw, app) = served_by("0").await;
    assert!(worker_threads(gw.pid()).is_empty());
    many_connections_are_served(&gw, &app).await;
}
