//! Frontend client certificate validation tests (`GatewayFrontend*`,
//! `GatewayInvalidFrontendClientCertificateValidation`): Gateway
//! `spec.tls.frontend` CA references and the mTLS handshakes they imply.
//!
//! At set-up the upstream suite creates, in the infra namespace, two CAs as
//! ConfigMaps (`tls-validity-checks-ca-certificate` for the default
//! validation, `tls-validity-checks-per-port-ca-certificate` for the
//! per-port one, PEM under `ca.crt`) and one client certificate issued by
//! each (`tls-validity-checks-client-certificate`,
//! `tls-validity-checks-per-port-client-certificate`). [`suite_objects`]
//! makes the same, generated once per run.
//!
//! A request "fails" as the suite's `MakeTLSRequestAndExpectFailureResponse`
//! judges it: the round trip ends in an error (refused, handshake alert,
//! connection closed); when the request carries a client certificate, the
//! gateway must also have asked for it during the handshake.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use http::Request;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;

use crate::client::{Exchange, REQUEST_DEADLINE, read_exchange};
use crate::ctx::{Ctx, INFRA};
use crate::env::{self, PortMap};
use crate::expect::{CONSECUTIVE_SUCCESSES, MAX_TIME_TO_CONSISTENCY, compare, converge, req};

/// ConfigMap of the CA the default validation trusts.
const DEFAULT_CA: &str = "tls-validity-checks-ca-certificate";
/// ConfigMap of the CA the per-port validation trusts.
const PER_PORT_CA: &str = "tls-validity-checks-per-port-ca-certificate";
/// Secret of the client certificate issued by [`DEFAULT_CA`].
const DEFAULT_CLIENT: &str = "tls-validity-checks-client-certificate";
/// Secret of the client certificate issued by [`PER_PORT_CA`].
const PER_PORT_CLIENT: &str = "tls-validity-checks-per-port-client-certificate";

/// One client identity: certificate chain and key.
struct ClientIdentity {
    chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
}

/// The CAs and client certificates of one run.
struct ClientPki {
    objects: Vec<Value>,
    default_client: ClientIdentity,
    per_port_client: ClientIdentity,
}

fn client_pki() -> anyhow::Result<&'static ClientPki> {
    static PKI: std::sync::OnceLock<ClientPki> = std::sync::OnceLock::new();
    if let Some(p) = PKI.get() {
        return Ok(p);
    }
    let mut objects = Vec::new();
    let mut clients = Vec::new();
    for (ca_name, client_name) in [(DEFAULT_CA, DEFAULT_CLIENT), (PER_PORT_CA, PER_PORT_CLIENT)] {
        let ca = env::RunnerCa::new(&format!("sluice conformance {ca_name}"))?;
        let (cert, key) = ca.issue(
            Vec::new(),
            Some(client_name),
            &format!("client certificate {client_name}"),
        )?;
        objects.push(ca.config_map(INFRA, ca_name)?);
        objects.push(env::tls_secret(INFRA, client_name, &cert, &key)?);
        clients.push(ClientIdentity {
            chain: vec![cert.der().clone()],
            key_der: key.serialize_der(),
        });
    }
    let per_port_client = clients.pop().expect("two clients were issued");
    let default_client = clients.pop().expect("two clients were issued");
    Ok(PKI.get_or_init(|| ClientPki {
        objects,
        default_client,
        per_port_client,
    }))
}

/// The CA ConfigMaps and client certificate Secrets the suite creates at
/// set-up, as manifests (generated on first use).
pub fn suite_objects() -> anyhow::Result<Vec<Value>> {
    Ok(client_pki()?.objects.clone())
}

/// Move a rendered Gateway's `spec.tls.frontend.perPort[].port` to the
/// loopback port its listeners were moved to (a per-port setting names a
/// listener port). Ports no listener of `gateway` uses stay as they are.
pub fn remap_per_port(doc: &mut Value, gateway: &str, ports: &PortMap) {
    let Some(per_port) = doc
        .get_mut("spec")
        .and_then(|s| s.get_mut("tls"))
        .and_then(|t| t.get_mut("frontend"))
        .and_then(|f| f.get_mut("perPort"))
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for entry in per_port {
        let actual = entry
            .get("port")
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .and_then(|p| ports.actual(gateway, p));
        if let (Some(actual), Some(m)) = (actual, entry.as_object_mut()) {
            m.insert("port".into(), Value::from(actual));
        }
    }
}

/// Which client certificate a request presents.
#[derive(Debug, Clone, Copy)]
enum Client {
    None,
    Default,
    PerPort,
}

impl Client {
    fn identity(self) -> anyhow::Result<Option<&'static ClientIdentity>> {
        let pki = client_pki()?;
        Ok(match self {
            Client::None => None,
            Client::Default => Some(&pki.default_client),
            Client::PerPort => Some(&pki.per_port_client),
        })
    }
}

