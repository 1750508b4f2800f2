//! BackendTLSPolicy: which backends the gateway reaches over TLS, and how.
//!
//! A policy targets a Service (all its ports, or the port its
//! `sectionName` names). Per the spec:
//! - `validation.hostname` is the SNI and the name the backend's certificate
//!   must be valid for, unless `subjectAltNames` are given: then the
//!   certificate must carry one of them, a `Hostname` as a DNS name (with
//!   the usual wildcard rules), a `URI` (a SPIFFE ID, say) as exactly that
//!   URI SAN; the chain is verified against the CA either way;
//! - `validation.caCertificateRefs` are ConfigMaps of the policy's
//!   namespace with the CA bundle under `ca.crt`. A reference that does not
//!   resolve gives `ResolvedRefs=False` (`InvalidCACertificateRef`, or
//!   `InvalidKind` for other kinds); when none resolves the policy is not
//!   accepted (`NoValidCACertificate`) and requests to the backend get a
//!   5xx (connections using an invalid CA "MUST fail");
//! - `wellKnownCACertificates` (system CAs) is not supported by sluice:
//!   `Accepted=False` with reason `Invalid`, as the spec says;
//! - two policies on the same target: the older (then alphabetically first)
//!   wins, the other gets `Accepted=False` with reason `Conflicted`.
//!
//! The Gateway's `spec.tls.backend.clientCertificateRef` is the certificate
//! the gateway presents to TLS backends. An invalid reference gives the
//! Gateway `ResolvedRefs=False` with reason `InvalidClientCertificateRef`
//! (`RefNotPermitted` across namespaces without a ReferenceGrant); the
//! Gateway stays accepted and backends are reached without a client
//! certificate.
//!
//! A policy's status lists one ancestor per Gateway whose routes use the
//! targeted Service.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use gateway_api::apis::standard::backendtlspolicies::{
    BackendTlsPolicyStatus, BackendTlsPolicyStatusAncestors,
    BackendTlsPolicyStatusAncestorsAncestorRef, BackendTlsPolicyValidationSubjectAltNames,
    BackendTlsPolicyValidationSubjectAltNamesType,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{
    WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor, verify_server_name,
};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::certificates::{KeyPair, ca_bundle, key_pair};
use super::conditions::{ConditionMaker, ConditionType, Reason, find, is_true, set_condition};
use super::meta::{namespace_of, sort_key};
use super::output::{ObjectStatus, StatusMetadata, api_version};
use super::references::{self, CoreRef, Referrer};
use crate::resources::{BackendTlsPolicy, CONTROLLER_NAME, GATEWAY_GROUP, Snapshot};
use crate::route::BackendTls;

/// `(reason, message)` of a condition that is False.
type Failure = (Reason, String);

/// `(namespace, name)` of a Gateway.
type GatewayKey = (String, String);

/// One BackendTLSPolicy, validated.
struct PolicyView<'a> {
    policy: &'a BackendTlsPolicy,
    namespace: &'a str,
    name: &'a str,
    /// `Accepted=False`: why the policy cannot be applied at all.
    rejected: Option<Failure>,
    /// Another policy on the same target takes precedence.
    conflicted: Option<String>,
    /// `ResolvedRefs=False`: the first CA reference that did not resolve.
    unresolved: Option<Failure>,
    /// The CA certificates of the references that resolved.
    roots: Vec<CertificateDer<'static>>,
    server_name: Option<ServerName<'static>>,
    /// `subjectAltNames` (verified instead of `hostname`).
    subject_alt_names: Vec<SubjectAltName>,
}

