//! HTTPS listeners through the binary: TLS terminated with certificates from
//! `kubernetes.io/tls` Secrets (generated here, written as manifests), SNI
//! choosing the listener and its certificate, 421 for a Host that belongs
//! to another listener, certificateRefs that do not resolve, ALPN h2.

use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::CertificateDer;
use tokio_rustls::client::TlsStream;

use crate::support::{
    GATEWAY_HEAD, Leaf, Pods, Resp, Sluice, TestCa, base64, free_port, tls_connect, tls_secret,
};

/// Send GETs with the given Host headers on one HTTP/1.1 connection.
async fn get_all(stream: TlsStream<tokio::net::TcpStream>, hosts: &[&str]) -> Vec<Resp> {
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("http/1.1 over TLS");
    tokio::spawn(conn);
    let mut out = Vec::new();
    for host in hosts {
        send.ready().await.expect("connection still open");
        let req = Request::get("/tls")
            .header("host", *host)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.expect("gateway answers");
        out.push(Resp::read(resp).await.expect("whole body"));
    }
    out
}

/// Everything the tests share: a CA, four certificates, three backends and
/// a Gateway with HTTPS listeners on the test port and an HTTP listener on
/// another one.
struct Setup {
    ca: TestCa,
    catch_all: Leaf,
    second: Leaf,
    wild: Leaf,
    sluice: Sluice,
    http_port: u16,
    _pods: Vec<Pods>,
}

async fn setup() -> Setup {
    let ca = TestCa::new();
    let catch_all = ca.issue(&["example.org"]);
    let second = ca.issue(&["second.example"]);
    let wild = ca.issue(&["*.wild.example"]);
    let denied = ca.issue(&["denied.example"]);
    let http_port = free_port();
    let pods = vec![
        Pods::start("default", "catch-all", 1).await,
        Pods::start("default", "second", 1).await,
        Pods::start("default", "wild", 1).await,
    ];
    let gateway = format!(
        r#"
{GATEWAY_HEAD}  listeners:
  - name: https
    protocol: HTTPS
    port: {{{{PORT}}}}
    tls: {{certificateRefs: [{{kind: Secret, group: "", name: catch-all}}]}}
  - name: second
    protocol: HTTPS
    port: {{{{PORT}}}}
    hostname: second.example
    tls: {{mode: Terminate, certificateRefs: [{{name: second}}]}}
  - name: wild
    protocol: HTTPS
    port: {{{{PORT}}}}
    hostname: "*.wild.example"
    tls: {{certificateRefs: [{{name: wild, namespace: certs}}]}}
  - name: denied
    protocol: HTTPS
    port: {{{{PORT}}}}
    hostname: denied.example
    tls: {{certificateRefs: [{{name: denied, namespace: locked}}]}}
  - name: missing
    protocol: HTTPS
    port: {{{{PORT}}}}
    hostname: missing.example
    tls: {{certificateRefs: [{{name: nonexistent}}]}}
  - name: http
    protocol: HTTP
    port: {http_port}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: gateways, namespace: certs}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: Gateway, namespace: default}}]
  to: [{{group: "", kind: Secret}}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: routes-only, namespace: locked}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}}]
  to: [{{group: "", kind: Secret}}]
"#
    );
    let mut routes = String::new();
    for (name, sections) in [
        ("catch-all", "[https, http]"),
        ("second", "[second]"),
        ("wild", "[wild]"),
    ] {
        let refs: Vec<String> = sections
            .trim_matches(|c| c == '[' || c == ']')
            .split(", ")
            .map(|s| format!("{{name: gw, sectionName: {s}}}"))
            .collect();
        routes.push_str(&format!(
            r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: default}}
spec:
  parentRefs: [{}]
  rules:
  - backendRefs: [{{name: {name}, port: 8080}}]
"#,
            refs.join(", ")
        ));
    }
    let mut secrets = tls_secret("default", "catch-all", &catch_all);
    secrets.push_str(&tls_secret("default", "second", &second));
    secrets.push_str(&tls_secret("certs", "wild", &wild));
    secrets.push_str(&tls_secret("locked", "denied", &denied));
    let backends: String = pods.iter().map(Pods::manifests).collect();
    let sluice = Sluice::start(&[
        ("gateway.yaml", gateway),
        ("routes.yaml", routes),
        ("secrets.yaml", secrets),
        ("backends.yaml", backends),
    ])
    .await;
    Setup {
        ca,
        catch_all,
        second,
        wild,
        sluice,
        http_port,
        _pods: pods,
    }
}

