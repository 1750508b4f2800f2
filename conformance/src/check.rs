//! What a conformance test can do and check against the running gateway:
//! send requests and compare them as the suite's `CompareRoundTrip` does,
//! and read status as the suite's `kubernetes` helpers do.
//!
//! Comparison rules carried over from the suite:
//! - the status code must be the expected one (200 unless said otherwise),
//!   or one of the others a test accepts;
//! - on 200, the request the backend saw must have the expected path (with
//!   query), method (GET by default), host (when one is expected) and
//!   headers (values joined by `,`), none of the absent headers, and come
//!   from the expected namespace and a pod whose name starts with the
//!   expected backend; unless a test says otherwise the request expected at
//!   the backend is the request sent;
//! - on a redirect, the `Location`'s scheme, host and path, where an unset
//!   expectation defaults to the request's own (the host to the one
//!   received), and its port: an unset expectation means the scheme's
//!   default (80 for http, 443 for https, or no port at all);
//! - response headers (joined by `,`), headers that must have one of
//!   several values (whitespace ignored), and absent response headers;
//! - a 200 expected from namespace "" (CORS preflights) must come from the
//!   gateway itself, not from a backend.
//!
//! Requests go over HTTP/1.1, HTTP/2 with prior knowledge (h2c), or TLS
//! with a server name, trusting only the CA that issued the suite's
//! certificates.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value as Json;
use sluice::echo::EchoResponse;
use sluice::serve::RunningGateway;
use tokio::net::TcpStream;

use crate::env::{self, ManifestFile, Pods, PortMap};

/// How long a status expectation may take to hold (reloads are
/// debounced); the first configuration is applied before a test starts.
const STATUS_DEADLINE: Duration = Duration::from_secs(10);
/// Bound on one request through the gateway.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// The namespace of the suite's infrastructure (Gateways, most backends).
pub const INFRA: &str = "gateway-conformance-infra";
pub const APP: &str = "gateway-conformance-app-backend";
pub const WEB: &str = "gateway-conformance-web-backend";

/// A running test: its manifests, the gateway serving them, the pods.
pub struct Ctx<'a> {
    pub dir: PathBuf,
    pub files: Vec<ManifestFile>,
    pub ports: PortMap,
    pub pods: &'a Pods,
    pub gateway: RunningGateway,
}

/// One object's published status.
#[derive(Debug, Clone)]
pub struct Status {
    pub generation: i64,
    pub status: Json,
}

impl Ctx<'_> {
    /// The status of `kind` `ns/name`, if sluice reports it.
    pub fn status_of(&self, kind: &str, id: &str) -> Option<Status> {
        let published = self.gateway.published();
        published.status.objects.iter().find_map(|o| {
            let ns = o.metadata.namespace.as_deref().unwrap_or("");
            let this = if ns.is_empty() {
                o.metadata.name.clone()
            } else {
                format!("{ns}/{}", o.metadata.name)
            };
            (o.kind == kind && this == id).then(|| Status {
                generation: o.metadata.generation,
                status: o.status.clone(),
            })
        })
    }

    /// Poll `check` until it holds or the deadline passes (its last error).
    pub async fn eventually<F>(&self, what: &str, mut check: F) -> anyhow::Result<()>
    where
        F: FnMut(&Self) -> anyhow::Result<()>,
    {
        let deadline = Instant::now() + STATUS_DEADLINE;
        loop {
            match check(self) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!("{what} (waited {STATUS_DEADLINE:?})")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
            }
        }
    }

    /// Change an object of the logical manifests and render them again;
    /// the gateway's watcher picks the change up.
    pub fn modify(
        &mut self,
        kind: &str,
        id: &str,
        change: impl FnOnce(&mut serde_yaml::Value),
    ) -> anyhow::Result<()> {
        let doc = self
            .files
            .iter_mut()
            .flat_map(|f| f.docs.iter_mut())
            .find(|d| env::kind(d) == kind && env::object_id(d) == id)
            .ok_or_else(|| anyhow!("no {kind} {id} in the manifests"))?;
        change(doc);
        env::render(&self.dir, &self.files, self.pods, &mut self.ports)
    }

    /// What the service-types test does to its manual EndpointSlices: fill
    /// each with the pods of `deployment`. Our pods share an address and
    /// differ by port, so each slice becomes one slice per pod, listing
    /// that pod's port under the slice's port names.
    pub fn fill_endpoint_slices(
        &mut self,
        ids: &[&str],
        namespace: &str,
        deployment: &str,
    ) -> anyhow::Result<()> {
        let pods = self.pods.of(namespace, deployment);
        if pods.is_empty() {
            bail!("no pods of {namespace}/{deployment}");
        }
        for id in ids {
            let (file, index) = self
                .files
                .iter()
                .enumerate()
                .find_map(|(f, file)| {
                    file.docs
                        .iter()
                        .position(|d| env::kind(d) == "EndpointSlice" && env::object_id(d) == *id)
                        .map(|i| (f, i))
                })
                .ok_or_else(|| anyhow!("no EndpointSlice {id} in the manifests"))?;
            let slice = self.files[file].docs.remove(index);
            for (n, pod) in pods.iter().enumerate() {
                let mut filled = slice.clone();
                filled["metadata"]["name"] = format!("{}-{n}", env::name(&slice)).into();
                let endpoint = serde_json::json!([{
                    "addresses": ["127.0.0.1"],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                    "targetRef": {"kind": "Pod", "name": pod.server.identity().pod, "namespace": namespace},
                }]);
                filled["endpoints"] = serde_yaml::to_value(endpoint)?;
                if let Some(ports) = filled["ports"].as_sequence_mut() {
                    for p in ports {
                        let target = p["port"].as_u64().and_then(|v| u16::try_from(v).ok());
                        p["port"] = pod.server.port_for(target).into();
                    }
                }
                self.files[file].docs.insert(index + n, filled);
            }
        }
        env::render(&self.dir, &self.files, self.pods, &mut self.ports)
    }

    /// The logical (original) port of a Gateway's first listener.
    fn first_listener_port(&self, gateway: &str) -> anyhow::Result<u16> {
        let doc = self
            .files
            .iter()
            .flat_map(|f| &f.docs)
            .find(|d| env::kind(d) == "Gateway" && env::object_id(d) == gateway)
            .ok_or_else(|| anyhow!("no Gateway {gateway} in the manifests"))?;
        doc.get("spec")
            .and_then(|s| s.get("listeners"))
            .and_then(|l| l.get(0))
            .and_then(|l| l.get("port"))
            .and_then(serde_yaml::Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| anyhow!("Gateway {gateway} has no listener port"))
    }

    /// Send the case's request and compare the exchange as the suite does.
    pub async fn expect(&self, case: &Case) -> anyhow::Result<()> {
        let exchange = self.send(case).await?;
        compare(case, &exchange).with_context(|| case.describe())
    }

    /// Send the case's request through the gateway.
    pub async fn send(&self, case: &Case) -> anyhow::Result<Exchange> {
        let port = match case.port {
            Some(p) => p,
            None => self.first_listener_port(&case.gateway)?,
        };
        let actual = self
            .ports
            .actual(&case.gateway, port)
            .ok_or_else(|| anyhow!("Gateway {} has no listener on port {port}", case.gateway))?;
        let default_port = if case.sni.is_some() { 443 } else { 80 };
        let default_host = if port == default_port {
            "127.0.0.1".to_owned()
        } else {
            format!("127.0.0.1:{port}")
        };
        let host = case.host.clone().unwrap_or(default_host);
        let exchange = tokio::time::timeout(
            REQUEST_DEADLINE,
            round_trip(actual, &host, case, &self.ports),
        )
        .await
        .map_err(|_| anyhow!("no response within {REQUEST_DEADLINE:?}"))??;
        Ok(exchange)
    }
}