/// One of a policy's `subjectAltNames`.
#[derive(Debug, Clone, Hash)]
enum SubjectAltName {
    Hostname(ServerName<'static>),
    Uri(String),
}

/// What a route's backends resolve against while it is compiled, and what
/// the resolutions recorded (for the policies' status).
#[derive(Default)]
struct State {
    /// `(namespace, name)` of the Gateways the route being compiled is
    /// attached to.
    gateways: Vec<GatewayKey>,
    /// `(policy, gateway namespace, gateway name)`: the policy applies to
    /// a backend of a route of that Gateway.
    ancestors: BTreeSet<(usize, String, String)>,
    /// Settings built so far, by (policy, Gateway whose client certificate
    /// is presented).
    built: BTreeMap<(usize, Option<GatewayKey>), Arc<BackendTls>>,
}

/// The snapshot's BackendTLSPolicies and Gateway client certificates.
pub(crate) struct BackendTlsIndex<'a> {
    policies: Vec<PolicyView<'a>>,
    /// (Service namespace, Service name, sectionName) -> the policies
    /// targeting it, the one that takes precedence first.
    targets: BTreeMap<(&'a str, &'a str, Option<&'a str>), Vec<usize>>,
    /// Gateways naming a backend client certificate: what it resolved to.
    client_certs: BTreeMap<(&'a str, &'a str), Result<KeyPair, Failure>>,
    state: RefCell<State>,
}

impl<'a> BackendTlsIndex<'a> {
    pub fn new(snapshot: &'a Snapshot) -> Self {
        let mut sorted: Vec<&BackendTlsPolicy> = snapshot.backend_tls_policies.iter().collect();
        sorted.sort_by_key(|p| sort_key(&p.metadata));
        let mut policies: Vec<PolicyView<'a>> = sorted
            .into_iter()
            .map(|p| validate_policy(snapshot, p))
            .collect();
        let mut targets: BTreeMap<(&str, &str, Option<&str>), Vec<usize>> = BTreeMap::new();
        for (i, view) in policies.iter().enumerate() {
            let mut seen = BTreeSet::new();
            for t in &view.policy.spec.target_refs {
                if !t.group.is_empty() || t.kind != "Service" {
                    continue; // only Services are supported targets
                }
                let key = (
                    view.namespace,
                    t.name.as_str(),
                    t.section_name.as_deref().filter(|s| !s.is_empty()),
                );
                if seen.insert(key) {
                    targets.entry(key).or_default().push(i);
                }
            }
        }
        for list in targets.values() {
            let winner = list[0];
            for &loser in &list[1..] {
                let w = &policies[winner];
                policies[loser].conflicted = Some(format!(
                    "BackendTLSPolicy {}/{} targets the same Service and takes precedence (older, or same age and first by name)",
                    w.namespace, w.name
                ));
            }
        }
        let mut client_certs = BTreeMap::new();
        for gw in &snapshot.gateways {
            let Some(r) = gw
                .spec
                .tls
                .as_ref()
                .and_then(|t| t.backend.as_ref())
                .and_then(|b| b.client_certificate_ref.as_ref())
            else {
                continue;
            };
            let Some(name) = gw.metadata.name.as_deref() else {
                continue;
            };
            let gw_ns = namespace_of(&gw.metadata);
            let r = CoreRef {
                group: r.group.as_deref().unwrap_or(""),
                kind: r.kind.as_deref().unwrap_or("Secret"),
                name: &r.name,
                namespace: r.namespace.as_deref(),
            };
            let resolved = resolve_client_cert(snapshot, gw_ns, r);
            client_certs.insert((gw_ns, name), resolved);
        }
        BackendTlsIndex {
            policies,
            targets,
            client_certs,
            state: RefCell::new(State::default()),
        }
    }

    /// The Gateways the route about to be compiled is attached to: its
    /// backends are used by them (policy ancestors), and the first one's
    /// client certificate is presented to TLS backends.
    pub fn set_route_gateways(&self, gateways: Vec<(String, String)>) {
        self.state.borrow_mut().gateways = gateways;
    }

