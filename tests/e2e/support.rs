//! The end-to-end harness: the real `sluice` binary, real manifests in a
//! temporary directory, echo backends on loopback, and a real HTTP client.
//!
//! Ports are ephemeral: backends bind port 0; the gateway's listener and
//! admin ports are taken free from the OS just before the gateway starts.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sluice::echo::{EchoIdentity, EchoResponse, EchoServer};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    sluice::ports::free_loopback_port().expect("a free loopback port")
}

/// GatewayClass `sluice` and Gateway `default/gw` with one HTTP listener on
/// the test's port (`{{PORT}}`) that admits routes from every namespace.
/// Our GatewayClass `sluice` and the head of Gateway `default/gw` of that
/// class, up to `spec.gatewayClassName`: the test writes the rest of the
/// spec (fields indented by two spaces).
pub const GATEWAY_HEAD: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sluice}
spec: {controllerName: sluice.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec:
  gatewayClassName: sluice
";

/// Gateway `default/gw` with one HTTP listener on `{{PORT}}` taking routes
/// from every namespace.
pub fn gateway() -> String {
    format!(
        "{GATEWAY_HEAD}  listeners:
  - name: http
    protocol: HTTP
    port: {{{{PORT}}}}
    allowedRoutes:
      namespaces:
        from: All
"
    )
}

/// The pods of one Service: echo servers on loopback.
pub struct Pods {
    pub namespace: String,
    pub service: String,
    pub servers: Vec<EchoServer>,
}

impl Pods {
    pub async fn start(namespace: &str, service: &str, count: usize) -> Pods {
        let mut servers = Vec::new();
        for i in 0..count {
            let identity = EchoIdentity {
                pod: format!("{service}-{i}"),
                namespace: namespace.into(),
                service: service.into(),
            };
            servers.push(
                sluice::echo::start("127.0.0.1:0".parse().unwrap(), identity)
                    .await
                    .expect("echo backend binds"),
            );
        }
        Pods {
            namespace: namespace.into(),
            service: service.into(),
            servers,
        }
    }

    /// Requests received by all pods together.
    pub fn requests(&self) -> u64 {
        self.servers.iter().map(|s| s.requests()).sum()
    }

    /// Service (port 8080) plus one EndpointSlice per pod (each pod listens
    /// on its own port), every endpoint ready.
    pub fn manifests(&self) -> String {
        self.manifests_with_readiness(|_| None)
    }

    /// Like [`manifests`](Self::manifests); `ready(i)` gives pod i's
    /// `conditions.ready` (None leaves it unset, which means ready).
    pub fn manifests_with_readiness(&self, ready: impl Fn(usize) -> Option<bool>) -> String {
        let (ns, svc) = (&self.namespace, &self.service);
        let mut out = format!(
            r#"
---
apiVersion: v1
kind: Service
metadata:
  name: {svc}
  namespace: {ns}
spec:
  ports:
  - port: 8080
"#
        );
        for (i, s) in self.servers.iter().enumerate() {
            let conditions = match ready(i) {
                Some(r) => format!("\n  conditions:\n    ready: {r}"),
                None => String::new(),
            };
            out.push_str(&format!(
                r#"
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {svc}-{i}
  namespace: {ns}
  labels:
    kubernetes.io/service-name: {svc}
addressType: IPv4
ports:
- port: {port}
endpoints:
- addresses: ["127.0.0.1"]{conditions}
"#,
                port = s.local_addr().port()
            ));
        }
        out
    }

    /// Requests received per pod.
    pub fn per_pod(&self) -> Vec<u64> {
        self.servers.iter().map(|s| s.requests()).collect()
    }
}

/// A running `sluice serve` process on a temporary manifest directory.
pub struct Sluice {
    child: Child,
    pub dir: tempfile::TempDir,
    /// The rollout state directory (`--state-dir`), apart from the
    /// manifests: its `rollouts.json` must not be read as one.
    pub state: tempfile::TempDir,
    /// The Gateway listener's port (put it in the manifests with [`gateway`]).
    pub port: u16,
    pub admin: SocketAddr,
    /// Arguments given after the defaults (`--state-dir` among them).
    args: Vec<String>,
}

impl Sluice {
    /// Start the gateway on `files` (name, content) after replacing
    /// `{{PORT}}` with the listener port. Waits until `/readyz` answers 200.
    pub async fn start(files: &[(&str, String)]) -> Sluice {
        Sluice::start_with(files, &[]).await
    }

    /// [`Sluice::start`] with more `sluice serve` arguments (a
    /// `--state-dir` given here replaces the harness's own; `{{DIR}}` in
    /// one is the manifest directory). A file name may name a
    /// subdirectory.
    pub async fn start_with(files: &[(&str, String)], args: &[&str]) -> Sluice {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        for (name, content) in files {
            if let Some(parent) = dir.path().join(name).parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            std::fs::write(
                dir.path().join(name),
                content.replace("{{PORT}}", &port.to_string()),
            )
            .unwrap();
        }
        // `{{DIR}}` in an argument is the manifest directory.
        let mut all: Vec<String> = args
            .iter()
            .map(|a| a.replace("{{DIR}}", &dir.path().display().to_string()))
            .collect();
        if !args.contains(&"--state-dir") {
            all.extend(["--state-dir".into(), state.path().display().to_string()]);
        }
        let child = spawn(&dir, admin, &all);
        let sluice = Sluice {
            child,
            dir,
            state,
            port,
            admin,
            args: all,
        };
        sluice.wait_ready().await;
        sluice
    }

    /// Stop the process (SIGKILL: nothing gets to be written on the way
    /// out) and start it again on the same manifests, ports and state.
    pub async fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = self.log();
        std::fs::write(self.dir.path().join("sluice.before-restart.log.txt"), log).unwrap();
        self.child = spawn(&self.dir, self.admin, &self.args);
        self.wait_ready().await;
    }

    /// The log of the run before the last [`Sluice::restart`].
    pub fn log_before_restart(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sluice.before-restart.log.txt"))
            .unwrap_or_default()
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((StatusCode::OK, _)) = admin_get(self.admin, "/readyz").await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sluice not ready in 30s; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The gateway's process id (to read its threads in /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sluice.log.txt")).unwrap_or_default()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Replace a manifest file (same `{{PORT}}` substitution), atomically by
    /// rename as editors and `kubectl`-style tools do.
    pub fn write(&self, name: &str, content: &str) {
        let target = self.path(name);
        let file_name = target.file_name().expect("a file name").to_string_lossy();
        let tmp = target.with_file_name(format!(".{file_name}.tmp"));
        std::fs::write(&tmp, content.replace("{{PORT}}", &self.port.to_string())).unwrap();
        std::fs::rename(tmp, target).unwrap();
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// A keep-alive HTTP/1.1 connection to the gateway's listener.
    pub async fn connect(&self) -> Conn {
        Conn::open(self.addr()).await
    }

    /// `/status` as JSON.
    pub async fn status(&self) -> serde_json::Value {
        let (code, body) = admin_get(self.admin, "/status")
            .await
            .expect("admin answers");
        assert_eq!(code, StatusCode::OK);
        serde_json::from_slice(&body).expect("/status is JSON")
    }

    /// The status of one object from `/status`.
    pub async fn object_status(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> serde_json::Value {
        let all = self.status().await;
        all.as_array()
            .expect("/status is an array")
            .iter()
            .find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"] == name
                    && namespace.is_none_or(|ns| o["metadata"]["namespace"] == ns)
            })
            .cloned()
            .unwrap_or_else(|| panic!("{kind} {name} not in /status: {all:#}"))
    }

    /// `/errors` as JSON.
    pub async fn errors(&self) -> serde_json::Value {
        let (_, body) = admin_get(self.admin, "/errors")
            .await
            .expect("admin answers");
        serde_json::from_slice(&body).expect("/errors is JSON")
    }

    pub async fn metrics(&self) -> String {
        let (_, body) = admin_get(self.admin, "/metrics")
            .await
            .expect("admin answers");
        String::from_utf8_lossy(&body).into_owned()
    }

    /// The value of the metric series `series` (name and labels) on
    /// `/metrics`, 0 when it is absent.
    pub async fn metric(&self, series: &str) -> f64 {
        metric(&self.metrics().await, series).unwrap_or(0.0)
    }

    /// Poll until `check` holds for a fresh response to `GET host path`, or
    /// panic after 15 s. For waiting on a reload.
    pub async fn eventually(&self, host: &str, path: &str, check: impl Fn(&Resp) -> bool) -> Resp {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut conn = self.connect().await;
            let r = conn.get(host, path).await;
            if check(&r) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "condition never held; last response {r:?}; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// `sluice serve` on `dir` with the harness's defaults and `args`, its log
/// in `dir/sluice.log.txt`.
fn spawn(dir: &tempfile::TempDir, admin: SocketAddr, args: &[String]) -> Child {
    let log = std::fs::File::create(dir.path().join("sluice.log.txt")).unwrap();
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .arg("-f")
        .arg(dir.path())
        .args(["--bind", "127.0.0.1", "--admin", &admin.to_string()])
        .args(args)
        .env("RUST_LOG", "info")
        // tracing writes to stdout: both go to the log file.
        .stdout(log.try_clone().expect("log file handle"))
        .stderr(log)
        .spawn()
        .expect("the sluice binary starts")
}

/// Poll `check` until it holds, or panic after 15 s naming `what` with
/// `log()` (the gateway's log). For waiting on a reload or a counter.
pub async fn poll_until(
    what: &str,
    log: impl Fn() -> String,
    mut check: impl AsyncFnMut() -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "{what}: never held; log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One GET on a fresh connection to the admin listener.
pub async fn admin_get(admin: SocketAddr, path: &str) -> Result<(StatusCode, Bytes), String> {
    let stream = tokio::net::TcpStream::connect(admin)
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "admin")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let code = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((code, body))
}

/// A response, fully read.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    /// `response` with its whole body.
    pub async fn read(response: http::Response<Incoming>) -> Result<Resp, hyper::Error> {
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Resp {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// The echo backend's description of the request it received.
    pub fn echo(&self) -> EchoResponse {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not an echo response ({e}): {} {:?}",
                self.status, self.body
            )
        })
    }

    /// The pod that answered, or `"<status>"` when the gateway answered itself.
    pub fn pod(&self) -> String {
        if self.status == StatusCode::OK {
            self.echo().pod
        } else {
            format!("<{}>", self.status.as_u16())
        }
    }
}

/// One client connection, reused for every request (HTTP/1.1 keep-alive).
pub struct Conn {
    send: SendRequest<Full<Bytes>>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("gateway accepts");
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("http/1.1 handshake");
        tokio::spawn(conn);
        Conn { send }
    }

    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> Resp {
        self.send.ready().await.expect("connection still open");
        let resp = self.send.send_request(req).await.expect("gateway answers");
        Resp::read(resp).await.expect("whole body")
    }

    pub async fn get(&mut self, host: &str, path: &str) -> Resp {
        self.get_with(host, path, &[]).await
    }

    pub async fn get_with(&mut self, host: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
        let mut req = Request::get(path).header("host", host);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req.body(Full::new(Bytes::new())).unwrap()).await
    }

    /// Send `n` GETs and count the answers by pod (or `<status>`).
    pub async fn tally(
        &mut self,
        n: usize,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for _ in 0..n {
            *counts
                .entry(self.get_with(host, path, headers).await.pod())
                .or_insert(0) += 1;
        }
        counts
    }
}

