//! TLSRoute through the binary: TLS listeners in Passthrough mode route
//! each connection by the SNI of its ClientHello to weighted backends
//! (split per connection, exactly), relay the bytes both ways with
//! half-close, refuse what they cannot route by closing the connection,
//! and hold clients to the ClientHello limits; in Terminate mode the
//! gateway completes the handshake and relays the decrypted bytes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::edge::Gw;
use crate::support::{
    GATEWAY_HEAD, TestCa, admin_get, poll_until, route_of_kind, static_service, tls_secret,
};

/// A backend that answers every connection with its name, then echoes
/// what it reads, upper-cased, until the client is done sending; then it
/// says how many bytes it got and closes. Over TLS (passthrough: it owns
/// the certificate) or in cleartext (behind a Terminate listener).
struct StreamBackend {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StreamBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StreamBackend {
    async fn start(name: &'static str, tls: Option<Arc<rustls::ServerConfig>>) -> StreamBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                counted.fetch_add(1, Ordering::Relaxed);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        Some(a) => {
                            if let Ok(s) = a.accept(stream).await {
                                let sni = s.get_ref().1.server_name().unwrap_or("-").to_owned();
                                serve_stream(s, name, &sni).await;
                            }
                        }
                        None => serve_stream(stream, name, "-").await,
                    }
                });
            }
        });
        StreamBackend {
            addr,
            connections,
            task,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

async fn serve_stream<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, name: &str, sni: &str) {
    if s.write_all(format!("{name} sni={sni}\n").as_bytes())
        .await
        .is_err()
    {
        return;
    }
    let mut total = 0usize;
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                total += n;
                let upper = buf[..n].to_ascii_uppercase();
                if s.write_all(&upper).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = s
        .write_all(format!("\ngot {total} bytes\n").as_bytes())
        .await;
    let _ = s.shutdown().await;
}

/// A TLS listener in `mode` on `{{PORT}}`, with `extra` listener fields.
fn tls_gateway(mode: &str, extra: &str) -> String {
    format!(
        "{GATEWAY_HEAD}  listeners:
  - name: tls
    protocol: TLS
    port: {{{{PORT}}}}
    tls: {{mode: {mode}{extra}}}
"
    )
}

fn tls_route(name: &str, hostnames: &str, backends: &str) -> String {
    route_of_kind(
        "TLSRoute",
        "default",
        name,
        &format!("  hostnames: {hostnames}\n  rules: [{{backendRefs: {backends}}}]\n"),
    )
}

/// Open a TLS connection with `sni` (trusting `ca`), say `hello`, close
/// the write half, and return everything the other side sent.
async fn exchange(addr: SocketAddr, ca: &TestCa, sni: &str) -> std::io::Result<String> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(sni.to_owned()).expect("a server name");
    let mut tls = ca.connector(&[]).connect(name, tcp).await?;
    tls.write_all(b"hello").await?;
    // Half-close: our write side ends, the answer still comes back.
    tls.shutdown().await?;
    let mut out = String::new();
    tls.read_to_string(&mut out).await?;
    Ok(out)
}

/// The connection with `sni` is refused: closed before a handshake.
async fn refused(addr: SocketAddr, ca: &TestCa, sni: &str) -> bool {
    exchange(addr, ca, sni).await.is_err()
}

async fn metrics(gw: &Gw) -> String {
    let (_, body) = admin_get(gw.admin, "/metrics").await.expect("metrics");
    String::from_utf8_lossy(&body).into_owned()
}

/// Poll `check` until it holds (a reload, a counter), or panic.
async fn until(what: &str, gw: &Gw, check: impl AsyncFnMut() -> bool) {
    poll_until(what, || gw.log(), check).await
}

