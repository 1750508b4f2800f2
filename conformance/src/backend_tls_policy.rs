//! The BackendTLSPolicy tests (GATEWAY-HTTP, Extended: features
//! `BackendTLSPolicy` and `BackendTLSPolicySANValidation`): HTTPRoutes to
//! Services of the `tls-backend` Deployment (echo-basic serving HTTPS with
//! Secret `tls-checks-certificate`, issued by the CA of ConfigMap
//! `tls-checks-ca-certificate` for `abc.example.com`, `other.example.com`
//! and `spiffe://abc.example.com/test-identity`, see
//! [`crate::backend_tls`]).
//!
//! What a test sends and expects comes from reading the upstream tests
//! (`conformance/tests/backendtlspolicy*.go`); the code here is ours. The
//! backend reports the SNI of the connection a request came on (echo-basic's
//! `tls.serverName`), which the suite compares with the policy's hostname.

use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};

use crate::backend_tls::CA_CONFIG_MAP;
use crate::ctx::{Ctx, INFRA, infra};
use crate::expect::{Case, same_ns};
use crate::suite::SAME_NS;

/// The name the backend's certificate is valid for.
const BACKEND: &str = "abc.example.com";

/// Answers in a row that make a failure consistent (the suite's
/// `MakeRequestAndExpectFailure` threshold).
const FAILURES_IN_A_ROW: usize = 5;
/// Bound on waiting for a consistent failure (the suite's
/// `MaxTimeToConsistency` bounds it upstream).
const FAILURE_DEADLINE: Duration = Duration::from_secs(30);

/// `Accepted=True Accepted` and `ResolvedRefs=True ResolvedRefs` of policy
/// `name` for Gateway `gateway`.
async fn policy_valid(cx: &Ctx<'_>, name: &str, gateway: &str) -> anyhow::Result<()> {
    let policy = infra(name);
    cx.policy_condition(&policy, gateway, "Accepted", true, "Accepted")
        .await?;
    cx.policy_condition(&policy, gateway, "ResolvedRefs", true, "ResolvedRefs")
        .await
}

