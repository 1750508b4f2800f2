//! Routes: compiling their rules (matches, filters, weighted backends,
//! session persistence), attaching them to listeners through their
//! parentRefs, and their status. HTTPRoute rules are compiled here;
//! GRPCRoute and TLSRoute rules are HTTPRoute-shaped for everything but
//! their matches ([`crate::resources::grpc_rule_as_http`]) and go through
//! the same [`compile_rules`] (see [`super::grpcroutes`] and
//! [`super::tlsroutes`]). Attachment and status are the same for every
//! kind ([`RouteHead`]).
//!
//! Per the spec, a route attaches to a listener when the parentRef selects
//! it (`sectionName`, `port`), the listener's `allowedRoutes` admits the
//! route's namespace and kind, and their hostnames intersect. The failures
//! are reported in that order: `NoMatchingParent`, `NotAllowedByListeners`,
//! `NoMatchingListenerHostname`.

use std::collections::BTreeMap;
use std::sync::Arc;

use gateway_api::experimental::httproutes::{
    HttpRoute, HttpRouteRules, HttpRouteRulesRetry, HttpRouteRulesSessionPersistence,
    HttpRouteRulesSessionPersistenceCookieConfigLifetimeType, HttpRouteRulesSessionPersistenceType,
};
use http::{HeaderName, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde_json::{Map, Value};

use super::backends::{BackendRefFields, BackendResolver, RefFailure, Resolution, backend_target};
use super::conditions::{ConditionType, Reason, condition_json};
use super::filters::{backend_filters_as_rule_filters, compile_filters};
use super::gateways::{GatewayView, namespace_allowed};
use super::matches::{compile_match, compile_timeouts};
use super::meta::namespace_of;
use super::output::{
    BackendOutcome, BackendSummary, ObjectStatus, RuleSummary, StatusMetadata, api_version,
};
use super::rollouts::{backend_key, served_split};
use crate::resources::{CONTROLLER_NAME, GATEWAY_GROUP, parse_gateway_duration};
use crate::rollout::ServedShares;
use crate::route::{
    Backend, CookieMatch, DEFAULT_RETRY_ATTEMPTS, DEFAULT_RETRY_BACKOFF, Filter, HeaderMatch,
    HostPattern, RequestMatch, RetryPolicy, RouteKind, Rule, RuleId, SessionCarrier,
    SessionPersistence, ValueMatch, stable_hash,
};

/// One rule, compiled, ready to be attached to listeners.
#[derive(Debug)]
pub(crate) struct CompiledRule {
    pub rule: Arc<Rule>,
    pub matches: Vec<RequestMatch>,
}

/// A route's rules and what compiling them found.
#[derive(Debug, Default)]
pub(crate) struct CompiledRoute {
    pub rules: Vec<CompiledRule>,
    /// Values sluice cannot honour (filter types, ...): `Accepted=False`
    /// with reason `UnsupportedValue`.
    pub unsupported: Vec<String>,
    /// backendRefs that do not resolve: `ResolvedRefs=False`.
    pub ref_failures: Vec<RefFailure>,
    pub summaries: Vec<Arc<RuleSummary>>,
    pub warnings: Vec<String>,
}

/// Compile every rule of an HTTPRoute.
pub(crate) fn compile_route(
    route: &HttpRoute,
    ns: &str,
    name: &str,
    resolver: &BackendResolver<'_>,
    served: &ServedShares,
) -> CompiledRoute {
    // The CRD's default for an absent `rules`: one rule matching PathPrefix
    // `/` with no backends (which answers 500).
    let default_rules = [HttpRouteRules::default()];
    let rules = route.spec.rules.as_deref().unwrap_or(&default_rules);
    let mut out = compile_rules(RouteKind::Http, rules, ns, name, resolver, served);
    add_cookie_matches(route, rules, &mut out);
    out
}

/// sluice's cookie conditions (an extension: the Gateway API has no cookie
/// match): the route annotation `sluice.dev/cookie-matches` holds a JSON
/// object from rule `name` to `{"name": COOKIE, "value": VALUE}`, and that
/// condition replaces the `Cookie` header match of every match of the rule,
/// or is ANDed into it when it has none (a rule without matches gets it on
/// its default `PathPrefix /`). It ranks as one header
/// match. A malformed annotation or an unknown rule name is an unsupported
/// value of the route, naming the annotation.
fn add_cookie_matches(route: &HttpRoute, rules: &[HttpRouteRules], out: &mut CompiledRoute) {
    let Some(text) = route
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(COOKIE_MATCHES_ANNOTATION))
    else {
        return;
    };
    let field = format!("metadata.annotations[{COOKIE_MATCHES_ANNOTATION}]");
    let parsed: BTreeMap<String, CookieMatch> = match serde_json::from_str::<
        BTreeMap<String, CookieMatchSpec>,
    >(text)
    {
        Ok(m) => m
            .into_iter()
            .map(|(rule, c)| {
                (
                    rule,
                    CookieMatch {
                        name: c.name,
                        value: c.value,
                    },
                )
            })
            .collect(),
        Err(e) => {
            out.unsupported.push(format!(
                "{field}: expected a JSON object from rule name to {{\"name\": COOKIE, \"value\": VALUE}}: {e}"
            ));
            return;
        }
    };
    for (rule_name, cookie) in parsed {
        if cookie.name.is_empty() || !cookie.name.bytes().all(is_cookie_name_byte) {
            out.unsupported.push(format!(
                "{field}: rule {rule_name:?}: {:?} is not a cookie name",
                cookie.name
            ));
            continue;
        }
        let Some(i) = rules
            .iter()
            .position(|r| r.name.as_deref() == Some(rule_name.as_str()))
        else {
            out.unsupported
                .push(format!("{field}: no rule is named {rule_name:?}"));
            continue;
        };
        let Some(compiled) = out.rules.get_mut(i) else {
            continue;
        };
        if compiled.matches.is_empty() {
            compiled.matches.push(RequestMatch::default());
        }
        for m in &mut compiled.matches {
            // The condition replaces the rule's own `Cookie` header match
            // (a portable approximation other implementations read).
            m.headers.retain(|h| h.name != http::header::COOKIE);
            m.headers.push(HeaderMatch {
                name: http::header::COOKIE,
                value: ValueMatch::Cookie(cookie.clone()),
            });
        }
    }
}