/// `GatewayFrontendClientCertificateValidation` (and, `insecure`, its
/// `InsecureFallback` variant): port 443 validates with the default CA,
/// port 8443 with the per-port CA. With `AllowValidOnly` the other CA's
/// certificate is refused; with `AllowInsecureFallback` every client is
/// served, and the Gateway says so.
pub async fn validation(cx: &mut Ctx<'_>, insecure: bool) -> anyhow::Result<()> {
    let (gateway, routes) = if insecure {
        (
            format!("{INFRA}/client-validation-insecure-fallback"),
            [
                format!("{INFRA}/client-cert-validation-insecure-fallback-test"),
                format!("{INFRA}/client-cert-validation-insecure-fallback-test-no-hostname"),
            ],
        )
    } else {
        (
            format!("{INFRA}/client-validation-default"),
            [
                format!("{INFRA}/client-certificate-validation-https-test"),
                format!("{INFRA}/client-certificate-validation-https-test-no-hostname"),
            ],
        )
    };
    let routes: Vec<&str> = routes.iter().map(String::as_str).collect();
    cx.accepted(&gateway, &routes).await?;
    for route in &routes {
        cx.resolved(route, &gateway).await?;
    }
    if insecure {
        cx.gateway_condition(
            &gateway,
            "InsecureFrontendValidationMode",
            true,
            "ConfigurationChanged",
        )
        .await?;
    }
    let ports = [
        (
            443,
            "example.org",
            "infra-backend-v1",
            Client::Default,
            Client::PerPort,
        ),
        (
            8443,
            "second-example.org",
            "infra-backend-v2",
            Client::PerPort,
            Client::Default,
        ),
    ];
    for (port, host, backend, matching, other) in ports {
        expect_served(cx, &gateway, port, host, backend, matching)
            .await
            .with_context(|| format!("port {port}, client certificate of its CA"))?;
        if insecure {
            for client in [other, Client::None] {
                expect_served(cx, &gateway, port, host, backend, client)
                    .await
                    .with_context(|| {
                        format!(
                            "port {port}, {client:?} client certificate (AllowInsecureFallback)"
                        )
                    })?;
            }
        } else {
            expect_refused(cx, &gateway, port, host, other)
                .await
                .with_context(|| format!("port {port}, client certificate of the other CA"))?;
        }
    }
    Ok(())
}

/// `GatewayInvalidFrontendClientCertificateValidation`: each listener whose
/// port's CA reference is invalid reports why and is not accepted; the
/// listener with the valid default keeps serving.
pub async fn invalid(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gateway = format!("{INFRA}/gateway-with-invalid-client-cert-validation");
    for (ty, status, reason) in [
        ("ResolvedRefs", true, ""),
        ("Accepted", true, ""),
        ("Programmed", true, ""),
    ] {
        cx.listener_condition(&gateway, Some("https"), ty, status, reason)
            .await?;
    }
    for (listener, reason) in [
        ("https-unresolved", "InvalidCACertificateRef"),
        ("https-invalid-kind", "InvalidCACertificateKind"),
        ("https-grant-missing", "RefNotPermitted"),
    ] {
        for (ty, status, reason) in [
            ("ResolvedRefs", false, reason),
            ("Accepted", false, "NoValidCACertificate"),
            ("Programmed", false, ""),
        ] {
            cx.listener_condition(&gateway, Some(listener), ty, status, reason)
                .await?;
        }
    }
    Ok(())
}

/// `GatewayFrontendInvalidDefaultClientCertificateValidation`: an invalid
/// default validation takes the HTTPS listener down and leaves the HTTP
/// listener serving.
pub async fn invalid_default(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gateway = format!("{INFRA}/invalid-default-client-validation-config");
    cx.eventually("Gateway address assigned", |cx| {
        let gw = cx
            .status_of("Gateway", &gateway)
            .ok_or_else(|| anyhow!("no status for Gateway {gateway}"))?;
        let has_address = gw.status["addresses"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["value"].is_string()));
        if has_address {
            Ok(())
        } else {
            bail!("Gateway {gateway} has no address in status")
        }
    })
    .await?;
    for ty in ["ResolvedRefs", "Accepted", "Programmed"] {
        cx.listener_condition(&gateway, Some("http"), ty, true, "")
            .await?;
    }
    let case = &req(&gateway, "/")
        .port(80)
        .host("example.org")
        .infra("infra-backend-v1");
    let cx_ref: &Ctx<'_> = cx;
    converge(
        CONSECUTIVE_SUCCESSES,
        MAX_TIME_TO_CONSISTENCY,
        || async move {
            let exchange = cx_ref.send(case).await?;
            compare(case, &exchange)
        },
    )
    .await
    .context("HTTP listener")?;
    for (ty, status, reason) in [
        ("ResolvedRefs", false, "InvalidCACertificateRef"),
        ("Accepted", false, "NoValidCACertificate"),
        ("Programmed", false, ""),
    ] {
        cx.listener_condition(&gateway, Some("https"), ty, status, reason)
            .await?;
    }
    expect_refused(cx, &gateway, 443, "example.org", Client::None)
        .await
        .context("HTTPS listener")
}