impl Ctx<'_> {
    /// The suite's WebSocket check: open `/ws` through `gateway`'s first
    /// listener, send a text and a binary message, and expect each back.
    pub async fn websocket_echo(&self, gateway: &str) -> anyhow::Result<()> {
        let port = self.first_listener_port(gateway)?;
        let actual = self
            .ports
            .actual(gateway, port)
            .ok_or_else(|| anyhow!("Gateway {gateway} has no listener on port {port}"))?;
        tokio::time::timeout(REQUEST_DEADLINE, websocket_exchange(actual))
            .await
            .map_err(|_| anyhow!("WebSocket exchange did not finish within {REQUEST_DEADLINE:?}"))?
    }
}

async fn websocket_exchange(actual_port: u16) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = TcpStream::connect(("127.0.0.1", actual_port))
        .await
        .context("cannot connect to the gateway")?;
    let key = crate::env::base64(&fastrand::u128(..).to_be_bytes());
    let request = format!(
        "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: ws://gateway/HTTPRouteBackendProtocolWebSocket\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    // The response head, byte by byte so that no frame byte is consumed.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 {
            bail!("response head too long");
        }
        head.push(
            stream
                .read_u8()
                .await
                .context("reading the handshake response")?,
        );
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    if !head.starts_with("http/1.1 101") {
        bail!(
            "handshake answered {:?}",
            head.lines().next().unwrap_or_default()
        );
    }
    let accept = crate::ws::accept_for(&key).to_ascii_lowercase();
    if !head.contains(&format!("sec-websocket-accept: {accept}")) {
        bail!("handshake response without the right Sec-WebSocket-Accept: {head}");
    }
    let text = b"Websocket Support!".to_vec();
    let binary = vec![1u8, 2, 3, 4, 5, 6, 7];
    for (opcode, payload) in [(crate::ws::TEXT, text), (crate::ws::BINARY, binary)] {
        let mask = fastrand::u32(..).to_be_bytes();
        stream
            .write_all(&crate::ws::encode(opcode, &payload, Some(mask)))
            .await?;
        let frame = crate::ws::read_frame(&mut stream)
            .await?
            .ok_or_else(|| anyhow!("connection closed before the reply"))?;
        if frame.opcode != opcode || frame.payload != payload {
            bail!(
                "sent opcode {opcode} {payload:?}, got opcode {} {:?}",
                frame.opcode,
                frame.payload
            );
        }
    }
    let mask = fastrand::u32(..).to_be_bytes();
    let _ = stream
        .write_all(&crate::ws::encode(crate::ws::CLOSE, &[], Some(mask)))
        .await;
    Ok(())
}

/// A request to make and what to expect of it.
#[derive(Debug, Clone)]
pub struct Case {
    /// `ns/name` of the Gateway to send to.
    pub gateway: String,
    /// The listener port (as the manifests say); default: first listener's.
    pub port: Option<u16>,
    pub host: Option<String>,
    pub method: Method,
    /// Path with query.
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// Connect with TLS, sending this server name (SNI).
    pub sni: Option<String>,
    /// Speak HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    pub h2c: bool,

    pub status: u16,
    /// Other acceptable statuses (the suite's `StatusCodes`).
    pub other_statuses: Vec<u16>,
    pub backend: Option<String>,
    pub namespace: Option<String>,
    pub exp_path: Option<String>,
    pub exp_host: Option<String>,
    pub exp_method: Option<String>,
    /// Headers expected at the backend, replacing the request's own.
    pub exp_headers: Option<Vec<(String, String)>>,
    pub absent: Vec<String>,
    pub redirect: Option<RedirectExpect>,
    pub resp_headers: Vec<(String, String)>,
    /// Response headers that must have one of these values, compared with
    /// whitespace removed (the suite's `ValidHeaderValues` with
    /// `IgnoreWhitespace`).
    pub valid_resp_headers: Vec<(String, Vec<String>)>,
    pub absent_resp_headers: Vec<String>,
}

/// Expected parts of a `Location`; `None` takes the request's own.
#[derive(Debug, Clone, Default)]
pub struct RedirectExpect {
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<String>,
    pub path: Option<String>,
}

/// A request to `gateway` (`ns/name`) for `path`.
pub fn req(gateway: &str, path: &str) -> Case {
    Case {
        gateway: gateway.to_owned(),
        port: None,
        host: None,
        method: Method::GET,
        path: path.to_owned(),
        headers: Vec::new(),
        sni: None,
        h2c: false,
        status: 200,
        other_statuses: Vec::new(),
        backend: None,
        namespace: None,
        exp_path: None,
        exp_host: None,
        exp_method: None,
        exp_headers: None,
        absent: Vec::new(),
        redirect: None,
        resp_headers: Vec::new(),
        valid_resp_headers: Vec::new(),
        absent_resp_headers: Vec::new(),
    }
}

/// The suite's usual Gateway.
pub fn same_ns(path: &str) -> Case {
    req(&format!("{INFRA}/same-namespace"), path)
}

impl Case {
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }
    pub fn host(mut self, host: &str) -> Self {
        self.host = Some(host.to_owned());
        self
    }
    pub fn method(mut self, method: &str) -> Self {
        self.method = Method::from_bytes(method.as_bytes()).expect("test methods are valid");
        self
    }
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }
    /// Accept any of `statuses` (the first is the one of the description).
    pub fn statuses(mut self, statuses: &[u16]) -> Self {
        if let Some((first, rest)) = statuses.split_first() {
            self.status = *first;
            self.other_statuses = rest.to_vec();
        }
        self
    }
    /// Send over TLS with server name `sni`.
    pub fn tls(mut self, sni: &str) -> Self {
        self.sni = Some(sni.to_owned());
        self
    }
    /// Send with HTTP/2 prior knowledge.
    pub fn h2c(mut self) -> Self {
        self.h2c = true;
        self
    }
    /// A response header must have one of `values` (whitespace ignored).
    pub fn resp_header_one_of(mut self, name: &str, values: &[&str]) -> Self {
        self.valid_resp_headers.push((
            name.to_owned(),
            values.iter().map(|v| (*v).to_owned()).collect(),
        ));
        self
    }
    /// Expect a 200 from a pod of `backend` in `namespace`.
    pub fn to(mut self, backend: &str, namespace: &str) -> Self {
        self.backend = Some(backend.to_owned());
        self.namespace = Some(namespace.to_owned());
        self
    }
    /// Expect a 200 from `backend` in the infra namespace.
    pub fn infra(self, backend: &str) -> Self {
        self.to(backend, INFRA)
    }
    pub fn exp_path(mut self, path: &str) -> Self {
        self.exp_path = Some(path.to_owned());
        self
    }
    pub fn exp_host(mut self, host: &str) -> Self {
        self.exp_host = Some(host.to_owned());
        self
    }
    pub fn exp_header(mut self, name: &str, value: &str) -> Self {
        self.exp_headers
            .get_or_insert_with(Vec::new)
            .push((name.to_owned(), value.to_owned()));
        self
    }
    /// The backend must see no headers beyond the absent checks (used when
    /// a test expects a request that names no headers).
    pub fn exp_no_headers(mut self) -> Self {
        self.exp_headers.get_or_insert_with(Vec::new);
        self
    }
    pub fn absent(mut self, name: &str) -> Self {
        self.absent.push(name.to_owned());
        self
    }
    pub fn resp_header(mut self, name: &str, value: &str) -> Self {
        self.resp_headers.push((name.to_owned(), value.to_owned()));
        self
    }
    pub fn absent_resp(mut self, name: &str) -> Self {
        self.absent_resp_headers.push(name.to_owned());
        self
    }
    fn redirect_mut(&mut self) -> &mut RedirectExpect {
        self.redirect.get_or_insert_with(RedirectExpect::default)
    }
    pub fn redirect(mut self, status: u16) -> Self {
        self.status = status;
        self.redirect_mut();
        self
    }
    pub fn r_scheme(mut self, v: &str) -> Self {
        self.redirect_mut().scheme = Some(v.to_owned());
        self
    }
    pub fn r_host(mut self, v: &str) -> Self {
        self.redirect_mut().host = Some(v.to_owned());
        self
    }
    pub fn r_port(mut self, v: &str) -> Self {
        self.redirect_mut().port = Some(v.to_owned());
        self
    }
    pub fn r_path(mut self, v: &str) -> Self {
        self.redirect_mut().path = Some(v.to_owned());
        self
    }

    pub fn describe(&self) -> String {
        let mut s = format!("{} {}", self.method, self.path);
        if let Some(h) = &self.host {
            s.push_str(&format!(" host={h}"));
        }
        for (k, v) in &self.headers {
            s.push_str(&format!(" {k}={v}"));
        }
        s
    }
}