#[tokio::test]
async fn passthrough_routes_by_sni_and_splits_connections_exactly() {
    let ca = TestCa::new();
    let cert = ca.issue(&["db.example.com", "*.example.org"]);
    let (stable, canary, other) = (
        StreamBackend::start("stable", Some(cert.server_config())).await,
        StreamBackend::start("canary", Some(cert.server_config())).await,
        StreamBackend::start("other", Some(cert.server_config())).await,
    );
    let manifests = format!(
        "{}{}{}{}{}{}",
        tls_gateway("Passthrough", ""),
        static_service("stable", None, 5432, None, stable.addr.port()),
        static_service("canary", None, 5432, None, canary.addr.port()),
        static_service("other", None, 5432, None, other.addr.port()),
        tls_route(
            "db",
            "[db.example.com]",
            "[{name: stable, port: 5432, weight: 3}, {name: canary, port: 5432, weight: 1}]"
        ),
        tls_route("wild", "['*.example.org']", "[{name: other, port: 5432}]"),
    );
    let gw = Gw::start(&manifests, &[]).await;

    let first = exchange(gw.addr(), &ca, "db.example.com")
        .await
        .expect("relayed");
    // The backend terminated TLS: it saw the client's SNI, and the
    // client's bytes came back after the client's half-close.
    assert!(
        first.ends_with("sni=db.example.com\nHELLO\ngot 5 bytes\n"),
        "{first:?}"
    );
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    *tally
        .entry(first.split(' ').next().unwrap_or("").to_owned())
        .or_default() += 1;
    for _ in 1..40 {
        let out = exchange(gw.addr(), &ca, "db.example.com")
            .await
            .expect("relayed");
        *tally
            .entry(out.split(' ').next().unwrap_or("").to_owned())
            .or_default() += 1;
    }
    assert_eq!(
        tally,
        BTreeMap::from([("canary".into(), 10), ("stable".into(), 30)]),
        "3:1 per connection, exactly"
    );
    let wild = exchange(gw.addr(), &ca, "a.example.org")
        .await
        .expect("relayed");
    assert!(wild.starts_with("other sni=a.example.org"), "{wild:?}");
    // No route for the name, and no SNI at all: refused, nothing reaches
    // a backend.
    let before = stable.connections() + canary.connections() + other.connections();
    assert!(refused(gw.addr(), &ca, "nope.example.net").await);
    // rustls sends no SNI for an IP address.
    let ip = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let tcp = TcpStream::connect(gw.addr()).await.expect("connect");
    let no_sni = ca.connector(&[]).connect(ip, tcp).await.is_err();
    assert!(no_sni, "a ClientHello without SNI is refused");
    assert_eq!(
        stable.connections() + canary.connections() + other.connections(),
        before
    );
    let m = metrics(&gw).await;
    for line in [
        r#"sluice_tls_connections_total{route="TLSRoute default/db",backend="default/stable:5432",outcome="forwarded"} 30"#,
        r#"sluice_tls_connections_total{route="TLSRoute default/db",backend="default/canary:5432",outcome="forwarded"} 10"#,
        r#"sluice_tls_connections_total{route="",backend="",outcome="no_route"} 2"#,
    ] {
        assert!(m.contains(line), "{line} not in\n{m}");
    }
}

#[tokio::test]
async fn a_missing_backend_keeps_its_share_of_connections_refused() {
    let ca = TestCa::new();
    let cert = ca.issue(&["db.example.com"]);
    let up = StreamBackend::start("up", Some(cert.server_config())).await;
    let manifests = format!(
        "{}{}{}",
        tls_gateway("Passthrough", ""),
        static_service("up", None, 5432, None, up.addr.port()),
        tls_route(
            "db",
            "[db.example.com]",
            "[{name: up, port: 5432}, {name: missing, port: 5432}]"
        ),
    );
    let gw = Gw::start(&manifests, &[]).await;
    let mut served = 0;
    for _ in 0..20 {
        if exchange(gw.addr(), &ca, "db.example.com").await.is_ok() {
            served += 1;
        }
    }
    assert_eq!(
        served, 10,
        "half the connections, exactly, go to the missing backend"
    );
    assert_eq!(up.connections(), 10);
    until("the refusals counted", &gw, async || {
        metrics(&gw).await.contains(
            r#"sluice_tls_connections_total{route="TLSRoute default/db",backend="default/missing:5432",outcome="rejected"} 10"#,
        )
    })
    .await;
}

#[tokio::test]
async fn an_endpoint_that_cannot_be_reached_closes_the_connection() {
    let ca = TestCa::new();
    let dead_port = crate::support::free_port(); // nothing listens here
    let manifests = format!(
        "{}{}{}",
        tls_gateway("Passthrough", ""),
        static_service("down", None, 5432, None, dead_port),
        tls_route("db", "[db.example.com]", "[{name: down, port: 5432}]"),
    );
    let gw = Gw::start(&manifests, &[]).await;
    assert!(refused(gw.addr(), &ca, "db.example.com").await);
    until("the connection counted unreachable", &gw, async || {
        metrics(&gw).await.contains(
            r#"sluice_tls_connections_total{route="TLSRoute default/db",backend="default/down:5432",outcome="unreachable"} 1"#,
        )
    })
    .await;
}

/// The bytes of a TLS 1.2-style ClientHello record with `sni`.
fn client_hello(sni: &str) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend([0u8; 32]);
    body.push(0);
    body.extend([0, 2, 0x13, 0x01, 1, 0]);
    let mut entry = vec![0u8];
    entry.extend((sni.len() as u16).to_be_bytes());
    entry.extend(sni.as_bytes());
    let mut ext = vec![0, 0];
    ext.extend(((entry.len() + 2) as u16).to_be_bytes());
    ext.extend((entry.len() as u16).to_be_bytes());
    ext.extend(entry);
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);
    let mut msg = vec![1u8];
    msg.extend(&(body.len() as u32).to_be_bytes()[1..]);
    msg.extend(body);
    let mut record = vec![22u8, 3, 1];
    record.extend((msg.len() as u16).to_be_bytes());
    record.extend(msg);
    record
}

