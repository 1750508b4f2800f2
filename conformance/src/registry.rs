//! The one list of conformance tests: each entry carries what the report
//! says of the test (name, profile, features, Core or Extended), the
//! manifests it starts from, and either the checks that run it or why it
//! cannot apply outside a cluster. A test is registered once, so it cannot
//! be listed without checks, nor have checks that never run.
//!
//! The checks themselves live by area: [`crate::suite`] (Gateway and
//! HTTPRoute), [`crate::grpc`], [`crate::tls_route`],
//! [`crate::listenerset`], [`crate::client_cert`], [`crate::backend_tls`]
//! and [`crate::backend_tls_policy`]. Names, features and manifests come from reading
//! the upstream test code (`conformance/tests/*.go` of
//! kubernetes-sigs/gateway-api v1.6.1); the code is ours.

use futures_util::future::BoxFuture;

use crate::ctx::{Ctx, infra};
use crate::{backend_tls, backend_tls_policy, client_cert, grpc, listenerset, suite, tls_route};

/// A conformance profile: the set of tests an implementation claims, with
/// its own Core features (the upstream suite's `ConformanceProfile`). The
/// report has one section per profile that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Profile {
    Http,
    Grpc,
    Tls,
}

/// The Gateway's Extended features (`GatewayExtendedFeatures`): every
/// Gateway profile's Extended set holds them.
const GATEWAY_EXTENDED: &[&str] = &[
    "GatewayPort8080",
    "GatewayStaticAddresses",
    "GatewayHTTPListenerIsolation",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "GatewayInfrastructurePropagation",
    "GatewayAddressEmpty",
    "GatewayBackendClientCertificate",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "ListenerSet",
];

/// GATEWAY-HTTP's Extended features besides the Gateway's: HTTPRoute's
/// (`HTTPRouteExtendedFeatures`) and BackendTLSPolicy's, Core and
/// Extended.
const HTTP_EXTENDED: &[&str] = &[
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteMethodMatching",
    "HTTPRouteResponseHeaderModification",
    "HTTPRoutePortRedirect",
    "HTTPRouteSchemeRedirect",
    "HTTPRoutePathRedirect",
    "HTTPRouteHostRewrite",
    "HTTPRoutePathRewrite",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteBackendTimeout",
    "HTTPRouteParentRefPort",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteCORS",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteRetry",
    "HTTPRouteRetryBackendTimeout",
    "HTTPRouteRetryConnectionError",
    "BackendTLSPolicy",
    "BackendTLSPolicySANValidation",
];

/// GATEWAY-TLS's Extended features besides the Gateway's
/// (`TLSRouteExtendedFeatures`).
const TLS_EXTENDED: &[&str] = &["TLSRouteModeTerminate", "TLSRouteModeMixed"];

impl Profile {
    /// Every profile, in the order of the report.
    pub const ALL: &[Profile] = &[Profile::Http, Profile::Grpc, Profile::Tls];

    /// The profile's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Http => "GATEWAY-HTTP",
            Profile::Grpc => "GATEWAY-GRPC",
            Profile::Tls => "GATEWAY-TLS",
        }
    }

    /// Features every implementation of the profile supports: a test whose
    /// features are all here is Core, the others are Extended (the suite's
    /// `isTestExtended`).
    pub fn core_features(self) -> &'static [&'static str] {
        match self {
            Profile::Http => &["Gateway", "ReferenceGrant", "HTTPRoute"],
            Profile::Grpc => &["Gateway", "ReferenceGrant", "GRPCRoute"],
            Profile::Tls => &["Gateway", "ReferenceGrant", "TLSRoute"],
        }
    }

    /// Does the profile's Extended set hold `feature`? GATEWAY-GRPC's is
    /// the Gateway's alone (upstream leaves `GRPCRouteNamedRouteRule` out
    /// of every profile).
    pub fn extends(self, feature: &str) -> bool {
        GATEWAY_EXTENDED.contains(&feature)
            || match self {
                Profile::Http => HTTP_EXTENDED.contains(&feature),
                Profile::Grpc => false,
                Profile::Tls => TLS_EXTENDED.contains(&feature),
            }
    }
}

/// What a test does to the running test `cx`, failing at the first
/// expectation that does not hold.
pub type Checks = for<'c, 'p> fn(&'c mut Ctx<'p>) -> BoxFuture<'c, anyhow::Result<()>>;

/// Whether a test can run outside a cluster, and how.
#[derive(Debug, Clone, Copy)]
pub enum Applicability {
    Runs(Checks),
    /// Why it cannot apply to a standalone gateway.
    NotApplicable(&'static str),
}

/// One conformance test.
#[derive(Debug)]
pub struct Test {
    /// The upstream test's `ShortName`.
    pub name: &'static str,
    /// The profile of the route kind the test is about: it is reported
    /// there even when upstream would report it in no profile (a test
    /// whose features no single profile holds).
    pub profile: Profile,
    pub features: &'static [&'static str],
    /// Test YAML files under `tests/`.
    pub manifests: &'static [&'static str],
    pub applies: Applicability,
}

