//! TLS termination for HTTPS listeners (rustls with the `ring` provider).
//!
//! The certificate is chosen per handshake from the route table current at
//! that moment, by SNI: the listener that owns the server name presents its
//! certificate, so several HTTPS listeners share a port and a reload swaps
//! certificates without rebinding. ALPN offers `h2` and `http/1.1`.
//!
//! The handshake's server name travels with the connection: a request whose
//! Host belongs to another listener than the one the handshake chose is
//! misdirected (a reused connection, HTTP/2 coalescing) and gets 421.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Request, Response, StatusCode};
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::Shared;
use super::body::ResponseBody;
use crate::route::RouteTable;

/// How long a client may take to complete the TLS handshake.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every request of a TLS connection knows about it (a request
/// extension; absent on cleartext connections).
#[derive(Debug, Clone)]
pub struct TlsConnection {
    /// The SNI the client sent, if any.
    pub server_name: Option<Arc<str>>,
}

/// The rustls configuration of one HTTPS socket.
pub(super) fn server_config(shared: Arc<Shared>, bind: SocketAddr) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(ListenerCertificates { shared, bind }));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Picks the certificate of the listener that owns the handshake's SNI.
struct ListenerCertificates {
    shared: Arc<Shared>,
    bind: SocketAddr,
}

impl std::fmt::Debug for ListenerCertificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerCertificates")
            .field("bind", &self.bind)
            .finish()
    }
}

impl ResolvesServerCert for ListenerCertificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let table = self.shared.table.load();
        let found = table
            .port(self.bind)
            .and_then(|p| p.certificate_for(hello.server_name()));
        if found.is_none() {
            tracing::debug!(bind = %self.bind, sni = ?hello.server_name(), "no listener certificate for this server name");
        }
        found
    }
}

/// The 421 response for a request on a TLS connection whose Host belongs to
/// another listener than the one its handshake chose; `None` when the
/// request is not misdirected (or the connection is cleartext).
pub(super) fn misdirected<B>(
    table: &RouteTable,
    bind: SocketAddr,
    req: &Request<B>,
    host: &str,
) -> Option<Response<ResponseBody>> {
    let sni = req
        .extensions()
        .get::<TlsConnection>()?
        .server_name
        .as_deref()?;
    if !table.port(bind)?.misdirected(sni, host) {
        return None;
    }
    const TEXT: &str = "misdirected request: this connection does not serve that host\n";
    let mut resp = Response::new(ResponseBody::full(TEXT));
    *resp.status_mut() = StatusCode::MISDIRECTED_REQUEST;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(TEXT.len()));
    Some(resp)
}

/// The scheme a request arrived with, as the client sees it.
pub(super) fn scheme(extensions: &http::Extensions) -> &'static str {
    if extensions.get::<TlsConnection>().is_some() {
        "https"
    } else {
        "http"
    }
}
