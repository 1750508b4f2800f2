//! `sluice serve --kubernetes`, end to end: the real binary against a fake
//! API server ([`fake_apiserver`]) and echo backends on loopback.

mod fake_apiserver;
mod fleet;
mod ingresses;
mod rollouts;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sluice::echo::{EchoIdentity, EchoServer};

use fake_apiserver::FakeApiServer;

const DEADLINE: Duration = Duration::from_secs(60);
const HOST: &str = "autocomplete.example.com";

fn free_port() -> u16 {
    sluice::ports::free_loopback_port().expect("a free loopback port")
}

/// Poll `check` until it returns `Some`, or fail after [`DEADLINE`].
async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn echo(service: &str, pod: &str) -> EchoServer {
    sluice::echo::start(
        "127.0.0.1:0".parse().expect("an address"),
        EchoIdentity {
            pod: pod.into(),
            namespace: "default".into(),
            service: service.into(),
        },
    )
    .await
    .expect("an echo backend starts")
}

/// GatewayClass, Gateway (one HTTP listener on `port`), the gateway's own
/// Service, and one Service + EndpointSlice per backend.
fn cluster(api: &FakeApiServer, port: u16, backends: &[(&str, &EchoServer)]) {
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
    api.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "sluice", "namespace": "sluice-system"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "ports": [{"port": 80}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}}));
    for (name, server) in backends {
        service(api, name, server);
    }
}

fn service(api: &FakeApiServer, name: &str, server: &EchoServer) {
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

/// HTTPRoute `default/autocomplete` splitting between `stable` and `canary`.
fn route(stable: u32, canary: u32) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "autocomplete", "namespace": "default"},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [HOST],
                 "rules": [{"backendRefs": [
                     {"name": "stable", "port": 80, "weight": stable},
                     {"name": "canary", "port": 80, "weight": canary}]}]}})
}

/// One `sluice serve --kubernetes` process.
struct Replica {
    child: Child,
    dir: tempfile::TempDir,
    admin: SocketAddr,
    listener: SocketAddr,
}

impl Replica {
    /// Start a replica that authenticates with `token` and binds its
    /// listeners on `bind` (each replica its own loopback address).
    fn start(api: &FakeApiServer, token: &str, bind: &str, port: u16) -> Replica {
        Replica::start_with(api, token, bind, port, &[])
    }

    /// [`Replica::start`] with more environment variables.
    fn start_with(
        api: &FakeApiServer,
        token: &str,
        bind: &str,
        port: u16,
        env: &[(&str, &str)],
    ) -> Replica {
        Replica::start_with_args(api, token, bind, port, env, &[])
    }

