//! The edge under stress, as raw bytes on sockets against the real binary:
//! slow and idle clients, oversized heads, connection limits, HTTP/2
//! abuse (stream limits, rapid reset, PING/SETTINGS floods, header list
//! size), slow readers (memory stays bounded), attacks next to well-behaved
//! clients. The limits are set with `sluice serve` flags
//! (docs/hardening.md lists each one and its default).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::support::*;

// ---------------------------------------------------------------------------
// Harness: the binary with extra flags, raw backends, raw HTTP/2 frames.
// ---------------------------------------------------------------------------

/// A `sluice serve` process started with extra flags. Manifests may use
/// `{{PORT}}` and `{{PORT2}}` for two listener ports.
pub struct Gw {
    child: Child,
    dir: tempfile::TempDir,
    pub port: u16,
    pub port2: u16,
    pub admin: SocketAddr,
}

impl Gw {
    pub async fn start(manifests: &str, flags: &[&str]) -> Gw {
        let dir = tempfile::tempdir().expect("temp dir");
        let (port, port2) = (free_port(), free_port());
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = log_file(dir.path().join("sluice.log.txt"));
        let gw = Gw {
            child: Command::new(env!("CARGO_BIN_EXE_sluice"))
                .arg("serve")
                .arg("-f")
                .arg(dir.path())
                .args(["--bind", "127.0.0.1", "--admin", &admin.to_string()])
                .args(flags)
                .env("RUST_LOG", "info,sluice::proxy=debug")
                // tracing writes to stdout; panics to stderr.
                .stdout(log.try_clone().expect("log file handle"))
                .stderr(log)
                .spawn()
                .expect("the sluice binary starts"),
            dir,
            port,
            port2,
            admin,
        };
        gw.write("all.yaml", manifests);
        gw.wait_ready().await;
        gw
    }

    pub fn write(&self, name: &str, content: &str) {
        let content = content
            .replace("{{PORT2}}", &self.port2.to_string())
            .replace("{{PORT}}", &self.port.to_string());
        let tmp = self.dir.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(tmp, self.dir.path().join(name)).unwrap();
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(
            admin_get(self.admin, "/readyz").await,
            Ok((http::StatusCode::OK, _))
        ) {
            assert!(Instant::now() < deadline, "not ready; log:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Wait for the listener too (it binds with the first table).
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(self.addr()).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "listener never bound; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn addr2(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port2))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sluice.log.txt")).unwrap_or_default()
    }

    /// Resident memory of the gateway process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }

    /// Wait (bounded) for the process to exit on its own.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("child status") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("gateway log:\n{}", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn log_file(path: PathBuf) -> std::fs::File {
    std::fs::File::create(path).expect("log file")
}

/// Gateway `gw` with listeners on `{{PORT}}` and `{{PORT2}}`, and a route
/// for every host to `service`.
fn gateway_two_ports(service: &str) -> String {
    format!(
        r#"{GATEWAY_HEAD}  listeners:
  - name: one
    protocol: HTTP
    port: {{{{PORT}}}}
  - name: two
    protocol: HTTP
    port: {{{{PORT2}}}}
{route}"#,
        route = route(
            "default",
            "all",
            &format!("  rules:\n  - backendRefs: [{{name: {service}, port: 8080}}]"),
        )
    )
}

/// A route for every host to `service`, on the default one-port gateway.
fn simple(service: &str) -> String {
    gateway()
        + &route(
            "default",
            "all",
            &format!("  rules:\n  - backendRefs: [{{name: {service}, port: 8080}}]"),
        )
}

/// Service `name` (port 8080) with one endpoint per port on loopback.
fn service(name: &str, ports: &[u16]) -> String {
    let mut out = format!(
        "\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  ports:\n  - port: 8080\n"
    );
    for (i, port) in ports.iter().enumerate() {
        out.push_str(&format!(
            "\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-{i}\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\naddressType: IPv4\nports:\n- port: {port}\nendpoints:\n- addresses: [\"127.0.0.1\"]\n"
        ));
    }
    out
}

/// A backend written as raw bytes: `handle` gets every accepted connection.
pub struct RawBackend {
    pub port: u16,
    /// Request heads received (counted when a whole head has arrived).
    pub heads: Arc<AtomicUsize>,
}