/// The suite's `MakeRequestAndExpectFailure`: the request must fail
/// [`FAILURES_IN_A_ROW`] times in a row with a status other than 200 and a
/// timeout (408, 504); a transport error or a timeout starts the count
/// again, and a 200 fails the test at once.
async fn expect_failure(cx: &Ctx<'_>, case: &Case) -> anyhow::Result<()> {
    let deadline = Instant::now() + FAILURE_DEADLINE;
    let mut in_a_row = 0;
    let mut last = String::new();
    while in_a_row < FAILURES_IN_A_ROW {
        if Instant::now() >= deadline {
            bail!(
                "{}: no consistent failure within {FAILURE_DEADLINE:?} (last: {last})",
                case.describe()
            );
        }
        match cx.send(case).await {
            Ok(ex) if ex.status == 200 => {
                bail!("{}: answered 200, expected a failure", case.describe())
            }
            Ok(ex) if matches!(ex.status, 408 | 504) => {
                in_a_row = 0;
                last = format!("status {}", ex.status);
            }
            Ok(_) => in_a_row += 1,
            Err(e) => {
                in_a_row = 0;
                last = format!("{e:#}");
            }
        }
        if in_a_row == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// A request to the `same-namespace` Gateway for `path` with Host
/// `abc.example.com`, answered in the infra namespace.
fn to_backend(path: &str) -> Case {
    let mut case = same_ns(path).host(BACKEND);
    case.namespace = Some(INFRA.to_owned());
    case
}

/// `BackendTLSPolicy`.
pub async fn backend_tls_policy(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    // Re-encrypt: HTTPS to the Gateway, TLS again to the backend.
    let https_gw = infra("same-namespace-with-https-listener");
    let reencrypt = infra("backendtlspolicy-reencrypt");
    cx.accepted(&https_gw, &[&reencrypt]).await?;
    cx.resolved(&reencrypt, &https_gw).await?;
    policy_valid(cx, "normative-test", &https_gw).await?;
    let mut case = crate::expect::req(&https_gw, "/backendtlspolicy")
        .host("https-listener.org")
        .tls("https-listener.org")
        .exp_sni(BACKEND);
    case.namespace = Some(INFRA.to_owned());
    cx.expect(&case).await.context("re-encrypt")?;

    let route = infra("backendtlspolicy");
    cx.accepted(SAME_NS, &[&route]).await?;
    cx.resolved(&route, SAME_NS).await?;

    policy_valid(cx, "normative-test", SAME_NS).await?;
    cx.expect(&to_backend("/backendtlspolicy").exp_sni(BACKEND))
        .await
        .context("valid policy")?;

    // The policy's hostname is not the certificate's: the handshake fails.
    policy_valid(cx, "host-mismatch", SAME_NS).await?;
    let mut mismatch = same_ns("/backendtlspolicy-host-mismatch").host("abc.example.org");
    mismatch.namespace = Some(INFRA.to_owned());
    expect_failure(cx, &mismatch).await?;

    // The policy's CA did not issue the certificate.
    policy_valid(cx, "cert-mismatch", SAME_NS).await?;
    expect_failure(cx, &to_backend("/backendtlspolicy-cert-mismatch")).await?;

    reconcile_ca_config_map(cx).await
}

/// The `reconcile-test` subtest: the policy moves to a ConfigMap that does
/// not exist yet (rejected), which is then created (accepted), emptied
/// (rejected again) and refilled (accepted).
async fn reconcile_ca_config_map(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    const POLICY: &str = "reconcile-test";
    const COPY: &str = "tls-checks-ca-certificate-reconcile-test";
    let policy = infra(POLICY);
    policy_valid(cx, POLICY, SAME_NS).await?;

    let ca = cx
        .files
        .iter()
        .flat_map(|f| &f.docs)
        .find(|d| {
            crate::env::kind(d) == "ConfigMap" && crate::env::object_id(d) == infra(CA_CONFIG_MAP)
        })
        .map(|d| d["data"]["ca.crt"].clone());
    // The suite's ConfigMaps are generated with the run, not listed in the
    // manifests: read the one the runner renders.
    let ca = match ca {
        Some(ca) => ca,
        None => crate::backend_tls::suite_objects()?
            .into_iter()
            .find(|d| crate::env::object_id(d) == infra(CA_CONFIG_MAP))
            .map(|d| d["data"]["ca.crt"].clone())
            .ok_or_else(|| anyhow!("no ConfigMap {CA_CONFIG_MAP}"))?,
    };

    cx.modify("BackendTLSPolicy", &policy, |p| {
        p["spec"]["validation"]["caCertificateRefs"] =
            sluice::yaml::from_str(&format!("[{{group: '', kind: ConfigMap, name: {COPY}}}]"))
                .expect("the reference is valid YAML");
    })?;
    no_valid_ca(cx, &policy)
        .await
        .context("the ConfigMap does not exist")?;

    let config_map = |data: serde_json::Value| -> anyhow::Result<serde_json::Value> {
        let mut doc: serde_json::Value = sluice::yaml::from_str(&format!(
            "{{apiVersion: v1, kind: ConfigMap, metadata: {{name: {COPY}, namespace: {INFRA}}}}}"
        ))?;
        doc["data"] = sluice::yaml::from_str("{}")?;
        doc["data"]["ca.crt"] = data;
        Ok(doc)
    };
    cx.apply(config_map(ca.clone())?)?;
    policy_valid(cx, POLICY, SAME_NS)
        .await
        .context("the ConfigMap was created")?;

    cx.apply(config_map("".into())?)?;
    no_valid_ca(cx, &policy)
        .await
        .context("the ConfigMap's ca.crt was emptied")?;

    cx.apply(config_map(ca)?)?;
    policy_valid(cx, POLICY, SAME_NS)
        .await
        .context("the ConfigMap's ca.crt was restored")?;
    cx.expect(&to_backend("/backendtlspolicy-reconcile-test").exp_sni(BACKEND))
        .await
        .context("after reconciling")
}

/// `Accepted=False NoValidCACertificate` and `ResolvedRefs=False
/// InvalidCACertificateRef` of `policy` for the `same-namespace` Gateway.
async fn no_valid_ca(cx: &Ctx<'_>, policy: &str) -> anyhow::Result<()> {
    cx.policy_condition(policy, SAME_NS, "Accepted", false, "NoValidCACertificate")
        .await?;
    cx.policy_condition(
        policy,
        SAME_NS,
        "ResolvedRefs",
        false,
        "InvalidCACertificateRef",
    )
    .await
}

/// `BackendTLSPolicyConflictResolution`.
pub async fn conflict_resolution(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let route = infra("backendtlspolicy-conflict-resolution");
    cx.accepted(SAME_NS, &[&route]).await?;
    cx.resolved(&route, SAME_NS).await?;
    for (winner, loser, path) in [
        (
            "conflicted-without-section-name-1",
            "conflicted-without-section-name-2",
            "/backendtlspolicy-conflicted-without-section-name",
        ),
        (
            "conflicted-with-section-name-1",
            "conflicted-with-section-name-2",
            "/backendtlspolicy-conflicted-with-section-name",
        ),
    ] {
        cx.policy_condition(&infra(winner), SAME_NS, "Accepted", true, "Accepted")
            .await?;
        cx.policy_condition(&infra(loser), SAME_NS, "Accepted", false, "Conflicted")
            .await?;
        // The winner's hostname is the SNI.
        cx.expect(&to_backend(path).exp_sni("other.example.com"))
            .await?;
    }
    // A policy on one port and one on the whole Service do not conflict:
    // each port takes the most specific.
    for name in [
        "not-conflicted-with-section-name",
        "not-conflicted-without-section-name",
    ] {
        cx.policy_condition(&infra(name), SAME_NS, "Accepted", true, "Accepted")
            .await?;
    }
    cx.expect(
        &to_backend("/backendtlspolicy-not-conflicted-with-section-name")
            .exp_sni("other.example.com"),
    )
    .await?;
    cx.expect(&to_backend("/backendtlspolicy-not-conflicted-without-section-name").exp_sni(BACKEND))
        .await
}

/// `BackendTLSPolicyInvalidCACertificateRef` and
/// `BackendTLSPolicyInvalidKind`: each policy's only CA reference does not
/// resolve (with `reason`): not accepted, and its backend's requests get a
/// 5xx.
pub async fn invalid_ca_reference(
    cx: &mut Ctx<'_>,
    route: &str,
    policies: &[&str],
    reason: &str,
) -> anyhow::Result<()> {
    cx.accepted(SAME_NS, &[&infra(route)]).await?;
    for name in policies {
        let policy = infra(name);
        cx.policy_condition(&policy, SAME_NS, "Accepted", false, "NoValidCACertificate")
            .await?;
        cx.policy_condition(&policy, SAME_NS, "ResolvedRefs", false, reason)
            .await?;
        cx.expect(&to_backend(&format!("/backendtlspolicy-{name}")).statuses(&[500, 502, 503]))
            .await?;
    }
    Ok(())
}

/// `BackendTLSPolicyObservedGenerationBump`.
pub async fn observed_generation_bump(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let policy = infra("observed-generation-bump");
    cx.latest_conditions("BackendTLSPolicy", &policy, None)
        .await?;
    let before = cx.generation("BackendTLSPolicy", &policy)?;
    cx.modify("BackendTLSPolicy", &policy, |p| {
        p["spec"]["validation"]["hostname"] = "foo.example.com".into();
    })?;
    cx.latest_conditions("BackendTLSPolicy", &policy, Some(before))
        .await?;
    cx.policy_condition(&policy, SAME_NS, "Accepted", true, "")
        .await
}

/// `BackendTLSPolicySANValidation`: with `subjectAltNames` the certificate
/// must carry one of them (a DNS name, or a URI exactly); the hostname
/// stays the SNI.
pub async fn san_validation(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let route = infra("backendtlspolicy-san-test");
    cx.accepted(SAME_NS, &[&route]).await?;
    cx.resolved(&route, SAME_NS).await?;
    for (policy, succeeds) in [
        ("san-dns", true),
        ("san-dns-mismatch", false),
        ("san-uri", true),
        ("san-uri-mismatch", false),
        ("multiple-sans", true),
        ("multiple-mismatch-sans", false),
    ] {
        cx.policy_condition(&infra(policy), SAME_NS, "Accepted", true, "Accepted")
            .await?;
        let case = to_backend(&format!("/backendtlspolicy-{policy}"));
        if succeeds {
            cx.expect(&case.exp_sni(BACKEND))
                .await
                .with_context(|| format!("policy {policy}"))?;
        } else {
            expect_failure(cx, &case)
                .await
                .with_context(|| format!("policy {policy}"))?;
        }
    }
    Ok(())
}