    /// [`Replica::start_with`] with more arguments to `sluice serve`.
    fn start_with_args(
        api: &FakeApiServer,
        token: &str,
        bind: &str,
        port: u16,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Replica {
        let dir = tempfile::tempdir().expect("a temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig(token)).expect("write the kubeconfig");
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("an address");
        let log = std::fs::File::create(dir.path().join("sluice.log")).expect("a log file");
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--kubernetes", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--bind", bind, "--admin", &admin.to_string()])
            .args([
                "--gateway-service",
                "sluice-system/sluice",
                "--lease-duration",
                "2",
            ])
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("KUBECONFIG")
            .env_remove("SLUICE_ROLLOUT_COUNTS_INTERVAL")
            .envs(env.iter().copied())
            // The log (stdout) and panics (stderr) in one file; the clone
            // shares the file offset, so lines do not overwrite each other.
            .stdout(log.try_clone().expect("a second handle to the log"))
            .stderr(log)
            .spawn()
            .expect("the sluice binary starts");
        let listener = format!("{bind}:{port}").parse().expect("an address");
        Replica {
            child,
            dir,
            admin,
            listener,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sluice.log")).unwrap_or_default()
    }

    async fn admin(&self, path: &str) -> Option<StatusCode> {
        get(self.admin, "admin", path).await.ok().map(|(s, _)| s)
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + DEADLINE;
        while self.admin("/readyz").await != Some(StatusCode::OK) {
            assert!(Instant::now() < deadline, "not ready; log:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One GET on a fresh connection: status and body.
async fn get(addr: SocketAddr, host: &str, path: &str) -> Result<(StatusCode, Bytes), String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
}

/// Which service answered (`<500>` when the gateway answered itself).
fn answered_by(status: StatusCode, body: &Bytes) -> String {
    if status == StatusCode::OK {
        serde_json::from_slice::<sluice::echo::EchoResponse>(body)
            .map(|r| r.service)
            .unwrap_or_else(|_| "<not echo>".into())
    } else {
        format!("<{}>", status.as_u16())
    }
}

/// Keep-alive traffic through the gateway, counted by who answered.
struct Traffic {
    stop: Arc<AtomicBool>,
    counts: Arc<std::sync::Mutex<BTreeMap<String, usize>>>,
    errors: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(addr: SocketAddr) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let errors = Arc::new(AtomicUsize::new(0));
        let (s, c, e) = (stop.clone(), counts.clone(), errors.clone());
        let task = tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("handshake");
            tokio::spawn(conn);
            while !s.load(Ordering::Relaxed) {
                let req = Request::get("/complete?q=a")
                    .header("host", HOST)
                    .body(Full::new(Bytes::new()))
                    .expect("a request");
                let result = async {
                    send.ready().await?;
                    let resp = send.send_request(req).await?;
                    let status = resp.status();
                    let body = resp.into_body().collect().await?.to_bytes();
                    Ok::<_, hyper::Error>(answered_by(status, &body))
                }
                .await;
                match result {
                    Ok(who) => *c.lock().expect("lock").entry(who).or_default() += 1,
                    Err(_) => {
                        e.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            }
        });
        Traffic {
            stop,
            counts,
            errors,
            task,
        }
    }

    /// Counts so far, and reset.
    fn take(&self) -> BTreeMap<String, usize> {
        std::mem::take(&mut *self.counts.lock().expect("lock"))
    }

    async fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the traffic task does not panic");
        self.errors.load(Ordering::Relaxed)
    }
}

/// Wait until traffic has been answered only by `who` for a while.
async fn settle_on(traffic: &Traffic, who: &[&str]) -> BTreeMap<String, usize> {
    traffic.take();
    eventually(&format!("traffic answered only by {who:?}"), async || {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let counts = traffic.take();
        let total: usize = counts.values().sum();
        let only = counts.keys().all(|k| who.contains(&k.as_str()));
        let all = who.iter().all(|w| counts.contains_key(*w));
        (total >= 20 && only && all).then_some(counts)
    })
    .await
}

/// The `controllerName` of each of the route's `status.parents`, in order.
fn route_controllers(api: &FakeApiServer) -> Option<Vec<String>> {
    let route = api.get("HTTPRoute", Some("default"), "autocomplete")?;
    let parents = route["status"]["parents"].as_array()?;
    Some(
        parents
            .iter()
            .filter_map(|p| p["controllerName"].as_str().map(str::to_string))
            .collect(),
    )
}

fn route_condition(api: &FakeApiServer, ty: &str) -> Option<(String, String, i64)> {
    let route = api.get("HTTPRoute", Some("default"), "autocomplete")?;
    let parents = route["status"]["parents"].as_array()?.clone();
    let ours = parents
        .iter()
        .find(|p| p["controllerName"] == "sluice.dev/gateway-controller")?;
    let c = ours["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)?
        .clone();
    Some((
        c["status"].as_str()?.to_string(),
        c["reason"].as_str()?.to_string(),
        c["observedGeneration"].as_i64()?,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_weights_deleted_services_and_expired_watches_under_traffic() {
    let api = FakeApiServer::start().await;
    let (stable, canary) = (
        echo("stable", "stable-0").await,
        echo("canary", "canary-0").await,
    );
    let port = free_port();
    cluster(&api, port, &[("stable", &stable), ("canary", &canary)]);
    api.apply(route(1, 1));
    // A second controller also reports on this route: its entry must stay.
    let mut theirs = api
        .get("HTTPRoute", Some("default"), "autocomplete")
        .expect("the route exists");
    theirs["status"] = json!({"parents": [{"parentRef": {"name": "other-gw"},
        "controllerName": "example.com/other",
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
            "message": "theirs", "observedGeneration": 1,
            "lastTransitionTime": "2024-01-01T00:00:00Z"}]}]});
    api.apply(theirs);

    // Nothing is served before every initial list completed.
    api.hold_lists("secrets");
    let gateway = Replica::start(&api, "replica-a", "127.0.0.1", port);
    eventually("the admin listener", async || {
        (gateway.admin("/healthz").await == Some(StatusCode::OK)).then_some(())
    })
    .await;
    eventually("the other kinds listed", async || {
        (api.lists("httproutes") > 0 && api.lists("endpointslices") > 0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        gateway.admin("/readyz").await,
        Some(StatusCode::SERVICE_UNAVAILABLE)
    );
    assert!(
        get(gateway.listener, HOST, "/").await.is_err(),
        "no listener before the first complete snapshot"
    );
    api.release_lists();
    gateway.wait_ready().await;

    let traffic = Traffic::start(gateway.listener);
    settle_on(&traffic, &["stable", "canary"]).await;

    // The leader wrote status: ours next to the other controller's entry.
    let accepted = eventually("route status", async || route_condition(&api, "Accepted")).await;
    assert_eq!(accepted, ("True".into(), "Accepted".into(), 1));
    let controllers = route_controllers(&api).expect("the route's parents");
    assert_eq!(
        controllers,
        ["example.com/other", "sluice.dev/gateway-controller"]
    );
    let gw = eventually("gateway status", async || {
        let gw = api.get("Gateway", Some("default"), "gw")?;
        gw["status"]["addresses"].is_array().then_some(gw)
    })
    .await;
    assert_eq!(
        gw["status"]["addresses"],
        json!([{"type": "IPAddress", "value": "203.0.113.7"}])
    );
    let programmed = gw["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Programmed"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(programmed["status"], "True", "{gw:#}");
    let class = eventually("class status", async || {
        let c = api.get("GatewayClass", None, "sluice")?;
        c["status"]["conditions"].is_array().then_some(c)
    })
    .await;
    assert_eq!(class["status"]["conditions"][0]["type"], "Accepted");
    assert_eq!(class["status"]["conditions"][0]["status"], "True");
    for patch in api.patches() {
        assert_eq!(patch.field_manager, "sluice.dev/gateway-controller");
        assert!(patch.force, "server-side apply with force");
    }

    // `kubectl patch ... weight 0`: the canary stops getting traffic.
    api.apply(route(1, 0));
    settle_on(&traffic, &["stable"]).await;
    let observed = eventually("status of generation 2", async || {
        route_condition(&api, "Accepted").filter(|c| c.2 == 2)
    })
    .await;
    assert_eq!(observed.0, "True");

    // Back to 1:1, then the canary Service is deleted: its share gets 500.
    api.apply(route(1, 1));
    settle_on(&traffic, &["stable", "canary"]).await;
    assert!(api.delete("Service", Some("default"), "canary"));
    settle_on(&traffic, &["stable", "<500>"]).await;
    let resolved = eventually("ResolvedRefs=False", async || {
        route_condition(&api, "ResolvedRefs").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(resolved.1, "BackendNotFound");

    // The watches expire (410 Gone) while the canary comes back: every kind
    // lists again, traffic keeps flowing on the current table meanwhile,
    // and the relist brings the canary back.
    let lists_before = api.lists("services");
    api.expire_watches();
    service(&api, "canary", &canary);
    settle_on(&traffic, &["stable", "canary"]).await;
    assert!(api.lists("services") > lists_before, "the watch relisted");
    eventually("ResolvedRefs=True again", async || {
        route_condition(&api, "ResolvedRefs").filter(|c| c.0 == "True")
    })
    .await;

    // No status write repeats itself once everything settled.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let settled = api.patches().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        api.patches().len(),
        settled,
        "unchanged status is not rewritten"
    );

    let errors = traffic.stop().await;
    assert_eq!(errors, 0, "no request failed; log:\n{}", gateway.log());
}

/// Another controller writes its entry of the route's `status.parents`
/// after sluice read the route and before its status write arrives. The
/// write names the resourceVersion it was computed from, so the API server
/// refuses it (409) rather than let it drop the other entry, and sluice
/// writes again from the route the watch delivers: both entries stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_racing_another_controller_never_overwrites_its_entry() {
    let api = FakeApiServer::start().await;
    let stable = echo("stable", "stable-0").await;
    let port = free_port();
    cluster(&api, port, &[("stable", &stable)]);
    api.apply(route(1, 0));
    api.write_before_next_status_patch("HTTPRoute", Some("default"), "autocomplete", |route| {
        route["status"] = json!({"parents": [{"parentRef": {"name": "other-gw"},
            "controllerName": "example.com/other",
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                "message": "theirs, written in between", "observedGeneration": 1,
                "lastTransitionTime": "2024-01-01T00:00:00Z"}]}]});
    });
    let gateway = Replica::start(&api, "replica-a", "127.0.0.1", port);
    gateway.wait_ready().await;

    let controllers = eventually("both entries in the route's parents", async || {
        let controllers = route_controllers(&api)?;
        (controllers.len() == 2).then_some(controllers)
    })
    .await;
    assert_eq!(
        controllers,
        ["example.com/other", "sluice.dev/gateway-controller"],
        "log:\n{}",
        gateway.log()
    );
    let writes: Vec<_> = api
        .patches()
        .into_iter()
        .filter(|p| p.plural == "httproutes")
        .collect();
    assert!(writes[0].conflict, "the first write raced and was refused");
    assert!(
        writes
            .iter()
            .all(|w| w.body["metadata"]["resourceVersion"].is_string()),
        "every route status write is conditional"
    );
    assert!(!writes.last().expect("a write").conflict);
    assert!(gateway.log().contains("status changed by another writer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_writes_status_and_a_successor_takes_over() {
    let api = FakeApiServer::start().await;
    let (stable, canary) = (
        echo("stable", "stable-0").await,
        echo("canary", "canary-0").await,
    );
    let port = free_port();
    cluster(&api, port, &[("stable", &stable), ("canary", &canary)]);
    api.apply(route(1, 1));

    let mut a = Replica::start(&api, "replica-a", "127.0.0.1", port);
    a.wait_ready().await;
    eventually("replica a leads and writes status", async || {
        route_condition(&api, "Accepted").filter(|c| c.2 == 1)
    })
    .await;
    let b = Replica::start(&api, "replica-b", "127.0.0.2", port);
    b.wait_ready().await;

    // Both replicas serve traffic from their own watches.
    api.apply(route(1, 0));
    for replica in [&a, &b] {
        eventually("the weight change on every replica", async || {
            let mut seen = Vec::new();
            for _ in 0..20 {
                let (status, body) = get(replica.listener, HOST, "/").await.ok()?;
                seen.push(answered_by(status, &body));
            }
            seen.iter().all(|s| s == "stable").then_some(())
        })
        .await;
    }
    eventually("status of generation 2", async || {
        route_condition(&api, "Accepted").filter(|c| c.2 == 2)
    })
    .await;
    let writers: Vec<String> = api.patches().iter().map(|p| p.token.clone()).collect();
    assert!(
        writers.iter().all(|t| t == "replica-a"),
        "only the leader writes: {writers:?}"
    );
    let holder = api
        .lease_holder("sluice-system", "sluice-gateway-controller")
        .expect("a lease holder");

    // The leader dies without releasing: the other replica takes over
    // within the lease duration and writes the next status.
    let _ = a.child.kill();
    let _ = a.child.wait();
    eventually("replica b takes the lease", async || {
        api.lease_holder("sluice-system", "sluice-gateway-controller")
            .filter(|h| *h != holder)
    })
    .await;
    api.apply(route(1, 1));
    eventually("status of generation 3", async || {
        route_condition(&api, "Accepted").filter(|c| c.2 == 3)
    })
    .await;
    let last = api.patches().last().cloned().expect("a patch");
    assert_eq!(last.token, "replica-b");
    let (status, body) = get(b.listener, HOST, "/").await.expect("b still serves");
    assert!(
        ["stable", "canary"].contains(&answered_by(status, &body).as_str()),
        "log:\n{}",
        b.log()
    );
}

/// The condition `ty` of a status `conditions` list: (status, reason).
fn condition(conditions: &Value, ty: &str) -> Option<(String, String)> {
    let c = conditions.as_array()?.iter().find(|c| c["type"] == ty)?;
    Some((c["status"].as_str()?.into(), c["reason"].as_str()?.into()))
}

/// A self-signed CA certificate, PEM.
fn ca_pem() -> String {
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).expect("valid CA parameters");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().expect("a key pair");
    params.self_signed(&key).expect("a CA certificate").pem()
}

/// The Gateway of [`cluster`], admitting ListenerSets of its namespace.
fn gateway_admitting_listener_sets(port: u16) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": "default"},
        "spec": {"gatewayClassName": "sluice",
                 "allowedListeners": {"namespaces": {"from": "Same"}},
                 "listeners": [{"name": "http", "protocol": "HTTP", "port": port}]}})
}

/// ListenerSet `default/team` (one HTTP listener on `port`) and a route
/// attached to it only, to the `stable` Service.
fn listener_set_and_route(api: &FakeApiServer, port: u16) {
    api.apply(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ListenerSet",
        "metadata": {"name": "team", "namespace": "default"},
        "spec": {"parentRef": {"name": "gw"},
                 "listeners": [{"name": "team-http", "protocol": "HTTP", "port": port}]}}),
    );
    api.apply(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "team", "namespace": "default"},
        "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "ListenerSet",
                                 "name": "team"}],
                 "hostnames": ["team.example.com"],
                 "rules": [{"backendRefs": [{"name": "stable", "port": 80}]}]}}),
    );
}