impl Test {
    /// The profiles that report the test: every profile whose Core and
    /// Extended sets hold all its features (the suite's
    /// `getConformanceProfilesForTest`: a Gateway-only test counts in all
    /// three), and its own.
    pub fn profiles(&self) -> impl Iterator<Item = Profile> + '_ {
        Profile::ALL.iter().copied().filter(move |&p| {
            p == self.profile
                || self
                    .features
                    .iter()
                    .all(|f| p.core_features().contains(f) || p.extends(f))
        })
    }

    /// Is the test Core in `profile` (all its features Core there)?
    pub fn is_core(&self, profile: Profile) -> bool {
        let core = profile.core_features();
        self.features.iter().all(|f| core.contains(f))
    }

    /// The Extended features of `profile` the test exercises.
    pub fn extended_features(
        &self,
        profile: Profile,
    ) -> impl Iterator<Item = &'static str> + use<> {
        let features = self.features;
        features.iter().copied().filter(move |f| profile.extends(f))
    }
}

const HTTP: Profile = Profile::Http;
const GRPC: Profile = Profile::Grpc;
const TLS: Profile = Profile::Tls;

/// An entry: profile, name, features, manifests, then the checks (`|cx|`
/// and an expression of the future to await) or `na = "why"`.
macro_rules! t {
    ($profile:expr, $name:literal, [$($f:literal),*], [$($m:literal),*], |$cx:ident| $checks:expr) => {
        Test {
            name: $name,
            profile: $profile,
            features: &[$($f),*],
            manifests: &[$($m),*],
            applies: Applicability::Runs(|$cx| Box::pin(async move { $checks.await })),
        }
    };
    ($profile:expr, $name:literal, [$($f:literal),*], [$($m:literal),*], na = $why:literal) => {
        Test {
            name: $name,
            profile: $profile,
            features: &[$($f),*],
            manifests: &[$($m),*],
            applies: Applicability::NotApplicable($why),
        }
    };
}

