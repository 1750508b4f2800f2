//! ingress-nginx's annotations, read as its controller reads them, each
//! given a verdict: the canary annotations become HTTPRoute rules (see
//! [`super::convert`]); the others become filters and fields where the
//! Gateway API says the same thing, and a report line where it does not.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::report::{Report, Verdict};

/// The prefix of every ingress-nginx annotation.
pub const PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// The canary annotations, which only count with `canary: "true"`.
pub const CANARY_KEYS: &[&str] = &[
    "canary",
    "canary-weight",
    "canary-weight-total",
    "canary-by-header",
    "canary-by-header-value",
    "canary-by-header-pattern",
    "canary-by-cookie",
];

/// The annotations of one Ingress, without the prefix (only those with it).
pub fn nginx_annotations(annotations: Option<&BTreeMap<String, String>>) -> BTreeMap<&str, &str> {
    annotations
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| k.strip_prefix(PREFIX).map(|k| (k, v.as_str())))
        .collect()
}

/// Go's `strconv.ParseBool`, which ingress-nginx's boolean annotations use.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// What a canary Ingress asks for, as ingress-nginx's canary parser reads
/// its annotations: a value that does not parse is weight 0 and total 100.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Canary {
    pub header: String,
    pub header_value: String,
    pub header_pattern: String,
    pub cookie: String,
    pub weight: i64,
    pub weight_total: i64,
}

impl Canary {
    pub fn of(a: &BTreeMap<&str, &str>) -> Canary {
        let text = |k: &str| a.get(k).map(|v| v.to_string()).unwrap_or_default();
        let int = |k: &str, default: i64| {
            a.get(k)
                .and_then(|v| v.trim().parse::<i64>().ok())
                .unwrap_or(default)
        };
        Canary {
            header: text("canary-by-header"),
            header_value: text("canary-by-header-value"),
            header_pattern: text("canary-by-header-pattern"),
            cookie: text("canary-by-cookie"),
            weight: int("canary-weight", 0),
            weight_total: int("canary-weight-total", 100),
        }
    }

    /// The total the balancer draws from: `canary-weight-total` only when
    /// it is above 100 (`math.random(total) <= weight` per request).
    pub fn effective_total(&self) -> i64 {
        if self.weight_total > 100 {
            self.weight_total
        } else {
            100
        }
    }

    /// `(primary, canary)` backendRef weights with the balancer's shares:
    /// the canary gets `min(max(weight, 0), total)` of `total`.
    pub fn weights(&self) -> (i64, i64) {
        let total = self.effective_total();
        let canary = self.weight.clamp(0, total);
        (total - canary, canary)
    }
}

/// Is this Ingress a canary (`canary` parses as true)?
pub fn is_canary(a: &BTreeMap<&str, &str>) -> bool {
    a.get("canary").and_then(|v| parse_bool(v)) == Some(true)
}

/// What a main Ingress's annotations add to each of its rules.
#[derive(Debug, Clone, Default)]
pub struct RuleSettings {
    /// HTTPRoute filters, in order.
    pub filters: Vec<Value>,
    /// `timeouts` of each rule, when an annotation sets one.
    pub timeouts: Option<Value>,
    /// Paths are regular expressions (`use-regex`, or `rewrite-target`
    /// with capture groups).
    pub use_regex: bool,
    /// `app-root`: a redirect of `/` to this path.
    pub app_root: Option<String>,
    /// `backend-protocol: GRPC`: the rules become a GRPCRoute's, each path
    /// a gRPC service or method.
    pub grpc: bool,
    /// `rewrite-target: T/$2` on paths `PREFIX(/|$)(.*)` (ingress-nginx's
    /// prefix-stripping idiom): each path becomes a PathPrefix `PREFIX`
    /// whose matched prefix is replaced by this (`T`, or `/`).
    pub replace_prefix: Option<String>,
    /// `ssl-redirect` (default true): plain HTTP to a host with TLS is
    /// redirected to https with 308.
    pub ssl_redirect: bool,
    /// `force-ssl-redirect` (default false): plain HTTP is redirected to
    /// https with 308 whether the host has TLS or not.
    pub force_ssl_redirect: bool,
    /// `preserve-trailing-slash` (default false): without it the redirect
    /// drops the last `/` of the request URI.
    pub preserve_trailing_slash: bool,
    /// `backend-protocol: HTTPS` or `GRPCS`: TLS to the backends, written
    /// as a BackendTLSPolicy per backend Service.
    pub backend_tls: Option<BackendTlsSettings>,
    /// `affinity: cookie`: the `sessionPersistence` of each rule.
    pub session: Option<Value>,
    /// `affinity-mode: persistent` (default `balanced`).
    pub affinity_persistent: bool,
    /// `session-cookie-samesite: Strict` (sluice's session cookies are
    /// SameSite=Strict).
    pub samesite_strict: bool,
}