/// Sum a tally by service: pod names are `<service>-<i>`.
pub fn by_service(tally: &BTreeMap<String, usize>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (pod, n) in tally {
        let service = match pod.rsplit_once('-') {
            Some((svc, i)) if i.bytes().all(|b| b.is_ascii_digit()) => svc.to_string(),
            _ => pod.clone(),
        };
        *out.entry(service).or_insert(0) += n;
    }
    out
}

/// An HTTPRoute on `default/gw` with the given body under `spec` (indented
/// by the caller to sit under `spec:`).
pub fn route(namespace: &str, name: &str, spec: &str) -> String {
    route_of_kind("HTTPRoute", namespace, name, spec)
}

/// A route of `kind` (HTTPRoute, GRPCRoute, TLSRoute) on `default/gw`, as
/// [`route`].
pub fn route_of_kind(kind: &str, namespace: &str, name: &str, spec: &str) -> String {
    format!(
        r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: {kind}
metadata:
  name: {name}
  namespace: {namespace}
spec:
  parentRefs:
  - name: gw
    namespace: default
{spec}
"#
    )
}

/// Service `default/name` with one port (`port`, named `port_name` when
/// given, with `appProtocol` when given) and an EndpointSlice sending it to
/// `127.0.0.1:target`: a backend the test runs itself.
pub fn static_service(
    name: &str,
    port_name: Option<&str>,
    port: u16,
    app_protocol: Option<&str>,
    target: u16,
) -> String {
    static_service_endpoints(name, port_name, port, app_protocol, &[target])
}