/// What came back for one request.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub status: u16,
    /// Response headers: lower-case name, values.
    pub headers: Vec<(String, String)>,
    /// What the backend saw, when it answered with an echo body.
    pub echo: Option<EchoResponse>,
    /// `Location` split into scheme, host, port ("" when absent), path.
    pub location: Option<(String, String, String, String)>,
}

/// A connection to the gateway: plain TCP or TLS.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Connect to the gateway's loopback port, with TLS when `sni` is given
/// (trusting only the suite's CA, offering HTTP/1.1 as the suite's client).
async fn connect(actual_port: u16, sni: Option<&str>) -> anyhow::Result<Box<dyn Io>> {
    let stream = TcpStream::connect(("127.0.0.1", actual_port))
        .await
        .with_context(|| format!("cannot connect to the gateway on 127.0.0.1:{actual_port}"))?;
    let _ = stream.set_nodelay(true);
    let Some(sni) = sni else {
        return Ok(Box::new(stream));
    };
    let name = rustls_pki_types::ServerName::try_from(sni.to_owned())
        .with_context(|| format!("{sni:?} is not a server name"))?;
    let tls = tls_connector()?
        .connect(name, stream)
        .await
        .with_context(|| format!("TLS handshake with server name {sni}"))?;
    Ok(Box::new(tls))
}

/// A TLS client trusting the suite's CA (built once).
fn tls_connector() -> anyhow::Result<tokio_rustls::TlsConnector> {
    static CONNECTOR: std::sync::OnceLock<tokio_rustls::TlsConnector> = std::sync::OnceLock::new();
    if let Some(c) = CONNECTOR.get() {
        return Ok(c.clone());
    }
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(env::suite_ca()?)
        .context("the suite CA is not a valid trust anchor")?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let webpki =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider.clone())
            .build()
            .context("the certificate verifier")?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(GoNameVerifier(webpki)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(CONNECTOR
        .get_or_init(|| tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)))
        .clone())
}