/// The route annotation of sluice's cookie conditions.
pub const COOKIE_MATCHES_ANNOTATION: &str = "sluice.dev/cookie-matches";

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CookieMatchSpec {
    name: String,
    value: String,
}

/// RFC 6265's cookie-name: a token.
fn is_cookie_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `spec.rules[i]`, as messages name a rule.
struct RuleField(usize);

impl std::fmt::Display for RuleField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "spec.rules[{}]", self.0)
    }
}

/// `spec.rules[i].backendRefs[j]`, as messages name a backendRef.
struct BackendField(usize, usize);

impl std::fmt::Display for BackendField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "spec.rules[{}].backendRefs[{}]", self.0, self.1)
    }
}

/// `HTTPRoute ns/name`, as warnings name a route.
pub(crate) struct RouteId<'a>(pub RouteKind, pub &'a str, pub &'a str);

impl std::fmt::Display for RouteId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.0, self.1, self.2)
    }
}

/// The field of a list of filters, for their messages: made only when
/// there are any (a rule without filters has no message about them).
fn filters_field<T>(filters: Option<&[T]>, field: impl FnOnce() -> String) -> String {
    if filters.is_some_and(|f| !f.is_empty()) {
        field()
    } else {
        String::new()
    }
}

/// Compile HTTPRoute-shaped rules of a route of `kind`; a rule a rollout
/// governs (`served`, by kind, route and rule) gets the shares it serves.
pub(crate) fn compile_rules(
    kind: RouteKind,
    rules: &[HttpRouteRules],
    ns: &str,
    name: &str,
    resolver: &BackendResolver<'_>,
    served: &ServedShares,
) -> CompiledRoute {
    let scope = Scope {
        kind,
        ns,
        name,
        resolver,
        served,
    };
    let mut out = CompiledRoute::default();
    for (i, rule) in rules.iter().enumerate() {
        compile_rule(&scope, rule, i, &mut out);
    }
    out
}

/// The route whose rules are compiled, and what they are compiled with.
struct Scope<'a, 'r> {
    kind: RouteKind,
    ns: &'a str,
    name: &'a str,
    resolver: &'a BackendResolver<'r>,
    served: &'a ServedShares,
}