/// What `backend-protocol: HTTPS`/`GRPCS` and the `proxy-ssl-*`
/// annotations ask of the connections to the backends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendTlsSettings {
    /// `HTTPS` or `GRPCS`, as written.
    pub protocol: String,
    /// `proxy-ssl-name`: the name verified (and sent as SNI).
    pub hostname: Option<String>,
    /// `proxy-ssl-verify: on` (ingress-nginx's default is off: the
    /// backend's certificate is not verified).
    pub verify: bool,
    /// `proxy-ssl-secret` as written (`namespace/name`).
    pub secret: Option<String>,
}

/// ingress-nginx's default session cookie name (`session-cookie-name`).
pub const DEFAULT_SESSION_COOKIE: &str = "INGRESSCOOKIE";

/// A number of seconds as a Gateway API Duration (`^([0-9]{1,5}(h|m|s|ms)){1,4}$`):
/// `90` is `1m30s`, `172800` is `48h`; `None` when the hours take more
/// than five digits.
pub fn gateway_duration(seconds: u64) -> Option<String> {
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if h > 99_999 {
        return None;
    }
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    if out.is_empty() {
        out.push_str("0s");
    }
    Some(out)
}

/// The suffix of ingress-nginx's prefix-stripping paths: `PREFIX(/|$)(.*)`.
pub const STRIP_SUFFIX: &str = "(/|$)(.*)";

/// The prefix of a path written as ingress-nginx's prefix-stripping
/// idiom (`/api(/|$)(.*)`), when it is one: a plain path, no regular
/// expression syntax in it.
pub fn stripped_prefix(path: &str) -> Option<&str> {
    let prefix = path.strip_suffix(STRIP_SUFFIX)?;
    let plain = prefix.len() > 1
        && prefix.starts_with('/')
        && !prefix.ends_with('/')
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._~/%".contains(c));
    plain.then_some(prefix)
}

/// The replacement of the prefix-stripping idiom's `rewrite-target`
/// (`/$2` is `/`, `/v2/$2` is `/v2`), when it is one.
fn prefix_replacement(target: &str) -> Option<String> {
    let rest = target.strip_suffix("/$2")?;
    if rest.contains('$') || !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    Some(if rest.is_empty() {
        "/".into()
    } else {
        rest.into()
    })
}

/// The implicit defaults of ingress-nginx that change behaviour, reported
/// for each main Ingress that does not set the annotation.
const DEFAULTS: &[(&str, &str)] = &[
    (
        "proxy-body-size",
        "ingress-nginx refuses request bodies over 1m with 413; sluice sets no body size limit",
    ),
    (
        "proxy-read-timeout",
        "ingress-nginx allows 60s between two reads from the backend; sluice's --backend-timeout (15s) bounds the whole response of a request without a body",
    ),
    (
        "proxy-next-upstream",
        "ingress-nginx tries another endpoint on a connection error or timeout, 3 tries in all; sluice retries only what a rule's retry asks for",
    ),
];

