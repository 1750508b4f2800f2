//! HTTPRoute filters, compiled: header modifiers, redirects, rewrites,
//! mirrors and CORS (rule-level and backendRef-level share one schema).
//!
//! Per the spec, an unknown or unsupported filter type must not be skipped:
//! "Unknown values here must result in the implementation setting the
//! Accepted Condition for the Route to `status: False`, with a Reason of
//! `UnsupportedValue`". A mirror whose backendRef does not resolve is
//! reported in `ResolvedRefs` and dropped (mirrors never affect the client).

use std::sync::Arc;

use gateway_api::experimental::httproutes::{
    HttpRouteRulesBackendRefsFilters, HttpRouteRulesFilters, HttpRouteRulesFiltersCors,
    HttpRouteRulesFiltersRequestRedirectPathType, HttpRouteRulesFiltersRequestRedirectScheme,
    HttpRouteRulesFiltersType, HttpRouteRulesFiltersUrlRewritePathType,
};
use http::{HeaderName, HeaderValue, StatusCode};

use super::backends::{BackendRefFields, BackendResolver, RefFailure, Resolution, backend_target};
use crate::resources::filter_type_name;
use crate::route::{
    Backend, CorsList, CorsPolicy, Filter, HeaderModifier, Mirror, OriginPattern, PathModifier,
    Redirect, RouteKind, UrlRewrite,
};

/// What compiling a list of filters produced.
#[derive(Debug, Default)]
pub(crate) struct CompiledFilters {
    pub filters: Vec<Filter>,
    /// Filters sluice cannot honour: the route is not accepted.
    pub unsupported: Vec<String>,
    /// Mirror backendRefs that did not resolve (the mirror is dropped).
    pub ref_failures: Vec<RefFailure>,
    pub warnings: Vec<String>,
}

/// Backend filters have the same schema as rule filters; convert them so
/// one compiler handles both.
pub(crate) fn backend_filters_as_rule_filters(
    filters: &[HttpRouteRulesBackendRefsFilters],
) -> Result<Vec<HttpRouteRulesFilters>, String> {
    filters
        .iter()
        .map(|f| {
            serde_json::to_value(f)
                .and_then(serde_json::from_value)
                .map_err(|e| format!("backendRef filter cannot be read: {e}"))
        })
        .collect()
}