    /// The TLS settings of Service `ns/service`, port named `port_name`,
    /// when a policy targets it (the port's own policy before the whole
    /// Service's).
    pub fn for_backend(
        &self,
        ns: &str,
        service: &str,
        port_name: Option<&str>,
    ) -> Option<Arc<BackendTls>> {
        let by_port = port_name
            .filter(|p| !p.is_empty())
            .and_then(|p| self.targets.get(&(ns, service, Some(p))));
        let list = by_port.or_else(|| self.targets.get(&(ns, service, None)))?;
        let winner = list[0];
        let mut state = self.state.borrow_mut();
        let gateways = state.gateways.clone();
        for &i in list {
            for (gw_ns, gw_name) in &gateways {
                state.ancestors.insert((i, gw_ns.clone(), gw_name.clone()));
            }
        }
        // The client certificate of the first Gateway that names a valid one.
        let presenting = gateways.iter().find(|(n, g)| {
            matches!(
                self.client_certs.get(&(n.as_str(), g.as_str())),
                Some(Ok(_))
            )
        });
        let key = (winner, presenting.cloned());
        if let Some(tls) = state.built.get(&key) {
            return Some(tls.clone());
        }
        let client = presenting.and_then(|(n, g)| {
            self.client_certs
                .get(&(n.as_str(), g.as_str()))
                .and_then(|c| c.as_ref().ok())
        });
        let tls = Arc::new(self.build(winner, presenting, client));
        state.built.insert(key, tls.clone());
        Some(tls)
    }

    fn build(
        &self,
        policy: usize,
        gateway: Option<&(String, String)>,
        client: Option<&KeyPair>,
    ) -> BackendTls {
        let view = &self.policies[policy];
        let id = format!("{}/{}", view.namespace, view.name);
        let server_name = view
            .server_name
            .clone()
            .unwrap_or_else(|| ServerName::try_from("invalid.invalid").expect("a valid DNS name"));
        let config = match &view.rejected {
            Some((_, message)) => Err(message.clone()),
            None => client_config(&view.roots, &view.subject_alt_names, client),
        };
        let mut h = DefaultHasher::new();
        for r in &view.roots {
            r.as_ref().hash(&mut h);
        }
        view.subject_alt_names.hash(&mut h);
        if let Some(c) = client {
            for r in &c.chain {
                r.as_ref().hash(&mut h);
            }
            c.key.secret_der().hash(&mut h);
        }
        let sni = server_name.to_str();
        let presenter = gateway.map(|(n, g)| format!("{n}/{g}")).unwrap_or_default();
        BackendTls {
            key: format!(
                "{id}|{sni}|{presenter}|{}|{:016x}",
                config.is_ok(),
                h.finish()
            ),
            policy: id,
            server_name,
            config,
        }
    }

    /// The status of every policy some route of one of our Gateways uses:
    /// one ancestor per such Gateway, with `Accepted` and `ResolvedRefs`.
    pub fn policy_statuses(&self, now: Timestamp) -> Vec<ObjectStatus> {
        let state = self.state.borrow();
        let mut out = Vec::new();
        for (i, view) in self.policies.iter().enumerate() {
            let cond = ConditionMaker {
                generation: view.policy.metadata.generation.unwrap_or(0),
                now,
            };
            let ancestors: Vec<BackendTlsPolicyStatusAncestors> = state
                .ancestors
                .iter()
                .filter(|(p, _, _)| *p == i)
                .map(|(_, gw_ns, gw_name)| BackendTlsPolicyStatusAncestors {
                    ancestor_ref: BackendTlsPolicyStatusAncestorsAncestorRef {
                        group: Some(GATEWAY_GROUP.into()),
                        kind: Some("Gateway".into()),
                        name: gw_name.clone(),
                        namespace: Some(gw_ns.clone()),
                        port: None,
                        section_name: None,
                    },
                    conditions: view.conditions(&cond),
                    controller_name: CONTROLLER_NAME.into(),
                })
                .collect();
            if ancestors.is_empty() {
                continue;
            }
            out.push(ObjectStatus {
                api_version: api_version(),
                kind: "BackendTLSPolicy".into(),
                metadata: StatusMetadata {
                    name: view.name.to_string(),
                    namespace: Some(view.namespace.to_string()),
                    generation: cond.generation,
                },
                status: serde_json::to_value(BackendTlsPolicyStatus { ancestors })
                    .unwrap_or_default(),
            });
        }
        out
    }