impl RawBackend {
    pub async fn start<F, Fut>(handle: F) -> RawBackend
    where
        F: Fn(TcpStream, String) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(AtomicUsize::new(0));
        let counted = heads.clone();
        let handle = Arc::new(handle);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let handle = handle.clone();
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Some(head) = read_head(&mut stream).await else {
                        return;
                    };
                    counted.fetch_add(1, Ordering::SeqCst);
                    handle(stream, head).await;
                });
            }
        });
        RawBackend { port, heads }
    }

    /// Wait (bounded) until `n` request heads have arrived.
    pub async fn wait_heads(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.heads.load(Ordering::SeqCst) < n {
            assert!(
                Instant::now() < deadline,
                "the backend never got {n} requests"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A gateway (`flags` on its command line) in front of one echo pod,
/// `app-0`, for every request.
async fn app_behind(flags: &[&str]) -> (Gw, Pods) {
    let app = Pods::start("default", "app", 1).await;
    let gw = Gw::start(&(simple("app") + &app.manifests()), flags).await;
    (gw, app)
}

/// Read up to the end of a request or response head.
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// A backend that answers `200 held` only once the test releases it.
fn held_backend(
    release: watch::Receiver<bool>,
) -> impl Fn(TcpStream, String) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync + 'static
{
    move |mut stream, _head| {
        let mut release = release.clone();
        Box::pin(async move {
            let _ = release.wait_for(|r| *r).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nheld")
                .await;
            let _ = stream.shutdown().await;
        })
    }
}

/// Everything the peer sends until it closes the connection (or resets
/// it), or `None` when it is still open after `within`.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(out),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Send raw bytes on a fresh connection and read the answer until the
/// gateway closes the connection (bounded).
async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    let out = read_until_closed(&mut s, Duration::from_secs(15))
        .await
        .expect("the gateway closes the connection");
    String::from_utf8_lossy(&out).into_owned()
}

/// A few requests on a fresh keep-alive connection; all must be 200.
async fn others_are_served(addr: SocketAddr, n: usize) {
    let mut c = Conn::open(addr).await;
    for i in 0..n {
        let r = c.get("h", &format!("/other/{i}")).await;
        assert_eq!(
            r.status, 200,
            "a well-behaved client's request {i} failed: {r:?}"
        );
    }
}

mod h2raw {
    //! Just enough HTTP/2 to misbehave: frames and HPACK literals, written
    //! by hand so that nothing on the client side can refuse to send them.

    use super::*;

    pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const CONTINUATION: u8 = 0x9;
    pub const END_STREAM: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const ACK: u8 = 0x1;

    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1).
    fn int(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
        let max = (1usize << n) - 1;
        if value < max {
            out.push(first | value as u8);
            return;
        }
        out.push(first | max as u8);
        value -= max;
        while value >= 128 {
            out.push((value % 128 + 128) as u8);
            value /= 128;
        }
        out.push(value as u8);
    }

    fn string(out: &mut Vec<u8>, s: &[u8]) {
        int(out, 0, 7, s.len());
        out.extend_from_slice(s);
    }

    /// A GET header block: `:method GET`, `:scheme http`, `:path`,
    /// `:authority`, then `extra` as literals without indexing.
    pub fn get(path: &str, authority: &str, extra: &[(&str, &str)]) -> Vec<u8> {
        block(0x82, path, authority, extra)
    }

    /// A POST header block, as [`get`]'s.
    pub fn post(path: &str, authority: &str, extra: &[(&str, &str)]) -> Vec<u8> {
        block(0x83, path, authority, extra)
    }

    /// `method` (the HPACK static table's indexed `:method`), `:scheme
    /// http`, `:path`, `:authority`, then `extra`.
    fn block(method: u8, path: &str, authority: &str, extra: &[(&str, &str)]) -> Vec<u8> {
        let mut b = vec![method, 0x86];
        int(&mut b, 0, 4, 4); // :path, literal without indexing
        string(&mut b, path.as_bytes());
        int(&mut b, 0, 4, 1); // :authority
        string(&mut b, authority.as_bytes());
        for (name, value) in extra {
            b.push(0);
            string(&mut b, name.as_bytes());
            string(&mut b, value.as_bytes());
        }
        b
    }

    #[derive(Debug, Clone)]
    pub struct Frame {
        pub kind: u8,
        pub flags: u8,
        pub stream: u32,
        pub payload: Vec<u8>,
    }

    /// A raw HTTP/2 connection: the preface and an empty SETTINGS are sent;
    /// frames from the server arrive on `frames` (the channel closes when
    /// the server closes the connection).
    pub struct Client {
        pub write: tokio::net::tcp::OwnedWriteHalf,
        pub frames: mpsc::UnboundedReceiver<Frame>,
    }

    impl Client {
        pub async fn connect(addr: SocketAddr) -> Client {
            let stream = TcpStream::connect(addr).await.unwrap();
            let (mut read, mut write) = stream.into_split();
            let mut hello = PREFACE.to_vec();
            hello.extend(frame(SETTINGS, 0, 0, &[]));
            write.write_all(&hello).await.unwrap();
            let (tx, frames) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                let mut head = [0u8; 9];
                loop {
                    if read.read_exact(&mut head).await.is_err() {
                        return;
                    }
                    let len = usize::from(head[0]) << 16
                        | usize::from(head[1]) << 8
                        | usize::from(head[2]);
                    let mut payload = vec![0; len];
                    if read.read_exact(&mut payload).await.is_err() {
                        return;
                    }
                    let stream =
                        u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                    let f = Frame {
                        kind: head[3],
                        flags: head[4],
                        stream,
                        payload,
                    };
                    if tx.send(f).is_err() {
                        return;
                    }
                }
            });
            Client { write, frames }
        }

        /// The server's SETTINGS (acknowledged).
        pub async fn settings(&mut self) -> Vec<(u16, u32)> {
            loop {
                let f = self.next().await.expect("server SETTINGS");
                if f.kind == SETTINGS && f.flags & ACK == 0 {
                    self.send(&frame(SETTINGS, ACK, 0, &[])).await;
                    return f
                        .payload
                        .chunks_exact(6)
                        .map(|c| {
                            (
                                u16::from_be_bytes([c[0], c[1]]),
                                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                            )
                        })
                        .collect();
                }
            }
        }

        pub async fn send(&mut self, bytes: &[u8]) {
            let _ = self.write.write_all(bytes).await;
        }

        /// The next frame, or `None` when the connection closed (or nothing
        /// came for 15 s).
        pub async fn next(&mut self) -> Option<Frame> {
            tokio::time::timeout(Duration::from_secs(15), self.frames.recv())
                .await
                .ok()
                .flatten()
        }

        /// Read frames until the server sends GOAWAY or closes; `true` if
        /// it did either within 15 s.
        pub async fn ends(&mut self) -> bool {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
            loop {
                match tokio::time::timeout_at(deadline, self.frames.recv()).await {
                    Err(_) => return false,
                    Ok(None) => return true,
                    Ok(Some(f)) if f.kind == GOAWAY => return true,
                    Ok(Some(_)) => {}
                }
            }
        }
    }
}

use h2raw::*;

// ---------------------------------------------------------------------------
// Slow and idle clients.
// ---------------------------------------------------------------------------