/// Like [`static_service`] with one endpoint per target port, each in its
/// own EndpointSlice (`name-1`, `name-2`, ...): backends the test runs.
/// The gateway takes them in port order.
pub fn static_service_endpoints(
    name: &str,
    port_name: Option<&str>,
    port: u16,
    app_protocol: Option<&str>,
    targets: &[u16],
) -> String {
    let named = port_name
        .map(|n| format!("name: {n}, "))
        .unwrap_or_default();
    let app = app_protocol
        .map(|p| format!(", appProtocol: {p}"))
        .unwrap_or_default();
    let mut out = format!(
        r#"
---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  ports: [{{{named}port: {port}{app}}}]
"#
    );
    for (i, target) in targets.iter().enumerate() {
        out.push_str(&format!(
            r#"---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-{n}
  namespace: default
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{{named}port: {target}}}]
endpoints: [{{addresses: ["127.0.0.1"]}}]
"#,
            n = i + 1
        ));
    }
    out
}

/// A test certificate authority and the certificates it issued.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pub cert: CertificateDer<'static>,
    /// The CA certificate's PEM (what a CA ConfigMap holds).
    pub pem: String,
}

/// A leaf certificate: PEM of the chain and key, and the DER the server
/// should present.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Leaf {
    /// A TLS server configuration presenting this certificate (no client
    /// certificates asked for).
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .expect("certificate PEM");
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("key PEM");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("certificate and key");
        Arc::new(config)
    }
}

