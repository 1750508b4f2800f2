//! References from Gateway API objects to core objects in a namespace, and
//! the ReferenceGrants that allow them across namespaces.
//!
//! Several objects name Secrets and ConfigMaps: listeners of Gateways and
//! ListenerSets (`tls.certificateRefs`), a Gateway's frontend validation
//! (`caCertificateRefs`) and backend client certificate, BackendTLSPolicies
//! (`caCertificateRefs`); HTTPRoutes name Services. Per the spec a
//! reference into another namespace is only valid when a ReferenceGrant in
//! that namespace lets the referring kind, from the referrer's namespace,
//! refer to the target kind (and name, when the grant names one). Grants
//! are not inherited: a grant to Gateways does not cover ListenerSets.
//!
//! Each caller maps [`RefError`] onto the reasons its own status uses.

use k8s_openapi::Metadata;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::conditions::Reason;
use super::meta::namespace_of;
use crate::resources::{ConfigMap, GATEWAY_GROUP, Secret, Snapshot};

/// The object that holds a reference: a kind of group
/// `gateway.networking.k8s.io` (`Gateway`, `ListenerSet`, `HTTPRoute`,
/// `BackendTLSPolicy`) in a namespace.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Referrer<'a> {
    pub kind: &'static str,
    pub namespace: &'a str,
}

/// A reference to a core object, as the spec shapes it (group `""` is the
/// core group; no namespace means the referrer's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CoreRef<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
}

/// Why a reference did not resolve. The message names the object; the
/// caller adds the field and picks the reason its status reports.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RefError {
    /// Another group or kind than the one the field takes.
    UnsupportedKind(String),
    /// Another namespace, and no ReferenceGrant allows it (`RefNotPermitted`).
    NotPermitted(String),
    /// The object does not exist, or does not hold what the field needs.
    Invalid(String),
}

impl RefError {
    /// `(reason, message)`: `unsupported_kind` for [`RefError::UnsupportedKind`],
    /// `RefNotPermitted`, `invalid` for [`RefError::Invalid`].
    pub fn reason(self, unsupported_kind: Reason, invalid: Reason) -> (Reason, String) {
        match self {
            RefError::UnsupportedKind(m) => (unsupported_kind, m),
            RefError::NotPermitted(m) => (Reason::RefNotPermitted, m),
            RefError::Invalid(m) => (invalid, m),
        }
    }
}

/// Does a ReferenceGrant in `to_ns` allow `from` to refer to the core
/// object `to_kind` `to_name`?
pub(crate) fn reference_granted(
    snapshot: &Snapshot,
    from: Referrer<'_>,
    to_kind: &str,
    to_ns: &str,
    to_name: &str,
) -> bool {
    snapshot
        .reference_grants
        .iter()
        .filter(|g| namespace_of(&g.metadata) == to_ns)
        .any(|g| {
            g.spec.from.iter().any(|f| {
                f.group == GATEWAY_GROUP && f.kind == from.kind && f.namespace == from.namespace
            }) && g.spec.to.iter().any(|t| {
                t.group.is_empty()
                    && t.kind == to_kind
                    && t.name.as_deref().is_none_or(|n| n == to_name)
            })
        })
}

/// Is a reference from `from` to `to_kind` `to_name` in `to_ns` allowed:
/// the same namespace, or granted.
pub(crate) fn reference_allowed(
    snapshot: &Snapshot,
    from: Referrer<'_>,
    to_kind: &str,
    to_ns: &str,
    to_name: &str,
) -> bool {
    to_ns == from.namespace || reference_granted(snapshot, from, to_kind, to_ns, to_name)
}

/// A core kind the snapshot holds and references can name.
pub(crate) trait CoreObject:
    k8s_openapi::Resource + Metadata<Ty = ObjectMeta> + Sized
{
    fn all(snapshot: &Snapshot) -> &[Self];
}

impl CoreObject for Secret {
    fn all(snapshot: &Snapshot) -> &[Self] {
        &snapshot.secrets
    }
}

impl CoreObject for ConfigMap {
    fn all(snapshot: &Snapshot) -> &[Self] {
        &snapshot.config_maps
    }
}