/// Certificate verification as the suite's Go client does it: the chain
/// must lead to the suite CA (webpki), and the server name is matched with
/// Go's rules, under which `*.org` covers `unknown-example.org` (webpki
/// refuses wildcards directly under a top-level domain, and the suite's
/// certificate relies on one).
#[derive(Debug)]
struct GoNameVerifier(std::sync::Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for GoNameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &rustls_pki_types::CertificateDer<'_>,
        intermediates: &[rustls_pki_types::CertificateDer<'_>],
        server_name: &rustls_pki_types::ServerName<'_>,
        ocsp: &[u8],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let Some(names) = env::issued_names(end_entity) else {
            return self
                .0
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
        };
        // The chain, checked against a name the certificate surely has.
        let concrete = names
            .iter()
            .find(|n| !n.starts_with('*'))
            .and_then(|n| rustls_pki_types::ServerName::try_from(n.clone()).ok())
            .ok_or(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ))?;
        self.0
            .verify_server_cert(end_entity, intermediates, &concrete, ocsp, now)?;
        let host = server_name.to_str();
        if names.iter().any(|n| go_name_matches(n, &host)) {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Go's `matchHostnames`: same number of labels, a leading `*` label
/// matches any one label, the rest compare case-insensitively.
fn go_name_matches(pattern: &str, host: &str) -> bool {
    let host = host.trim_end_matches('.');
    let p: Vec<&str> = pattern.split('.').collect();
    let h: Vec<&str> = host.split('.').collect();
    p.len() == h.len()
        && !host.is_empty()
        && p.iter()
            .zip(&h)
            .enumerate()
            .all(|(i, (p, h))| (i == 0 && *p == "*") || p.eq_ignore_ascii_case(h))
}

async fn round_trip(
    actual_port: u16,
    host: &str,
    case: &Case,
    ports: &PortMap,
) -> anyhow::Result<Exchange> {
    let io = TokioIo::new(connect(actual_port, case.sni.as_deref()).await?);
    let mut request = Request::builder().method(case.method.clone());
    request = if case.h2c {
        request.uri(format!("http://{host}{}", case.path))
    } else {
        request.uri(&case.path).header(http::header::HOST, host)
    };
    for (k, v) in &case.headers {
        request = request.header(k.as_str(), v.as_str());
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .context("building the request")?;
    let response = if case.h2c {
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .context("HTTP/2 handshake")?;
        tokio::spawn(connection);
        sender.send_request(request).await.context("request")?
    } else {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .context("HTTP/1.1 handshake")?;
        tokio::spawn(connection);
        sender.send_request(request).await.context("request")?
    };
    read_exchange(response, Some(ports)).await
}

/// The status, headers and echo body of `response`; its `Location` split
/// with [`split_location`] when `ports` are given (else not read).
pub async fn read_exchange(
    response: http::Response<hyper::body::Incoming>,
    ports: Option<&PortMap>,
) -> anyhow::Result<Exchange> {
    let status = response.status();
    let headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .context("reading the response body")?
        .to_bytes();
    let echo = if status == StatusCode::OK {
        serde_json::from_slice::<EchoResponse>(&body).ok()
    } else {
        None
    };
    let location = ports.and_then(|ports| {
        headers
            .iter()
            .find(|(k, _)| k == "location")
            .map(|(_, v)| split_location(v, ports))
    });
    Ok(Exchange {
        status: status.as_u16(),
        headers,
        echo,
        location,
    })
}

/// Split a `Location` into (scheme, host, port, path); a port that is one
/// of our loopback ports is translated back to the listener port it
/// stands for, and a scheme's default port is reported empty.
fn split_location(location: &str, ports: &PortMap) -> (String, String, String, String) {
    let (scheme, rest) = location.split_once("://").unwrap_or(("", location));
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = path.split('?').next().unwrap_or("");
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => (h, p.to_owned()),
        _ => (authority, String::new()),
    };
    let mut port = match port.parse::<u16>().ok().and_then(|p| ports.original(p)) {
        Some(original) => original.to_string(),
        None => port,
    };
    if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
        port.clear();
    }
    (scheme.to_owned(), host.to_owned(), port, path.to_owned())
}

fn joined<'a>(
    headers: impl Iterator<Item = (&'a String, &'a String)>,
    name: &str,
) -> Option<String> {
    let values: Vec<&str> = headers
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// The suite's comparison of one exchange with the expectation.
pub fn compare(case: &Case, ex: &Exchange) -> anyhow::Result<()> {
    if ex.status != case.status && !case.other_statuses.contains(&ex.status) {
        if case.other_statuses.is_empty() {
            bail!("expected status {}, got {}", case.status, ex.status);
        }
        bail!(
            "expected status {} or {:?}, got {}",
            case.status,
            case.other_statuses,
            ex.status
        );
    }
    for (name, valid) in &case.valid_resp_headers {
        let squeeze = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
        let got = joined(ex.headers.iter().map(|(k, v)| (k, v)), name);
        if !got
            .as_deref()
            .is_some_and(|g| valid.iter().any(|v| squeeze(v) == squeeze(g)))
        {
            bail!("response header {name}: expected one of {valid:?}, got {got:?}");
        }
    }
    for (name, want) in &case.resp_headers {
        let got = joined(ex.headers.iter().map(|(k, v)| (k, v)), name);
        if got.as_deref() != Some(want.as_str()) {
            bail!("response header {name}: expected {want:?}, got {got:?}");
        }
    }
    for name in &case.absent_resp_headers {
        if ex.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name)) {
            bail!("response header {name} should be absent");
        }
    }
    if ex.status == 200 && case.namespace.as_deref() == Some("") {
        // The suite expects namespace "" of what the backend saw: the
        // gateway answered itself (a CORS preflight), no backend did.
        if let Some(echo) = &ex.echo {
            bail!(
                "expected the gateway to answer, but backend pod {} did",
                echo.pod
            );
        }
    } else if ex.status == 200 {
        let Some(echo) = &ex.echo else {
            bail!("the 200 response is not an echo body");
        };
        let want_path = case.exp_path.as_deref().unwrap_or(&case.path);
        if echo.path != want_path {
            bail!("backend saw path {:?}, expected {want_path:?}", echo.path);
        }
        let want_host = case.exp_host.as_ref().or(case.host.as_ref());
        if let Some(h) = want_host
            && !h.is_empty()
            && &echo.host != h
        {
            bail!("backend saw host {:?}, expected {h:?}", echo.host);
        }
        let want_method = case
            .exp_method
            .clone()
            .unwrap_or_else(|| case.method.to_string());
        if echo.method != want_method {
            bail!("backend saw method {}, expected {want_method}", echo.method);
        }
        if let Some(ns) = &case.namespace
            && &echo.namespace != ns
        {
            bail!("backend namespace {:?}, expected {ns:?}", echo.namespace);
        }
        let want_headers = case.exp_headers.as_ref().unwrap_or(&case.headers);
        for (name, want) in want_headers {
            let got = echo.header(name).map(|v| v.join(","));
            if got.as_deref() != Some(want.as_str()) {
                bail!("backend saw header {name}: {got:?}, expected {want:?}");
            }
        }
        for name in &case.absent {
            if echo.header(name).is_some() {
                bail!("backend saw header {name}, which should be absent");
            }
        }
        if let Some(backend) = &case.backend
            && !echo.pod.starts_with(backend.as_str())
        {
            bail!("served by pod {:?}, expected backend {backend:?}", echo.pod);
        }
    } else if matches!(ex.status, 301 | 302 | 303 | 307 | 308)
        && let Some(r) = &case.redirect
    {
        let Some((scheme, host, port, path)) = &ex.location else {
            bail!("redirect without a Location header");
        };
        let request_scheme = if case.sni.is_some() { "https" } else { "http" };
        let want_scheme = r
            .scheme
            .clone()
            .unwrap_or_else(|| request_scheme.to_owned());
        let want_host = r.host.clone().unwrap_or_else(|| host.clone());
        // No expected port: the scheme's default (reported empty).
        let want_port = r.port.clone().unwrap_or_default();
        let want_path = r
            .path
            .clone()
            .unwrap_or_else(|| case.path.split('?').next().unwrap_or("").to_owned());
        let got = (scheme, host, port, path);
        let want = (&want_scheme, &want_host, &want_port, &want_path);
        if got != want {
            bail!("redirect to (scheme, host, port, path) {got:?}, expected {want:?}");
        }
    }
    Ok(())
}

// ---- status checks, as the suite's kubernetes helpers make them ----

/// `type` condition with `status` and (unless empty) `reason` in a list.
pub fn has_condition(conditions: &Json, ty: &str, status: &str, reason: &str) -> bool {
    conditions.as_array().is_some_and(|list| {
        list.iter().any(|c| {
            c["type"] == ty && c["status"] == status && (reason.is_empty() || c["reason"] == reason)
        })
    })
}

/// Every condition's observedGeneration is the object's generation.
pub fn fresh(s: &Status, conditions: &Json) -> anyhow::Result<()> {
    for c in conditions.as_array().into_iter().flatten() {
        if c["observedGeneration"].as_i64() != Some(s.generation) {
            bail!(
                "condition {} has observedGeneration {}, generation is {}",
                c["type"],
                c["observedGeneration"],
                s.generation
            );
        }
    }
    Ok(())
}

/// The route's parent status for `gateway` (`ns/name`), section optional.
pub fn route_parent<'a>(
    route_ns: &str,
    status: &'a Json,
    gateway: &str,
    section: Option<&str>,
) -> Option<&'a Json> {
    status["parents"].as_array()?.iter().find(|p| {
        let r = &p["parentRef"];
        let ns = r["namespace"].as_str().unwrap_or(route_ns);
        let id = format!("{ns}/{}", r["name"].as_str().unwrap_or(""));
        id == gateway
            && r["kind"].as_str().unwrap_or("Gateway") == "Gateway"
            && p["controllerName"] == sluice::resources::CONTROLLER_NAME
            && section.is_none_or(|s| r["sectionName"] == s)
    })
}

/// An expected `parents[]` entry of a route status.
#[derive(Debug, Clone)]
pub struct ParentExpect {
    pub gateway: String,
    pub section: Option<String>,
    pub port: Option<u16>,
    pub conditions: Vec<(String, String, String)>,
}

pub fn parent(gateway: &str) -> ParentExpect {
    ParentExpect {
        gateway: gateway.to_owned(),
        section: None,
        port: None,
        conditions: Vec::new(),
    }
}

impl ParentExpect {
    pub fn cond(mut self, ty: &str, status: bool, reason: &str) -> Self {
        let status = if status { "True" } else { "False" };
        self.conditions
            .push((ty.to_owned(), status.to_owned(), reason.to_owned()));
        self
    }
}

