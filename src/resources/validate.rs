//! What the API server's CRD schema and CEL rules would refuse, checked on
//! load so that a file gets the same answer a cluster would give.
//!
//! Only the checks that matter for what sluice does with the object: a
//! weight outside 0..=1,000,000, an invalid regular expression, a path that
//! does not start with `/`, an invalid header name, a port outside
//! 1..=65535, too many rules, filters without their configuration, ... Each
//! problem is `(field path, message)`.

use std::collections::HashSet;
use std::net::IpAddr;

use gateway_api::experimental::grpcroutes::{
    GrpcRouteRulesMatches, GrpcRouteRulesMatchesHeadersType, GrpcRouteRulesMatchesMethodType,
};
use gateway_api::experimental::httproutes::{
    HttpRouteRules, HttpRouteRulesFilters, HttpRouteRulesFiltersType,
    HttpRouteRulesMatchesPathType, HttpRouteRulesSessionPersistence,
    HttpRouteRulesSessionPersistenceCookieConfigLifetimeType, HttpRouteRulesSessionPersistenceType,
};
use http::{HeaderName, HeaderValue};

use super::{
    Gateway, GatewayClass, GrpcRoute, HttpRoute, Object, Service, TlsRoute, grpc_rule_as_http,
    parse_gateway_duration, tls_backend_refs_as_http,
};

pub(crate) type Problems = Vec<(String, String)>;

/// Every problem with an object that parsed into its type.
pub(crate) fn validate(object: &Object) -> Problems {
    let mut p = Problems::new();
    match object {
        Object::GatewayClass(o) => gateway_class(o, &mut p),
        Object::Gateway(o) => gateway(o, &mut p),
        Object::HttpRoute(o) => http_route(o, &mut p),
        Object::GrpcRoute(o) => grpc_route(o, &mut p),
        Object::TlsRoute(o) => tls_route(o, &mut p),
        Object::Service(o) => service(o, &mut p),
        Object::RolloutPolicy(o) => {
            if let Err(problems) = o.settings() {
                p.extend(problems);
            }
        }
        Object::ReferenceGrant(_)
        | Object::EndpointSlice(_)
        | Object::Namespace(_)
        | Object::Secret(_)
        | Object::ListenerSet(_)
        | Object::BackendTlsPolicy(_)
        | Object::ConfigMap(_) => {}
    }
    p
}

pub const MAX_WEIGHT: i32 = 1_000_000;

fn push(p: &mut Problems, field: impl Into<String>, message: impl Into<String>) {
    p.push((field.into(), message.into()));
}

/// The CRDs' `maxItems`: a list of `count` `what` at `field` has at most
/// `max`.
fn at_most(p: &mut Problems, field: impl Into<String>, count: usize, max: usize, what: &str) {
    if count > max {
        push(
            p,
            field,
            format!("has {count} {what}; at most {max} are allowed"),
        );
    }
}

fn check_port(p: &mut Problems, field: String, port: i32) {
    if !(1..=65535).contains(&port) {
        push(p, field, format!("{port} is outside 1..=65535"));
    }
}

fn gateway_class(o: &GatewayClass, p: &mut Problems) {
    if o.spec.controller_name.is_empty() {
        push(p, "spec.controllerName", "is required");
    }
}

fn gateway(o: &Gateway, p: &mut Problems) {
    if o.spec.gateway_class_name.is_empty() {
        push(p, "spec.gatewayClassName", "is required");
    }
    let listeners = &o.spec.listeners;
    if listeners.is_empty() || listeners.len() > 64 {
        push(
            p,
            "spec.listeners",
            format!("has {} entries; 1 to 64 are allowed", listeners.len()),
        );
    }
    let mut names = HashSet::new();
    for (i, l) in listeners.iter().enumerate() {
        let f = format!("spec.listeners[{i}]");
        if !names.insert(l.name.as_str()) {
            push(
                p,
                format!("{f}.name"),
                format!(
                    "{:?} is used by another listener; names must be unique",
                    l.name
                ),
            );
        }
        check_port(p, format!("{f}.port"), l.port);
        if let Some(h) = &l.hostname
            && let Err(e) = check_hostname(h)
        {
            push(p, format!("{f}.hostname"), e);
        }
    }
    for (i, a) in o.spec.addresses.iter().flatten().enumerate() {
        let ty = a.r#type.as_deref().unwrap_or("IPAddress");
        if ty == "IPAddress"
            && let Some(v) = &a.value
            && v.parse::<IpAddr>().is_err()
        {
            push(
                p,
                format!("spec.addresses[{i}].value"),
                format!("{v:?} is not an IP address"),
            );
        }
    }
}

fn service(o: &Service, p: &mut Problems) {
    for (i, port) in o
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .enumerate()
    {
        check_port(p, format!("spec.ports[{i}].port"), port.port);
    }
}

/// RFC 1123 hostname, optionally with a `*.` prefix, and not an IP address
/// (the spec's `Hostname` type).
pub(crate) fn check_hostname(h: &str) -> Result<(), String> {
    if h.parse::<IpAddr>().is_ok() {
        return Err(format!("{h:?} is an IP address; a hostname is required"));
    }
    let rest = h.strip_prefix("*.").unwrap_or(h);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if h.len() > 253 || !rest.split('.').all(label_ok) {
        return Err(format!(
            "{h:?} is not a valid hostname (lower-case RFC 1123 labels, optionally prefixed by \"*.\")"
        ));
    }
    Ok(())
}

