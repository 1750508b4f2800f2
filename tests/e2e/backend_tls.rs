//! TLS to backends through the binary: a BackendTLSPolicy makes the gateway
//! speak TLS to a Service's endpoints, with `validation.hostname` as SNI,
//! the backend's certificate verified against the CA of a ConfigMap, and
//! the Gateway's `spec.tls.backend.clientCertificateRef` presented. A
//! wrong hostname, an untrusted CA or a missing CA ConfigMap fail the
//! request (502), as the spec says connections must fail.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::support::{
    GATEWAY_HEAD, Leaf, Sluice, TestCa, ca_config_map, route, static_service, tls_secret,
};

/// What the TLS backend saw of one connection.
#[derive(Debug, Clone, Default)]
struct Seen {
    sni: Option<String>,
    client_cert: Option<CertificateDer<'static>>,
}

/// A TLS echo backend: answers 200 to every request, and records the SNI
/// and client certificate of each connection. Client certificates are
/// asked for (verified against `client_ca`) but not required.
struct TlsBackend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsBackend {
    async fn start(server: &Leaf, client_ca: &TestCa) -> TlsBackend {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(client_ca.cert.clone()).expect("client CA");
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone())
            .allow_unauthenticated()
            .build()
            .expect("client verifier");
        let chain = CertificateDer::pem_slice_iter(server.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("server chain");
        let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).expect("server key");
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let record = record.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let conn = tls.get_ref().1;
                    let s = Seen {
                        sni: conn.server_name().map(str::to_owned),
                        client_cert: conn
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .map(|c| c.clone().into_owned()),
                    };
                    record.lock().expect("lock").push(s);
                    let service = service_fn(|_req| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                            b"hello over TLS",
                        ))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        TlsBackend { addr, seen, task }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

/// Our GatewayClass and Gateway `default/gw` on `{{PORT}}`, presenting the
/// client certificate of Secret `client` to TLS backends.
fn gateway_with_client_certificate() -> String {
    format!(
        r#"
{GATEWAY_HEAD}  listeners:
  - {{name: http, protocol: HTTP, port: {{{{PORT}}}}}}
  tls:
    backend:
      clientCertificateRef: {{kind: Secret, name: client}}
"#
    )
}

/// Service `name` (port 443 named https) with the backend as its endpoint,
/// a BackendTLSPolicy on it, and a route sending `/name` to it.
fn tls_service(name: &str, backend: SocketAddr, hostname: &str, ca_config_map: &str) -> String {
    let mut out = static_service(name, Some("https"), 443, None, backend.port());
    out.push_str(&format!(
        r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: {name}, namespace: default}}
spec:
  targetRefs: [{{group: '', kind: Service, name: {name}}}]
  validation:
    caCertificateRefs: [{{group: '', kind: ConfigMap, name: {ca_config_map}}}]
    hostname: {hostname}
"#
    ));
    out.push_str(&route(
        "default",
        name,
        &format!(
            "  rules:\n  - matches: [{{path: {{type: Exact, value: /{name}}}}}]\n    backendRefs: [{{name: {name}, port: 443}}]\n"
        ),
    ));
    out
}

fn condition<'a>(conditions: &'a serde_json::Value, ty: &str) -> &'a serde_json::Value {
    conditions
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == ty))
        .unwrap_or_else(|| panic!("no {ty} condition in {conditions}"))
}

#[tokio::test]
async fn backend_tls_policy_verifies_the_backend_and_presents_the_client_certificate() {
    let ca = TestCa::new();
    let other_ca = TestCa::new();
    let backend = TlsBackend::start(&ca.issue(&["abc.example.com"]), &ca).await;
    let client = ca.issue(&["gateway.example.com"]);

    let mut manifests = gateway_with_client_certificate();
    manifests.push_str(&tls_secret("default", "client", &client));
    manifests.push_str(&ca_config_map("ca", &ca));
    manifests.push_str(&ca_config_map("other-ca", &other_ca));
    manifests.push_str(&tls_service("good", backend.addr, "abc.example.com", "ca"));
    manifests.push_str(&tls_service(
        "wrong-name",
        backend.addr,
        "other.example.com",
        "ca",
    ));
    manifests.push_str(&tls_service(
        "untrusted",
        backend.addr,
        "abc.example.com",
        "other-ca",
    ));
    manifests.push_str(&tls_service(
        "no-ca",
        backend.addr,
        "abc.example.com",
        "missing",
    ));
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;

    let ok = sluice
        .eventually("example.com", "/good", |r| r.status == StatusCode::OK)
        .await;
    assert_eq!(ok.body, Bytes::from_static(b"hello over TLS"));
    let seen = backend.seen();
    let first = seen.first().expect("the backend saw a TLS connection");
    assert_eq!(first.sni.as_deref(), Some("abc.example.com"));
    assert_eq!(
        first.client_cert.as_ref(),
        Some(&client.der),
        "the Gateway's client certificate is presented"
    );

    // Connections that must fail: the certificate is not valid for the
    // hostname, or not issued by the policy's CA, or there is no valid CA.
    let mut conn = sluice.connect().await;
    for path in ["/wrong-name", "/untrusted", "/no-ca"] {
        let r = conn.get("example.com", path).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{path}: {r:?}");
    }
    // Keep-alive: the good backend is still reached after failures.
    assert_eq!(
        conn.get("example.com", "/good").await.status,
        StatusCode::OK
    );

    let gw = sluice.object_status("Gateway", Some("default"), "gw").await;
    let resolved = condition(&gw["status"]["conditions"], "ResolvedRefs");
    assert_eq!(resolved["status"], "True", "{gw}");

    let good = sluice
        .object_status("BackendTLSPolicy", Some("default"), "good")
        .await;
    let ancestor = &good["status"]["ancestors"][0];
    assert_eq!(ancestor["ancestorRef"]["name"], "gw");
    assert_eq!(
        condition(&ancestor["conditions"], "Accepted")["status"],
        "True"
    );

    let no_ca = sluice
        .object_status("BackendTLSPolicy", Some("default"), "no-ca")
        .await;
    let conditions = &no_ca["status"]["ancestors"][0]["conditions"];
    assert_eq!(
        condition(conditions, "Accepted")["reason"],
        "NoValidCACertificate"
    );
    assert_eq!(
        condition(conditions, "ResolvedRefs")["reason"],
        "InvalidCACertificateRef"
    );
}

#[tokio::test]
async fn an_invalid_client_certificate_ref_is_reported_on_the_gateway() {
    let manifests = gateway_with_client_certificate()
        + "\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: client, namespace: default}\ntype: Opaque\ndata: {}\n";
    let sluice = Sluice::start(&[("all.yaml", manifests)]).await;
    let gw = sluice.object_status("Gateway", Some("default"), "gw").await;
    let conditions = &gw["status"]["conditions"];
    let resolved = condition(conditions, "ResolvedRefs");
    assert_eq!(resolved["status"], "False", "{gw}");
    assert_eq!(resolved["reason"], "InvalidClientCertificateRef");
    assert_eq!(condition(conditions, "Accepted")["status"], "True");
}