impl Ctx<'_> {
    pub fn require(&self, kind: &str, id: &str) -> anyhow::Result<Status> {
        self.status_of(kind, id)
            .ok_or_else(|| anyhow!("no status for {kind} {id}"))
    }

    /// `GatewayAndHTTPRoutesMustBeAccepted`: the Gateway's conditions are
    /// fresh and it has an address; each route has a parent status for it
    /// from our controller with `Accepted=True`.
    pub async fn accepted(&self, gateway: &str, routes: &[&str]) -> anyhow::Result<()> {
        self.eventually("Gateway and HTTPRoutes accepted", |cx| {
            let gw = cx.require("Gateway", gateway)?;
            fresh(&gw, &gw.status["conditions"])?;
            let has_address = gw.status["addresses"]
                .as_array()
                .is_some_and(|a| a.iter().any(|a| a["type"].is_string()));
            if !has_address {
                bail!("Gateway {gateway} has no address in status");
            }
            for route in routes {
                let r = cx.require("HTTPRoute", route)?;
                let ns = route.split('/').next().unwrap_or("");
                let p = route_parent(ns, &r.status, gateway, None).ok_or_else(|| {
                    anyhow!("HTTPRoute {route} has no parent status for {gateway}")
                })?;
                if !has_condition(&p["conditions"], "Accepted", "True", "") {
                    bail!(
                        "HTTPRoute {route} not Accepted by {gateway}: {}",
                        p["conditions"]
                    );
                }
                fresh(&r, &p["conditions"])?;
            }
            Ok(())
        })
        .await
    }

    /// `HTTPRouteMustHaveCondition` for the route's parent `gateway`.
    pub async fn route_condition(
        &self,
        route: &str,
        gateway: &str,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let want = if status { "True" } else { "False" };
        self.eventually(&format!("HTTPRoute {route} {ty}={want} {reason}"), |cx| {
            let r = cx.require("HTTPRoute", route)?;
            let ns = route.split('/').next().unwrap_or("");
            let p = route_parent(ns, &r.status, gateway, None)
                .ok_or_else(|| anyhow!("HTTPRoute {route} has no parent status for {gateway}"))?;
            fresh(&r, &p["conditions"])?;
            if !has_condition(&p["conditions"], ty, want, reason) {
                bail!("conditions are {}", p["conditions"]);
            }
            Ok(())
        })
        .await
    }

    /// `HTTPRouteMustHaveResolvedRefsConditionsTrue`.
    pub async fn resolved(&self, route: &str, gateway: &str) -> anyhow::Result<()> {
        self.route_condition(route, gateway, "ResolvedRefs", true, "ResolvedRefs")
            .await
    }

    /// `HTTPRouteMustHaveParents`: exactly these parents, each with at
    /// least the given conditions.
    pub async fn route_parents(&self, route: &str, want: &[ParentExpect]) -> anyhow::Result<()> {
        self.eventually(&format!("HTTPRoute {route} parents"), |cx| {
            let r = cx.require("HTTPRoute", route)?;
            let ns = route.split('/').next().unwrap_or("");
            let got = r.status["parents"].as_array().cloned().unwrap_or_default();
            if got.len() != want.len() {
                bail!(
                    "{} parents, expected {}: {}",
                    got.len(),
                    want.len(),
                    r.status
                );
            }
            for w in want {
                let found = got.iter().any(|p| {
                    let rf = &p["parentRef"];
                    let pns = rf["namespace"].as_str().unwrap_or(ns);
                    let id = format!("{pns}/{}", rf["name"].as_str().unwrap_or(""));
                    let port_ok = match w.port {
                        None => rf["port"].is_null(),
                        Some(port) => {
                            rf["port"].as_u64().and_then(|p| {
                                u16::try_from(p)
                                    .ok()
                                    .and_then(|p| cx.ports.original(p).or(Some(p)))
                            }) == Some(port)
                        }
                    };
                    id == w.gateway
                        && p["controllerName"] == sluice::resources::CONTROLLER_NAME
                        && rf["sectionName"].as_str() == w.section.as_deref()
                        && port_ok
                        && fresh(&r, &p["conditions"]).is_ok()
                        && w.conditions
                            .iter()
                            .all(|(t, s, re)| has_condition(&p["conditions"], t, s, re))
                });
                if !found {
                    bail!("no parent matching {w:?} in {}", r.status);
                }
            }
            Ok(())
        })
        .await
    }

    /// `GatewayMustHaveCondition`.
    pub async fn gateway_condition(
        &self,
        gateway: &str,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let want = if status { "True" } else { "False" };
        self.eventually(&format!("Gateway {gateway} {ty}={want} {reason}"), |cx| {
            let gw = cx.require("Gateway", gateway)?;
            fresh(&gw, &gw.status["conditions"])?;
            if !has_condition(&gw.status["conditions"], ty, want, reason) {
                bail!("conditions are {}", gw.status["conditions"]);
            }
            Ok(())
        })
        .await
    }

    /// `GatewayListenersMustHaveConditions` for one listener (all when None).
    pub async fn listener_condition(
        &self,
        gateway: &str,
        listener: Option<&str>,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let want = if status { "True" } else { "False" };
        self.eventually(
            &format!("Gateway {gateway} listener {listener:?} {ty}={want} {reason}"),
            |cx| {
                let gw = cx.require("Gateway", gateway)?;
                let listeners = gw.status["listeners"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let mut seen = false;
                for l in &listeners {
                    if listener.is_some_and(|n| l["name"] != n) {
                        continue;
                    }
                    seen = true;
                    fresh(&gw, &l["conditions"])?;
                    if !has_condition(&l["conditions"], ty, want, reason) {
                        bail!("listener {} conditions are {}", l["name"], l["conditions"]);
                    }
                }
                if !seen {
                    bail!("no listener status for {listener:?}");
                }
                Ok(())
            },
        )
        .await
    }

    /// A listener's `attachedRoutes`.
    pub async fn attached_routes(
        &self,
        gateway: &str,
        listener: &str,
        want: i64,
    ) -> anyhow::Result<()> {
        self.eventually(
            &format!("Gateway {gateway} listener {listener} attachedRoutes"),
            |cx| {
                let gw = cx.require("Gateway", gateway)?;
                let l = gw.status["listeners"]
                    .as_array()
                    .and_then(|ls| ls.iter().find(|l| l["name"] == listener))
                    .ok_or_else(|| anyhow!("no listener status {listener}"))?;
                if l["attachedRoutes"].as_i64() != Some(want) {
                    bail!("attachedRoutes is {}, expected {want}", l["attachedRoutes"]);
                }
                Ok(())
            },
        )
        .await
    }

    /// A listener's `supportedKinds` (kinds only, group is Gateway API's).
    pub async fn supported_kinds(
        &self,
        gateway: &str,
        listener: &str,
        want: &[&str],
    ) -> anyhow::Result<()> {
        self.eventually(
            &format!("Gateway {gateway} listener {listener} supportedKinds"),
            |cx| {
                let gw = cx.require("Gateway", gateway)?;
                let l = gw.status["listeners"]
                    .as_array()
                    .and_then(|ls| ls.iter().find(|l| l["name"] == listener))
                    .ok_or_else(|| anyhow!("no listener status {listener}"))?;
                let got: Vec<&str> = l["supportedKinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|k| k["kind"].as_str())
                    .collect();
                if got != want {
                    bail!("supportedKinds {got:?}, expected {want:?}");
                }
                Ok(())
            },
        )
        .await
    }
}

/// An expected `status.listeners[]` entry (`GatewayStatusMustHaveListeners`).
#[derive(Debug, Clone)]
pub struct ListenerExpect {
    pub name: String,
    pub kinds: Vec<String>,
    pub attached: i64,
    pub conditions: Vec<(String, String, String)>,
}

/// A listener with kinds `[HTTPRoute]`, `attached` routes, Accepted and
/// ResolvedRefs True (any reason): the suite's usual expectation.
pub fn listener(name: &str, attached: i64) -> ListenerExpect {
    ListenerExpect {
        name: name.to_owned(),
        kinds: vec!["HTTPRoute".to_owned()],
        attached,
        conditions: vec![
            ("Accepted".into(), "True".into(), String::new()),
            ("ResolvedRefs".into(), "True".into(), String::new()),
        ],
    }
}

/// How a listener status's `supportedKinds` is compared with
/// [`ListenerExpect::kinds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KindsRule {
    /// The kinds, in order, exactly (`GatewayStatusMustHaveListeners`).
    Exactly,
    /// At least these kinds in the Gateway API group (group defaulted);
    /// none at all when none are expected
    /// (`ListenerSetStatusMustHaveListeners`).
    AtLeast,
}