/// Read a main Ingress's annotations (prefix stripped), add a report line
/// for each (but the https redirect's, which the conversion writes), and
/// return what its rules get.
pub fn main_settings(
    object: &str,
    a: &BTreeMap<&str, &str>,
    paths: &[String],
    report: &mut Report,
) -> RuleSettings {
    let mut s = RuleSettings::default();
    let key = |k: &str| format!("{PREFIX}{k}");
    let mut rewrite: serde_json::Map<String, Value> = serde_json::Map::new();
    s.use_regex = a.get("use-regex").and_then(|v| parse_bool(v)) == Some(true);
    let idiom = a
        .get("rewrite-target")
        .and_then(|v| prefix_replacement(v))
        .filter(|_| !paths.is_empty() && paths.iter().all(|p| stripped_prefix(p).is_some()));
    if idiom.is_some() {
        s.use_regex = false;
    }
    let protocol = a
        .get("backend-protocol")
        .map(|v| v.to_ascii_uppercase())
        .unwrap_or_default();
    s.grpc = matches!(protocol.as_str(), "GRPC" | "GRPCS");
    let ssl_verify = match a.get("proxy-ssl-verify").copied() {
        None => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("on") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("off") => Ok(false),
        Some(v) => Err(format!("{v:?} is neither on nor off")),
    };
    if matches!(protocol.as_str(), "HTTPS" | "GRPCS") {
        s.backend_tls = Some(BackendTlsSettings {
            protocol: protocol.clone(),
            hostname: a.get("proxy-ssl-name").map(|v| v.to_string()),
            verify: *ssl_verify.as_ref().unwrap_or(&false),
            secret: a.get("proxy-ssl-secret").map(|v| v.to_string()),
        });
    }
    let session = session_persistence(a);
    if let Ok(Some(sp)) = &session {
        s.session = Some(sp.clone());
    }
    s.affinity_persistent = a.get("affinity-mode") == Some(&"persistent");
    s.samesite_strict = a
        .get("session-cookie-samesite")
        .is_some_and(|v| v.eq_ignore_ascii_case("strict"));
    let affinity_on = matches!(session, Ok(Some(_)));
    let mut cors_verdicts = match cors(a) {
        Ok(Some((filter, verdicts))) => {
            s.filters.push(filter);
            verdicts
        }
        Ok(None) => BTreeMap::new(),
        Err((k, e)) => BTreeMap::from([(k, Verdict::Error(e))]),
    };
    for (&k, &v) in a {
        let verdict = match k {
            k if CANARY_KEYS.contains(&k) => {
                // Canary annotations on a main Ingress (canary not true).
                if k == "canary" {
                    Verdict::Converted
                } else {
                    Verdict::Error(
                        "canary annotations without canary: \"true\" are refused by ingress-nginx (configured but not enabled); the Ingress is converted as a main Ingress".into(),
                    )
                }
            }
            "use-regex" => match parse_bool(v) {
                // The regex locations of the prefix-stripping idiom are
                // the PathPrefix matches rewrite-target's line describes.
                Some(true) if idiom.is_some() => Verdict::Converted,
                Some(true) => Verdict::Approximated(
                    "paths become RegularExpression matches (case-insensitive, anchored at the start as nginx's ~* location); nginx tries regex locations in order of path length, sluice ranks them after Exact and PathPrefix of the same route set, and PCRE syntax sluice's regex engine lacks is refused".into(),
                ),
                Some(false) => Verdict::Converted,
                None => Verdict::Error(format!("{v:?} is not a boolean")),
            },
            "rewrite-target" => {
                if let Some(replacement) = idiom.clone() {
                    let slash = if replacement == "/" {
                        String::new()
                    } else {
                        format!(
                            "; the prefix alone (no slash after it) becomes {replacement:?} where nginx gives \"{replacement}/\""
                        )
                    };
                    s.replace_prefix = Some(replacement);
                    Verdict::Approximated(format!(
                        "paths PREFIX{STRIP_SUFFIX} with {v:?} strip the prefix: each becomes a PathPrefix with an URLRewrite ReplacePrefixMatch; nginx matches the prefix case-insensitively (~*), the PathPrefix match is case-sensitive{slash}"
                    ))
                } else if v.contains('$') {
                    Verdict::Unsupported(
                        "a target with capture groups ($1...) has no Gateway API equivalent; write an URLRewrite ReplacePrefixMatch by hand when the groups only keep the rest of the path".into(),
                    )
                } else {
                    rewrite.insert(
                        "path".into(),
                        json!({"type": "ReplaceFullPath", "replaceFullPath": v}),
                    );
                    Verdict::Converted
                }
            }
            "upstream-vhost" => {
                rewrite.insert("hostname".into(), json!(v));
                Verdict::Converted
            }
            "x-forwarded-prefix" => {
                s.filters.push(json!({
                    "type": "RequestHeaderModifier",
                    "requestHeaderModifier": {"set": [{"name": "X-Forwarded-Prefix", "value": v}]}
                }));
                Verdict::Converted
            }
            "permanent-redirect" => match redirect(v, a.get("permanent-redirect-code")) {
                Ok(filter) => {
                    s.filters.push(filter);
                    Verdict::Converted
                }
                Err(e) => Verdict::Error(e),
            },
            "permanent-redirect-code" => Verdict::Converted,
            "app-root" => {
                s.app_root = Some(v.to_string());
                Verdict::Converted
            }
            // The redirect's lines are the conversion's, which knows the
            // listeners (`super::convert::https_redirects`).
            "ssl-redirect" | "force-ssl-redirect" if parse_bool(v).is_some() => continue,
            "ssl-redirect" | "force-ssl-redirect" => Verdict::Error(format!(
                "{v:?} is not a boolean; ingress-nginx then keeps its default ({})",
                if k == "ssl-redirect" { "true" } else { "false" }
            )),
            "preserve-trailing-slash" => match parse_bool(v) {
                Some(_) => Verdict::Converted,
                None => Verdict::Error(format!("{v:?} is not a boolean")),
            },
            "backend-protocol" => match protocol.as_str() {
                "HTTP" | "GRPC" => Verdict::Converted,
                // The BackendTLSPolicy's line is the conversion's, which
                // knows the Services and Secrets (`super::convert`).
                "HTTPS" | "GRPCS" => continue,
                _ => Verdict::Unsupported(format!("backend protocol {v:?}")),
            },
            "proxy-ssl-verify" => match (&ssl_verify, &s.backend_tls) {
                (Err(e), _) => Verdict::Error(format!("{e}; ingress-nginx then keeps its default (off)")),
                (Ok(_), None) => Verdict::Converted,
                (Ok(true), Some(_)) => Verdict::Converted,
                (Ok(false), Some(_)) => Verdict::Approximated(
                    "ingress-nginx does not verify the backend's certificate; a BackendTLSPolicy always does (see backend-protocol)".into(),
                ),
            },
            // Read with the Secrets by the conversion (`super::convert`).
            "proxy-ssl-secret" if s.backend_tls.is_some() => continue,
            "proxy-ssl-name" | "proxy-ssl-secret" => Verdict::Converted,
            "proxy-ssl-server-name" => match (v.eq_ignore_ascii_case("on"), &s.backend_tls) {
                (_, None) | (true, Some(_)) => Verdict::Converted,
                (false, Some(_)) => Verdict::Approximated(
                    "ingress-nginx sends no SNI to the backend; sluice sends the BackendTLSPolicy's hostname as SNI, so a backend that picks its certificate by SNI may present another one".into(),
                ),
            },
            "proxy-ssl-verify-depth" | "proxy-ssl-ciphers" | "proxy-ssl-protocols" => {
                if s.backend_tls.is_some() {
                    Verdict::Unsupported(
                        "a BackendTLSPolicy has no verify depth, ciphers or protocol versions; sluice uses rustls's defaults (TLS 1.2 and 1.3)".into(),
                    )
                } else {
                    Verdict::Converted
                }
            }
            "proxy-connect-timeout" | "proxy-read-timeout" | "proxy-send-timeout" => {
                Verdict::Approximated(
                    "nginx's proxy timeouts bound each connect, read or write; the Gateway API's timeouts bound a whole request: not written, set the rule's timeouts by hand".into(),
                )
            }
            "proxy-body-size" => Verdict::Unsupported(
                "sluice sets no request body size limit".into(),
            ),
            "proxy-next-upstream" | "proxy-next-upstream-tries" | "proxy-next-upstream-timeout" => {
                Verdict::Approximated(
                    "nginx's retries to the next endpoint are not written; a rule's retry (attempts, codes) is the nearest".into(),
                )
            }
            // Its line is the conversion's, which knows the canaries.
            "affinity" if session.is_ok() => continue,
            "affinity" => Verdict::Error(session.clone().err().unwrap_or_default()),
            k if SESSION_KEYS.contains(&k) && !affinity_on => Verdict::Converted,
            "affinity-mode" => match v {
                "persistent" => Verdict::Converted,
                "balanced" => Verdict::Approximated(BALANCED.into()),
                _ => Verdict::Error(format!("{v:?} is neither balanced nor persistent")),
            },
            // Read from the canary Ingress by ingress-nginx (and here).
            "affinity-canary-behavior" => Verdict::Converted,
            "session-cookie-name" => Verdict::Converted,
            "session-cookie-max-age" | "session-cookie-expires" => match cookie_lifetime(a) {
                Err(e) => Verdict::Error(e),
                Ok(_) => Verdict::Converted,
            },
            "session-cookie-samesite" if s.samesite_strict => Verdict::Converted,
            "session-cookie-samesite" | "session-cookie-conditional-samesite-none" => {
                Verdict::Approximated(format!(
                    "sluice's session cookie is SameSite=Strict, not {v:?}: a cross-site navigation does not carry it and starts a new session"
                ))
            }
            "session-cookie-path" => Verdict::Approximated(
                "sluice's session cookie Path is the path the rule matched, not this one".into(),
            ),
            "session-cookie-secure" => Verdict::Approximated(
                "sluice's session cookie is Secure when the request came over TLS, whatever this says".into(),
            ),
            "session-cookie-domain" => Verdict::Unsupported(
                "sluice's session cookie has no Domain: it goes back to the request's host only".into(),
            ),
            "session-cookie-change-on-failure" => Verdict::Approximated(
                "sluice moves a session to another endpoint when its pod is no longer ready, not when a request to it fails".into(),
            ),
            "upstream-hash-by" | "upstream-hash-by-subset" | "upstream-hash-by-subset-size"
            | "load-balance" => Verdict::Unsupported(
                "endpoint selection by hash or algorithm is not in the Gateway API".into(),
            ),
            k if CORS_KEYS.contains(&k) => cors_verdicts
                .remove(k)
                .unwrap_or(Verdict::Converted),
            "mirror-target" | "mirror-request-body" | "mirror-host" => Verdict::Unsupported(
                "mirror-target is an URL; a RequestMirror filter needs a Service: not converted"
                    .into(),
            ),
            "ssl-passthrough" => Verdict::Unsupported(
                "TLS passthrough is a TLSRoute on a Passthrough listener: not converted".into(),
            ),
            "whitelist-source-range" | "allowlist-source-range" | "denylist-source-range" => {
                Verdict::Unsupported("the Gateway API has no client address filter".into())
            }
            k if k.ends_with("snippet") => {
                Verdict::Unsupported("nginx configuration snippets cannot be converted".into())
            }
            _ => Verdict::Unsupported("no Gateway API equivalent".into()),
        };
        let verdict = match verdict {
            Verdict::Converted | Verdict::Approximated(_) | Verdict::Extension(_)
                if s.grpc && HTTP_ONLY.contains(&k) && !is_off(k, v) =>
            {
                Verdict::Error(
                    "backend-protocol GRPC makes the rules a GRPCRoute's, which has no such filter or match; left out".into(),
                )
            }
            verdict => verdict,
        };
        report.push(object, key(k), verdict);
    }
    if s.grpc {
        // What a GRPCRoute rule has: header modifiers and mirrors.
        s.filters.retain(|f| {
            matches!(
                f["type"].as_str(),
                Some("RequestHeaderModifier" | "ResponseHeaderModifier" | "RequestMirror")
            )
        });
        rewrite.clear();
        s.replace_prefix = None;
        s.app_root = None;
        s.use_regex = false;
        s.timeouts = None;
    }
    if !rewrite.is_empty() {
        s.filters
            .push(json!({"type": "URLRewrite", "urlRewrite": Value::Object(rewrite)}));
    }
    for (k, what) in DEFAULTS {
        if !a.contains_key(k) {
            report.push(
                object,
                format!("default {k}"),
                Verdict::Default((*what).into()),
            );
        }
    }
    let flag = |k: &str, default: bool| a.get(k).and_then(|v| parse_bool(v)).unwrap_or(default);
    s.ssl_redirect = flag("ssl-redirect", true);
    s.force_ssl_redirect = flag("force-ssl-redirect", false);
    s.preserve_trailing_slash = flag("preserve-trailing-slash", false);
    s
}

