//! Shared by `tests/admin.rs` and `tests/reload.rs`: a gateway started
//! in-process on manifests in a temp directory, backends that answer with
//! their own name, and a small keep-alive HTTP client.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use sluice::serve::{RunningGateway, ServeConfig};
use tokio::net::{TcpListener, TcpStream};

/// Upper bound of every wait in these tests; reached only when the
/// behaviour under test is broken.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    sluice::ports::free_loopback_port().expect("a free loopback port")
}

/// Start a backend on an ephemeral port that answers every request with
/// 200 and its `name` as the body. It runs until the test's runtime ends.
pub async fn start_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind backend");
    let addr = listener.local_addr().expect("bound socket has an address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service = service_fn(move |_request: Request<Incoming>| async move {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                        name.as_bytes(),
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// GatewayClass + Gateway with one HTTP listener on `port`.
pub fn gateway_yaml(port: u16) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: sluice
spec:
  controllerName: sluice.dev/gateway-controller
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
spec:
  gatewayClassName: sluice
  listeners:
  - name: http
    protocol: HTTP
    port: {port}
"#
    )
}

/// A Service `name` (port 80, named `http`) and its EndpointSlice pointing
/// at `backend`.
pub fn service_yaml(name: &str, backend: SocketAddr) -> String {
    let port = backend.port();
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: {name}
spec:
  ports:
  - name: http
    port: 80
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  labels:
    kubernetes.io/service-name: {name}
addressType: IPv4
ports:
- name: http
  port: {port}
endpoints:
- addresses: ["127.0.0.1"]
"#
    )
}

/// HTTPRoute `name` on path prefix `path` splitting between Services blue
/// and green.
pub fn route_yaml(name: &str, path: &str, blue: u32, green: u32) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: {name}
spec:
  parentRefs:
  - name: gw
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: {path}
    backendRefs:
    - name: blue
      port: 80
      weight: {blue}
    - name: green
      port: 80
      weight: {green}
"#
    )
}

/// A gateway serving the manifests of a temp directory, with blue and
/// green backends and a route file `route.yaml`.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub gateway: RunningGateway,
    /// The gateway listener.
    pub listener: SocketAddr,
}

impl Fixture {
    /// Start blue and green, write `gateway.yaml`, `services.yaml` and the
    /// given `route.yaml`, and start the gateway on the directory.
    pub async fn start(route: &str) -> Fixture {
        let blue = start_backend("blue").await;
        let green = start_backend("green").await;
        let port = free_port();
        let dir = tempfile::tempdir().expect("temp dir");
        write(dir.path(), "gateway.yaml", &gateway_yaml(port));
        write(
            dir.path(),
            "services.yaml",
            &format!(
                "{}---\n{}",
                service_yaml("blue", blue),
                service_yaml("green", green)
            ),
        );
        write(dir.path(), "route.yaml", route);
        let gateway = sluice::serve::start(ServeConfig {
            paths: vec![dir.path().to_path_buf()],
            bind: Ipv4Addr::LOCALHOST.into(),
            admin: (Ipv4Addr::LOCALHOST, 0).into(),
            crds: Vec::new(),
        })
        .await
        .expect("gateway starts");
        Fixture {
            dir,
            gateway,
            listener: (Ipv4Addr::LOCALHOST, port).into(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `GET path` on the admin listener.
    pub async fn admin(&self, path: &str) -> (StatusCode, String) {
        get(self.gateway.admin_addr(), path).await
    }

    /// `/status` parsed.
    pub async fn status(&self) -> serde_json::Value {
        let (code, body) = self.admin("/status").await;
        assert_eq!(code, StatusCode::OK, "{body}");
        serde_json::from_str(&body).expect("/status is JSON")
    }

    /// `/errors` parsed.
    pub async fn errors(&self) -> Vec<serde_json::Value> {
        let (code, body) = self.admin("/errors").await;
        assert_eq!(code, StatusCode::OK, "{body}");
        serde_json::from_str(&body).expect("/errors is a JSON array")
    }

    /// The `sluice_config_generation` gauge.
    pub async fn generation(&self) -> u64 {
        let (_, metrics) = self.admin("/metrics").await;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("sluice_config_generation "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `GET path` through the gateway on a fresh connection.
    pub async fn request(&self, path: &str) -> (StatusCode, String) {
        get(self.listener, path).await
    }

    /// Poll `path` through the gateway until the answer satisfies `want`,
    /// or panic at the deadline with the last answer.
    pub async fn wait_for_response(
        &self,
        path: &str,
        expected: &str,
        want: impl Fn(StatusCode, &str) -> bool,
    ) {
        wait_for(self.listener, path, expected, want).await;
    }

    /// Poll until `path` answers 200 from `backend`.
    pub async fn wait_for_backend(&self, path: &str, backend: &str) {
        self.wait_for_response(path, backend, |status, body| {
            status == StatusCode::OK && body == backend
        })
        .await;
    }

    /// Poll until the gateway applied a configuration newer than `after`.
    pub async fn wait_for_generation_after(&self, after: u64) -> u64 {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let now = self.generation().await;
            if now > after {
                return now;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "configuration generation stuck at {now}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

pub fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("write manifest");
}

/// Replace `dir/name` the way careful editors do: write a hidden temp file,
/// then rename it over the original.
pub fn rename_replace(dir: &Path, name: &str, text: &str) {
    let temp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&temp, text).expect("write temp manifest");
    std::fs::rename(&temp, dir.join(name)).expect("rename over manifest");
}

/// One HTTP/1.1 keep-alive connection.
pub struct Client {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> std::io::Result<Client> {
        let stream = TcpStream::connect(addr).await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(connection);
        Ok(Client { sender })
    }

    /// `GET path` on this connection.
    pub async fn get(&mut self, path: &str) -> Result<(StatusCode, String), hyper::Error> {
        self.sender.ready().await?;
        let request = Request::get(path)
            .header(http::header::HOST, "example.com")
            .body(Empty::new())
            .expect("static request is valid");
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// `GET path` on a fresh connection to `addr`. A connection failure is
/// reported as `BAD_GATEWAY` with the error as body (no backend answers
/// with such a body), so that polling loops can go on.
pub async fn get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let mut client = match Client::connect(addr).await {
        Ok(client) => client,
        Err(error) => return (StatusCode::BAD_GATEWAY, format!("connect: {error}")),
    };
    match client.get(path).await {
        Ok(answer) => answer,
        Err(error) => (StatusCode::BAD_GATEWAY, format!("request: {error}")),
    }
}

/// Poll `GET path` on `addr` until the answer satisfies `want` and return
/// it, or panic at the deadline with the last answer.
pub async fn wait_for(
    addr: SocketAddr,
    path: &str,
    expected: &str,
    want: impl Fn(StatusCode, &str) -> bool,
) -> (StatusCode, String) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (status, body) = get(addr, path).await;
        if want(status, &body) {
            return (status, body);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path}: still {status} {body:?}, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