/// What the client gets for the share of a backend that cannot take it, in
/// the words of each route kind (HTTP status, gRPC status, or the
/// connection refused), for warnings.
fn answer(kind: RouteKind, http: u16) -> String {
    match kind {
        RouteKind::Http => http.to_string(),
        RouteKind::Grpc => "gRPC status UNAVAILABLE".into(),
        RouteKind::Tls => "its connections refused".into(),
    }
}

fn compile_rule(scope: &Scope<'_, '_>, rule: &HttpRouteRules, i: usize, out: &mut CompiledRoute) {
    let &Scope {
        kind,
        ns,
        name,
        resolver,
        served,
    } = scope;
    // Written only into messages (most rules have none): displayed when
    // one is, not formatted for every rule.
    let field = RuleField(i);
    let route_id = RouteId(kind, ns, name);
    let id_prefix = format!("{}/{ns}/{name}/rule/{i}", kind.id_prefix());

    let mut matches = Vec::new();
    for (j, m) in rule.matches.iter().flatten().enumerate() {
        match compile_match(m) {
            Ok(m) => matches.push(m),
            Err(e) => out.unsupported.push(format!("{field}.matches[{j}].{e}")),
        }
    }
    let timeouts = compile_timeouts(rule.timeouts.as_ref()).unwrap_or_else(|e| {
        out.unsupported.push(format!("{field}.{e}"));
        Default::default()
    });
    let retry = rule.retry.as_ref().and_then(|r| {
        compile_retry(r)
            .map_err(|e| out.unsupported.push(format!("{field}.retry.{e}")))
            .ok()
    });

    let filters = compile_filters(
        kind,
        rule.filters.as_deref().unwrap_or_default(),
        &filters_field(rule.filters.as_deref(), || format!("{field}.filters")),
        &id_prefix,
        ns,
        resolver,
    );
    out.unsupported.extend(filters.unsupported);
    out.ref_failures.extend(filters.ref_failures);
    out.warnings.extend(
        filters
            .warnings
            .into_iter()
            .map(|w| format!("{route_id}: {w}")),
    );

    let refs = rule.backend_refs.as_deref().unwrap_or_default();
    // Omitted by the manifest (the CRD default made it 1), or not defaulted.
    let omitted = |j: usize| refs[j].weight.is_none() || resolver.weight_omitted(&route_id, i, j);
    let explicit_weights = (0..refs.len()).any(|j| !omitted(j));
    let mut backends = Vec::new();
    let mut summaries = Vec::new();
    for (j, b) in refs.iter().enumerate() {
        let bfield = BackendField(i, j);
        let fields = BackendRefFields::of(b);
        // The label is the identity's display (see BackendResolver::label).
        let key = backend_key(ns, &fields);
        let label = key.to_string();
        let weight = match b.weight.map(u32::try_from) {
            None => 1,
            Some(Ok(w)) if w <= 1_000_000 => w,
            Some(_) => {
                out.unsupported.push(format!(
                    "{bfield}.weight: {:?} is outside 0..=1000000",
                    b.weight
                ));
                0
            }
        };
        if omitted(j) && explicit_weights {
            out.warnings.push(format!(
                "{route_id}: {bfield} ({label}) has no weight, so it weighs 1, next to explicit weights"
            ));
        }
        let resolution = resolver.resolve(kind, ns, &fields);
        let outcome = match &resolution {
            Resolution::Endpoints { addrs, .. } => BackendOutcome::Serves {
                ready_endpoints: addrs.len(),
            },
            Resolution::NoReadyEndpoints => {
                if weight > 0 {
                    out.warnings.push(format!(
                        "{route_id}: {bfield} ({label}) has no ready endpoints: its share gets {}",
                        answer(kind, 503)
                    ));
                }
                BackendOutcome::NoReadyEndpoints
            }
            Resolution::Unresolved { reason, message } => {
                if weight > 0 {
                    out.warnings.push(format!(
                        "{route_id}: {bfield} ({label}) does not resolve ({reason}): its share gets {}",
                        answer(kind, 500)
                    ));
                }
                out.ref_failures.push(RefFailure {
                    reason: *reason,
                    message: format!("{bfield}: {message}"),
                });
                BackendOutcome::Unresolved {
                    reason: reason.to_string(),
                    message: message.clone(),
                }
            }
        };
        let backend_id = format!("{id_prefix}/backend/{j}");
        let mut backend_filters = Vec::new();
        match backend_filters_as_rule_filters(b.filters.as_deref().unwrap_or_default()) {
            Ok(fs) => {
                let compiled = compile_filters(
                    kind,
                    &fs,
                    &filters_field(Some(fs.as_slice()), || format!("{bfield}.filters")),
                    &backend_id,
                    ns,
                    resolver,
                );
                out.unsupported.extend(compiled.unsupported);
                out.ref_failures.extend(compiled.ref_failures);
                out.warnings.extend(
                    compiled
                        .warnings
                        .into_iter()
                        .map(|w| format!("{route_id}: {w}")),
                );
                if compiled
                    .filters
                    .iter()
                    .any(|f| matches!(f, Filter::Cors(_)))
                {
                    // A preflight is answered before any backend is chosen.
                    out.unsupported.push(format!(
                        "{bfield}.filters: CORS is only supported in rule filters"
                    ));
                }
                backend_filters = compiled.filters;
            }
            Err(e) => out.unsupported.push(format!("{bfield}.filters: {e}")),
        }
        summaries.push(BackendSummary {
            name: label.clone(),
            weight,
            share_percent: 0.0,
            outcome,
            key,
            served_weight: None,
            served_percent: None,
            removed_from_spec: false,
        });
        backends.push(Backend {
            id: backend_id,
            service: label,
            weight,
            target: backend_target(resolution),
            filters: backend_filters,
        });
    }
    let total: u64 = summaries.iter().map(|s| u64::from(s.weight)).sum();
    for s in &mut summaries {
        if total > 0 {
            s.share_percent = 100.0 * f64::from(s.weight) / total as f64;
        }
    }
    let redirects = filters
        .filters
        .iter()
        .any(|f| matches!(f, Filter::RequestRedirect(_)));
    if refs.is_empty() && !redirects {
        out.warnings.push(format!(
            "{route_id}: {field}: no backendRefs and no redirect: the rule answers {}",
            answer(kind, 500)
        ));
    }
    if !refs.is_empty() && total == 0 {
        out.warnings.push(format!(
            "{route_id}: {field}: every backendRef has weight 0: the rule answers {}",
            answer(kind, 500)
        ));
    }
    let id = RuleId {
        kind,
        namespace: ns.to_string(),
        route: name.to_string(),
        index: i,
        name: rule.name.clone(),
    };
    let session = rule.session_persistence.as_ref().and_then(|sp| {
        compile_session(sp, &id, &backends)
            .map_err(|e| {
                out.unsupported
                    .push(format!("{field}.sessionPersistence.{e}"))
            })
            .ok()
    });
    let (split, rollout) = served_split(
        (kind, ns, name, i),
        backends,
        &mut summaries,
        served,
        resolver,
        &id_prefix,
    );
    out.summaries.push(Arc::new(RuleSummary {
        kind: kind.as_str().to_string(),
        route: format!("{ns}/{name}"),
        rule: i,
        backends: summaries,
        rollout,
    }));
    out.rules.push(CompiledRule {
        rule: Arc::new(Rule {
            id,
            filters: filters.filters,
            backends: split,
            timeouts,
            retry,
            session,
        }),
        matches,
    });
}