/// The session affinity annotations besides `affinity`, which do
/// nothing without `affinity: cookie`.
const SESSION_KEYS: [&str; 11] = [
    "affinity-mode",
    "affinity-canary-behavior",
    "session-cookie-name",
    "session-cookie-path",
    "session-cookie-max-age",
    "session-cookie-expires",
    "session-cookie-samesite",
    "session-cookie-secure",
    "session-cookie-domain",
    "session-cookie-change-on-failure",
    "session-cookie-conditional-samesite-none",
];

/// Why `affinity-mode: balanced` (the default) is approximated.
pub const BALANCED: &str = "affinity-mode balanced (the default): when the endpoints change, ingress-nginx moves some sessions to other pods (the cookie is hashed onto a ring of the endpoints); sluice keeps a session on its pod while that pod is ready, as affinity-mode persistent does";

/// The `sessionPersistence` of `affinity: cookie` (`None` without it):
/// a Cookie session named `session-cookie-name` (default
/// `INGRESSCOOKIE`); with `session-cookie-max-age` (else
/// `session-cookie-expires`, both in seconds) a Permanent cookie and an
/// absolute timeout of that long, as nginx's cookie then ends in the
/// browser; without either a browser-session cookie that never times out,
/// as nginx's. An error names what ingress-nginx would refuse.
fn session_persistence(a: &BTreeMap<&str, &str>) -> Result<Option<Value>, String> {
    match a.get("affinity").copied() {
        None => return Ok(None),
        Some("cookie") => {}
        Some(v) => {
            return Err(format!(
                "affinity {v:?}: ingress-nginx supports only cookie and ignores this"
            ));
        }
    }
    let name = a
        .get("session-cookie-name")
        .copied()
        .unwrap_or(DEFAULT_SESSION_COOKIE);
    let mut sp = json!({"type": "Cookie", "sessionName": name});
    if let Ok(Some(d)) = cookie_lifetime(a) {
        sp["absoluteTimeout"] = json!(d);
        sp["cookieConfig"] = json!({"lifetimeType": "Permanent"});
    }
    Ok(Some(sp))
}

