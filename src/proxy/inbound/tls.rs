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
//!
//! Client certificates (a Gateway's `spec.tls.frontend`) follow the same
//! table: each handshake asks for one only when the socket's port has
//! validation, checks it with that port's CAs, and (mode `AllowValidOnly`)
//! refuses a client without a valid one. Mode `AllowInsecureFallback` serves
//! every client. Sessions are not resumed on a port that requires client
//! certificates, so a reload that adds validation is never bypassed by a
//! session made before it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, StoresServerSessions};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme,
    client::danger::HandshakeSignatureValid,
};
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::proxy::Shared;
use crate::route::{ClientValidation, RouteTable};

/// How long a client may take to complete the TLS handshake.
pub(in crate::proxy) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every request of a TLS connection knows about it (a request
/// extension; absent on cleartext connections).
#[derive(Debug, Clone)]
pub struct TlsConnection {
    /// The SNI the client sent, if any.
    pub server_name: Option<Arc<str>>,
}

/// The rustls configuration of one HTTPS socket.
pub(in crate::proxy) fn server_config(shared: Arc<Shared>, bind: SocketAddr) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default protocol versions")
        .with_client_cert_verifier(Arc::new(PortClientVerifier {
            shared: shared.clone(),
            bind,
            algorithms,
        }))
        .with_cert_resolver(Arc::new(ListenerCertificates {
            shared: shared.clone(),
            bind,
        }));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.session_storage = Arc::new(PortSessions {
        inner: config.session_storage.clone(),
        shared,
        bind,
    });
    Arc::new(config)
}

/// The rustls configuration that terminates TLS on a socket of TLS
/// listeners in `Terminate` mode: the certificate of the listener that owns
/// the SNI, no client certificate, and no ALPN (the bytes relayed are the
/// backend's protocol, which the gateway does not speak for it).
pub(in crate::proxy) fn stream_server_config(
    shared: Arc<Shared>,
    bind: SocketAddr,
) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(ListenerCertificates { shared, bind }));
    Arc::new(config)
}

/// The client certificate validation of the socket bound at `bind`, in the
/// table current now.
fn client_validation(shared: &Shared, bind: SocketAddr) -> Option<Arc<ClientValidation>> {
    shared.table.load().port(bind)?.client_validation.clone()
}

/// Verifies client certificates with the CAs the current table gives the
/// socket's port; asks for none when the port has no validation.
struct PortClientVerifier {
    shared: Arc<Shared>,
    bind: SocketAddr,
    /// For handshake signatures (the client proving it holds its key).
    algorithms: WebPkiSupportedAlgorithms,
}

impl std::fmt::Debug for PortClientVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortClientVerifier")
            .field("bind", &self.bind)
            .finish()
    }
}

impl ClientCertVerifier for PortClientVerifier {
    fn offer_client_auth(&self) -> bool {
        client_validation(&self.shared, self.bind).is_some()
    }

    fn client_auth_mandatory(&self) -> bool {
        client_validation(&self.shared, self.bind).is_some_and(|v| !v.insecure_fallback)
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The CA names would borrow from a table that a reload may drop;
        // the hint is optional (clients send their certificate without it).
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let Some(v) = client_validation(&self.shared, self.bind) else {
            // A reload removed the validation since the handshake asked.
            return Ok(ClientCertVerified::assertion());
        };
        match v
            .verifier
            .verify_client_cert(end_entity, intermediates, now)
        {
            Err(e) if v.insecure_fallback => {
                tracing::debug!(bind = %self.bind, error = %e, "invalid client certificate served (AllowInsecureFallback)");
                Ok(ClientCertVerified::assertion())
            }
            result => result,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
            .or_else(|e| self.fallback(e))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
            .or_else(|e| self.fallback(e))
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl PortClientVerifier {
    /// A client whose certificate cannot even sign is still served under
    /// `AllowInsecureFallback`; otherwise the handshake fails with `e`.
    fn fallback(&self, e: rustls::Error) -> Result<HandshakeSignatureValid, rustls::Error> {
        match client_validation(&self.shared, self.bind) {
            Some(v) if !v.insecure_fallback => Err(e),
            _ => Ok(HandshakeSignatureValid::assertion()),
        }
    }
}

/// The socket's TLS session cache, which resumes no session while the
/// port requires client certificates (a resumed session skips them).
struct PortSessions {
    inner: Arc<dyn StoresServerSessions>,
    shared: Arc<Shared>,
    bind: SocketAddr,
}

impl std::fmt::Debug for PortSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortSessions")
            .field("bind", &self.bind)
            .finish()
    }
}

impl PortSessions {
    fn resumable(&self) -> bool {
        client_validation(&self.shared, self.bind).is_none_or(|v| v.insecure_fallback)
    }
}

impl StoresServerSessions for PortSessions {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.inner.put(key, value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        if self.resumable() {
            self.inner.get(key)
        } else {
            None
        }
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        if self.resumable() {
            self.inner.take(key)
        } else {
            None
        }
    }

    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
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

/// Is the request, on a TLS connection, for a Host that belongs to another
/// listener than the one its handshake chose (answered 421)? Never on a
/// cleartext connection.
pub(in crate::proxy) fn misdirected<B>(
    table: &RouteTable,
    bind: SocketAddr,
    req: &Request<B>,
    host: &str,
) -> bool {
    let Some(sni) = req
        .extensions()
        .get::<TlsConnection>()
        .and_then(|tls| tls.server_name.as_deref())
    else {
        return false;
    };
    table
        .port(bind)
        .is_some_and(|port| port.misdirected(sni, host))
}

/// The scheme a request arrived with, as the client sees it.
pub(in crate::proxy) fn scheme(extensions: &http::Extensions) -> &'static str {
    if extensions.get::<TlsConnection>().is_some() {
        "https"
    } else {
        "http"
    }
}
