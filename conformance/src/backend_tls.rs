//! Backend TLS tests (`GatewayTLSBackendClientCertificate`,
//! `GatewayInvalidTLSBackendConfiguration`): BackendTLSPolicy and the
//! Gateway's `spec.tls.backend` client certificate.
//!
//! What the suite sets up in Go at run time, made here with rcgen: a CA
//! (ConfigMap `tls-checks-ca-certificate`, key `ca.crt`), the backend's
//! server certificate for `abc.example.com` (Secret `tls-checks-certificate`)
//! and the client certificate the Gateway presents (Secret
//! `tls-checks-client-certificate`), both issued by that CA. The test's
//! Deployment runs echo-basic with `TLS_SERVER_CERT` (HTTPS on 8443) and
//! `TLS_CLIENT_CACERTS` (client certificates required, verified against
//! the CA): the runner's pod does the same ([`server_config`]) and records
//! the SNI and client certificate of each connection, which the suite
//! compares through echo-basic's `tls` report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_yaml::Value;

use crate::ctx::{Ctx, INFRA};
use crate::env;
use crate::expect::req;
use crate::status::{fresh, has_condition};

const CA_CONFIG_MAP: &str = "tls-checks-ca-certificate";
const SERVER_SECRET: &str = "tls-checks-certificate";
const CLIENT_SECRET: &str = "tls-checks-client-certificate";
/// The name the backend's certificate is issued for (the policies'
/// `validation.hostname`).
const BACKEND_HOSTNAME: &str = "abc.example.com";

/// Bound on the request check (the suite's eventually-consistent request).
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// The certificates of one run.
struct BackendPki {
    objects: Vec<Value>,
    ca: CertificateDer<'static>,
    server_chain: Vec<CertificateDer<'static>>,
    server_key: Vec<u8>,
    client_cert: CertificateDer<'static>,
}

fn pki() -> anyhow::Result<&'static BackendPki> {
    static PKI: std::sync::OnceLock<BackendPki> = std::sync::OnceLock::new();
    if let Some(p) = PKI.get() {
        return Ok(p);
    }
    let ca = env::RunnerCa::new("sluice conformance backend TLS CA")?;
    let (server, server_key) = ca.issue(
        vec![BACKEND_HOSTNAME.to_owned()],
        None,
        "the backend server certificate",
    )?;
    let (client, client_key) = ca.issue(
        vec!["gateway.example.com".to_owned()],
        None,
        "the client certificate",
    )?;
    let objects = vec![
        ca.config_map(INFRA, CA_CONFIG_MAP)?,
        env::tls_secret(INFRA, SERVER_SECRET, &server, &server_key)?,
        env::tls_secret(INFRA, CLIENT_SECRET, &client, &client_key)?,
    ];
    Ok(PKI.get_or_init(|| BackendPki {
        objects,
        ca: ca.cert.der().clone(),
        server_chain: vec![server.der().clone()],
        server_key: server_key.serialize_der(),
        client_cert: client.der().clone(),
    }))
}

/// The CA ConfigMap and the server and client certificate Secrets the
/// suite creates at set-up, as manifests (generated on first use).
pub fn suite_objects() -> anyhow::Result<Vec<Value>> {
    Ok(pki()?.objects.clone())
}

/// The HTTPS settings of a Deployment running echo-basic with
/// `TLS_SERVER_CERT` and Secret `tls-checks-certificate` (none for the
/// others): that Secret's server certificate, and client certificates required and verified
/// against the CA ConfigMap when `TLS_CLIENT_CACERTS` is set.
pub fn server_config(deployment: &Value) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
    let spec = &deployment["spec"]["template"]["spec"];
    let env_set = |name: &str| {
        spec["containers"]
            .as_sequence()
            .into_iter()
            .flatten()
            .flat_map(|c| c["env"].as_sequence().into_iter().flatten())
            .any(|e| e["name"].as_str() == Some(name))
    };
    if !env_set("TLS_SERVER_CERT") {
        return Ok(None);
    }
    let volumes: Vec<&Value> = spec["volumes"]
        .as_sequence()
        .into_iter()
        .flatten()
        .collect();
    let id = env::object_id(deployment);
    let secret = volumes
        .iter()
        .find_map(|v| v["secret"]["secretName"].as_str())
        .ok_or_else(|| anyhow!("Deployment {id}: TLS_SERVER_CERT without a Secret volume"))?;
    if secret != SERVER_SECRET {
        // Another test's TLS backend (TLSRoute passthrough): not served
        // over TLS by the runner; it keeps its plain echo ports.
        return Ok(None);
    }
    let pki = pki()?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = if env_set("TLS_CLIENT_CACERTS") {
        let config_map = volumes
            .iter()
            .find_map(|v| v["configMap"]["name"].as_str())
            .ok_or_else(|| {
                anyhow!("Deployment {id}: TLS_CLIENT_CACERTS without a ConfigMap volume")
            })?;
        if config_map != CA_CONFIG_MAP {
            bail!("Deployment {id}: the runner has no CA for ConfigMap {config_map}");
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pki.ca.clone()).context("the backend CA")?;
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .context("the client certificate verifier")?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.server_key.clone()));
    let config = builder
        .with_single_cert(pki.server_chain.clone(), key)
        .context("the backend's server certificate")?;
    Ok(Some(Arc::new(config)))
}