/// The session cookie's lifetime as a Gateway API duration:
/// `session-cookie-max-age`, else `session-cookie-expires` (seconds; a
/// browser heeds Max-Age over Expires).
fn cookie_lifetime(a: &BTreeMap<&str, &str>) -> Result<Option<String>, String> {
    let lifetime = a
        .get("session-cookie-max-age")
        .map(|v| ("session-cookie-max-age", v))
        .or_else(|| {
            a.get("session-cookie-expires")
                .map(|v| ("session-cookie-expires", v))
        });
    let Some((k, v)) = lifetime else {
        return Ok(None);
    };
    let seconds: u64 = v
        .trim()
        .parse()
        .map_err(|_| format!("{k} {v:?} is not a number of seconds; not written"))?;
    gateway_duration(seconds)
        .map(Some)
        .ok_or_else(|| format!("{k} {v:?} is longer than a Gateway API duration; not written"))
}

/// Annotations that make HTTPRoute filters or matches a GRPCRoute does
/// not have.
const HTTP_ONLY: [&str; 7] = [
    "rewrite-target",
    "upstream-vhost",
    "permanent-redirect",
    "permanent-redirect-code",
    "app-root",
    "use-regex",
    "enable-cors",
];

/// Whether annotation `k` is switched off by its value (`use-regex:
/// "false"`), so that it asks for nothing.
fn is_off(k: &str, v: &str) -> bool {
    matches!(k, "use-regex" | "enable-cors") && parse_bool(v) == Some(false)
}

