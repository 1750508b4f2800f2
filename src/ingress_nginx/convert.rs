//! Ingresses (with their canaries) to HTTPRoutes, as ingress-nginx serves
//! them. Pure: objects in, objects and a report out.
//!
//! ingress-nginx builds one nginx location per host, path and pathType of
//! the main Ingresses (the oldest Ingress wins a location). A canary
//! Ingress (`canary: "true"`) adds an alternative backend to a location
//! with exactly its host, path and pathType, one per location, and its
//! balancer (`route_to_alternative_balancer` in balancer.lua) decides per
//! request:
//!
//! 1. `canary-by-header` present: with `canary-by-header-value`, that exact
//!    value goes to the canary; else with `canary-by-header-pattern`, a
//!    match anywhere in the value goes to the canary; else `always` goes to
//!    the canary and `never` to the primary, with no further rule.
//!    Anything else falls through.
//! 2. `canary-by-cookie`: `always` to the canary, `never` to the primary.
//! 3. `canary-weight` out of `canary-weight-total` (only above 100).
//!
//! Each location becomes the rules of one HTTPRoute in that order: header
//! rules, then cookie rules (each one header condition), then the
//! weighted rule with none. The Gateway API's precedence ranks rules with
//! more header conditions first and keeps rule order among equals, so a
//! request takes the first rule of the ladder it matches, as the balancer
//! does. Cookie conditions are sluice's extension (the route annotation
//! `sluice.dev/cookie-matches`, which makes exact the rule's portable
//! `Cookie` header regex); the pattern is a standard
//! `RegularExpression` header match, `.*(?:PATTERN).*`, which in sluice's
//! whole-value semantics is the unanchored search nginx does.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use serde_json::{Value, json};

use super::annotations::{
    BALANCED, BackendTlsSettings, CANARY_KEYS, Canary, PREFIX, RuleSettings, is_canary,
    main_settings, nginx_annotations, parse_bool, stripped_prefix,
};
use super::report::{Report, Verdict};
use crate::resources::{CONTROLLER_NAME, DEFAULT_NAMESPACE};

/// What a conversion reads.
#[derive(Debug, Clone, Default)]
pub struct Input {
    pub ingresses: Vec<Ingress>,
    /// The Services the Ingresses name, to resolve named ports.
    pub services: Vec<Service>,
    /// The Secrets `proxy-ssl-secret` names, for their CA certificate.
    pub secrets: Vec<Secret>,
}

/// How to convert.
#[derive(Debug, Clone)]
pub struct Options {
    /// Attach the routes to this Gateway (namespace, name); without it the
    /// output also holds a GatewayClass and a Gateway for the class.
    pub gateway: Option<(String, String)>,
    /// Only Ingresses of this class (ingress-nginx's default is `nginx`).
    pub ingress_class: String,
    /// Add a RolloutPolicy for each canary's route.
    pub rollout_policy: bool,
    /// The (HTTP, HTTPS) listener names of `gateway`, to write the https
    /// redirects: a TLS host's routes attach to the HTTPS listener and a
    /// redirect route to the HTTP one. Without them (and with `gateway`)
    /// the redirects are reported, not written.
    pub listeners: Option<(String, String)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            gateway: None,
            ingress_class: "nginx".into(),
            rollout_policy: false,
            listeners: None,
        }
    }
}

/// The Gateway API objects and the report.
#[derive(Debug, Clone, Default)]
pub struct Conversion {
    pub objects: Vec<Value>,
    pub report: Report,
}

/// The cookie-match annotation sluice reads on HTTPRoutes.
pub const COOKIE_MATCHES: &str = crate::translate::COOKIE_MATCHES_ANNOTATION;

/// The class an Ingress names (`spec.ingressClassName`, else the older
/// `kubernetes.io/ingress.class` annotation).
pub fn ingress_class(ing: &Ingress) -> Option<&str> {
    ing.spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .or_else(|| {
            ing.metadata
                .annotations
                .as_ref()?
                .get("kubernetes.io/ingress.class")
                .map(String::as_str)
        })
}

/// One nginx location: a host, path and pathType of a main Ingress.
struct Location {
    /// Index of the main Ingress in `mains`.
    main: usize,
    host: String,
    path: String,
    path_type: String,
    primary: Value,
    canary: Option<CanaryBackend>,
}

struct CanaryBackend {
    canary: Canary,
    backend: Value,
}

fn object_name(ing: &Ingress) -> String {
    format!("Ingress {}/{}", namespace(ing), name(ing))
}

fn namespace(ing: &Ingress) -> &str {
    ing.metadata
        .namespace
        .as_deref()
        .unwrap_or(DEFAULT_NAMESPACE)
}

fn name(ing: &Ingress) -> &str {
    ing.metadata.name.as_deref().unwrap_or("")
}

