//! The admin listener: what a standalone gateway tells its operator.
//!
//! With no API server to write status to, sluice serves it here, next to the
//! configuration errors, the Prometheus metrics and the health probes:
//!
//! - `GET /status`: JSON array of `{apiVersion, kind, metadata, status}`, each
//!   `status` in the shape the object's Kubernetes status has;
//! - `GET /errors`: JSON array of the current configuration errors
//!   (`{file, line, object, field, message}`);
//! - `GET /endpoints`: JSON array of the endpoints ejected from their
//!   backend's rotation now or lately, or failing now (outlier ejection:
//!   which, since when, why);
//! - `GET /metrics`: Prometheus text;
//! - `GET /explain?method=GET&url=http://host/path&header=Name:%20value`:
//!   which listener and rule take that request and why, as `sluice
//!   explain` prints it, in JSON (`header` repeatable, `gateway=ns/name`);
//! - `GET /`: the dashboard, one page built into the binary (no external
//!   assets), polling `GET /overview` (JSON: Gateways and listeners,
//!   rules with spec, served and observed shares per backend, rollouts
//!   with their evidence over time, errors; bounded, see [`overview`]);
//! - `GET /healthz`: `ok` while the process serves;
//! - `GET /readyz`: 200 once the first configuration is applied, 503 before;
//!   a line more for each thing an operator should know (the rollout state
//!   cannot be saved).
//!
//! The serve loop publishes a new [`Published`] after every reload, and a
//! [`RolloutReport`] whenever a rollout moves (often: it carries the step's
//! counts); requests read each with one atomic load. A RolloutPolicy's
//! `status.rollouts` is filled in from the report when `/status` is read,
//! so that a rollout's counts do not copy the whole status.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::proxy::Proxy;
use crate::rollout::{PolicyKey, RolloutReport};
use crate::route::EndpointReport;
use crate::source::ConfigError;
use crate::translate::{ObjectStatus, RuleSummary, StatusReport};

pub mod overview;

/// The dashboard page: HTML, CSS and script in one file, no external asset.
const DASHBOARD: &str = include_str!("admin/dashboard.html");

/// Content type of the Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4";
const JSON: &str = "application/json";

/// What the admin endpoints show, replaced as a whole after each reload.
#[derive(Debug, Default)]
pub struct Published {
    pub status: StatusReport,
    pub errors: Vec<ConfigError>,
    /// Every attached rule with its backends' shares and state.
    pub rules: Arc<Vec<Arc<RuleSummary>>>,
    /// Number of the route table in service.
    pub generation: u64,
}

/// State shared between the serve loop (writer) and the admin listener
/// (reader).
pub struct AdminState {
    published: ArcSwap<Published>,
    rollouts: ArcSwap<RolloutReport>,
    gates: ArcSwap<overview::GateLimits>,
    histories: ArcSwap<overview::Histories>,
    ready: AtomicBool,
    metrics: Arc<Metrics>,
    /// The proxy in service: its route table for `/explain`, its endpoints
    /// for `/endpoints`.
    proxy: OnceLock<Proxy>,
}

impl AdminState {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        AdminState {
            published: ArcSwap::from_pointee(Published::default()),
            rollouts: ArcSwap::from_pointee(RolloutReport::default()),
            gates: ArcSwap::from_pointee(overview::GateLimits::default()),
            histories: ArcSwap::from_pointee(overview::Histories::default()),
            ready: AtomicBool::new(false),
            metrics,
            proxy: OnceLock::new(),
        }
    }

    /// The proxy in service, whose table `/explain` reads and whose
    /// endpoints `/endpoints` shows (set once).
    pub fn show_proxy(&self, proxy: Proxy) {
        let _ = self.proxy.set(proxy);
    }

    /// Show `report` as the rollouts' status from now on.
    pub fn publish_rollouts(&self, report: RolloutReport) {
        self.rollouts.store(Arc::new(report));
    }

    /// Show `gates` as the rollouts' limits (what the dashboard compares
    /// their gate values with).
    pub fn publish_gates(&self, gates: overview::GateLimits) {
        self.gates.store(Arc::new(gates));
    }

    /// Show `histories` as the rollouts' evidence over time (the
    /// dashboard's charts).
    pub fn publish_histories(&self, histories: overview::Histories) {
        self.histories.store(Arc::new(histories));
    }

    /// The rollouts' status currently shown.
    pub fn rollouts(&self) -> Arc<RolloutReport> {
        self.rollouts.load_full()
    }

    /// Replace the status and errors shown.
    /// Show `published` from now on; returns what was shown before.
    pub fn publish(&self, published: Published) -> Arc<Published> {
        self.published.swap(Arc::new(published))
    }

    /// The status and errors currently shown.
    pub fn published(&self) -> Arc<Published> {
        self.published.load_full()
    }

    /// `/readyz` answers 200 from now on.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Answer one admin request.
    pub fn respond(&self, method: &Method, path: &str) -> Response<Full<Bytes>> {
        self.respond_to(method, path, None)
    }

    /// Answer one admin request with its query string.
    pub fn respond_to(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
    ) -> Response<Full<Bytes>> {
        if method != Method::GET && method != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        }
        match path {
            "/" => body(StatusCode::OK, "text/html; charset=utf-8", DASHBOARD),
            "/overview" => json(&overview::Overview::build(
                &self.published.load(),
                &self.rollouts.load(),
                &self.gates.load(),
                &self.histories.load(),
                &self.metrics,
                overview::Limits::from_query(query),
            )),
            "/explain" => self.explain(query),
            "/status" => json(&MergedStatus {
                status: &self.published.load().status,
                rollouts: &self.rollouts.load(),
            }),
            "/errors" => json(&self.published.load().errors),
            "/endpoints" => {
                let report = self.proxy.get().map(Proxy::endpoint_report);
                let endpoints: Vec<EndpointJson<'_>> =
                    report.iter().flatten().map(EndpointJson::from).collect();
                json(&endpoints)
            }
            "/metrics" => body(StatusCode::OK, PROMETHEUS_TEXT, self.metrics.encode()),
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" if self.is_ready() => match &self.rollouts.load().not_saved {
                None => text(StatusCode::OK, "ready\n"),
                Some((why, _)) => body(
                    StatusCode::OK,
                    "text/plain; charset=utf-8",
                    format!("ready\nrollout state not saved: {why}\n"),
                ),
            },
            "/readyz" => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "no configuration applied yet\n",
            ),
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }
}