fn http_route(o: &HttpRoute, p: &mut Problems) {
    route_common(
        o.spec.hostnames.iter().flatten(),
        o.spec.parent_refs.iter().flatten().map(|r| r.port),
        p,
    );
    let rules = o.spec.rules.as_deref().unwrap_or_default();
    if rules.len() > 16 {
        push(
            p,
            "spec.rules",
            format!("has {} rules; at most 16 are allowed", rules.len()),
        );
    }
    for (i, rule) in rules.iter().enumerate() {
        http_rule(rule, &format!("spec.rules[{i}]"), p);
    }
    unique_rule_names(rules.iter().map(|r| r.name.as_deref()), p);
}

/// The CRDs' "Rule name must be unique within the route".
fn unique_rule_names<'a>(names: impl Iterator<Item = Option<&'a str>>, p: &mut Problems) {
    let mut seen = HashSet::new();
    for (i, name) in names.enumerate() {
        if let Some(name) = name
            && !seen.insert(name)
        {
            push(
                p,
                format!("spec.rules[{i}].name"),
                format!(
                    "{name:?} is used by another rule; rule names must be unique within the route"
                ),
            );
        }
    }
}

/// Hostnames and parentRef ports, as every route kind has them.
fn route_common<'a>(
    hostnames: impl Iterator<Item = &'a String>,
    parent_ports: impl Iterator<Item = Option<i32>>,
    p: &mut Problems,
) {
    for (i, h) in hostnames.enumerate() {
        if let Err(e) = check_hostname(h) {
            push(p, format!("spec.hostnames[{i}]"), e);
        }
    }
    for (i, port) in parent_ports.enumerate() {
        if let Some(port) = port {
            check_port(p, format!("spec.parentRefs[{i}].port"), port);
        }
    }
}

fn grpc_route(o: &GrpcRoute, p: &mut Problems) {
    let hostnames = o.spec.hostnames.as_deref().unwrap_or_default();
    at_most(p, "spec.hostnames", hostnames.len(), 16, "entries");
    route_common(
        hostnames.iter(),
        o.spec.parent_refs.iter().flatten().map(|r| r.port),
        p,
    );
    let rules = o.spec.rules.as_deref().unwrap_or_default();
    at_most(p, "spec.rules", rules.len(), 16, "rules");
    let total: usize = rules
        .iter()
        .map(|r| r.matches.as_ref().map_or(0, Vec::len))
        .sum();
    if total > 128 {
        push(
            p,
            "spec.rules",
            format!(
                "has {total} matches in all; the total number of matches across all rules in a route must be less than 128"
            ),
        );
    }
    for (i, rule) in rules.iter().enumerate() {
        let f = format!("spec.rules[{i}]");
        let matches = rule.matches.as_deref().unwrap_or_default();
        at_most(p, format!("{f}.matches"), matches.len(), 64, "entries");
        for (j, m) in matches.iter().enumerate() {
            grpc_match(m, &format!("{f}.matches[{j}]"), p);
        }
        // Filters, backendRefs and sessionPersistence are HTTPRoute's.
        match grpc_rule_as_http(rule) {
            Ok(http) => http_rule(&http, &f, p),
            Err(e) => push(p, f, format!("cannot be read: {e}")),
        }
    }
    unique_rule_names(rules.iter().map(|r| r.name.as_deref()), p);
}

/// The CRD's GRPCMethodMatch and GRPCHeaderMatch rules.
fn grpc_match(m: &GrpcRouteRulesMatches, f: &str, p: &mut Problems) {
    if let Some(method) = &m.method {
        let mf = format!("{f}.method");
        let exact = !matches!(
            method.r#type,
            Some(GrpcRouteRulesMatchesMethodType::RegularExpression)
        );
        if method.service.is_none() && method.method.is_none() {
            push(
                p,
                mf.clone(),
                "One or both of 'service' or 'method' must be specified",
            );
        }
        for (field, value) in [("service", &method.service), ("method", &method.method)] {
            let Some(value) = value else { continue };
            if value.len() > 1024 {
                push(p, format!("{mf}.{field}"), "is longer than 1024 characters");
            } else if !exact {
                if let Err(e) = regex::Regex::new(value) {
                    push(
                        p,
                        format!("{mf}.{field}"),
                        format!("invalid regular expression: {e}"),
                    );
                }
            } else if !grpc_name_ok(field, value) {
                let pattern = if field == "service" {
                    r"^(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$"
                } else {
                    r"^[A-Za-z_][A-Za-z_0-9]*$"
                };
                push(
                    p,
                    format!("{mf}.{field}"),
                    format!("{field} must only contain valid characters (matching {pattern})"),
                );
            }
        }
    }
    let headers = m.headers.as_deref().unwrap_or_default();
    at_most(p, format!("{f}.headers"), headers.len(), 16, "entries");
    for (k, h) in headers.iter().enumerate() {
        if HeaderName::from_bytes(h.name.as_bytes()).is_err() {
            push(
                p,
                format!("{f}.headers[{k}].name"),
                format!("{:?} is not a valid header name", h.name),
            );
        }
        if h.value.is_empty() {
            push(p, format!("{f}.headers[{k}].value"), "must not be empty");
        }
        if matches!(
            h.r#type,
            Some(GrpcRouteRulesMatchesHeadersType::RegularExpression)
        ) && let Err(e) = regex::Regex::new(&h.value)
        {
            push(
                p,
                format!("{f}.headers[{k}].value"),
                format!("invalid regular expression: {e}"),
            );
        }
    }
}