fn peer_certificate(stream: &TlsStream<tokio::net::TcpStream>) -> CertificateDer<'static> {
    stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .expect("the server presented a certificate")
        .clone()
        .into_owned()
}

#[tokio::test]
async fn sni_picks_the_listener_certificate_and_requests_are_served_over_tls() {
    let s = setup().await;
    let connector = s.ca.connector(&[b"http/1.1"]);
    for (sni, leaf, pod) in [
        ("example.org", &s.catch_all, "catch-all-0"),
        ("second.example", &s.second, "second-0"),
        // The wildcard listener's Secret is in another namespace, allowed by
        // a ReferenceGrant.
        ("a.wild.example", &s.wild, "wild-0"),
    ] {
        let stream = tls_connect(&s.sluice, &connector, sni)
            .await
            .unwrap_or_else(|e| panic!("handshake for {sni}: {e}; log:\n{}", s.sluice.log()));
        assert!(
            peer_certificate(&stream) == leaf.der,
            "{sni}: the listener's own certificate"
        );
        let resp = get_all(stream, &[sni]).await.remove(0);
        assert_eq!(resp.status, StatusCode::OK, "{sni}: {resp:?}");
        let echo = resp.echo();
        assert_eq!(echo.pod, pod, "{sni}");
        assert_eq!(echo.path, "/tls");
        assert_eq!(
            echo.header("x-forwarded-proto"),
            Some(&["https".to_string()][..]),
            "{sni}"
        );
    }
    // A name no listener has: the listener without a hostname answers
    // (and its certificate does not cover the name, so verification fails).
    assert!(
        tls_connect(&s.sluice, &connector, "unknown.example")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_host_owned_by_another_listener_than_the_sni_one_gets_421() {
    let s = setup().await;
    let connector = s.ca.connector(&[b"http/1.1"]);
    let stream = tls_connect(&s.sluice, &connector, "example.org")
        .await
        .expect("handshake");
    let resps = get_all(
        stream,
        &[
            "second.example",
            "a.wild.example",
            "example.org",
            "unknown.example",
        ],
    )
    .await;
    let got: Vec<String> = resps.iter().map(Resp::pod).collect();
    // Hosts of other listeners: 421; hosts the catch-all listener owns
    // (whether a route names them or not): served by it.
    assert_eq!(got, ["<421>", "<421>", "catch-all-0", "catch-all-0"]);

    let stream = tls_connect(&s.sluice, &connector, "x.wild.example")
        .await
        .expect("handshake");
    let got: Vec<String> = get_all(stream, &["y.wild.example", "example.org", "second.example"])
        .await
        .iter()
        .map(Resp::pod)
        .collect();
    assert_eq!(got, ["wild-0", "<421>", "<421>"]);
}

#[tokio::test]
async fn unresolved_certificate_refs_are_reported_and_the_other_listeners_serve() {
    let s = setup().await;
    let gw = s
        .sluice
        .object_status("Gateway", Some("default"), "gw")
        .await;
    let listener = |name: &str| {
        gw["status"]["listeners"]
            .as_array()
            .expect("listeners")
            .iter()
            .find(|l| l["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("listener {name} in {gw:#}"))
    };
    let condition = |name: &str, ty: &str| {
        let l = listener(name);
        let c = l["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == ty)
            .cloned()
            .unwrap_or_else(|| panic!("{ty} on {name}: {l:#}"));
        (
            c["status"].as_str().unwrap().to_string(),
            c["reason"].as_str().unwrap().to_string(),
        )
    };
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        condition("denied", "ResolvedRefs"),
        pair("False", "RefNotPermitted")
    );
    assert_eq!(
        condition("missing", "ResolvedRefs"),
        pair("False", "InvalidCertificateRef")
    );
    for bad in ["denied", "missing"] {
        assert_eq!(condition(bad, "Programmed").0, "False", "{bad}");
        assert_eq!(condition(bad, "Conflicted").0, "False", "{bad}");
    }
    for good in ["https", "second", "wild", "http"] {
        assert_eq!(
            condition(good, "ResolvedRefs"),
            pair("True", "ResolvedRefs"),
            "{good}"
        );
        assert_eq!(condition(good, "Programmed").0, "True", "{good}");
    }
    assert_eq!(listener("wild")["supportedKinds"][0]["kind"], "HTTPRoute");

    // The HTTP listener on its own port and the HTTPS listeners serve.
    let mut conn = crate::support::Conn::open(([127, 0, 0, 1], s.http_port).into()).await;
    let resp = conn.get("plain.example", "/").await;
    assert_eq!(resp.pod(), "catch-all-0");
    assert_eq!(
        resp.echo().header("x-forwarded-proto"),
        Some(&["http".to_string()][..])
    );
    let stream = tls_connect(&s.sluice, &s.ca.connector(&[]), "second.example")
        .await
        .expect("handshake");
    assert_eq!(
        get_all(stream, &["second.example"]).await[0].pod(),
        "second-0"
    );
}

#[tokio::test]
async fn alpn_h2_is_negotiated_and_requests_are_served_over_http2() {
    let s = setup().await;
    let stream = tls_connect(
        &s.sluice,
        &s.ca.connector(&[b"h2", b"http/1.1"]),
        "example.org",
    )
    .await
    .expect("handshake");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(conn);
    for path in ["/one", "/two"] {
        let req = Request::get(format!("https://example.org{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.expect("gateway answers");
        assert_eq!(resp.version(), Version::HTTP_2);
        assert_eq!(resp.status(), StatusCode::OK);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let echo: sluice::echo::EchoResponse = serde_json::from_slice(&body).unwrap();
        assert_eq!(echo.pod, "catch-all-0");
        assert_eq!(echo.path, path);
        assert_eq!(echo.host, "example.org");
        assert_eq!(echo.proto, "HTTP/1.1", "backends get HTTP/1.1 by default");
    }
    // Without ALPN the connection is HTTP/1.1.
    let stream = tls_connect(&s.sluice, &s.ca.connector(&[]), "example.org")
        .await
        .expect("handshake");
    assert_eq!(stream.get_ref().1.alpn_protocol(), None);
    assert_eq!(
        get_all(stream, &["example.org"]).await[0].pod(),
        "catch-all-0"
    );
}

#[tokio::test]
async fn a_rotated_certificate_is_served_after_the_reload() {
    let s = setup().await;
    let connector = s.ca.connector(&[]);
    let rotated = s.ca.issue(&["second.example"]);
    let mut secrets = tls_secret("default", "catch-all", &s.catch_all);
    secrets.push_str(&tls_secret("default", "second", &rotated));
    secrets.push_str(&tls_secret("certs", "wild", &s.wild));
    s.sluice.write("secrets.yaml", &secrets);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let stream = tls_connect(&s.sluice, &connector, "second.example")
            .await
            .expect("handshake");
        if peer_certificate(&stream) == rotated.der {
            assert_eq!(
                get_all(stream, &["second.example"]).await[0].pod(),
                "second-0"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated certificate was never served; log:\n{}",
            s.sluice.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

#[test]
fn base64_matches_the_standard_alphabet_and_padding() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"f"), "Zg==");
    assert_eq!(base64(b"fo"), "Zm8=");
    assert_eq!(base64(b"foo"), "Zm9v");
    assert_eq!(base64(b"Hello world\n"), "SGVsbG8gd29ybGQK");
}