/// Convert `input` by `options`.
pub fn convert(input: &Input, options: &Options) -> Conversion {
    let mut report = Report::default();
    let mut ingresses: Vec<&Ingress> = input.ingresses.iter().collect();
    // ingress-nginx: the oldest Ingress wins a location.
    ingresses.sort_by(|a, b| {
        let ts = |i: &Ingress| i.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (ts(a), namespace(a), name(a)).cmp(&(ts(b), namespace(b), name(b)))
    });
    let mut mains: Vec<&Ingress> = Vec::new();
    let mut canaries: Vec<&Ingress> = Vec::new();
    for ing in ingresses {
        let object = object_name(ing);
        match ingress_class(ing) {
            Some(class) if class != options.ingress_class => {
                report.push(
                    &object,
                    "spec.ingressClassName",
                    Verdict::Skipped(format!("class {class:?}, not {:?}", options.ingress_class)),
                );
                continue;
            }
            _ => {}
        }
        if is_canary(&nginx_annotations(ing.metadata.annotations.as_ref())) {
            canaries.push(ing);
        } else {
            mains.push(ing);
        }
    }

    let mut settings: Vec<RuleSettings> = Vec::new();
    let mut locations: Vec<Location> = Vec::new();
    let mut at: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for (m, ing) in mains.iter().enumerate() {
        let object = object_name(ing);
        let a = nginx_annotations(ing.metadata.annotations.as_ref());
        let spec = ing.spec.clone().unwrap_or_default();
        let paths: Vec<String> = spec
            .rules
            .iter()
            .flatten()
            .flat_map(|r| r.http.iter().flat_map(|h| &h.paths))
            .map(|p| p.path.clone().unwrap_or_else(|| "/".into()))
            .collect();
        settings.push(main_settings(&object, &a, &paths, &mut report));
        if spec.default_backend.is_some() {
            report.push(
                &object,
                "spec.defaultBackend",
                Verdict::Unsupported(
                    "ingress-nginx serves it for the paths no rule takes on the default server; not converted".into(),
                ),
            );
        }
        for_each_path(
            ing,
            input,
            &object,
            &mut report,
            |host, path, path_type, backend, _| {
                if settings[m].grpc {
                    grpc_method(&path, &path_type)?;
                }
                let key = (host.clone(), path.clone(), path_type.clone());
                if let Some(&first) = at.get(&key) {
                    return Err(format!(
                        "{} already serves host {host:?} path {path:?} ({path_type}): ingress-nginx keeps the oldest",
                        object_name(mains[locations[first].main])
                    ));
                }
                at.insert(key, locations.len());
                locations.push(Location {
                    main: m,
                    host,
                    path,
                    path_type,
                    primary: backend,
                    canary: None,
                });
                Ok(())
            },
        );
    }

    let mut grants: BTreeSet<(String, String, String, &'static str)> = BTreeSet::new();
    for ing in &canaries {
        let object = object_name(ing);
        let a = nginx_annotations(ing.metadata.annotations.as_ref());
        let canary = Canary::of(&a);
        report_canary(&object, &a, &canary, &mut report);
        for_each_path(
            ing,
            input,
            &object,
            &mut report,
            |host, path, path_type, backend, _| {
                let key = (host.clone(), path.clone(), path_type.clone());
                let Some(&i) = at.get(&key) else {
                    return Err(format!(
                        "no main Ingress serves host {host:?} path {path:?} ({path_type}): ingress-nginx drops this canary (\"unable to find real backend for alternative backend\")"
                    ));
                };
                let loc = &mut locations[i];
                if settings[loc.main].grpc && !canary.cookie.is_empty() {
                    return Err(format!(
                        "canary-by-cookie on a gRPC backend (backend-protocol GRPC): a GRPCRoute matches no cookie; the canary of host {host:?} path {path:?} is left out"
                    ));
                }
                if loc.canary.is_some() {
                    return Err(format!(
                        "the location host {host:?} path {path:?} already has a canary: ingress-nginx uses only the first"
                    ));
                }
                let main_ns = namespace(mains[loc.main]);
                let mut backend = backend;
                if namespace(ing) != main_ns {
                    backend["namespace"] = json!(namespace(ing));
                    grants.insert((
                        namespace(ing).to_string(),
                        main_ns.to_string(),
                        backend["name"].as_str().unwrap_or_default().to_string(),
                        route_kind(&settings[loc.main]),
                    ));
                }
                loc.canary = Some(CanaryBackend {
                    canary: canary.clone(),
                    backend,
                });
                Ok(())
            },
        );
    }

    let mut tls_objects: BTreeMap<(String, String, String), Value> = BTreeMap::new();
    for (m, ing) in mains.iter().enumerate() {
        let locs: Vec<&Location> = locations.iter().filter(|l| l.main == m).collect();
        if let Some(tls) = &settings[m].backend_tls {
            backend_tls(ing, tls, &locs, input, &mut tls_objects, &mut report);
        }
        if settings[m].session.is_some() {
            report_affinity(ing, &settings[m], &locs, &mut report);
        }
    }

    let (gateway_ns, gateway_name) = options
        .gateway
        .clone()
        .unwrap_or_else(|| (DEFAULT_NAMESPACE.to_string(), options.ingress_class.clone()));
    let listeners = listener_names(&mains, options, &gateway_ns, &gateway_name);
    let mut objects = Vec::new();
    if options.gateway.is_none() {
        objects.extend(gateway_objects(
            &mains,
            &gateway_ns,
            &gateway_name,
            &options.ingress_class,
        ));
    }
    for (m, ing) in mains.iter().enumerate() {
        let hosts: Vec<&str> = {
            let mut seen: Vec<&str> = Vec::new();
            for l in locations.iter().filter(|l| l.main == m) {
                if !seen.contains(&l.host.as_str()) {
                    seen.push(&l.host);
                }
            }
            seen
        };
        for host in &hosts {
            let route_name = if hosts.len() == 1 {
                name(ing).to_string()
            } else {
                format!("{}-{}", name(ing), slug(host))
            };
            let locs: Vec<&Location> = locations
                .iter()
                .filter(|l| l.main == m && l.host == *host)
                .collect();
            let mut route = http_route(
                ing,
                &route_name,
                host,
                &locs,
                &settings[m],
                (&gateway_ns, &gateway_name),
            );
            let has_canary = locs.iter().any(|l| l.canary.is_some());
            let placed = https_redirect(
                ing,
                &route_name,
                host,
                &locs,
                &settings[m],
                &listeners,
                &mut report,
            );
            if let Some(sections) = &placed.sections {
                route["spec"]["parentRefs"] = parent_refs(&gateway_ns, &gateway_name, sections);
            }
            objects.push(route);
            objects.extend(placed.redirect);
            if has_canary && options.rollout_policy && settings[m].grpc {
                report.push(
                    &object_name(ing),
                    "--rollout-policy",
                    Verdict::Unsupported(format!(
                        "GRPCRoute {route_name}: a RolloutPolicy governs HTTPRoutes only; no policy written"
                    )),
                );
            } else if has_canary && options.rollout_policy {
                objects.push(json!({
                    "apiVersion": crate::resources::ROLLOUT_POLICY_API_VERSION,
                    "kind": "RolloutPolicy",
                    "metadata": {"name": route_name, "namespace": namespace(ing)},
                    "spec": {
                        "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": route_name}],
                        "steps": ["1%", "5%", "25%", "50%", "100%"],
                        "interval": "5m",
                        "analysis": {"minRequests": 100, "maxErrorRate": "1%"},
                    }
                }));
            }
        }
    }
    objects.extend(tls_objects.into_values());
    for (from_ns, to_ns, service, kind) in grants {
        let name = match kind {
            "GRPCRoute" => format!("canary-from-{to_ns}-{service}-grpc"),
            _ => format!("canary-from-{to_ns}-{service}"),
        };
        objects.push(json!({
            "apiVersion": "gateway.networking.k8s.io/v1beta1",
            "kind": "ReferenceGrant",
            "metadata": {"name": name, "namespace": from_ns},
            "spec": {
                "from": [{"group": "gateway.networking.k8s.io", "kind": kind, "namespace": to_ns}],
                "to": [{"group": "", "kind": "Service", "name": service}],
            }
        }));
    }
    Conversion { objects, report }
}

/// The report lines of a canary's annotations.
fn report_canary(object: &str, a: &BTreeMap<&str, &str>, c: &Canary, report: &mut Report) {
    for (&k, &v) in a {
        let verdict = match k {
            "canary-by-cookie" => Verdict::Extension(format!(
                "a cookie condition in the HTTPRoute annotation {COOKIE_MATCHES}"
            )),
            "canary-by-header-pattern" if !c.header_value.is_empty() => Verdict::Converted,
            "canary-by-header-pattern" => match crate::route::ValueMatch::regex(&unanchored(v)) {
                Err(e) => Verdict::Error(format!(
                    "sluice's regular expressions (Rust regex syntax) cannot read it: {e}"
                )),
                Ok(_) if pcre_specific(v) => Verdict::Approximated(
                    "\\d, \\w, \\s and \\b are Unicode-aware in sluice, ASCII in PCRE".into(),
                ),
                Ok(_) => Verdict::Converted,
            },
            k if CANARY_KEYS.contains(&k) => Verdict::Converted,
            // Read from the canary Ingress (`mergeAlternativeBackend`):
            // anything but legacy copies the main's session affinity to
            // the canary's backend.
            "affinity-canary-behavior" if v == "legacy" => Verdict::Approximated(
                "legacy: ingress-nginx pins no session to the canary (only the primary is sticky); the converted weighted rule's sessionPersistence pins sessions on both backends, as sticky does".into(),
            ),
            // ingress-nginx reads a canary's location settings from the
            // main Ingress, and so does the conversion.
            _ => Verdict::Converted,
        };
        report.push(object, format!("{PREFIX}{k}"), verdict);
    }
}

/// The `(namespace, name)` of the Services a location's backends are.
fn location_services(l: &Location, main_ns: &str) -> Vec<(String, String)> {
    let service = |b: &Value| {
        (
            b["namespace"].as_str().unwrap_or(main_ns).to_string(),
            b["name"].as_str().unwrap_or_default().to_string(),
        )
    };
    let mut out = vec![service(&l.primary)];
    out.extend(l.canary.as_ref().map(|c| service(&c.backend)));
    out
}