/// `status.listeners` (`listeners`) are exactly `want`: each with the
/// supportedKinds `kinds` asks for, the attachedRoutes count and at least
/// the expected conditions.
fn listeners_match(
    listeners: &Json,
    want: &[ListenerExpect],
    kinds: KindsRule,
) -> anyhow::Result<()> {
    let got = listeners.as_array().cloned().unwrap_or_default();
    if got.len() != want.len() {
        bail!(
            "{} listeners in status, expected {}: {listeners}",
            got.len(),
            want.len()
        );
    }
    for w in want {
        let l = got
            .iter()
            .find(|l| l["name"] == w.name.as_str())
            .ok_or_else(|| anyhow!("no listener status {}", w.name))?;
        supported_kinds_match(l, w, kinds)?;
        if l["attachedRoutes"].as_i64() != Some(w.attached) {
            bail!(
                "listener {}: attachedRoutes {}, expected {}",
                w.name,
                l["attachedRoutes"],
                w.attached
            );
        }
        for (t, s, r) in &w.conditions {
            if !has_condition(&l["conditions"], t, s, r) {
                bail!(
                    "listener {}: no {t}={s} {r} in {}",
                    w.name,
                    conditions_brief(&l["conditions"])
                );
            }
        }
    }
    Ok(())
}

/// Listener status `l`'s `supportedKinds` compared with `w.kinds` by `rule`.
fn supported_kinds_match(l: &Json, w: &ListenerExpect, rule: KindsRule) -> anyhow::Result<()> {
    let entries = l["supportedKinds"].as_array().into_iter().flatten();
    match rule {
        KindsRule::Exactly => {
            let kinds: Vec<&str> = entries.filter_map(|k| k["kind"].as_str()).collect();
            if kinds != w.kinds {
                bail!(
                    "listener {}: supportedKinds {kinds:?}, expected {:?}",
                    w.name,
                    w.kinds
                );
            }
        }
        KindsRule::AtLeast => {
            let kinds: Vec<(&str, &str)> = entries
                .map(|k| {
                    (
                        k["group"].as_str().unwrap_or(GATEWAY_GROUP),
                        k["kind"].as_str().unwrap_or(""),
                    )
                })
                .collect();
            if w.kinds.is_empty() && !kinds.is_empty() {
                bail!(
                    "listener {}: supportedKinds {kinds:?}, expected none",
                    w.name
                );
            }
            for kind in &w.kinds {
                if !kinds.contains(&(GATEWAY_GROUP, kind.as_str())) {
                    bail!(
                        "listener {}: supportedKinds {kinds:?} lack {GATEWAY_GROUP}/{kind} (expected at least {:?})",
                        w.name,
                        w.kinds
                    );
                }
            }
        }
    }
    Ok(())
}

impl Ctx<'_> {
    /// `GatewayStatusMustHaveListeners`: exactly these listeners.
    pub async fn listeners(&self, gateway: &str, want: &[ListenerExpect]) -> anyhow::Result<()> {
        self.eventually(&format!("Gateway {gateway} listeners"), |cx| {
            let gw = cx.require("Gateway", gateway)?;
            listeners_match(&gw.status["listeners"], want, KindsRule::Exactly)
        })
        .await
    }

    /// Generation of an object's published status.
    pub fn generation(&self, kind: &str, id: &str) -> anyhow::Result<i64> {
        Ok(self.require(kind, id)?.generation)
    }

    /// `*MustHaveLatestConditions`: all the object's conditions (top level,
    /// listeners, route parents) carry its generation, which is not `old`.
    pub async fn latest_conditions(
        &self,
        kind: &str,
        id: &str,
        old: Option<i64>,
    ) -> anyhow::Result<()> {
        self.eventually(
            &format!("{kind} {id} conditions at the latest generation"),
            |cx| {
                let s = cx.require(kind, id)?;
                if old == Some(s.generation) {
                    bail!("generation is still {}", s.generation);
                }
                fresh(&s, &s.status["conditions"])?;
                for l in s.status["listeners"].as_array().into_iter().flatten() {
                    fresh(&s, &l["conditions"])?;
                }
                for p in s.status["parents"].as_array().into_iter().flatten() {
                    fresh(&s, &p["conditions"])?;
                }
                Ok(())
            },
        )
        .await
    }
}

// ---- ListenerSet status (GEP-1713), as the suite's kubernetes helpers read it ----

/// The API group of Gateway API kinds: what an omitted group means in a
/// parentRef or a supportedKinds entry.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// An expected condition: type, status, reason ("" means any reason).
pub type Cond = (&'static str, bool, &'static str);