pub async fn client_certificate(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = format!("{INFRA}/gateway-tls-backend-client-certificate");
    let route = format!("{INFRA}/gateway-tls-backend-client-certificate");
    let policy = format!("{INFRA}/gateway-tls-backend-client-certificate-test");
    cx.accepted(&gw, &[&route]).await?;
    cx.resolved(&route, &gw).await?;
    policy_condition(cx, &policy, &gw, "Accepted", true, "Accepted").await?;
    cx.gateway_condition(&gw, "ResolvedRefs", true, "ResolvedRefs")
        .await?;

    // The request reaches the backend over TLS with SNI abc.example.com,
    // and the backend saw the Secret's client certificate.
    let mut case = req(&gw, "/").host(BACKEND_HOSTNAME);
    case.namespace = Some(INFRA.to_owned());
    let pods = cx.pods.of(INFRA, "tls-backend-with-client-cert-validation");
    if pods.is_empty() {
        bail!("no pod of Deployment tls-backend-with-client-cert-validation");
    }
    let want_cert = pki()?.client_cert.as_ref().to_vec();
    let deadline = Instant::now() + REQUEST_DEADLINE;
    loop {
        let outcome = match cx.expect(&case).await {
            Err(e) => Err(e),
            Ok(()) => {
                let seen: Vec<_> = pods.iter().flat_map(|p| p.server.tls_seen()).collect();
                let last = seen
                    .last()
                    .ok_or_else(|| anyhow!("the backend saw no TLS connection"))?;
                if last.sni.as_deref() != Some(BACKEND_HOSTNAME) {
                    Err(anyhow!(
                        "the backend saw SNI {:?}, expected {BACKEND_HOSTNAME}",
                        last.sni
                    ))
                } else if last.client_cert.as_deref() != Some(want_cert.as_slice()) {
                    Err(anyhow!(
                        "the backend did not see Secret {CLIENT_SECRET}'s certificate (saw {})",
                        if last.client_cert.is_some() {
                            "another certificate"
                        } else {
                            "none"
                        }
                    ))
                } else {
                    Ok(())
                }
            }
        };
        match outcome {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

pub async fn invalid_configuration(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    for (gateway, reason) in [
        (
            "gateway-client-certificate-nonexistent-secret",
            "InvalidClientCertificateRef",
        ),
        (
            "gateway-client-certificate-unsupported-group",
            "InvalidClientCertificateRef",
        ),
        (
            "gateway-client-certificate-unsupported-kind",
            "InvalidClientCertificateRef",
        ),
        (
            "gateway-client-certificate-malformed-secret",
            "InvalidClientCertificateRef",
        ),
        (
            "gateway-client-certificate-missing-reference-grant",
            "RefNotPermitted",
        ),
    ] {
        let gw = format!("{INFRA}/{gateway}");
        cx.latest_conditions("Gateway", &gw, None).await?;
        cx.gateway_condition(&gw, "ResolvedRefs", false, reason)
            .await?;
        cx.gateway_condition(&gw, "Accepted", true, "Accepted")
            .await?;
    }
    Ok(())
}

/// `BackendTLSPolicyMustHaveCondition`: an ancestor of the policy naming
/// `gateway` has the condition, and every ancestor's conditions carry the
/// policy's generation.
async fn policy_condition(
    cx: &Ctx<'_>,
    policy: &str,
    gateway: &str,
    ty: &str,
    status: bool,
    reason: &str,
) -> anyhow::Result<()> {
    let want = if status { "True" } else { "False" };
    let (gw_ns, gw_name) = gateway.split_once('/').unwrap_or(("", gateway));
    cx.eventually(
        &format!("BackendTLSPolicy {policy} {ty}={want} {reason} for {gateway}"),
        |cx| {
            let s = cx
                .status_of("BackendTLSPolicy", policy)
                .ok_or_else(|| anyhow!("no status for BackendTLSPolicy {policy}"))?;
            let ancestors = s.status["ancestors"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for a in &ancestors {
                fresh(&s, &a["conditions"])?;
            }
            let found = ancestors.iter().any(|a| {
                let r = &a["ancestorRef"];
                r["name"] == gw_name
                    && r["namespace"].as_str().is_none_or(|ns| ns == gw_ns)
                    && has_condition(&a["conditions"], ty, want, reason)
            });
            if !found {
                bail!("ancestors are {}", s.status["ancestors"]);
            }
            Ok(())
        },
    )
    .await
}
