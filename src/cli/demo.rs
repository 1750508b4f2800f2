//! `sluice demo`: the examples of `examples/` served for real, with nothing
//! installed. It starts an echo backend for every endpoint of every
//! EndpointSlice, starts the gateway in this process on the manifests (ports
//! rewritten to free ones), drives a few thousand requests through it and
//! prints what each backend *received* — counted by the backends, not the
//! client — next to its configured share. Then it flips the blue-green pair
//! by rewriting the file and shows the new split after the reload. Last,
//! two rollouts ([`rollouts`]): a canary promoted step by step by its
//! RolloutPolicy, and a canary that starts failing and is rolled back.
//!
//! The examples put each pod on its own loopback address (127.0.1.1, ...),
//! as a cluster would put them on their own pod IPs. Where the system does
//! not route all of 127.0.0.0/8 to loopback (macOS), every pod is moved to
//! 127.0.0.1 on a port of its own instead, one EndpointSlice per pod.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{Map as Mapping, Value};
use tokio::net::TcpStream;

use crate::cli::check::format_share;
use crate::echo::{self, EchoIdentity, EchoResponse, EchoServer};
use crate::serve::{self, RunningGateway, ServeConfig};

mod live;
mod rollouts;

pub use rollouts::{RolloutAct, RolloutStepReport};

/// The manifests the demo serves: the files of `examples/`, embedded.
pub const EXAMPLES: [(&str, &str); 5] = [
    ("gateway.yaml", include_str!("../../examples/gateway.yaml")),
    ("canary.yaml", include_str!("../../examples/canary.yaml")),
    (
        "header-canary.yaml",
        include_str!("../../examples/header-canary.yaml"),
    ),
    (
        "blue-green.yaml",
        include_str!("../../examples/blue-green.yaml"),
    ),
    ("rollout.yaml", include_str!("../../examples/rollout.yaml")),
];

const AUTOCOMPLETE_HOST: &str = "autocomplete.example.com";
const SEARCH_HOST: &str = "search.example.com";
const CHECKOUT_HOST: &str = "checkout.example.com";
const BLUE_GREEN_FILE: &str = "blue-green.yaml";
/// Keep-alive connections each phase's requests are spread over.
const CONNECTIONS: usize = 4;
/// Longest wait for the gateway to start or to apply a change.
const SETTLE_DEADLINE: Duration = Duration::from_secs(15);

/// Settings of `sluice demo`.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Requests sent to the 995/5 autocomplete canary. The other routes get
    /// smaller numbers in proportion (search 1/8 plus 1/40 tagged, checkout
    /// 1/20 before and after the flip).
    pub requests: usize,
    /// Also print every pod's count.
    pub verbose: bool,
    /// After the acts, keep serving with traffic and rollouts in a loop
    /// until Ctrl-C ([`live`]).
    pub keep_running: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            requests: 4000,
            verbose: false,
            keep_running: false,
        }
    }
}

/// What one phase of the demo sent and what the backends received.
#[derive(Debug, Clone)]
pub struct PhaseReport {
    pub title: String,
    pub sent: usize,
    /// Requests that failed or were not answered 200.
    pub failed: usize,
    /// What went wrong with the first failed request.
    pub first_failure: Option<String>,
    /// Per Service name: requests received and pods that received any.
    pub received: BTreeMap<String, ServiceCount>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceCount {
    pub requests: u64,
    pub pods_with_traffic: usize,
    pub pods: usize,
}

/// Everything the demo measured.
#[derive(Debug, Clone, Default)]
pub struct DemoReport {
    pub phases: Vec<PhaseReport>,
    /// The promotion, then the rollback.
    pub rollouts: Vec<RolloutAct>,
}

impl DemoReport {
    /// Requests that failed without being meant to (the failing canary's
    /// answers are meant to).
    pub fn failed(&self) -> usize {
        self.phases.iter().map(|p| p.failed).sum::<usize>()
            + self
                .rollouts
                .iter()
                .map(RolloutAct::unexpected_failures)
                .sum::<usize>()
    }
}

/// Run the demo, printing to stdout. Fails when a request failed.
pub async fn run(opts: DemoOptions) -> anyhow::Result<()> {
    let mut stdout = io::stdout();
    let report = run_with_output(opts, &mut stdout).await?;
    let failed = report.failed();
    if failed > 0 {
        bail!("{failed} request(s) failed");
    }
    Ok(())
}

/// Run the demo, printing to `out`, and return what it measured.
pub async fn run_with_output(
    opts: DemoOptions,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<DemoReport> {
    let dir = TempDir::create()?;
    let mut files = parse_examples()?;
    rollouts::for_the_demo(&mut files);
    let listener_port = free_port()?;
    set_listener_ports(&mut files, listener_port);
    let pods = start_pods(&mut files).await?;
    for (name, documents) in &files {
        write_documents(&dir.path.join(name), documents)?;
    }

    let gateway = serve::start(ServeConfig {
        paths: vec![dir.path.clone()],
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        admin: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        crds: Vec::new(),
    })
    .await
    .context("cannot start the gateway")?;
    let gateway_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, listener_port));
    let mut result = demo_phases(&opts, out, &dir, &mut files, &pods, gateway_addr, &gateway).await;
    if opts.keep_running
        && let Ok(report) = &result
        && report.failed() == 0
    {
        let mut live = live::Live {
            out: &mut *out,
            dir: &dir,
            files: &mut files,
            pods: &pods,
            gateway: gateway_addr,
            running: &gateway,
        };
        if let Err(e) = live::keep_running(&mut live, crate::shutdown::signalled()).await {
            result = Err(e);
        }
    }
    gateway.shutdown().await;
    for pod in pods.into_values().flatten() {
        pod.shutdown().await;
    }
    result
}