/// An Exact service (`pkg.Service`, an optional leading dot, letters in
/// any case) or method (`Method`) name, as the CRD's patterns allow.
fn grpc_name_ok(field: &str, value: &str) -> bool {
    let ident = |s: &str| {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if field == "method" {
        return ident(value);
    }
    let value = value.strip_prefix('.').unwrap_or(value);
    value.split('.').all(ident)
}

fn tls_route(o: &TlsRoute, p: &mut Problems) {
    let hostnames = &o.spec.hostnames;
    if hostnames.is_empty() || hostnames.len() > 1024 {
        push(
            p,
            "spec.hostnames",
            format!("has {} entries; 1 to 1024 are allowed", hostnames.len()),
        );
    }
    route_common(
        hostnames.iter(),
        o.spec.parent_refs.iter().flatten().map(|r| r.port),
        p,
    );
    if o.spec.rules.len() != 1 {
        push(
            p,
            "spec.rules",
            format!("has {} rules; exactly 1 is allowed", o.spec.rules.len()),
        );
    }
    for (i, rule) in o.spec.rules.iter().enumerate() {
        let f = format!("spec.rules[{i}]");
        let n = rule.backend_refs.len();
        if n == 0 || n > 16 {
            push(
                p,
                format!("{f}.backendRefs"),
                format!("has {n} entries; 1 to 16 are allowed"),
            );
        }
        match tls_backend_refs_as_http(&rule.backend_refs) {
            Ok(refs) => backend_refs(&refs, &f, true, p),
            Err(e) => push(
                p,
                format!("{f}.backendRefs"),
                format!("cannot be read: {e}"),
            ),
        }
    }
}

/// GEP-1619's `sessionPersistence` of a route rule, with the CRD's rules.
fn session_persistence(s: &HttpRouteRulesSessionPersistence, f: &str, p: &mut Problems) {
    let f = format!("{f}.sessionPersistence");
    for (field, value) in [
        ("absoluteTimeout", &s.absolute_timeout),
        ("idleTimeout", &s.idle_timeout),
    ] {
        if let Some(d) = value {
            match parse_gateway_duration(d) {
                Err(e) => push(p, format!("{f}.{field}"), e),
                Ok(d) if d.is_zero() => push(p, format!("{f}.{field}"), "must be longer than 0s"),
                Ok(_) => {}
            }
        }
    }
    let header = matches!(s.r#type, Some(HttpRouteRulesSessionPersistenceType::Header));
    if let Some(c) = &s.cookie_config {
        if header {
            push(
                p,
                format!("{f}.cookieConfig"),
                "cookieConfig can only be set with type Cookie",
            );
        }
        if matches!(
            c.lifetime_type,
            Some(HttpRouteRulesSessionPersistenceCookieConfigLifetimeType::Permanent)
        ) && s.absolute_timeout.is_none()
        {
            push(
                p,
                f.clone(),
                "AbsoluteTimeout must be specified when cookie lifetimeType is Permanent",
            );
        }
    }
    if let Some(name) = &s.session_name {
        let token = !name.is_empty()
            && name.len() <= 128
            && HeaderName::from_bytes(name.as_bytes()).is_ok();
        if !token {
            push(
                p,
                format!("{f}.sessionName"),
                format!(
                    "{name:?} is not a valid {} name (1 to 128 token characters)",
                    if header { "header" } else { "cookie" }
                ),
            );
        }
    }
}

fn http_rule(rule: &HttpRouteRules, f: &str, p: &mut Problems) {
    let matches = rule.matches.as_deref().unwrap_or_default();
    if matches.len() > 64 {
        push(
            p,
            format!("{f}.matches"),
            format!("has {} entries; at most 64 are allowed", matches.len()),
        );
    }
    for (j, m) in matches.iter().enumerate() {
        let mf = format!("{f}.matches[{j}]");
        if let Some(path) = &m.path {
            let value = path.value.as_deref().unwrap_or("/");
            match path.r#type {
                Some(HttpRouteRulesMatchesPathType::RegularExpression) => {
                    if let Err(e) = regex::Regex::new(value) {
                        push(
                            p,
                            format!("{mf}.path.value"),
                            format!("invalid regular expression: {e}"),
                        );
                    }
                }
                _ => {
                    if !value.starts_with('/') {
                        push(
                            p,
                            format!("{mf}.path.value"),
                            format!("{value:?} must be an absolute path and start with '/'"),
                        );
                    }
                }
            }
        }
        for (k, h) in m.headers.iter().flatten().enumerate() {
            if HeaderName::from_bytes(h.name.as_bytes()).is_err() {
                push(
                    p,
                    format!("{mf}.headers[{k}].name"),
                    format!("{:?} is not a valid header name", h.name),
                );
            }
            if matches!(h.r#type, Some(gateway_api::experimental::httproutes::HttpRouteRulesMatchesHeadersType::RegularExpression)) && let Err(e) = regex::Regex::new(&h.value) {
                push(p, format!("{mf}.headers[{k}].value"), format!("invalid regular expression: {e}"));
            }
        }
        for (k, q) in m.query_params.iter().flatten().enumerate() {
            if q.name.is_empty() {
                push(
                    p,
                    format!("{mf}.queryParams[{k}].name"),
                    "must not be empty",
                );
            }
            if matches!(q.r#type, Some(gateway_api::experimental::httproutes::HttpRouteRulesMatchesQueryParamsType::RegularExpression)) && let Err(e) = regex::Regex::new(&q.value) {
                push(p, format!("{mf}.queryParams[{k}].value"), format!("invalid regular expression: {e}"));
            }
        }
    }

    let prefix_match_only = matches.len() <= 1
        && matches.iter().all(|m| {
            m.path.as_ref().is_none_or(|path| {
                matches!(
                    path.r#type,
                    None | Some(HttpRouteRulesMatchesPathType::PathPrefix)
                )
            })
        });
    filters(
        rule.filters.as_deref().unwrap_or_default(),
        &format!("{f}.filters"),
        prefix_match_only,
        p,
    );

    backend_refs(
        rule.backend_refs.as_deref().unwrap_or_default(),
        f,
        prefix_match_only,
        p,
    );
    if let Some(sp) = &rule.session_persistence {
        session_persistence(sp, f, p);
    }

    if let Some(t) = &rule.timeouts {
        let request = t.request.as_deref().map(|d| (d, parse_gateway_duration(d)));
        let backend = t
            .backend_request
            .as_deref()
            .map(|d| (d, parse_gateway_duration(d)));
        if let Some((_, Err(e))) = &request {
            push(p, format!("{f}.timeouts.request"), e.clone());
        }
        if let Some((_, Err(e))) = &backend {
            push(p, format!("{f}.timeouts.backendRequest"), e.clone());
        }
        if let (Some((_, Ok(r))), Some((bd, Ok(b)))) = (&request, &backend)
            && !r.is_zero()
            && (b.is_zero() || b > r)
        {
            push(
                p,
                format!("{f}.timeouts.backendRequest"),
                format!("{bd:?} cannot be longer than request timeout"),
            );
        }
    }
}

/// A rule's backendRefs (at `f`, the rule's field): weights, ports and
/// backend filters.
fn backend_refs(
    refs: &[gateway_api::experimental::httproutes::HttpRouteRulesBackendRefs],
    f: &str,
    prefix_match_only: bool,
    p: &mut Problems,
) {
    for (j, b) in refs.iter().enumerate() {
        let bf = format!("{f}.backendRefs[{j}]");
        if let Some(w) = b.weight
            && !(0..=MAX_WEIGHT).contains(&w)
        {
            push(
                p,
                format!("{bf}.weight"),
                format!("{w} is outside 0..={MAX_WEIGHT}"),
            );
        }
        let is_service = b.group.as_deref().unwrap_or("").is_empty()
            && b.kind.as_deref().unwrap_or("Service") == "Service";
        match b.port {
            Some(port) => check_port(p, format!("{bf}.port"), port),
            None if is_service => push(
                p,
                format!("{bf}.port"),
                "is required for a Service reference",
            ),
            None => {}
        }
        // Backend filters have the same schema as rule filters.
        let converted: Vec<HttpRouteRulesFilters> = b
            .filters
            .iter()
            .flatten()
            .filter_map(|bf| {
                serde_json::to_value(bf)
                    .ok()
                    .and_then(|v| serde_json::from_value(v).ok())
            })
            .collect();
        filters(&converted, &format!("{bf}.filters"), prefix_match_only, p);
    }
}

fn filters(filters: &[HttpRouteRulesFilters], f: &str, prefix_match_only: bool, p: &mut Problems) {
    use HttpRouteRulesFiltersType as T;
    let mut seen = HashSet::new();
    for (k, flt) in filters.iter().enumerate() {
        let ff = format!("{f}[{k}]");
        let name = filter_type_name(&flt.r#type);
        if !matches!(flt.r#type, T::RequestMirror | T::ExtensionRef) && !seen.insert(name) {
            push(
                p,
                format!("{ff}.type"),
                format!("{name} filter cannot be repeated"),
            );
        }
        let present = match flt.r#type {
            T::RequestHeaderModifier => flt.request_header_modifier.is_some(),
            T::ResponseHeaderModifier => flt.response_header_modifier.is_some(),
            T::RequestMirror => flt.request_mirror.is_some(),
            T::RequestRedirect => flt.request_redirect.is_some(),
            T::UrlRewrite => flt.url_rewrite.is_some(),
            T::ExtensionRef => flt.extension_ref.is_some(),
            T::Cors => flt.cors.is_some(),
            T::ExternalAuth => flt.external_auth.is_some(),
        };
        if !present {
            push(
                p,
                ff.clone(),
                format!(
                    "filter.{} must be specified for {name} filter.type",
                    filter_field_name(&flt.r#type)
                ),
            );
        }
        let mut header_names = |field: &str, set: Vec<(&str, Option<&str>)>| {
            for (n, (hn, hv)) in set.into_iter().enumerate() {
                if HeaderName::from_bytes(hn.as_bytes()).is_err() {
                    push(
                        p,
                        format!("{ff}.{field}[{n}].name"),
                        format!("{hn:?} is not a valid header name"),
                    );
                }
                if let Some(v) = hv
                    && HeaderValue::from_str(v).is_err()
                {
                    push(
                        p,
                        format!("{ff}.{field}[{n}].value"),
                        format!("{v:?} is not a valid header value"),
                    );
                }
            }
        };
        if let Some(m) = &flt.request_header_modifier {
            header_names(
                "requestHeaderModifier.set",
                m.set
                    .iter()
                    .flatten()
                    .map(|h| (h.name.as_str(), Some(h.value.as_str())))
                    .collect(),
            );
            header_names(
                "requestHeaderModifier.add",
                m.add
                    .iter()
                    .flatten()
                    .map(|h| (h.name.as_str(), Some(h.value.as_str())))
                    .collect(),
            );
            header_names(
                "requestHeaderModifier.remove",
                m.remove
                    .iter()
                    .flatten()
                    .map(|h| (h.as_str(), None))
                    .collect(),
            );
        }
        if let Some(m) = &flt.response_header_modifier {
            header_names(
                "responseHeaderModifier.set",
                m.set
                    .iter()
                    .flatten()
                    .map(|h| (h.name.as_str(), Some(h.value.as_str())))
                    .collect(),
            );
            header_names(
                "responseHeaderModifier.add",
                m.add
                    .iter()
                    .flatten()
                    .map(|h| (h.name.as_str(), Some(h.value.as_str())))
                    .collect(),
            );
            header_names(
                "responseHeaderModifier.remove",
                m.remove
                    .iter()
                    .flatten()
                    .map(|h| (h.as_str(), None))
                    .collect(),
            );
        }
        if let Some(r) = &flt.request_redirect {
            if let Some(code) = r.status_code
                && ![301, 302, 303, 307, 308].contains(&code)
            {
                push(
                    p,
                    format!("{ff}.requestRedirect.statusCode"),
                    format!("{code} is not one of 301, 302, 303, 307, 308"),
                );
            }
            if let Some(port) = r.port {
                check_port(p, format!("{ff}.requestRedirect.port"), port);
            }
            if let Some(h) = &r.hostname
                && let Err(e) = check_hostname(h)
            {
                push(p, format!("{ff}.requestRedirect.hostname"), e);
            }
            if let Some(path) = &r.path {
                let prefix = matches!(path.r#type, gateway_api::experimental::httproutes::HttpRouteRulesFiltersRequestRedirectPathType::ReplacePrefixMatch);
                path_modifier(
                    p,
                    &format!("{ff}.requestRedirect.path"),
                    prefix,
                    path.replace_full_path.as_deref(),
                    path.replace_prefix_match.as_deref(),
                    prefix_match_only,
                    "RequestRedirect",
                );
            }
        }
        if let Some(r) = &flt.url_rewrite {
            if let Some(h) = &r.hostname
                && let Err(e) = check_hostname(h)
            {
                push(p, format!("{ff}.urlRewrite.hostname"), e);
            }
            if let Some(path) = &r.path {
                let prefix = matches!(path.r#type, gateway_api::experimental::httproutes::HttpRouteRulesFiltersUrlRewritePathType::ReplacePrefixMatch);
                path_modifier(
                    p,
                    &format!("{ff}.urlRewrite.path"),
                    prefix,
                    path.replace_full_path.as_deref(),
                    path.replace_prefix_match.as_deref(),
                    prefix_match_only,
                    "URLRewrite",
                );
            }
        }
        if let Some(m) = &flt.request_mirror {
            let mf = format!("{ff}.requestMirror");
            if m.percent.is_some() && m.fraction.is_some() {
                push(
                    p,
                    mf.clone(),
                    "Only one of percent or fraction may be specified",
                );
            }
            if let Some(pc) = m.percent
                && !(0..=100).contains(&pc)
            {
                push(
                    p,
                    format!("{mf}.percent"),
                    format!("{pc} is outside 0..=100"),
                );
            }
            if let Some(fr) = &m.fraction {
                let den = fr.denominator.unwrap_or(100);
                if den < 1 {
                    push(
                        p,
                        format!("{mf}.fraction.denominator"),
                        format!("{den} must be at least 1"),
                    );
                } else if fr.numerator < 0 || fr.numerator > den {
                    push(
                        p,
                        format!("{mf}.fraction.numerator"),
                        format!(
                            "{} must be between 0 and the denominator {den}",
                            fr.numerator
                        ),
                    );
                }
            }
            let b = &m.backend_ref;
            let is_service = b.group.as_deref().unwrap_or("").is_empty()
                && b.kind.as_deref().unwrap_or("Service") == "Service";
            match b.port {
                Some(port) => check_port(p, format!("{mf}.backendRef.port"), port),
                None if is_service => push(
                    p,
                    format!("{mf}.backendRef.port"),
                    "is required for a Service reference",
                ),
                None => {}
            }
        }
    }
    let has = |t: T| filters.iter().any(|f| f.r#type == t);
    if has(T::RequestRedirect) && has(T::UrlRewrite) {
        push(
            p,
            f.to_string(),
            "May specify either httpRouteFilterRequestRedirect or httpRouteFilterRequestRewrite, but not both",
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn path_modifier(
    p: &mut Problems,
    f: &str,
    is_prefix: bool,
    full: Option<&str>,
    prefix: Option<&str>,
    prefix_match_only: bool,
    filter: &str,
) {
    match (is_prefix, full, prefix) {
        (false, None, _) => push(
            p,
            f,
            "replaceFullPath must be specified when type is set to 'ReplaceFullPath'",
        ),
        (false, Some(_), Some(_)) => push(
            p,
            f,
            "type must be 'ReplacePrefixMatch' when replacePrefixMatch is set",
        ),
        (true, _, None) => push(
            p,
            f,
            "replacePrefixMatch must be specified when type is set to 'ReplacePrefixMatch'",
        ),
        (true, Some(_), Some(_)) => push(
            p,
            f,
            "type must be 'ReplaceFullPath' when replaceFullPath is set",
        ),
        _ => {}
    }
    if is_prefix && !prefix_match_only {
        push(
            p,
            f,
            format!(
                "When using {filter} filter with path.replacePrefixMatch, exactly one PathPrefix match must be specified"
            ),
        );
    }
}

pub(crate) fn filter_type_name(t: &HttpRouteRulesFiltersType) -> &'static str {
    use HttpRouteRulesFiltersType as T;
    match t {
        T::RequestHeaderModifier => "RequestHeaderModifier",
        T::ResponseHeaderModifier => "ResponseHeaderModifier",
        T::RequestMirror => "RequestMirror",
        T::RequestRedirect => "RequestRedirect",
        T::UrlRewrite => "URLRewrite",
        T::ExtensionRef => "ExtensionRef",
        T::Cors => "CORS",
        T::ExternalAuth => "ExternalAuth",
    }
}

fn filter_field_name(t: &HttpRouteRulesFiltersType) -> &'static str {
    use HttpRouteRulesFiltersType as T;
    match t {
        T::RequestHeaderModifier => "requestHeaderModifier",
        T::ResponseHeaderModifier => "responseHeaderModifier",
        T::RequestMirror => "requestMirror",
        T::RequestRedirect => "requestRedirect",
        T::UrlRewrite => "urlRewrite",
        T::ExtensionRef => "extensionRef",
        T::Cors => "cors",
        T::ExternalAuth => "externalAuth",
    }
}

#[cfg(test)]
mod tests {
    use crate::resources::parse_manifests;

    /// The (field, message) of every error for one document.
    fn problems(yaml: &str) -> Vec<(String, String)> {
        let parsed = parse_manifests(yaml, "t.yaml");
        parsed
            .errors
            .into_iter()
            .map(|e| (e.field.unwrap_or_default(), e.message))
            .collect()
    }

    fn route_rule(rule: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r}}\n\
             spec:\n  rules:\n  - {rule}\n"
        )
    }

    fn one_problem(yaml: &str, field: &str, message_part: &str) {
        let p = problems(yaml);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].0, field, "{p:?}");
        assert!(p[0].1.contains(message_part), "{p:?}");
    }

    #[test]
    fn valid_route_has_no_problems() {
        let yaml = route_rule(
            "matches: [{path: {type: PathPrefix, value: /api}, headers: [{name: x-canary, value: 'yes'}]}]\n    \
             filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}]\n    \
             backendRefs: [{name: a, port: 80, weight: 1000000}, {name: b, port: 80, weight: 0}]\n    \
             timeouts: {request: 10s, backendRequest: 2s}",
        );
        assert_eq!(problems(&yaml), vec![]);
    }

    #[test]
    fn weight_outside_range() {
        one_problem(
            &route_rule("backendRefs: [{name: a, port: 80, weight: -1}]"),
            "spec.rules[0].backendRefs[0].weight",
            "-1 is outside 0..=1000000",
        );
        one_problem(
            &route_rule("backendRefs: [{name: a, port: 80, weight: 1000001}]"),
            "spec.rules[0].backendRefs[0].weight",
            "outside",
        );
    }

    #[test]
    fn service_backend_needs_a_port() {
        one_problem(
            &route_rule("backendRefs: [{name: a}]"),
            "spec.rules[0].backendRefs[0].port",
            "required",
        );
        // Other kinds need none (they are reported as InvalidKind later).
        assert_eq!(
            problems(&route_rule(
                "backendRefs: [{name: a, kind: Bucket, group: x.io}]"
            )),
            vec![]
        );
    }

    #[test]
    fn ports_outside_range() {
        one_problem(
            &route_rule("backendRefs: [{name: a, port: 70000}]"),
            "spec.rules[0].backendRefs[0].port",
            "70000 is outside 1..=65535",
        );
        one_problem(
            "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 0}]}\n",
            "spec.ports[0].port",
            "outside",
        );
        one_problem(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: g}\n\
             spec: {gatewayClassName: c, listeners: [{name: h, port: 0, protocol: HTTP}]}\n",
            "spec.listeners[0].port",
            "outside",
        );
    }

    #[test]
    fn invalid_regexes() {
        one_problem(
            &route_rule("matches: [{path: {type: RegularExpression, value: '/a('}}]"),
            "spec.rules[0].matches[0].path.value",
            "invalid regular expression",
        );
        one_problem(
            &route_rule("matches: [{headers: [{name: x, type: RegularExpression, value: '[a'}]}]"),
            "spec.rules[0].matches[0].headers[0].value",
            "invalid regular expression",
        );
        one_problem(
            &route_rule(
                "matches: [{queryParams: [{name: q, type: RegularExpression, value: '(?'}]}]",
            ),
            "spec.rules[0].matches[0].queryParams[0].value",
            "invalid regular expression",
        );
    }

    #[test]
    fn paths_must_be_absolute() {
        one_problem(
            &route_rule("matches: [{path: {type: Exact, value: api}}]"),
            "spec.rules[0].matches[0].path.value",
            "start with '/'",
        );
    }

    #[test]
    fn invalid_header_names() {
        one_problem(
            &route_rule("matches: [{headers: [{name: 'bad header', value: x}]}]"),
            "spec.rules[0].matches[0].headers[0].name",
            "not a valid header name",
        );
        one_problem(
            &route_rule(
                "filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: 'a:b', value: x}]}}]",
            ),
            "spec.rules[0].filters[0].requestHeaderModifier.set[0].name",
            "not a valid header name",
        );
    }

    #[test]
    fn too_many_rules() {
        let rules = "  - {}\n".repeat(17);
        let yaml = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r}}\nspec:\n  rules:\n{rules}"
        );
        one_problem(&yaml, "spec.rules", "at most 16");
    }

    #[test]
    fn filter_without_its_configuration() {
        one_problem(
            &route_rule("filters: [{type: RequestRedirect}]"),
            "spec.rules[0].filters[0]",
            "filter.requestRedirect must be specified",
        );
    }

    #[test]
    fn redirect_and_rewrite_together_and_repeated_filters() {
        let p = problems(&route_rule(
            "filters: [{type: RequestRedirect, requestRedirect: {}}, {type: URLRewrite, urlRewrite: {}}]",
        ));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].1.contains("not both"));
        one_problem(
            &route_rule(
                "filters: [{type: URLRewrite, urlRewrite: {}}, {type: URLRewrite, urlRewrite: {}}]",
            ),
            "spec.rules[0].filters[1].type",
            "cannot be repeated",
        );
    }

    #[test]
    fn replace_prefix_match_needs_one_prefix_match() {
        one_problem(
            &route_rule(
                "matches: [{path: {type: Exact, value: /a}}]\n    \
                 filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]",
            ),
            "spec.rules[0].filters[0].urlRewrite.path",
            "exactly one PathPrefix match",
        );
    }

    #[test]
    fn redirect_status_code() {
        one_problem(
            &route_rule("filters: [{type: RequestRedirect, requestRedirect: {statusCode: 304}}]"),
            "spec.rules[0].filters[0].requestRedirect.statusCode",
            "304",
        );
    }

    #[test]
    fn mirror_percent_and_fraction() {
        one_problem(
            &route_rule(
                "filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}, percent: 101}}]",
            ),
            "spec.rules[0].filters[0].requestMirror.percent",
            "outside",
        );
        one_problem(
            &route_rule(
                "filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}, fraction: {numerator: 3, denominator: 2}}}]",
            ),
            "spec.rules[0].filters[0].requestMirror.fraction.numerator",
            "denominator",
        );
    }

    #[test]
    fn timeouts() {
        one_problem(
            &route_rule("timeouts: {request: 10 s}"),
            "spec.rules[0].timeouts.request",
            "not a Gateway API duration",
        );
        one_problem(
            &route_rule("timeouts: {request: 1s, backendRequest: 2s}"),
            "spec.rules[0].timeouts.backendRequest",
            "cannot be longer",
        );
    }

    #[test]
    fn hostnames() {
        let yaml = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\n\
                    spec: {hostnames: ['*.example.com', 'Bad_Host', '10.0.0.1']}\n";
        let p = problems(yaml);
        let fields: Vec<&str> = p.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            vec!["spec.hostnames[1]", "spec.hostnames[2]"],
            "{p:?}"
        );
    }

    #[test]
    fn gateway_listener_names_unique_and_addresses_are_ips() {
        let yaml = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: g}\n\
                    spec:\n  gatewayClassName: c\n  addresses: [{value: not-an-ip}, {type: Hostname, value: a.b}]\n  \
                    listeners: [{name: h, port: 80, protocol: HTTP}, {name: h, port: 81, protocol: HTTP}]\n";
        let p = problems(yaml);
        let fields: Vec<&str> = p.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            vec!["spec.listeners[1].name", "spec.addresses[0].value"],
            "{p:?}"
        );
    }

    fn grpc_rule(rule: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{name: g}}\n\
             spec:\n  rules:\n  - {rule}\n"
        )
    }

    #[test]
    fn grpc_routes_are_checked_like_the_crd_does() {
        assert_eq!(
            problems(&grpc_rule(
                "matches: [{method: {service: grpc.examples.echo.Echo, method: Echo}, headers: [{name: version, value: one}]}]\n    \
                 backendRefs: [{name: a, port: 80, weight: 3}]\n    \
                 filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}}}]"
            )),
            vec![]
        );
        one_problem(
            &grpc_rule("matches: [{method: {type: Exact}}]"),
            "spec.rules[0].matches[0].method",
            "One or both of 'service' or 'method'",
        );
        one_problem(
            &grpc_rule("matches: [{method: {service: 'a/b'}}]"),
            "spec.rules[0].matches[0].method.service",
            "valid characters",
        );
        one_problem(
            &grpc_rule("matches: [{method: {method: 'Echo.Two'}}]"),
            "spec.rules[0].matches[0].method.method",
            "valid characters",
        );
        one_problem(
            &grpc_rule("matches: [{method: {type: RegularExpression, service: '(x'}}]"),
            "spec.rules[0].matches[0].method.service",
            "invalid regular expression",
        );
        one_problem(
            &grpc_rule("backendRefs: [{name: a, port: 80, weight: -2}]"),
            "spec.rules[0].backendRefs[0].weight",
            "outside",
        );
        one_problem(
            &grpc_rule("backendRefs: [{name: a}]"),
            "spec.rules[0].backendRefs[0].port",
            "required",
        );
        one_problem(
            &grpc_rule("filters: [{type: RequestHeaderModifier}]"),
            "spec.rules[0].filters[0]",
            "must be specified",
        );
        // A leading dot and upper-case letters are allowed in a service.
        assert_eq!(
            problems(&grpc_rule("matches: [{method: {service: .Pkg.Svc_1}}]")),
            vec![]
        );
    }

    #[test]
    fn rule_names_are_unique() {
        one_problem(
            &grpc_rule("{name: a}\n  - {name: a}"),
            "spec.rules[1].name",
            "unique",
        );
        one_problem(
            &route_rule("{name: a}\n  - {name: a}"),
            "spec.rules[1].name",
            "unique",
        );
    }

    fn tls_route(spec: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: TLSRoute\nmetadata: {{name: t}}\nspec:\n{spec}"
        )
    }

    #[test]
    fn tls_routes_need_hostnames_and_one_rule_with_backends() {
        assert_eq!(
            problems(&tls_route(
                "  hostnames: [abc.example.com, '*.example.org']\n  rules: [{backendRefs: [{name: db, port: 443, weight: 2}]}]\n"
            )),
            vec![]
        );
        one_problem(
            &tls_route("  hostnames: []\n  rules: [{backendRefs: [{name: db, port: 443}]}]\n"),
            "spec.hostnames",
            "1 to 1024",
        );
        one_problem(
            &tls_route(
                "  hostnames: [a.b]\n  rules: [{backendRefs: [{name: db, port: 443}]}, {backendRefs: [{name: db, port: 443}]}]\n",
            ),
            "spec.rules",
            "exactly 1",
        );
        one_problem(
            &tls_route("  hostnames: [a.b]\n  rules: [{backendRefs: [{name: db}]}]\n"),
            "spec.rules[0].backendRefs[0].port",
            "required",
        );
        one_problem(
            &tls_route(
                "  hostnames: [10.0.0.1]\n  rules: [{backendRefs: [{name: db, port: 1}]}]\n",
            ),
            "spec.hostnames[0]",
            "IP address",
        );
        // Without hostnames the v1 schema refuses the object, naming it.
        let p = problems(&tls_route(
            "  rules: [{backendRefs: [{name: db, port: 1}]}]\n",
        ));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].1.contains("hostnames"), "{p:?}");
    }

    #[test]
    fn session_persistence_is_checked_like_the_crd_does() {
        assert_eq!(
            problems(&route_rule(
                "sessionPersistence: {sessionName: sid, absoluteTimeout: 1h, idleTimeout: 10m, cookieConfig: {lifetimeType: Permanent}}"
            )),
            vec![]
        );
        one_problem(
            &route_rule("sessionPersistence: {cookieConfig: {lifetimeType: Permanent}}"),
            "spec.rules[0].sessionPersistence",
            "AbsoluteTimeout must be specified",
        );
        one_problem(
            &route_rule(
                "sessionPersistence: {type: Header, cookieConfig: {lifetimeType: Session}}",
            ),
            "spec.rules[0].sessionPersistence.cookieConfig",
            "only be set with type Cookie",
        );
        one_problem(
            &route_rule("sessionPersistence: {absoluteTimeout: 1 hour}"),
            "spec.rules[0].sessionPersistence.absoluteTimeout",
            "duration",
        );
        one_problem(
            &route_rule("sessionPersistence: {sessionName: 'a b'}"),
            "spec.rules[0].sessionPersistence.sessionName",
            "cookie name",
        );
        one_problem(
            &grpc_rule("sessionPersistence: {type: Header, idleTimeout: 0s}"),
            "spec.rules[0].sessionPersistence.idleTimeout",
            "longer than 0s",
        );
    }

    #[test]
    fn gateway_class_needs_a_controller() {
        one_problem(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: c}\nspec: {controllerName: ''}\n",
            "spec.controllerName",
            "required",
        );
    }
}
