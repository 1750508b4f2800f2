//! The GATEWAY-TLS tests: TLSRoute checks of Gateway API v1.6.1, and the
//! suite's TLS clients as they use them.
//!
//! Three kinds of traffic, as the upstream tests make it:
//! - HTTPS through a passthrough listener to echo-basic's HTTPS port
//!   (`MakeTLSRequestAndExpectEventuallyConsistentResponse`): the
//!   backend's certificate (issued by the TLS checks CA) is the one the
//!   client verifies; [`crate::expect`] judges the echo;
//! - the TCP echo server's line protocol over TLS
//!   (`MakeTCPRequestAndExpectEventuallyValidResponse`): the welcome line,
//!   `PING`, `IS_TLS` (is the backend's own connection TLS: true in
//!   passthrough, false behind a Terminate listener), and `TEST`, whose
//!   JSON names the pod and the SNI the backend saw;
//! - a TLS connection that must be refused
//!   (`MakeTLSConnectionAndExpectEventuallyConnectionRejection`): the
//!   handshake ends with the connection closed or reset, not with an
//!   alert or a certificate error.
//!
//! sluice supports Terminate and mixed-mode listeners, so the two tests
//! that upstream skips for implementations claiming them
//! (`TLSRouteListenerTerminateNotSupported`,
//! `TLSRouteListenerMixedTerminationNotSupported` return early) check the
//! supported behaviour on their manifests instead: the listeners are
//! accepted.
//!
//! Expectations come from reading the upstream test code; the code here is
//! ours.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::backend::TCP_WELCOME;
use crate::ctx::{Ctx, INFRA, infra};
use crate::expect::req;
use crate::status::ListenerExpect;

/// How long a connection check may take to start holding.
const CHECK_DEADLINE: Duration = Duration::from_secs(10);

const TLS_ROUTE: &str = "TLSRoute";

/// The suite's TCP client over TLS, trusting the TLS checks CA (built
/// once).
fn tcp_tls_connector() -> anyhow::Result<tokio_rustls::TlsConnector> {
    static CONNECTOR: std::sync::OnceLock<tokio_rustls::TlsConnector> = std::sync::OnceLock::new();
    if let Some(c) = CONNECTOR.get() {
        return Ok(c.clone());
    }
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(crate::backend_tls::checks_ca()?)
        .context("the TLS checks CA")?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS protocol versions")?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(CONNECTOR
        .get_or_init(|| tokio_rustls::TlsConnector::from(Arc::new(config)))
        .clone())
}

/// What the TCP echo server must say (`tcp.ExpectedResponse`).
struct TcpExpect {
    backend: &'static str,
    /// `IS_TLS`: the backend's own connection is TLS.
    backend_tls: bool,
    /// The SNI the backend saw (`TEST`'s `tls.serverName`), when checked.
    sni: Option<&'static str>,
}