/// Send a request head one byte at a time, `every` apart, until the
/// gateway closes the connection; returns the bytes sent and whether the
/// gateway closed it (within 20 s).
async fn slowloris(addr: SocketAddr, every: Duration) -> (usize, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = b"GET /slow HTTP/1.1\r\nHost: h\r\nX-Padding: ".to_vec();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    let mut byte = [0u8; 1];
    while Instant::now() < deadline {
        let b = head.get(sent).copied().unwrap_or(b'a');
        if s.write_all(&[b]).await.is_err() {
            return (sent, true);
        }
        sent += 1;
        // A read that returns means the gateway closed (or answered).
        if let Ok(r) = tokio::time::timeout(every, s.read(&mut byte)).await {
            return (sent, matches!(r, Ok(0) | Err(_)));
        }
    }
    (sent, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_its_head_slowly_is_closed_and_others_are_served() {
    let (gw, app) = app_behind(&["--request-header-timeout", "1s"]).await;
    let addr = gw.addr();
    let attackers: Vec<_> = (0..10)
        .map(|_| tokio::spawn(slowloris(addr, Duration::from_millis(100))))
        .collect();
    others_are_served(addr, 30).await;
    for a in attackers {
        let (sent, closed) = a.await.unwrap();
        assert!(
            closed,
            "a slowloris client is still connected after {sent} bytes"
        );
        assert!(sent > 3, "closed before the timeout could have passed");
    }
    assert_eq!(app.requests(), 30, "no slow request reached the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_but_not_while_a_request_is_in_flight() {
    let (release, released) = watch::channel(false);
    let held = RawBackend::start(held_backend(released)).await;
    let app = Pods::start("default", "app", 1).await;
    let routes = route(
        "default",
        "r",
        "  rules:\n  - matches: [{path: {type: PathPrefix, value: /held}}]\n    backendRefs: [{name: held, port: 8080}]\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let manifests = gateway() + &routes + &app.manifests() + &service("held", &[held.port]);
    let gw = Gw::start(&manifests, &["--idle-timeout", "1s"]).await;

    // HTTP/1.1: after its response, an idle keep-alive connection is closed.
    let mut idle = TcpStream::connect(gw.addr()).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut idle, Duration::from_secs(15))
        .await
        .expect("the idle connection is closed");
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));

    // HTTP/2: an idle connection gets GOAWAY.
    let mut h2 = Client::connect(gw.addr()).await;
    h2.settings().await;
    assert!(h2.ends().await, "an idle HTTP/2 connection was kept open");

    // A request that outlasts the idle timeout keeps its connection.
    let mut busy = TcpStream::connect(gw.addr()).await.unwrap();
    busy.write_all(b"GET /held HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    held.wait_heads(1).await;
    // Longer than the idle timeout, so that it would have fired.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    release.send_replace(true);
    let answer = read_until_closed(&mut busy, Duration::from_secs(15))
        .await
        .expect("closed once idle after the response");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("held"), "{answer}");
}

/// Send `request` (a head and part of its body) on a fresh connection,
/// then nothing: what the gateway answers before it closes the connection.
async fn answer_to_a_stalled_body(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let answer = read_until_closed(&mut s, Duration::from_secs(15))
        .await
        .expect("the stalled connection is closed");
    String::from_utf8_lossy(&answer).into_owned()
}

/// A client that stops sending its request body gets 408 and its
/// connection closed once the body timeout passes; the backend's try ends
/// there too, without a whole request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stalling_in_its_body_gets_408_and_is_closed() {
    let (gw, app) = app_behind(&["--request-body-timeout", "1s"]).await;
    let length = b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc";
    let answer = answer_to_a_stalled_body(gw.addr(), length).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    // Chunked, stalled between chunks.
    let chunked =
        b"POST /upload HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n";
    let answer = answer_to_a_stalled_body(gw.addr(), chunked).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    others_are_served(gw.addr(), 5).await;
    let uploads = app.servers[0]
        .recent()
        .into_iter()
        .filter(|r| r.path == "/upload");
    assert_eq!(
        uploads.count(),
        0,
        "no stalled upload reached the backend whole"
    );
}

/// HTTP/2: a stream whose client sends its HEADERS without END_STREAM
/// and then nothing gets 408 on that stream once the body timeout passes
/// (a response, not a reset); the connection's other streams are served
/// meanwhile and after, and the backend never gets the whole request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_a_stream_stalling_in_its_body_gets_408_and_the_others_go_on() {
    let (gw, app) = app_behind(&["--request-body-timeout", "1s"]).await;
    let mut h2 = Client::connect(gw.addr()).await;
    h2.settings().await;
    let upload = post("/upload", "h", &[("content-length", "10")]);
    h2.send(&frame(HEADERS, END_HEADERS, 1, &upload)).await;
    h2.send(&frame(DATA, 0, 1, b"abc")).await;
    let during = get("/during", "h", &[]);
    h2.send(&frame(HEADERS, END_STREAM | END_HEADERS, 3, &during))
        .await;
    let mut answers = std::collections::HashMap::new();
    while answers.len() < 2 {
        let f = h2.next().await.expect("answers for streams 1 and 3");
        if f.kind == HEADERS || f.kind == RST_STREAM {
            answers.entry(f.stream).or_insert(f);
        }
    }
    let stalled = &answers[&1];
    assert_eq!(
        stalled.kind, HEADERS,
        "a response, not a reset: {stalled:?}"
    );
    assert!(h2_status(&stalled.payload, "408"), "{stalled:?}");
    let other = &answers[&3];
    assert!(h2_status(&other.payload, "200"), "{other:?}");

    // The connection goes on.
    let after = get("/after", "h", &[]);
    h2.send(&frame(HEADERS, END_STREAM | END_HEADERS, 5, &after))
        .await;
    let answer = loop {
        let f = h2.next().await.expect("an answer for stream 5");
        if f.stream == 5 && (f.kind == HEADERS || f.kind == RST_STREAM) {
            break f;
        }
    };
    assert!(h2_status(&answer.payload, "200"), "{answer:?}");
    let seen: Vec<String> = app.servers[0]
        .recent()
        .into_iter()
        .map(|r| r.path)
        .collect();
    assert_eq!(
        seen,
        ["/during", "/after"],
        "the stalled upload never completed"
    );
}

/// The request-head timeout runs from a kept-alive connection's next
/// request's first byte: waiting for that request is the keep-alive
/// timeout's business, and a connection quiet for longer than the head
/// timeout is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_waits_longer_than_the_head_timeout() {
    let (gw, app) = app_behind(&[
        "--request-header-timeout",
        "1s",
        "--keepalive-timeout",
        "30s",
    ])
    .await;
    let mut send = served_conn(gw.addr()).await;
    // Longer than the head timeout, so that it would have fired.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(get_root(&mut send).await, Some(200));

    // With a short keep-alive timeout the quiet connection is closed.
    let gw = Gw::start(
        &(simple("app") + &app.manifests()),
        &["--keepalive-timeout", "1s"],
    )
    .await;
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut s, Duration::from_secs(15))
        .await
        .expect("closed after the keep-alive timeout");
    assert!(answer.starts_with(b"HTTP/1.1 200"));
}