/// The annotations of ingress-nginx's CORS (`enable-cors` and its
/// settings).
const CORS_KEYS: [&str; 7] = [
    "enable-cors",
    "cors-allow-origin",
    "cors-allow-methods",
    "cors-allow-headers",
    "cors-expose-headers",
    "cors-allow-credentials",
    "cors-max-age",
];

/// ingress-nginx's defaults for each CORS setting it answers with when
/// `enable-cors` is true and the setting's annotation is absent.
const CORS_DEFAULTS: [(&str, &str); 5] = [
    ("cors-allow-origin", "*"),
    (
        "cors-allow-methods",
        "GET, PUT, POST, DELETE, PATCH, OPTIONS",
    ),
    (
        "cors-allow-headers",
        "DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Authorization",
    ),
    ("cors-allow-credentials", "true"),
    ("cors-max-age", "1728000"),
];

/// The methods the Gateway API's CORS filter may list.
const CORS_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// The `CORS` filter of `enable-cors: "true"` with its settings (each
/// absent one at ingress-nginx's default, written out), and the verdict of
/// each annotation that is not plainly converted. `None` when CORS is not
/// enabled (the `cors-*` settings then do nothing in ingress-nginx
/// either). An error names the annotation.
#[allow(clippy::type_complexity)]
fn cors(
    a: &BTreeMap<&str, &str>,
) -> Result<Option<(Value, BTreeMap<&'static str, Verdict>)>, (&'static str, String)> {
    match a.get("enable-cors").map(|v| (v, parse_bool(v))) {
        None | Some((_, Some(false))) => return Ok(None),
        Some((_, Some(true))) => {}
        Some((v, None)) => return Err(("enable-cors", format!("{v:?} is not a boolean"))),
    }
    let get = |k: &'static str| {
        a.get(k).copied().unwrap_or_else(|| {
            CORS_DEFAULTS
                .iter()
                .find(|(d, _)| *d == k)
                .map_or("", |(_, v)| v)
        })
    };
    let list = |k: &'static str| -> Vec<String> {
        get(k)
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    };
    let mut verdicts = BTreeMap::new();
    let mut origins = list("cors-allow-origin");
    if origins.iter().any(|o| o == "*") {
        origins = vec!["*".into()];
    }
    for o in &origins {
        if o == "*" {
            continue;
        }
        let valid = o.split_once("://").is_some_and(|(scheme, host)| {
            matches!(scheme, "http" | "https")
                && !host.is_empty()
                && !host.contains('/')
                && host.parse::<http::uri::Authority>().is_ok()
        });
        if !valid {
            return Err((
                "cors-allow-origin",
                format!("{o:?} is not an origin (scheme://host[:port])"),
            ));
        }
        if o.contains("*.") {
            verdicts.insert(
                "cors-allow-origin",
                Verdict::Approximated(format!(
                    "in {o:?}, ingress-nginx's * matches one DNS label, the Gateway API's any number of labels"
                )),
            );
        }
    }
    if origins.is_empty() {
        return Err(("cors-allow-origin", "lists no origin".into()));
    }
    let credentials = match parse_bool(get("cors-allow-credentials")) {
        Some(c) => c,
        None => {
            return Err((
                "cors-allow-credentials",
                format!("{:?} is not a boolean", get("cors-allow-credentials")),
            ));
        }
    };
    // ingress-nginx answers `Access-Control-Allow-Origin: *` with
    // `Access-Control-Allow-Credentials: true` for origin *, which browsers
    // refuse for credentialed requests: without credentials the filter
    // answers `*` too, and browsers treat both answers alike.
    let credentials = credentials && origins != ["*"];
    let methods = list("cors-allow-methods");
    if let Some(m) = methods
        .iter()
        .find(|m| **m != "*" && !CORS_METHODS.contains(&m.as_str()))
    {
        return Err((
            "cors-allow-methods",
            format!(
                "{m:?} is not a method the Gateway API's CORS filter allows ({})",
                CORS_METHODS.join(", ")
            ),
        ));
    }
    let max_age: i32 = get("cors-max-age").parse().map_err(|_| {
        (
            "cors-max-age",
            format!("{:?} is not a number of seconds", get("cors-max-age")),
        )
    })?;
    let mut cors = json!({
        "allowOrigins": origins,
        "allowCredentials": credentials,
        "allowMethods": methods,
        "allowHeaders": list("cors-allow-headers"),
        "maxAge": max_age,
    });
    let expose = list("cors-expose-headers");
    if !expose.is_empty() {
        cors["exposeHeaders"] = json!(expose);
    }
    Ok(Some((json!({"type": "CORS", "cors": cors}), verdicts)))
}