async fn demo_phases(
    opts: &DemoOptions,
    out: &mut (dyn Write + Send),
    dir: &TempDir,
    files: &mut [(String, Vec<Value>)],
    pods: &BTreeMap<String, Vec<EchoServer>>,
    gateway: SocketAddr,
    running: &RunningGateway,
) -> anyhow::Result<DemoReport> {
    let admin = running.admin_addr();
    wait_ready(admin).await?;
    wait_for_backend(gateway, AUTOCOMPLETE_HOST, &[], "autocomplete-stable").await?;
    let pod_count: usize = pods.values().map(Vec::len).sum();
    writeln!(
        out,
        "sluice demo: gateway listening on {gateway} (admin http://{admin}), \
         {pod_count} echo pods on loopback, manifests from examples/ in {}\n",
        dir.path.display()
    )?;

    let mut report = DemoReport::default();
    let weights = route_weights(files, "autocomplete")?;
    let phase = measure(
        pods,
        format!(
            "HTTPRoute default/autocomplete: 0.5% canary (Host: {AUTOCOMPLETE_HOST}, {} requests over {CONNECTIONS} keep-alive connections)",
            opts.requests
        ),
        drive(gateway, AUTOCOMPLETE_HOST, &[], opts.requests),
    )
    .await?;
    let observed = observed_shares(admin, "default/autocomplete").await;
    print_weighted(out, &phase, &weights, &observed, pods, opts.verbose)?;
    report.phases.push(phase);

    let untagged = (opts.requests / 8).max(1);
    let tagged = (opts.requests / 40).max(1);
    let phase = measure(
        pods,
        format!(
            "HTTPRoute default/search: untagged requests (Host: {SEARCH_HOST}, {untagged} requests)"
        ),
        drive(gateway, SEARCH_HOST, &[], untagged),
    )
    .await?;
    let expected = [
        ("search-stable".to_owned(), None, 100.0),
        ("search-canary".to_owned(), None, 0.0),
    ];
    print_table(out, &phase, &expected, None, pods, opts.verbose)?;
    report.phases.push(phase);
    let phase = measure(
        pods,
        format!("HTTPRoute default/search: tagged with `x-canary: always` ({tagged} requests)"),
        drive(gateway, SEARCH_HOST, &[("x-canary", "always")], tagged),
    )
    .await?;
    let expected = [
        ("search-stable".to_owned(), None, 0.0),
        ("search-canary".to_owned(), None, 100.0),
    ];
    print_table(out, &phase, &expected, None, pods, opts.verbose)?;
    report.phases.push(phase);

    let checkout = (opts.requests / 20).max(1);
    let weights = route_weights(files, "checkout")?;
    let phase = measure(
        pods,
        format!("HTTPRoute default/checkout: blue-green before the flip (Host: {CHECKOUT_HOST}, {checkout} requests)"),
        drive(gateway, CHECKOUT_HOST, &[], checkout),
    )
    .await?;
    let observed = observed_shares(admin, "default/checkout").await;
    print_weighted(out, &phase, &weights, &observed, pods, opts.verbose)?;
    report.phases.push(phase);

    // Flip: swap the weights in the file, as an operator would.
    let (name, documents) = files
        .iter_mut()
        .find(|(name, _)| name == BLUE_GREEN_FILE)
        .ok_or_else(|| anyhow!("examples/{BLUE_GREEN_FILE} is missing"))?;
    let route = find_route(documents, "checkout")?;
    swap_weights(route)?;
    let new_live = live_backend(route)?;
    write_documents(&dir.path.join(name.as_str()), documents)?;
    let flipped = Instant::now();
    wait_for_backend(gateway, CHECKOUT_HOST, &[], &new_live).await?;
    writeln!(
        out,
        "Flipped the checkout weights in {BLUE_GREEN_FILE}; the gateway reloaded it and sent traffic to {new_live} {} ms later.\n",
        flipped.elapsed().as_millis()
    )?;
    let weights = route_weights(files, "checkout")?;
    let phase = measure(
        pods,
        format!("HTTPRoute default/checkout: after the flip ({checkout} requests)"),
        drive(gateway, CHECKOUT_HOST, &[], checkout),
    )
    .await?;
    let observed = observed_shares(admin, "default/checkout").await;
    print_weighted(out, &phase, &weights, &observed, pods, opts.verbose)?;
    report.phases.push(phase);

    let mut stage = rollouts::Stage {
        out: &mut *out,
        dir,
        files: &mut *files,
        pods,
        gateway,
        running,
    };
    report.rollouts.push(rollouts::promotion(&mut stage).await?);
    report.rollouts.push(rollouts::rollback(&mut stage).await?);

    let failed = report.failed();
    let sent: usize = report.phases.iter().map(|p| p.sent).sum::<usize>()
        + report.rollouts.iter().map(RolloutAct::sent).sum::<usize>();
    let meant: usize = report
        .rollouts
        .iter()
        .map(RolloutAct::expected_failures)
        .sum();
    if failed == 0 {
        writeln!(
            out,
            "All {sent} requests answered 200, except the {meant} the failing canary answered 500 before it was rolled back."
        )?;
    } else {
        writeln!(out, "{failed} of {sent} requests FAILED.")?;
    }
    Ok(report)
}

