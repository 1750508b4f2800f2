//! The cluster the conformance suite expects, made of loopback pieces.
//!
//! Upstream, the suite applies `base/manifests.yaml` and each test's YAML to
//! a cluster: Deployments of the `echo-basic` backend, Services selecting
//! them, Gateways that each get their own address. Here:
//! - every Deployment replica is an in-process [`sluice::echo`] server whose
//!   pod name starts with the Deployment's name (the suite identifies the
//!   backend by that prefix);
//! - every Service gets one EndpointSlice per selected pod, listing that
//!   pod's own loopback port under each Service port (name and appProtocol
//!   kept), as the EndpointSlice controller would;
//! - every Gateway listener port is moved to a free loopback port, one per
//!   (Gateway, port): in a cluster each Gateway has its own address, so two
//!   Gateways on port 80 never share a socket. [`PortMap`] translates the
//!   ports a test names (requests, parentRef ports, redirect locations).
//!   A ListenerSet's listeners are served on its parent Gateway's address,
//!   so their ports are moved under the parent Gateway's key: a ListenerSet
//!   listener on port 80 shares the loopback port of its Gateway's port 80.
//!
//! The manifests are kept as YAML values with their original ports (the
//! "logical" view a test reasons about) and rendered to a temporary
//! directory that `sluice serve` watches; tests that modify objects edit the
//! logical view and render again.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls_pki_types::CertificateDer;
use serde_json::{Map as Mapping, Value};
use sluice::echo::EchoIdentity;

use crate::backend::EchoPod;

/// Our GatewayClass, replacing the suite's `{GATEWAY_CLASS_NAME}`.
pub const GATEWAY_CLASS: &str = "sluice-conformance";

/// One manifest file: its YAML documents in order.
#[derive(Debug, Clone)]
pub struct ManifestFile {
    /// File name inside the rendered directory.
    pub name: String,
    pub docs: Vec<Value>,
}

/// Parse a multi-document YAML file after the suite's class placeholder is
/// replaced by ours.
pub fn parse_file(path: &Path, name: &str) -> anyhow::Result<ManifestFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = text.replace("{GATEWAY_CLASS_NAME}", GATEWAY_CLASS).replace(
        "{GATEWAY_CONTROLLER_NAME}",
        sluice::resources::CONTROLLER_NAME,
    );
    let docs = sluice::yaml::documents(&text)
        .with_context(|| format!("{}: invalid YAML", path.display()))?
        .into_iter()
        .map(|d| overlay_static_addresses(d.value))
        .collect();
    Ok(ManifestFile {
        name: name.to_owned(),
        docs,
    })
}

/// The address the suite is told sluice can use (`UsableNetworkAddresses`):
/// the loopback address the runner serves on.
pub const USABLE_ADDRESS: &str = "127.0.0.1";
/// An address sluice cannot bind (`UnusableNetworkAddresses`): TEST-NET-1
/// (RFC 5737), never assigned to a local interface.
pub const UNUSABLE_ADDRESS: &str = "192.0.2.1";

/// What the suite's applier does to a Gateway with static addresses: the
/// `test/fake-invalid-type` entries are kept, then `PLACEHOLDER_UNUSABLE_ADDRS`
/// and `PLACEHOLDER_USABLE_ADDRS` become the unusable and usable addresses
/// (in that order); a Gateway with neither placeholder is left as it is.
fn overlay_static_addresses(mut doc: Value) -> Value {
    if kind(&doc) != "Gateway" {
        return doc;
    }
    let Some(addresses) = doc
        .get_mut("spec")
        .and_then(|s| s.get_mut("addresses"))
        .and_then(Value::as_array_mut)
    else {
        return doc;
    };
    let value_is = |a: &Value, v: &str| a.get("value").and_then(Value::as_str) == Some(v);
    let usable = addresses
        .iter()
        .any(|a| value_is(a, "PLACEHOLDER_USABLE_ADDRS"));
    let unusable = addresses
        .iter()
        .any(|a| value_is(a, "PLACEHOLDER_UNUSABLE_ADDRS"));
    if !usable && !unusable {
        return doc;
    }
    let ip = |v: &str| -> Value {
        sluice::yaml::from_str(&format!("{{type: IPAddress, value: \"{v}\"}}"))
            .expect("the address template is valid YAML")
    };
    let mut out: Vec<Value> = addresses
        .iter()
        .filter(|a| a.get("type").and_then(Value::as_str) == Some("test/fake-invalid-type"))
        .cloned()
        .collect();
    if unusable {
        out.push(ip(UNUSABLE_ADDRESS));
    }
    if usable {
        out.push(ip(USABLE_ADDRESS));
    }
    *addresses = out;
    doc
}

