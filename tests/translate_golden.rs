//! Golden tests for translate: `tests/translate/<case>.in.yaml` (every
//! input object of the case) → `<case>.out.yaml` (status of every object,
//! rule summaries, warnings, sockets, load errors).
//!
//! A case may end with a document of kind `Probes` (apiVersion
//! `golden.sluice.dev/v1`, which sluice skips as a kind it does not read):
//! each of its `requests` is looked up in the route table, and the rule it
//! reaches, with its filters and backends, is part of the output. That is
//! how the golden files show what filters and hostnames compile to.
//!
//! Conditions are stamped with the Unix epoch. Regenerate with
//! `UPDATE_GOLDEN=1 cargo test --test translate_golden`, then review every
//! changed line against the spec: a golden file that records a wrong
//! answer is a defect.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use http::{HeaderMap, HeaderName, Method};
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use sluice::resources::{Generations, Snapshot, parse_manifests};
use sluice::route::{
    Backend, BackendTarget, CorsList, Filter, HeaderModifier, Lookup, PathMatch, PathModifier,
    RouteTable, SessionCarrier, SessionPersistence, StreamLookup, ValueMatch,
};
use sluice::translate::{ObjectStatus, RuleSummary, TranslateOptions, translate_at};

const PROBES_API_VERSION: &str = "golden.sluice.dev/v1";

#[derive(Deserialize)]
struct ProbesDoc {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    requests: Vec<ProbeRequest>,
}

#[derive(Deserialize)]
struct ProbeRequest {
    bind: SocketAddr,
    #[serde(default)]
    host: String,
    #[serde(default)]
    method: Option<String>,
    /// Path with an optional `?query`.
    #[serde(default)]
    path: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// A TLS connection with this SNI (on a socket of TLS listeners),
    /// instead of a request.
    #[serde(default)]
    sni: Option<String>,
}