// ---------------------------------------------------------------------------
// Manifests

/// The embedded examples, each file as its list of YAML documents.
fn parse_examples() -> anyhow::Result<Vec<(String, Vec<Value>)>> {
    EXAMPLES
        .iter()
        .map(|(name, text)| {
            let documents = crate::yaml::documents(text)
                .with_context(|| format!("examples/{name} is not valid YAML"))?
                .into_iter()
                .map(|d| d.value)
                .collect();
            Ok(((*name).to_owned(), documents))
        })
        .collect()
}

fn write_documents(path: &Path, documents: &[Value]) -> anyhow::Result<()> {
    let mut text = String::new();
    for document in documents {
        text.push_str("---\n");
        text.push_str(&crate::yaml::to_string(document)?);
    }
    // Write then rename, so the watcher never reads half a file.
    let partial = path.with_extension("yaml.partial");
    std::fs::write(&partial, text)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn kind_of(document: &Value) -> &str {
    document.get("kind").and_then(Value::as_str).unwrap_or("")
}

fn name_of(document: &Value) -> &str {
    document
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn set_listener_ports(files: &mut [(String, Vec<Value>)], port: u16) {
    for document in files.iter_mut().flat_map(|(_, d)| d.iter_mut()) {
        if kind_of(document) != "Gateway" {
            continue;
        }
        let listeners = document
            .get_mut("spec")
            .and_then(|s| s.get_mut("listeners"))
            .and_then(Value::as_array_mut);
        for listener in listeners.into_iter().flatten() {
            if let Some(listener) = listener.as_object_mut() {
                listener.insert("port".into(), u64::from(port).into());
            }
        }
    }
}

fn find_route<'a>(documents: &'a mut [Value], name: &str) -> anyhow::Result<&'a mut Value> {
    documents
        .iter_mut()
        .find(|d| kind_of(d) == "HTTPRoute" && name_of(d) == name)
        .ok_or_else(|| anyhow!("HTTPRoute {name} is missing from the examples"))
}

fn backend_refs_mut(route: &mut Value) -> anyhow::Result<&mut Vec<Value>> {
    let name = name_of(route).to_owned();
    route
        .get_mut("spec")
        .and_then(|s| s.get_mut("rules"))
        .and_then(Value::as_array_mut)
        .and_then(|rules| rules.first_mut())
        .and_then(|rule| rule.get_mut("backendRefs"))
        .and_then(Value::as_array_mut)
        .ok_or_else(|| anyhow!("HTTPRoute {name} has no spec.rules[0].backendRefs"))
}