    /// Add `ResolvedRefs` to the status of each Gateway that names a
    /// backend client certificate (True when it resolved). A False
    /// ResolvedRefs already there (set for another reference) is kept.
    pub fn apply_gateway_conditions(&self, objects: &mut [ObjectStatus], now: Timestamp) {
        for object in objects.iter_mut().filter(|o| o.kind == "Gateway") {
            let ns = object.metadata.namespace.as_deref().unwrap_or("");
            let Some(resolved) = self.client_certs.get(&(ns, object.metadata.name.as_str())) else {
                continue;
            };
            let cond = ConditionMaker {
                generation: object.metadata.generation,
                now,
            };
            let condition = match resolved {
                Ok(_) => cond.make(
                    ConditionType::ResolvedRefs,
                    true,
                    Reason::ResolvedRefs,
                    "all references resolved",
                ),
                Err((reason, message)) => {
                    cond.make(ConditionType::ResolvedRefs, false, *reason, message.clone())
                }
            };
            let Some(serde_json::Value::Array(list)) = object.status.get_mut("conditions") else {
                continue;
            };
            let mut conditions: Vec<Condition> = list
                .iter()
                .filter_map(|c| serde_json::from_value(c.clone()).ok())
                .collect();
            let already_false = find(&conditions, ConditionType::ResolvedRefs, false).is_some();
            if already_false && is_true(&condition) {
                continue;
            }
            set_condition(&mut conditions, condition);
            if let Ok(serde_json::Value::Array(v)) = serde_json::to_value(conditions) {
                *list = v;
            }
        }
    }
}

impl PolicyView<'_> {
    fn conditions(
        &self,
        cond: &ConditionMaker,
    ) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
        let accepted = if let Some((reason, message)) = &self.rejected {
            cond.make(ConditionType::Accepted, false, *reason, message.clone())
        } else if let Some(message) = &self.conflicted {
            cond.make(
                ConditionType::Accepted,
                false,
                Reason::Conflicted,
                message.clone(),
            )
        } else {
            cond.make(
                ConditionType::Accepted,
                true,
                Reason::Accepted,
                "policy accepted",
            )
        };
        let resolved = match &self.unresolved {
            Some((reason, message)) => {
                cond.make(ConditionType::ResolvedRefs, false, *reason, message.clone())
            }
            None => cond.make(
                ConditionType::ResolvedRefs,
                true,
                Reason::ResolvedRefs,
                "all references resolved",
            ),
        };
        vec![accepted, resolved]
    }
}

fn validate_policy<'a>(snapshot: &Snapshot, policy: &'a BackendTlsPolicy) -> PolicyView<'a> {
    let namespace = namespace_of(&policy.metadata);
    let name = policy.metadata.name.as_deref().unwrap_or("");
    let v = &policy.spec.validation;
    let mut view = PolicyView {
        policy,
        namespace,
        name,
        rejected: None,
        conflicted: None,
        unresolved: None,
        roots: Vec::new(),
        server_name: None,
        subject_alt_names: Vec::new(),
    };
    let refs = v.ca_certificate_refs.as_deref().unwrap_or_default();
    let mut failures: Vec<Failure> = Vec::new();
    // The references are local: ConfigMaps of the policy's namespace.
    let from = Referrer {
        kind: "BackendTLSPolicy",
        namespace,
    };
    for (i, r) in refs.iter().enumerate() {
        let r = CoreRef {
            group: &r.group,
            kind: &r.kind,
            name: &r.name,
            namespace: None,
        };
        match references::resolve(snapshot, from, r, ca_bundle) {
            Ok(certs) => view.roots.extend(certs),
            Err(e) => {
                let (reason, message) =
                    e.reason(Reason::InvalidKind, Reason::InvalidCACertificateRef);
                failures.push((
                    reason,
                    format!("spec.validation.caCertificateRefs[{i}]: {message}"),
                ));
            }
        }
    }
    if let Some((reason, _)) = failures.first() {
        let message = failures
            .iter()
            .map(|f| f.1.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        view.unresolved = Some((*reason, message.clone()));
        if view.roots.is_empty() {
            view.rejected = Some((
                Reason::NoValidCACertificate,
                format!("no CA certificate reference is valid: {message}"),
            ));
        }
    }
    if let Some(well_known) = v
        .well_known_ca_certificates
        .as_deref()
        .filter(|w| !w.is_empty())
    {
        view.rejected = Some((
            Reason::Invalid,
            format!(
                "spec.validation.wellKnownCACertificates {well_known:?} is not supported; name the CA in caCertificateRefs"
            ),
        ));
    } else if refs.is_empty() {
        view.rejected = Some((
            Reason::Invalid,
            "spec.validation needs caCertificateRefs (or wellKnownCACertificates)".into(),
        ));
    }
    match ServerName::try_from(v.hostname.clone()) {
        Ok(n @ ServerName::DnsName(_)) => view.server_name = Some(n),
        _ => {
            view.rejected.get_or_insert((
                Reason::Invalid,
                format!(
                    "spec.validation.hostname {:?} is not a DNS name",
                    v.hostname
                ),
            ));
        }
    }
    for (i, san) in v.subject_alt_names.iter().flatten().enumerate() {
        match subject_alt_name(san) {
            Ok(name) => view.subject_alt_names.push(name),
            Err(message) => {
                view.rejected.get_or_insert((
                    Reason::Invalid,
                    format!("spec.validation.subjectAltNames[{i}]: {message}"),
                ));
            }
        }
    }
    view
}