/// Every test, in the order they run.
#[rustfmt::skip]
pub static TESTS: &[Test] = &[
    t!(HTTP, "HTTPRouteSimpleSameNamespace", ["Gateway", "HTTPRoute"], ["httproute-simple-same-namespace.yaml"],
        |cx| suite::simple_same_namespace(cx)),
    t!(HTTP, "HTTPRouteWeight", ["Gateway", "HTTPRoute"], ["httproute-weight.yaml"],
        |cx| suite::weight(cx)),
    t!(HTTP, "HTTPRouteMatching", ["Gateway", "HTTPRoute"], ["httproute-matching.yaml"],
        |cx| suite::matching(cx)),
    t!(HTTP, "HTTPRouteHeaderMatching", ["Gateway", "HTTPRoute"], ["httproute-header-matching.yaml"],
        |cx| suite::header_matching(cx)),
    t!(HTTP, "HTTPRouteExactPathMatching", ["Gateway", "HTTPRoute"], ["httproute-exact-path-matching.yaml"],
        |cx| suite::exact_path_matching(cx)),
    t!(HTTP, "HTTPRoutePathMatchOrder", ["Gateway", "HTTPRoute"], ["httproute-path-match-order.yaml"],
        |cx| suite::path_match_order(cx)),
    t!(HTTP, "HTTPRouteMatchingAcrossRoutes", ["Gateway", "HTTPRoute"], ["httproute-matching-across-routes.yaml"],
        |cx| suite::matching_across_routes(cx)),
    t!(HTTP, "HTTPRouteQueryParamMatching", ["Gateway", "HTTPRoute", "HTTPRouteQueryParamMatching"], ["httproute-query-param-matching.yaml"],
        |cx| suite::query_param_matching(cx)),
    t!(HTTP, "HTTPRouteMethodMatching", ["Gateway", "HTTPRoute", "HTTPRouteMethodMatching"], ["httproute-method-matching.yaml"],
        |cx| suite::method_matching(cx)),
    t!(HTTP, "HTTPRouteRequestHeaderModifier", ["Gateway", "HTTPRoute"], ["httproute-request-header-modifier.yaml"],
        |cx| suite::request_header_modifier(cx)),
    t!(HTTP, "HTTPRouteResponseHeaderModifier", ["Gateway", "HTTPRoute", "HTTPRouteResponseHeaderModification"], ["httproute-response-header-modifier.yaml"],
        |cx| suite::response_header_modifier(cx)),
    t!(HTTP, "HTTPRouteRedirectHostAndStatus", ["Gateway", "HTTPRoute"], ["httproute-redirect-host-and-status.yaml"],
        |cx| suite::redirect_host_and_status(cx)),
    t!(HTTP, "HTTPRouteRedirectPath", ["Gateway", "HTTPRoute", "HTTPRoutePathRedirect"], ["httproute-redirect-path.yaml"],
        |cx| suite::redirect_path(cx)),
    t!(HTTP, "HTTPRouteRedirectPort", ["Gateway", "HTTPRoute", "HTTPRoutePortRedirect"], ["httproute-redirect-port.yaml"],
        |cx| suite::redirect_port(cx)),
    t!(HTTP, "HTTPRouteRedirectScheme", ["Gateway", "HTTPRoute", "HTTPRouteSchemeRedirect"], ["httproute-redirect-scheme.yaml"],
        |cx| suite::redirect_scheme(cx)),
    t!(HTTP, "HTTPRouteRedirectPortAndScheme", ["Gateway", "HTTPRoute", "HTTPRoutePortRedirect", "GatewayPort8080"], ["httproute-redirect-port-and-scheme.yaml"],
        |cx| suite::redirect_port_and_scheme(cx)),
    t!(HTTP, "HTTPRoute303Redirect", ["Gateway", "HTTPRoute", "HTTPRoute303RedirectStatusCode"], ["httproute-303-redirect.yaml"],
        |cx| suite::redirect_status(cx, "303-redirect", "/see-other", 303)),
    t!(HTTP, "HTTPRoute307Redirect", ["Gateway", "HTTPRoute", "HTTPRoute307RedirectStatusCode"], ["httproute-307-redirect.yaml"],
        |cx| suite::redirect_status(cx, "307-redirect", "/temporary", 307)),
    t!(HTTP, "HTTPRoute308Redirect", ["Gateway", "HTTPRoute", "HTTPRoute308RedirectStatusCode"], ["httproute-308-redirect.yaml"],
        |cx| suite::redirect_status(cx, "308-redirect", "/permanent", 308)),
    t!(HTTP, "HTTPRouteRewritePath", ["Gateway", "HTTPRoute", "HTTPRoutePathRewrite"], ["httproute-rewrite-path.yaml"],
        |cx| suite::rewrite_path(cx)),
    t!(HTTP, "HTTPRouteRewriteHost", ["Gateway", "HTTPRoute", "HTTPRouteHostRewrite"], ["httproute-rewrite-host.yaml"],
        |cx| suite::rewrite_host(cx)),
    t!(HTTP, "HTTPRouteInvalidNonExistentBackendRef", ["Gateway", "HTTPRoute"], ["httproute-invalid-nonexistent-backendref.yaml"],
        |cx| suite::invalid_backend(cx, "invalid-nonexistent-backend-ref", "/", "BackendNotFound")),
    t!(HTTP, "HTTPRouteInvalidBackendRefUnknownKind", ["Gateway", "HTTPRoute"], ["httproute-invalid-backendref-unknown-kind.yaml"],
        |cx| suite::invalid_backend(cx, "invalid-backend-ref-unknown-kind", "/v2", "InvalidKind")),
    t!(HTTP, "HTTPRouteInvalidCrossNamespaceBackendRef", ["Gateway", "HTTPRoute", "ReferenceGrant"], ["httproute-invalid-cross-namespace-backend-ref.yaml"],
        |cx| suite::invalid_backend(cx, "invalid-cross-namespace-backend-ref", "/", "RefNotPermitted")),
    t!(HTTP, "HTTPRouteInvalidReferenceGrant", ["Gateway", "HTTPRoute", "ReferenceGrant"], ["httproute-invalid-reference-grant.yaml"],
        |cx| suite::invalid_backend(cx, "reference-grant", "/", "RefNotPermitted")),
    t!(HTTP, "HTTPRouteReferenceGrant", ["Gateway", "HTTPRoute", "ReferenceGrant"], ["httproute-reference-grant.yaml"],
        |cx| suite::reference_grant(cx)),
    t!(HTTP, "HTTPRoutePartiallyInvalidViaInvalidReferenceGrant", ["Gateway", "HTTPRoute", "ReferenceGrant"], ["httproute-partially-invalid-via-invalid-reference-grant.yaml"],
        |cx| suite::partially_invalid(cx)),
    t!(HTTP, "HTTPRouteCrossNamespace", ["Gateway", "HTTPRoute"], ["httproute-cross-namespace.yaml"],
        |cx| suite::cross_namespace(cx)),
    t!(HTTP, "HTTPRouteInvalidCrossNamespaceParentRef", ["Gateway", "HTTPRoute"], ["httproute-invalid-cross-namespace-parent-ref.yaml"],
        |cx| suite::invalid_cross_namespace_parent_ref(cx)),
    t!(HTTP, "HTTPRouteInvalidParentRefNotMatchingSectionName", ["Gateway", "HTTPRoute"], ["httproute-invalid-parentref-not-matching-section-name.yaml"],
        |cx| suite::not_matching_section_name(cx)),
    t!(HTTP, "HTTPRouteHostnameIntersection", ["Gateway", "HTTPRoute"], ["httproute-hostname-intersection.yaml"],
        |cx| suite::hostname_intersection(cx)),
    t!(HTTP, "HTTPRouteListenerHostnameMatching", ["Gateway", "HTTPRoute"], ["httproute-listener-hostname-matching.yaml"],
        |cx| suite::listener_hostname_matching(cx)),
    t!(HTTP, "HTTPRouteObservedGenerationBump", ["Gateway", "HTTPRoute"], ["httproute-observed-generation-bump.yaml"],
        |cx| suite::route_generation_bump(cx)),
    t!(HTTP, "GatewayObservedGenerationBump", ["Gateway"], ["gateway-observed-generation-bump.yaml"],
        |cx| suite::gateway_generation_bump(cx)),
    t!(HTTP, "GatewayClassObservedGenerationBump", ["Gateway"], ["gatewayclass-observed-generation-bump.yaml"],
        |cx| suite::class_generation_bump(cx)),
    t!(HTTP, "GatewayWithAttachedRoutes", ["Gateway"], ["gateway-with-attached-routes.yaml"],
        |cx| suite::with_attached_routes(cx)),
    t!(HTTP, "GatewayWithAttachedRoutesWithPort8080", ["Gateway", "GatewayPort8080"], ["gateway-with-attached-routes-with-port-8080.yaml"],
        |cx| suite::with_attached_routes_8080(cx)),
    t!(HTTP, "GatewayInvalidRouteKind", ["Gateway"], ["gateway-invalid-route-kind.yaml"],
        |cx| suite::invalid_route_kind(cx)),
    t!(HTTP, "GatewayModifyListeners", ["Gateway"], ["gateway-modify-listeners.yaml"],
        |cx| suite::modify_listeners(cx)),
    t!(HTTP, "HTTPRouteMultipleGateways", ["Gateway", "HTTPRoute"], ["httproute-multiple-gateways.yaml"],
        |cx| suite::multiple_gateways(cx)),
    t!(HTTP, "HTTPRouteServiceTypes", ["Gateway", "HTTPRoute"], ["httproute-service-types.yaml"],
        |cx| suite::service_types(cx)),
    t!(HTTP, "HTTPRouteNoBackendRefs", ["Gateway", "HTTPRoute"], ["httproute-omitted-backendrefs.yaml"],
        |cx| suite::no_backend_refs(cx)),
    t!(HTTP, "HTTPRouteHTTPSListener", ["Gateway", "HTTPRoute"], ["httproute-https-listener.yaml"],
        |cx| suite::https_listener(cx)),
    t!(HTTP, "GatewayInvalidTLSConfiguration", ["Gateway"], ["gateway-invalid-tls-configuration.yaml"],
        |cx| suite::invalid_tls_configuration(cx)),
    t!(HTTP, "GatewayListenerUnsupportedProtocol", ["Gateway"], ["gateway-invalid-listeners-unsupported-protocol.yaml"],
        |cx| suite::unsupported_protocol(cx)),
    t!(HTTP, "GatewayInvalidParametersRef", ["Gateway"], ["gateway-invalid-parameters-ref.yaml"],
        |cx| suite::invalid_parameters_ref(cx)),
    t!(HTTP, "GatewaySecretInvalidReferenceGrant", ["Gateway", "ReferenceGrant"], ["gateway-secret-invalid-reference-grant.yaml"],
        |cx| suite::secret_listeners(cx, "gateway-secret-invalid-reference-grant", &["https"], false)),
    // v1.6.1's manifest has the `https` listener only (later releases
    // add `https-nonexistent-secret`).
    t!(HTTP, "GatewaySecretMissingReferenceGrant", ["Gateway", "ReferenceGrant"], ["gateway-secret-missing-reference-grant.yaml"],
        |cx| suite::secret_listeners(cx, "gateway-secret-missing-reference-grant", &["https"], false)),
    t!(HTTP, "GatewaySecretReferenceGrantAllInNamespace", ["Gateway", "ReferenceGrant"], ["gateway-secret-reference-grant-all-in-namespace.yaml"],
        |cx| suite::secret_listeners(cx, "gateway-secret-reference-grant-all-in-namespace", &["https"], true)),
    t!(HTTP, "GatewaySecretReferenceGrantSpecific", ["Gateway", "ReferenceGrant"], ["gateway-secret-reference-grant-specific.yaml"],
        |cx| suite::secret_listeners(cx, "gateway-secret-reference-grant-specific", &["https"], true)),
    t!(HTTP, "HTTPRouteInvalidParentRefNotMatchingListenerPort", ["Gateway", "HTTPRoute", "HTTPRouteParentRefPort"], ["httproute-invalid-parentref-not-matching-listener-port.yaml"],
        |cx| suite::parent_port_not_matching(cx, suite::SAME_NS, "httproute-listener-not-matching-route-port")),
    t!(HTTP, "HTTPRouteInvalidParentRefSectionNameNotMatchingPort", ["Gateway", "HTTPRoute", "HTTPRouteParentRefPort"], ["httproute-invalid-parentref-section-name-not-matching-port.yaml"],
        |cx| suite::parent_port_not_matching(cx, &infra("gateway-with-one-not-matching-port-and-section-name-route"), "httproute-listener-section-name-not-matching-port")),
    t!(HTTP, "HTTPRouteListenerPortMatching", ["Gateway", "HTTPRoute", "HTTPRouteParentRefPort"], ["httproute-listener-port-matching.yaml"],
        |cx| suite::listener_port_matching(cx)),
    t!(HTTP, "HTTPRouteNamedRule", ["Gateway", "HTTPRoute", "HTTPRouteNamedRouteRule"], ["httproute-named-rule.yaml"],
        |cx| suite::named_rule(cx)),
    t!(HTTP, "HTTPRouteBackendRequestHeaderModifier", ["Gateway", "HTTPRoute", "HTTPRouteBackendRequestHeaderModification"], ["httproute-request-header-modifier-backend.yaml"],
        |cx| suite::request_header_modifier(cx)),
    t!(HTTP, "HTTPRouteRequestHeaderModifierBackendWeights", ["Gateway", "HTTPRoute", "HTTPRouteBackendRequestHeaderModification"], ["httproute-request-header-modifier-backend-weights.yaml"],
        |cx| suite::backend_weights(cx)),
    t!(HTTP, "HTTPRouteRequestMirror", ["Gateway", "HTTPRoute", "HTTPRouteRequestMirror"], ["httproute-request-mirror.yaml"],
        |cx| suite::request_mirror(cx, "request-mirror", &["/mirror"], &["infra-backend-v2"])),
    t!(HTTP, "HTTPRouteRequestMultipleMirrors", ["Gateway", "HTTPRoute", "HTTPRouteRequestMultipleMirrors"], ["httproute-request-multiple-mirrors.yaml"],
        |cx| suite::request_mirror(cx, "request-multiple-mirrors", &["/multi-mirror"], &["infra-backend-v2", "infra-backend-v3"])),
    t!(HTTP, "HTTPRouteRequestPercentageMirror", ["Gateway", "HTTPRoute", "HTTPRouteRequestPercentageMirror"], ["httproute-request-percentage-mirror.yaml"],
        |cx| suite::percentage_mirror(cx)),
    t!(HTTP, "HTTPRouteTimeoutRequest", ["Gateway", "HTTPRoute", "HTTPRouteRequestTimeout"], ["httproute-timeout-request.yaml"],
        |cx| suite::timeouts(cx, "request-timeout", "/request-timeout", "/disable-request-timeout")),
    t!(HTTP, "HTTPRouteTimeoutBackendRequest", ["Gateway", "HTTPRoute", "HTTPRouteBackendTimeout"], ["httproute-timeout-backend-request.yaml"],
        |cx| suite::timeouts(cx, "backend-request-timeout", "/backend-timeout", "/disable-backend-timeout")),
    t!(HTTP, "HTTPRouteRetry", ["Gateway", "HTTPRoute", "HTTPRouteRetry"], ["httproute-retry.yaml"],
        |cx| suite::retry(cx)),
    t!(HTTP, "HTTPRouteCORS", ["Gateway", "HTTPRoute", "HTTPRouteCORS"], ["httproute-cors.yaml"],
        |cx| suite::cors(cx)),
    t!(HTTP, "HTTPRouteBackendProtocolH2C", ["Gateway", "HTTPRoute", "HTTPRouteBackendProtocolH2C"], ["httproute-backend-protocol-h2c.yaml"],
        |cx| suite::backend_protocol_h2c(cx)),
    t!(HTTP, "HTTPRouteBackendProtocolWebSocket", ["Gateway", "HTTPRoute", "HTTPRouteBackendProtocolWebSocket"], ["httproute-backend-protocol-websocket.yaml"],
        |cx| suite::backend_protocol_websocket(cx)),
    t!(HTTP, "HTTPRouteHTTPSListenerDetectMisdirectedRequests", ["Gateway", "HTTPRoute", "GatewayHTTPSListenerDetectMisdirectedRequests"], ["httproute-https-listener-detect-misdirected-requests.yaml"],
        |cx| suite::misdirected_requests(cx)),
    t!(HTTP, "GatewayHTTPListenerIsolation", ["Gateway", "HTTPRoute", "GatewayHTTPListenerIsolation"], ["gateway-http-listener-isolation.yaml", "gateway-http-listener-isolation-with-hostname-intersection.yaml"],
        |cx| suite::listener_isolation(cx)),
    t!(HTTP, "GatewayStaticAddresses", ["Gateway", "GatewayStaticAddresses"], ["gateway-static-addresses.yaml"],
        |cx| suite::static_addresses(cx)),
    t!(HTTP, "GatewayOptionalAddressValue", ["Gateway", "GatewayAddressEmpty"], ["gateway-optional-address-value.yaml"],
        |cx| suite::optional_address_value(cx)),
    t!(HTTP, "GatewayFrontendClientCertificateValidation", ["Gateway", "HTTPRoute", "GatewayFrontendClientCertificateValidation"], ["gateway-with-clientcertificate-validation.yaml"],
        |cx| client_cert::validation(cx, false)),
    t!(HTTP, "GatewayFrontendClientCertificateValidationInsecureFallback", ["Gateway", "HTTPRoute", "GatewayFrontendClientCertificateValidation", "GatewayFrontendClientCertificateValidationInsecureFallback"], ["gateway-with-clientcertificate-validation-insecure-fallback.yaml"],
        |cx| client_cert::validation(cx, true)),
    t!(HTTP, "GatewayInvalidFrontendClientCertificateValidation", ["Gateway", "HTTPRoute", "ReferenceGrant", "GatewayFrontendClientCertificateValidation"], ["gateway-with-invalid-clientcertificate-validation.yaml"],
        |cx| client_cert::invalid(cx)),
    t!(HTTP, "GatewayFrontendInvalidDefaultClientCertificateValidation", ["Gateway", "HTTPRoute", "GatewayFrontendClientCertificateValidation"], ["gateway-invalid-default-frontend-client-certificate-validation.yaml"],
        |cx| client_cert::invalid_default(cx)),
    t!(HTTP, "GatewayTLSBackendClientCertificate", ["Gateway", "HTTPRoute", "GatewayBackendClientCertificate", "BackendTLSPolicy"], ["gateway-tls-backend-client-certificate.yaml"],
        |cx| backend_tls::client_certificate(cx)),
    t!(HTTP, "GatewayInvalidTLSBackendConfiguration", ["Gateway", "HTTPRoute", "GatewayBackendClientCertificate", "BackendTLSPolicy"], ["gateway-invalid-tls-backend-configuration.yaml"],
        |cx| backend_tls::invalid_configuration(cx)),
    t!(HTTP, "BackendTLSPolicy", ["Gateway", "HTTPRoute", "BackendTLSPolicy"], ["backendtlspolicy.yaml"],
        |cx| backend_tls_policy::backend_tls_policy(cx)),
    t!(HTTP, "BackendTLSPolicyConflictResolution", ["Gateway", "HTTPRoute", "BackendTLSPolicy"], ["backendtlspolicy-conflict-resolution.yaml"],
        |cx| backend_tls_policy::conflict_resolution(cx)),
    t!(HTTP, "BackendTLSPolicyInvalidCACertificateRef", ["Gateway", "HTTPRoute", "BackendTLSPolicy"], ["backendtlspolicy-invalid-ca-certificate-ref.yaml"],
        |cx| backend_tls_policy::invalid_ca_reference(cx, "backendtlspolicy-invalid-ca-certificate-ref", &["nonexistent-ca-certificate-ref", "malformed-ca-certificate-ref"], "InvalidCACertificateRef")),
    t!(HTTP, "BackendTLSPolicyInvalidKind", ["Gateway", "HTTPRoute", "BackendTLSPolicy"], ["backendtlspolicy-invalid-kind.yaml"],
        |cx| backend_tls_policy::invalid_ca_reference(cx, "backendtlspolicy-invalid-kind-test", &["invalid-kind"], "InvalidKind")),
    t!(HTTP, "BackendTLSPolicyObservedGenerationBump", ["Gateway", "HTTPRoute", "BackendTLSPolicy"], ["backendtlspolicy-observed-generation-bump.yaml"],
        |cx| backend_tls_policy::observed_generation_bump(cx)),
    t!(HTTP, "BackendTLSPolicySANValidation", ["Gateway", "HTTPRoute", "BackendTLSPolicy", "BackendTLSPolicySANValidation"], ["backendtlspolicy-san.yaml"],
        |cx| backend_tls_policy::san_validation(cx)),
    t!(HTTP, "ListenerSetAllowedNamespaceNone", ["Gateway", "ListenerSet"], ["listenerset-allowed-namespace-none.yaml"],
        |cx| listenerset::not_allowed(cx, "gateway-does-not-allow-listenerset", &infra("listenerset-not-allowed"))),
    t!(HTTP, "ListenerSetAllowedNamespaceSame", ["Gateway", "ListenerSet"], ["listenerset-allowed-namespace-same.yaml"],
        |cx| listenerset::allowed_namespaces(cx, "gateway-allows-listenerset-in-same-namespace", (&infra("listenerset-in-same-namespace"), "listenerset-in-same-namespace-listener"), "gateway-api-listenerset-not-allowed-ns/listenerset-in-different-namespace")),
    t!(HTTP, "ListenerSetAllowedNamespaceSelector", ["Gateway", "ListenerSet"], ["listenerset-allowed-namespace-selector.yaml"],
        |cx| listenerset::allowed_namespaces(cx, "gateway-allows-listenerset-in-selected-namespace", ("gateway-api-listenerset-selector-allowed-ns/listenerset-in-selected-namespace", "listenerset-in-selected-namespace-listener"), "gateway-api-listenerset-selector-not-allowed-ns/listenerset-not-in-selected-namespace")),
    t!(HTTP, "ListenerSetAllowedRoutesNamespaces", ["Gateway", "HTTPRoute", "ListenerSet", "ReferenceGrant"], ["listenerset-allowed-routes-namespaces.yaml"],
        |cx| listenerset::allowed_routes_namespaces(cx)),
    t!(HTTP, "ListenerSetAllowedRoutesSupportedKinds", ["Gateway", "ListenerSet", "TLSRoute"], ["listenerset-allowed-routes-supported-kinds.yaml"],
        |cx| listenerset::allowed_routes_supported_kinds(cx)),
    t!(HTTP, "ListenerSetDefaultNotAllowed", ["Gateway", "ListenerSet"], ["listenerset-default-not-allowed.yaml"],
        |cx| listenerset::not_allowed(cx, "gateway-default-does-not-allow-listenerset", &infra("listenerset-default-not-allowed"))),
    t!(HTTP, "ListenerSetDualParentRefIndependence", ["Gateway", "HTTPRoute", "ListenerSet"], ["listenerset-dual-parentref-independence.yaml"],
        |cx| listenerset::dual_parent_ref_independence(cx)),
    t!(HTTP, "ListenerSetGatewayParentSectionNameNotFound", ["Gateway", "HTTPRoute", "ListenerSet"], ["listenerset-gateway-parent-section-name-not-found.yaml"],
        |cx| listenerset::gateway_parent_section_not_found(cx)),
    t!(HTTP, "ListenerSetHostnameConflict", ["Gateway", "ListenerSet"], ["listenerset-hostname-conflict.yaml"],
        |cx| listenerset::conflict(cx, "hostname", "HostnameConflict")),
    t!(HTTP, "ListenerSetHTTPRouting", ["Gateway", "HTTPRoute", "ListenerSet"], ["listenerset-http-routing.yaml"],
        |cx| listenerset::http_routing(cx)),
    t!(HTTP, "ListenerSetProtocolConflict", ["Gateway", "ListenerSet"], ["listenerset-protocol-conflict.yaml"],
        |cx| listenerset::conflict(cx, "protocol", "ProtocolConflict")),
    t!(HTTP, "ListenerSetReferenceGrant", ["Gateway", "ListenerSet", "ReferenceGrant"], ["listenerset-reference-grant.yaml"],
        |cx| listenerset::reference_grant(cx)),
    t!(HTTP, "ListenerSetRouteStatusScopedToParentRef", ["Gateway", "HTTPRoute", "ListenerSet"], ["listenerset-route-status-scoped-to-parentref.yaml"],
        |cx| listenerset::route_status_scoped_to_parent_ref(cx)),
    t!(HTTP, "HTTPRouteDisallowedKind", ["Gateway", "HTTPRoute", "TLSRoute"], ["httproute-disallowed-kind.yaml"],
        |cx| suite::disallowed_kind(cx)),
    // GATEWAY-GRPC.
    t!(GRPC, "GRPCExactMethodMatching", ["Gateway", "GRPCRoute"], ["grpcroute-exact-method-matching.yaml"],
        |cx| grpc::exact_method_matching(cx)),
    t!(GRPC, "GRPCRouteHeaderMatching", ["Gateway", "GRPCRoute"], ["grpcroute-header-matching.yaml"],
        |cx| grpc::header_matching(cx)),
    t!(GRPC, "GRPCRouteListenerHostnameMatching", ["Gateway", "GRPCRoute"], ["grpcroute-listener-hostname-matching.yaml"],
        |cx| grpc::listener_hostname_matching(cx)),
    t!(GRPC, "GRPCRouteNamedRule", ["Gateway", "GRPCRoute", "GRPCRouteNamedRouteRule"], ["grpcroute-named-rule.yaml"],
        |cx| grpc::named_rule(cx)),
    t!(GRPC, "GRPCRouteWeight", ["Gateway", "GRPCRoute"], ["grpcroute-weight.yaml"],
        |cx| grpc::weight(cx)),
    // GATEWAY-TLS.
    t!(TLS, "TLSRouteSimpleSameNamespace", ["Gateway", "TLSRoute"], ["tlsroute-simple-same-namespace.yaml"],
        |cx| tls_route::simple_same_namespace(cx)),
    t!(TLS, "TLSRouteHostnameIntersection", ["Gateway", "TLSRoute"], ["tlsroute-hostname-intersection.yaml"],
        |cx| tls_route::hostname_intersection(cx)),
    t!(TLS, "TLSRouteInvalidBackendRefNonexistent", ["Gateway", "TLSRoute"], ["tlsroute-invalid-backendref-nonexistent.yaml"],
        |cx| tls_route::invalid_backend(cx, "gateway-tlsroute-invalid-backend-ref-nonexistent", "invalid-backend-ref-nonexistent", "BackendNotFound")),
    t!(TLS, "TLSRouteInvalidBackendRefUnknownKind", ["Gateway", "TLSRoute"], ["tlsroute-invalid-backendref-unknown-kind.yaml"],
        |cx| tls_route::invalid_backend(cx, "gateway-tlsroute-invalid-backend-ref-unknown-kind", "invalid-backend-ref-unknown-kind", "InvalidKind")),
    t!(TLS, "TLSRouteInvalidNoMatchingListenerHostname", ["Gateway", "TLSRoute"], ["tlsroute-invalid-no-matching-listener-hostname.yaml"],
        |cx| tls_route::no_matching_listener_hostname(cx)),
    t!(TLS, "TLSRouteInvalidNoMatchingListener", ["Gateway", "TLSRoute"], ["tlsroute-invalid-no-matching-listener.yaml"],
        |cx| tls_route::no_matching_listener(cx)),
    t!(TLS, "TLSRouteInvalidReferenceGrant", ["Gateway", "TLSRoute", "ReferenceGrant"], ["tlsroute-invalid-reference-grant.yaml"],
        |cx| tls_route::invalid_reference_grant(cx)),
    t!(TLS, "TLSRouteListenerPassthroughSupportedKinds", ["Gateway", "TLSRoute"], ["tlsroute-listener-passthrough-supported-kinds.yaml"],
        |cx| tls_route::passthrough_supported_kinds(cx)),
    t!(TLS, "TLSRouteListenerTerminateNotSupported", ["Gateway", "TLSRoute"], ["tlsroute-listener-terminate-not-supported.yaml"],
        |cx| tls_route::terminate_supported(cx)),
    t!(TLS, "TLSRouteListenerTerminateSupportedKinds", ["Gateway", "TLSRoute", "TLSRouteModeTerminate"], ["tlsroute-listener-terminate-supported-kinds.yaml"],
        |cx| tls_route::terminate_supported_kinds(cx)),
    t!(TLS, "TLSRouteTerminateSimpleSameNamespace", ["Gateway", "TLSRoute", "TLSRouteModeTerminate"], ["tlsroute-terminate-simple-same-namespace.yaml"],
        |cx| tls_route::terminate_simple_same_namespace(cx)),
    t!(TLS, "TLSRouteListenerMixedTerminationNotSupported", ["Gateway", "TLSRoute", "TLSRouteModeTerminate"], ["tlsroute-listener-mixed-termination-not-supported.yaml"],
        |cx| tls_route::mixed_termination_supported(cx)),
    t!(TLS, "TLSRouteMixedTerminationSameNamespace", ["Gateway", "TLSRoute", "TLSRouteModeTerminate", "TLSRouteModeMixed"], ["tlsroute-mixed-termination-same-namespace.yaml"],
        |cx| tls_route::mixed_termination_same_namespace(cx)),
    t!(HTTP, "GatewayInfrastructure", ["Gateway", "GatewayInfrastructurePropagation"], ["gateway-infrastructure.yaml"],
        na = "checks that spec.infrastructure labels and annotations reach the Deployment/Service a controller generates in the cluster; a standalone gateway generates no cluster resources"),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn names_are_unique() {
        let mut seen = BTreeSet::new();
        for t in TESTS {
            assert!(seen.insert(t.name), "{} is registered twice", t.name);
        }
    }

    #[test]
    fn expected_passes_are_registered_tests() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/expected-pass.txt");
        let text = std::fs::read_to_string(path).expect("expected-pass.txt");
        for name in text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            assert!(
                TESTS.iter().any(|t| t.name == name),
                "{name} is in expected-pass.txt but is no registered test"
            );
        }
    }

    fn test(name: &str) -> &'static Test {
        TESTS.iter().find(|t| t.name == name).expect(name)
    }

    fn profiles(name: &str) -> Vec<Profile> {
        test(name).profiles().collect()
    }

    #[test]
    fn a_test_is_reported_in_every_profile_whose_features_hold_it() {
        // Gateway features alone: every profile, Core everywhere.
        assert_eq!(profiles("GatewayInvalidRouteKind"), Profile::ALL);
        assert!(
            Profile::ALL
                .iter()
                .all(|&p| test("GatewayInvalidRouteKind").is_core(p))
        );
        // A route kind's tests stay in its profile.
        assert_eq!(profiles("HTTPRouteSimpleSameNamespace"), [Profile::Http]);
        assert_eq!(profiles("GRPCExactMethodMatching"), [Profile::Grpc]);
        assert_eq!(profiles("TLSRouteSimpleSameNamespace"), [Profile::Tls]);
        // Extended in its profile: Terminate mode is a TLSRoute extension.
        let terminate = test("TLSRouteTerminateSimpleSameNamespace");
        assert!(!terminate.is_core(Profile::Tls));
        assert_eq!(
            terminate
                .extended_features(Profile::Tls)
                .collect::<Vec<_>>(),
            ["TLSRouteModeTerminate"]
        );
        // Upstream reports GRPCRouteNamedRule in no profile (its feature is
        // in none); it stays in its home profile.
        assert_eq!(profiles("GRPCRouteNamedRule"), [Profile::Grpc]);
    }
}
