//! Frontend client certificate validation through the binary (a Gateway's
//! `spec.tls.frontend`): the CA comes from a ConfigMap written here, a
//! client with a certificate it issued is served, a client without one or
//! with one from another CA is refused at the handshake, and a reload to
//! `AllowInsecureFallback` serves them all.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::TlsConnector;

use crate::support::{GATEWAY_HEAD, Pods, Resp, Sluice, TestCa, ca_config_map, tls_secret};

/// A TLS client trusting `server_ca`, offering HTTP/1.1, presenting
/// `client` when asked.
fn connector(
    server_ca: &TestCa,
    client: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
) -> TlsConnector {
    server_ca.client_connector(&[b"http/1.1"], client)
}

/// `GET /mtls` for `example.org` over TLS; `Err` when the handshake or the
/// exchange fails (a refused client certificate shows as either: under
/// TLS 1.3 the server's alert arrives after the client's handshake ends).
async fn get(sluice: &Sluice, connector: &TlsConnector) -> Result<Resp, String> {
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(sluice.addr())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let name = ServerName::try_from("example.org").expect("a server name");
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("http/1.1: {e}"))?;
        tokio::spawn(conn);
        let req = Request::get("/mtls")
            .header("host", "example.org")
            .body(Full::new(Bytes::new()))
            .expect("a request");
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        Resp::read(resp).await.map_err(|e| format!("body: {e}"))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| "no answer in 10 s".to_string())?
}

fn gateway(mode: &str) -> String {
    format!(
        r#"
{GATEWAY_HEAD}  tls:
    frontend:
      default:
        validation:
          mode: {mode}
          caCertificateRefs: [{{kind: ConfigMap, group: "", name: client-ca}}]
  listeners:
  - name: https
    protocol: HTTPS
    port: {{{{PORT}}}}
    tls: {{certificateRefs: [{{name: server}}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: mtls, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
  - backendRefs: [{{name: mtls, port: 8080}}]
"#
    )
}

#[tokio::test]
async fn only_clients_with_a_certificate_from_the_configured_ca_are_served() {
    let server_ca = TestCa::new();
    let server = server_ca.issue(&["example.org"]);
    let client_ca = TestCa::named("client CA");
    let other_ca = TestCa::named("another CA");
    let pods = Pods::start("default", "mtls", 1).await;
    let sluice = Sluice::start(&[
        ("gateway.yaml", gateway("AllowValidOnly")),
        ("ca.yaml", ca_config_map("client-ca", &client_ca)),
        ("secrets.yaml", tls_secret("default", "server", &server)),
        ("backends.yaml", pods.manifests()),
    ])
    .await;

    let valid = connector(&server_ca, Some(client_ca.issue_client("valid client")));
    let resp = get(&sluice, &valid)
        .await
        .unwrap_or_else(|e| panic!("valid client certificate: {e}; log:\n{}", sluice.log()));
    assert_eq!(resp.status, StatusCode::OK, "{resp:?}");
    assert_eq!(resp.pod(), "mtls-0");
    assert_eq!(resp.echo().path, "/mtls");

    let served_before = pods.requests();
    let without = connector(&server_ca, None);
    let foreign = connector(&server_ca, Some(other_ca.issue_client("foreign client")));
    for (what, c) in [
        ("no client certificate", &without),
        ("another CA's", &foreign),
    ] {
        if let Ok(resp) = get(&sluice, c).await {
            panic!("{what}: should be refused, got {resp:?}");
        }
    }
    assert_eq!(
        pods.requests(),
        served_before,
        "no refused request reached the backend"
    );

    // The Gateway does not report an insecure mode.
    let gw = sluice.object_status("Gateway", Some("default"), "gw").await;
    let conditions = gw["status"]["conditions"].as_array().expect("conditions");
    assert!(
        !conditions
            .iter()
            .any(|c| c["type"] == "InsecureFrontendValidationMode"),
        "{gw:#}"
    );

    // A reload to AllowInsecureFallback serves every client on the same
    // socket, and the Gateway says so.
    sluice.write("gateway.yaml", &gateway("AllowInsecureFallback"));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let served = [&without, &foreign, &valid];
        let mut all = true;
        for c in served {
            all &= matches!(get(&sluice, c).await, Ok(r) if r.status == StatusCode::OK);
        }
        if all {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "AllowInsecureFallback never served every client; log:\n{}",
            sluice.log()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let gw = sluice.object_status("Gateway", Some("default"), "gw").await;
    let insecure = gw["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "InsecureFrontendValidationMode")
        .unwrap_or_else(|| panic!("no InsecureFrontendValidationMode: {gw:#}"))
        .clone();
    assert_eq!(insecure["status"], "True");
    assert_eq!(insecure["reason"], "ConfigurationChanged");
}

#[tokio::test]
async fn a_missing_ca_config_map_takes_the_listener_down_with_the_spec_conditions() {
    let server_ca = TestCa::new();
    let server = server_ca.issue(&["example.org"]);
    let pods = Pods::start("default", "mtls", 1).await;
    let sluice = Sluice::start(&[
        ("gateway.yaml", gateway("AllowValidOnly")),
        ("secrets.yaml", tls_secret("default", "server", &server)),
        ("backends.yaml", pods.manifests()),
    ])
    .await;
    let gw = sluice.object_status("Gateway", Some("default"), "gw").await;
    let listener = &gw["status"]["listeners"][0];
    let cond = |ty: &str| {
        listener["conditions"]
            .as_array()
            .expect("listener conditions")
            .iter()
            .find(|c| c["type"] == ty)
            .unwrap_or_else(|| panic!("no {ty}: {gw:#}"))
            .clone()
    };
    assert_eq!(cond("ResolvedRefs")["status"], "False");
    assert_eq!(cond("ResolvedRefs")["reason"], "InvalidCACertificateRef");
    assert_eq!(cond("Accepted")["status"], "False");
    assert_eq!(cond("Accepted")["reason"], "NoValidCACertificate");
    assert_eq!(cond("Programmed")["status"], "False");
    // Not served: no client gets through, with or without a certificate.
    let any_client = TestCa::named("any CA");
    for c in [
        connector(&server_ca, None),
        connector(&server_ca, Some(any_client.issue_client("client"))),
    ] {
        assert!(get(&sluice, &c).await.is_err());
    }
    assert_eq!(pods.requests(), 0);
}