#[derive(Serialize)]
struct ProbeResult {
    request: String,
    result: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    filters: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    backends: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Golden {
    /// Objects refused on load (`file:line: object: field: message`).
    load_errors: Vec<String>,
    /// Documents of kinds sluice does not read.
    ignored: Vec<String>,
    /// Sockets the route table serves.
    binds: Vec<String>,
    /// Which listener is served on which socket.
    listener_binds: Vec<String>,
    status: Vec<ObjectStatus>,
    rules: Vec<RuleSummary>,
    warnings: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    probes: Vec<ProbeResult>,
}

fn run_case(input: &Path) -> String {
    let text = std::fs::read_to_string(input).expect("golden input is readable");
    let file = input
        .file_name()
        .expect("file name")
        .to_string_lossy()
        .to_string();
    let parsed = parse_manifests(&text, &file);
    let snapshot = Snapshot::from_loaded(parsed.objects, |objects| {
        Generations::new().assign(objects, Timestamp::UNIX_EPOCH);
    });
    let options = TranslateOptions {
        default_bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    let t = translate_at(&snapshot, &options, Timestamp::UNIX_EPOCH);
    let golden = Golden {
        load_errors: parsed.errors.iter().map(ToString::to_string).collect(),
        ignored: parsed
            .ignored
            .iter()
            .filter(|i| !i.contains(PROBES_API_VERSION))
            .cloned()
            .collect(),
        binds: t.table.binds().map(|b| b.to_string()).collect(),
        listener_binds: t
            .status
            .listener_binds
            .iter()
            .map(|b| match &b.listener_set {
                None => format!(
                    "{}/{} {} -> {}",
                    b.gateway_namespace, b.gateway_name, b.listener, b.bind
                ),
                Some((ns, name)) => format!(
                    "{}/{} ListenerSet {ns}/{name} {} -> {}",
                    b.gateway_namespace, b.gateway_name, b.listener, b.bind
                ),
            })
            .collect(),
        status: t.status.objects,
        rules: t.rules.iter().map(|r| (**r).clone()).collect(),
        warnings: t.warnings,
        probes: probes(&text).iter().map(|p| probe(&t.table, p)).collect(),
    };
    sluice::yaml::to_string(&golden).expect("golden output serializes")
}

fn probes(text: &str) -> Vec<ProbeRequest> {
    let mut out = Vec::new();
    let Ok(docs) = sluice::yaml::documents(text) else {
        return out;
    };
    for doc in docs {
        let Ok(d) = serde_json::from_value::<ProbesDoc>(doc.value) else {
            continue;
        };
        if d.api_version.as_deref() == Some(PROBES_API_VERSION)
            && d.kind.as_deref() == Some("Probes")
        {
            out.extend(d.requests);
        }
    }
    out
}

fn probe(table: &RouteTable, p: &ProbeRequest) -> ProbeResult {
    if let Some(sni) = &p.sni {
        return probe_sni(table, p.bind, sni);
    }
    let method: Method = p
        .method
        .as_deref()
        .unwrap_or("GET")
        .parse()
        .expect("probe method is valid");
    let (path, query) = match p.path.split_once('?') {
        Some((path, q)) => (path, Some(q)),
        None => (p.path.as_str(), None),
    };
    let mut headers = HeaderMap::new();
    for (k, v) in &p.headers {
        headers.append(
            HeaderName::from_bytes(k.as_bytes()).expect("probe header name is valid"),
            v.parse().expect("probe header value is valid"),
        );
    }
    let mut request = format!("{method} {}{} on {}", p.host, p.path, p.bind);
    for (k, v) in &p.headers {
        request.push_str(&format!(" [{k}: {v}]"));
    }
    let host = sluice::route::normalize_host(&p.host);
    match table.lookup(p.bind, &host, &method, path, query, &headers) {
        Lookup::NoListener => ProbeResult {
            request,
            result: "404: no listener for this host".into(),
            filters: vec![],
            backends: vec![],
            retry: None,
            session: None,
        },
        Lookup::NoRoute { listener } => ProbeResult {
            request,
            result: format!("404: no route on {}", listener.id),
            filters: vec![],
            backends: vec![],
            retry: None,
            session: None,
        },
        Lookup::Matched(m) => ProbeResult {
            request,
            result: format!(
                "{} on {} (match {})",
                m.rule.id,
                m.listener.id,
                describe_path(&m.matched.path)
            ),
            filters: m.rule.filters.iter().map(describe_filter).collect(),
            backends: m
                .rule
                .backends
                .backends()
                .iter()
                .map(describe_backend)
                .collect(),
            retry: m.rule.retry.as_ref().map(|r| {
                let codes: Vec<String> = r.codes.iter().map(|c| c.as_str().to_string()).collect();
                format!(
                    "codes [{}] attempts {} backoff {:?}",
                    codes.join(", "),
                    r.attempts,
                    r.backoff
                )
            }),
            session: m.rule.session.as_ref().map(describe_session),
        },
    }
}

/// Where a TLS connection with SNI `sni` goes.
fn probe_sni(table: &RouteTable, bind: SocketAddr, sni: &str) -> ProbeResult {
    let request = format!("TLS connection with SNI {sni} on {bind}");
    let none = |result: String| ProbeResult {
        request: request.clone(),
        result,
        filters: vec![],
        backends: vec![],
        retry: None,
        session: None,
    };
    let Some(port) = table.port(bind) else {
        return none("refused: no socket".into());
    };
    match port.stream_route(&sluice::route::normalize_host(sni)) {
        StreamLookup::NoListener => none("refused: no TLS listener owns this name".into()),
        StreamLookup::NoRoute { listener } => {
            none(format!("refused: no TLSRoute on {}", listener.id))
        }
        StreamLookup::Matched { listener, rule } => ProbeResult {
            result: format!(
                "{} on {} ({})",
                rule.id,
                listener.id,
                listener
                    .stream
                    .as_ref()
                    .map_or("?".to_owned(), |s| format!("{:?}", s.mode))
            ),
            backends: rule
                .backends
                .backends()
                .iter()
                .map(describe_backend)
                .collect(),
            ..none(String::new())
        },
    }
}

fn describe_session(s: &SessionPersistence) -> String {
    let carrier = match &s.carrier {
        SessionCarrier::Cookie { name, permanent } => format!(
            "cookie {name} ({})",
            if *permanent { "permanent" } else { "session" }
        ),
        SessionCarrier::Header(name) => format!("header {name}"),
    };
    format!(
        "{carrier}, absoluteTimeout {:?}, idleTimeout {:?}",
        s.absolute_timeout, s.idle_timeout
    )
}

fn describe_path(p: &PathMatch) -> String {
    match p {
        PathMatch::Exact(v) => format!("Exact {v}"),
        PathMatch::Prefix(v) => format!("PathPrefix {v}"),
        PathMatch::RegularExpression(re) => format!("RegularExpression {}", re.as_str()),
        PathMatch::Grpc(g) => {
            let part = |v: &Option<ValueMatch>| match v {
                None => "*".to_owned(),
                Some(ValueMatch::Exact(v)) => v.clone(),
                Some(ValueMatch::RegularExpression(re)) => format!("~{}", re.as_str()),
                Some(ValueMatch::Cookie(c)) => format!("cookie {}={}", c.name, c.value),
            };
            format!("gRPC {}/{}", part(&g.service), part(&g.method))
        }
    }
}

fn describe_headers(m: &HeaderModifier) -> String {
    let pairs = |v: &[(HeaderName, http::HeaderValue)]| {
        v.iter()
            .map(|(k, v)| format!("{k}={}", v.to_str().unwrap_or("<binary>")))
            .collect::<Vec<_>>()
            .join(",")
    };
    let remove: Vec<&str> = m.remove.iter().map(HeaderName::as_str).collect();
    format!(
        "set[{}] add[{}] remove[{}]",
        pairs(&m.set),
        pairs(&m.add),
        remove.join(",")
    )
}

fn describe_path_modifier(p: &Option<PathModifier>) -> String {
    match p {
        None => "-".into(),
        Some(PathModifier::ReplaceFullPath(v)) => format!("ReplaceFullPath {v}"),
        Some(PathModifier::ReplacePrefixMatch(v)) => format!("ReplacePrefixMatch {v}"),
    }
}

fn describe_filter(f: &Filter) -> String {
    match f {
        Filter::RequestHeaderModifier(m) => {
            format!("RequestHeaderModifier {}", describe_headers(m))
        }
        Filter::ResponseHeaderModifier(m) => {
            format!("ResponseHeaderModifier {}", describe_headers(m))
        }
        Filter::RequestRedirect(r) => format!(
            "RequestRedirect {} scheme={} hostname={} port={} path={}",
            r.status.as_u16(),
            r.scheme.as_deref().unwrap_or("-"),
            r.hostname.as_deref().unwrap_or("-"),
            r.port.map(|p| p.to_string()).unwrap_or("-".into()),
            describe_path_modifier(&r.path)
        ),
        Filter::UrlRewrite(u) => format!(
            "URLRewrite hostname={} path={}",
            u.hostname.as_deref().unwrap_or("-"),
            describe_path_modifier(&u.path)
        ),
        Filter::RequestMirror(m) => format!(
            "RequestMirror {}/{} to {}",
            m.numerator,
            m.denominator,
            describe_backend(&m.backend)
        ),
        Filter::Cors(c) => {
            let list = |l: &CorsList| match l {
                CorsList::Unset => "-".to_string(),
                CorsList::Wildcard => "*".to_string(),
                CorsList::Names(v) => format!("[{}]", v.to_str().unwrap_or("<binary>")),
            };
            let origins: Vec<String> = c.allow_origins.iter().map(|o| format!("{o:?}")).collect();
            format!(
                "CORS origins [{}] credentials={} methods={} headers={} expose={} maxAge={}",
                origins.join(", "),
                c.allow_credentials,
                list(&c.allow_methods),
                list(&c.allow_headers),
                list(&c.expose_headers),
                c.max_age.to_str().unwrap_or("<binary>")
            )
        }
    }
}

fn describe_backend(b: &Backend) -> String {
    let target = match &b.target {
        BackendTarget::Endpoints(e) => format!(
            "{:?} {}",
            e.protocol,
            e.addrs()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
        BackendTarget::NoReadyEndpoints => "503 (no ready endpoints)".into(),
        BackendTarget::Unresolved { reason } => format!("500 ({reason})"),
    };
    let mut s = format!("{} {} weight {} -> {target}", b.id, b.service, b.weight);
    for f in &b.filters {
        s.push_str(&format!(" + {}", describe_filter(f)));
    }
    s
}

fn cases() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/translate");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/translate exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".in.yaml"))
        .collect();
    cases.sort();
    cases
}

#[test]
fn translate_golden_files() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let cases = cases();
    assert!(
        cases.len() >= 10,
        "expected the golden cases in tests/translate, found {}",
        cases.len()
    );
    let mut failures = Vec::new();
    for input in cases {
        let output = PathBuf::from(input.to_string_lossy().replace(".in.yaml", ".out.yaml"));
        let got = run_case(&input);
        if update {
            std::fs::write(&output, &got).expect("golden output is writable");
            continue;
        }
        match std::fs::read_to_string(&output) {
            Ok(want) if want == got => {}
            Ok(want) => failures.push(format!(
                "{}: output differs from {}\n{}",
                input.display(),
                output.display(),
                first_difference(&want, &got)
            )),
            Err(_) => failures.push(format!(
                "{}: no {} (run with UPDATE_GOLDEN=1 and review it)",
                input.display(),
                output.display()
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn first_difference(want: &str, got: &str) -> String {
    for (i, (w, g)) in want.lines().zip(got.lines()).enumerate() {
        if w != g {
            return format!("line {}:\n  want: {w}\n  got:  {g}", i + 1);
        }
    }
    format!(
        "lengths differ: want {} lines, got {} lines",
        want.lines().count(),
        got.lines().count()
    )
}