pub fn kind(doc: &Value) -> &str {
    doc.get("kind").and_then(Value::as_str).unwrap_or("")
}

pub fn name(doc: &Value) -> &str {
    doc.get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn namespace(doc: &Value) -> &str {
    doc.get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or("default")
}

/// `namespace/name` of an object.
pub fn object_id(doc: &Value) -> String {
    format!("{}/{}", namespace(doc), name(doc))
}

/// Listener ports of Gateways, moved to free loopback ports.
#[derive(Debug, Default, Clone)]
pub struct PortMap {
    /// (`ns/gateway`, original port) -> actual port.
    ports: BTreeMap<(String, u16), u16>,
    /// `ns/listenerset` -> `ns/gateway` of its parentRef.
    listener_sets: BTreeMap<String, String>,
}

impl PortMap {
    /// The loopback port serving `gateway`'s listeners on `port`.
    pub fn actual(&self, gateway: &str, port: u16) -> Option<u16> {
        self.ports.get(&(gateway.to_owned(), port)).copied()
    }

    /// The port a test named for an actual port we chose, if it is ours.
    pub fn original(&self, actual: u16) -> Option<u16> {
        self.ports
            .iter()
            .find(|(_, a)| **a == actual)
            .map(|((_, port), _)| *port)
    }

    /// Record that ListenerSet `listener_set` (`ns/name`) attaches to
    /// `gateway` (`ns/name`): its listener ports are the Gateway's.
    pub fn add_listener_set(&mut self, listener_set: &str, gateway: &str) {
        self.listener_sets
            .insert(listener_set.to_owned(), gateway.to_owned());
    }

    /// The `ns/name` of the Gateway whose address serves `parent`'s
    /// listeners: the parent Gateway of a known ListenerSet, else `parent`.
    pub fn gateway_of<'a>(&'a self, parent: &'a str) -> &'a str {
        self.listener_sets
            .get(parent)
            .map(String::as_str)
            .unwrap_or(parent)
    }

    /// The loopback port for `gateway`'s listeners on `port` (chosen on first use).
    pub fn assign(&mut self, gateway: &str, port: u16) -> anyhow::Result<u16> {
        if let Some(actual) = self.actual(gateway, port) {
            return Ok(actual);
        }
        let actual = free_port()?;
        self.ports.insert((gateway.to_owned(), port), actual);
        Ok(actual)
    }
}

/// A free loopback port (bound and released; the gateway binds it next).
fn free_port() -> anyhow::Result<u16> {
    sluice::ports::free_loopback_port().context("cannot bind a loopback port")
}

/// An echo pod of a Deployment.
pub struct Pod {
    pub namespace: String,
    pub deployment: String,
    /// The Deployment's pod template labels (what Services select).
    pub labels: BTreeMap<String, String>,
    pub server: EchoPod,
}

/// All echo pods started so far, kept across tests (like the suite's base
/// Deployments, which stay up for the whole run).
#[derive(Default)]
pub struct Pods {
    pods: Vec<Arc<Pod>>,
    /// (namespace, deployment) already started.
    started: HashMap<(String, String), ()>,
}

impl Pods {
    /// Start the replicas of every Deployment in `files` not yet running.
    pub async fn start_deployments(&mut self, files: &[ManifestFile]) -> anyhow::Result<()> {
        for doc in files.iter().flat_map(|f| &f.docs) {
            if kind(doc) != "Deployment" {
                continue;
            }
            let key = (namespace(doc).to_owned(), name(doc).to_owned());
            if self.started.contains_key(&key) {
                continue;
            }
            let replicas = doc
                .get("spec")
                .and_then(|s| s.get("replicas"))
                .and_then(Value::as_u64)
                .unwrap_or(1);
            let labels = string_map(
                doc.get("spec")
                    .and_then(|s| s.get("template"))
                    .and_then(|t| t.get("metadata"))
                    .and_then(|m| m.get("labels")),
            );
            for replica in 0..replicas {
                let identity = EchoIdentity {
                    pod: format!("{}-5f7c9-{replica}", key.1),
                    namespace: key.0.clone(),
                    service: key.1.clone(),
                };
                let server = match (mode(doc), crate::backend_tls::server_config(doc)?) {
                    (Mode::Grpc, _) => EchoPod::start_grpc(identity).await,
                    (Mode::Tcp, Some(tls)) => EchoPod::start_tcp(identity, tls).await,
                    (Mode::Tcp, None) => {
                        bail!(
                            "Deployment {}/{}: TCP_ECHO_SERVER without TLS_SERVER_CERT",
                            key.0,
                            key.1
                        )
                    }
                    (Mode::Http, Some(tls)) => EchoPod::start_tls(identity, tls).await,
                    (Mode::Http, None) => EchoPod::start(identity).await,
                }
                .with_context(|| format!("cannot start echo pod for {}/{}", key.0, key.1))?;
                self.pods.push(Arc::new(Pod {
                    namespace: key.0.clone(),
                    deployment: key.1.clone(),
                    labels: labels.clone(),
                    server,
                }));
            }
            self.started.insert(key, ());
        }
        Ok(())
    }

    /// Pods of a Deployment.
    pub fn of(&self, namespace: &str, deployment: &str) -> Vec<Arc<Pod>> {
        self.pods
            .iter()
            .filter(|p| p.namespace == namespace && p.deployment == deployment)
            .cloned()
            .collect()
    }

    fn selected(&self, namespace: &str, selector: &BTreeMap<String, String>) -> Vec<Arc<Pod>> {
        if selector.is_empty() {
            return Vec::new();
        }
        self.pods
            .iter()
            .filter(|p| {
                p.namespace == namespace && selector.iter().all(|(k, v)| p.labels.get(k) == Some(v))
            })
            .cloned()
            .collect()
    }
}

/// What an echo-basic container serves, by its environment.
enum Mode {
    Http,
    /// `GRPC_ECHO_SERVER`: the gRPC echo service.
    Grpc,
    /// `TCP_ECHO_SERVER`: the TCP echo server.
    Tcp,
}

fn mode(deployment: &Value) -> Mode {
    let set = |name: &str| {
        deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["env"].as_array().into_iter().flatten())
            .any(|e| e["name"].as_str() == Some(name))
    };
    if set("GRPC_ECHO_SERVER") {
        Mode::Grpc
    } else if set("TCP_ECHO_SERVER") {
        Mode::Tcp
    } else {
        Mode::Http
    }
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(Value::Object(m)) = value {
        for (k, v) in m {
            if let Some(v) = v.as_str() {
                out.insert(k.clone(), v.to_owned());
            }
        }
    }
    out
}