/// `MakeTLSRequestAndExpectEventuallyConsistentResponse`: a TLS request
/// for `/` on `host` (also the SNI) through `gateway`'s `port`, presenting
/// `client`, answered by `backend` in the infra namespace, consistently.
async fn expect_served(
    cx: &Ctx<'_>,
    gateway: &str,
    port: u16,
    host: &str,
    backend: &str,
    client: Client,
) -> anyhow::Result<()> {
    let actual = actual_port(cx, gateway, port)?;
    let case = &req(gateway, "/")
        .port(port)
        .host(host)
        .tls(host)
        .infra(backend);
    converge(
        CONSECUTIVE_SUCCESSES,
        MAX_TIME_TO_CONSISTENCY,
        || async move {
            let (exchange, _) = tls_round_trip(actual, host, client).await?;
            compare(case, &exchange)
        },
    )
    .await
}

/// `MakeTLSRequestAndExpectFailureResponse`: the request fails, and a
/// client certificate it carries was asked for by the gateway.
async fn expect_refused(
    cx: &Ctx<'_>,
    gateway: &str,
    port: u16,
    host: &str,
    client: Client,
) -> anyhow::Result<()> {
    let actual = actual_port(cx, gateway, port)?;
    let asked = Arc::new(AtomicBool::new(false));
    match tls_round_trip_recording(actual, host, client, asked.clone()).await {
        Ok((exchange, _)) => bail!(
            "the request should fail, it was answered {}",
            exchange.status
        ),
        Err(e) => {
            if client.identity()?.is_some() && !asked.load(Ordering::SeqCst) {
                bail!(
                    "the gateway did not ask for a client certificate (the request failed: {e:#})"
                );
            }
            Ok(())
        }
    }
}

fn actual_port(cx: &Ctx<'_>, gateway: &str, port: u16) -> anyhow::Result<u16> {
    cx.ports
        .actual(gateway, port)
        .ok_or_else(|| anyhow!("Gateway {gateway} has no listener on port {port}"))
}

async fn tls_round_trip(
    actual_port: u16,
    host: &str,
    client: Client,
) -> anyhow::Result<(Exchange, bool)> {
    tls_round_trip_recording(actual_port, host, client, Arc::new(AtomicBool::new(false))).await
}

/// One HTTP/1.1 `GET /` over TLS (SNI and Host `host`), trusting the suite
/// CA and presenting `client`'s certificate when the gateway asks (`asked`
/// records that it did).
async fn tls_round_trip_recording(
    actual_port: u16,
    host: &str,
    client: Client,
    asked: Arc<AtomicBool>,
) -> anyhow::Result<(Exchange, bool)> {
    let config = client_config(client, asked.clone())?;
    let exchange = tokio::time::timeout(REQUEST_DEADLINE, async {
        let stream = TcpStream::connect(("127.0.0.1", actual_port))
            .await
            .with_context(|| format!("cannot connect to 127.0.0.1:{actual_port}"))?;
        let name = ServerName::try_from(host.to_owned())
            .with_context(|| format!("{host:?} is not a server name"))?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, stream)
            .await
            .context("TLS handshake")?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .context("HTTP/1.1 handshake")?;
        tokio::spawn(connection);
        let request = Request::builder()
            .uri("/")
            .header(http::header::HOST, host)
            .body(Empty::<Bytes>::new())
            .context("building the request")?;
        let response = sender.send_request(request).await.context("request")?;
        read_exchange(response, None).await
    })
    .await
    .map_err(|_| anyhow!("no response within {REQUEST_DEADLINE:?}"))??;
    Ok((exchange, asked.load(Ordering::SeqCst)))
}

/// A TLS client trusting the suite CA, offering HTTP/1.1, with `client`'s
/// certificate.
fn client_config(
    client: Client,
    asked: Arc<AtomicBool>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(env::suite_ca()?)
        .context("the suite CA is not a valid trust anchor")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = match client.identity()? {
        None => None,
        Some(id) => {
            let der = PrivateKeyDer::try_from(id.key_der.clone())
                .map_err(|e| anyhow!("client key: {e}"))?;
            Some(Arc::new(
                CertifiedKey::from_der(id.chain.clone(), der, &provider)
                    .context("client certificate and key")?,
            ))
        }
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(RecordingClientCert { key, asked }));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Presents a client certificate (if it has one) and records that the
/// server asked for one, as the suite's `GetClientCertificateHook` does.
#[derive(Debug)]
struct RecordingClientCert {
    key: Option<Arc<CertifiedKey>>,
    asked: Arc<AtomicBool>,
}

impl ResolvesClientCert for RecordingClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.asked.store(true, Ordering::SeqCst);
        self.key.clone()
    }

    fn has_certs(&self) -> bool {
        self.key.is_some()
    }
}
