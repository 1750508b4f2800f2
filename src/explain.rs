//! `sluice explain` and the admin listener's `/explain`: why a request
//! goes where it goes.
//!
//! The answer comes from the route table's own precedence walk
//! ([`RouteTable::explain`], which shares its listener choice and its match
//! test with the proxy's [`RouteTable::lookup`]): which listener owns the
//! host, every candidate rule for it in precedence order with the first
//! criterion that ranks it before or after the winner, the winner's filters
//! and its backends with the shares and state `sluice check` prints.
//!
//! The CLI prints it as text; `/explain` serves the same [`Explanation`]
//! as JSON, with the names `/status` and the dashboard use.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use serde::Serialize;

use crate::route::{
    Filter, HostPattern, Mismatch, PathMatch, RequestMatch, RouteKind, RouteTable, ValueMatch,
    normalize_host,
};
use crate::translate::{BackendSummary, RuleSummary};

/// One request to explain.
#[derive(Debug, Clone)]
pub struct ExplainRequest {
    pub method: Method,
    /// `scheme://host[:port]/path?query`.
    pub url: String,
    pub headers: HeaderMap,
    /// Only listeners of this Gateway (`namespace/name`).
    pub gateway: Option<String>,
}

/// Why a request cannot be explained (bad method, URL or header).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

impl ExplainRequest {
    /// Build a request from the CLI's or the query string's words:
    /// `headers` as `Name: value`.
    pub fn parse(
        method: &str,
        url: &str,
        headers: &[String],
        gateway: Option<String>,
    ) -> Result<Self, BadRequest> {
        let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .map_err(|_| BadRequest(format!("invalid method {method:?}")))?;
        let mut map = HeaderMap::new();
        for h in headers {
            let (name, value) = h
                .split_once(':')
                .ok_or_else(|| BadRequest(format!("header {h:?} is not `Name: value`")))?;
            let name = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| BadRequest(format!("invalid header name in {h:?}")))?;
            let value = HeaderValue::from_str(value.trim())
                .map_err(|_| BadRequest(format!("invalid header value in {h:?}")))?;
            map.append(name, value);
        }
        let request = ExplainRequest {
            method,
            url: url.to_string(),
            headers: map,
            gateway,
        };
        request.target()?;
        Ok(request)
    }

    /// Host (normalized), port, path and query of the URL.
    fn target(&self) -> Result<(String, u16, String, Option<String>), BadRequest> {
        let uri: http::Uri = self
            .url
            .parse()
            .map_err(|e| BadRequest(format!("invalid URL {:?}: {e}", self.url)))?;
        let host = uri
            .host()
            .ok_or_else(|| BadRequest(format!("URL {:?} has no host", self.url)))?;
        let port = match (uri.port_u16(), uri.scheme_str()) {
            (Some(p), _) => p,
            (None, Some("https")) => 443,
            (None, Some("http") | None) => 80,
            (None, Some(other)) => return Err(BadRequest(format!("unknown scheme {other:?}"))),
        };
        let path = match uri.path() {
            "" => "/".to_string(),
            p => p.to_string(),
        };
        Ok((
            normalize_host(host).into_owned(),
            port,
            path,
            uri.query().map(str::to_string),
        ))
    }
}

/// What happens to one request, and why.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub method: String,
    pub url: String,
    /// `gateway/<ns>/<name>/listener/<name>` of the listener that owns the
    /// host; `None` when no listener does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listener: Option<String>,
    /// Every candidate (rule, match) for the host, in precedence order.
    pub candidates: Vec<Candidate>,
    /// The winning rule, when one matches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub winner: Option<Winner>,
    /// What the client gets, in words (`404: ...` when nothing matches).
    pub outcome: String,
}

/// One candidate of the precedence walk.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// `HTTPRoute <namespace>/<name>` (or GRPCRoute).
    pub route: String,
    pub rule: usize,
    /// The rule's `name`, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule_name: Option<String>,
    /// The match entry, as the manifest would say it.
    #[serde(rename = "match")]
    pub matcher: String,
    /// The route hostname it is listed under (`*` for none).
    pub hostname: String,
    pub matches: bool,
    /// The first condition the request fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fails: Option<String>,
    /// Is it the winner?
    pub wins: bool,
    /// The first precedence criterion that ranks it before or after the
    /// winner (`hostname`, `exact path`, `prefix length`, `method`,
    /// `header count`, `query count`, `age`, `name`, `rule order`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// Ranked before the winner (and does not match) or after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<&'static str>,
}

/// The rule a request gets, its filters and its backends.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Winner {
    pub route: String,
    pub rule: usize,
    pub filters: Vec<String>,
    /// As `sluice check` and `/status` name them: spec and served shares,
    /// state.
    pub backends: Vec<BackendSummary>,
}