/// One response on `stream`: its head, and its body by Content-Length.
async fn read_response(stream: &mut TcpStream) -> (String, String) {
    let head = read_head(stream).await.expect("a response head");
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().unwrap())
        })
        .expect("a Content-Length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    (head, String::from_utf8_lossy(&body).into_owned())
}

/// Between requests a connection holds no buffer, and reads the next
/// head's first bytes into a small room on the stack (issue 13): pipelined
/// requests are still answered in order, and a head larger than that
/// room, sent in pieces after the connection went idle, is read whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_and_a_large_head_after_idle_are_served_in_order() {
    let (gw, _app) = app_behind(&[]).await;
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    s.write_all(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\nGET /second HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    for path in ["/first", "/second"] {
        let (head, body) = read_response(&mut s).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
        assert!(body.contains(&format!("\"{path}\"")), "{path}: {body}");
    }
    // Idle now: the next head comes in two pieces, 3 KiB in all.
    let pad = "a".repeat(3000);
    let head = format!("GET /third HTTP/1.1\r\nHost: h\r\nX-Pad: {pad}\r\n\r\n");
    let (one, two) = head.as_bytes().split_at(1500);
    s.write_all(one).await.unwrap();
    s.flush().await.unwrap();
    s.write_all(two).await.unwrap();
    let (head, body) = read_response(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("\"/third\""), "{body}");
    assert!(
        body.contains(&pad),
        "the padding header reached the backend"
    );
}

/// A TCP connection to `addr` from the loopback address `from`.
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((from, 0)))
        .expect("any 127/8 address is local on Linux");
    socket.connect(addr).await.unwrap()
}

/// Whether a request on `s` is answered 200.
async fn served_on(mut s: TcpStream) -> bool {
    s.write_all(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    read_until_closed(&mut s, Duration::from_secs(15))
        .await
        .is_some_and(|a| a.starts_with(b"HTTP/1.1 200"))
}

/// `--max-connections-per-client`: one address's connections beyond the
/// limit are closed on accept, other addresses keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_client_address_are_limited() {
    let (gw, _app) = app_behind(&["--max-connections-per-client", "2"]).await;
    let client = [127, 0, 0, 2];
    let mut held = Vec::new();
    for _ in 0..2 {
        // An open connection is counted once accepted: a served request
        // on it says it was.
        let mut s = connect_from(client, gw.addr()).await;
        s.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            .await
            .unwrap();
        assert!(
            read_head(&mut s)
                .await
                .is_some_and(|h| h.starts_with("HTTP/1.1 200"))
        );
        held.push(s);
    }
    assert!(
        !served_on(connect_from(client, gw.addr()).await).await,
        "a third connection from the same address was served"
    );
    assert!(
        served_on(connect_from([127, 0, 0, 3], gw.addr()).await).await,
        "another address has its own count"
    );
    drop(held.pop());
    poll_until(
        "a closed connection frees its place",
        || gw.log(),
        async || served_on(connect_from(client, gw.addr()).await).await,
    )
    .await;
}