/// The RequestRedirect filter of `permanent-redirect` (code default 301).
fn redirect(url: &str, code: Option<&&str>) -> Result<Value, String> {
    let code: u16 = match code {
        None => 301,
        Some(c) => c
            .parse()
            .map_err(|_| format!("permanent-redirect-code {c:?} is not a status code"))?,
    };
    if ![301, 302, 303, 307, 308].contains(&code) {
        return Err(format!(
            "status {code} is not a redirect the Gateway API allows"
        ));
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not an URL: {e}"))?;
    let mut r = serde_json::Map::new();
    if let Some(s) = uri.scheme_str() {
        r.insert("scheme".into(), json!(s));
    }
    if let Some(h) = uri.host() {
        r.insert("hostname".into(), json!(h));
    }
    if let Some(p) = uri.port_u16() {
        r.insert("port".into(), json!(p));
    }
    let path = uri.path();
    r.insert(
        "path".into(),
        json!({"type": "ReplaceFullPath", "replaceFullPath": if path.is_empty() { "/" } else { path }}),
    );
    r.insert("statusCode".into(), json!(code));
    Ok(json!({"type": "RequestRedirect", "requestRedirect": Value::Object(r)}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canary(pairs: &[(&str, &str)]) -> Canary {
        Canary::of(&pairs.iter().copied().collect())
    }

    #[test]
    fn weight_total_counts_only_above_100() {
        type Pairs<'a> = &'a [(&'a str, &'a str)];
        let table: &[(Pairs<'_>, (i64, i64))] = &[
            (&[("canary-weight", "25")], (75, 25)),
            // ingress2gateway honours a total under 100; nginx does not.
            (
                &[("canary-weight", "25"), ("canary-weight-total", "50")],
                (75, 25),
            ),
            (
                &[("canary-weight", "25"), ("canary-weight-total", "1000")],
                (975, 25),
            ),
            (&[("canary-weight", "150")], (0, 100)),
            (&[("canary-weight", "-3")], (100, 0)),
            (&[("canary-weight", "ten")], (100, 0)),
            (
                &[("canary-weight", "5"), ("canary-weight-total", "x")],
                (95, 5),
            ),
            (&[], (100, 0)),
        ];
        for (pairs, want) in table {
            assert_eq!(canary(pairs).weights(), *want, "{pairs:?}");
        }
    }

    #[test]
    fn canary_is_go_parse_bool() {
        for (v, want) in [
            ("true", true),
            ("True", true),
            ("1", true),
            ("yes", false),
            ("false", false),
        ] {
            let a: BTreeMap<&str, &str> = [("canary", v)].into_iter().collect();
            assert_eq!(is_canary(&a), want, "{v}");
        }
    }

    #[test]
    fn enable_cors_writes_ingress_nginx_defaults_out() {
        let a: BTreeMap<&str, &str> = [("enable-cors", "true")].into_iter().collect();
        let (f, verdicts) = cors(&a).unwrap().unwrap();
        assert_eq!(
            f["cors"],
            json!({"allowOrigins": ["*"], "allowCredentials": false,
                   "allowMethods": ["GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS"],
                   "allowHeaders": ["DNT", "Keep-Alive", "User-Agent", "X-Requested-With",
                       "If-Modified-Since", "Cache-Control", "Content-Type", "Authorization"],
                   "maxAge": 1728000})
        );
        assert!(verdicts.is_empty());
        let a: BTreeMap<&str, &str> = [
            ("enable-cors", "true"),
            (
                "cors-allow-origin",
                "https://a.example, https://*.b.example:8443",
            ),
            ("cors-expose-headers", "X-Id"),
            ("cors-max-age", "60"),
        ]
        .into_iter()
        .collect();
        let (f, verdicts) = cors(&a).unwrap().unwrap();
        assert_eq!(
            f["cors"]["allowOrigins"],
            json!(["https://a.example", "https://*.b.example:8443"])
        );
        assert_eq!(f["cors"]["allowCredentials"], json!(true));
        assert_eq!(f["cors"]["exposeHeaders"], json!(["X-Id"]));
        assert_eq!(f["cors"]["maxAge"], json!(60));
        assert!(matches!(
            verdicts.get("cors-allow-origin"),
            Some(Verdict::Approximated(_))
        ));
        for (k, v) in [
            ("cors-allow-origin", "a.example"),
            ("cors-allow-methods", "GET, FETCH"),
            ("cors-max-age", "soon"),
            ("cors-allow-credentials", "maybe"),
        ] {
            let a: BTreeMap<&str, &str> = [("enable-cors", "true"), (k, v)].into_iter().collect();
            assert_eq!(cors(&a).map(|_| ()).unwrap_err().0, k, "{k}: {v}");
        }
        let off: BTreeMap<&str, &str> = [("enable-cors", "false"), ("cors-max-age", "x")]
            .into_iter()
            .collect();
        assert!(cors(&off).unwrap().is_none());
    }

    #[test]
    fn the_prefix_stripping_idiom_is_recognised_and_nothing_else() {
        assert_eq!(stripped_prefix("/api(/|$)(.*)"), Some("/api"));
        assert_eq!(stripped_prefix("/a/b-c.d(/|$)(.*)"), Some("/a/b-c.d"));
        for path in [
            "/(/|$)(.*)",
            "/api/(/|$)(.*)",
            "/ap[i](/|$)(.*)",
            "/api(/.*)",
            "/api",
        ] {
            assert_eq!(stripped_prefix(path), None, "{path}");
        }
        assert_eq!(prefix_replacement("/$2").as_deref(), Some("/"));
        assert_eq!(prefix_replacement("/v2/$2").as_deref(), Some("/v2"));
        for target in ["/$1", "$2", "/x/$1/$2", "v2/$2", "/new"] {
            assert_eq!(prefix_replacement(target), None, "{target}");
        }
    }

    #[test]
    fn permanent_redirect_becomes_a_request_redirect() {
        let f = redirect("https://example.com:8443/new", None).unwrap();
        assert_eq!(
            f["requestRedirect"],
            json!({"scheme": "https", "hostname": "example.com", "port": 8443,
                   "path": {"type": "ReplaceFullPath", "replaceFullPath": "/new"}, "statusCode": 301})
        );
        assert!(redirect("https://a/", Some(&"418")).is_err());
    }
}
