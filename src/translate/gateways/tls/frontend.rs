//! Frontend client certificate validation (GEP-91): a Gateway's
//! `spec.tls.frontend`, resolved for each of its HTTPS listeners.
//!
//! Per the spec, `perPort` "overrides the default configuration for all
//! Listeners handling HTTPS traffic that match this port"; HTTP listeners
//! are never affected. Each `caCertificateRefs` entry names a ConfigMap with
//! the PEM CA bundle under `ca.crt`. An invalid reference sets the matching
//! listeners' `ResolvedRefs` to False (`InvalidCACertificateKind` for a kind
//! other than ConfigMap, `RefNotPermitted` across namespaces without a
//! ReferenceGrant, `InvalidCACertificateRef` otherwise), and "if ALL
//! CACertificateRefs are invalid" the listener is not accepted
//! (`Accepted=False`, `NoValidCACertificate`). Only those listeners are
//! affected: the others keep serving.
//!
//! `mode: AllowInsecureFallback` serves clients without a valid certificate;
//! the Gateway then reports `InsecureFrontendValidationMode=True`.

use std::sync::Arc;

use gateway_api::experimental::gateways::{
    GatewayListeners, GatewayTlsFrontendDefaultValidationMode,
    GatewayTlsFrontendPerPortTlsValidationMode,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;

use super::super::GatewayView;
use crate::resources::{Gateway, Snapshot};
use crate::route::ClientValidation;
use crate::translate::certificates::ca_bundle;
use crate::translate::conditions::{ConditionType, Reason};
use crate::translate::references::{self, CoreRef, Referrer};

/// What `spec.tls.frontend` means for one listener.
#[derive(Debug, Default)]
pub(crate) struct ListenerFrontend {
    /// The validation TLS handshakes on the listener's port go through, when
    /// the listener asks for one and at least one CA certificate resolved.
    pub validation: Option<Arc<ClientValidation>>,
    /// `(reason, message)` of `ResolvedRefs=False`, when a CA reference did
    /// not resolve.
    pub unresolved: Option<(Reason, String)>,
    /// Every CA reference is invalid: the message of `Accepted=False` with
    /// reason `NoValidCACertificate` (the listener is not served).
    pub no_valid_ca: Option<String>,
    /// The listener's validation mode is `AllowInsecureFallback`.
    pub insecure_fallback: bool,
}

impl ListenerFrontend {
    /// Can the listener be accepted as far as client validation goes?
    pub fn accepted(&self) -> bool {
        self.no_valid_ca.is_none()
    }

    /// The message of `Accepted=False` (`NoValidCACertificate`).
    pub fn rejection(&self) -> String {
        self.no_valid_ca.clone().unwrap_or_default()
    }
}

/// The validation settings that apply to a listener: its port's `perPort`
/// entry, else `default`. `None` when neither asks for validation.
fn effective<'a>(gw: &'a Gateway, listener: &GatewayListeners) -> Option<(Vec<CoreRef<'a>>, bool)> {
    let frontend = gw.spec.tls.as_ref()?.frontend.as_ref()?;
    if let Some(per_port) = frontend
        .per_port
        .iter()
        .flatten()
        .find(|p| p.port == listener.port)
    {
        let v = per_port.tls.validation.as_ref()?;
        let refs = v
            .ca_certificate_refs
            .iter()
            .map(|r| CoreRef {
                group: &r.group,
                kind: &r.kind,
                name: &r.name,
                namespace: r.namespace.as_deref(),
            })
            .collect();
        let insecure = matches!(
            v.mode,
            Some(GatewayTlsFrontendPerPortTlsValidationMode::AllowInsecureFallback)
        );
        return Some((refs, insecure));
    }
    let v = frontend.default.validation.as_ref()?;
    let refs = v
        .ca_certificate_refs
        .iter()
        .map(|r| CoreRef {
            group: &r.group,
            kind: &r.kind,
            name: &r.name,
            namespace: r.namespace.as_deref(),
        })
        .collect();
    let insecure = matches!(
        v.mode,
        Some(GatewayTlsFrontendDefaultValidationMode::AllowInsecureFallback)
    );
    Some((refs, insecure))
}

