//! Listener TLS: an HTTPS listener's `tls.certificateRefs` (a Gateway's or
//! a ListenerSet's listener), resolved into the certificate it presents.
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

use gateway_api::experimental::gateways::{GatewayListeners, GatewayListenersTlsMode};
use rustls::sign::CertifiedKey;

use crate::resources::{Gateway, Snapshot};
use crate::route::TlsMode;
use crate::translate::certificates::certified_key;
use crate::translate::conditions::Reason;
use crate::translate::references::{self, CoreRef, Referrer};

/// What a listener's TLS configuration resolved to.
#[derive(Debug, Default)]
pub(crate) struct ListenerTls {
    /// The certificate to terminate TLS with: the first reference that
    /// resolved. `None` when none did (the listener cannot be served).
    pub certificate: Option<Arc<CertifiedKey>>,
    /// `(reason, message)` of `ResolvedRefs=False`, when a reference did not
    /// resolve.
    pub unresolved: Option<(Reason, String)>,
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
                None => (*reason, message.clone()),
            });
        }
        self
    }
}

/// The TLS settings of any listener defined by `from` (see [`resolve`]):
/// an HTTPS listener's certificate and, when `frontend` gives its Gateway
/// (and that Gateway's namespace), the client certificate validation the
/// Gateway asks for its port; a TLS listener's certificate in `Terminate`
/// mode, none in `Passthrough` mode; nothing for other protocols.
pub(crate) fn for_listener(
    snapshot: &Snapshot,
    from: Referrer<'_>,
    listener: &GatewayListeners,
    frontend: Option<(&Gateway, &str)>,
) -> ListenerTls {
    match listener.protocol.as_str() {
        "HTTPS" => {
            let tls = resolve(snapshot, from, listener);
            match frontend {
                Some((gw, gw_ns)) => tls.with_frontend(snapshot, gw, gw_ns, listener),
                None => tls,
            }
        }
        "TLS" if tls_mode(listener) == TlsMode::Passthrough => ListenerTls::default(),
        "TLS" => resolve(snapshot, from, listener),
        _ => ListenerTls::default(),
    }
}

/// A TLS listener's `tls.mode` (the CRD's default is `Terminate`).
pub(crate) fn tls_mode(listener: &GatewayListeners) -> TlsMode {
    match listener.tls.as_ref().and_then(|t| t.mode.as_ref()) {
        Some(GatewayListenersTlsMode::Passthrough) => TlsMode::Passthrough,
        Some(GatewayListenersTlsMode::Terminate) | None => TlsMode::Terminate,
    }
}

/// Resolve the TLS settings of an HTTPS listener, or of a TLS listener in
/// `Terminate` mode, defined by `from` (a Gateway, or a ListenerSet: its
/// certificateRefs resolve from its own namespace, with ReferenceGrants to
/// its own kind).
pub(crate) fn resolve(
    snapshot: &Snapshot,
    from: Referrer<'_>,
    listener: &GatewayListeners,
) -> ListenerTls {
    let mut out = ListenerTls::default();
    let Some(tls) = &listener.tls else {
        out.unresolved = Some((
            Reason::InvalidCertificateRef,
            format!(
                "a {} listener that terminates TLS needs tls.certificateRefs",
                listener.protocol
            ),
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
            Reason::InvalidCertificateRef,
            "tls.certificateRefs is empty; mode Terminate needs a certificate".into(),
        ));
        return out;
    }
    let mut failures: Vec<(Reason, String)> = Vec::new();
    for (i, r) in refs.iter().enumerate() {
        let r = CoreRef {
            group: r.group.as_deref().unwrap_or(""),
            kind: r.kind.as_deref().unwrap_or("Secret"),
            name: &r.name,
            namespace: r.namespace.as_deref(),
        };
        match references::resolve(snapshot, from, r, certified_key) {
            Ok(key) => {
                out.certificate.get_or_insert(key);
            }
            Err(e) => {
                let (reason, message) =
                    e.reason(Reason::InvalidCertificateRef, Reason::InvalidCertificateRef);
                failures.push((reason, format!("tls.certificateRefs[{i}]: {message}")))
            }
        }
    }
    if let Some((reason, _)) = failures.first() {
        // RefNotPermitted says more than InvalidCertificateRef (the spec
        // reserves the latter for references that are allowed).
        let reason = if failures.iter().any(|f| f.0 == Reason::RefNotPermitted) {
            Reason::RefNotPermitted
        } else {
            *reason
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