/// Compile a rule's `sessionPersistence` for its rule `id` and compiled
/// `backends`. Cookie and header names default to one per rule
/// (`sluice-session-<8 hex digits>`), as "If SessionName is not
/// specified, then a unique cookie name should be generated". The error
/// starts with the field name (relative to `sessionPersistence`).
fn compile_session(
    sp: &HttpRouteRulesSessionPersistence,
    id: &RuleId,
    backends: &[Backend],
) -> Result<SessionPersistence, String> {
    let duration = |field: &str, d: &Option<String>| match d {
        None => Ok(None),
        Some(d) => parse_gateway_duration(d)
            .map(|d| (!d.is_zero()).then_some(d))
            .map_err(|e| format!("{field}: {e}")),
    };
    let rule_tag = stable_hash(id.to_string().as_bytes()) as u32;
    let name = sp
        .session_name
        .clone()
        .unwrap_or_else(|| format!("sluice-session-{rule_tag:08x}"));
    let carrier = match sp.r#type {
        Some(HttpRouteRulesSessionPersistenceType::Header) => SessionCarrier::Header(
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("sessionName: {name:?} is not a valid header name"))?,
        ),
        Some(HttpRouteRulesSessionPersistenceType::Cookie) | None => SessionCarrier::Cookie {
            name,
            permanent: matches!(
                sp.cookie_config
                    .as_ref()
                    .and_then(|c| c.lifetime_type.as_ref()),
                Some(HttpRouteRulesSessionPersistenceCookieConfigLifetimeType::Permanent)
            ),
        },
    };
    Ok(SessionPersistence {
        carrier,
        absolute_timeout: duration("absoluteTimeout", &sp.absolute_timeout)?,
        idle_timeout: duration("idleTimeout", &sp.idle_timeout)?,
        rule_tag,
        backend_keys: backends
            .iter()
            .map(|b| stable_hash(b.service.as_bytes()))
            .collect(),
    })
}