impl AdminState {
    /// `/explain?method=&url=&header=&gateway=`: the explanation as JSON;
    /// 400 when the request cannot be built.
    fn explain(&self, query: Option<&str>) -> Response<Full<Bytes>> {
        let mut method = "GET".to_string();
        let mut url = None;
        let mut headers = Vec::new();
        let mut gateway = None;
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match k.as_ref() {
                "method" => method = v.into_owned(),
                "url" => url = Some(v.into_owned()),
                "header" => headers.push(v.into_owned()),
                "gateway" => gateway = Some(v.into_owned()),
                _ => {}
            }
        }
        let Some(url) = url else {
            return text(StatusCode::BAD_REQUEST, "missing url= parameter\n");
        };
        let Some(table) = self.proxy.get().map(Proxy::table) else {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "no configuration applied yet\n",
            );
        };
        let published = self.published.load();
        let explained = crate::explain::ExplainRequest::parse(&method, &url, &headers, gateway)
            .and_then(|r| crate::explain::explain(&table, &published.rules, &r));
        match explained {
            Ok(e) => json(&e),
            Err(e) => body(
                StatusCode::BAD_REQUEST,
                "text/plain; charset=utf-8",
                format!("{e}\n"),
            ),
        }
    }
}

/// One endpoint of `/endpoints` (docs/hardening.md shows one).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct EndpointJson<'a> {
    backend: &'a str,
    endpoint: SocketAddr,
    ejected: bool,
    /// When the current or last ejection started (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_failure: Option<&'static str>,
    ejections: u32,
    consecutive_failures: u32,
}

impl<'a> From<&'a EndpointReport> for EndpointJson<'a> {
    fn from(e: &'a EndpointReport) -> Self {
        let since = e.since.and_then(|since| {
            let secs = since
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            k8s_openapi::jiff::Timestamp::from_second(secs as i64)
                .ok()
                .map(|t| t.to_string())
        });
        EndpointJson {
            backend: &e.backend,
            endpoint: e.endpoint,
            ejected: e.ejected,
            since,
            remaining_seconds: e
                .remaining
                .map(|left| left.as_millis().div_ceil(1000) as u64),
            reason: e
                .reason
                .map(|r| format!("{} failed tries in a row, the last {r}", e.failures)),
            last_failure: e.reason.map(|r| r.label()),
            ejections: e.ejections,
            consecutive_failures: e.consecutive_failures,
        }
    }
}

/// `/status`: the objects of `status`, RolloutPolicies completed by
/// `rollouts`, serialized one by one (only policies are copied).
struct MergedStatus<'a> {
    status: &'a StatusReport,
    rollouts: &'a RolloutReport,
}

impl serde::Serialize for MergedStatus<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.status.objects.len()))?;
        for object in &self.status.objects {
            if object.kind == "RolloutPolicy" {
                seq.serialize_element(&complete_policy(object, self.rollouts))?;
            } else {
                seq.serialize_element(object)?;
            }
        }
        seq.end()
    }
}

/// `object` with its rollouts, when it is a RolloutPolicy.
fn complete_policy(object: &ObjectStatus, rollouts: &RolloutReport) -> ObjectStatus {
    let mut object = object.clone();
    if object.kind == "RolloutPolicy" {
        let key = PolicyKey {
            namespace: object.metadata.namespace.clone().unwrap_or_default(),
            name: object.metadata.name.clone(),
        };
        rollouts.complete(&key, &mut object.status);
    }
    object
}