/// A `subjectAltNames` entry: the field its `type` names, which must be
/// set (the CRD's rule) and, for a Hostname, a DNS name.
fn subject_alt_name(
    san: &BackendTlsPolicyValidationSubjectAltNames,
) -> Result<SubjectAltName, String> {
    let value = |v: &Option<String>| v.as_deref().filter(|v| !v.is_empty()).map(str::to_owned);
    match san.r#type {
        BackendTlsPolicyValidationSubjectAltNamesType::Hostname => {
            let hostname = value(&san.hostname).ok_or("type Hostname needs hostname")?;
            match ServerName::try_from(hostname.clone()) {
                Ok(n @ ServerName::DnsName(_)) => Ok(SubjectAltName::Hostname(n)),
                _ => Err(format!("hostname {hostname:?} is not a DNS name")),
            }
        }
        BackendTlsPolicyValidationSubjectAltNamesType::Uri => value(&san.uri)
            .map(SubjectAltName::Uri)
            .ok_or_else(|| "type URI needs uri".to_owned()),
    }
}

/// The certificate the Gateway in `gateway_ns` presents to TLS backends,
/// from its `spec.tls.backend.clientCertificateRef`.
fn resolve_client_cert(
    snapshot: &Snapshot,
    gateway_ns: &str,
    r: CoreRef<'_>,
) -> Result<KeyPair, Failure> {
    let from = Referrer {
        kind: "Gateway",
        namespace: gateway_ns,
    };
    references::resolve(snapshot, from, r, key_pair).map_err(|e| {
        let (reason, message) = e.reason(
            Reason::InvalidClientCertificateRef,
            Reason::InvalidClientCertificateRef,
        );
        (
            reason,
            format!("spec.tls.backend.clientCertificateRef: {message}"),
        )
    })
}

