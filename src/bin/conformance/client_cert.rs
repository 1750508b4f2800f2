//! Frontend client certificate validation tests (`GatewayFrontend*`,
//! `GatewayInvalidFrontendClientCertificateValidation`): Gateway
//! `spec.tls.frontend` CA references and the mTLS handshakes they imply.

use anyhow::anyhow;

use crate::check::Ctx;

/// Run the checks of test `name`.
pub async fn run(name: &str, _cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    Err(anyhow!(
        "not implemented yet: the runner has no checks for {name}, and sluice does not implement frontend client certificate validation"
    ))
}