impl Ctx<'_> {
    /// The loopback address of `gateway`'s first listener.
    fn listener_addr(&self, gateway: &str) -> anyhow::Result<std::net::SocketAddr> {
        let port = self.first_listener_port(gateway)?;
        let actual = self
            .ports
            .actual(gateway, port)
            .ok_or_else(|| anyhow!("Gateway {gateway} has no listener on port {port}"))?;
        Ok(std::net::SocketAddr::from(([127, 0, 0, 1], actual)))
    }

    /// One exchange with the TCP echo server through `gateway` over TLS with
    /// `sni`.
    async fn tcp_exchange(&self, gateway: &str, sni: &str, want: &TcpExpect) -> anyhow::Result<()> {
        let tcp = TcpStream::connect(self.listener_addr(gateway)?).await?;
        let name = ServerName::try_from(sni.to_owned())?;
        let tls = tcp_tls_connector()?
            .connect(name, tcp)
            .await
            .context("TLS handshake with the gateway")?;
        let mut io = BufReader::new(tls);
        let mut line = String::new();
        io.read_line(&mut line).await?;
        if line != TCP_WELCOME {
            bail!("welcome line {line:?}");
        }
        let mut ask = async |command: &str| -> anyhow::Result<String> {
            io.get_mut()
                .write_all(format!("{command}\n").as_bytes())
                .await?;
            io.get_mut().flush().await?;
            let mut answer = String::new();
            io.read_line(&mut answer).await?;
            Ok(answer.trim_end().to_owned())
        };
        if ask("PING").await? != "PONG" {
            bail!("no PONG");
        }
        let is_tls = ask("IS_TLS").await?;
        if is_tls != want.backend_tls.to_string() {
            bail!("IS_TLS answered {is_tls}, expected {}", want.backend_tls);
        }
        let test: serde_json::Value =
            serde_json::from_str(&ask("TEST").await?).context("TEST answer")?;
        if test["namespace"] != INFRA {
            bail!("namespace {}, expected {INFRA}", test["namespace"]);
        }
        let pod = test["pod"].as_str().unwrap_or("");
        if !pod.starts_with(&format!("{}-", want.backend)) {
            bail!("pod {pod:?}, expected backend {}", want.backend);
        }
        if let Some(sni) = want.sni
            && test["tls"]["serverName"] != sni
        {
            bail!(
                "the backend saw SNI {}, expected {sni}",
                test["tls"]["serverName"]
            );
        }
        Ok(())
    }

    /// `MakeTCPRequestAndExpectEventuallyValidResponse` over TLS.
    async fn tcp_request(&self, gateway: &str, sni: &str, want: TcpExpect) -> anyhow::Result<()> {
        let deadline = Instant::now() + CHECK_DEADLINE;
        loop {
            match self.tcp_exchange(gateway, sni, &want).await {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!("TCP over TLS with SNI {sni} to {gateway}")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// `MakeTLSConnectionAndExpectEventuallyConnectionRejection`: a TLS
    /// handshake with `sni` ends with the connection closed or reset.
    async fn rejected(&self, gateway: &str, sni: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + CHECK_DEADLINE;
        loop {
            let tcp = TcpStream::connect(self.listener_addr(gateway)?).await?;
            let name = ServerName::try_from(sni.to_owned())?;
            let outcome = match tcp_tls_connector()?.connect(name, tcp).await {
                Ok(_) => Err(anyhow!("the handshake succeeded")),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
                    ) =>
                {
                    Ok(())
                }
                Err(e) => Err(anyhow!("the handshake failed otherwise: {e}")),
            };
            match outcome {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!(
                        "a connection with SNI {sni} to {gateway} is refused"
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

/// A listener expectation: `kinds`, `attached` routes, conditions.
fn listener(
    name: &str,
    kinds: &[&str],
    attached: i64,
    conditions: &[(&str, bool, &str)],
) -> ListenerExpect {
    ListenerExpect {
        name: name.to_owned(),
        kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
        attached,
        conditions: conditions
            .iter()
            .map(|(t, s, r)| {
                (
                    (*t).to_owned(),
                    if *s { "True" } else { "False" }.to_owned(),
                    (*r).to_owned(),
                )
            })
            .collect(),
    }
}

pub async fn simple_same_namespace(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-tlsroute");
    cx.accepted_kind(TLS_ROUTE, &gw, &[&infra("gateway-conformance-infra-test")])
        .await?;
    cx.tcp_request(
        &gw,
        "abc.example.com",
        TcpExpect {
            backend: "tcp-backend",
            backend_tls: true,
            sni: Some("abc.example.com"),
        },
    )
    .await
}

pub async fn terminate_simple_same_namespace(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-tlsroute-terminate");
    cx.accepted_kind(TLS_ROUTE, &gw, &[&infra("tlsroute-terminated-test")])
        .await?;
    cx.tcp_request(
        &gw,
        "tls.example.com",
        TcpExpect {
            backend: "tcp-backend",
            backend_tls: false,
            sni: None,
        },
    )
    .await
}

pub async fn mixed_termination_same_namespace(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-tlsroute-mixed-termination");
    cx.accepted_kind(
        TLS_ROUTE,
        &gw,
        &[&infra("gateway-conformance-mixed-passthroughroute")],
    )
    .await?;
    let accepted = [("Accepted", true, "Accepted")];
    cx.listeners(
        &gw,
        &[
            listener("tls-terminate", &["TLSRoute"], 1, &accepted),
            listener("tls-passthrough", &["TLSRoute"], 1, &accepted),
        ],
    )
    .await?;
    cx.accepted_kind(
        TLS_ROUTE,
        &gw,
        &[&infra("gateway-conformance-mixed-terminateroute")],
    )
    .await?;
    cx.tcp_request(
        &gw,
        "tls.example.com",
        TcpExpect {
            backend: "tcp-backend",
            backend_tls: false,
            sni: None,
        },
    )
    .await?;
    cx.tcp_request(
        &gw,
        "abc.example.com",
        TcpExpect {
            backend: "tcp-backend",
            backend_tls: true,
            sni: Some("abc.example.com"),
        },
    )
    .await
}

pub async fn hostname_intersection(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    // (Gateway, routes, SNI of tls-backend-2, the SNI nobody serves).
    let cases = [
        (
            "gw-tlsroute-exact-hostname-x-1",
            &["tlsroute-more-specific-wc-hostname-x-1"][..],
            None,
            "non.matching.com",
        ),
        (
            "gw-tlsroute-more-specific-wc-hostname-x-2",
            &[
                "tlsroute-exact-hostname-x-2",
                "tlsroute-less-specific-wc-hostname-x-2",
            ][..],
            Some("other.example.com"),
            "non.matching.com",
        ),
        (
            "gw-tlsroute-less-specific-wc-hostname-x-3",
            &[
                "tlsroute-exact-hostname-x-3",
                "tlsroute-more-specific-wc-hostname-x-3",
            ][..],
            Some("other.example.com"),
            "non.matching.com",
        ),
        (
            "gw-tlsroute-empty-hostname-x-4",
            &[
                "tlsroute-exact-hostname-x-4",
                "tlsroute-less-specific-wc-hostname-x-4",
            ][..],
            Some("other.example.com"),
            "non.matching.org",
        ),
    ];
    for (gateway, routes, second, nowhere) in cases {
        let gw = infra(gateway);
        let routes: Vec<String> = routes.iter().map(|r| infra(r)).collect();
        let refs: Vec<&str> = routes.iter().map(String::as_str).collect();
        cx.accepted_kind(TLS_ROUTE, &gw, &refs).await?;
        for route in &refs {
            cx.resolved_kind(TLS_ROUTE, route, &gw).await?;
        }
        let https = |sni: &str, backend: &str| req(&gw, "/").host(sni).tls(sni).infra(backend);
        cx.expect(&https("abc.example.com", "tls-backend"))
            .await
            .with_context(|| format!("Gateway {gateway}"))?;
        if let Some(sni) = second {
            cx.expect(&https(sni, "tls-backend-2"))
                .await
                .with_context(|| format!("Gateway {gateway}"))?;
        }
        cx.rejected(&gw, nowhere).await?;
    }
    Ok(())
}

/// `TLSRouteInvalidBackendRefNonexistent`, `...UnknownKind`: accepted, not
/// resolved for `reason`, and connections for its hostname refused.
pub async fn invalid_backend(
    cx: &mut Ctx<'_>,
    gateway: &str,
    route: &str,
    reason: &str,
) -> anyhow::Result<()> {
    let (gw, route) = (infra(gateway), infra(route));
    cx.accepted_kind(TLS_ROUTE, &gw, &[&route]).await?;
    cx.route_condition_kind(TLS_ROUTE, &route, &gw, "ResolvedRefs", false, reason)
        .await?;
    let hostname = cx.route_hostname(&route)?;
    cx.rejected(&gw, &hostname).await
}

pub async fn invalid_reference_grant(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("gateway-tlsroute-referencegrant");
    let route = infra("gateway-conformance-infra-test");
    cx.accepted_kind(TLS_ROUTE, &gw, &[&route]).await?;
    cx.route_condition_kind(
        TLS_ROUTE,
        &route,
        &gw,
        "ResolvedRefs",
        false,
        "RefNotPermitted",
    )
    .await
}

pub async fn no_matching_listener_hostname(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let exact = infra("gateway-tls-exact-hostname");
    let wildcard = infra("gateway-tls-wildcard-hostname");
    let (r1, r2) = (
        infra("tlsroute-hostname-mismatch-1"),
        infra("tlsroute-hostname-mismatch-2"),
    );
    for (route, gw) in [(&r1, &exact), (&r2, &wildcard)] {
        cx.route_condition_kind(
            TLS_ROUTE,
            route,
            gw,
            "Accepted",
            false,
            "NoMatchingListenerHostname",
        )
        .await?;
        cx.no_accepted_parents(TLS_ROUTE, route).await?;
    }
    cx.zero_routes(&exact).await?;
    cx.zero_routes(&wildcard).await
}

pub async fn no_matching_listener(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let http_only = infra("gateway-tlsroute-http-only");
    let https_only = infra("gateway-tlsroute-https-only");
    let passthrough_only = infra("gateway-tlsroute-tls-passthrough-only");
    let on_http = infra("tlsroute-not-allowed-protocol-http");
    let on_https = infra("tlsroute-not-allowed-protocol-https");
    let no_section = infra("tlsroute-no-matching-section-name");
    for (route, gw, reason) in [
        (&on_http, &http_only, "NotAllowedByListeners"),
        (&on_https, &https_only, "NotAllowedByListeners"),
        (&no_section, &passthrough_only, "NoMatchingParent"),
    ] {
        cx.route_condition_kind(TLS_ROUTE, route, gw, "Accepted", false, reason)
            .await?;
    }
    for route in [&on_http, &on_https, &no_section] {
        cx.no_accepted_parents(TLS_ROUTE, route).await?;
    }
    cx.zero_routes(&http_only).await?;
    cx.zero_routes(&https_only).await
}

/// Gateway `gateway`'s one listener `name` supports TLSRoute, has no
/// route, and has `conditions`.
async fn tls_listener(
    cx: &Ctx<'_>,
    gateway: &str,
    name: &str,
    conditions: &[(&str, bool, &str)],
) -> anyhow::Result<()> {
    cx.listeners(
        &infra(gateway),
        &[listener(name, &["TLSRoute"], 0, conditions)],
    )
    .await
}

pub async fn passthrough_supported_kinds(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    tls_listener(
        cx,
        "gateway-tlsroute-passthrough-supported-kind",
        "tls-passthrough",
        &[("ResolvedRefs", false, "InvalidRouteKinds")],
    )
    .await
}

pub async fn terminate_supported_kinds(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    tls_listener(
        cx,
        "gateway-tlsroute-terminate-supported",
        "tls-terminate",
        &[("Accepted", true, "Accepted")],
    )
    .await
}

/// `TLSRouteListenerTerminateNotSupported` for an implementation that
/// supports Terminate (upstream returns before any check): the listener
/// in mode Terminate is accepted, not `UnsupportedValue`.
pub async fn terminate_supported(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    tls_listener(
        cx,
        "gateway-tlsroute-terminate-unsupported",
        "tls-terminate",
        &[("Accepted", true, "Accepted"), ("Programmed", true, "")],
    )
    .await
}

/// `TLSRouteListenerMixedTerminationNotSupported` for an implementation
/// that supports mixed termination (upstream returns before any check):
/// both listeners on the one port are accepted, neither is a
/// `ProtocolConflict`.
pub async fn mixed_termination_supported(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let ok = [
        ("Accepted", true, "Accepted"),
        ("Conflicted", false, "NoConflicts"),
    ];
    cx.listeners(
        &infra("gateway-tlsroute-mixed-termination-not-supported"),
        &[
            listener("tls-terminate", &["TLSRoute"], 0, &ok),
            listener("tls-passthrough", &["TLSRoute"], 0, &ok),
        ],
    )
    .await
}

impl Ctx<'_> {
    /// The first `spec.hostnames` entry of a TLSRoute in the manifests.
    fn route_hostname(&self, route: &str) -> anyhow::Result<String> {
        self.files
            .iter()
            .flat_map(|f| &f.docs)
            .find(|d| crate::env::kind(d) == TLS_ROUTE && crate::env::object_id(d) == route)
            .and_then(|d| d["spec"]["hostnames"][0].as_str())
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("TLSRoute {route} names no hostname"))
    }
}