/// Compile a rule's `retry`. The error starts with the field name
/// (relative to `retry`).
fn compile_retry(r: &HttpRouteRulesRetry) -> Result<RetryPolicy, String> {
    let mut codes = Vec::new();
    for (n, c) in r.codes.iter().flatten().enumerate() {
        // The CRD's range: "Minimum=400, Maximum=599".
        let code = u16::try_from(*c)
            .ok()
            .filter(|c| (400..=599).contains(c))
            .and_then(|c| StatusCode::from_u16(c).ok())
            .ok_or_else(|| format!("codes[{n}]: {c} is outside 400..=599"))?;
        if !codes.contains(&code) {
            codes.push(code);
        }
    }
    let attempts = match r.attempts {
        None => DEFAULT_RETRY_ATTEMPTS,
        Some(a) => u32::try_from(a).map_err(|_| format!("attempts: {a} is negative"))?,
    };
    let backoff = match &r.backoff {
        None => DEFAULT_RETRY_BACKOFF,
        Some(b) => parse_gateway_duration(b).map_err(|e| format!("backoff: {e}"))?,
    };
    Ok(RetryPolicy {
        codes,
        attempts,
        backoff,
    })
}

/// A route attached to one listener, under these effective hostnames.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Attachment {
    pub gateway: usize,
    pub listener: usize,
    pub hostnames: Vec<HostPattern>,
}

/// A parentRef, whatever the route kind (each kind's generated type has
/// these fields).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ParentRef<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'a str>,
    pub name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub section_name: Option<&'a str>,
}

/// What attaching a route and reporting on it need, whatever its kind.
#[derive(Debug, Clone)]
pub(crate) struct RouteHead<'a> {
    pub kind: RouteKind,
    pub meta: &'a ObjectMeta,
    pub namespace: &'a str,
    pub name: &'a str,
    /// `spec.hostnames` (none: any hostname).
    pub hostnames: &'a [String],
    pub parent_refs: Vec<ParentRef<'a>>,
}

impl<'a> RouteHead<'a> {
    /// The head of a route of `kind` with this metadata, hostnames and
    /// parentRefs (of the kind's own type).
    pub fn new<P: RouteParentRef>(
        kind: RouteKind,
        meta: &'a ObjectMeta,
        hostnames: &'a [String],
        parent_refs: &'a [P],
    ) -> Self {
        RouteHead {
            kind,
            meta,
            namespace: namespace_of(meta),
            name: meta.name.as_deref().unwrap_or(""),
            hostnames,
            parent_refs: parent_refs.iter().map(RouteParentRef::parent_ref).collect(),
        }
    }

    /// `HTTPRoute ns/name`.
    pub fn id(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// A parentRef of one route kind's own type (every kind has the same
/// fields), as a [`ParentRef`]. Copied field by field: a JSON round trip
/// per parentRef was a visible part of translating 10,000 routes.
pub(crate) trait RouteParentRef {
    fn parent_ref(&self) -> ParentRef<'_>;
}

macro_rules! route_parent_ref {
    ($($t:ty),*) => {$(
        impl RouteParentRef for $t {
            fn parent_ref(&self) -> ParentRef<'_> {
                ParentRef {
                    group: self.group.as_deref(),
                    kind: self.kind.as_deref(),
                    name: &self.name,
                    namespace: self.namespace.as_deref(),
                    port: self.port,
                    section_name: self.section_name.as_deref(),
                }
            }
        }
    )*};
}

route_parent_ref!(
    gateway_api::experimental::httproutes::HttpRouteParentRefs,
    gateway_api::experimental::grpcroutes::GrpcRouteParentRefs,
    gateway_api::experimental::tlsroutes::TlsRouteParentRefs
);

/// What one parentRef that names one of our Gateways came to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParentResult {
    /// Which of the route's parentRefs ([`RouteHead::parent_refs`]).
    pub parent_ref: usize,
    /// `Err((reason, message))` when the route is not accepted here.
    pub accepted: Result<Vec<Attachment>, (Reason, String)>,
}

