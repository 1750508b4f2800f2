//! The suite's HTTP client: the requests a test makes through the gateway,
//! over HTTP/1.1, HTTP/2 with prior knowledge (h2c), or TLS with a server
//! name (trusting only the CA that issued the suite's certificates, with
//! Go's server-name rules), and the WebSocket exchange of the WebSocket
//! test. What comes back is an [`Exchange`], judged by [`crate::expect`].
//!
//! Requests go to the loopback port a listener moved to; a `Location`'s
//! port is translated back to the listener port it stands for, so that
//! expectations speak of the manifests' ports.

use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use sluice::echo::EchoResponse;
use tokio::net::TcpStream;

use crate::ctx::Ctx;
use crate::env::{self, PortMap};
use crate::expect::Case;

/// Bound on one request through the gateway.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// What came back for one request.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub status: u16,
    /// Response headers: lower-case name, values.
    pub headers: Vec<(String, String)>,
    /// What the backend saw, when it answered with an echo body.
    pub echo: Option<EchoResponse>,
    /// The server name (SNI) of the connection the backend answered on,
    /// when it reports one (echo-basic's `tls.serverName`).
    pub backend_sni: Option<String>,
    /// `Location` split into scheme, host, port ("" when absent), path.
    pub location: Option<(String, String, String, String)>,
}

impl Ctx<'_> {
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

/// A TLS client trusting the suite's CA and the TLS checks CA (the
/// backends' certificates a passthrough listener hands through), built
/// once.
fn tls_connector() -> anyhow::Result<tokio_rustls::TlsConnector> {
    static CONNECTOR: std::sync::OnceLock<tokio_rustls::TlsConnector> = std::sync::OnceLock::new();
    if let Some(c) = CONNECTOR.get() {
        return Ok(c.clone());
    }
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(env::suite_ca()?)
        .context("the suite CA is not a valid trust anchor")?;
    roots
        .add(crate::backend_tls::checks_ca()?)
        .context("the TLS checks CA is not a valid trust anchor")?;
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
    let backend_sni = echo
        .as_ref()
        .and_then(|_| serde_json::from_slice::<serde_json::Value>(&body).ok())
        .and_then(|v| v["tls"]["serverName"].as_str().map(str::to_owned));
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
        backend_sni,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
