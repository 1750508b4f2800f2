//! Status conditions: the types and reasons sluice reports (one typed
//! vocabulary, written as the spec writes them), and building conditions
//! that carry the generation they were computed from (`observedGeneration`)
//! and the translation time.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// An enum whose variants are spec strings: `as_str` is the variant's name,
/// so a variant and the string it writes cannot drift apart.
macro_rules! vocabulary {
    ($(#[$doc:meta])* $name:ident { $($(#[$variant_doc:meta])* $variant:ident,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum $name {
            $($(#[$variant_doc])* $variant,)*
        }

        impl $name {
            /// Every value, in declaration order.
            pub(crate) const ALL: &[$name] = &[$($name::$variant,)*];

            /// The string the spec (and a condition) uses.
            pub(crate) const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant),)*
                }
            }

            /// The value a condition's string names (`None` for a string
            /// outside the vocabulary).
            #[allow(dead_code, reason = "not every vocabulary is read back")]
            pub(crate) fn parse(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

vocabulary! {
    /// A condition's `type`.
    ConditionType {
        /// Every object sluice reports on: taken for processing.
        Accepted,
        /// Gateways, their listeners, ListenerSets: served.
        Programmed,
        /// Routes, listeners, Gateways, BackendTLSPolicies: every reference
        /// resolved.
        ResolvedRefs,
        /// Listeners: indistinct from another listener (negative polarity:
        /// True is the problem).
        Conflicted,
        /// Gateways: a listener serves clients without a valid certificate
        /// (GEP-91 `AllowInsecureFallback`).
        InsecureFrontendValidationMode,
        /// Routes: some rules dropped (negative polarity; sluice does not
        /// report it, `sluice check` judges it).
        PartiallyInvalid,
        /// Routes and listeners: TLS settings overlap (negative polarity;
        /// sluice does not report it, `sluice check` judges it).
        OverlappingTLSConfig,
    }
}

vocabulary! {
    /// A condition's `reason`.
    Reason {
        // Positive: the condition holds.
        /// `Accepted=True`.
        Accepted,
        /// `Programmed=True`.
        Programmed,
        /// `ResolvedRefs=True`.
        ResolvedRefs,
        /// `Conflicted=False`.
        NoConflicts,

        // HTTPRoute parents.
        /// The parentRef selects no listener (`sectionName`, `port`), or
        /// names a ListenerSet its Gateway did not take.
        NoMatchingParent,
        /// No selected listener's `allowedRoutes` admits the route.
        NotAllowedByListeners,
        /// No route hostname intersects the selected listeners' hostnames.
        NoMatchingListenerHostname,
        /// The route asks for something sluice cannot honour.
        UnsupportedValue,
        /// A backendRef names a Service (or port) that does not exist.
        BackendNotFound,
        /// A reference names a kind the field does not take.
        InvalidKind,
        /// A reference into another namespace no ReferenceGrant allows.
        RefNotPermitted,

        // Listeners.
        /// A protocol (or TLS mode) sluice does not serve.
        UnsupportedProtocol,
        /// The port cannot be bound (in use, or a wildcard address next to
        /// a specific one).
        PortUnavailable,
        /// Listeners on one socket with different protocols.
        ProtocolConflict,
        /// Listeners on one socket with the same hostname.
        HostnameConflict,
        /// `allowedRoutes.kinds` names a kind sluice does not support.
        InvalidRouteKinds,
        /// A `tls.certificateRefs` entry does not resolve to a certificate.
        InvalidCertificateRef,
        /// `Programmed=False` while the listener waits for its socket.
        Pending,
        /// `Programmed=False`: not served, for the reason its `Accepted`
        /// gives; BackendTLSPolicies: a setting sluice cannot honour.
        Invalid,

        // Gateways.
        /// Some (or all) listeners are not accepted.
        ListenersNotValid,
        /// `spec.addresses` has an address sluice cannot bind.
        UnsupportedAddress,
        /// `spec.infrastructure.parametersRef` names anything at all.
        InvalidParameters,
        /// None of the Gateway's listeners could bind its socket.
        AddressNotUsable,
        /// `spec.tls.backend.clientCertificateRef` does not resolve.
        InvalidClientCertificateRef,
        /// `InsecureFrontendValidationMode=True`.
        ConfigurationChanged,
        /// A `caCertificateRefs` entry does not resolve to CA certificates.
        InvalidCACertificateRef,
        /// A frontend `caCertificateRefs` entry of a kind other than
        /// ConfigMap.
        InvalidCACertificateKind,
        /// None of the `caCertificateRefs` resolved.
        NoValidCACertificate,

        // ListenerSets.
        /// The parent Gateway's `allowedListeners` does not admit it.
        NotAllowed,
        /// The parent Gateway is not accepted.
        ParentNotAccepted,
        /// `Programmed=False` because the parent Gateway is not accepted.
        ParentNotProgrammed,

        // Policies (BackendTLSPolicies, RolloutPolicies).
        /// Another policy on the same target takes precedence.
        Conflicted,
        /// A RolloutPolicy's targetRef names a route (or a rule of it) that
        /// does not exist.
        TargetNotFound,
    }
}

/// `True` or `False`, as a condition's `status` writes it.
const fn status_str(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Makes conditions for one object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConditionMaker {
    pub generation: i64,
    pub now: Timestamp,
}

impl ConditionMaker {
    pub fn make(
        &self,
        type_: ConditionType,
        status: bool,
        reason: Reason,
        message: impl Into<String>,
    ) -> Condition {
        Condition {
            type_: type_.as_str().to_string(),
            status: status_str(status).to_string(),
            reason: reason.as_str().to_string(),
            message: message.into(),
            observed_generation: Some(self.generation),
            last_transition_time: Time(self.now),
        }
    }
}

/// `now` as a condition's `lastTransitionTime` writes it in JSON: made
/// once per translation for [`condition_json`].
pub(crate) fn time_json(now: Timestamp) -> serde_json::Value {
    serde_json::to_value(Time(now)).unwrap_or_default()
}

/// The JSON of the condition [`ConditionMaker::make`] makes (as
/// `serde_json::to_value` writes it), written directly, with `time` (from
/// [`time_json`]) its `lastTransitionTime`: route statuses, one per route,
/// are built so, without a typed condition to serialize again.
pub(crate) fn condition_json(
    type_: ConditionType,
    status: bool,
    reason: Reason,
    message: String,
    generation: i64,
    time: &serde_json::Value,
) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("lastTransitionTime".into(), time.clone());
    m.insert("message".into(), message.into());
    m.insert("observedGeneration".into(), generation.into());
    m.insert("reason".into(), reason.as_str().into());
    m.insert("status".into(), status_str(status).into());
    m.insert("type".into(), type_.as_str().into());
    serde_json::Value::Object(m)
}

/// The condition of type `type_` among `conditions`, if its status is
/// `status`.
pub(crate) fn find(
    conditions: &[Condition],
    type_: ConditionType,
    status: bool,
) -> Option<&Condition> {
    conditions
        .iter()
        .find(|c| c.type_ == type_.as_str() && c.status == status_str(status))
}

/// Is the condition's status True?
pub(crate) fn is_true(condition: &Condition) -> bool {
    condition.status == status_str(true)
}

/// Replace the condition of the same type (keeping its transition time
/// when the status does not change), or append it.
pub(crate) fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            *old = new;
        }
        None => conditions.push(new),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_the_spec_spelling_and_parse_back() {
        // A few spellings that are easy to get wrong, checked by hand
        // against the spec.
        assert_eq!(
            Reason::InvalidCACertificateRef.as_str(),
            "InvalidCACertificateRef"
        );
        assert_eq!(
            Reason::NoMatchingListenerHostname.as_str(),
            "NoMatchingListenerHostname"
        );
        assert_eq!(
            ConditionType::OverlappingTLSConfig.as_str(),
            "OverlappingTLSConfig"
        );
        assert_eq!(ConditionType::ResolvedRefs.to_string(), "ResolvedRefs");
        for &t in ConditionType::ALL {
            assert_eq!(ConditionType::parse(t.as_str()), Some(t));
        }
        for &r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
        }
        assert_eq!(ConditionType::parse("accepted"), None);
    }

    #[test]
    fn made_conditions_write_the_strings_and_find_them() {
        let maker = ConditionMaker {
            generation: 7,
            now: Timestamp::UNIX_EPOCH,
        };
        let c = maker.make(ConditionType::Accepted, false, Reason::NotAllowed, "no");
        assert_eq!((c.type_.as_str(), c.status.as_str()), ("Accepted", "False"));
        assert_eq!(c.reason, "NotAllowed");
        assert_eq!(c.observed_generation, Some(7));
        let conditions = vec![
            c,
            maker.make(ConditionType::Programmed, true, Reason::Programmed, ""),
        ];
        assert!(find(&conditions, ConditionType::Accepted, false).is_some());
        assert!(find(&conditions, ConditionType::Accepted, true).is_none());
        assert!(find(&conditions, ConditionType::Programmed, true).is_some_and(is_true));
    }

    #[test]
    fn condition_json_is_the_made_condition_serialized() {
        let now = Timestamp::from_second(1_764_720_000).expect("a valid time");
        let maker = ConditionMaker { generation: 3, now };
        for (t, status, reason, message) in [
            (ConditionType::Accepted, true, Reason::Accepted, "attached"),
            (
                ConditionType::ResolvedRefs,
                false,
                Reason::BackendNotFound,
                "",
            ),
        ] {
            let made = serde_json::to_value(maker.make(t, status, reason, message))
                .expect("a condition serializes");
            let direct = condition_json(t, status, reason, message.into(), 3, &time_json(now));
            assert_eq!(direct, made);
        }
    }
}