/// Exit codes of `sluice explain`.
pub const EXIT_MATCHED: i32 = 0;
pub const EXIT_NOT_FOUND: i32 = 1;
pub const EXIT_UNREADABLE: i32 = 2;

/// Explain `request` against `table` (the rules' shares from `rules`).
pub fn explain(
    table: &RouteTable,
    rules: &[Arc<RuleSummary>],
    request: &ExplainRequest,
) -> Result<Explanation, BadRequest> {
    let (host, port, path, query) = request.target()?;
    let gateway_prefix = request
        .gateway
        .as_ref()
        .map(|g| format!("gateway/{g}/listener/"));
    let mut binds: Vec<SocketAddr> = table.binds().filter(|b| b.port() == port).collect();
    binds.sort();
    let mut found = None;
    for bind in binds {
        let explained = table.explain(
            bind,
            &host,
            &request.method,
            &path,
            query.as_deref(),
            &request.headers,
        );
        let Some(listener) = explained.listener else {
            continue;
        };
        if gateway_prefix
            .as_ref()
            .is_some_and(|p| !listener.id.starts_with(p.as_str()))
        {
            continue;
        }
        found = Some(explained);
        break;
    }
    let mut out = Explanation {
        method: request.method.to_string(),
        url: request.url.clone(),
        listener: None,
        candidates: Vec::new(),
        winner: None,
        outcome: String::new(),
    };
    let Some(explained) = found else {
        let mut ports: Vec<u16> = table.binds().map(|b| b.port()).collect();
        ports.sort_unstable();
        ports.dedup();
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        out.outcome = format!(
            "404: no listener on port {port} accepts host {host}{} (listener ports: {})",
            request
                .gateway
                .as_ref()
                .map(|g| format!(" of Gateway {g}"))
                .unwrap_or_default(),
            if ports.is_empty() {
                "none".to_string()
            } else {
                ports.join(", ")
            }
        );
        return Ok(out);
    };
    out.listener = explained.listener.map(|l| l.id.clone());
    for (i, c) in explained.candidates.iter().enumerate() {
        let wins = explained.winner == Some(i);
        out.candidates.push(Candidate {
            route: route_name(c.rule.id.kind, &c.rule.id.namespace, &c.rule.id.route),
            rule: c.rule.id.index,
            rule_name: c.rule.id.name.clone(),
            matcher: describe_match(c.matcher),
            hostname: describe_host(c.hostname),
            matches: c.mismatch.is_none(),
            fails: c.mismatch.as_ref().map(describe_mismatch),
            wins,
            decided_by: c.decided_by.map(|d| d.as_str().to_string()),
            position: explained.winner.and_then(|w| match i.cmp(&w) {
                std::cmp::Ordering::Less => Some("before"),
                std::cmp::Ordering::Greater => Some("after"),
                std::cmp::Ordering::Equal => None,
            }),
        });
    }
    let Some(w) = explained.winner else {
        out.outcome = format!(
            "404: listener {} owns host {host} but no rule matches",
            out.listener.as_deref().unwrap_or_default()
        );
        return Ok(out);
    };
    let rule = explained.candidates[w].rule;
    let kind = rule.id.kind.as_str();
    let route = format!("{}/{}", rule.id.namespace, rule.id.route);
    let backends = rules
        .iter()
        .find(|r| r.kind == kind && r.route == route && r.rule == rule.id.index)
        .map(|r| r.backends.clone())
        .unwrap_or_default();
    let filters: Vec<String> = rule.filters.iter().map(describe_filter).collect();
    out.outcome = if filters.iter().any(|f| f.starts_with("RequestRedirect")) {
        format!("redirected by {kind} {route} rule {}", rule.id.index)
    } else if backends.is_empty() {
        format!(
            "{kind} {route} rule {} has no backendRefs: 500",
            rule.id.index
        )
    } else {
        format!("served by {kind} {route} rule {}", rule.id.index)
    };
    out.winner = Some(Winner {
        route: route_name(rule.id.kind, &rule.id.namespace, &rule.id.route),
        rule: rule.id.index,
        filters,
        backends,
    });
    Ok(out)
}

fn route_name(kind: RouteKind, namespace: &str, name: &str) -> String {
    format!("{} {namespace}/{name}", kind.as_str())
}

fn describe_host(h: &HostPattern) -> String {
    h.to_string()
}

fn describe_value(v: &ValueMatch) -> String {
    match v {
        ValueMatch::Exact(s) => format!("{s:?}"),
        ValueMatch::RegularExpression(re) => format!("~{:?}", re.as_str()),
        ValueMatch::Cookie(c) => format!("cookie {}={:?}", c.name, c.value),
    }
}

