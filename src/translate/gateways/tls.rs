//! Listener TLS: an HTTPS listener's `tls.certificateRefs`, resolved into
//! the certificate it presents.
//!
//! Per the spec, a reference to a Secret in another namespace is invalid
//! unless a ReferenceGrant in that namespace allows it ("ResolvedRefs" False
//! with reason `RefNotPermitted`); a reference to a missing or unsupported
//! object, or to a Secret whose data is malformed, gives `InvalidCertificateRef`.
//! Either way only that listener is affected: the others keep serving.
//!
//! Client certificate validation (the Gateway's `spec.tls.frontend`) is in
//! [`frontend`].

pub(crate) mod frontend;

use std::sync::Arc;

use gateway_api::experimental::gateways::{
    GatewayListeners, GatewayListenersTlsCertificateRefs, GatewayListenersTlsMode,
};
use k8s_openapi::ByteString;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::resources::{DEFAULT_NAMESPACE, GATEWAY_GROUP, Gateway, Secret, Snapshot};

/// What a listener's TLS configuration resolved to.
#[derive(Debug, Default)]
pub(crate) struct ListenerTls {
    /// The certificate to terminate TLS with: the first reference that
    /// resolved. `None` when none did (the listener cannot be served).
    pub certificate: Option<Arc<CertifiedKey>>,
    /// `(reason, message)` of `ResolvedRefs=False`, when a reference did not
    /// resolve.
    pub unresolved: Option<(&'static str, String)>,
    /// Why the listener's TLS settings cannot be accepted at all (the
    /// listener gets `Accepted=False`).
    pub unsupported: Option<String>,
    /// Client certificate validation from the Gateway's
    /// `spec.tls.frontend` (see [`ListenerTls::with_frontend`]).
    pub frontend: frontend::ListenerFrontend,
}

impl ListenerTls {
    /// Add the client certificate validation Gateway `gw` (in namespace
    /// `gateway_ns`) asks of `listener`; its CA references that do not
    /// resolve join the listener's `ResolvedRefs=False`.
    pub(crate) fn with_frontend(
        mut self,
        snapshot: &Snapshot,
        gw: &Gateway,
        gateway_ns: &str,
        listener: &GatewayListeners,
    ) -> Self {
        self.frontend = frontend::resolve(snapshot, gw, gateway_ns, listener);
        if let Some((reason, message)) = &self.frontend.unresolved {
            self.unresolved = Some(match self.unresolved.take() {
                // The certificate's reason comes first; both messages stay.
                Some((first, m)) => (first, format!("{m}; {message}")),
                None => (reason, message.clone()),
            });
        }
        self
    }
}

/// Resolve the TLS settings of an HTTPS listener of a Gateway in `gateway_ns`.
pub(crate) fn resolve(
    snapshot: &Snapshot,
    gateway_ns: &str,
    listener: &GatewayListeners,
) -> ListenerTls {
    let mut out = ListenerTls::default();
    let Some(tls) = &listener.tls else {
        out.unresolved = Some((
            "InvalidCertificateRef",
            "an HTTPS listener needs tls.certificateRefs".into(),
        ));
        return out;
    };
    if matches!(tls.mode, Some(GatewayListenersTlsMode::Passthrough)) {
        out.unsupported = Some(
            "tls.mode Passthrough is not supported on an HTTPS listener: HTTPS terminates TLS (mode Terminate)"
                .into(),
        );
        return out;
    }
    let refs = tls.certificate_refs.as_deref().unwrap_or_default();
    if refs.is_empty() {
        out.unresolved = Some((
            "InvalidCertificateRef",
            "tls.certificateRefs is empty; mode Terminate needs a certificate".into(),
        ));
        return out;
    }
    let mut failures: Vec<(&'static str, String)> = Vec::new();
    for (i, r) in refs.iter().enumerate() {
        match resolve_ref(snapshot, gateway_ns, r) {
            Ok(key) => {
                if out.certificate.is_none() {
                    out.certificate = Some(key);
                }
            }
            Err((reason, message)) => {
                failures.push((reason, format!("tls.certificateRefs[{i}]: {message}")))
            }
        }
    }
    if let Some((reason, _)) = failures.first() {
        // RefNotPermitted says more than InvalidCertificateRef (the spec
        // reserves the latter for references that are allowed).
        let reason = if failures.iter().any(|f| f.0 == "RefNotPermitted") {
            "RefNotPermitted"
        } else {
            reason
        };
        let message = failures
            .iter()
            .map(|f| f.1.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        out.unresolved = Some((reason, message));
    }
    out
}

fn resolve_ref(
    snapshot: &Snapshot,
    gateway_ns: &str,
    r: &GatewayListenersTlsCertificateRefs,
) -> Result<Arc<CertifiedKey>, (&'static str, String)> {
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    if !group.is_empty() || kind != "Secret" {
        let what = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        return Err((
            "InvalidCertificateRef",
            format!(
                "{what} {} is not supported; sluice reads core Secrets",
                r.name
            ),
        ));
    }
    let ns = r.namespace.as_deref().unwrap_or(gateway_ns);
    if ns != gateway_ns && !gateway_ref_granted(snapshot, gateway_ns, ns, "Secret", &r.name) {
        return Err((
            "RefNotPermitted",
            format!(
                "Secret {ns}/{}: no ReferenceGrant in namespace {ns} allows Gateways from namespace {gateway_ns} to refer to it",
                r.name
            ),
        ));
    }
    let secret = snapshot
        .secrets
        .iter()
        .find(|s| {
            s.metadata.name.as_deref() == Some(r.name.as_str())
                && s.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE) == ns
        })
        .ok_or_else(|| {
            (
                "InvalidCertificateRef",
                format!("Secret {ns}/{} not found", r.name),
            )
        })?;
    certified_key(secret).map_err(|message| {
        (
            "InvalidCertificateRef",
            format!("Secret {ns}/{}: {message}", r.name),
        )
    })
}

/// Is a reference from a Gateway in `from_ns` to the core object `kind`
/// `name` in `to_ns` (a Secret, a ConfigMap) allowed by a ReferenceGrant in
/// `to_ns`?
fn gateway_ref_granted(
    snapshot: &Snapshot,
    from_ns: &str,
    to_ns: &str,
    kind: &str,
    name: &str,
) -> bool {
    snapshot
        .reference_grants
        .iter()
        .filter(|g| g.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE) == to_ns)
        .any(|g| {
            g.spec
                .from
                .iter()
                .any(|f| f.group == GATEWAY_GROUP && f.kind == "Gateway" && f.namespace == from_ns)
                && g.spec.to.iter().any(|t| {
                    t.group.is_empty()
                        && t.kind == kind
                        && t.name.as_deref().is_none_or(|n| n == name)
                })
        })
}

/// One key of a Secret: `stringData` wins over `data`, as the API server
/// merges them.
fn secret_value<'a>(secret: &'a Secret, key: &str) -> Option<&'a [u8]> {
    if let Some(v) = secret.string_data.as_ref().and_then(|d| d.get(key)) {
        return Some(v.as_bytes());
    }
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|ByteString(b)| b.as_slice())
}