/// A passthrough listener routing `raw.example.com` to `backend`.
fn raw_passthrough(backend: &StreamBackend) -> String {
    format!(
        "{}{}{}",
        tls_gateway("Passthrough", ""),
        static_service("raw", None, 9000, None, backend.addr.port()),
        tls_route("raw", "[raw.example.com]", "[{name: raw, port: 9000}]"),
    )
}

/// The gateway closes `s` (an end of stream or a reset), within a bound
/// that only stops a hang.
async fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await;
    matches!(read, Ok(Ok(0)) | Ok(Err(_)))
}

#[tokio::test]
async fn bytes_travel_both_ways_and_half_closes_are_passed_on() {
    // A cleartext backend behind a passthrough listener sees the client's
    // bytes as they are: the ClientHello first, then the rest.
    let backend = StreamBackend::start("raw", None).await;
    let manifests = raw_passthrough(&backend);
    let gw = Gw::start(&manifests, &[]).await;
    let hello = client_hello("raw.example.com");
    let mut s = TcpStream::connect(gw.addr()).await.expect("connect");
    s.write_all(&hello).await.expect("hello");
    let mut greeting = vec![0u8; "raw sni=-\n".len()];
    s.read_exact(&mut greeting)
        .await
        .expect("the backend's greeting");
    assert_eq!(greeting, b"raw sni=-\n");
    s.write_all(b"abc").await.expect("more bytes");
    s.shutdown().await.expect("half-close");
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)
        .await
        .expect("the rest, until the backend closes");
    let rest = String::from_utf8_lossy(&rest);
    // The backend upper-cased the hello and the bytes, saw our end (the
    // half-close passed on), and answered after it.
    assert!(
        rest.ends_with(&format!("ABC\ngot {} bytes\n", hello.len() + 3)),
        "{rest:?}"
    );
}

#[tokio::test]
async fn clients_without_a_timely_or_sane_client_hello_are_cut() {
    let backend = StreamBackend::start("raw", None).await;
    let manifests = raw_passthrough(&backend);
    let gw = Gw::start(
        &manifests,
        &[
            "--client-hello-timeout",
            "1s",
            "--max-client-hello-bytes",
            "1024",
        ],
    )
    .await;
    // Silent: closed once the ClientHello timeout passes.
    let mut silent = TcpStream::connect(gw.addr()).await.expect("connect");
    assert!(closed(&mut silent).await, "a silent client is cut");
    // A ClientHello announcing more than the limit: closed at once.
    let mut big = TcpStream::connect(gw.addr()).await.expect("connect");
    big.write_all(&[22, 3, 1, 0x10, 0x00, 1, 0, 0x0f, 0xfc])
        .await
        .expect("header");
    assert!(
        closed(&mut big).await,
        "an oversized ClientHello is refused"
    );
    // Not TLS at all.
    let mut plain = TcpStream::connect(gw.addr()).await.expect("connect");
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    assert!(
        closed(&mut plain).await,
        "bytes that are not TLS are refused"
    );
    assert_eq!(backend.connections(), 0);
    until("the refusals are counted", &gw, async || {
        let m = metrics(&gw).await;
        m.contains(r#"outcome="client_hello_timeout"} 1"#)
            && m.contains(r#"outcome="bad_client_hello"} 2"#)
    })
    .await;
}

#[tokio::test]
async fn terminate_mode_relays_the_decrypted_bytes() {
    let ca = TestCa::new();
    let listener_cert = ca.issue(&["tls.example.com"]);
    let backend = StreamBackend::start("plain", None).await;
    let manifests = format!(
        "{}{}{}{}",
        tls_gateway("Terminate", ", certificateRefs: [{name: listener-cert}]"),
        tls_secret("default", "listener-cert", &listener_cert),
        static_service("plain", None, 3000, None, backend.addr.port()),
        tls_route("plain", "[tls.example.com]", "[{name: plain, port: 3000}]"),
    );
    let gw = Gw::start(&manifests, &[]).await;
    let mut out = String::new();
    until(
        "the listener's certificate is served",
        &gw,
        async || match exchange(gw.addr(), &ca, "tls.example.com").await {
            Ok(o) => {
                out = o;
                true
            }
            Err(_) => false,
        },
    )
    .await;
    // The backend got cleartext (no SNI of its own) and the bytes after
    // the handshake only.
    assert_eq!(out, "plain sni=-\nHELLO\ngot 5 bytes\n");
    assert!(refused(gw.addr(), &ca, "other.example.com").await);
}