/// `backend-protocol: HTTPS`/`GRPCS`: a BackendTLSPolicy per backend
/// Service of the Ingress's locations (the canaries' too, which take the
/// main Ingress's protocol), its `validation.hostname` `proxy-ssl-name`
/// or else the Service's cluster DNS name, and its CA the `ca.crt` of the
/// `proxy-ssl-secret` Secret, written as a ConfigMap (a BackendTLSPolicy
/// takes CA certificates from ConfigMaps only). ingress-nginx verifies
/// nothing unless `proxy-ssl-verify: on`; the Gateway API cannot say
/// that, so without a CA the policy names a ConfigMap `<service>-backend-ca`
/// that is not written: the strict form, which fails the requests until
/// the CA is given, never plain HTTP to a TLS port. The report lines of
/// `backend-protocol` and `proxy-ssl-secret` say which.
fn backend_tls(
    ing: &Ingress,
    tls: &BackendTlsSettings,
    locs: &[&Location],
    input: &Input,
    written: &mut BTreeMap<(String, String, String), Value>,
    report: &mut Report,
) {
    let object = object_name(ing);
    let ns = namespace(ing);
    let mut services: Vec<(String, String)> = Vec::new();
    for l in locs {
        for s in location_services(l, ns) {
            if !services.contains(&s) {
                services.push(s);
            }
        }
    }
    let secret = tls.secret.as_deref().map(|v| {
        let (secret_ns, secret_name) = v.split_once('/').unwrap_or((ns, v));
        let found = input.secrets.iter().find(|s| {
            s.metadata.name.as_deref() == Some(secret_name)
                && s.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE) == secret_ns
        });
        let field = |s: &Secret, k: &str| {
            s.data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .or_else(|| s.string_data.as_ref().and_then(|d| d.get(k)).cloned())
        };
        let ca = match found {
            None => Err(format!(
                "Secret {secret_ns}/{secret_name} is not in the input: give it with -f to take its ca.crt"
            )),
            Some(s) => field(s, "ca.crt")
                .filter(|pem| pem.contains("-----BEGIN CERTIFICATE-----"))
                .ok_or_else(|| format!("Secret {secret_ns}/{secret_name} has no PEM certificate under ca.crt"))
                .map(|pem| (pem, field(s, "tls.crt").is_some())),
        };
        (secret_name.to_string(), ca)
    });
    let ca = match &secret {
        Some((name, Ok((pem, _)))) => Some((format!("{name}-ca"), pem.clone())),
        _ => None,
    };
    if let Some((name, result)) = &secret {
        let verdict = match result {
            Err(e) => Verdict::Error(e.clone()),
            Ok((_, true)) => Verdict::Approximated(format!(
                "its ca.crt is written as ConfigMap {name}-ca; its tls.crt/tls.key, the client certificate ingress-nginx presents to the backend, is not: the Gateway API sets it per Gateway (spec.tls.backend.clientCertificateRef)"
            )),
            Ok((_, false)) => Verdict::Converted,
        };
        report.push(&object, format!("{PREFIX}proxy-ssl-secret"), verdict);
    }
    let mut why: Vec<String> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (svc_ns, svc) in &services {
        let hostname = tls
            .hostname
            .clone()
            .unwrap_or_else(|| format!("{svc}.{svc_ns}.svc.cluster.local"));
        let config_map = match &ca {
            Some((name, pem)) => {
                written
                    .entry((svc_ns.clone(), "ConfigMap".into(), name.clone()))
                    .or_insert_with(|| {
                        json!({
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "metadata": {"name": name, "namespace": svc_ns},
                            "data": {"ca.crt": pem},
                        })
                    });
                name.clone()
            }
            None => format!("{svc}-backend-ca"),
        };
        let policy_name = format!("{svc}-backend-tls");
        let policy = json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "BackendTLSPolicy",
            "metadata": {"name": policy_name, "namespace": svc_ns},
            "spec": {
                "targetRefs": [{"group": "", "kind": "Service", "name": svc}],
                "validation": {
                    "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": config_map}],
                    "hostname": hostname,
                },
            },
        });
        let key = (
            svc_ns.clone(),
            "BackendTLSPolicy".to_string(),
            policy_name.clone(),
        );
        match written.get(&key) {
            Some(first) if first["spec"] != policy["spec"] => why.push(format!(
                "Service {svc_ns}/{svc} already has a BackendTLSPolicy with other settings from an older Ingress, which is kept"
            )),
            Some(_) => {}
            None => {
                written.insert(key, policy);
            }
        }
        names.push(format!(
            "BackendTLSPolicy {svc_ns}/{policy_name} (hostname {hostname}, CA ConfigMap {config_map})"
        ));
    }
    if tls.hostname.is_none() {
        why.push(
            "without proxy-ssl-name the certificate is verified for the Service's cluster DNS name, sent as SNI; ingress-nginx sends no SNI and checks no name unless told".into(),
        );
    }
    match (&ca, tls.verify) {
        (Some(_), true) => {}
        (Some(_), false) => why.push(format!(
            "ingress-nginx does not verify the backend's certificate (proxy-ssl-verify off, its default); the BackendTLSPolicy verifies it against the ca.crt of Secret {}: a certificate that CA did not issue is refused where nginx accepts it",
            tls.secret.as_deref().unwrap_or_default()
        )),
        (None, verify) => why.push(format!(
            "{}; a BackendTLSPolicy always verifies against caCertificateRefs (wellKnownCACertificates System would be stricter still, and sluice does not take it): create ConfigMap <service>-backend-ca with the CA of the backend's certificate under ca.crt; until then sluice answers the requests with 502",
            if verify {
                "proxy-ssl-verify on without a CA that the conversion can read"
            } else {
                "ingress-nginx does not verify the backend's certificate (proxy-ssl-verify off, its default), which the Gateway API cannot express"
            }
        )),
    }
    let written_names = names.join(", ");
    let verdict = if why.is_empty() {
        Verdict::Converted
    } else {
        Verdict::Approximated(format!("{written_names}: {}", why.join("; ")))
    };
    report.push(&object, format!("{PREFIX}backend-protocol"), verdict);
}

/// The `affinity` line of a main Ingress with `affinity: cookie`: each of
/// its rules has the `sessionPersistence`. ingress-nginx checks the
/// session before any canary rule (`route_to_alternative_balancer`): a
/// request pinned to the primary stays there, one pinned to a sticky
/// canary stays there. A weighted rule with both backends and the
/// session is that; a header or cookie canary rule is a rule of its own,
/// chosen before any session is read, so there a session is not checked
/// first.
fn report_affinity(ing: &Ingress, s: &RuleSettings, locs: &[&Location], report: &mut Report) {
    let mut why: Vec<String> = Vec::new();
    for l in locs {
        if let Some(c) = &l.canary
            && (!c.canary.header.is_empty() || !c.canary.cookie.is_empty())
        {
            why.push(format!(
                "host {:?} path {:?}: the canary's header and cookie rules are chosen before any session is read, so a request pinned to the primary goes to the canary when its header or cookie says so, where ingress-nginx keeps it on the primary (sessions are exact on the weighted rule)",
                l.host, l.path
            ));
        }
    }
    if !s.affinity_persistent {
        why.push(BALANCED.into());
    }
    if !s.samesite_strict {
        why.push("sluice's session cookie is SameSite=Strict, ingress-nginx's has no SameSite: a cross-site navigation does not carry it and starts a new session".into());
    }
    let verdict = if why.is_empty() {
        Verdict::Converted
    } else {
        Verdict::Approximated(format!(
            "each rule gets a Cookie sessionPersistence; {}",
            why.join("; ")
        ))
    };
    report.push(&object_name(ing), format!("{PREFIX}affinity"), verdict);
}

/// Escapes whose meaning differs between PCRE (ASCII) and Rust's regex
/// (Unicode).
fn pcre_specific(pattern: &str) -> bool {
    ["\\d", "\\w", "\\s", "\\b", "\\D", "\\W", "\\S", "\\B"]
        .iter()
        .any(|e| pattern.contains(e))
}

/// The portable stand-in of a cookie condition: a `Cookie` header holding
/// the pair. sluice replaces it with the exact condition (the first cookie
/// of the name, across every `Cookie` header); elsewhere it also takes a
/// later cookie of the same name.
pub fn cookie_regex(name: &str, value: &str) -> String {
    format!(
        "(?:.*[;,])? *(?i:{}) *= *{} *(?:;.*)?",
        regex_syntax::escape(name),
        regex_syntax::escape(value)
    )
}

/// A pattern searched anywhere in a value, as a whole-value expression.
pub fn unanchored(pattern: &str) -> String {
    format!(".*(?:{pattern}).*")
}

/// Call `f(host, path, pathType, backendRef, field)` for every path of
/// the Ingress; an error it returns, or a backend that does not resolve,
/// is an `error` line naming the path's field.
fn for_each_path(
    ing: &Ingress,
    input: &Input,
    object: &str,
    report: &mut Report,
    mut f: impl FnMut(String, String, String, Value, &str) -> Result<(), String>,
) {
    let rules = ing.spec.as_ref().and_then(|s| s.rules.as_ref());
    for (i, rule) in rules.into_iter().flatten().enumerate() {
        let host = rule.host.clone().unwrap_or_default();
        let paths = rule
            .http
            .as_ref()
            .map(|h| h.paths.as_slice())
            .unwrap_or_default();
        for (j, p) in paths.iter().enumerate() {
            let field = format!("spec.rules[{i}].http.paths[{j}]");
            let path = p
                .path
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "/".into());
            let result = backend_ref(ing, &p.backend, input)
                .and_then(|b| f(host.clone(), path, p.path_type.clone(), b, &field));
            if let Err(e) = result {
                report.push(object, field, Verdict::Error(e));
            }
        }
    }
}

/// The backendRef of an Ingress backend (a named port resolved through
/// the Service).
fn backend_ref(ing: &Ingress, b: &IngressBackend, input: &Input) -> Result<Value, String> {
    let Some(svc) = &b.service else {
        return Err("a resource backend has no Gateway API equivalent".into());
    };
    let port = svc.port.as_ref().ok_or("backend.service.port is missing")?;
    let number = match (port.number, port.name.as_deref()) {
        (Some(n), _) => n,
        (None, Some(port_name)) => {
            let service = input
                .services
                .iter()
                .find(|s| {
                    s.metadata.name.as_deref() == Some(svc.name.as_str())
                        && s.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
                            == namespace(ing)
                })
                .ok_or_else(|| {
                    format!(
                        "backend.service.port.name {port_name:?}: Service {}/{} is not in the input, so the named port cannot be resolved",
                        namespace(ing),
                        svc.name
                    )
                })?;
            service
                .spec
                .as_ref()
                .and_then(|s| s.ports.as_ref())
                .into_iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(port_name))
                .map(|p| p.port)
                .ok_or_else(|| {
                    format!(
                        "backend.service.port.name {port_name:?}: Service {}/{} has no port of that name",
                        namespace(ing),
                        svc.name
                    )
                })?
        }
        (None, None) => return Err("backend.service.port has neither number nor name".into()),
    };
    Ok(json!({"name": svc.name, "port": number}))
}