/// Compile `filters` found at `field` (`spec.rules[0].filters`). Mirror
/// backends get ids `<id_prefix>/mirror/<k>`.
pub(crate) fn compile_filters(
    kind: RouteKind,
    filters: &[HttpRouteRulesFilters],
    field: &str,
    id_prefix: &str,
    route_ns: &str,
    resolver: &BackendResolver<'_>,
) -> CompiledFilters {
    use HttpRouteRulesFiltersType as T;
    let mut out = CompiledFilters::default();
    for (k, f) in filters.iter().enumerate() {
        let ff = format!("{field}[{k}]");
        let missing = |out: &mut CompiledFilters, what: &str| {
            out.unsupported.push(format!(
                "{ff}: filter.{what} must be specified for {} filter.type",
                filter_type_name(&f.r#type)
            ));
        };
        match f.r#type {
            T::RequestHeaderModifier => match &f.request_header_modifier {
                Some(m) => match header_modifier(
                    m.set
                        .iter()
                        .flatten()
                        .map(|h| (h.name.as_str(), h.value.as_str())),
                    m.add
                        .iter()
                        .flatten()
                        .map(|h| (h.name.as_str(), h.value.as_str())),
                    m.remove.iter().flatten().map(String::as_str),
                ) {
                    Ok(m) => out.filters.push(Filter::RequestHeaderModifier(m)),
                    Err(e) => out
                        .unsupported
                        .push(format!("{ff}.requestHeaderModifier: {e}")),
                },
                None => missing(&mut out, "requestHeaderModifier"),
            },
            T::ResponseHeaderModifier => match &f.response_header_modifier {
                Some(m) => match header_modifier(
                    m.set
                        .iter()
                        .flatten()
                        .map(|h| (h.name.as_str(), h.value.as_str())),
                    m.add
                        .iter()
                        .flatten()
                        .map(|h| (h.name.as_str(), h.value.as_str())),
                    m.remove.iter().flatten().map(String::as_str),
                ) {
                    Ok(m) => out.filters.push(Filter::ResponseHeaderModifier(m)),
                    Err(e) => out
                        .unsupported
                        .push(format!("{ff}.responseHeaderModifier: {e}")),
                },
                None => missing(&mut out, "responseHeaderModifier"),
            },
            T::RequestRedirect => match &f.request_redirect {
                Some(r) => {
                    let path = r.path.as_ref().map(|p| {
                        let prefix = matches!(
                            p.r#type,
                            HttpRouteRulesFiltersRequestRedirectPathType::ReplacePrefixMatch
                        );
                        path_modifier(
                            prefix,
                            p.replace_full_path.as_deref(),
                            p.replace_prefix_match.as_deref(),
                        )
                    });
                    let status = StatusCode::from_u16(
                        r.status_code
                            .and_then(|c| u16::try_from(c).ok())
                            .unwrap_or(302),
                    )
                    .ok()
                    .filter(|s| [301, 302, 303, 307, 308].contains(&s.as_u16()));
                    let port = r.port.map(u16::try_from);
                    match (path.transpose(), status, port.transpose()) {
                        (Ok(path), Some(status), Ok(port)) => out.filters.push(Filter::RequestRedirect(Redirect {
                            scheme: r.scheme.as_ref().map(|s| match s {
                                HttpRouteRulesFiltersRequestRedirectScheme::Http => "http".to_string(),
                                HttpRouteRulesFiltersRequestRedirectScheme::Https => "https".to_string(),
                            }),
                            hostname: r.hostname.clone(),
                            path,
                            port,
                            status,
                        })),
                        (Err(e), _, _) => out.unsupported.push(format!("{ff}.requestRedirect.path: {e}")),
                        (_, None, _) => out.unsupported.push(format!(
                            "{ff}.requestRedirect.statusCode: {:?} is not one of 301, 302, 303, 307, 308",
                            r.status_code
                        )),
                        (_, _, Err(_)) => out.unsupported.push(format!("{ff}.requestRedirect.port: outside 1..=65535")),
                    }
                }
                None => missing(&mut out, "requestRedirect"),
            },
            T::UrlRewrite => match &f.url_rewrite {
                Some(r) => {
                    let path = r.path.as_ref().map(|p| {
                        let prefix = matches!(
                            p.r#type,
                            HttpRouteRulesFiltersUrlRewritePathType::ReplacePrefixMatch
                        );
                        path_modifier(
                            prefix,
                            p.replace_full_path.as_deref(),
                            p.replace_prefix_match.as_deref(),
                        )
                    });
                    match path.transpose() {
                        Ok(path) => out.filters.push(Filter::UrlRewrite(UrlRewrite {
                            hostname: r.hostname.clone(),
                            path,
                        })),
                        Err(e) => out.unsupported.push(format!("{ff}.urlRewrite.path: {e}")),
                    }
                }
                None => missing(&mut out, "urlRewrite"),
            },
            T::RequestMirror => match &f.request_mirror {
                Some(m) => {
                    let b = &m.backend_ref;
                    let fields = BackendRefFields {
                        group: b.group.as_deref(),
                        kind: b.kind.as_deref(),
                        name: &b.name,
                        namespace: b.namespace.as_deref(),
                        port: b.port,
                    };
                    let label = BackendResolver::label(route_ns, &fields);
                    let (numerator, denominator) = match (m.percent, &m.fraction) {
                        (Some(p), _) => (p, 100),
                        (None, Some(fr)) => (fr.numerator, fr.denominator.unwrap_or(100)),
                        (None, None) => (100, 100),
                    };
                    let (Ok(numerator), Ok(denominator)) =
                        (u32::try_from(numerator), u32::try_from(denominator))
                    else {
                        out.unsupported.push(format!(
                            "{ff}.requestMirror: percent or fraction is negative"
                        ));
                        continue;
                    };
                    if denominator == 0 || numerator > denominator {
                        out.unsupported.push(format!(
                            "{ff}.requestMirror: fraction {numerator}/{denominator} is not between 0 and 1"
                        ));
                        continue;
                    }
                    match resolver.resolve(kind, route_ns, &fields) {
                        Resolution::Unresolved { reason, message } => {
                            out.ref_failures.push(RefFailure {
                                reason,
                                message: format!(
                                    "{ff}.requestMirror: {message}; the mirror is dropped"
                                ),
                            });
                        }
                        resolution => {
                            if resolution == Resolution::NoReadyEndpoints {
                                out.warnings.push(format!(
                                    "{ff}: mirror backend {label} has no ready endpoints; nothing is mirrored"
                                ));
                            }
                            out.filters.push(Filter::RequestMirror(Mirror::new(
                                Arc::new(Backend {
                                    id: format!("{id_prefix}/mirror/{k}"),
                                    service: label,
                                    weight: 1,
                                    target: backend_target(resolution),
                                    filters: Vec::new(),
                                }),
                                numerator,
                                denominator,
                            )));
                        }
                    }
                }
                None => missing(&mut out, "requestMirror"),
            },
            T::Cors => match &f.cors {
                Some(c) => match compile_cors(c) {
                    Ok(c) => out.filters.push(Filter::Cors(c)),
                    Err(e) => out.unsupported.push(format!("{ff}.cors.{e}")),
                },
                None => missing(&mut out, "cors"),
            },
            T::ExtensionRef | T::ExternalAuth => {
                out.unsupported.push(format!(
                    "{ff}: filter type {} is not supported by sluice",
                    filter_type_name(&f.r#type)
                ));
            }
        }
    }
    out
}

/// Methods `allowMethods` may name (RFC 9110), besides `*`.
const CORS_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// The spec's default `maxAge`: "the gateway sets the response header
/// `Access-Control-Max-Age: 5` by default".
const CORS_DEFAULT_MAX_AGE: i32 = 5;

/// Compile a CORS filter. The error starts with the field name (relative to
/// `cors`). As the CRD says, `*` may not appear next to other entries.
pub(crate) fn compile_cors(c: &HttpRouteRulesFiltersCors) -> Result<CorsPolicy, String> {
    fn lone_wildcard(field: &str, items: &[String]) -> Result<(), String> {
        if items.len() > 1 && items.iter().any(|i| i == "*") {
            return Err(format!(
                "{field}: \"*\" cannot appear alongside other entries"
            ));
        }
        Ok(())
    }
    fn list(
        field: &str,
        items: Option<&[String]>,
        valid: impl Fn(&str) -> bool,
    ) -> Result<CorsList, String> {
        let Some(items) = items.filter(|i| !i.is_empty()) else {
            return Ok(CorsList::Unset);
        };
        lone_wildcard(field, items)?;
        if items.len() == 1 && items[0] == "*" {
            return Ok(CorsList::Wildcard);
        }
        for (n, item) in items.iter().enumerate() {
            if !valid(item) {
                return Err(format!("{field}[{n}]: {item:?} is not valid here"));
            }
        }
        HeaderValue::from_str(&items.join(", "))
            .map(CorsList::Names)
            .map_err(|_| format!("{field}: not a valid header value"))
    }
    let header_name = |h: &str| HeaderName::from_bytes(h.as_bytes()).is_ok();

    let origins = c.allow_origins.as_deref().unwrap_or_default();
    lone_wildcard("allowOrigins", origins)?;
    let allow_origins = origins
        .iter()
        .enumerate()
        .map(|(n, o)| OriginPattern::parse(o).map_err(|e| format!("allowOrigins[{n}]: {e}")))
        .collect::<Result<_, _>>()?;
    let max_age = c.max_age.unwrap_or(CORS_DEFAULT_MAX_AGE);
    let max_age = u32::try_from(max_age).map_err(|_| format!("maxAge: {max_age} is negative"))?;
    Ok(CorsPolicy {
        allow_origins,
        allow_credentials: c.allow_credentials.unwrap_or(false),
        allow_methods: list("allowMethods", c.allow_methods.as_deref(), |m| {
            CORS_METHODS.contains(&m)
        })?,
        allow_headers: list("allowHeaders", c.allow_headers.as_deref(), header_name)?,
        expose_headers: list("exposeHeaders", c.expose_headers.as_deref(), header_name)?,
        max_age: HeaderValue::from(max_age),
    })
}

fn path_modifier(
    prefix: bool,
    full: Option<&str>,
    prefix_match: Option<&str>,
) -> Result<PathModifier, String> {
    match (prefix, full, prefix_match) {
        (false, Some(p), None) => Ok(PathModifier::ReplaceFullPath(p.to_string())),
        (true, None, Some(p)) => Ok(PathModifier::ReplacePrefixMatch(p.to_string())),
        (false, _, _) => Err(
            "replaceFullPath must be specified (and only it) when type is 'ReplaceFullPath'".into(),
        ),
        (true, _, _) => Err(
            "replacePrefixMatch must be specified (and only it) when type is 'ReplacePrefixMatch'"
                .into(),
        ),
    }
}

fn header_modifier<'a>(
    set: impl Iterator<Item = (&'a str, &'a str)>,
    add: impl Iterator<Item = (&'a str, &'a str)>,
    remove: impl Iterator<Item = &'a str>,
) -> Result<HeaderModifier, String> {
    let name = |n: &str| {
        HeaderName::from_bytes(n.as_bytes())
            .map_err(|_| format!("{n:?} is not a valid header name"))
    };
    let pair = |(n, v): (&str, &str)| -> Result<(HeaderName, HeaderValue), String> {
        Ok((
            name(n)?,
            HeaderValue::from_str(v).map_err(|_| format!("{v:?} is not a valid header value"))?,
        ))
    };
    Ok(HeaderModifier {
        set: set.map(pair).collect::<Result<_, _>>()?,
        add: add.map(pair).collect::<Result<_, _>>()?,
        remove: remove.map(name).collect::<Result<_, _>>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Snapshot;
    use crate::translate::conditions::Reason;

    fn compile(yaml: &str) -> CompiledFilters {
        let filters: Vec<HttpRouteRulesFilters> =
            crate::yaml::from_str(yaml).expect("test filters parse");
        let snapshot = Snapshot::default();
        let resolver = BackendResolver::new(&snapshot);
        compile_filters(
            RouteKind::Http,
            &filters,
            "spec.rules[0].filters",
            "httproute/default/r/rule/0",
            "default",
            &resolver,
        )
    }

    #[test]
    fn header_modifiers_keep_set_add_remove() {
        let c = compile(
            "[{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-A, value: '1'}], add: [{name: x-b, value: '2'}], remove: [x-c]}}]",
        );
        assert!(c.unsupported.is_empty(), "{:?}", c.unsupported);
        let Filter::RequestHeaderModifier(m) = &c.filters[0] else {
            panic!("{:?}", c.filters)
        };
        assert_eq!(m.set[0].0, "x-a");
        assert_eq!(m.add[0].1, "2");
        assert_eq!(m.remove[0], "x-c");
    }

    #[test]
    fn redirect_defaults_to_302() {
        let c = compile("[{type: RequestRedirect, requestRedirect: {scheme: https, port: 8443}}]");
        let Filter::RequestRedirect(r) = &c.filters[0] else {
            panic!("{:?}", c.filters)
        };
        assert_eq!(r.status, StatusCode::FOUND);
        assert_eq!(r.scheme.as_deref(), Some("https"));
        assert_eq!(r.port, Some(8443));
    }

    #[test]
    fn unsupported_types_are_reported() {
        let c = compile("[{type: ExtensionRef, extensionRef: {group: x.io, kind: K, name: n}}]");
        assert!(c.filters.is_empty());
        assert_eq!(c.unsupported.len(), 1);
        assert!(
            c.unsupported[0].contains("ExtensionRef"),
            "{:?}",
            c.unsupported
        );
    }

    #[test]
    fn cors_compiles_lists_and_defaults() {
        let c = compile(
            "[{type: CORS, cors: {allowOrigins: ['https://www.foo.com', 'https://*.bar.com'], allowMethods: [GET, OPTIONS], allowHeaders: [x-header-1, x-header-2], exposeHeaders: ['*'], allowCredentials: true}}]",
        );
        assert!(c.unsupported.is_empty(), "{:?}", c.unsupported);
        let Filter::Cors(p) = &c.filters[0] else {
            panic!("{:?}", c.filters)
        };
        assert_eq!(p.allow_origins.len(), 2);
        assert!(p.allows_origin("https://a.bar.com"));
        assert!(p.allow_credentials);
        assert_eq!(
            p.allow_methods,
            CorsList::Names(HeaderValue::from_static("GET, OPTIONS"))
        );
        assert_eq!(
            p.allow_headers,
            CorsList::Names(HeaderValue::from_static("x-header-1, x-header-2"))
        );
        assert_eq!(p.expose_headers, CorsList::Wildcard);
        assert_eq!(p.max_age, "5", "the spec's default maxAge");
    }

    #[test]
    fn invalid_cors_is_unsupported_and_names_the_field() {
        for (yaml, field) in [
            (
                "{allowOrigins: ['*', 'https://a.com']}",
                "cors.allowOrigins",
            ),
            ("{allowOrigins: ['ftp://a.com']}", "cors.allowOrigins[0]"),
            ("{allowMethods: [GET, FETCH]}", "cors.allowMethods[1]"),
            ("{allowHeaders: ['bad header']}", "cors.allowHeaders[0]"),
            ("{maxAge: -1}", "cors.maxAge"),
        ] {
            let c = compile(&format!("[{{type: CORS, cors: {yaml}}}]"));
            assert!(c.filters.is_empty(), "{yaml}");
            assert_eq!(c.unsupported.len(), 1, "{yaml}");
            assert!(
                c.unsupported[0].starts_with(&format!("spec.rules[0].filters[0].{field}")),
                "{yaml}: {:?}",
                c.unsupported
            );
        }
    }

    #[test]
    fn unresolvable_mirror_is_dropped_and_reported() {
        let c = compile(
            "[{type: RequestMirror, requestMirror: {backendRef: {name: gone, port: 80}, percent: 10}}]",
        );
        assert!(c.filters.is_empty());
        assert_eq!(c.ref_failures.len(), 1);
        assert_eq!(c.ref_failures[0].reason, Reason::BackendNotFound);
    }
}