/// `(Service name, weight)` of the first rule of an HTTPRoute in the
/// examples (an omitted weight is 1).
fn route_weights(
    files: &[(String, Vec<Value>)],
    route: &str,
) -> anyhow::Result<Vec<(String, u64)>> {
    let mut route = files
        .iter()
        .flat_map(|(_, d)| d.iter())
        .find(|d| kind_of(d) == "HTTPRoute" && name_of(d) == route)
        .cloned()
        .ok_or_else(|| anyhow!("HTTPRoute {route} is missing from the examples"))?;
    Ok(backend_refs_mut(&mut route)?
        .iter()
        .map(|b| {
            (
                b.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_owned(),
                b.get("weight").and_then(Value::as_u64).unwrap_or(1),
            )
        })
        .collect())
}

/// Swap the weights of the first two backendRefs of the route's first rule.
fn swap_weights(route: &mut Value) -> anyhow::Result<()> {
    let refs = backend_refs_mut(route)?;
    if refs.len() != 2 {
        bail!("the blue-green route must have exactly two backendRefs");
    }
    let weight = |b: &Value| b.get("weight").cloned().unwrap_or(Value::from(1u64));
    let (first, second) = (weight(&refs[0]), weight(&refs[1]));
    for (backend, weight) in refs.iter_mut().zip([second, first]) {
        if let Some(backend) = backend.as_object_mut() {
            backend.insert("weight".into(), weight);
        }
    }
    Ok(())
}

/// The backend with the highest weight in the route's first rule.
fn live_backend(route: &mut Value) -> anyhow::Result<String> {
    backend_refs_mut(route)?
        .iter()
        .max_by_key(|b| b.get("weight").and_then(Value::as_u64).unwrap_or(1))
        .and_then(|b| b.get("name").and_then(Value::as_str))
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("the blue-green route has no backend"))
}

// ---------------------------------------------------------------------------
// Echo pods

/// An endpoint of an EndpointSlice in the examples.
struct PodSpec {
    ip: IpAddr,
    identity: EchoIdentity,
}

fn slice_pods(slice: &Value) -> anyhow::Result<(String, Vec<PodSpec>)> {
    let metadata = slice.get("metadata");
    let namespace = metadata
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let service = metadata
        .and_then(|m| m.get("labels"))
        .and_then(|l| l.get("kubernetes.io/service-name"))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            anyhow!(
                "EndpointSlice {} has no kubernetes.io/service-name label",
                name_of(slice)
            )
        })?;
    let endpoints = slice
        .get("endpoints")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let mut pods = Vec::new();
    for (index, endpoint) in endpoints.iter().enumerate() {
        let address = endpoint
            .get("addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .ok_or_else(|| {
                anyhow!(
                    "EndpointSlice {}: endpoints[{index}] has no address",
                    name_of(slice)
                )
            })?;
        let ip: IpAddr = address.parse().with_context(|| {
            format!(
                "EndpointSlice {}: endpoints[{index}].addresses[0]",
                name_of(slice)
            )
        })?;
        let pod = endpoint
            .get("targetRef")
            .and_then(|t| t.get("name"))
            .and_then(Value::as_str)
            .map_or_else(|| format!("{service}-{}", index + 1), str::to_owned);
        pods.push(PodSpec {
            ip,
            identity: EchoIdentity {
                pod,
                namespace: namespace.to_owned(),
                service: service.to_owned(),
            },
        });
    }
    Ok((service.to_owned(), pods))
}

/// Start an echo server for every endpoint and point the EndpointSlices at
/// them. Returns the servers by Service name.
async fn start_pods(
    files: &mut [(String, Vec<Value>)],
) -> anyhow::Result<BTreeMap<String, Vec<EchoServer>>> {
    match start_pods_on_own_addresses(files).await {
        Ok(pods) => Ok(pods),
        Err(PodsError::AddressNotAvailable) => start_pods_on_own_ports(files).await,
        Err(PodsError::Other(error)) => Err(error),
    }
}

enum PodsError {
    /// This system does not route the slice's loopback addresses.
    AddressNotAvailable,
    Other(anyhow::Error),
}

impl From<anyhow::Error> for PodsError {
    fn from(error: anyhow::Error) -> Self {
        PodsError::Other(error)
    }
}