/// Attach a route through each of its parentRefs that names one of our
/// Gateways, or a ListenerSet whose parentRef names one. ParentRefs to
/// anything else are not ours to report on.
pub(crate) fn attach(
    route: &RouteHead<'_>,
    views: &[GatewayView],
    labels: &dyn Fn(&str) -> BTreeMap<String, String>,
) -> Vec<ParentResult> {
    let ns = route.namespace;
    let route_kind = route.kind;
    let route_hosts: Vec<HostPattern> = if route.hostnames.is_empty() {
        vec![HostPattern::Any]
    } else {
        route
            .hostnames
            .iter()
            .map(|h| HostPattern::parse(Some(h)))
            .collect()
    };
    let mut out = Vec::new();
    for (parent_index, parent) in route.parent_refs.iter().enumerate() {
        let group = parent.group.unwrap_or(GATEWAY_GROUP);
        let kind = parent.kind.unwrap_or("Gateway");
        if group != GATEWAY_GROUP {
            continue;
        }
        let parent_ns = parent.namespace.unwrap_or(ns);
        // The Gateway, and whose listeners the parentRef can reach: a
        // Gateway parentRef reaches the Gateway's own listeners only, a
        // ListenerSet parentRef that ListenerSet's.
        let (g, owner) = match kind {
            "Gateway" => {
                let Some(g) = views
                    .iter()
                    .position(|v| v.namespace == parent_ns && v.name == parent.name)
                else {
                    continue;
                };
                (g, None)
            }
            "ListenerSet" => {
                let Some((g, s)) = views.iter().enumerate().find_map(|(g, v)| {
                    v.listener_sets
                        .iter()
                        .position(|s| s.namespace == parent_ns && s.name == parent.name)
                        .map(|s| (g, s))
                }) else {
                    continue;
                };
                (g, Some(s))
            }
            _ => continue,
        };
        let view = &views[g];
        let selected: Vec<usize> = view
            .listeners_of(owner)
            .filter(|&l| {
                let listener = &view.listeners[l];
                parent.section_name.is_none_or(|s| s == listener.name)
                    && parent.port.is_none_or(|p| p == listener.port)
            })
            .collect();
        let set_rejected = owner.and_then(|s| view.listener_sets[s].rejected.as_ref());
        let accepted = if let Some((reason, message)) = set_rejected {
            Err((
                Reason::NoMatchingParent,
                format!(
                    "ListenerSet {parent_ns}/{} is not attached to its Gateway ({reason}: {message})",
                    parent.name
                ),
            ))
        } else if selected.is_empty() {
            Err((
                Reason::NoMatchingParent,
                match (&parent.section_name, parent.port) {
                    (Some(s), Some(p)) => format!(
                        "{kind} {parent_ns}/{} has no listener {s} on port {p}",
                        parent.name
                    ),
                    (Some(s), None) => {
                        format!(
                            "{kind} {parent_ns}/{} has no listener named {s}",
                            parent.name
                        )
                    }
                    (None, Some(p)) => {
                        format!(
                            "{kind} {parent_ns}/{} has no listener on port {p}",
                            parent.name
                        )
                    }
                    (None, None) => format!("{kind} {parent_ns}/{} has no listeners", parent.name),
                },
            ))
        } else {
            let allowed: Vec<usize> = selected
                .iter()
                .copied()
                .filter(|&l| {
                    let listener = &view.listeners[l];
                    listener.accepts(route_kind)
                        && namespace_allowed(
                            &listener.namespaces,
                            view.listener_namespace(l),
                            ns,
                            labels,
                        )
                })
                .collect();
            if allowed.is_empty() {
                let kind_ok = selected
                    .iter()
                    .any(|&l| view.listeners[l].accepts(route_kind));
                Err((
                    Reason::NotAllowedByListeners,
                    if kind_ok {
                        format!(
                            "no listener of {kind} {parent_ns}/{} that the parentRef selects allows {route_kind}s from namespace {ns}",
                            parent.name
                        )
                    } else {
                        format!(
                            "no listener of {kind} {parent_ns}/{} that the parentRef selects allows the {route_kind} kind",
                            parent.name
                        )
                    },
                ))
            } else {
                let attachments: Vec<Attachment> = allowed
                    .iter()
                    .filter_map(|&l| {
                        let lh = &view.listeners[l].hostname;
                        let mut hostnames: Vec<HostPattern> = Vec::new();
                        for h in &route_hosts {
                            if let Some(i) = lh.intersect(h)
                                && !hostnames.contains(&i)
                            {
                                hostnames.push(i);
                            }
                        }
                        (!hostnames.is_empty()).then_some(Attachment {
                            gateway: g,
                            listener: l,
                            hostnames,
                        })
                    })
                    .collect();
                if attachments.is_empty() {
                    let listener_hosts: Vec<String> = allowed
                        .iter()
                        .map(|&l| view.listeners[l].hostname.to_string())
                        .collect();
                    Err((
                        Reason::NoMatchingListenerHostname,
                        format!(
                            "no route hostname intersects the listener hostnames ({})",
                            listener_hosts.join(", ")
                        ),
                    ))
                } else {
                    Ok(attachments)
                }
            }
        };
        out.push(ParentResult {
            parent_ref: parent_index,
            accepted,
        });
    }
    out
}