/// The TLS client settings: trust `roots`, verify `subject_alt_names`
/// (when given) instead of the SNI, present `client` when given.
fn client_config(
    roots: &[CertificateDer<'static>],
    subject_alt_names: &[SubjectAltName],
    client: Option<&KeyPair>,
) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut store = RootCertStore::empty();
    for r in roots {
        store
            .add(r.clone())
            .map_err(|e| format!("CA certificate: {e}"))?;
    }
    let store = Arc::new(store);
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?;
    let builder = if subject_alt_names.is_empty() {
        let webpki = WebPkiServerVerifier::builder_with_provider(store, provider)
            .build()
            .map_err(|e| format!("certificate verifier: {e}"))?;
        builder.with_webpki_verifier(webpki)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SubjectAltNameVerifier {
                roots: store,
                algorithms: provider.signature_verification_algorithms,
                names: subject_alt_names.to_vec(),
            }))
    };
    let config = match client {
        Some(c) => builder
            .with_client_auth_cert(c.chain.clone(), c.key.clone_key())
            .map_err(|e| format!("client certificate: {e}"))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// `subjectAltNames`: the chain is verified against the roots as rustls
/// does, and the certificate must carry one of the names (the SNI is not
/// checked). rustls verifies DNS names; URI SANs are read with webpki,
/// which rustls verifies with (rustls checks no URI names).
#[derive(Debug)]
struct SubjectAltNameVerifier {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
    names: Vec<SubjectAltName>,
}

impl ServerCertVerifier for SubjectAltNameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        let uris: Vec<&str> = webpki::EndEntityCert::try_from(end_entity)
            .map(|c| c.valid_uri_names().collect())
            .unwrap_or_default();
        let matches = self.names.iter().any(|name| match name {
            SubjectAltName::Hostname(n) => verify_server_name(&cert, n).is_ok(),
            SubjectAltName::Uri(u) => uris.contains(&u.as_str()),
        });
        if matches {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::testing::snapshot;

    fn ca_pem() -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("CA").pem()
    }

    fn indent(pem: &str) -> String {
        pem.lines().map(|l| format!("    {l}\n")).collect()
    }

    fn ca_config_map(name: &str) -> String {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\ndata:\n  ca.crt: |\n{}---\n",
            indent(&ca_pem())
        )
    }

    fn policy(name: &str, created: &str, target: &str, ca_ref: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\n\
             metadata: {{name: {name}, creationTimestamp: '{created}'}}\n\
             spec:\n  targetRefs: [{target}]\n  validation:\n    caCertificateRefs: [{ca_ref}]\n    hostname: abc.example.com\n---\n"
        )
    }

    const SVC: &str = "{group: '', kind: Service, name: web}";
    const CA: &str = "{group: '', kind: ConfigMap, name: ca}";

    fn used_by_gateway(index: &BackendTlsIndex<'_>, port: Option<&str>) -> Option<Arc<BackendTls>> {
        index.set_route_gateways(vec![("default".into(), "gw".into())]);
        index.for_backend("default", "web", port)
    }

    fn conditions(index: &BackendTlsIndex<'_>, name: &str) -> Vec<(String, String, String)> {
        let statuses = index.policy_statuses(Timestamp::UNIX_EPOCH);
        let s = statuses
            .iter()
            .find(|s| s.metadata.name == name)
            .unwrap_or_else(|| panic!("no status for {name}: {statuses:?}"));
        let ancestors = s.status["ancestors"].as_array().expect("ancestors");
        assert_eq!(ancestors.len(), 1, "{}", s.status);
        assert_eq!(ancestors[0]["ancestorRef"]["name"], "gw");
        assert_eq!(ancestors[0]["ancestorRef"]["kind"], "Gateway");
        assert_eq!(ancestors[0]["controllerName"], CONTROLLER_NAME);
        ancestors[0]["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .map(|c| {
                let f = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                (f("type"), f("status"), f("reason"))
            })
            .collect()
    }

    fn cond(ty: &str, status: &str, reason: &str) -> (String, String, String) {
        (ty.into(), status.into(), reason.into())
    }

    #[test]
    fn a_valid_policy_makes_the_backend_tls_with_its_hostname() {
        let s = snapshot(&(ca_config_map("ca") + &policy("p", "2024-01-01T00:00:00Z", SVC, CA)));
        let index = BackendTlsIndex::new(&s);
        let tls = used_by_gateway(&index, Some("https")).expect("the Service is TLS");
        assert!(tls.config.is_ok(), "{:?}", tls.config);
        assert_eq!(tls.server_name.to_str(), "abc.example.com");
        assert_eq!(tls.policy, "default/p");
        assert_eq!(
            conditions(&index, "p"),
            [
                cond("Accepted", "True", "Accepted"),
                cond("ResolvedRefs", "True", "ResolvedRefs")
            ]
        );
        // Another Service is not affected, and a policy nobody uses has no status.
        assert!(index.for_backend("default", "other", None).is_none());
        let unused =
            snapshot(&(ca_config_map("ca") + &policy("p", "2024-01-01T00:00:00Z", SVC, CA)));
        assert!(
            BackendTlsIndex::new(&unused)
                .policy_statuses(Timestamp::UNIX_EPOCH)
                .is_empty()
        );
    }

    #[test]
    fn invalid_ca_references_reject_the_policy_and_fail_connections() {
        for (ca_ref, extra, reason) in [
            ("{group: '', kind: ConfigMap, name: missing}", String::new(), "InvalidCACertificateRef"),
            (
                "{group: '', kind: ConfigMap, name: bad}",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad}\ndata: {ca.crt: 'not a certificate'}\n---\n".to_string(),
                "InvalidCACertificateRef",
            ),
            ("{group: example.com, kind: Bundle, name: ca}", String::new(), "InvalidKind"),
        ] {
            let s = snapshot(&(extra + &policy("p", "2024-01-01T00:00:00Z", SVC, ca_ref)));
            let index = BackendTlsIndex::new(&s);
            let tls = used_by_gateway(&index, None).expect("the policy still applies");
            assert!(tls.config.is_err(), "{ca_ref}: connections must fail");
            assert_eq!(
                conditions(&index, "p"),
                [
                    cond("Accepted", "False", "NoValidCACertificate"),
                    cond("ResolvedRefs", "False", reason)
                ],
                "{ca_ref}"
            );
        }
    }

    #[test]
    fn the_older_policy_wins_a_conflict() {
        let s = snapshot(
            &(ca_config_map("ca")
                + &policy("newer", "2024-02-01T00:00:00Z", SVC, CA)
                + &policy("older", "2024-01-01T00:00:00Z", SVC, CA)),
        );
        let index = BackendTlsIndex::new(&s);
        let tls = used_by_gateway(&index, None).expect("TLS");
        assert_eq!(tls.policy, "default/older");
        assert_eq!(
            conditions(&index, "older")[0],
            cond("Accepted", "True", "Accepted")
        );
        assert_eq!(
            conditions(&index, "newer")[0],
            cond("Accepted", "False", "Conflicted")
        );
    }

    #[test]
    fn section_name_selects_the_port_by_name() {
        let target = "{group: '', kind: Service, name: web, sectionName: https}";
        let s = snapshot(&(ca_config_map("ca") + &policy("p", "2024-01-01T00:00:00Z", target, CA)));
        let index = BackendTlsIndex::new(&s);
        assert!(used_by_gateway(&index, Some("https")).is_some());
        assert!(used_by_gateway(&index, Some("http")).is_none());
        assert!(used_by_gateway(&index, None).is_none());
    }

    #[test]
    fn system_cas_are_not_supported() {
        let well_known = "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {name: p}\n\
            spec:\n  targetRefs: [{group: '', kind: Service, name: web}]\n  validation:\n    wellKnownCACertificates: System\n    hostname: abc.example.com\n";
        let s = snapshot(well_known);
        let index = BackendTlsIndex::new(&s);
        assert!(used_by_gateway(&index, None).expect("TLS").config.is_err());
        assert_eq!(
            conditions(&index, "p")[0],
            cond("Accepted", "False", "Invalid")
        );
    }

    #[test]
    fn subject_alt_names_need_the_field_their_type_names() {
        let with_sans = |sans: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {{name: p}}\n\
                 spec:\n  targetRefs: [{SVC}]\n  validation:\n    caCertificateRefs: [{CA}]\n    hostname: abc.example.com\n    subjectAltNames: [{sans}]\n---\n"
            )
        };
        for (sans, accepted) in [
            (
                "{type: URI, uri: 'spiffe://abc.example.com/test-identity'}",
                true,
            ),
            ("{type: Hostname, hostname: other.example.com}", true),
            ("{type: URI, hostname: other.example.com}", false),
            ("{type: Hostname, uri: 'spiffe://abc.example.com/x'}", false),
            ("{type: Hostname, hostname: '10.0.0.1'}", false),
        ] {
            let s = snapshot(&(ca_config_map("ca") + &with_sans(sans)));
            let index = BackendTlsIndex::new(&s);
            let tls = used_by_gateway(&index, None).expect("TLS");
            assert_eq!(tls.config.is_ok(), accepted, "{sans}: {:?}", tls.config);
            let want = if accepted {
                cond("Accepted", "True", "Accepted")
            } else {
                cond("Accepted", "False", "Invalid")
            };
            assert_eq!(conditions(&index, "p")[0], want, "{sans}");
        }
    }

    fn client_cert_secret(ns: &str, name: &str) -> String {
        let c = rcgen::generate_simple_self_signed(vec!["client.example".to_string()])
            .expect("certificate");
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {ns}}}\ntype: kubernetes.io/tls\n\
             stringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\n",
            indent(&c.cert.pem()),
            indent(&c.signing_key.serialize_pem())
        )
    }

    fn gateway_with_client_cert(name: &str, cert_ref: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}}}\n\
             spec:\n  gatewayClassName: sluice\n  listeners: [{{name: http, port: 8080, protocol: HTTP}}]\n\
             \x20 tls:\n    backend:\n      clientCertificateRef: {cert_ref}\n---\n"
        )
    }

    #[test]
    fn gateway_client_certificate_references() {
        let yaml = client_cert_secret("default", "client")
            + &client_cert_secret("other", "client")
            + "apiVersion: v1\nkind: Secret\nmetadata: {name: empty}\ntype: Opaque\ndata: {}\n---\n"
            + &gateway_with_client_cert("ok", "{name: client}")
            + &gateway_with_client_cert("missing", "{name: nope}")
            + &gateway_with_client_cert("kind", "{kind: WrongKind, name: client}")
            + &gateway_with_client_cert(
                "group",
                "{group: wrong.example.com, kind: Secret, name: client}",
            )
            + &gateway_with_client_cert("malformed", "{name: empty}")
            + &gateway_with_client_cert("elsewhere", "{name: client, namespace: other}");
        let s = snapshot(&yaml);
        let index = BackendTlsIndex::new(&s);
        let reason = |gw: &str| match &index.client_certs[&("default", gw)] {
            Ok(_) => "ok",
            Err((reason, _)) => reason.as_str(),
        };
        assert_eq!(reason("ok"), "ok");
        for gw in ["missing", "kind", "group", "malformed"] {
            assert_eq!(reason(gw), "InvalidClientCertificateRef", "{gw}");
        }
        assert_eq!(reason("elsewhere"), "RefNotPermitted");

        // The Gateway's ResolvedRefs condition, added to its status.
        let mut objects = vec![ObjectStatus {
            api_version: api_version(),
            kind: "Gateway".into(),
            metadata: StatusMetadata {
                name: "missing".into(),
                namespace: Some("default".into()),
                generation: 3,
            },
            status: serde_json::json!({"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "observedGeneration": 3, "lastTransitionTime": "1970-01-01T00:00:00Z"}]}),
        }];
        index.apply_gateway_conditions(&mut objects, Timestamp::UNIX_EPOCH);
        let conds = objects[0].status["conditions"]
            .as_array()
            .expect("conditions");
        assert_eq!(conds.len(), 2);
        assert_eq!(conds[1]["type"], "ResolvedRefs");
        assert_eq!(conds[1]["status"], "False");
        assert_eq!(conds[1]["reason"], "InvalidClientCertificateRef");
        assert_eq!(conds[1]["observedGeneration"], 3);
        assert_eq!(conds[0]["type"], "Accepted", "other conditions are kept");
    }

    #[test]
    fn the_gateway_client_certificate_is_presented_and_keys_differ() {
        let yaml = ca_config_map("ca")
            + &policy("p", "2024-01-01T00:00:00Z", SVC, CA)
            + &client_cert_secret("default", "client")
            + &gateway_with_client_cert("gw", "{name: client}");
        let s = snapshot(&yaml);
        let index = BackendTlsIndex::new(&s);
        let with_cert = used_by_gateway(&index, None).expect("TLS");
        let config = with_cert.config.as_ref().expect("valid");
        assert!(config.client_auth_cert_resolver.has_certs());
        index.set_route_gateways(vec![("default".into(), "plain".into())]);
        let without = index.for_backend("default", "web", None).expect("TLS");
        assert!(
            !without
                .config
                .as_ref()
                .expect("valid")
                .client_auth_cert_resolver
                .has_certs()
        );
        assert_ne!(with_cert.key, without.key, "pools must not be shared");
    }
}