/// Each pod on its own address, as in the examples; one port per slice
/// (the EndpointSlice port is shared by its endpoints), found free on all of
/// the slice's addresses.
async fn start_pods_on_own_addresses(
    files: &mut [(String, Vec<Value>)],
) -> Result<BTreeMap<String, Vec<EchoServer>>, PodsError> {
    let mut all: BTreeMap<String, Vec<EchoServer>> = BTreeMap::new();
    for slice in files
        .iter_mut()
        .flat_map(|(_, d)| d.iter_mut())
        .filter(|d| kind_of(d) == "EndpointSlice")
    {
        let (service, pods) = slice_pods(slice)?;
        let mut started = None;
        'attempt: for _ in 0..20 {
            let mut servers = Vec::with_capacity(pods.len());
            let mut port = 0u16;
            for pod in &pods {
                match echo::start(SocketAddr::new(pod.ip, port), pod.identity.clone()).await {
                    Ok(server) => {
                        port = server.local_addr().port();
                        servers.push(server);
                    }
                    Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue 'attempt,
                    Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
                        return Err(PodsError::AddressNotAvailable);
                    }
                    Err(e) => {
                        return Err(anyhow!(e)
                            .context(format!("cannot start an echo pod on {}", pod.ip))
                            .into());
                    }
                }
            }
            started = Some((port, servers));
            break;
        }
        let (port, servers) = started
            .ok_or_else(|| anyhow!("no port was free on every address of service {service}"))?;
        set_slice_port(slice, port);
        all.entry(service).or_default().extend(servers);
    }
    Ok(all)
}

/// Every pod on 127.0.0.1 with a port of its own: each slice is split into
/// one slice per endpoint.
async fn start_pods_on_own_ports(
    files: &mut [(String, Vec<Value>)],
) -> anyhow::Result<BTreeMap<String, Vec<EchoServer>>> {
    let mut all: BTreeMap<String, Vec<EchoServer>> = BTreeMap::new();
    for (_, documents) in files.iter_mut() {
        let mut rewritten = Vec::with_capacity(documents.len());
        for document in documents.drain(..) {
            if kind_of(&document) != "EndpointSlice" {
                rewritten.push(document);
                continue;
            }
            let (service, pods) = slice_pods(&document)?;
            for (index, pod) in pods.into_iter().enumerate() {
                let server = echo::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), pod.identity)
                    .await
                    .context("cannot start an echo pod on 127.0.0.1")?;
                let mut slice = document.clone();
                if let Some(metadata) = slice.get_mut("metadata").and_then(Value::as_object_mut) {
                    metadata.insert(
                        "name".into(),
                        format!("{}-{index}", name_of(&document)).into(),
                    );
                }
                if let Some(slice_map) = slice.as_object_mut() {
                    let mut endpoint = document
                        .get("endpoints")
                        .and_then(Value::as_array)
                        .and_then(|e| e.get(index))
                        .cloned()
                        .unwrap_or(Value::Object(Mapping::new()));
                    if let Some(endpoint) = endpoint.as_object_mut() {
                        endpoint.insert("addresses".into(), Value::Array(vec!["127.0.0.1".into()]));
                    }
                    slice_map.insert("endpoints".into(), Value::Array(vec![endpoint]));
                }
                set_slice_port(&mut slice, server.local_addr().port());
                all.entry(service.clone()).or_default().push(server);
                rewritten.push(slice);
            }
        }
        *documents = rewritten;
    }
    Ok(all)
}

fn set_slice_port(slice: &mut Value, port: u16) {
    let ports = slice.get_mut("ports").and_then(Value::as_array_mut);
    for slice_port in ports.into_iter().flatten() {
        if let Some(slice_port) = slice_port.as_object_mut() {
            slice_port.insert("port".into(), u64::from(port).into());
        }
    }
}

// ---------------------------------------------------------------------------
// Traffic

struct Driven {
    sent: usize,
    failed: usize,
    first_failure: Option<String>,
}

/// Snapshot the pods' counters, run `traffic`, and report the difference.
async fn measure(
    pods: &BTreeMap<String, Vec<EchoServer>>,
    title: String,
    traffic: impl Future<Output = Driven>,
) -> anyhow::Result<PhaseReport> {
    let before = counts(pods);
    let driven = traffic.await;
    let after = counts(pods);
    let received = pods
        .iter()
        .map(|(service, servers)| {
            let deltas: Vec<u64> = after[service]
                .iter()
                .zip(&before[service])
                .map(|(a, b)| a - b)
                .collect();
            (
                service.clone(),
                ServiceCount {
                    requests: deltas.iter().sum(),
                    pods_with_traffic: deltas.iter().filter(|d| **d > 0).count(),
                    pods: servers.len(),
                },
            )
        })
        .collect();
    Ok(PhaseReport {
        title,
        sent: driven.sent,
        failed: driven.failed,
        first_failure: driven.first_failure,
        received,
    })
}