/// Render the logical manifests into `dir`: ports moved, Deployments left
/// out (the pods run in-process), EndpointSlices and our GatewayClass added.
pub fn render(
    dir: &Path,
    files: &[ManifestFile],
    pods: &Pods,
    ports: &mut PortMap,
) -> anyhow::Result<()> {
    let mut generated = vec![gateway_class()];
    generated.extend(suite_secrets()?.iter().cloned());
    generated.extend(crate::client_cert::suite_objects()?);
    generated.extend(crate::backend_tls::suite_objects()?);
    for doc in files.iter().flat_map(|f| &f.docs) {
        if kind(doc) == "ListenerSet" {
            ports.add_listener_set(&object_id(doc), &listener_set_parent(doc));
        }
    }
    for file in files {
        let mut out = Vec::new();
        for doc in &file.docs {
            match kind(doc) {
                "Deployment" => continue,
                "Gateway" => out.push(render_gateway(doc, ports)?),
                "ListenerSet" => out.push(render_listener_set(doc, ports)?),
                "HTTPRoute" | "GRPCRoute" | "TLSRoute" => out.push(render_route(doc, ports)),
                "Service" => {
                    generated.extend(endpoint_slices(doc, pods));
                    out.push(doc.clone());
                }
                _ => out.push(doc.clone()),
            }
        }
        write_docs(&dir.join(&file.name), &out)?;
    }
    write_docs(&dir.join("zz-generated.yaml"), &generated)
}

