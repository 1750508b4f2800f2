//! Backend TLS tests (`GatewayTLSBackendClientCertificate`,
//! `GatewayInvalidTLSBackendConfiguration`): BackendTLSPolicy and the
//! Gateway's `spec.tls.backend` client certificate.

use anyhow::anyhow;

use crate::check::Ctx;

/// Run the checks of test `name`.
pub async fn run(name: &str, _cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    Err(anyhow!(
        "not implemented yet: the runner has no checks for {name}, and sluice does not implement backend TLS"
    ))
}