fn counts(pods: &BTreeMap<String, Vec<EchoServer>>) -> BTreeMap<String, Vec<u64>> {
    pods.iter()
        .map(|(service, servers)| {
            (
                service.clone(),
                servers.iter().map(EchoServer::requests).collect(),
            )
        })
        .collect()
}

/// Send `total` GET requests for `host` over [`CONNECTIONS`] keep-alive
/// connections; count the ones that did not answer 200.
async fn drive(gateway: SocketAddr, host: &str, headers: &[(&str, &str)], total: usize) -> Driven {
    let mut tasks = Vec::with_capacity(CONNECTIONS);
    for connection in 0..CONNECTIONS {
        let share = total / CONNECTIONS + usize::from(connection < total % CONNECTIONS);
        let host = host.to_owned();
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut driven = Driven {
                sent: 0,
                failed: 0,
                first_failure: None,
            };
            let mut sender: Option<SendRequest<Empty<Bytes>>> = None;
            for i in 0..share {
                driven.sent += 1;
                let path = format!("/demo/{connection}/{i}");
                if let Err(error) = request_once(&mut sender, gateway, &host, &headers, &path).await
                {
                    driven.failed += 1;
                    driven.first_failure.get_or_insert(error);
                    sender = None;
                }
            }
            driven
        }));
    }
    let mut driven = Driven {
        sent: 0,
        failed: 0,
        first_failure: None,
    };
    for task in tasks {
        match task.await {
            Ok(part) => {
                driven.sent += part.sent;
                driven.failed += part.failed;
                if driven.first_failure.is_none() {
                    driven.first_failure = part.first_failure;
                }
            }
            Err(error) => {
                driven.failed += 1;
                driven.first_failure.get_or_insert(error.to_string());
            }
        }
    }
    driven
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Empty<Bytes>>, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake with {addr}: {e}"))?;
    tokio::spawn(connection);
    Ok(sender)
}

/// One request on the kept-alive connection (opened if needed). Returns the
/// response body when the answer is 200.
async fn request_once(
    sender: &mut Option<SendRequest<Empty<Bytes>>>,
    addr: SocketAddr,
    host: &str,
    headers: &[(String, String)],
    path: &str,
) -> Result<Bytes, String> {
    let (status, body) = request_raw(sender, addr, host, headers, path).await?;
    if status != StatusCode::OK {
        return Err(format!("{host}{path}: answered {status}"));
    }
    Ok(body)
}

/// One request on the kept-alive connection (opened if needed): its status
/// and body, whatever the status.
async fn request_raw(
    sender: &mut Option<SendRequest<Empty<Bytes>>>,
    addr: SocketAddr,
    host: &str,
    headers: &[(String, String)],
    path: &str,
) -> Result<(StatusCode, Bytes), String> {
    if sender.as_ref().is_none_or(SendRequest::is_closed) {
        *sender = Some(connect(addr).await?);
    }
    let Some(connection) = sender.as_mut() else {
        return Err("no connection".to_owned());
    };
    connection.ready().await.map_err(|e| e.to_string())?;
    let mut request = Request::get(path).header(http::header::HOST, host);
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let request = request.body(Empty::new()).map_err(|e| e.to_string())?;
    let response = connection
        .send_request(request)
        .await
        .map_err(|e| format!("{host}{path}: {e}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{host}{path}: reading the body: {e}"))?
        .to_bytes();
    Ok((status, body))
}