/// Resolve the client validation of `listener`, of Gateway `gw` in
/// namespace `gateway_ns`. Listeners other than HTTPS get none.
pub(crate) fn resolve(
    snapshot: &Snapshot,
    gw: &Gateway,
    gateway_ns: &str,
    listener: &GatewayListeners,
) -> ListenerFrontend {
    let mut out = ListenerFrontend::default();
    if listener.protocol != "HTTPS" {
        return out;
    }
    let Some((refs, insecure_fallback)) = effective(gw, listener) else {
        return out;
    };
    out.insecure_fallback = insecure_fallback;
    let source = if gw
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.frontend.as_ref())
        .and_then(|f| f.per_port.as_ref())
        .is_some_and(|p| p.iter().any(|p| p.port == listener.port))
    {
        format!("spec.tls.frontend.perPort[port {}]", listener.port)
    } else {
        "spec.tls.frontend.default".to_string()
    };
    let mut roots = RootCertStore::empty();
    let mut failures: Vec<(Reason, String)> = Vec::new();
    let from = Referrer {
        kind: "Gateway",
        namespace: gateway_ns,
    };
    for (i, r) in refs.iter().enumerate() {
        match references::resolve(snapshot, from, *r, ca_bundle) {
            Ok(certs) => {
                let (_, unusable) = roots.add_parsable_certificates(certs);
                debug_assert_eq!(unusable, 0, "ca_bundle checked every certificate");
            }
            Err(e) => {
                let (reason, message) = e.reason(
                    Reason::InvalidCACertificateKind,
                    Reason::InvalidCACertificateRef,
                );
                failures.push((
                    reason,
                    format!("{source}.validation.caCertificateRefs[{i}]: {message}"),
                ))
            }
        }
    }
    if refs.is_empty() {
        failures.push((
            Reason::InvalidCACertificateRef,
            format!("{source}.validation.caCertificateRefs is empty"),
        ));
    }
    let message = failures
        .iter()
        .map(|f| f.1.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    if let Some((reason, _)) = failures.first() {
        out.unresolved = Some((*reason, message.clone()));
    }
    if roots.is_empty() {
        out.no_valid_ca = Some(format!("no CA certificate of {source} is valid: {message}"));
        return out;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    match WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build() {
        Ok(verifier) => {
            out.validation = Some(Arc::new(ClientValidation {
                verifier,
                insecure_fallback,
            }))
        }
        Err(e) => {
            out.no_valid_ca = Some(format!(
                "the CA certificates of {source} cannot validate clients: {e}"
            ));
        }
    }
    out
}

/// The Gateway's `InsecureFrontendValidationMode` condition, when one of
/// its HTTPS listeners serves clients without a valid certificate.
pub(crate) fn insecure_condition(view: &GatewayView) -> Option<Condition> {
    let names: Vec<&str> = view
        .listeners
        .iter()
        .filter(|l| l.frontend.insecure_fallback)
        .map(|l| l.name.as_str())
        .collect();
    (!names.is_empty()).then(|| {
        view.cond.make(
            ConditionType::InsecureFrontendValidationMode,
            true,
            Reason::ConfigurationChanged,
            format!(
                "listener(s) {} validate client certificates with mode AllowInsecureFallback: clients without a valid certificate are served",
                names.join(", ")
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{ConfigMap, ReferenceGrant};
    use std::collections::BTreeMap;

    fn ca_pem() -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    fn config_map(ns: &str, name: &str, ca: Option<&str>) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some(ns.into());
        c.data = ca.map(|ca| BTreeMap::from([("ca.crt".to_string(), ca.to_string())]));
        c
    }

    /// A Gateway in `infra` with HTTPS listeners on 443 and 8443 and an
    /// HTTP one on 80, and the given `spec.tls.frontend` (YAML).
    fn gateway(frontend: &str) -> Gateway {
        let indented: String = frontend.lines().map(|l| format!("      {l}\n")).collect();
        let yaml = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: gw\n  namespace: infra\nspec:\n  gatewayClassName: sluice\n  tls:\n    frontend:\n{indented}  listeners:\n  - {{name: https, port: 443, protocol: HTTPS}}\n  - {{name: https-8443, port: 8443, protocol: HTTPS}}\n  - {{name: http, port: 80, protocol: HTTP}}\n"
        );
        crate::yaml::from_str(&yaml).unwrap()
    }

    fn listener<'a>(gw: &'a Gateway, name: &str) -> &'a GatewayListeners {
        gw.spec.listeners.iter().find(|l| l.name == name).unwrap()
    }

    fn snapshot(config_maps: Vec<ConfigMap>) -> Snapshot {
        Snapshot {
            config_maps,
            ..Snapshot::default()
        }
    }

    const DEFAULT_AND_PER_PORT: &str = "default:
  validation:
    caCertificateRefs: [{kind: ConfigMap, group: '', name: default-ca}]
perPort:
- port: 8443
  tls:
    validation:
      mode: AllowInsecureFallback
      caCertificateRefs: [{kind: ConfigMap, group: '', name: per-port-ca}]
";

    #[test]
    fn per_port_overrides_default_and_http_listeners_are_untouched() {
        let ca = ca_pem();
        let s = snapshot(vec![
            config_map("infra", "default-ca", Some(&ca)),
            config_map("infra", "per-port-ca", Some(&ca)),
        ]);
        let gw = gateway(DEFAULT_AND_PER_PORT);
        let on_443 = resolve(&s, &gw, "infra", listener(&gw, "https"));
        let v = on_443
            .validation
            .clone()
            .expect("443 validates with the default");
        assert!(!v.insecure_fallback && !on_443.insecure_fallback);
        assert!(on_443.unresolved.is_none() && on_443.accepted());

        let on_8443 = resolve(&s, &gw, "infra", listener(&gw, "https-8443"));
        let v = on_8443
            .validation
            .clone()
            .expect("8443 validates with its own");
        assert!(v.insecure_fallback && on_8443.insecure_fallback);

        let http = resolve(&s, &gw, "infra", listener(&gw, "http"));
        assert!(http.validation.is_none() && http.unresolved.is_none() && http.accepted());
    }

    #[test]
    fn a_per_port_entry_without_validation_turns_it_off_for_that_port() {
        let ca = ca_pem();
        let s = snapshot(vec![config_map("infra", "default-ca", Some(&ca))]);
        let gw = gateway(
            "default:
  validation:
    caCertificateRefs: [{kind: ConfigMap, group: '', name: default-ca}]
perPort:
- {port: 8443, tls: {}}
",
        );
        assert!(
            resolve(&s, &gw, "infra", listener(&gw, "https"))
                .validation
                .is_some()
        );
        let off = resolve(&s, &gw, "infra", listener(&gw, "https-8443"));
        assert!(off.validation.is_none() && off.accepted());
    }

    #[test]
    fn invalid_references_give_the_spec_reasons_and_no_valid_ca() {
        let ca = ca_pem();
        let s = snapshot(vec![
            config_map("web", "web-ca", Some(&ca)),
            config_map("infra", "no-key", None),
            config_map("infra", "garbage", Some("Hello world\n")),
        ]);
        for (reference, reason) in [
            (
                "{kind: ConfigMap, group: '', name: missing}",
                Reason::InvalidCACertificateRef,
            ),
            (
                "{kind: ConfigMap, group: '', name: no-key}",
                Reason::InvalidCACertificateRef,
            ),
            (
                "{kind: ConfigMap, group: '', name: garbage}",
                Reason::InvalidCACertificateRef,
            ),
            (
                "{kind: Service, group: '', name: infra-backend-v2}",
                Reason::InvalidCACertificateKind,
            ),
            (
                "{kind: ConfigMap, group: example.com, name: default-ca}",
                Reason::InvalidCACertificateKind,
            ),
            (
                "{kind: ConfigMap, group: '', name: web-ca, namespace: web}",
                Reason::RefNotPermitted,
            ),
        ] {
            let gw = gateway(&format!(
                "default:\n  validation:\n    caCertificateRefs: [{reference}]\n"
            ));
            let out = resolve(&s, &gw, "infra", listener(&gw, "https"));
            let (got, message) = out.unresolved.clone().expect(reference);
            assert_eq!(got, reason, "{reference}: {message}");
            assert!(message.contains("spec.tls.frontend.default"), "{message}");
            assert!(!out.accepted() && out.validation.is_none(), "{reference}");
            assert!(out.rejection().contains("no CA certificate"), "{reference}");
        }
    }

    #[test]
    fn one_valid_reference_keeps_the_listener_accepted() {
        let ca = ca_pem();
        let s = snapshot(vec![config_map("infra", "good", Some(&ca))]);
        let gw = gateway(
            "default:
  validation:
    caCertificateRefs:
    - {kind: ConfigMap, group: '', name: missing}
    - {kind: ConfigMap, group: '', name: good}
",
        );
        let out = resolve(&s, &gw, "infra", listener(&gw, "https"));
        assert_eq!(
            out.unresolved.as_ref().unwrap().0,
            Reason::InvalidCACertificateRef
        );
        assert!(out.accepted() && out.validation.is_some());
    }

    #[test]
    fn a_reference_grant_to_config_maps_allows_another_namespace() {
        let ca = ca_pem();
        let mut s = snapshot(vec![config_map("web", "web-ca", Some(&ca))]);
        let grant: ReferenceGrant = crate::yaml::from_str(
            "apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: g, namespace: web}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}]
  to: [{group: '', kind: Secret}]
",
        )
        .unwrap();
        s.reference_grants.push(grant.clone());
        let gw = gateway(
            "default:
  validation:
    caCertificateRefs: [{kind: ConfigMap, group: '', name: web-ca, namespace: web}]
",
        );
        // A grant to Secrets does not cover ConfigMaps.
        let out = resolve(&s, &gw, "infra", listener(&gw, "https"));
        assert_eq!(out.unresolved.unwrap().0, Reason::RefNotPermitted);
        let mut to_config_maps = grant;
        to_config_maps.spec.to[0].kind = "ConfigMap".into();
        s.reference_grants = vec![to_config_maps];
        let out = resolve(&s, &gw, "infra", listener(&gw, "https"));
        assert!(out.unresolved.is_none() && out.validation.is_some());
    }

    #[test]
    fn no_frontend_means_no_validation() {
        let s = snapshot(vec![]);
        let mut gw = gateway(DEFAULT_AND_PER_PORT);
        gw.spec.tls = None;
        let out = resolve(&s, &gw, "infra", listener(&gw, "https"));
        assert!(out.validation.is_none() && out.unresolved.is_none() && out.accepted());
    }
}
