//! Config propagation in Kubernetes mode: from a watch event (an HTTPRoute
//! changed on the API server) to the first request served by the new table.
//!
//! `sluice serve --kubernetes` runs against the tests' fake API server
//! (`tests/kubernetes/fake_apiserver.rs`) with two echo backends; the
//! route sends everything to one of them, and each flip applies the route
//! with the other. Probes (a new connection each) ask until the other
//! backend answers. `--routes N` adds N routes on other hostnames (the
//! size of the table translate rebuilds). A bench tool, not a test: it
//! prints one JSON object and asserts nothing about time.
//!
//! ```text
//! k8s_flip run --sluice target/release/sluice [--routes 100] [--flips 20]
//! ```
//!
//! Built with `cargo bench --no-run`; run by `bench/driver.py` (flip row).

#[path = "../tests/kubernetes/fake_apiserver.rs"]
mod fake_apiserver;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sluice::echo::{EchoIdentity, EchoServer};

use fake_apiserver::FakeApiServer;

const HOST: &str = "flip.example.com";
const DEADLINE: Duration = Duration::from_secs(60);

struct Args {
    sluice: String,
    routes: usize,
    flips: usize,
}

fn args() -> Result<Option<Args>, String> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) != Some("run") {
        return Ok(None);
    }
    let mut out = Args {
        sluice: String::new(),
        routes: 0,
        flips: 20,
    };
    let mut it = argv[1..].iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--sluice" => out.sluice = value()?.clone(),
            "--routes" => out.routes = value()?.parse().map_err(|e| format!("--routes: {e}"))?,
            "--flips" => out.flips = value()?.parse().map_err(|e| format!("--flips: {e}"))?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if out.sluice.is_empty() {
        return Err("--sluice is required".into());
    }
    Ok(Some(out))
}

fn main() {
    let args = match args() {
        Ok(Some(a)) => a,
        // `cargo bench` runs every bench target with `--bench`: nothing to do.
        Ok(None) => {
            eprintln!("usage: k8s_flip run --sluice PATH [--routes N] [--flips N]");
            return;
        }
        Err(e) => {
            eprintln!("k8s_flip: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime starts");
    runtime.block_on(run(args));
}

async fn echo(service: &str) -> EchoServer {
    sluice::echo::start(
        "127.0.0.1:0".parse().expect("an address"),
        EchoIdentity {
            pod: format!("{service}-0"),
            namespace: "default".into(),
            service: service.into(),
        },
    )
    .await
    .expect("an echo backend starts")
}

fn apply_cluster(api: &FakeApiServer, port: u16, backends: &[(&str, &EchoServer)]) {
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "default", "labels": {"kubernetes.io/metadata.name": "default"}}}));
    api.apply(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "sluice"}, "spec": {"controllerName": "sluice.dev/gateway-controller"}}));
    api.apply(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": "default"},
        "spec": {"gatewayClassName": "sluice",
                 "listeners": [{"name": "http", "protocol": "HTTP", "port": port}]}}),
    );
    for (name, server) in backends {
        api.apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"ports": [{"port": 80, "name": "http"}]}}));
        api.apply(
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "default",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": server.local_addr().port()}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}]}),
        );
    }
}

fn route(name: &str, host: &str, backend: &str) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [host],
                 "rules": [{"backendRefs": [{"name": backend, "port": 80}]}]}})
}

/// The service that answered a GET on a fresh connection, if any.
async fn answered_by(addr: SocketAddr) -> Option<String> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    let req = Request::get("/")
        .header("host", HOST)
        .body(Full::new(Bytes::new()))
        .ok()?;
    let resp = send.send_request(req).await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    serde_json::from_slice::<sluice::echo::EchoResponse>(&body)
        .ok()
        .map(|r| r.service)
}

async fn wait_for(addr: SocketAddr, service: &str) -> Duration {
    let started = Instant::now();
    loop {
        if answered_by(addr).await.as_deref() == Some(service) {
            return started.elapsed();
        }
        assert!(started.elapsed() < DEADLINE, "{service} never answered");
        tokio::task::yield_now().await;
    }
}

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn run(args: Args) {
    let api = FakeApiServer::start().await;
    let (stable, canary) = (echo("stable").await, echo("canary").await);
    let port = sluice::ports::free_loopback_port().expect("a free port");
    let admin = sluice::ports::free_loopback_port().expect("a free port");
    apply_cluster(&api, port, &[("stable", &stable), ("canary", &canary)]);
    for i in 0..args.routes {
        api.apply(route(
            &format!("extra-{i}"),
            &format!("host-{}.example.com", i / 10),
            "stable",
        ));
    }
    api.apply(route("flip", HOST, "stable"));
    let dir = std::env::temp_dir().join(format!("sluice-k8s-flip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig("bench")).expect("write the kubeconfig");
    let _gateway = Gateway(
        Command::new(&args.sluice)
            .args(["serve", "--kubernetes", "--kubeconfig"])
            .arg(&kubeconfig)
            .args([
                "--bind",
                "127.0.0.1",
                "--admin",
                &format!("127.0.0.1:{admin}"),
            ])
            .env("RUST_LOG", "warn")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("KUBECONFIG")
            .stdout(Stdio::null())
            .spawn()
            .expect("the sluice binary starts"),
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_for(addr, "stable").await;
    let mut times = Vec::new();
    for i in 0..args.flips {
        let to = if i % 2 == 0 { "canary" } else { "stable" };
        let started = Instant::now();
        api.apply(route("flip", HOST, to));
        wait_for(addr, to).await;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!(
        "{}",
        json!({"routes": args.routes + 1, "flips": args.flips,
               "median_ms": median, "max_ms": times.last().copied().unwrap_or(0.0)})
    );
}
