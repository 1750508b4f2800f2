//! The suite's TLS checks CA and what it issued, the TLS echo pods that
//! present them, and the backend TLS tests of Gateways
//! (`GatewayTLSBackendClientCertificate`,
//! `GatewayInvalidTLSBackendConfiguration`).
//!
//! What the suite sets up in Go at run time, made here with rcgen: a CA
//! (ConfigMap `tls-checks-ca-certificate`, key `ca.crt`) that issues the
//! backends' server certificate (Secret `tls-checks-certificate`, for
//! `abc.example.com`, `other.example.com` and the URI
//! `spiffe://abc.example.com/test-identity`), the client certificate the
//! Gateway presents (`tls-checks-client-certificate`), the passthrough
//! backends' certificate (`tls-passthrough-checks-certificate`, in the
//! infra and app-backend namespaces, for `abc.example.com`) and the
//! certificate of TLS listeners in Terminate mode
//! (`tls-terminate-checks-certificate`, for `tls.example.com`); and a CA
//! that issued none of them (`mismatch-ca-certificate`).
//!
//! A Deployment running echo-basic with `TLS_SERVER_CERT` serves HTTPS (or,
//! with `TCP_ECHO_SERVER`, TCP over TLS) with the certificate of the
//! Secret it mounts ([`server_config`]), and requires client certificates
//! verified against the CA when `TLS_CLIENT_CACERTS` is set; the pods
//! record the SNI and client certificate of each connection, which the
//! suite compares through echo-basic's `tls` report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::Value;

use crate::ctx::{APP, Ctx, INFRA};
use crate::env;
use crate::expect::req;

pub const CA_CONFIG_MAP: &str = "tls-checks-ca-certificate";
const SERVER_SECRET: &str = "tls-checks-certificate";
const CLIENT_SECRET: &str = "tls-checks-client-certificate";
const PASSTHROUGH_SECRET: &str = "tls-passthrough-checks-certificate";
const TERMINATE_SECRET: &str = "tls-terminate-checks-certificate";
const MISMATCH_CA: &str = "mismatch-ca-certificate";
/// The name the backend's certificate is issued for (the policies'
/// `validation.hostname`).
const BACKEND_HOSTNAME: &str = "abc.example.com";

/// Bound on the request check (the suite's eventually-consistent request).
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// A server certificate chain and its key (PKCS#8 DER).
struct Issued {
    chain: Vec<CertificateDer<'static>>,
    key: Vec<u8>,
}

/// The certificates of one run.
struct BackendPki {
    objects: Vec<Value>,
    ca: CertificateDer<'static>,
    /// By Secret name (the same certificate in every namespace).
    servers: Vec<(&'static str, Issued)>,
    client_cert: CertificateDer<'static>,
}

fn pki() -> anyhow::Result<&'static BackendPki> {
    static PKI: std::sync::OnceLock<BackendPki> = std::sync::OnceLock::new();
    if let Some(p) = PKI.get() {
        return Ok(p);
    }
    let ca = env::RunnerCa::new("sluice conformance TLS checks CA")?;
    let mismatch = env::RunnerCa::new("sluice conformance mismatch CA")?;
    let mut objects = vec![
        ca.config_map(INFRA, CA_CONFIG_MAP)?,
        mismatch.config_map(INFRA, MISMATCH_CA)?,
    ];
    let mut servers = Vec::new();
    for (secret, names, namespaces) in [
        (
            SERVER_SECRET,
            &[
                "abc.example.com",
                "other.example.com",
                "spiffe://abc.example.com/test-identity",
            ][..],
            &[INFRA][..],
        ),
        (
            PASSTHROUGH_SECRET,
            &[BACKEND_HOSTNAME][..],
            &[INFRA, APP][..],
        ),
        (TERMINATE_SECRET, &["tls.example.com"][..], &[INFRA][..]),
    ] {
        let (cert, key) = ca.issue(
            names.iter().map(|n| (*n).to_owned()).collect(),
            None,
            &format!("the certificate of Secret {secret}"),
        )?;
        for ns in namespaces {
            objects.push(env::tls_secret(ns, secret, &cert, &key)?);
        }
        servers.push((
            secret,
            Issued {
                chain: vec![cert.der().clone()],
                key: key.serialize_der(),
            },
        ));
    }
    let (client, client_key) = ca.issue(
        vec!["gateway.example.com".to_owned()],
        None,
        "the client certificate",
    )?;
    objects.push(env::tls_secret(INFRA, CLIENT_SECRET, &client, &client_key)?);
    Ok(PKI.get_or_init(|| BackendPki {
        objects,
        ca: ca.cert.der().clone(),
        servers,
        client_cert: client.der().clone(),
    }))
}

/// The CA ConfigMaps and the certificate Secrets the suite creates at
/// set-up, as manifests (generated on first use).
pub fn suite_objects() -> anyhow::Result<Vec<Value>> {
    Ok(pki()?.objects.clone())
}

/// The TLS checks CA (`tls-checks-ca-certificate`): what the suite's
/// clients trust for the backends' certificates.
pub fn checks_ca() -> anyhow::Result<CertificateDer<'static>> {
    Ok(pki()?.ca.clone())
}

/// The server settings of a Deployment running echo-basic with
/// `TLS_SERVER_CERT` (none for the others): the certificate of the Secret
/// its volume mounts, and client certificates required and verified
/// against the CA ConfigMap when `TLS_CLIENT_CACERTS` is set.
pub fn server_config(deployment: &Value) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
    let spec = &deployment["spec"]["template"]["spec"];
    let env_set = |name: &str| {
        spec["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["env"].as_array().into_iter().flatten())
            .any(|e| e["name"].as_str() == Some(name))
    };
    if !env_set("TLS_SERVER_CERT") {
        return Ok(None);
    }
    let volumes: Vec<&Value> = spec["volumes"].as_array().into_iter().flatten().collect();
    let id = env::object_id(deployment);
    let secret = volumes
        .iter()
        .find_map(|v| v["secret"]["secretName"].as_str())
        .ok_or_else(|| anyhow!("Deployment {id}: TLS_SERVER_CERT without a Secret volume"))?;
    let pki = pki()?;
    let issued = pki
        .servers
        .iter()
        .find(|(name, _)| *name == secret)
        .map(|(_, issued)| issued)
        .ok_or_else(|| {
            anyhow!("Deployment {id}: the runner has no certificate for Secret {secret}")
        })?;
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
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(issued.key.clone()));
    let config = builder
        .with_single_cert(issued.chain.clone(), key)
        .context("the backend's server certificate")?;
    Ok(Some(Arc::new(config)))
}

pub async fn client_certificate(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = format!("{INFRA}/gateway-tls-backend-client-certificate");
    let route = format!("{INFRA}/gateway-tls-backend-client-certificate");
    let policy = format!("{INFRA}/gateway-tls-backend-client-certificate-test");
    cx.accepted(&gw, &[&route]).await?;
    cx.resolved(&route, &gw).await?;
    cx.policy_condition(&policy, &gw, "Accepted", true, "Accepted")
        .await?;
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