fn write_docs(path: &PathBuf, docs: &[Value]) -> anyhow::Result<()> {
    let mut text = String::new();
    for doc in docs {
        text.push_str("---\n");
        text.push_str(&sluice::yaml::to_string(doc)?);
    }
    // Write then rename, so the watcher never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// The TLS Secrets the upstream suite creates at set-up (self-signed,
/// generated once per run): `(namespace, name, DNS names)`.
const SUITE_SECRETS: &[(&str, &str, &[&str])] = &[
    (
        "gateway-conformance-infra",
        "tls-validity-checks-certificate",
        &[
            "*.org",
            "*.wildcard.org",
            "example.org",
            "second-example.org",
            "third-example.org",
            "fourth-example.wildcard.org",
            "*.example.com",
            "example.com",
        ],
    ),
    (
        "gateway-conformance-web-backend",
        "certificate",
        &["*.org", "example.org", "*.example.com", "example.com"],
    ),
];

/// A self-signed CA the runner issues certificates with.
pub struct RunnerCa {
    pub cert: rcgen::Certificate,
    issuer: Issuer<'static, KeyPair>,
}

impl RunnerCa {
    /// A new CA named `common_name`.
    pub fn new(common_name: &str) -> anyhow::Result<RunnerCa> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let key = KeyPair::generate()
            .with_context(|| format!("cannot generate the key of CA {common_name}"))?;
        let cert = params
            .self_signed(&key)
            .with_context(|| format!("cannot sign CA {common_name}"))?;
        Ok(RunnerCa {
            cert,
            issuer: Issuer::new(params, key),
        })
    }

    /// A certificate for the DNS `names` (a name with `://` is a URI
    /// subjectAltName), with `common_name` as subject when given, and its
    /// new key; `what` names it in the error.
    pub fn issue(
        &self,
        names: Vec<String>,
        common_name: Option<&str>,
        what: &str,
    ) -> anyhow::Result<(rcgen::Certificate, KeyPair)> {
        let key = KeyPair::generate()?;
        let (uris, dns): (Vec<String>, Vec<String>) =
            names.into_iter().partition(|n| n.contains("://"));
        let cert = CertificateParams::new(dns)
            .and_then(|mut params| {
                for uri in uris {
                    params
                        .subject_alt_names
                        .push(rcgen::SanType::URI(uri.as_str().try_into()?));
                }
                if let Some(cn) = common_name {
                    params.distinguished_name.push(DnType::CommonName, cn);
                }
                params.signed_by(&key, &self.issuer)
            })
            .with_context(|| format!("cannot issue {what}"))?;
        Ok((cert, key))
    }

    /// ConfigMap `namespace/name` holding this CA's PEM under `ca.crt`.
    pub fn config_map(&self, namespace: &str, name: &str) -> anyhow::Result<Value> {
        Ok(serde_json::to_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": {"ca.crt": self.cert.pem()},
        }))?)
    }
}