/// A DNS-label form of a host for route names.
fn slug(host: &str) -> String {
    if host.is_empty() {
        return "any".into();
    }
    host.replace('*', "wildcard")
        .replace('.', "-")
        .to_ascii_lowercase()
}

/// The path match of a location.
fn path_match(l: &Location, use_regex: bool) -> Value {
    if use_regex {
        // nginx: `location ~* "^PATH"`, case-insensitive, open at the end.
        return json!({"type": "RegularExpression", "value": format!("(?i)(?:{}).*", l.path)});
    }
    match l.path_type.as_str() {
        "Exact" => json!({"type": "Exact", "value": l.path}),
        _ => json!({"type": "PathPrefix", "value": l.path}),
    }
}

fn http_route(
    ing: &Ingress,
    route_name: &str,
    host: &str,
    locs: &[&Location],
    s: &RuleSettings,
    gateway: (&str, &str),
) -> Value {
    let mut rules: Vec<Value> = Vec::new();
    let mut cookies = serde_json::Map::new();
    let rule = |name: String, path: &Value, header: Option<Value>, backends: Vec<Value>| {
        // A GRPCRoute's rule matches a method where an HTTPRoute's matches
        // a path (`path` is then the method match, or null for all).
        let mut m = match (s.grpc, path) {
            (false, _) => json!({"path": path}),
            (true, Value::Null) => json!({}),
            (true, method) => json!({"method": method}),
        };
        if let Some(h) = header {
            m["headers"] = json!([h]);
        }
        let mut r = json!({"name": name, "matches": [m], "backendRefs": backends});
        let mut filters = s.filters.clone();
        // The prefix-stripping idiom: every path of the Ingress is one.
        if let Some(replacement) = &s.replace_prefix
            && path["type"] == "PathPrefix"
        {
            filters.push(json!({"type": "URLRewrite", "urlRewrite": {
                "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": replacement}}}));
        }
        if !filters.is_empty() {
            r["filters"] = json!(filters);
        }
        if let Some(t) = &s.timeouts {
            r["timeouts"] = t.clone();
        }
        if let Some(sp) = &s.session {
            r["sessionPersistence"] = sp.clone();
        }
        r
    };
    if let Some(root) = &s.app_root {
        rules.push(json!({
            "name": "app-root",
            "matches": [{"path": {"type": "Exact", "value": "/"}}],
            "filters": [{"type": "RequestRedirect", "requestRedirect": {
                "path": {"type": "ReplaceFullPath", "replaceFullPath": root}, "statusCode": 302}}],
        }));
    }
    for (n, l) in locs.iter().enumerate() {
        let path = if s.grpc {
            // Checked when the location was taken.
            grpc_method(&l.path, &l.path_type)
                .ok()
                .flatten()
                .unwrap_or(Value::Null)
        } else if s.replace_prefix.is_some()
            && let Some(prefix) = stripped_prefix(&l.path)
        {
            json!({"type": "PathPrefix", "value": prefix})
        } else {
            path_match(l, s.use_regex)
        };
        let base = format!("path-{n}");
        let Some(c) = &l.canary else {
            rules.push(rule(base, &path, None, vec![l.primary.clone()]));
            continue;
        };
        let canary = || vec![c.backend.clone()];
        let primary = || vec![l.primary.clone()];
        let cfg = &c.canary;
        if !cfg.header.is_empty() {
            let exact = |v: &str| json!({"type": "Exact", "name": cfg.header, "value": v});
            if !cfg.header_value.is_empty() {
                rules.push(rule(
                    format!("{base}-header-value"),
                    &path,
                    Some(exact(&cfg.header_value)),
                    canary(),
                ));
            } else if !cfg.header_pattern.is_empty() {
                let re = json!({"type": "RegularExpression", "name": cfg.header, "value": unanchored(&cfg.header_pattern)});
                rules.push(rule(
                    format!("{base}-header-pattern"),
                    &path,
                    Some(re),
                    canary(),
                ));
            } else {
                rules.push(rule(
                    format!("{base}-header-always"),
                    &path,
                    Some(exact("always")),
                    canary(),
                ));
                rules.push(rule(
                    format!("{base}-header-never"),
                    &path,
                    Some(exact("never")),
                    primary(),
                ));
            }
        }
        if !cfg.cookie.is_empty() {
            for (value, backends) in [("always", canary()), ("never", primary())] {
                let rule_name = format!("{base}-cookie-{value}");
                cookies.insert(
                    rule_name.clone(),
                    json!({"name": cfg.cookie, "value": value}),
                );
                let approx = json!({"type": "RegularExpression", "name": "Cookie", "value": cookie_regex(&cfg.cookie, value)});
                rules.push(rule(rule_name, &path, Some(approx), backends));
            }
        }
        let (pw, cw) = cfg.weights();
        let mut p = l.primary.clone();
        p["weight"] = json!(pw);
        let mut k = c.backend.clone();
        k["weight"] = json!(cw);
        rules.push(rule(base, &path, None, vec![p, k]));
    }
    let mut metadata = json!({"name": route_name, "namespace": namespace(ing)});
    if !cookies.is_empty() {
        metadata["annotations"] = json!({COOKIE_MATCHES: Value::Object(cookies).to_string()});
    }
    let mut spec = json!({
        "parentRefs": [{"name": gateway.1, "namespace": gateway.0}],
        "rules": rules,
    });
    if !host.is_empty() {
        spec["hostnames"] = json!([host]);
    }
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": route_kind(s),
        "metadata": metadata,
        "spec": spec,
    })
}

/// The kind of route a main Ingress's rules become.
fn route_kind(s: &RuleSettings) -> &'static str {
    if s.grpc { "GRPCRoute" } else { "HTTPRoute" }
}

/// The GRPCRoute method match of an Ingress path to a gRPC backend: gRPC
/// calls are `POST /package.Service/Method`, so `/` (Prefix) is every
/// call (`None`), `/package.Service` (Prefix, with or without the
/// trailing slash) one service's, and `/package.Service/Method` (Exact or
/// Prefix) one method's. Any other path has no GRPCRoute equivalent.
fn grpc_method(path: &str, path_type: &str) -> Result<Option<Value>, String> {
    let err = || {
        format!(
            "path {path:?} ({path_type}) to a gRPC backend (backend-protocol GRPC): a GRPCRoute matches /, /package.Service or /package.Service/Method; left out"
        )
    };
    let name = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    };
    let rest = path.strip_prefix('/').ok_or_else(err)?;
    if rest.is_empty() {
        return match path_type {
            "Exact" => Err(err()),
            _ => Ok(None),
        };
    }
    let (service, method) = match rest.split_once('/') {
        None => (rest, ""),
        Some((service, method)) => (service, method),
    };
    if !name(service) || !(method.is_empty() || name(method) && !method.contains('.')) {
        return Err(err());
    }
    match (method.is_empty(), path_type) {
        (true, "Exact") => Err(err()),
        (true, _) => Ok(Some(json!({"type": "Exact", "service": service}))),
        (false, _) => Ok(Some(
            json!({"type": "Exact", "service": service, "method": method}),
        )),
    }
}

/// The listeners the https redirects are written against.
struct ListenerNames {
    /// `NS/NAME` of the Gateway, for messages.
    gateway: String,
    /// The HTTP listener's name, when known (`None`: `--gateway` without
    /// `--http-listener`; the redirects are then reported, not written).
    http: Option<String>,
    /// (hostname, listener name) of the HTTPS side of each TLS host.
    https: Vec<(String, String)>,
    /// `--https-listener`: the HTTPS listener of every host.
    named_https: Option<String>,
}