// ---------------------------------------------------------------------------
// Sizes.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_get_431_long_targets_414_and_underscores_400() {
    let (gw, app) = app_behind(&[
        "--max-request-header-bytes",
        "16384",
        "--max-uri-bytes",
        "1024",
    ])
    .await;
    let addr = gw.addr();
    let big = "a".repeat(20_000);
    let answer = raw(
        addr,
        format!("GET / HTTP/1.1\r\nHost: h\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    let many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    let answer = raw(
        addr,
        format!("GET / HTTP/1.1\r\nHost: h\r\n{many}\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    let long = "b".repeat(2000);
    let answer = raw(
        addr,
        format!("GET /{long} HTTP/1.1\r\nHost: h\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 414"), "{answer}");

    // Underscores: a backend that reads X_Canary as X-Canary would get a
    // header the gateway never checked.
    let answer = raw(addr, b"GET / HTTP/1.1\r\nHost: h\r\nX_Canary: 1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    // Just under the limits: served.
    let fine = "c".repeat(10_000);
    let mut c = Conn::open(addr).await;
    let r = c
        .get_with("h", &format!("/{}", "d".repeat(1000)), &[("x-fine", &fine)])
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        app.requests(),
        1,
        "only the request within the limits reached the backend"
    );

    // HTTP/2: a header list over the limit gets 431 (or the stream refused),
    // never the backend.
    let mut h2 = Client::connect(addr).await;
    h2.settings().await;
    let block = get("/", "h", &[("x-big", &big)]);
    let (first, rest) = block.split_at(8000);
    h2.send(&frame(HEADERS, END_STREAM, 1, first)).await;
    h2.send(&frame(CONTINUATION, END_HEADERS, 1, rest)).await;
    let mut refused = false;
    while let Some(f) = h2.next().await {
        if f.stream == 1 && (f.kind == HEADERS || f.kind == RST_STREAM) || f.kind == GOAWAY {
            refused = true;
            break;
        }
    }
    assert!(refused, "the oversized HTTP/2 request was not refused");
    assert_eq!(app.requests(), 1);
}

// ---------------------------------------------------------------------------
// Connection limits.
// ---------------------------------------------------------------------------

/// Is a fresh connection refused (closed before any answer)?
async fn refused(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return true;
    };
    let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").await;
    match read_until_closed(&mut s, Duration::from_secs(15)).await {
        Some(answer) => answer.is_empty(),
        None => false,
    }
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// `GET /` on a keep-alive connection: the status, or `None` when the
/// connection is gone.
async fn get_root(send: &mut Sender) -> Option<u16> {
    use http_body_util::BodyExt;
    send.ready().await.ok()?;
    let req = http::Request::get("/")
        .header("host", "h")
        .body(Default::default())
        .unwrap();
    let resp = send.send_request(req).await.ok()?;
    let status = resp.status().as_u16();
    resp.into_body().collect().await.ok()?;
    Some(status)
}

/// A keep-alive connection that has been served once (retried until one is).
async fn served_conn(addr: SocketAddr) -> Sender {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        if get_root(&mut send).await == Some(200) {
            return send;
        }
        assert!(Instant::now() < deadline, "no connection was served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limits_are_closed_and_open_ones_keep_working() {
    let app = Pods::start("default", "app", 1).await;
    let gw = Gw::start(
        &(gateway_two_ports("app") + &app.manifests()),
        &[
            "--max-connections-per-listener",
            "2",
            "--max-connections",
            "3",
        ],
    )
    .await;
    let (a, b) = (gw.addr(), gw.addr2());
    // (The readiness probe's connection may still hold a place for a moment.)
    let mut a1 = served_conn(a).await;
    let mut a2 = served_conn(a).await;
    // Listener one is full; listener two still has room in the total.
    assert!(
        refused(a).await,
        "a third connection on a full listener was served"
    );
    let mut b1 = served_conn(b).await;
    // Now the process is full.
    assert!(refused(b).await, "a connection beyond the total was served");
    // The open connections are unaffected.
    for c in [&mut a1, &mut a2, &mut b1] {
        assert_eq!(get_root(c).await, Some(200));
    }
    // A closed connection frees its place.
    drop(a1);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut s = TcpStream::connect(b).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = read_until_closed(&mut s, Duration::from_secs(15))
            .await
            .unwrap_or_default();
        if answer.starts_with(b"HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the freed place was never reused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------
// HTTP/2 abuse.
// ---------------------------------------------------------------------------

/// Whether an HTTP/2 response header block is `:status` `code` (hyper
/// sends the statuses HPACK's static table has as an index, others as a
/// literal, Huffman-coded or not).
fn h2_status(block: &[u8], code: &str) -> bool {
    let indexed = match code {
        "200" => 0x88,
        "400" => 0x8c,
        _ => 0,
    };
    let huffman = huffman_digits(code);
    block.first() == Some(&indexed)
        || block.windows(3).any(|w| w == code.as_bytes())
        || block.windows(huffman.len()).any(|w| w == huffman)
}

/// `digits` Huffman-coded as HPACK codes them (RFC 7541 Appendix B: '0'
/// to '2' are 5-bit codes 0-2, '3' to '9' 6-bit codes 0x19-0x1f), padded
/// with ones.
fn huffman_digits(digits: &str) -> Vec<u8> {
    let (mut bits, mut n) = (0u64, 0u32);
    for d in digits.bytes().map(|c| u64::from(c - b'0')) {
        let (code, len) = if d < 3 { (d, 5) } else { (0x16 + d, 6) };
        bits = bits << len | code;
        n += len;
    }
    let pad = (8 - n % 8) % 8;
    bits = bits << pad | ((1 << pad) - 1);
    let bytes = (n + pad) / 8;
    (0..bytes).rev().map(|i| (bits >> (8 * i)) as u8).collect()
}

/// HTTP/2's `:authority`, and a Host field next to it, are `host[:port]`
/// as HTTP/1.1's Host is: anything else is refused on its stream (400, or
/// a reset where hyper cannot parse it) and never reaches a backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_authorities_that_are_not_host_and_port_are_refused() {
    let (gw, app) = app_behind(&[]).await;
    // (:authority, more header fields, the status wanted)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case<'_>] = &[
        ("a b", &[], "400"),
        ("a/b", &[], "400"),
        ("user@a", &[], "400"),
        ("a:xyz", &[], "400"),
        ("h", &[("host", "user@h")], "400"),
        ("h", &[("host", "h:8080")], "200"),
        ("h:80", &[], "200"),
    ];
    let mut problems = Vec::new();
    for (authority, extra, want) in cases {
        let mut c = Client::connect(gw.addr()).await;
        c.settings().await;
        c.send(&frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            1,
            &get("/", authority, extra),
        ))
        .await;
        let answer = loop {
            match c.next().await {
                Some(f) if f.stream == 1 && (f.kind == HEADERS || f.kind == RST_STREAM) => {
                    break Some(f);
                }
                Some(_) => {}
                None => break None,
            }
        };
        let ok = match &answer {
            Some(f) if f.kind == HEADERS => h2_status(&f.payload, want),
            // A reset or a closed connection is a refusal too.
            _ => *want == "400",
        };
        if !ok {
            problems.push(format!(
                "{authority:?} {extra:?}: want {want}, got {answer:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(
        app.requests(),
        2,
        "only the well-formed ones reached the backend"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_beyond_the_limit_are_refused() {
    let (release, released) = watch::channel(false);
    let held = RawBackend::start(held_backend(released)).await;
    let gw = Gw::start(
        &(simple("held") + &service("held", &[held.port])),
        &["--http2-max-concurrent-streams", "2"],
    )
    .await;
    let mut h2 = Client::connect(gw.addr()).await;
    let settings = h2.settings().await;
    assert!(
        settings.contains(&(0x3, 2)),
        "MAX_CONCURRENT_STREAMS advertised: {settings:?}"
    );
    for stream in [1, 3, 5] {
        h2.send(&frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            stream,
            &get("/", "h", &[]),
        ))
        .await;
    }
    // The third stream is refused (REFUSED_STREAM = 7) ...
    loop {
        let f = h2.next().await.expect("an answer for stream 5");
        if f.stream == 5 {
            assert_eq!(f.kind, RST_STREAM, "{f:?}");
            assert_eq!(f.payload, 7u32.to_be_bytes(), "REFUSED_STREAM");
            break;
        }
    }
    // ... and the two within the limit are served.
    held.wait_heads(2).await;
    release.send_replace(true);
    let mut answered = Vec::new();
    while answered.len() < 2 {
        let f = h2.next().await.expect("answers for streams 1 and 3");
        if f.kind == HEADERS && !answered.contains(&f.stream) {
            answered.push(f.stream);
        }
    }
    answered.sort();
    assert_eq!(answered, [1, 3]);
    assert_eq!(held.heads.load(Ordering::SeqCst), 2);
}

/// Open and reset `n` streams as fast as possible.
async fn rapid_reset(addr: SocketAddr, n: u32) -> bool {
    let mut h2 = Client::connect(addr).await;
    h2.settings().await;
    let mut burst = Vec::new();
    for i in 0..n {
        let stream = 2 * i + 1;
        burst.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            stream,
            &get("/", "h", &[]),
        ));
        burst.extend(frame(RST_STREAM, 0, stream, &8u32.to_be_bytes()));
        if burst.len() > 64 * 1024 {
            h2.send(&burst).await;
            burst.clear();
        }
    }
    h2.send(&burst).await;
    h2.ends().await
}

/// Send `n` copies of `f` without reading the answers.
async fn flood(addr: SocketAddr, f: Vec<u8>, n: usize) -> bool {
    let mut h2 = Client::connect(addr).await;
    let all: Vec<u8> = f.iter().copied().cycle().take(f.len() * n).collect();
    h2.send(&all).await;
    h2.ends().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_rapid_reset_and_ping_and_settings_floods_end_the_connection() {
    let (gw, _app) = app_behind(&[]).await;
    let addr = gw.addr();
    assert!(rapid_reset(addr, 2000).await, "rapid reset went on");
    assert!(
        flood(addr, frame(PING, 0, 0, &[7; 8]), 20_000).await,
        "a PING flood went on"
    );
    assert!(
        flood(addr, frame(SETTINGS, 0, 0, &[]), 20_000).await,
        "a SETTINGS flood went on"
    );
    // Closed by the gateway's flood limit, not by chance.
    assert_eq!(
        gw.log().matches("HTTP/2 control frame flood").count(),
        2,
        "{}",
        gw.log()
    );
    // A client that pings now and then is no flood.
    let mut calm = Client::connect(addr).await;
    calm.settings().await;
    for i in 0..20u8 {
        calm.send(&frame(PING, 0, 0, &[i; 8])).await;
        loop {
            let f = calm.next().await.expect("PING answered");
            if f.kind == PING && f.flags & ACK != 0 && f.payload == [i; 8] {
                break;
            }
        }
    }
    calm.send(&frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        &get("/", "h", &[]),
    ))
    .await;
    let mut status = None;
    while let Some(f) = calm.next().await {
        if f.kind == HEADERS && f.stream == 1 {
            status = Some(f.payload[0]);
            break;
        }
    }
    // 0x88 is HPACK's indexed `:status 200`.
    assert_eq!(status, Some(0x88), "the calm client's request was served");
    others_are_served(addr, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn well_behaved_clients_are_served_while_others_attack() {
    let (gw, app) = app_behind(&["--request-header-timeout", "2s"]).await;
    let addr = gw.addr();
    let mut attacks = Vec::new();
    for _ in 0..20 {
        attacks.push(tokio::spawn(async move {
            slowloris(addr, Duration::from_millis(200)).await.1
        }));
    }
    for _ in 0..3 {
        attacks.push(tokio::spawn(rapid_reset(addr, 2000)));
        attacks.push(tokio::spawn(flood(
            addr,
            frame(PING, 0, 0, &[1; 8]),
            50_000,
        )));
    }
    let clients: Vec<_> = (0..4)
        .map(|_| tokio::spawn(others_are_served(addr, 25)))
        .collect();
    for c in clients {
        c.await.expect("every well-behaved request succeeded");
    }
    for a in attacks {
        assert!(a.await.unwrap(), "an attacking connection was never closed");
    }
    assert_eq!(app.requests(), 100, "{}", gw.log());
}

// ---------------------------------------------------------------------------
// Slow readers and slow backends: memory stays bounded.
// ---------------------------------------------------------------------------

const HUGE: u64 = 256 * 1024 * 1024;
/// What the gateway may hold for one slow connection, generously: its
/// buffers plus the kernel's socket buffers on both sides.
const BOUND: u64 = 48 * 1024 * 1024;

/// Sample `counter` until it stops moving (unchanged over 10 samples).
async fn plateau(counter: &AtomicU64) -> u64 {
    let mut last = counter.load(Ordering::SeqCst);
    let mut still = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while still < 10 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = counter.load(Ordering::SeqCst);
        if now == last {
            still += 1;
        } else {
            still = 0;
            last = now;
        }
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_cannot_make_the_gateway_buffer_a_response() {
    let written = Arc::new(AtomicU64::new(0));
    let counter = written.clone();
    let fire_hose = RawBackend::start(move |mut stream, _| {
        let counter = counter.clone();
        async move {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {HUGE}\r\n\r\n");
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![b'z'; 64 * 1024];
            while counter.load(Ordering::SeqCst) < HUGE {
                if stream.write_all(&chunk).await.is_err() {
                    return;
                }
                counter.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            }
        }
    })
    .await;
    let gw = Gw::start(&(simple("hose") + &service("hose", &[fire_hose.port])), &[]).await;
    let before = gw.rss_kib();
    let mut client = TcpStream::connect(gw.addr()).await.unwrap();
    client
        .write_all(b"GET /big HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    // Read the head only, then stop reading.
    let head = read_head(&mut client).await.expect("a response head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let sent = plateau(&written).await;
    let grown = gw.rss_kib().saturating_sub(before) * 1024;
    assert!(
        sent < BOUND,
        "the backend got {sent} bytes out to a client that reads nothing"
    );
    assert!(grown < BOUND, "the gateway grew by {grown} bytes");
    // Reading resumes: the rest arrives, all of it.
    let mut total = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    while total < HUGE {
        let n = tokio::time::timeout(Duration::from_secs(30), client.read(&mut buf))
            .await
            .expect("the body keeps coming")
            .unwrap();
        assert!(n > 0, "the body ended early at {total}");
        total += n as u64;
    }
    assert_eq!(total, HUGE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_backend_cannot_make_the_gateway_buffer_an_upload() {
    let sink = RawBackend::start(|stream, _| async move {
        // Read nothing of the body; keep the connection open.
        tokio::time::sleep(Duration::from_secs(120)).await;
        drop(stream);
    })
    .await;
    let gw = Gw::start(&(simple("sink") + &service("sink", &[sink.port])), &[]).await;
    let before = gw.rss_kib();
    let mut client = TcpStream::connect(gw.addr()).await.unwrap();
    client
        .write_all(
            format!("POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: {HUGE}\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let uploaded = Arc::new(AtomicU64::new(0));
    let counter = uploaded.clone();
    let upload = tokio::spawn(async move {
        let chunk = vec![b'u'; 64 * 1024];
        while counter.load(Ordering::SeqCst) < HUGE {
            if client.write_all(&chunk).await.is_err() {
                return;
            }
            counter.fetch_add(chunk.len() as u64, Ordering::SeqCst);
        }
    });
    sink.wait_heads(1).await;
    let sent = plateau(&uploaded).await;
    let grown = gw.rss_kib().saturating_sub(before) * 1024;
    upload.abort();
    assert!(sent < BOUND, "the client got {sent} bytes into the gateway");
    assert!(grown < BOUND, "the gateway grew by {grown} bytes");
}

// ---------------------------------------------------------------------------
// Failing backends.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_dying_mid_response_truncates_that_response_only() {
    let dying = RawBackend::start(|mut stream, head| async move {
        let chunked = head.contains("/chunked");
        let start: &[u8] = if chunked {
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n"
        } else {
            b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"
        };
        let _ = stream.write_all(start).await;
        let _ = stream.write_all(&[b'x'; 1024]).await;
        let _ = stream.flush().await;
        if head.contains("/reset") {
            // RST instead of FIN.
            #[allow(deprecated)]
            let _ = stream.set_linger(Some(Duration::ZERO));
        }
        drop(stream);
    })
    .await;
    let app = Pods::start("default", "app", 1).await;
    let routes = route(
        "default",
        "r",
        "  rules:\n  - matches: [{path: {type: PathPrefix, value: /dying}}]\n    backendRefs: [{name: dying, port: 8080}]\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let gw = Gw::start(
        &(gateway() + &routes + &app.manifests() + &service("dying", &[dying.port])),
        &[],
    )
    .await;
    for path in ["/dying/close", "/dying/reset"] {
        let answer = raw_bytes(gw.addr(), path).await;
        let (head, body) = split_answer(&answer);
        // A reset that reaches the gateway before the head does is a 502.
        if path.ends_with("reset") && head.starts_with("HTTP/1.1 502") {
            continue;
        }
        // Otherwise the head had already gone out with the backend's
        // length: the client sees fewer bytes than promised and the
        // connection closed.
        assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
        assert!(
            head.to_ascii_lowercase().contains("content-length: 100000"),
            "{path}: {head}"
        );
        assert!(
            body.len() < 100_000,
            "{path}: a whole body from a dead backend"
        );
    }
    let answer = raw_bytes(gw.addr(), "/dying/chunked").await;
    let (head, body) = split_answer(&answer);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !body.ends_with(b"0\r\n\r\n"),
        "a truncated chunked body was terminated as if complete"
    );
    others_are_served(gw.addr(), 5).await;
}

/// GET `path` on a fresh connection (asking to keep it alive) and read
/// until the gateway closes it.
async fn raw_bytes(addr: SocketAddr, path: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: h\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_until_closed(&mut s, Duration::from_secs(15))
        .await
        .expect("the gateway closes a connection whose response was cut")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_backend_gets_504_from_the_default_timeout() {
    let (_never, released) = watch::channel(false);
    let hanging = RawBackend::start(held_backend(released)).await;
    let app = Pods::start("default", "app", 1).await;
    let routes = route(
        "default",
        "r",
        "  rules:\n  - matches: [{path: {type: PathPrefix, value: /hang}}]\n    backendRefs: [{name: hanging, port: 8080}]\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let gw = Gw::start(
        &(gateway() + &routes + &app.manifests() + &service("hanging", &[hanging.port])),
        &["--backend-timeout", "1s"],
    )
    .await;
    let mut c = Conn::open(gw.addr()).await;
    let r = c.get("h", "/hang").await;
    assert_eq!(r.status, 504);
    assert_eq!(hanging.heads.load(Ordering::SeqCst), 1);
    // The same connection and everything else go on.
    assert_eq!(c.get("h", "/fine").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_finish_when_their_endpoint_is_removed() {
    let (release, released) = watch::channel(false);
    let held = RawBackend::start(held_backend(released)).await;
    let manifests = simple("held") + &service("held", &[held.port]);
    let gw = Gw::start(&manifests, &[]).await;
    let mut in_flight = TcpStream::connect(gw.addr()).await.unwrap();
    in_flight
        .write_all(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    held.wait_heads(1).await;
    // The endpoint goes away: new requests get 503 once the change is served.
    gw.write("all.yaml", &(simple("held") + &service("held", &[])));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // A probe the old table sends to the held backend stays held.
        let probe = async { Conn::open(gw.addr()).await.get("h", "/new").await };
        if let Ok(r) = tokio::time::timeout(Duration::from_secs(1), probe).await
            && r.status == 503
        {
            break;
        }
        assert!(Instant::now() < deadline, "the removal was never served");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    release.send_replace(true);
    let mut answer = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(15), in_flight.read(&mut answer))
        .await
        .expect("the request in flight is answered")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

// ---------------------------------------------------------------------------
// Graceful shutdown.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_accepting_finishes_requests_in_flight_and_exits_0() {
    let (release, released) = watch::channel(false);
    let held = RawBackend::start(held_backend(released)).await;
    let mut gw = Gw::start(
        &(simple("held") + &service("held", &[held.port])),
        &["--drain-timeout", "60s"],
    )
    .await;
    // An idle keep-alive connection must not hold the drain up (the drain
    // period is longer than the wait for the exit below).
    let _idle = Conn::open(gw.addr()).await;
    let mut in_flight = TcpStream::connect(gw.addr()).await.unwrap();
    in_flight
        .write_all(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    held.wait_heads(1).await;

    rustix::process::kill_process(
        rustix::process::Pid::from_child(&gw.child),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM sent");
    // New connections are refused once the listener is closed.
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect(gw.addr()).await.is_ok() {
        assert!(Instant::now() < deadline, "still accepting after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        gw.child.try_wait().unwrap().is_none(),
        "exited with a request in flight"
    );
    release.send_replace(true);
    let answer = read_until_closed(&mut in_flight, Duration::from_secs(15))
        .await
        .expect("answered, then closed");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("held"), "the whole body: {answer}");
    let status = gw
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("the gateway exits after draining");
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        gw.log()
    );
}

// ---------------------------------------------------------------------------
// Headers only the gateway sets.
// ---------------------------------------------------------------------------

fn echo_header(r: &Resp, name: &str) -> Option<String> {
    r.echo().header(name).map(|v| v.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_address_comes_from_trusted_hops_only() {
    let app = Pods::start("default", "app", 1).await;
    let manifests = simple("app") + &app.manifests();
    let spoof = [
        ("x-forwarded-for", "6.6.6.6, 192.0.2.10"),
        ("x-real-ip", "6.6.6.6"),
    ];

    let untrusting = Gw::start(&manifests, &[]).await;
    let r = Conn::open(untrusting.addr())
        .await
        .get_with("h", "/", &spoof)
        .await;
    assert_eq!(echo_header(&r, "x-real-ip").as_deref(), Some("127.0.0.1"));
    assert_eq!(
        echo_header(&r, "x-forwarded-for").as_deref(),
        Some("6.6.6.6, 192.0.2.10, 127.0.0.1"),
        "X-Forwarded-For is appended to"
    );

    let one_hop = Gw::start(&manifests, &["--xff-trusted-hops", "1"]).await;
    let r = Conn::open(one_hop.addr())
        .await
        .get_with("h", "/", &spoof)
        .await;
    assert_eq!(echo_header(&r, "x-real-ip").as_deref(), Some("192.0.2.10"));

    let by_cidr = Gw::start(&manifests, &["--trusted-proxy", "127.0.0.0/8"]).await;
    let r = Conn::open(by_cidr.addr())
        .await
        .get_with("h", "/", &spoof)
        .await;
    assert_eq!(echo_header(&r, "x-real-ip").as_deref(), Some("192.0.2.10"));
    let r = Conn::open(by_cidr.addr())
        .await
        .get_with("h", "/", &[("x-forwarded-for", "10.0.0.1, 127.0.0.9")])
        .await;
    assert_eq!(echo_header(&r, "x-real-ip").as_deref(), Some("10.0.0.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_the_route_removes_cannot_be_injected() {
    let app = Pods::start("default", "app", 1).await;
    let routes = route(
        "default",
        "r",
        "  rules:\n  - filters:\n    - type: RequestHeaderModifier\n      requestHeaderModifier:\n        remove: [X-Canary-Internal]\n    backendRefs: [{name: app, port: 8080}]",
    );
    let gw = Gw::start(&(gateway() + &routes + &app.manifests()), &[]).await;
    // HTTP/1.1: any case, repeated, comma-joined.
    let raw_request = b"GET / HTTP/1.1\r\nHost: h\r\nX-Canary-Internal: 1\r\nx-canary-internal: 2\r\nX-CANARY-INTERNAL: 3, 4\r\nConnection: close\r\n\r\n";
    let answer = raw(gw.addr(), raw_request).await;
    let (head, body) = split_answer(answer.as_bytes());
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let echo: sluice::echo::EchoResponse = serde_json::from_slice(body).expect("echo JSON");
    assert_eq!(echo.header("x-canary-internal"), None, "{:?}", echo.headers);
    // Underscore spelling, which some backends read as the same header.
    let answer = raw(
        gw.addr(),
        b"GET / HTTP/1.1\r\nHost: h\r\nX_Canary_Internal: 1\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    // HTTP/2.
    let mut h2 = Client::connect(gw.addr()).await;
    h2.settings().await;
    let block = get(
        "/",
        "h",
        &[("x-canary-internal", "1"), ("x-canary-internal", "2")],
    );
    h2.send(&frame(HEADERS, END_STREAM | END_HEADERS, 1, &block))
        .await;
    let mut body = Vec::new();
    while let Some(f) = h2.next().await {
        if f.stream == 1 && f.kind == 0x0 {
            body.extend_from_slice(&f.payload);
            if f.flags & END_STREAM != 0 {
                break;
            }
        }
    }
    let echo: sluice::echo::EchoResponse = serde_json::from_slice(&body).expect("echo JSON");
    assert_eq!(echo.header("x-canary-internal"), None, "{:?}", echo.headers);
    assert_eq!(app.requests(), 2);
}

// ---------------------------------------------------------------------------
// Hop-by-hop headers, both ways.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_never_cross_in_either_direction() {
    let requests = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = requests.clone();
    let backend = RawBackend::start(move |mut stream, head| {
        seen.lock().unwrap().push(head);
        async move {
            let _ = stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\nConnection: x-secret, keep-alive\r\nX-Secret: 1\r\n\
                      Keep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nUpgrade: h2c\r\n\
                      Trailer: x-checksum\r\nProxy-Authenticate: Basic\r\nX-End-To-End: kept\r\n\
                      Content-Length: 2\r\n\r\nok",
                )
                .await;
        }
    })
    .await;
    let gw = Gw::start(&(simple("b") + &service("b", &[backend.port])), &[]).await;
    // An Upgrade that does not ask to upgrade (no `Connection: upgrade`),
    // and one on HTTP/1.0 (which has no upgrades), are plain hop-by-hop
    // headers.
    for request in [
        &b"GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nTE: trailers\r\nTrailer: x\r\nProxy-Authorization: Basic eA==\r\nConnection: close\r\n\r\n"[..],
        &b"GET / HTTP/1.0\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"[..],
    ] {
        let answer = raw(gw.addr(), request).await;
        let (head, body) = split_answer(answer.as_bytes());
        assert!(head.contains(" 200 "), "{head}");
        assert_eq!(body, b"ok");
        let lower = head.to_ascii_lowercase();
        for hop in [
            "x-secret",
            "keep-alive:",
            "proxy-connection",
            "upgrade",
            "trailer",
            "proxy-authenticate",
        ] {
            assert!(!lower.contains(hop), "{hop} crossed to the client: {head}");
        }
        assert!(lower.contains("x-end-to-end: kept"), "{head}");
    }
    let heads = requests.lock().unwrap().clone();
    assert_eq!(heads.len(), 2);
    for head in heads {
        let lower = head.to_ascii_lowercase();
        for hop in ["upgrade", "te:", "trailer", "proxy-authorization"] {
            assert!(!lower.contains(hop), "{hop} crossed to the backend: {head}");
        }
    }
}