/// The ListenerSet `default/team`'s status, once it has `Programmed`.
async fn programmed_listener_set(api: &FakeApiServer) -> Value {
    eventually("ListenerSet status", async || {
        let set = api.get("ListenerSet", Some("default"), "team")?;
        condition(&set["status"]["conditions"], "Programmed").map(|_| set)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_set_and_backend_tls_policy_status_are_written_back() {
    let api = FakeApiServer::start().await;
    let (stable, canary) = (
        echo("stable", "stable-0").await,
        echo("canary", "canary-0").await,
    );
    let (port, set_port) = (free_port(), free_port());
    cluster(&api, port, &[("stable", &stable), ("canary", &canary)]);
    api.apply(gateway_admitting_listener_sets(port));
    api.apply(route(1, 1));
    listener_set_and_route(&api, set_port);

    // A BackendTLSPolicy on a Service of a second route, its CA in a
    // ConfigMap; another controller already reports an ancestor of its own.
    let secure = echo("secure", "secure-0").await;
    service(&api, "secure", &secure);
    api.apply(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "secure", "namespace": "default"},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["secure.example.com"],
                 "rules": [{"backendRefs": [{"name": "secure", "port": 80}]}]}}),
    );
    api.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "secure-ca", "namespace": "default"},
        "data": {"ca.crt": ca_pem(), "unrelated": "dropped by the cache"}}));
    api.apply(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy",
        "metadata": {"name": "secure-tls", "namespace": "default"},
        "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "secure"}],
                 "validation": {"hostname": "secure.default",
                                "caCertificateRefs": [{"group": "", "kind": "ConfigMap",
                                                       "name": "secure-ca"}]}},
        "status": {"ancestors": [{
            "ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                            "name": "mesh", "namespace": "default"},
            "controllerName": "example.com/other",
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                "message": "theirs", "observedGeneration": 1,
                "lastTransitionTime": "2024-01-01T00:00:00Z"}]}]}}),
    );

    let gateway = Replica::start(&api, "replica-a", "127.0.0.1", port);
    gateway.wait_ready().await;

    // The ListenerSet's listener serves its route.
    let set_listener: SocketAddr = format!("127.0.0.1:{set_port}").parse().expect("an address");
    eventually("the ListenerSet's route served on its port", async || {
        let (status, body) = get(set_listener, "team.example.com", "/").await.ok()?;
        (answered_by(status, &body) == "stable").then_some(())
    })
    .await;

    // Its status is written back: accepted and programmed, per listener.
    let set = programmed_listener_set(&api).await;
    let conditions = &set["status"]["conditions"];
    assert_eq!(
        condition(conditions, "Accepted"),
        Some(("True".into(), "Accepted".into())),
        "{set:#}"
    );
    assert_eq!(
        condition(conditions, "Programmed"),
        Some(("True".into(), "Programmed".into())),
        "{set:#}"
    );
    assert_eq!(set["status"]["listeners"][0]["name"], "team-http");
    assert_eq!(set["status"]["listeners"][0]["attachedRoutes"], 1);
    let gw = eventually("attachedListenerSets", async || {
        let gw = api.get("Gateway", Some("default"), "gw")?;
        (gw["status"]["attachedListenerSets"] == 1).then_some(gw)
    })
    .await;
    assert!(gw["status"]["conditions"].is_array());

    // The policy's ancestors: theirs kept, ours added, the CA resolved
    // through the ConfigMap watch.
    let policy = eventually("BackendTLSPolicy ancestors", async || {
        let p = api.get("BackendTLSPolicy", Some("default"), "secure-tls")?;
        (p["status"]["ancestors"].as_array()?.len() == 2).then_some(p)
    })
    .await;
    let ancestors = &policy["status"]["ancestors"];
    assert_eq!(ancestors[0]["controllerName"], "example.com/other");
    assert_eq!(ancestors[0]["conditions"][0]["message"], "theirs");
    assert_eq!(
        ancestors[1]["controllerName"],
        "sluice.dev/gateway-controller"
    );
    assert_eq!(ancestors[1]["ancestorRef"]["name"], "gw");
    assert_eq!(
        condition(&ancestors[1]["conditions"], "ResolvedRefs"),
        Some(("True".into(), "ResolvedRefs".into())),
        "{policy:#}"
    );
    assert_eq!(
        condition(&ancestors[1]["conditions"], "Accepted"),
        Some(("True".into(), "Accepted".into())),
        "{policy:#}"
    );

    for patch in api.patches() {
        assert_eq!(patch.field_manager, "sluice.dev/gateway-controller");
        assert!(patch.force, "server-side apply with force");
    }
    let plurals: Vec<String> = api.patches().iter().map(|p| p.plural.clone()).collect();
    for plural in ["listenersets", "backendtlspolicies"] {
        assert!(plurals.iter().any(|p| p == plural), "{plurals:?}");
    }

    // A change to the ListenerSet reaches both the proxy and its status.
    api.apply(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ListenerSet",
        "metadata": {"name": "team", "namespace": "default"},
        "spec": {"parentRef": {"name": "gw"},
                 "listeners": [{"name": "team-http", "protocol": "HTTP", "port": set_port,
                                "hostname": "other.example.com"}]}}),
    );
    eventually("status of ListenerSet generation 2", async || {
        let set = api.get("ListenerSet", Some("default"), "team")?;
        let conditions = set["status"]["conditions"].as_array()?;
        conditions
            .iter()
            .all(|c| c["observedGeneration"] == 2)
            .then_some(())
    })
    .await;
    eventually("the route no longer attached", async || {
        let (status, _) = get(set_listener, "team.example.com", "/").await.ok()?;
        (status == StatusCode::NOT_FOUND).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_listener_set_and_backend_tls_policy_crds_serves_and_picks_them_up() {
    let api = FakeApiServer::start().await;
    api.uninstall("listenersets");
    api.uninstall("backendtlspolicies");
    let (stable, canary) = (
        echo("stable", "stable-0").await,
        echo("canary", "canary-0").await,
    );
    let (port, set_port) = (free_port(), free_port());
    cluster(&api, port, &[("stable", &stable), ("canary", &canary)]);
    api.apply(gateway_admitting_listener_sets(port));
    api.apply(route(1, 0));

    let gateway = Replica::start(&api, "replica-a", "127.0.0.1", port);
    gateway.wait_ready().await;
    eventually("the route served", async || {
        let (status, body) = get(gateway.listener, HOST, "/").await.ok()?;
        (answered_by(status, &body) == "stable").then_some(())
    })
    .await;
    eventually("route status", async || {
        route_condition(&api, "Accepted").filter(|c| c.0 == "True")
    })
    .await;

    // The watcher asks again (with backoff); the missing CRD is logged once.
    eventually("listenersets asked for again", async || {
        (api.not_found("listenersets") >= 2).then_some(())
    })
    .await;
    let log = gateway.log();
    for kind in ["ListenerSet", "BackendTLSPolicy"] {
        let lines = log
            .lines()
            .filter(|l| l.contains("CRD not installed") && l.contains(&format!("\"{kind}\"")))
            .count();
        assert_eq!(lines, 1, "{kind} logged once; log:\n{log}");
    }

    // The ListenerSet CRD is installed later: no restart needed.
    api.install("listenersets");
    listener_set_and_route(&api, set_port);
    let set = programmed_listener_set(&api).await;
    assert_eq!(
        condition(&set["status"]["conditions"], "Accepted"),
        Some(("True".into(), "Accepted".into())),
        "{set:#}"
    );
    let set_listener: SocketAddr = format!("127.0.0.1:{set_port}").parse().expect("an address");
    eventually("the ListenerSet's route served", async || {
        let (status, body) = get(set_listener, "team.example.com", "/").await.ok()?;
        (answered_by(status, &body) == "stable").then_some(())
    })
    .await;
    assert!(
        gateway.log().contains("CRD installed"),
        "log:\n{}",
        gateway.log()
    );
}

/// `sluice_config_reloads_total`: how many configurations were translated.
async fn reloads(replica: &Replica) -> Option<u64> {
    let (_, body) = get(replica.admin, "admin", "/metrics").await.ok()?;
    std::str::from_utf8(&body)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("sluice_config_reloads_total "))?
        .trim()
        .parse()
        .ok()
}

/// Route statuses come back as watch events (ours after every write, and
/// other controllers'): they change no route's spec and cost no
/// translation, but the status writer works from them, so our next write
/// names the resourceVersion they made and keeps their entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_status_change_is_not_translated_but_is_written_from() {
    let api = FakeApiServer::start().await;
    let (stable, canary) = (
        echo("stable", "stable-0").await,
        echo("canary", "canary-0").await,
    );
    let port = free_port();
    cluster(&api, port, &[("stable", &stable), ("canary", &canary)]);
    api.apply(route(1, 0));
    let gateway = Replica::start(&api, "replica-a", "127.0.0.1", port);
    gateway.wait_ready().await;
    eventually("our route status", async || {
        route_condition(&api, "Accepted")
    })
    .await;
    // Settled: the echoes of the first writes are in.
    let mut before = None;
    let settled = eventually("the reload count to settle", async || {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = reloads(&gateway).await?;
        let last = before.replace(now);
        (last == Some(now)).then_some(now)
    })
    .await;

    // Another controller writes its entry next to ours.
    let mut route_now = api
        .get("HTTPRoute", Some("default"), "autocomplete")
        .expect("the route exists");
    let mut parents = route_now["status"]["parents"]
        .as_array()
        .cloned()
        .expect("parents");
    parents.insert(
        0,
        json!({"parentRef": {"name": "other-gw"}, "controllerName": "example.com/other",
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                "message": "theirs", "observedGeneration": 1,
                "lastTransitionTime": "2024-01-01T00:00:00Z"}]}),
    );
    route_now["status"]["parents"] = serde_json::Value::Array(parents);
    api.apply(route_now);
    // Then the spec changes: served, and our status follows it.
    api.apply(route(0, 1));
    let traffic = Traffic::start(gateway.listener);
    settle_on(&traffic, &["canary"]).await;
    assert_eq!(traffic.stop().await, 0);
    eventually("our status at generation 2", async || {
        route_condition(&api, "Accepted").filter(|c| c.2 == 2)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let log = gateway.log();
    assert_eq!(
        reloads(&gateway).await,
        Some(settled + 1),
        "only the spec change was translated; log:\n{log}"
    );
    let controllers = route_controllers(&api).expect("the route's parents");
    assert_eq!(
        controllers,
        ["example.com/other", "sluice.dev/gateway-controller"],
        "their entry kept; log:\n{log}"
    );
    assert!(
        !log.contains("status changed by another writer"),
        "written over the resourceVersion their write made, not refused; log:\n{log}"
    );
}