fn status_word(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Conditions as `type=status reason` items (what a failure shows).
pub fn conditions_brief(conditions: &Json) -> String {
    let items: Vec<String> = conditions
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={} {}",
                c["type"].as_str().unwrap_or("?"),
                c["status"].as_str().unwrap_or("?"),
                c["reason"].as_str().unwrap_or("")
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}

/// The first of `conds` missing from `conditions`, as `type=status reason`.
fn missing_condition(conditions: &Json, conds: &[Cond]) -> Option<String> {
    conds.iter().find_map(|(ty, status, reason)| {
        (!has_condition(conditions, ty, status_word(*status), reason))
            .then(|| format!("{ty}={} {reason}", status_word(*status)))
    })
}

/// Whether a route status `parentRef` names `kind` `parent` (`ns/name`) as
/// the suite's `parentsForRouteMatch` compares them: group and kind (an
/// omitted one is the API default, which the API server would have filled
/// in), name, and namespace; an omitted namespace matches only when
/// `namespace_required` is false. The sectionName is not compared.
pub fn parent_ref_is(
    parent_ref: &Json,
    kind: &str,
    parent: &str,
    namespace_required: bool,
) -> bool {
    let (ns, name) = parent.split_once('/').unwrap_or(("", parent));
    let group = parent_ref["group"].as_str().unwrap_or(GATEWAY_GROUP);
    let actual_kind = parent_ref["kind"].as_str().unwrap_or("Gateway");
    let ns_ok = match parent_ref["namespace"].as_str() {
        Some(actual) => actual == ns,
        None => !namespace_required,
    };
    group == GATEWAY_GROUP && actual_kind == kind && parent_ref["name"] == name && ns_ok
}

impl Ctx<'_> {
    /// `ListenerSetMustHaveCondition`: the ListenerSet's conditions are
    /// fresh and include this one.
    pub async fn listener_set_condition(
        &self,
        listener_set: &str,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let want = status_word(status);
        self.eventually(
            &format!("ListenerSet {listener_set} {ty}={want} {reason}"),
            |cx| {
                let ls = cx.require("ListenerSet", listener_set)?;
                fresh(&ls, &ls.status["conditions"])?;
                if !has_condition(&ls.status["conditions"], ty, want, reason) {
                    bail!(
                        "conditions are {}",
                        conditions_brief(&ls.status["conditions"])
                    );
                }
                Ok(())
            },
        )
        .await
    }

    /// `ListenerSetListenersMustHaveConditions`: the ListenerSet's
    /// conditions are fresh, and each of `listeners` (every listener in
    /// status when empty) has all of `conds`.
    pub async fn listener_set_listener_conditions(
        &self,
        listener_set: &str,
        listeners: &[&str],
        conds: &[Cond],
    ) -> anyhow::Result<()> {
        self.eventually(
            &format!("ListenerSet {listener_set} listeners {listeners:?}"),
            |cx| {
                let ls = cx.require("ListenerSet", listener_set)?;
                fresh(&ls, &ls.status["conditions"])?;
                listeners_have(&ls.status, listeners, conds)
            },
        )
        .await
    }

    /// `GatewayListenersMustHaveConditions` with several conditions: each
    /// of `listeners` (every listener when empty) has all of `conds`.
    pub async fn gateway_listener_conditions(
        &self,
        gateway: &str,
        listeners: &[&str],
        conds: &[Cond],
    ) -> anyhow::Result<()> {
        self.eventually(
            &format!("Gateway {gateway} listeners {listeners:?}"),
            |cx| {
                let gw = cx.require("Gateway", gateway)?;
                listeners_have(&gw.status, listeners, conds)
            },
        )
        .await
    }

    /// `ListenerSetStatusMustHaveListeners`: the ListenerSet's conditions
    /// are fresh and its `status.listeners` are exactly these: each with
    /// at least the expected supportedKinds (group defaulted), the
    /// attachedRoutes count and at least the expected conditions.
    pub async fn listener_set_listeners(
        &self,
        listener_set: &str,
        want: &[ListenerExpect],
    ) -> anyhow::Result<()> {
        self.eventually(&format!("ListenerSet {listener_set} listeners"), |cx| {
            let ls = cx.require("ListenerSet", listener_set)?;
            fresh(&ls, &ls.status["conditions"])?;
            listeners_match(&ls.status["listeners"], want, KindsRule::AtLeast)
        })
        .await
    }

    /// `GatewayMustHaveAttachedListeners`: the Gateway's conditions are
    /// fresh and `status.attachedListenerSets` (absent: 0) is `want`.
    pub async fn attached_listener_sets(&self, gateway: &str, want: i64) -> anyhow::Result<()> {
        self.eventually(
            &format!("Gateway {gateway} attachedListenerSets {want}"),
            |cx| {
                let gw = cx.require("Gateway", gateway)?;
                fresh(&gw, &gw.status["conditions"])?;
                let got = gw.status["attachedListenerSets"].as_i64().unwrap_or(0);
                if got != want {
                    bail!(
                        "attachedListenerSets is {}, expected {want}",
                        gw.status["attachedListenerSets"]
                    );
                }
                Ok(())
            },
        )
        .await
    }

    /// `HTTPRouteMustHaveCondition` as the suite makes it: every parent's
    /// conditions are fresh, and a parent named like `parent` (`ns/name`,
    /// any kind; an omitted namespace matches) has the condition.
    pub async fn route_parent_condition(
        &self,
        route: &str,
        parent: &str,
        ty: &str,
        status: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let want = status_word(status);
        let (ns, name) = parent.split_once('/').unwrap_or(("", parent));
        self.eventually(
            &format!("HTTPRoute {route} parent {parent} {ty}={want} {reason}"),
            |cx| {
                let r = cx.require("HTTPRoute", route)?;
                let parents = r.status["parents"].as_array().cloned().unwrap_or_default();
                for p in &parents {
                    fresh(&r, &p["conditions"])?;
                }
                let named: Vec<&Json> = parents
                    .iter()
                    .filter(|p| {
                        let rf = &p["parentRef"];
                        rf["name"] == name && rf["namespace"].as_str().is_none_or(|n| n == ns)
                    })
                    .collect();
                if named.is_empty() {
                    bail!("no parent status named {parent} in {}", r.status);
                }
                if !named
                    .iter()
                    .any(|p| has_condition(&p["conditions"], ty, want, reason))
                {
                    let got: Vec<String> = named
                        .iter()
                        .map(|p| conditions_brief(&p["conditions"]))
                        .collect();
                    bail!("parent {parent} conditions are {}", got.join("; "));
                }
                Ok(())
            },
        )
        .await
    }

    /// `HTTPRouteMustHaveParents` for one expected parent: the route's
    /// status has a parent from our controller for `kind` `parent` with
    /// at least `conds` (more parents may be there, as upstream allows).
    pub async fn route_has_parent(
        &self,
        route: &str,
        kind: &str,
        parent: &str,
        namespace_required: bool,
        conds: &[Cond],
    ) -> anyhow::Result<()> {
        self.eventually(&format!("HTTPRoute {route} parent {kind} {parent}"), |cx| {
            let r = cx.require("HTTPRoute", route)?;
            let parents = r.status["parents"].as_array().cloned().unwrap_or_default();
            for p in &parents {
                fresh(&r, &p["conditions"])?;
            }
            let ok = parents.iter().any(|p| {
                p["controllerName"] == sluice::resources::CONTROLLER_NAME
                    && parent_ref_is(&p["parentRef"], kind, parent, namespace_required)
                    && missing_condition(&p["conditions"], conds).is_none()
            });
            if !ok {
                bail!("no parent {kind} {parent} with {conds:?} in {}", r.status);
            }
            Ok(())
        })
        .await
    }

    /// `RoutesAndParentMustBeAccepted` for a Gateway or a ListenerSet
    /// (`kind`): each route has a parent from our controller for it,
    /// `Accepted=True` reason `Accepted` (namespace required when the
    /// route lives elsewhere), and every listener of the parent is
    /// ResolvedRefs, Accepted and Programmed.
    pub async fn routes_and_parent_accepted(
        &self,
        kind: &str,
        parent: &str,
        routes: &[&str],
    ) -> anyhow::Result<()> {
        let parent_ns = parent.split('/').next().unwrap_or("");
        for route in routes {
            let route_ns = route.split('/').next().unwrap_or("");
            self.route_has_parent(
                route,
                kind,
                parent,
                route_ns != parent_ns,
                &[("Accepted", true, "Accepted")],
            )
            .await?;
        }
        const READY: &[Cond] = &[
            ("ResolvedRefs", true, ""),
            ("Accepted", true, ""),
            ("Programmed", true, ""),
        ];
        if kind == "ListenerSet" {
            self.listener_set_listener_conditions(parent, &[], READY)
                .await
        } else {
            self.gateway_listener_conditions(parent, &[], READY).await
        }
    }
}