/// A route that names at least one of our Gateways, attached and
/// compiled: what its status is made of.
#[derive(Debug)]
pub(crate) struct AttachedRoute<'a> {
    pub head: RouteHead<'a>,
    /// One per parentRef that names one of our Gateways (or a ListenerSet
    /// of one), in the route's order. Shared with the next translation,
    /// which reuses it for an unchanged route while the Gateways are
    /// unchanged ([`super::reuse`]).
    pub parents: Arc<Vec<ParentResult>>,
    /// Its compiled form: what compiling found that sluice cannot honour
    /// ([`CompiledRoute::unsupported`]) and the backendRefs that do not
    /// resolve ([`CompiledRoute::ref_failures`]) are in its status.
    pub compiled: Arc<CompiledRoute>,
    /// Its index in its kind's list in the snapshot, and in the previous
    /// translation's when it was there with an equal spec
    /// ([`super::reuse::Reuse::unchanged`]): where its status is kept,
    /// and may be taken from.
    pub index: usize,
    pub unchanged: Option<usize>,
}

/// Phase: route status. A route's `status.parents`, one entry per
/// parentRef of [`AttachedRoute::parents`], each with `Accepted`
/// (`UnsupportedValue` when the route asks for something sluice cannot
/// honour, else why the parentRef did not attach, else the listeners it
/// attached to) and the route's `ResolvedRefs` (the first failure's reason,
/// every failure's message), stamped with `time` ([`super::conditions::time_json`] of the
/// translation's time).
///
/// Written as JSON directly (the value `serde_json::to_value` gives of an
/// `HttpRouteStatus`; every route kind's status has its shape): with
/// 10,000 routes, building the typed status and serializing it was most
/// of the status's cost.
pub(crate) fn route_status(
    route: &AttachedRoute<'_>,
    views: &[GatewayView],
    time: &Value,
) -> ObjectStatus {
    let generation = route.head.meta.generation.unwrap_or(0);
    let condition =
        |t, status, reason, message| condition_json(t, status, reason, message, generation, time);
    let CompiledRoute {
        unsupported,
        ref_failures,
        ..
    } = &*route.compiled;
    let resolved = match ref_failures.first() {
        None => condition(
            ConditionType::ResolvedRefs,
            true,
            Reason::ResolvedRefs,
            "all references resolved".into(),
        ),
        Some(first) => condition(
            ConditionType::ResolvedRefs,
            false,
            first.reason,
            ref_failures
                .iter()
                .map(|f| f.message.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    let mut parents = Vec::with_capacity(route.parents.len());
    // Every parent has the route's ResolvedRefs: a copy each but the last,
    // which takes it.
    let mut resolved = Some(resolved);
    let last = route.parents.len().saturating_sub(1);
    for (i, parent) in route.parents.iter().enumerate() {
        let accepted = if !unsupported.is_empty() {
            condition(
                ConditionType::Accepted,
                false,
                Reason::UnsupportedValue,
                unsupported.join("; "),
            )
        } else {
            match &parent.accepted {
                Err((reason, message)) => {
                    condition(ConditionType::Accepted, false, *reason, message.clone())
                }
                Ok(attachments) => {
                    let names: Vec<&str> = attachments
                        .iter()
                        .map(|a| views[a.gateway].listeners[a.listener].name.as_str())
                        .collect();
                    condition(
                        ConditionType::Accepted,
                        true,
                        Reason::Accepted,
                        format!("attached to listener(s) {}", names.join(", ")),
                    )
                }
            }
        };
        let mut entry = Map::new();
        let resolved = if i == last {
            resolved.take()
        } else {
            resolved.clone()
        };
        entry.insert(
            "conditions".into(),
            Value::Array(vec![accepted, resolved.unwrap_or_default()]),
        );
        entry.insert("controllerName".into(), CONTROLLER_NAME.into());
        entry.insert(
            "parentRef".into(),
            parent_ref_json(&route.head.parent_refs[parent.parent_ref]),
        );
        parents.push(Value::Object(entry));
    }
    let mut status = Map::new();
    status.insert("parents".into(), Value::Array(parents));
    ObjectStatus {
        api_version: api_version(),
        kind: route.head.kind.as_str().into(),
        metadata: StatusMetadata {
            name: route.head.name.to_string(),
            namespace: Some(route.head.namespace.to_string()),
            generation,
        },
        status: Value::Object(status),
    }
}

/// A route status's `parentRef` (an `HttpRouteStatusParentsParentRef` as
/// JSON: the fields the route's parentRef sets).
fn parent_ref_json(p: &ParentRef<'_>) -> Value {
    let mut m = Map::new();
    let mut set = |key: &str, value: Option<&str>| {
        if let Some(v) = value {
            m.insert(key.into(), v.into());
        }
    };
    set("group", p.group);
    set("kind", p.kind);
    set("name", Some(p.name));
    set("namespace", p.namespace);
    if let Some(port) = p.port {
        m.insert("port".into(), port.into());
    }
    if let Some(s) = p.section_name {
        m.insert("sectionName".into(), s.into());
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_api::experimental::httproutes::HttpRouteStatusParentsParentRef;
    use std::time::Duration;

    fn retry(yaml: &str) -> Result<RetryPolicy, String> {
        compile_retry(&crate::yaml::from_str(yaml).expect("test retry parses"))
    }

    #[test]
    fn retry_fields_and_defaults() {
        let r = retry("{codes: [500, 502, 500], attempts: 3, backoff: 1s100ms}").expect("valid");
        assert_eq!(
            r.codes,
            [StatusCode::INTERNAL_SERVER_ERROR, StatusCode::BAD_GATEWAY]
        );
        assert_eq!(r.attempts, 3);
        assert_eq!(r.backoff, Duration::from_millis(1100));
        let r = retry("{}").expect("valid");
        assert!(r.codes.is_empty());
        assert_eq!(r.attempts, DEFAULT_RETRY_ATTEMPTS);
        assert_eq!(r.backoff, DEFAULT_RETRY_BACKOFF);
        assert_eq!(retry("{attempts: 0}").expect("valid").attempts, 0);
    }

    #[test]
    fn parent_ref_json_is_the_status_parent_ref_serialized() {
        let all = ParentRef {
            group: Some("gateway.networking.k8s.io"),
            kind: Some("ListenerSet"),
            name: "set",
            namespace: Some("infra"),
            port: Some(8443),
            section_name: Some("https"),
        };
        let bare = ParentRef {
            name: "gw",
            ..ParentRef::default()
        };
        for p in [all, bare] {
            let typed = HttpRouteStatusParentsParentRef {
                group: p.group.map(str::to_string),
                kind: p.kind.map(str::to_string),
                name: p.name.to_string(),
                namespace: p.namespace.map(str::to_string),
                port: p.port,
                section_name: p.section_name.map(str::to_string),
            };
            assert_eq!(
                parent_ref_json(&p),
                serde_json::to_value(typed).expect("a parentRef serializes")
            );
        }
    }

    #[test]
    fn invalid_retry_names_the_field() {
        for (yaml, field) in [
            ("{codes: [500, 200]}", "codes[1]"),
            ("{codes: [600]}", "codes[0]"),
            ("{attempts: -1}", "attempts"),
            ("{backoff: 10}", "backoff"),
        ] {
            let e = retry(yaml).expect_err(yaml);
            assert!(e.starts_with(field), "{yaml}: {e}");
        }
    }
}