fn body(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    response
}

fn text(status: StatusCode, message: &'static str) -> Response<Full<Bytes>> {
    body(status, "text/plain; charset=utf-8", message)
}

fn json(value: &impl serde::Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec_pretty(value) {
        Ok(mut bytes) => {
            bytes.push(b'\n');
            body(StatusCode::OK, JSON, bytes)
        }
        Err(error) => {
            tracing::error!(%error, "cannot serialize admin response");
            text(StatusCode::INTERNAL_SERVER_ERROR, "cannot serialize\n")
        }
    }
}

/// A running admin listener.
pub struct AdminServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl AdminServer {
    /// Bind `addr` and serve `state` until `shutdown` turns true.
    pub async fn start(
        addr: SocketAddr,
        state: Arc<AdminState>,
        shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() {
            tracing::warn!(
                %addr,
                "the admin listener is reachable from other hosts: it exposes the configuration (routes, backends, errors, metrics) to anyone who can connect; bind it to 127.0.0.1 and use kubectl port-forward or a NetworkPolicy"
            );
        }
        let task = tokio::spawn(accept_loop(listener, state, shutdown));
        Ok(AdminServer { addr, task })
    }

    /// The address actually bound (port 0 resolved).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Wait for the accept loop to end (after shutdown was signalled).
    pub async fn join(self) {
        if let Err(error) = self.task.await {
            tracing::error!(%error, "admin listener task failed");
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<AdminState>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = crate::shutdown::stopped(&mut shutdown) => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: pause instead of spinning.
                tracing::warn!(%error, "admin listener: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                // Off the async workers: `/status`, `/metrics` and
                // `/overview` of 10,000 routes take tens of milliseconds
                // that requests on the same worker must not wait behind.
                let state = state.clone();
                async move {
                    let answered = tokio::task::spawn_blocking(move || {
                        let uri = request.uri();
                        state.respond_to(request.method(), uri.path(), uri.query())
                    })
                    .await;
                    Ok::<_, Infallible>(answered.unwrap_or_else(|error| {
                        tracing::error!(%error, "admin request failed");
                        text(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")
                    }))
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                _ = crate::shutdown::stopped(&mut shutdown) => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%error, %peer, "admin connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_text(response: Response<Full<Bytes>>) -> String {
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("Full bodies cannot fail")
            .to_bytes();
        String::from_utf8(bytes.to_vec()).expect("admin bodies are UTF-8")
    }

    #[tokio::test]
    async fn readyz_is_503_until_set_ready() {
        let state = AdminState::new(Metrics::shared());
        assert_eq!(
            state.respond(&Method::GET, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        state.set_ready();
        assert_eq!(
            state.respond(&Method::GET, "/readyz").status(),
            StatusCode::OK
        );
        assert_eq!(
            state.respond(&Method::GET, "/healthz").status(),
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn unknown_paths_are_404_and_other_methods_405() {
        let state = AdminState::new(Metrics::shared());
        assert_eq!(
            state.respond(&Method::GET, "/nope").status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            state.respond(&Method::POST, "/status").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[tokio::test]
    async fn errors_are_served_as_json_objects() {
        let state = AdminState::new(Metrics::shared());
        state.publish(Published {
            rules: Arc::default(),
            generation: 1,
            status: StatusReport::default(),
            errors: vec![ConfigError {
                file: "routes.yaml".into(),
                line: Some(7),
                object: Some("HTTPRoute default/web".into()),
                field: Some("spec.rules[0].backendRefs[0].weight".into()),
                message: "must be at most 1000000".into(),
            }],
        });
        let response = state.respond(&Method::GET, "/errors");
        assert_eq!(response.headers()[CONTENT_TYPE], JSON);
        let value: serde_json::Value =
            serde_json::from_str(&body_text(response).await).expect("valid JSON");
        assert_eq!(
            value,
            serde_json::json!([{
                "file": "routes.yaml",
                "line": 7,
                "object": "HTTPRoute default/web",
                "field": "spec.rules[0].backendRefs[0].weight",
                "message": "must be at most 1000000",
            }])
        );
        let status = body_text(state.respond(&Method::GET, "/status")).await;
        assert_eq!(status.trim(), "[]");
    }

    #[tokio::test]
    async fn metrics_use_the_prometheus_text_content_type() {
        let metrics = Metrics::shared();
        metrics.record_config_error("a.yaml");
        let state = AdminState::new(metrics);
        let response = state.respond(&Method::GET, "/metrics");
        assert_eq!(response.headers()[CONTENT_TYPE], PROMETHEUS_TEXT);
        let text = body_text(response).await;
        assert!(
            text.contains(r#"sluice_config_errors_total{file="a.yaml"} 1"#),
            "{text}"
        );
    }
}