/// The listener names: the generated Gateway's (`http` and an
/// `https-<host>` per TLS host with a certificate), or those `--gateway`
/// was given with (every host of a `spec.tls` on the HTTPS listener).
fn listener_names(mains: &[&Ingress], options: &Options, ns: &str, name: &str) -> ListenerNames {
    let generated = options.gateway.is_none();
    let mut https: Vec<(String, String)> = Vec::new();
    for ing in mains {
        let tls = ing.spec.as_ref().and_then(|s| s.tls.as_ref());
        for t in tls.into_iter().flatten() {
            if generated && t.secret_name.is_none() {
                // gateway_objects writes no listener for it.
                continue;
            }
            for host in t.hosts.iter().flatten() {
                if !https.iter().any(|(h, _)| h == host) {
                    let listener = match &options.listeners {
                        Some((_, l)) if !generated => l.clone(),
                        _ => format!("https-{}", slug(host)),
                    };
                    https.push((host.clone(), listener));
                }
            }
        }
    }
    let (http, named_https) = match (&options.listeners, generated) {
        (_, true) => (Some("http".to_string()), None),
        (Some((h, s)), false) => (Some(h.clone()), Some(s.clone())),
        (None, false) => (None, None),
    };
    ListenerNames {
        gateway: format!("{ns}/{name}"),
        http,
        https,
        named_https,
    }
}

/// The HTTPS listener of `host`: one of its hostname, else one whose
/// wildcard (`*.example.com`) takes it, as ingress-nginx takes a wildcard
/// certificate for the host.
fn tls_listener<'a>(host: &str, https: &'a [(String, String)]) -> Option<&'a str> {
    let exact = https.iter().find(|(h, _)| h == host);
    let wild = || {
        let (_, parent) = host.split_once('.')?;
        https
            .iter()
            .find(|(h, _)| h.strip_prefix("*.") == Some(parent))
    };
    exact.or_else(wild).map(|(_, l)| l.as_str())
}

/// The parentRefs of a route on these listeners of the Gateway.
fn parent_refs(ns: &str, name: &str, sections: &[String]) -> Value {
    json!(
        sections
            .iter()
            .map(|s| json!({"name": name, "namespace": ns, "sectionName": s}))
            .collect::<Vec<_>>()
    )
}

/// Where a host's route attaches, and the redirect route written beside it.
struct Placement {
    /// The route's listeners; `None`: the whole Gateway (each listener
    /// whose hostname takes the route's); empty: none.
    sections: Option<Vec<String>>,
    redirect: Option<Value>,
}

/// ingress-nginx's redirect of plain HTTP to https (`lua_ingress.lua`,
/// `redirect_to_https`): with `force-ssl-redirect`, or with `ssl-redirect`
/// (default true) on a host with a certificate, every request of the
/// Ingress's locations that came over plain HTTP gets a 308 to
/// `https://HOST` + the request URI (path and query; the Host's port
/// dropped, no port added: 443), the URI's last `/` dropped unless
/// `preserve-trailing-slash`. Written as an HTTPRoute on the HTTP listener
/// with the locations' path matches and a RequestRedirect (scheme https,
/// 308, which keeps path and query and leaves out port 443), the host's
/// route on its HTTPS listener only. The report line goes to the
/// annotations that decide it, or `default ssl-redirect` for a TLS host.
fn https_redirect(
    ing: &Ingress,
    route_name: &str,
    host: &str,
    locs: &[&Location],
    s: &RuleSettings,
    l: &ListenerNames,
    report: &mut Report,
) -> Placement {
    let a = nginx_annotations(ing.metadata.annotations.as_ref());
    let keys: Vec<&str> = ["ssl-redirect", "force-ssl-redirect"]
        .into_iter()
        .filter(|k| a.get(k).and_then(|v| parse_bool(v)).is_some())
        .collect();
    let tls = tls_listener(host, &l.https);
    let redirect = s.force_ssl_redirect || (s.ssl_redirect && tls.is_some());
    let mut placement = Placement {
        sections: None,
        redirect: None,
    };
    let shown = if host.is_empty() { "(any)" } else { host };
    let verdict = match (&l.http, tls) {
        _ if !redirect => {
            if let (Some(http), Some(tls)) = (&l.http, tls) {
                placement.sections = Some(vec![http.clone(), tls.to_string()]);
            }
            Verdict::Converted
        }
        (None, _) => {
            let why = format!(
                "ingress-nginx redirects plain HTTP for host {shown} to https with 308; not written, as the listener names of Gateway {} are not known: convert with --http-listener and --https-listener, or add an HTTPRoute on the HTTP listener (sectionName) with hostname {shown}, the paths of HTTPRoute {route_name} and a RequestRedirect filter (scheme https, statusCode 308), and attach {route_name} to the HTTPS listener only",
                l.gateway
            );
            if keys.is_empty() {
                Verdict::Default(why)
            } else {
                Verdict::Unsupported(why)
            }
        }
        (Some(http), tls) => {
            placement.redirect = Some(redirect_route(ing, route_name, host, locs, s, l, http));
            let https = tls.map(str::to_string).or_else(|| l.named_https.clone());
            placement.sections = Some(https.iter().cloned().collect());
            match https {
                None => Verdict::Unsupported(format!(
                    "force-ssl-redirect on host {shown}, which has no certificate: the redirect route {route_name}-https-redirect is written; ingress-nginx serves the https side with its default certificate (TLS is usually terminated in front of it), the generated Gateway has no HTTPS listener without a certificate, so {route_name} is attached to no listener: add an HTTPS listener for {shown} and attach {route_name} to it, or convert with --gateway, --http-listener and --https-listener"
                )),
                Some(_) if s.preserve_trailing_slash => Verdict::Converted,
                Some(_) => Verdict::Approximated(format!(
                    "the redirect of host {shown} is written; ingress-nginx drops the last / of the request URI (http://{shown}/docs/ goes to https://{shown}/docs), the RequestRedirect keeps it: preserve-trailing-slash: \"true\" makes it exact"
                )),
            }
        }
    };
    let object = object_name(ing);
    if keys.is_empty() {
        if tls.is_some() {
            report.push(&object, "default ssl-redirect", verdict);
        }
    } else {
        for k in keys {
            report.push(&object, format!("{PREFIX}{k}"), verdict.clone());
        }
    }
    placement
}

/// The HTTPRoute `<route>-https-redirect` on the HTTP listener: the
/// route's locations (and its app-root rule: nginx answers it before any
/// location) with a 308 RequestRedirect to https.
fn redirect_route(
    ing: &Ingress,
    route_name: &str,
    host: &str,
    locs: &[&Location],
    s: &RuleSettings,
    l: &ListenerNames,
    http: &str,
) -> Value {
    let mut rules: Vec<Value> = Vec::new();
    if let Some(root) = s.app_root.as_ref().filter(|_| !s.grpc) {
        rules.push(json!({
            "name": "app-root",
            "matches": [{"path": {"type": "Exact", "value": "/"}}],
            "filters": [{"type": "RequestRedirect", "requestRedirect": {
                "path": {"type": "ReplaceFullPath", "replaceFullPath": root}, "statusCode": 302}}],
        }));
    }
    for (n, loc) in locs.iter().enumerate() {
        let path = match stripped_prefix(&loc.path) {
            Some(prefix) if s.replace_prefix.is_some() => {
                json!({"type": "PathPrefix", "value": prefix})
            }
            _ => path_match(loc, s.use_regex),
        };
        rules.push(json!({
            "name": format!("path-{n}"),
            "matches": [{"path": path}],
            "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https", "statusCode": 308}}],
        }));
    }
    let (ns, name) = l.gateway.split_once('/').unwrap_or(("", &l.gateway));
    let mut spec = json!({
        "parentRefs": parent_refs(ns, name, &[http.to_string()]),
        "rules": rules,
    });
    if !host.is_empty() {
        spec["hostnames"] = json!([host]);
    }
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": format!("{route_name}-https-redirect"), "namespace": namespace(ing)},
        "spec": spec,
    })
}