/// The certificate chain (`tls.crt`) and private key (`tls.key`) of a
/// `kubernetes.io/tls` Secret, checked to belong together.
pub(crate) fn certified_key(secret: &Secret) -> Result<Arc<CertifiedKey>, String> {
    if let Some(t) = secret.type_.as_deref()
        && t != "kubernetes.io/tls"
    {
        return Err(format!("type is {t}, expected kubernetes.io/tls"));
    }
    let crt = secret_value(secret, "tls.crt").ok_or("tls.crt is missing")?;
    let key = secret_value(secret, "tls.key").ok_or("tls.key is missing")?;
    let chain = CertificateDer::pem_slice_iter(crt)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls.crt is not valid PEM: {e}"))?;
    if chain.is_empty() {
        return Err("tls.crt holds no PEM certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|e| format!("tls.key holds no usable PEM private key: {e}"))?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .map(Arc::new)
        .map_err(|e| format!("certificate and key cannot be used: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn secret(crt: &str, key: &str, ty: Option<&str>) -> Secret {
        Secret {
            type_: ty.map(str::to_string),
            string_data: Some(BTreeMap::from([
                ("tls.crt".to_string(), crt.to_string()),
                ("tls.key".to_string(), key.to_string()),
            ])),
            ..Secret::default()
        }
    }

    fn generated(name: &str) -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    #[test]
    fn a_generated_certificate_and_key_load() {
        let (crt, key) = generated("a.example");
        assert!(certified_key(&secret(&crt, &key, Some("kubernetes.io/tls"))).is_ok());
        // `data` (base64 in the manifest) works the same.
        let s = Secret {
            data: Some(BTreeMap::from([
                ("tls.crt".to_string(), ByteString(crt.into_bytes())),
                ("tls.key".to_string(), ByteString(key.into_bytes())),
            ])),
            ..Secret::default()
        };
        assert!(certified_key(&s).is_ok());
    }

    #[test]
    fn malformed_or_mismatched_secrets_are_refused_with_a_reason() {
        let (crt, key) = generated("a.example");
        let (_, other_key) = generated("b.example");
        let hello = "Hello world\n";
        for (s, needle) in [
            (secret(hello, hello, None), "no PEM certificate"),
            (secret(&crt, hello, None), "private key"),
            (secret(&crt, &other_key, None), "cannot be used"),
            (
                secret(&crt, &key, Some("Opaque")),
                "expected kubernetes.io/tls",
            ),
            (Secret::default(), "tls.crt is missing"),
        ] {
            let err = certified_key(&s).unwrap_err();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }
}