/// Resolve `r`, held by `from`, to a `T` (a core Secret or ConfigMap) and
/// read what the field needs from it with `read`: the kind must be `T`'s,
/// another namespace needs a ReferenceGrant, the object must exist and
/// `read` must succeed (its error becomes [`RefError::Invalid`], naming the
/// object).
pub(crate) fn resolve<T: CoreObject, U>(
    snapshot: &Snapshot,
    from: Referrer<'_>,
    r: CoreRef<'_>,
    read: impl FnOnce(&T) -> Result<U, String>,
) -> Result<U, RefError> {
    let kind = T::KIND;
    if !r.group.is_empty() || r.kind != kind {
        let what = if r.group.is_empty() {
            r.kind.to_string()
        } else {
            format!("{}.{}", r.kind, r.group)
        };
        return Err(RefError::UnsupportedKind(format!(
            "{what} {} is not supported; sluice reads core {kind}s",
            r.name
        )));
    }
    let ns = r.namespace.unwrap_or(from.namespace);
    let name = r.name;
    if !reference_allowed(snapshot, from, kind, ns, name) {
        return Err(RefError::NotPermitted(format!(
            "{kind} {ns}/{name}: no ReferenceGrant in namespace {ns} allows {}s from namespace {} to refer to it",
            from.kind, from.namespace
        )));
    }
    let object = T::all(snapshot)
        .iter()
        .find(|o| {
            let meta = o.metadata();
            meta.name.as_deref() == Some(name) && namespace_of(meta) == ns
        })
        .ok_or_else(|| RefError::Invalid(format!("{kind} {ns}/{name} not found")))?;
    read(object).map_err(|why| RefError::Invalid(format!("{kind} {ns}/{name}: {why}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::testing::snapshot;

    const OBJECTS: &str = "apiVersion: v1
kind: Secret
metadata: {name: cert, namespace: secrets}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ca, namespace: secrets}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: gateways-to-cert, namespace: secrets}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}]
  to: [{group: '', kind: Secret, name: cert}]
";

    fn secret_ref(name: &'static str, namespace: Option<&'static str>) -> CoreRef<'static> {
        CoreRef {
            group: "",
            kind: "Secret",
            name,
            namespace,
        }
    }

    fn name_of<T: CoreObject>(o: &T) -> Result<String, String> {
        Ok(o.metadata().name.clone().unwrap_or_default())
    }

    const GATEWAY: Referrer<'static> = Referrer {
        kind: "Gateway",
        namespace: "infra",
    };

    #[test]
    fn a_grant_covers_its_from_kind_and_namespace_and_its_to_kind_and_name() {
        let s = snapshot(OBJECTS);
        let granted = |kind, ns, to_kind, to_name| {
            reference_granted(
                &s,
                Referrer {
                    kind,
                    namespace: ns,
                },
                to_kind,
                "secrets",
                to_name,
            )
        };
        assert!(granted("Gateway", "infra", "Secret", "cert"));
        // Not inherited by other kinds, namespaces, target kinds or names.
        assert!(!granted("ListenerSet", "infra", "Secret", "cert"));
        assert!(!granted("Gateway", "other", "Secret", "cert"));
        assert!(!granted("Gateway", "infra", "ConfigMap", "cert"));
        assert!(!granted("Gateway", "infra", "Secret", "other"));
        // Nothing is needed within the namespace.
        let local = Referrer {
            kind: "ListenerSet",
            namespace: "secrets",
        };
        assert!(reference_allowed(&s, local, "Secret", "secrets", "x"));
    }

    #[test]
    fn resolve_checks_kind_grant_and_existence_in_that_order() {
        let s = snapshot(OBJECTS);
        let ok = resolve::<Secret, _>(&s, GATEWAY, secret_ref("cert", Some("secrets")), name_of);
        assert_eq!(ok, Ok("cert".to_string()));

        let wrong_kind = CoreRef {
            group: "example.com",
            ..secret_ref("cert", Some("secrets"))
        };
        assert!(matches!(
            resolve::<Secret, _>(&s, GATEWAY, wrong_kind, name_of),
            Err(RefError::UnsupportedKind(m)) if m == "Secret.example.com cert is not supported; sluice reads core Secrets"
        ));
        assert!(matches!(
            resolve::<ConfigMap, _>(&s, GATEWAY, secret_ref("cert", Some("secrets")), name_of),
            Err(RefError::UnsupportedKind(_))
        ));

        let set = Referrer {
            kind: "ListenerSet",
            namespace: "infra",
        };
        assert_eq!(
            resolve::<Secret, _>(&s, set, secret_ref("cert", Some("secrets")), name_of),
            Err(RefError::NotPermitted(
                "Secret secrets/cert: no ReferenceGrant in namespace secrets allows ListenerSets from namespace infra to refer to it".into()
            ))
        );
        assert_eq!(
            resolve::<Secret, _>(&s, GATEWAY, secret_ref("gone", None), name_of),
            Err(RefError::Invalid("Secret infra/gone not found".into()))
        );
        assert_eq!(
            resolve::<Secret, _>(&s, GATEWAY, secret_ref("cert", Some("secrets")), |_| {
                Err::<(), _>("tls.crt is missing".into())
            }),
            Err(RefError::Invalid(
                "Secret secrets/cert: tls.crt is missing".into()
            ))
        );
    }

    #[test]
    fn ref_errors_map_onto_the_callers_reasons() {
        let r = |e: RefError| {
            e.reason(Reason::InvalidKind, Reason::InvalidCACertificateRef)
                .0
        };
        assert_eq!(
            r(RefError::UnsupportedKind(String::new())),
            Reason::InvalidKind
        );
        assert_eq!(
            r(RefError::NotPermitted(String::new())),
            Reason::RefNotPermitted
        );
        assert_eq!(
            r(RefError::Invalid(String::new())),
            Reason::InvalidCACertificateRef
        );
    }
}