/// A match entry as the manifest says it: `PathPrefix /`, `Exact /a`,
/// then method, headers and query parameters.
pub fn describe_match(m: &RequestMatch) -> String {
    let mut parts = vec![match &m.path {
        PathMatch::Exact(p) => format!("Exact {p}"),
        PathMatch::Prefix(p) => format!("PathPrefix {p}"),
        PathMatch::RegularExpression(re) => format!("RegularExpression {}", re.as_str()),
        PathMatch::Grpc(g) => format!(
            "gRPC {}/{}",
            g.service.as_ref().map_or("*".to_string(), describe_value),
            g.method.as_ref().map_or("*".to_string(), describe_value)
        ),
    }];
    if let Some(method) = &m.method {
        parts.push(format!("method {method}"));
    }
    for h in &m.headers {
        parts.push(format!("header {}={}", h.name, describe_value(&h.value)));
    }
    for q in &m.query {
        parts.push(format!("query {}={}", q.name, describe_value(&q.value)));
    }
    parts.join(", ")
}

fn describe_mismatch(m: &Mismatch<'_>) -> String {
    match m {
        Mismatch::Method => "method".to_string(),
        Mismatch::Path => "path".to_string(),
        Mismatch::Header(name) => format!("header {name}"),
        Mismatch::Query(name) => format!("query {name}"),
    }
}

fn describe_filter(f: &Filter) -> String {
    match f {
        Filter::RequestHeaderModifier(_) => "RequestHeaderModifier".to_string(),
        Filter::ResponseHeaderModifier(_) => "ResponseHeaderModifier".to_string(),
        Filter::RequestRedirect(r) => format!("RequestRedirect ({})", r.status.as_u16()),
        Filter::UrlRewrite(_) => "URLRewrite".to_string(),
        Filter::RequestMirror(m) => format!(
            "RequestMirror to {} ({}/{})",
            m.backend.service, m.numerator, m.denominator
        ),
        Filter::Cors(_) => "CORS".to_string(),
    }
}

/// The explanation as `sluice explain` prints it.
pub fn write_text(e: &Explanation, out: &mut impl std::io::Write) -> std::io::Result<()> {
    writeln!(out, "{} {}", e.method, e.url)?;
    match &e.listener {
        Some(l) => writeln!(out, "listener: {l}")?,
        None => writeln!(out, "listener: none")?,
    }
    if !e.candidates.is_empty() {
        writeln!(out, "candidates, in precedence order:")?;
    }
    for (i, c) in e.candidates.iter().enumerate() {
        let mark = if c.wins { "=>" } else { "  " };
        let name = c
            .rule_name
            .as_ref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        let verdict = match (&c.fails, c.wins, c.position, &c.decided_by) {
            (_, true, _, _) => "matches: WINS".to_string(),
            (Some(f), _, Some("before"), Some(d)) => {
                format!("ranks before the winner by {d}, but fails {f}")
            }
            (Some(f), _, _, Some(d)) => format!("fails {f}; ranks after the winner by {d}"),
            (Some(f), _, _, None) => format!("fails {f}"),
            (None, _, _, Some(d)) => format!("matches, but loses to the winner by {d}"),
            (None, _, _, None) => "matches".to_string(),
        };
        writeln!(
            out,
            "{mark} {}. {} rule {}{name} [{}] host {}: {verdict}",
            i + 1,
            c.route,
            c.rule,
            c.matcher,
            c.hostname,
        )?;
    }
    if let Some(w) = &e.winner {
        writeln!(out, "winner: {} rule {}", w.route, w.rule)?;
        if w.filters.is_empty() {
            writeln!(out, "  filters: none")?;
        } else {
            writeln!(out, "  filters: {}", w.filters.join(", "))?;
        }
        for b in &w.backends {
            let served = b
                .served_percent
                .filter(|s| (s - b.share_percent).abs() > f64::EPSILON)
                .map(|s| format!(", served {}", crate::cli::check::format_share(s)))
                .unwrap_or_default();
            writeln!(
                out,
                "  backend {}: weight {}, spec {}{served}, {}",
                b.name,
                b.weight,
                crate::cli::check::format_share(b.share_percent),
                describe_state(b)
            )?;
        }
    }
    writeln!(out, "outcome: {}", e.outcome)
}

fn describe_state(b: &BackendSummary) -> String {
    match &b.outcome {
        crate::translate::BackendOutcome::Serves { ready_endpoints } => {
            format!("resolved, {ready_endpoints} ready endpoint(s)")
        }
        crate::translate::BackendOutcome::NoReadyEndpoints => {
            "resolved, no ready endpoint: its share gets 503".to_string()
        }
        crate::translate::BackendOutcome::Unresolved { reason, .. } => {
            format!("unresolved ({reason}): its share gets 500")
        }
    }
}