/// Each of `listeners` (every one when empty) in `status.listeners` has
/// all of `conds`; a named listener missing from status is an error.
fn listeners_have(status: &Json, listeners: &[&str], conds: &[Cond]) -> anyhow::Result<()> {
    let got = status["listeners"].as_array().cloned().unwrap_or_default();
    for name in listeners {
        if !got.iter().any(|l| l["name"] == *name) {
            bail!("no listener status {name} in {}", status["listeners"]);
        }
    }
    for l in &got {
        let selected = listeners.is_empty() || listeners.iter().any(|n| l["name"] == *n);
        if !selected {
            continue;
        }
        if let Some(missing) = missing_condition(&l["conditions"], conds) {
            bail!(
                "listener {} has no {missing}: conditions are {}",
                l["name"],
                conditions_brief(&l["conditions"])
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo(pod: &str, path: &str, headers: &[(&str, &str)]) -> EchoResponse {
        EchoResponse {
            path: path.to_owned(),
            host: "example.com".to_owned(),
            method: "GET".to_owned(),
            proto: "HTTP/1.1".to_owned(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), vec![(*v).to_owned()]))
                .collect(),
            namespace: INFRA.to_owned(),
            ingress: String::new(),
            service: String::new(),
            pod: pod.to_owned(),
            body_bytes: 0,
        }
    }

    fn exchange(status: u16, echo: Option<EchoResponse>) -> Exchange {
        Exchange {
            status,
            headers: Vec::new(),
            echo,
            location: None,
        }
    }

    #[test]
    fn compare_checks_backend_prefix_path_and_headers() {
        let case = same_ns("/a")
            .header("Version", "one")
            .infra("infra-backend-v1");
        let ok = exchange(
            200,
            Some(echo(
                "infra-backend-v1-5f7c9-0",
                "/a",
                &[("Version", "one")],
            )),
        );
        assert!(compare(&case, &ok).is_ok());
        let wrong_pod = exchange(
            200,
            Some(echo(
                "infra-backend-v2-5f7c9-0",
                "/a",
                &[("Version", "one")],
            )),
        );
        assert!(compare(&case, &wrong_pod).is_err());
        let wrong_path = exchange(
            200,
            Some(echo(
                "infra-backend-v1-5f7c9-0",
                "/b",
                &[("Version", "one")],
            )),
        );
        assert!(compare(&case, &wrong_path).is_err());
        let no_header = exchange(200, Some(echo("infra-backend-v1-5f7c9-0", "/a", &[])));
        assert!(compare(&case, &no_header).is_err());
        assert!(compare(&case, &exchange(404, None)).is_err());
        let absent = same_ns("/a")
            .absent("Version")
            .infra("infra-backend-v1")
            .exp_no_headers();
        assert!(compare(&absent, &ok).is_err());
    }

    #[test]
    fn server_names_match_like_go() {
        assert!(go_name_matches("*.org", "unknown-example.org"));
        assert!(go_name_matches("example.org", "Example.ORG"));
        assert!(go_name_matches("*.wildcard.org", "a.wildcard.org"));
        assert!(!go_name_matches("*.wildcard.org", "a.b.wildcard.org"));
        assert!(!go_name_matches("*.org", "org"));
        assert!(!go_name_matches("example.org", "second-example.org"));
    }

    #[test]
    fn statuses_and_header_alternatives() {
        let case = same_ns("/p")
            .statuses(&[200, 204])
            .resp_header_one_of("a", &["x, y", "y, x"])
            .to("", "");
        let mut ex = exchange(204, None);
        ex.headers = vec![("a".into(), "y,x".into())];
        assert!(compare(&case, &ex).is_ok(), "204 and whitespace ignored");
        ex.status = 403;
        assert!(compare(&case, &ex).is_err());
        let mut ex = exchange(200, Some(echo("infra-backend-v1-1", "/p", &[])));
        ex.headers = vec![("a".into(), "x, y".into())];
        assert!(
            compare(&case, &ex).is_err(),
            "namespace \"\": the gateway must answer, not a backend"
        );
        ex.echo = None;
        assert!(compare(&case, &ex).is_ok());
    }

    #[test]
    fn redirect_ports_are_translated_back_and_defaults_dropped() {
        let mut ports = PortMap::default();
        let on80 = ports.assign("x/gw", 80).unwrap();
        let on8080 = ports.assign("x/gw", 8080).unwrap();
        let loc = split_location(&format!("http://example.org:{on80}/p"), &ports);
        assert_eq!(
            loc.2, "",
            "our port for listener 80 reads as the default port"
        );
        let loc = split_location(&format!("http://example.org:{on8080}/p"), &ports);
        assert_eq!(loc.2, "8080");
        let loc = split_location("https://example.org:443/p?q=1", &ports);
        assert_eq!(
            loc,
            (
                "https".into(),
                "example.org".into(),
                String::new(),
                "/p".into()
            )
        );
        let loc = split_location("http://example.org:8083/p", &ports);
        assert_eq!(loc.2, "8083");
    }

    #[test]
    fn redirect_expectations_default_to_the_request() {
        let case = same_ns("/p").redirect(302).r_host("example.org");
        let mut ex = exchange(302, None);
        ex.location = Some((
            "http".into(),
            "example.org".into(),
            String::new(),
            "/p".into(),
        ));
        assert!(compare(&case, &ex).is_ok());
        ex.location = Some((
            "https".into(),
            "example.org".into(),
            String::new(),
            "/p".into(),
        ));
        assert!(
            compare(&case, &ex).is_err(),
            "scheme defaults to the request's"
        );
        ex.location = Some((
            "http".into(),
            "example.org".into(),
            "8080".into(),
            "/p".into(),
        ));
        assert!(
            compare(&case, &ex).is_err(),
            "no expected port means the scheme's default"
        );
    }

    #[test]
    fn parent_refs_compare_group_kind_and_namespace_like_the_suite() {
        let omitted = serde_json::json!({"name": "gw"});
        assert!(
            parent_ref_is(&omitted, "Gateway", "infra/gw", false),
            "omitted group and kind are the API defaults, an omitted namespace matches when not required"
        );
        assert!(!parent_ref_is(&omitted, "Gateway", "infra/gw", true));
        assert!(!parent_ref_is(&omitted, "ListenerSet", "infra/gw", false));
        let ls = serde_json::json!({
            "group": GATEWAY_GROUP, "kind": "ListenerSet", "name": "ls", "namespace": "infra",
            "sectionName": "any",
        });
        assert!(parent_ref_is(&ls, "ListenerSet", "infra/ls", true));
        assert!(!parent_ref_is(&ls, "ListenerSet", "other/ls", false));
        assert!(!parent_ref_is(&ls, "Gateway", "infra/ls", false));
        let other_group =
            serde_json::json!({"group": "example.com", "kind": "ListenerSet", "name": "ls"});
        assert!(!parent_ref_is(
            &other_group,
            "ListenerSet",
            "infra/ls",
            false
        ));
    }

    #[test]
    fn listener_conditions_are_checked_on_the_named_listeners_or_all() {
        let status = serde_json::json!({"listeners": [
            {"name": "a", "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]},
            {"name": "b", "conditions": [{"type": "Accepted", "status": "False", "reason": "HostnameConflict"}]},
        ]});
        let accepted: &[Cond] = &[("Accepted", true, "")];
        assert!(listeners_have(&status, &["a"], accepted).is_ok());
        assert!(
            listeners_have(&status, &[], accepted).is_err(),
            "b is not accepted"
        );
        assert!(
            listeners_have(&status, &["b"], &[("Accepted", false, "HostnameConflict")]).is_ok()
        );
        assert!(
            listeners_have(&status, &["b"], &[("Accepted", false, "ProtocolConflict")]).is_err()
        );
        assert!(
            listeners_have(&status, &["c"], accepted).is_err(),
            "a named listener must be in status"
        );
        assert!(
            listeners_have(&serde_json::json!({}), &[], accepted).is_ok(),
            "no listeners: nothing to check, as upstream"
        );
    }
}