/// Poll the admin listener's `/readyz` until it answers 200.
async fn wait_ready(admin: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut last = String::new();
    while Instant::now() < deadline {
        let mut sender = None;
        match request_once(&mut sender, admin, "localhost", &[], "/readyz").await {
            Ok(_) => return Ok(()),
            Err(error) => last = error,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the gateway did not become ready: {last}")
}

/// Send requests for `host` until one is answered by a pod of `service`
/// (the gateway is serving the configuration that routes there).
async fn wait_for_backend(
    gateway: SocketAddr,
    host: &str,
    headers: &[(String, String)],
    service: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut last = String::new();
    let mut sender = None;
    while Instant::now() < deadline {
        match request_once(&mut sender, gateway, host, headers, "/demo/probe").await {
            Ok(body) => match serde_json::from_slice::<EchoResponse>(&body) {
                Ok(echoed) if echoed.service == service => return Ok(()),
                Ok(echoed) => last = format!("answered by {}", echoed.service),
                Err(error) => last = format!("not an echo response: {error}"),
            },
            Err(error) => {
                last = error;
                sender = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("{host} was not routed to {service} in time ({last})")
}

// ---------------------------------------------------------------------------
// Output

/// Print a weighted route's table: configured share = weight / sum.
/// The gateway's own observed share of each backend of `route`'s rule 0,
/// by Service name: the `sluice_backend_observed_share` gauges of its
/// `/metrics` (empty when they cannot be read).
async fn observed_shares(admin: SocketAddr, route: &str) -> BTreeMap<String, f64> {
    let mut sender = None;
    let Ok(body) = request_once(&mut sender, admin, "localhost", &[], "/metrics").await else {
        return BTreeMap::new();
    };
    let route_label = format!("route=\"{route}\",rule=\"0\",");
    String::from_utf8_lossy(&body)
        .lines()
        .filter_map(|l| l.strip_prefix("sluice_backend_observed_share{"))
        .filter(|l| l.starts_with(&route_label))
        .filter_map(|l| {
            let name = l.split("backend_name=\"").nth(1)?.split('"').next()?;
            let value = l.rsplit(' ').next()?.parse::<f64>().ok()?;
            Some((name.to_owned(), value))
        })
        .collect()
}

fn print_weighted(
    out: &mut (dyn Write + Send),
    phase: &PhaseReport,
    weights: &[(String, u64)],
    observed: &BTreeMap<String, f64>,
    pods: &BTreeMap<String, Vec<EchoServer>>,
    verbose: bool,
) -> anyhow::Result<()> {
    let sum: u64 = weights.iter().map(|(_, w)| w).sum();
    let expected: Vec<(String, Option<u64>, f64)> = weights
        .iter()
        .map(|(name, weight)| {
            let share = if sum == 0 {
                0.0
            } else {
                100.0 * *weight as f64 / sum as f64
            };
            (name.clone(), Some(*weight), share)
        })
        .collect();
    print_table(out, phase, &expected, Some(observed), pods, verbose)
}

fn print_table(
    out: &mut (dyn Write + Send),
    phase: &PhaseReport,
    expected: &[(String, Option<u64>, f64)],
    observed: Option<&BTreeMap<String, f64>>,
    pods: &BTreeMap<String, Vec<EchoServer>>,
    verbose: bool,
) -> anyhow::Result<()> {
    writeln!(out, "{}", phase.title)?;
    let width = expected
        .iter()
        .map(|(name, _, _)| name.len())
        .max()
        .unwrap_or(0)
        .max("backend".len());
    writeln!(
        out,
        "  {:<width$}  {:>7}  {:>10}  {:>9}  {:>8}  {:>8}  {:>5}",
        "backend", "weight", "configured", "received", "actual", "observed", "pods with traffic"
    )?;
    let received_total: u64 = expected
        .iter()
        .filter_map(|(name, _, _)| phase.received.get(name))
        .map(|c| c.requests)
        .sum();
    for (name, weight, share) in expected {
        let count = phase.received.get(name).copied().unwrap_or(ServiceCount {
            requests: 0,
            pods_with_traffic: 0,
            pods: 0,
        });
        let actual = if received_total == 0 {
            0.0
        } else {
            100.0 * count.requests as f64 / received_total as f64
        };
        let weight = weight.map_or_else(|| "-".to_owned(), |w| w.to_string());
        let seen = observed
            .and_then(|o| o.get(name))
            .map_or_else(|| "-".to_owned(), |f| format_share(f * 100.0));
        writeln!(
            out,
            "  {name:<width$}  {weight:>7}  {:>10}  {:>9}  {:>8}  {seen:>8}  {}/{}",
            format_share(*share),
            count.requests,
            format_share(actual),
            count.pods_with_traffic,
            count.pods
        )?;
        if verbose && let Some(servers) = pods.get(name) {
            for server in servers {
                writeln!(
                    out,
                    "      {:<28} {:>21}  {} requests in total",
                    server.identity().pod,
                    server.local_addr(),
                    server.requests()
                )?;
            }
        }
    }
    let failed = match &phase.first_failure {
        None => String::new(),
        Some(first) => format!(", {} FAILED (first: {first})", phase.failed),
    };
    writeln!(
        out,
        "  sent {}, backends received {received_total}{failed}",
        phase.sent
    )?;
    if observed.is_some() {
        writeln!(
            out,
            "  observed: the gateway's sluice_backend_observed_share gauge (the rule's requests over the last minute)"
        )?;
    }
    writeln!(out)?;
    Ok(())
}

// ---------------------------------------------------------------------------

/// A private directory under the system's temp dir, removed on drop.
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn create() -> anyhow::Result<Self> {
        let base = std::env::temp_dir();
        for attempt in 0..100u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path = base.join(format!(
                "sluice-demo-{}-{nanos}-{attempt}",
                std::process::id()
            ));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(anyhow!(e).context(format!("cannot create {}", path.display())));
                }
            }
        }
        bail!("cannot create a temporary directory in {}", base.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> anyhow::Result<u16> {
    crate::ports::free_loopback_port().context("cannot find a free port on 127.0.0.1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_parse_and_have_the_documented_shape() {
        let files = parse_examples().expect("embedded examples parse");
        let weights = route_weights(&files, "autocomplete").expect("autocomplete route");
        assert_eq!(
            weights,
            vec![
                ("autocomplete-stable".to_owned(), 995),
                ("autocomplete-canary".to_owned(), 5)
            ]
        );
        let mut pods_per_service = BTreeMap::new();
        for slice in files
            .iter()
            .flat_map(|(_, d)| d.iter())
            .filter(|d| kind_of(d) == "EndpointSlice")
        {
            let (service, pods) = slice_pods(slice).expect("slice pods");
            *pods_per_service.entry(service).or_insert(0) += pods.len();
        }
        assert_eq!(pods_per_service["autocomplete-stable"], 47);
        assert_eq!(pods_per_service["autocomplete-canary"], 2);
    }

    #[test]
    fn flipping_swaps_the_blue_green_weights() {
        let mut files = parse_examples().expect("embedded examples parse");
        let documents = &mut files
            .iter_mut()
            .find(|(name, _)| name == BLUE_GREEN_FILE)
            .expect("blue-green example")
            .1;
        let route = find_route(documents, "checkout").expect("checkout route");
        assert_eq!(live_backend(route).expect("live"), "checkout-green");
        swap_weights(route).expect("swap");
        assert_eq!(live_backend(route).expect("live"), "checkout-blue");
        assert_eq!(
            route_weights(&files, "checkout").expect("weights"),
            vec![
                ("checkout-blue".to_owned(), 1),
                ("checkout-green".to_owned(), 0)
            ]
        );
    }

    #[test]
    fn listener_and_slice_ports_are_rewritten() {
        let mut files = parse_examples().expect("embedded examples parse");
        set_listener_ports(&mut files, 4242);
        let gateway = files
            .iter()
            .flat_map(|(_, d)| d.iter())
            .find(|d| kind_of(d) == "Gateway")
            .expect("gateway");
        assert_eq!(gateway["spec"]["listeners"][0]["port"].as_u64(), Some(4242));
        let slice = files
            .iter_mut()
            .flat_map(|(_, d)| d.iter_mut())
            .find(|d| kind_of(d) == "EndpointSlice")
            .expect("slice");
        set_slice_port(slice, 31337);
        assert_eq!(slice["ports"][0]["port"].as_u64(), Some(31337));
    }

    #[tokio::test]
    async fn without_own_loopback_addresses_every_pod_gets_a_slice_and_port() {
        let mut files = parse_examples().expect("embedded examples parse");
        let pods = start_pods_on_own_ports(&mut files)
            .await
            .expect("pods start on 127.0.0.1");
        assert_eq!(pods["autocomplete-stable"].len(), 47);
        assert_eq!(pods["autocomplete-canary"].len(), 2);
        let slices: Vec<&Value> = files
            .iter()
            .flat_map(|(_, d)| d.iter())
            .filter(|d| kind_of(d) == "EndpointSlice")
            .collect();
        let total: usize = pods.values().map(Vec::len).sum();
        assert_eq!(slices.len(), total);
        let mut ports: Vec<u64> = Vec::new();
        for slice in &slices {
            assert_eq!(slice["endpoints"].as_array().map(Vec::len), Some(1));
            assert_eq!(
                slice["endpoints"][0]["addresses"][0].as_str(),
                Some("127.0.0.1")
            );
            ports.push(slice["ports"][0]["port"].as_u64().expect("port"));
        }
        let servers: Vec<u64> = pods
            .values()
            .flatten()
            .map(|s| u64::from(s.local_addr().port()))
            .collect();
        ports.sort_unstable();
        let mut sorted = servers.clone();
        sorted.sort_unstable();
        assert_eq!(ports, sorted, "each slice points at its own echo pod");
    }
}
