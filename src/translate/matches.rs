//! HTTPRouteMatch and rule timeouts, compiled for the route table.
//!
//! Per the spec: "If no matches are specified, the default is a prefix path
//! match on '/'"; a path match without a type is a PathPrefix, without a
//! value it is "/"; "If multiple entries specify equivalent header names,
//! only the first entry with an equivalent name MUST be considered for a
//! match" (likewise query parameters, whose names are case-sensitive).

use gateway_api::experimental::httproutes::{
    HttpRouteRulesMatches, HttpRouteRulesMatchesHeadersType, HttpRouteRulesMatchesMethod,
    HttpRouteRulesMatchesPathType, HttpRouteRulesMatchesQueryParamsType, HttpRouteRulesTimeouts,
};
use http::{HeaderName, Method};

use crate::resources::parse_gateway_duration;
use crate::route::{HeaderMatch, PathMatch, QueryMatch, RequestMatch, Timeouts, ValueMatch};

/// Compile one entry of a rule's `matches`. The error names the field
/// (relative to the match) and what is wrong with it.
pub(crate) fn compile_match(m: &HttpRouteRulesMatches) -> Result<RequestMatch, String> {
    let path = match &m.path {
        None => PathMatch::prefix("/"),
        Some(p) => {
            let value = p.value.as_deref().unwrap_or("/");
            match p.r#type {
                Some(HttpRouteRulesMatchesPathType::Exact) => PathMatch::Exact(value.to_string()),
                Some(HttpRouteRulesMatchesPathType::RegularExpression) => {
                    PathMatch::regex(value)
                        .map_err(|e| format!("path.value: invalid regular expression: {e}"))?
                }
                Some(HttpRouteRulesMatchesPathType::PathPrefix) | None => PathMatch::prefix(value),
            }
        }
    };
    let headers = header_matches(m.headers.iter().flatten().map(|h| {
        let regex = matches!(
            h.r#type,
            Some(HttpRouteRulesMatchesHeadersType::RegularExpression)
        );
        (h.name.as_str(), h.value.as_str(), regex)
    }))?;
    let mut query: Vec<QueryMatch> = Vec::new();
    for (i, q) in m.query_params.iter().flatten().enumerate() {
        if query.iter().any(|seen| seen.name == q.name) {
            continue;
        }
        let value = match q.r#type {
            Some(HttpRouteRulesMatchesQueryParamsType::RegularExpression) => {
                ValueMatch::regex(&q.value).map_err(|e| {
                    format!("queryParams[{i}].value: invalid regular expression: {e}")
                })?
            }
            _ => ValueMatch::Exact(q.value.clone()),
        };
        query.push(QueryMatch {
            name: q.name.clone(),
            value,
        });
    }
    Ok(RequestMatch {
        path,
        method: m.method.as_ref().map(method),
        headers,
        query,
    })
}

/// Header conditions from `(name, value, is a regular expression)`
/// entries (HTTPRoute's and GRPCRoute's have the same rules). The error
/// names the field relative to the match.
pub(crate) fn header_matches<'a>(
    entries: impl Iterator<Item = (&'a str, &'a str, bool)>,
) -> Result<Vec<HeaderMatch>, String> {
    let mut headers: Vec<HeaderMatch> = Vec::new();
    for (i, (name, value, regex)) in entries.enumerate() {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("headers[{i}].name: {name:?} is not a valid header name"))?;
        if headers.iter().any(|seen| seen.name == name) {
            continue; // the first entry with an equivalent name wins
        }
        let value = if regex {
            ValueMatch::regex(value)
                .map_err(|e| format!("headers[{i}].value: invalid regular expression: {e}"))?
        } else {
            ValueMatch::Exact(value.to_string())
        };
        headers.push(HeaderMatch { name, value });
    }
    Ok(headers)
}

fn method(m: &HttpRouteRulesMatchesMethod) -> Method {
    use HttpRouteRulesMatchesMethod as M;
    match m {
        M::Get => Method::GET,
        M::Head => Method::HEAD,
        M::Post => Method::POST,
        M::Put => Method::PUT,
        M::Delete => Method::DELETE,
        M::Connect => Method::CONNECT,
        M::Options => Method::OPTIONS,
        M::Trace => Method::TRACE,
        M::Patch => Method::PATCH,
    }
}

/// Rule `timeouts`. "0s" (and an absent field) means no timeout.
pub(crate) fn compile_timeouts(t: Option<&HttpRouteRulesTimeouts>) -> Result<Timeouts, String> {
    let Some(t) = t else {
        return Ok(Timeouts::default());
    };
    let parse = |field: &str, v: Option<&String>| -> Result<_, String> {
        match v {
            None => Ok(None),
            Some(v) => {
                let d = parse_gateway_duration(v).map_err(|e| format!("timeouts.{field}: {e}"))?;
                Ok((!d.is_zero()).then_some(d))
            }
        }
    };
    Ok(Timeouts {
        request: parse("request", t.request.as_ref())?,
        backend_request: parse("backendRequest", t.backend_request.as_ref())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn m(yaml: &str) -> HttpRouteRulesMatches {
        crate::yaml::from_str(yaml).expect("test match parses")
    }

    #[test]
    fn defaults_to_prefix_slash() {
        let c = compile_match(&m("{}")).expect("compiles");
        assert!(matches!(&c.path, PathMatch::Prefix(p) if p == "/"));
        let c = compile_match(&m("{path: {value: /api/}}")).expect("compiles");
        assert!(matches!(&c.path, PathMatch::Prefix(p) if p == "/api"));
    }

    #[test]
    fn first_header_entry_wins_among_equal_names() {
        let c = compile_match(&m(
            "{headers: [{name: X-Env, value: a}, {name: x-env, value: b}, {name: x-other, value: c}]}",
        ))
        .expect("compiles");
        assert_eq!(c.headers.len(), 2);
        assert!(matches!(&c.headers[0].value, ValueMatch::Exact(v) if v == "a"));
        let q = compile_match(&m(
            "{queryParams: [{name: q, value: 1}, {name: q, value: 2}, {name: Q, value: 3}]}",
        ))
        .expect("compiles");
        assert_eq!(q.query.len(), 2, "query names are case-sensitive");
    }

    #[test]
    fn method_and_regex() {
        let c = compile_match(&m(
            "{method: POST, path: {type: RegularExpression, value: '/v[0-9]+'}}",
        ))
        .expect("compiles");
        assert_eq!(c.method, Some(Method::POST));
        assert!(c.path.matches("/v2"));
        assert!(compile_match(&m("{path: {type: RegularExpression, value: '('}}")).is_err());
    }

    #[test]
    fn timeouts_parse_and_zero_is_none() {
        let t: HttpRouteRulesTimeouts =
            crate::yaml::from_str("{request: 1m30s, backendRequest: 0s}").expect("parses");
        assert_eq!(
            compile_timeouts(Some(&t)),
            Ok(Timeouts {
                request: Some(Duration::from_secs(90)),
                backend_request: None
            })
        );
        let bad: HttpRouteRulesTimeouts = crate::yaml::from_str("{request: soon}").expect("parses");
        assert!(compile_timeouts(Some(&bad)).is_err());
    }
}