/// A `kubernetes.io/tls` Secret `namespace/name` holding `cert` and `key`.
pub fn tls_secret(
    namespace: &str,
    name: &str,
    cert: &rcgen::Certificate,
    key: &KeyPair,
) -> anyhow::Result<Value> {
    Ok(serde_json::to_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64(cert.pem().as_bytes()),
            "tls.key": base64(key.serialize_pem().as_bytes()),
        },
    }))?)
}

/// The certificates of one run: a CA the runner's TLS client trusts, and
/// the suite's Secrets, each holding a certificate it issued.
struct SuitePki {
    ca: CertificateDer<'static>,
    secrets: Vec<Value>,
    /// Each issued certificate and its DNS names.
    issued: Vec<(CertificateDer<'static>, Vec<String>)>,
}

fn suite_pki() -> anyhow::Result<&'static SuitePki> {
    static PKI: std::sync::OnceLock<SuitePki> = std::sync::OnceLock::new();
    if let Some(p) = PKI.get() {
        return Ok(p);
    }
    let ca = RunnerCa::new("sluice conformance CA")?;
    let mut secrets = Vec::new();
    let mut issued = Vec::new();
    for (ns, name, hosts) in SUITE_SECRETS {
        let names: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let (cert, key) = ca.issue(
            names.clone(),
            None,
            &format!("the certificate of Secret {ns}/{name}"),
        )?;
        secrets.push(tls_secret(ns, name, &cert, &key)?);
        issued.push((cert.der().clone(), names));
    }
    Ok(PKI.get_or_init(|| SuitePki {
        ca: ca.cert.der().clone(),
        secrets,
        issued,
    }))
}

/// The suite's TLS Secrets as manifests (generated on first use).
fn suite_secrets() -> anyhow::Result<&'static [Value]> {
    Ok(&suite_pki()?.secrets)
}

/// The CA that issued every suite certificate (what a TLS client trusts).
pub fn suite_ca() -> anyhow::Result<CertificateDer<'static>> {
    Ok(suite_pki()?.ca.clone())
}

/// The DNS names of a certificate the runner issued, if it is one.
pub fn issued_names(cert: &CertificateDer<'_>) -> Option<Vec<String>> {
    let pki = suite_pki().ok()?;
    pki.issued
        .iter()
        .find(|(der, _)| der.as_ref() == cert.as_ref())
        .map(|(_, names)| names.clone())
}

/// Standard base64 with padding (Secret `data` values).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn gateway_class() -> Value {
    sluice::yaml::from_str(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata:\n  name: {GATEWAY_CLASS}\nspec:\n  controllerName: {}\n",
        sluice::resources::CONTROLLER_NAME
    ))
    .expect("the GatewayClass template is valid YAML")
}

fn render_gateway(doc: &Value, ports: &mut PortMap) -> anyhow::Result<Value> {
    let id = object_id(doc);
    move_listener_ports(doc, &format!("Gateway {id}"), &id, ports)
}