impl TestCa {
    pub fn new() -> TestCa {
        TestCa::named("sluice test CA")
    }

    /// A CA with `common_name` as subject.
    pub fn named(common_name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa {
            cert: cert.der().clone(),
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names`: DNS names (`*.` wildcards allowed), and
    /// URIs (names with `://`, a SPIFFE ID say) as URI SANs.
    pub fn issue(&self, names: &[&str]) -> Leaf {
        let (uris, dns): (Vec<&str>, Vec<&str>) = names.iter().partition(|n| n.contains("://"));
        let dns: Vec<String> = dns.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(dns).expect("leaf params");
        for uri in uris {
            let uri = uri.try_into().expect("a URI SAN");
            params.subject_alt_names.push(rcgen::SanType::URI(uri));
        }
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// A client certificate with subject `common_name`, and its key.
    pub fn issue_client(
        &self,
        common_name: &str,
    ) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let key = KeyPair::generate().expect("client key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("client certificate");
        let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key PEM");
        (cert.der().clone(), key)
    }

    /// A TLS client that trusts only this CA and offers `alpn`.
    pub fn connector(&self, alpn: &[&[u8]]) -> TlsConnector {
        self.client_connector(alpn, None)
    }

    /// A TLS client that trusts only this CA, offers `alpn` and presents
    /// `client` when the server asks.
    pub fn client_connector(
        &self,
        alpn: &[&[u8]],
        client: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
    ) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.cert.clone())
            .expect("CA certificate is valid");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("default protocol versions")
            .with_root_certificates(roots);
        let mut config = match client {
            Some((cert, key)) => builder
                .with_client_auth_cert(vec![cert], key)
                .expect("client certificate and key"),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        TlsConnector::from(Arc::new(config))
    }
}

/// A `kubernetes.io/tls` Secret manifest holding `leaf` (base64 `data`, as
/// `kubectl create secret tls` writes it).
pub fn tls_secret(namespace: &str, name: &str, leaf: &Leaf) -> String {
    format!(
        r#"
---
apiVersion: v1
kind: Secret
metadata:
  name: {name}
  namespace: {namespace}
type: kubernetes.io/tls
data:
  tls.crt: {crt}
  tls.key: {key}
"#,
        crt = base64(leaf.cert_pem.as_bytes()),
        key = base64(leaf.key_pem.as_bytes()),
    )
}

/// ConfigMap `default/name` holding `ca`'s PEM under `ca.crt`.
pub fn ca_config_map(name: &str, ca: &TestCa) -> String {
    let indented: String = ca.pem.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: default}}\ndata:\n  ca.crt: |\n{indented}"
    )
}

/// Standard base64 with padding (Secret `data` values).
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A TLS connection to the gateway with `sni`, verified by `connector`.
pub async fn tls_connect(
    sluice: &Sluice,
    connector: &TlsConnector,
    sni: &str,
) -> Result<TlsStream<tokio::net::TcpStream>, std::io::Error> {
    let tcp = tokio::net::TcpStream::connect(sluice.addr()).await?;
    let name = ServerName::try_from(sni.to_string()).expect("a valid server name");
    connector.connect(name, tcp).await
}

/// Split a raw HTTP/1.1 answer into head and body.
pub fn split_answer(answer: &[u8]) -> (String, &[u8]) {
    let at = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(answer.len(), |p| p + 4);
    (
        String::from_utf8_lossy(&answer[..at]).into_owned(),
        &answer[at..],
    )
}

/// The value of the metric series `series` (name and labels) in the text
/// of `/metrics`, if present.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