/// A GatewayClass for sluice and a Gateway for the class: an HTTP listener
/// on 80 and an HTTPS one on 443 per TLS host of the Ingresses.
fn gateway_objects(mains: &[&Ingress], ns: &str, name: &str, class: &str) -> Vec<Value> {
    let mut listeners = vec![json!({
        "name": "http", "protocol": "HTTP", "port": 80,
        "allowedRoutes": {"namespaces": {"from": "All"}},
    })];
    let mut grants: BTreeSet<String> = BTreeSet::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for ing in mains {
        for tls in ing
            .spec
            .as_ref()
            .and_then(|s| s.tls.as_ref())
            .into_iter()
            .flatten()
        {
            let Some(secret) = &tls.secret_name else {
                continue;
            };
            for host in tls.hosts.iter().flatten() {
                if !seen.insert(host.clone()) {
                    continue;
                }
                let mut cert = json!({"kind": "Secret", "name": secret});
                if namespace(ing) != ns {
                    cert["namespace"] = json!(namespace(ing));
                    grants.insert(namespace(ing).to_string());
                }
                listeners.push(json!({
                    "name": format!("https-{}", slug(host)), "protocol": "HTTPS", "port": 443,
                    "hostname": host,
                    "tls": {"mode": "Terminate", "certificateRefs": [cert]},
                    "allowedRoutes": {"namespaces": {"from": "All"}},
                }));
            }
        }
    }
    let mut out = vec![
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "sluice"},
            "spec": {"controllerName": CONTROLLER_NAME},
        }),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": ns, "annotations": {"sluice.dev/ingress-class": class}},
            "spec": {"gatewayClassName": "sluice", "listeners": listeners},
        }),
    ];
    for from in grants {
        out.push(json!({
            "apiVersion": "gateway.networking.k8s.io/v1beta1",
            "kind": "ReferenceGrant",
            "metadata": {"name": format!("gateway-{ns}-{name}-certificates"), "namespace": from},
            "spec": {
                "from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": ns}],
                "to": [{"group": "", "kind": "Secret"}],
            }
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(yaml: &str) -> Input {
        let mut input = Input::default();
        for doc in crate::yaml::documents(yaml).expect("test YAML parses") {
            match doc.value["kind"].as_str() {
                Some("Ingress") => input
                    .ingresses
                    .push(serde_json::from_value(doc.value).expect("an Ingress")),
                Some("Service") => input
                    .services
                    .push(serde_json::from_value(doc.value).expect("a Service")),
                Some("Secret") => input
                    .secrets
                    .push(serde_json::from_value(doc.value).expect("a Secret")),
                _ => panic!("unexpected document"),
            }
        }
        input
    }

    fn ingress(name: &str, annotations: &str, paths: &str) -> String {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, annotations: {{{annotations}}}}}\nspec:\n  rules:\n  - host: a.example\n    http:\n      paths: [{paths}]\n"
        )
    }

    fn path(p: &str, t: &str, svc: &str) -> String {
        format!(
            "{{path: {p}, pathType: {t}, backend: {{service: {{name: {svc}, port: {{number: 80}}}}}}}}"
        )
    }

    const CANARY: &str = "nginx.ingress.kubernetes.io/canary: 'true'";

    /// (rule name, header condition as `name type value`, backends as
    /// `service:weight`) of every rule of the first HTTPRoute.
    fn rules(c: &Conversion) -> Vec<(String, String, String)> {
        let route = c
            .objects
            .iter()
            .find(|o| o["kind"] == "HTTPRoute")
            .expect("a route");
        route["spec"]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let h = &r["matches"][0]["headers"][0];
                let header = if h.is_null() {
                    String::new()
                } else {
                    format!(
                        "{} {} {}",
                        h["name"].as_str().unwrap(),
                        h["type"].as_str().unwrap(),
                        h["value"].as_str().unwrap()
                    )
                };
                let backends: Vec<String> = r["backendRefs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|b| match b["weight"].as_i64() {
                        Some(w) => format!("{}:{w}", b["name"].as_str().unwrap()),
                        None => b["name"].as_str().unwrap().to_string(),
                    })
                    .collect();
                (
                    r["name"].as_str().unwrap().to_string(),
                    header,
                    backends.join(","),
                )
            })
            .collect()
    }

    fn owned(rows: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
        rows.iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect()
    }

    #[test]
    fn canary_ladders() {
        type Rows<'a> = &'a [(&'a str, &'a str, &'a str)];
        let table: &[(&str, Rows<'_>)] = &[
            (
                "nginx.ingress.kubernetes.io/canary-weight: '10'",
                &[("path-0", "", "main:90,canary:10")],
            ),
            (
                "nginx.ingress.kubernetes.io/canary-by-header: X-C",
                &[
                    ("path-0-header-always", "X-C Exact always", "canary"),
                    ("path-0-header-never", "X-C Exact never", "main"),
                    ("path-0", "", "main:100,canary:0"),
                ],
            ),
            (
                "nginx.ingress.kubernetes.io/canary-by-header: X-C, nginx.ingress.kubernetes.io/canary-by-header-value: v1, nginx.ingress.kubernetes.io/canary-by-header-pattern: x",
                &[
                    ("path-0-header-value", "X-C Exact v1", "canary"),
                    ("path-0", "", "main:100,canary:0"),
                ],
            ),
            (
                "nginx.ingress.kubernetes.io/canary-by-header: X-C, nginx.ingress.kubernetes.io/canary-by-header-pattern: 'v[12]'",
                &[
                    (
                        "path-0-header-pattern",
                        "X-C RegularExpression .*(?:v[12]).*",
                        "canary",
                    ),
                    ("path-0", "", "main:100,canary:0"),
                ],
            ),
            (
                "nginx.ingress.kubernetes.io/canary-by-cookie: beta, nginx.ingress.kubernetes.io/canary-weight: '5', nginx.ingress.kubernetes.io/canary-weight-total: '1000'",
                &[
                    (
                        "path-0-cookie-always",
                        "Cookie RegularExpression (?:.*[;,])? *(?i:beta) *= *always *(?:;.*)?",
                        "canary",
                    ),
                    (
                        "path-0-cookie-never",
                        "Cookie RegularExpression (?:.*[;,])? *(?i:beta) *= *never *(?:;.*)?",
                        "main",
                    ),
                    ("path-0", "", "main:995,canary:5"),
                ],
            ),
        ];
        for (annotations, want) in table {
            let yaml = ingress("main", "", &path("/", "Prefix", "main"))
                + &ingress(
                    "canary",
                    &format!("{CANARY}, {annotations}"),
                    &path("/", "Prefix", "canary"),
                );
            let c = convert(&input(&yaml), &Options::default());
            assert_eq!(rules(&c), owned(want), "{annotations}");
        }
    }

    #[test]
    fn cookie_rules_are_named_in_the_route_annotation() {
        let yaml = ingress("main", "", &path("/", "Prefix", "main"))
            + &ingress(
                "canary",
                &format!("{CANARY}, nginx.ingress.kubernetes.io/canary-by-cookie: beta"),
                &path("/", "Prefix", "canary"),
            );
        let c = convert(&input(&yaml), &Options::default());
        let route = c.objects.iter().find(|o| o["kind"] == "HTTPRoute").unwrap();
        let ann: Value = serde_json::from_str(
            route["metadata"]["annotations"][COOKIE_MATCHES]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            ann,
            json!({"path-0-cookie-always": {"name": "beta", "value": "always"},
                   "path-0-cookie-never": {"name": "beta", "value": "never"}})
        );
        assert!(c.report.is_exact(), "{:?}", c.report);
    }

    #[test]
    fn a_canary_merges_only_on_equal_host_path_and_path_type_once() {
        let yaml = ingress(
            "main",
            "",
            &[path("/a", "Prefix", "main"), path("/b", "Exact", "main")].join(", "),
        ) + &ingress(
            "c1",
            CANARY,
            &[path("/a", "Exact", "c1"), path("/b", "Exact", "c1")].join(", "),
        ) + &ingress("c2", CANARY, &path("/b", "Exact", "c2"));
        let c = convert(&input(&yaml), &Options::default());
        let err = |o: &str, f: &str| match c.report.find(o, f) {
            Some(Verdict::Error(e)) => e.clone(),
            other => panic!("{o} {f}: {other:?}"),
        };
        assert!(
            err("Ingress default/c1", "spec.rules[0].http.paths[0]")
                .contains("no main Ingress serves host \"a.example\" path \"/a\" (Exact)")
        );
        assert!(
            err("Ingress default/c2", "spec.rules[0].http.paths[0]")
                .contains("already has a canary")
        );
        assert!(!c.report.is_exact());
        let names: Vec<String> = rules(&c).into_iter().map(|r| r.2).collect();
        assert_eq!(names, ["main", "main:100,c1:0"]);
    }

    #[test]
    fn classes_named_ports_and_oldest_main() {
        let yaml = "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: other}\nspec: {ingressClassName: traefik}\n".to_string()
            + &ingress("main", "", "{path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}")
            + "---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{name: http, port: 8080}]}\n"
            + &ingress("nope", "", "{path: /x, pathType: Prefix, backend: {service: {name: gone, port: {name: http}}}}");
        let c = convert(&input(&yaml), &Options::default());
        assert!(matches!(
            c.report
                .find("Ingress default/other", "spec.ingressClassName"),
            Some(Verdict::Skipped(_))
        ));
        assert_eq!(rules(&c)[0].2, "web");
        let route = c.objects.iter().find(|o| o["kind"] == "HTTPRoute").unwrap();
        assert_eq!(route["spec"]["rules"][0]["backendRefs"][0]["port"], 8080);
        assert!(
            matches!(c.report.find("Ingress default/nope", "spec.rules[0].http.paths[0]"), Some(Verdict::Error(e)) if e.contains("Service default/gone is not in the input"))
        );
    }

    #[test]
    fn grpc_paths_become_services_and_methods() {
        let svc = "pkg.v1.Shop";
        assert_eq!(grpc_method("/", "Prefix"), Ok(None));
        for path in [format!("/{svc}"), format!("/{svc}/")] {
            assert_eq!(
                grpc_method(&path, "Prefix"),
                Ok(Some(json!({"type": "Exact", "service": svc}))),
                "{path}"
            );
        }
        for t in ["Exact", "Prefix", "ImplementationSpecific"] {
            assert_eq!(
                grpc_method(&format!("/{svc}/Buy"), t),
                Ok(Some(
                    json!({"type": "Exact", "service": svc, "method": "Buy"})
                )),
                "{t}"
            );
        }
        for (path, t) in [
            ("/", "Exact"),
            ("/pkg.v1.Shop", "Exact"),
            ("/api/v1/buy", "Prefix"),
            ("/pkg.v1.Shop/Buy/more", "Prefix"),
            ("/pkg v1", "Prefix"),
            ("/pkg.v1.Shop/a.b", "Prefix"),
        ] {
            assert!(grpc_method(path, t).is_err(), "{path} {t}");
        }
    }

    /// A main Ingress `web` with TLS for `tls_hosts` (Secret `cert`), a
    /// rule per host in `hosts` with path `/` (Prefix), and `annotations`.
    fn tls_ingress(annotations: &str, hosts: &[&str], tls_hosts: &[&str]) -> Input {
        let rules: String = hosts
            .iter()
            .map(|h| {
                format!(
                    "  - host: {h}\n    http:\n      paths: [{}]\n",
                    path("/", "Prefix", "web")
                )
            })
            .collect();
        let tls = if tls_hosts.is_empty() {
            String::new()
        } else {
            format!(
                "  tls: [{{hosts: [{}], secretName: cert}}]\n",
                tls_hosts.join(", ")
            )
        };
        input(&format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: web, annotations: {{{annotations}}}}}\nspec:\n{tls}  rules:\n{rules}"
        ))
    }

    fn route<'a>(c: &'a Conversion, name: &str) -> Option<&'a Value> {
        c.objects
            .iter()
            .find(|o| o["kind"] == "HTTPRoute" && o["metadata"]["name"] == name)
    }

    /// The sectionNames of a route's parentRefs (`-` for none given).
    fn sections(c: &Conversion, name: &str) -> Vec<String> {
        route(c, name).expect("the route")["spec"]["parentRefs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["sectionName"].as_str().unwrap_or("-").to_string())
            .collect()
    }

    const WEB: &str = "Ingress default/web";

    #[test]
    fn tls_hosts_are_redirected_on_http_and_served_on_their_https_listener() {
        let c = convert(
            &tls_ingress("", &["a.example", "b.example"], &["a.example"]),
            &Options::default(),
        );
        assert_eq!(sections(&c, "web-a-example"), ["https-a-example"]);
        assert_eq!(sections(&c, "web-b-example"), ["-"]);
        assert!(route(&c, "web-b-example-https-redirect").is_none());
        let redirect = route(&c, "web-a-example-https-redirect").expect("a redirect route");
        assert_eq!(
            redirect["spec"],
            json!({
                "parentRefs": [{"name": "nginx", "namespace": "default", "sectionName": "http"}],
                "hostnames": ["a.example"],
                "rules": [{"name": "path-0", "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https", "statusCode": 308}}]}],
            })
        );
        assert!(
            matches!(c.report.find(WEB, "default ssl-redirect"), Some(Verdict::Approximated(why)) if why.contains("last /")),
            "{:?}",
            c.report
        );
        let exact = convert(
            &tls_ingress(
                "nginx.ingress.kubernetes.io/preserve-trailing-slash: 'true'",
                &["a.example"],
                &["a.example"],
            ),
            &Options::default(),
        );
        assert_eq!(
            exact.report.find(WEB, "default ssl-redirect"),
            Some(&Verdict::Converted)
        );
        assert!(route(&exact, "web-https-redirect").is_some());
        assert!(exact.report.is_exact(), "{:?}", exact.report);
    }

    #[test]
    fn ssl_redirect_false_serves_both_listeners_and_force_redirects_without_tls() {
        let off = convert(
            &tls_ingress(
                "nginx.ingress.kubernetes.io/ssl-redirect: 'false'",
                &["a.example"],
                &["a.example"],
            ),
            &Options::default(),
        );
        assert_eq!(sections(&off, "web"), ["http", "https-a-example"]);
        assert!(route(&off, "web-https-redirect").is_none());
        assert_eq!(
            off.report
                .find(WEB, "nginx.ingress.kubernetes.io/ssl-redirect"),
            Some(&Verdict::Converted)
        );

        let force = "nginx.ingress.kubernetes.io/force-ssl-redirect: 'true', nginx.ingress.kubernetes.io/preserve-trailing-slash: 'true'";
        let c = convert(
            &tls_ingress(force, &["a.example"], &[]),
            &Options::default(),
        );
        assert!(route(&c, "web-https-redirect").is_some());
        assert!(
            sections(&c, "web").is_empty(),
            "no HTTPS listener to attach to"
        );
        assert!(matches!(
            c.report.find(WEB, "nginx.ingress.kubernetes.io/force-ssl-redirect"),
            Some(Verdict::Unsupported(why)) if why.contains("attached to no listener")
        ));
        let named = Options {
            gateway: Some(("infra".into(), "edge".into())),
            listeners: Some(("web".into(), "websecure".into())),
            ..Options::default()
        };
        let c = convert(&tls_ingress(force, &["a.example"], &[]), &named);
        assert_eq!(sections(&c, "web"), ["websecure"]);
        assert_eq!(sections(&c, "web-https-redirect"), ["web"]);
        assert_eq!(
            route(&c, "web-https-redirect").unwrap()["spec"]["parentRefs"][0]["namespace"],
            "infra"
        );
        assert!(c.report.is_exact(), "{:?}", c.report);
    }

    #[test]
    fn without_listener_names_the_redirect_is_reported_and_wildcards_take_hosts() {
        let gateway = Options {
            gateway: Some(("default".into(), "gw".into())),
            ..Options::default()
        };
        let c = convert(&tls_ingress("", &["a.example"], &["a.example"]), &gateway);
        assert!(route(&c, "web-https-redirect").is_none());
        assert_eq!(sections(&c, "web"), ["-"]);
        assert!(matches!(
            c.report.find(WEB, "default ssl-redirect"),
            Some(Verdict::Default(why)) if why.contains("--http-listener")
        ));
        let explicit = tls_ingress(
            "nginx.ingress.kubernetes.io/ssl-redirect: 'true'",
            &["a.example"],
            &["a.example"],
        );
        assert!(matches!(
            convert(&explicit, &gateway)
                .report
                .find(WEB, "nginx.ingress.kubernetes.io/ssl-redirect"),
            Some(Verdict::Unsupported(_))
        ));
        let bad = tls_ingress(
            "nginx.ingress.kubernetes.io/ssl-redirect: 'yes'",
            &["a.example"],
            &["a.example"],
        );
        assert!(matches!(
            convert(&bad, &Options::default())
                .report
                .find(WEB, "nginx.ingress.kubernetes.io/ssl-redirect"),
            Some(Verdict::Error(_))
        ));

        let https = vec![("*.example".to_string(), "https-wild".to_string())];
        assert_eq!(tls_listener("a.example", &https), Some("https-wild"));
        assert_eq!(tls_listener("a.b.example", &https), None);
        assert_eq!(tls_listener("example", &https), None);
    }

    #[test]
    fn common_annotations_become_filters() {
        let yaml = ingress(
            "main",
            "nginx.ingress.kubernetes.io/rewrite-target: /new, nginx.ingress.kubernetes.io/upstream-vhost: inner.local, nginx.ingress.kubernetes.io/x-forwarded-prefix: /p, nginx.ingress.kubernetes.io/rewrite-target-typo: x",
            &path("/", "Prefix", "main"),
        );
        let c = convert(&input(&yaml), &Options::default());
        let route = c.objects.iter().find(|o| o["kind"] == "HTTPRoute").unwrap();
        assert_eq!(
            route["spec"]["rules"][0]["filters"],
            json!([
                {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "X-Forwarded-Prefix", "value": "/p"}]}},
                {"type": "URLRewrite", "urlRewrite": {"hostname": "inner.local", "path": {"type": "ReplaceFullPath", "replaceFullPath": "/new"}}}
            ])
        );
        assert_eq!(
            c.report.find(
                "Ingress default/main",
                "nginx.ingress.kubernetes.io/rewrite-target"
            ),
            Some(&Verdict::Converted)
        );
        assert!(matches!(
            c.report.find(
                "Ingress default/main",
                "nginx.ingress.kubernetes.io/rewrite-target-typo"
            ),
            Some(Verdict::Unsupported(_))
        ));
        assert!(matches!(
            c.report
                .find("Ingress default/main", "default proxy-body-size"),
            Some(Verdict::Default(_))
        ));
    }

    fn of_kind<'a>(c: &'a Conversion, kind: &str) -> Vec<&'a Value> {
        c.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    const CA_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn backend_protocol_https_writes_a_backend_tls_policy_with_the_secret_s_ca() {
        let secret = format!(
            "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: backend-ca, namespace: default}}\nstringData: {{ca.crt: {CA_PEM:?}}}\n"
        );
        let exact = "nginx.ingress.kubernetes.io/backend-protocol: HTTPS, nginx.ingress.kubernetes.io/proxy-ssl-secret: default/backend-ca, nginx.ingress.kubernetes.io/proxy-ssl-verify: 'on', nginx.ingress.kubernetes.io/proxy-ssl-name: app.internal";
        let yaml = ingress("main", exact, &path("/", "Prefix", "main")) + &secret;
        let c = convert(&input(&yaml), &Options::default());
        assert!(c.report.is_exact(), "{:?}", c.report);
        let policies = of_kind(&c, "BackendTLSPolicy");
        assert_eq!(policies.len(), 1);
        assert_eq!(
            policies[0]["spec"],
            json!({"targetRefs": [{"group": "", "kind": "Service", "name": "main"}],
                   "validation": {"caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "backend-ca-ca"}],
                                  "hostname": "app.internal"}})
        );
        let maps = of_kind(&c, "ConfigMap");
        assert_eq!(maps[0]["data"]["ca.crt"], CA_PEM);

        // ingress-nginx's default: no verification, no CA: the strict
        // form, approximated, and the ConfigMap left to write.
        let yaml = ingress(
            "main",
            "nginx.ingress.kubernetes.io/backend-protocol: HTTPS",
            &path("/", "Prefix", "main"),
        );
        let c = convert(&input(&yaml), &Options::default());
        assert!(
            matches!(
                c.report.find("Ingress default/main", "nginx.ingress.kubernetes.io/backend-protocol"),
                Some(Verdict::Approximated(why)) if why.contains("does not verify") && why.contains("main-backend-ca")
            ),
            "{:?}",
            c.report
        );
        let policies = of_kind(&c, "BackendTLSPolicy");
        assert_eq!(
            policies[0]["spec"]["validation"]["hostname"],
            "main.default.svc.cluster.local"
        );
        assert!(of_kind(&c, "ConfigMap").is_empty());

        // A Secret not in the input: an error on proxy-ssl-secret.
        let yaml = ingress("main", exact, &path("/", "Prefix", "main"));
        let c = convert(&input(&yaml), &Options::default());
        assert!(matches!(
            c.report.find("Ingress default/main", "nginx.ingress.kubernetes.io/proxy-ssl-secret"),
            Some(Verdict::Error(why)) if why.contains("not in the input")
        ));
    }

    #[test]
    fn backend_protocol_grpcs_is_a_grpcroute_over_tls_for_primary_and_canary() {
        let yaml = ingress(
            "main",
            "nginx.ingress.kubernetes.io/backend-protocol: GRPCS, nginx.ingress.kubernetes.io/proxy-ssl-name: rpc.internal",
            &path("/", "Prefix", "main"),
        ) + &ingress(
            "canary",
            &format!("{CANARY}, nginx.ingress.kubernetes.io/canary-weight: '10'"),
            &path("/", "Prefix", "canary"),
        );
        let c = convert(&input(&yaml), &Options::default());
        assert_eq!(of_kind(&c, "GRPCRoute").len(), 1);
        let targets: Vec<&Value> = of_kind(&c, "BackendTLSPolicy")
            .iter()
            .map(|p| &p["spec"]["targetRefs"][0]["name"])
            .collect();
        assert_eq!(targets, [&json!("canary"), &json!("main")]);
    }

    #[test]
    fn affinity_becomes_session_persistence_on_every_rule() {
        let yaml = ingress(
            "main",
            "nginx.ingress.kubernetes.io/affinity: cookie, nginx.ingress.kubernetes.io/affinity-mode: persistent, nginx.ingress.kubernetes.io/session-cookie-samesite: Strict, nginx.ingress.kubernetes.io/session-cookie-name: route, nginx.ingress.kubernetes.io/session-cookie-expires: '5400'",
            &path("/", "Prefix", "main"),
        ) + &ingress(
            "canary",
            &format!("{CANARY}, nginx.ingress.kubernetes.io/canary-weight: '10'"),
            &path("/", "Prefix", "canary"),
        );
        let c = convert(&input(&yaml), &Options::default());
        let route = c.objects.iter().find(|o| o["kind"] == "HTTPRoute").unwrap();
        assert_eq!(
            route["spec"]["rules"][0]["sessionPersistence"],
            json!({"type": "Cookie", "sessionName": "route", "absoluteTimeout": "1h30m",
                   "cookieConfig": {"lifetimeType": "Permanent"}})
        );
        // Weight only, persistent, SameSite Strict: exact.
        assert!(c.report.is_exact(), "{:?}", c.report);

        // A header canary is chosen before the session is read; balanced
        // moves sessions; legacy pins no canary session.
        let yaml = ingress(
            "main",
            "nginx.ingress.kubernetes.io/affinity: cookie",
            &path("/", "Prefix", "main"),
        ) + &ingress(
            "canary",
            &format!(
                "{CANARY}, nginx.ingress.kubernetes.io/canary-by-header: X-C, nginx.ingress.kubernetes.io/affinity-canary-behavior: legacy"
            ),
            &path("/", "Prefix", "canary"),
        );
        let c = convert(&input(&yaml), &Options::default());
        let why = match c.report.find(
            "Ingress default/main",
            "nginx.ingress.kubernetes.io/affinity",
        ) {
            Some(Verdict::Approximated(why)) => why.clone(),
            other => panic!("{other:?}"),
        };
        assert!(
            why.contains("header and cookie rules")
                && why.contains("balanced")
                && why.contains("SameSite"),
            "{why}"
        );
        assert!(matches!(
            c.report.find(
                "Ingress default/canary",
                "nginx.ingress.kubernetes.io/affinity-canary-behavior"
            ),
            Some(Verdict::Approximated(_))
        ));
        let route = c.objects.iter().find(|o| o["kind"] == "HTTPRoute").unwrap();
        assert_eq!(
            route["spec"]["rules"][2]["sessionPersistence"]["sessionName"],
            "INGRESSCOOKIE"
        );

        let bad = ingress(
            "main",
            "nginx.ingress.kubernetes.io/affinity: ip, nginx.ingress.kubernetes.io/session-cookie-name: x",
            &path("/", "Prefix", "main"),
        );
        let c = convert(&input(&bad), &Options::default());
        assert!(matches!(
            c.report.find(
                "Ingress default/main",
                "nginx.ingress.kubernetes.io/affinity"
            ),
            Some(Verdict::Error(_))
        ));
        let route = c.objects.iter().find(|o| o["kind"] == "HTTPRoute").unwrap();
        assert!(
            route["spec"]["rules"][0]
                .get("sessionPersistence")
                .is_none()
        );
    }

    #[test]
    fn gateway_durations_fit_five_digits_per_unit() {
        use super::super::annotations::gateway_duration;
        assert_eq!(gateway_duration(172_800).as_deref(), Some("48h"));
        assert_eq!(gateway_duration(90).as_deref(), Some("1m30s"));
        assert_eq!(gateway_duration(3_661).as_deref(), Some("1h1m1s"));
        assert_eq!(gateway_duration(0).as_deref(), Some("0s"));
        assert_eq!(gateway_duration(100_000 * 3600), None);
    }
}