/// `ns/name` of the Gateway a ListenerSet's `spec.parentRef` names (its
/// namespace defaults to the ListenerSet's).
fn listener_set_parent(doc: &Value) -> String {
    let parent = doc.get("spec").and_then(|s| s.get("parentRef"));
    let ns = parent
        .and_then(|p| p.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or_else(|| namespace(doc));
    let name = parent
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("");
    format!("{ns}/{name}")
}

/// A ListenerSet's listeners are served on its parent Gateway's address:
/// their ports move with the parent Gateway's key.
fn render_listener_set(doc: &Value, ports: &mut PortMap) -> anyhow::Result<Value> {
    let gateway = listener_set_parent(doc);
    let what = format!("ListenerSet {}", object_id(doc));
    move_listener_ports(doc, &what, &gateway, ports)
}

/// A copy of `doc` with each `spec.listeners[].port` replaced by the
/// loopback port of (`gateway`, port).
fn move_listener_ports(
    doc: &Value,
    what: &str,
    gateway: &str,
    ports: &mut PortMap,
) -> anyhow::Result<Value> {
    let mut doc = doc.clone();
    let Some(listeners) = doc
        .get_mut("spec")
        .and_then(|s| s.get_mut("listeners"))
        .and_then(Value::as_array_mut)
    else {
        return Ok(doc);
    };
    for listener in listeners {
        let Some(port) = listener.get("port").and_then(Value::as_u64) else {
            continue;
        };
        let Ok(port) = u16::try_from(port) else {
            bail!("{what}: listener port {port} out of range");
        };
        let actual = ports.assign(gateway, port)?;
        if let Some(m) = listener.as_object_mut() {
            m.insert("port".into(), Value::from(actual));
        }
    }
    crate::client_cert::remap_per_port(&mut doc, gateway, ports);
    Ok(doc)
}

fn render_route(doc: &Value, ports: &PortMap) -> Value {
    let mut doc = doc.clone();
    let route_ns = namespace(&doc).to_owned();
    let Some(parents) = doc
        .get_mut("spec")
        .and_then(|s| s.get_mut("parentRefs"))
        .and_then(Value::as_array_mut)
    else {
        return doc;
    };
    for parent in parents {
        let kind = parent
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("Gateway");
        if kind != "Gateway" && kind != "ListenerSet" {
            continue;
        }
        let ns = parent
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or(&route_ns);
        let name = parent.get("name").and_then(Value::as_str).unwrap_or("");
        let parent_id = format!("{ns}/{name}");
        // A ListenerSet's ports are its parent Gateway's.
        let gateway = if kind == "ListenerSet" {
            ports.gateway_of(&parent_id).to_owned()
        } else {
            parent_id
        };
        let Some(port) = parent.get("port").and_then(Value::as_u64) else {
            continue;
        };
        let actual = u16::try_from(port)
            .ok()
            .and_then(|p| ports.actual(&gateway, p));
        if let (Some(actual), Some(m)) = (actual, parent.as_object_mut()) {
            m.insert("port".into(), Value::from(actual));
        }
    }
    doc
}

/// One EndpointSlice per pod the Service selects, each listing the pod's
/// echo port under every Service port.
fn endpoint_slices(service: &Value, pods: &Pods) -> Vec<Value> {
    let ns = namespace(service);
    let svc = name(service);
    let spec = service.get("spec");
    let selector = string_map(spec.and_then(|s| s.get("selector")));
    let service_ports: Vec<&Value> = spec
        .and_then(|s| s.get("ports"))
        .and_then(Value::as_array)
        .map(|s| s.iter().collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for (index, pod) in pods.selected(ns, &selector).iter().enumerate() {
        let mut slice_ports = Vec::new();
        for service_port in &service_ports {
            let target = service_port
                .get("targetPort")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok());
            let port = pod.server.port_for(target);
            let mut p = Mapping::new();
            p.insert(
                "name".into(),
                service_port
                    .get("name")
                    .cloned()
                    .unwrap_or_else(|| Value::from("")),
            );
            p.insert("port".into(), Value::from(port));
            p.insert("protocol".into(), Value::from("TCP"));
            if let Some(app) = service_port.get("appProtocol") {
                p.insert("appProtocol".into(), app.clone());
            }
            slice_ports.push(Value::Object(p));
        }
        let slice = serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{svc}-{index}"),
                "namespace": ns,
                "labels": {"kubernetes.io/service-name": svc},
            },
            "addressType": "IPv4",
            "endpoints": [{
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "name": pod.server.identity().pod, "namespace": ns},
            }],
        });
        let mut slice: Value =
            serde_json::to_value(slice).expect("a JSON value converts to a YAML value");
        if let Some(m) = slice.as_object_mut() {
            m.insert("ports".into(), Value::Array(slice_ports));
        }
        out.push(slice);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_pads_like_rfc_4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn ports_are_moved_per_gateway_and_translated_back() {
        let mut ports = PortMap::default();
        let a = ports.assign("ns/a", 80).unwrap();
        let b = ports.assign("ns/b", 80).unwrap();
        assert_ne!(a, b, "two Gateways on port 80 get their own sockets");
        assert_eq!(
            ports.assign("ns/a", 80).unwrap(),
            a,
            "stable per (Gateway, port)"
        );
        assert_eq!(ports.original(a), Some(80));
        assert_eq!(ports.original(1), None);
    }

    fn yaml(text: &str) -> Value {
        sluice::yaml::from_str(text).expect("test YAML is valid")
    }

    fn listener_ports(doc: &Value) -> Vec<u64> {
        doc["spec"]["listeners"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["port"].as_u64())
            .collect()
    }

    #[test]
    fn listener_set_ports_move_with_their_parent_gateway() {
        let mut ports = PortMap::default();
        let gateway = yaml(
            "kind: Gateway\nmetadata: {name: gw, namespace: infra}\n\
             spec: {listeners: [{name: a, port: 80}]}",
        );
        // parentRef namespace omitted: the ListenerSet's own.
        let set = yaml(
            "kind: ListenerSet\nmetadata: {name: ls, namespace: infra}\n\
             spec: {parentRef: {name: gw}, listeners: [{name: b, port: 80}, {name: c, port: 8080}]}",
        );
        let other = yaml(
            "kind: Gateway\nmetadata: {name: other, namespace: infra}\n\
             spec: {listeners: [{name: a, port: 80}]}",
        );
        let set_rendered = render_listener_set(&set, &mut ports).unwrap();
        let gw_rendered = render_gateway(&gateway, &mut ports).unwrap();
        let other_rendered = render_gateway(&other, &mut ports).unwrap();
        let on80 = ports.actual("infra/gw", 80).unwrap();
        let on8080 = ports.actual("infra/gw", 8080).unwrap();
        assert_eq!(
            listener_ports(&set_rendered),
            [u64::from(on80), u64::from(on8080)],
            "the ListenerSet's port 80 is its Gateway's port 80, whichever is rendered first"
        );
        assert_eq!(listener_ports(&gw_rendered), [u64::from(on80)]);
        assert_ne!(
            listener_ports(&other_rendered),
            [u64::from(on80)],
            "another Gateway on port 80 keeps its own socket"
        );
        assert_eq!(ports.original(on8080), Some(8080));
        assert!(
            ports.actual("infra/ls", 80).is_none(),
            "keyed by the Gateway only"
        );
    }

    #[test]
    fn route_parent_ports_of_listener_sets_use_the_parent_gateway() {
        let mut ports = PortMap::default();
        ports.add_listener_set("apps/ls", "infra/gw");
        assert_eq!(ports.gateway_of("apps/ls"), "infra/gw");
        assert_eq!(ports.gateway_of("infra/gw"), "infra/gw");
        let actual = ports.assign("infra/gw", 8080).unwrap();
        let route = yaml(
            "kind: HTTPRoute\nmetadata: {name: r, namespace: apps}\n\
             spec: {parentRefs: [{kind: ListenerSet, name: ls, port: 8080}, {kind: Service, name: s, port: 8080}]}",
        );
        let rendered = render_route(&route, &ports);
        assert_eq!(
            rendered["spec"]["parentRefs"][0]["port"].as_u64(),
            Some(u64::from(actual))
        );
        assert_eq!(
            rendered["spec"]["parentRefs"][1]["port"].as_u64(),
            Some(8080),
            "other kinds are left alone"
        );
    }

    #[test]
    fn listener_set_parent_defaults_to_its_namespace() {
        let set = yaml(
            "kind: ListenerSet\nmetadata: {name: ls, namespace: a}\nspec: {parentRef: {name: gw, namespace: b}}",
        );
        assert_eq!(listener_set_parent(&set), "b/gw");
        let set = yaml(
            "kind: ListenerSet\nmetadata: {name: ls, namespace: a}\nspec: {parentRef: {name: gw}}",
        );
        assert_eq!(listener_set_parent(&set), "a/gw");
    }
}
