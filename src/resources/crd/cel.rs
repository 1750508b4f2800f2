//! `x-kubernetes-validations`: CEL rules compiled with the `cel` crate (the
//! maintained Rust CEL implementation, formerly `cel-interpreter`), plus
//! the functions of the Kubernetes CEL library that CRD rules call.
//!
//! As the API server does: `self` is the value at the rule's node (object
//! properties whose names CEL cannot spell are escaped: `namespace` is
//! `__namespace__`, `a.b` is `a__dot__b`), a rule that does not hold gives
//! `Invalid value: "<type>": <message>` at the node (or at its `fieldPath`,
//! with its `reason`), `messageExpression` words the message when it
//! evaluates to a one-line string, and a rule without a message says
//! `failed rule: <rule>`.
//!
//! Transition rules (those using `oldSelf`) only run on an update, against
//! the stored object. A file has no previous version, so they are skipped,
//! as the API server skips them on a create.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use cel::extractors::This;
use cel::{Context, Env, ExecutionError, Program};
use serde_json::Value;

use super::schema::{RuleStats, Schema};

/// One compiled rule.
#[derive(Debug)]
pub(crate) struct CelRule {
    pub rule: String,
    program: Option<Program>,
    message: Option<String>,
    message_expression: Option<Program>,
    pub field_path: Option<String>,
    pub reason: Option<String>,
    /// Uses `oldSelf`: runs only on updates (see the module doc).
    pub transition: bool,
}

/// The outcome of one rule on one value.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    Holds,
    /// Does not hold: the message to report.
    Fails(String),
    /// The evaluation failed (`no such key`, ...): reported as the API
    /// server reports it.
    Error(String),
    /// Not evaluated: it did not compile, calls a function this library
    /// does not have, or is a transition rule.
    Skipped,
}

fn env() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // The Kubernetes CEL environment has the strings and lists
        // extensions (`split`, `substring`, `join`, `indexOf`, ...).
        let _ = env.add_extension(cel::extensions::strings);
        let _ = env.add_extension(cel::extensions::lists);
        Arc::new(env)
    })
}

impl CelRule {
    pub fn compile(v: &Value, stats: &mut RuleStats) -> CelRule {
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let rule = text("rule").unwrap_or_default();
        let program = match env().compile(&rule) {
            Ok(p) => Some(p),
            Err(e) => {
                stats.failed.push((rule.clone(), e.to_string()));
                None
            }
        };
        let transition = program
            .as_ref()
            .is_some_and(|p| p.references().has_variable("oldSelf"));
        if transition {
            stats.transition += 1;
        } else if program.is_some() {
            stats.compiled += 1;
        }
        let message_expression = text("messageExpression").and_then(|m| env().compile(&m).ok());
        CelRule {
            rule,
            program,
            message: text("message"),
            message_expression,
            field_path: text("fieldPath"),
            reason: text("reason"),
            transition,
        }
    }

    /// The message of a failure: the rule's `message`, else `failed rule:
    /// <rule>`.
    fn message(&self) -> String {
        match self.message.as_deref().map(str::trim) {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => format!("failed rule: {}", self.rule.trim()),
        }
    }

    /// What an evaluation error names the rule by: its message, else the rule.
    fn name(&self) -> String {
        match self.message.as_deref().map(str::trim) {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => self.rule.trim().to_string(),
        }
    }

    /// Evaluate with `self` bound in `scope`.
    pub fn evaluate(&self, scope: &Context<'_, '_>) -> Verdict {
        let Some(program) = &self.program else {
            return Verdict::Skipped;
        };
        if self.transition {
            return Verdict::Skipped;
        }
        match program.execute(scope) {
            Ok(cel::Value::Bool(true)) => Verdict::Holds,
            Ok(cel::Value::Bool(false)) => Verdict::Fails(self.failure_message(scope)),
            Ok(other) => Verdict::Error(format!(
                "rule evaluated to {other:?}, not a bool, evaluating rule: {}",
                self.name()
            )),
            Err(ExecutionError::UndeclaredReference(name))
                if name.as_str() != "self" && name.as_str() != "oldSelf" =>
            {
                note_not_run(
                    &self.rule,
                    &format!("calls {name}, which sluice's CEL library does not have"),
                );
                Verdict::Skipped
            }
            Err(e) => Verdict::Error(format!(
                "{} evaluating rule: {}",
                lower_first(&e.to_string()),
                self.name()
            )),
        }
    }

    fn failure_message(&self, scope: &Context<'_, '_>) -> String {
        if let Some(m) = &self.message_expression
            && let Ok(cel::Value::String(s)) = m.execute(scope)
        {
            let s = s.trim();
            if !s.is_empty() && !s.contains('\n') && s.len() <= 5 * 1024 {
                return s.to_string();
            }
        }
        self.message()
    }
}

/// Rules that could not run because they call a function this library
/// lacks: `(rule, why)`, for `check` to list. Process-wide: rules are
/// compiled once per set of CRDs, and which functions are missing does not
/// depend on the object.
static NOT_RUN: std::sync::Mutex<std::collections::BTreeSet<(String, String)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn note_not_run(rule: &str, why: &str) {
    if let Ok(mut set) = NOT_RUN.lock() {
        set.insert((rule.to_string(), why.to_string()));
    }
}

/// The rules met so far that could not run, and why.
pub fn rules_not_run() -> Vec<(String, String)> {
    NOT_RUN
        .lock()
        .map(|set| set.iter().cloned().collect())
        .unwrap_or_default()
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

/// A context with the Kubernetes CEL library's functions; bind `self` in
/// an inner scope per node.
pub(crate) fn context() -> Context<'static, 'static> {
    let mut ctx = Context::with_env(Arc::clone(env()));
    // `isIP`, `isCIDR`, `isURL` (the ip, cidr and url libraries' checks).
    let _ = ctx.add_function("isIP", |s: Arc<String>| s.parse::<IpAddr>().is_ok());
    let _ = ctx.add_function("isCIDR", |s: Arc<String>| is_cidr(&s));
    let _ = ctx.add_function("isURL", |s: Arc<String>| is_url(&s));
    // The lists library: `isSorted()`, `sum()`.
    let _ = ctx.add_function("isSorted", |This(list): This<Arc<Vec<cel::Value>>>| {
        list.windows(2).all(|w| {
            w[0].partial_cmp(&w[1])
                .is_some_and(|o| o != std::cmp::Ordering::Greater)
        })
    });
    let _ = ctx.add_function(
        "sum",
        |This(list): This<Arc<Vec<cel::Value>>>| -> cel::Value {
            let ints: Option<i64> = list.iter().try_fold(0i64, |acc, v| match v {
                cel::Value::Int(i) => acc.checked_add(*i),
                _ => None,
            });
            match ints {
                Some(total) => cel::Value::Int(total),
                None => cel::Value::Float(
                    list.iter()
                        .map(|v| match v {
                            cel::Value::Int(i) => *i as f64,
                            cel::Value::UInt(u) => *u as f64,
                            cel::Value::Float(f) => *f,
                            _ => 0.0,
                        })
                        .sum(),
                ),
            }
        },
    );
    // The format library: `format.dns1123Label().validate(s)` is null when
    // `s` has the format, else the list of what is wrong.
    for name in FORMATS {
        let _ = ctx.add_function(&format!("format.{name}"), move || {
            cel::Value::String(Arc::new((*name).to_string()))
        });
    }
    let _ = ctx.add_function(
        "validate",
        |This(format): This<Arc<String>>, s: Arc<String>| -> cel::Value {
            match format_errors(&format, &s) {
                None => cel::Value::Null,
                Some(errors) => cel::Value::List(Arc::new(
                    errors
                        .into_iter()
                        .map(|e| cel::Value::String(Arc::new(e)))
                        .collect(),
                )),
            }
        },
    );
    ctx
}

const FORMATS: &[&str] = &[
    "dns1123Label",
    "dns1123Subdomain",
    "dns1035Label",
    "qualifiedName",
    "labelValue",
    "uuid",
    "byte",
    "date",
    "datetime",
];

fn is_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => bits <= 32,
        Ok(IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

/// Go's `url.ParseRequestURI` acceptance: an absolute URL (`scheme:...`)
/// or an absolute path.
fn is_url(s: &str) -> bool {
    if s.starts_with('/') {
        return !s.contains(char::is_whitespace);
    }
    match s.split_once(':') {
        Some((scheme, rest)) => {
            let mut c = scheme.chars();
            c.next().is_some_and(|f| f.is_ascii_alphabetic())
                && c.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                && !rest.is_empty()
                && !s.contains(char::is_whitespace)
        }
        None => false,
    }
}

fn dns_label(s: &str, first_alpha: bool, max: usize) -> Option<Vec<String>> {
    let ok = !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
        && (!first_alpha || s.starts_with(|c: char| c.is_ascii_lowercase()));
    (!ok).then(|| {
        vec![format!(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', \
             and must start and end with an alphanumeric character (at most {max} characters)"
        )]
    })
}

/// `None` when `s` has the named format, else what is wrong.
fn format_errors(format: &str, s: &str) -> Option<Vec<String>> {
    match format {
        "dns1123Label" => dns_label(s, false, 63),
        "dns1035Label" => dns_label(s, true, 63),
        "dns1123Subdomain" => {
            let ok = !s.is_empty()
                && s.len() <= 253
                && s.split('.').all(|l| dns_label(l, false, 63).is_none());
            (!ok).then(|| vec!["a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".to_string()])
        }
        "qualifiedName" | "labelValue" => {
            let (prefix, name) = match (format, s.split_once('/')) {
                ("qualifiedName", Some((p, n))) => (Some(p), n),
                _ => (None, s),
            };
            let name_ok = (format == "labelValue" && name.is_empty())
                || (!name.is_empty()
                    && name.len() <= 63
                    && name.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && name.ends_with(|c: char| c.is_ascii_alphanumeric())
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
            let prefix_ok = prefix.is_none_or(|p| format_errors("dns1123Subdomain", p).is_none());
            (!(name_ok && prefix_ok)).then(|| {
                vec![
                    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
                        .to_string(),
                ]
            })
        }
        "uuid" => {
            let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
            let parts: Vec<&str> = s.split('-').collect();
            let ok = parts.len() == 5 && parts.iter().zip([8, 4, 4, 4, 12]).all(|(p, n)| hex(p, n));
            (!ok).then(|| vec!["does not match the UUID format".to_string()])
        }
        "byte" => {
            let body = s.trim_end_matches('=');
            let ok = s.len().is_multiple_of(4)
                && s.len() - body.len() <= 2
                && body
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/');
            (!ok).then(|| vec!["invalid base64".to_string()])
        }
        "date" => {
            let ok = s.parse::<k8s_openapi::jiff::civil::Date>().is_ok();
            (!ok).then(|| vec!["invalid date".to_string()])
        }
        "datetime" => {
            let ok = s.parse::<k8s_openapi::jiff::Timestamp>().is_ok();
            (!ok).then(|| vec!["invalid datetime".to_string()])
        }
        _ => None,
    }
}

/// CEL's reserved words: a property named so is `__word__` in a rule.
const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// A property name as a rule spells it, or `None` when CEL cannot (the
/// property is then invisible to rules, as in the API server).
pub(crate) fn escape(name: &str) -> Option<String> {
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let escaped = name
        .replace("__", "__underscores__")
        .replace('.', "__dot__")
        .replace('-', "__dash__")
        .replace('/', "__slash__");
    escaped
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')
        .then_some(escaped)
}

/// A JSON value as the CEL value a rule sees at a node of `schema`:
/// integers stay integers, `number` fields are doubles, object properties
/// are escaped, map keys are not. At the root only `metadata.name` and
/// `metadata.generateName` are visible.
pub(crate) fn to_cel(value: &Value, schema: &Schema, root: bool) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => {
            if schema.ty.as_deref() == Some("number") {
                cel::Value::Float(n.as_f64().unwrap_or(0.0))
            } else if let Some(i) = n.as_i64() {
                cel::Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                cel::Value::UInt(u)
            } else {
                cel::Value::Float(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => {
            let empty = Schema::default();
            let item_schema = schema.items.as_deref().unwrap_or(&empty);
            cel::Value::List(Arc::new(
                items
                    .iter()
                    .map(|v| to_cel(v, item_schema, false))
                    .collect(),
            ))
        }
        Value::Object(map) => {
            let mut out: std::collections::HashMap<String, cel::Value> =
                std::collections::HashMap::new();
            for (k, v) in map {
                if root && k == "metadata" {
                    let mut meta = std::collections::HashMap::new();
                    for field in ["name", "generateName"] {
                        if let Some(Value::String(s)) = v.get(field) {
                            meta.insert(field.to_string(), cel::Value::String(Arc::new(s.clone())));
                        }
                    }
                    out.insert(k.clone(), meta.into());
                    continue;
                }
                if let Some(prop) = schema.properties.get(k) {
                    if let Some(name) = escape(k) {
                        out.insert(name, to_cel(v, prop, false));
                    }
                } else if let Some(additional) = &schema.additional {
                    out.insert(k.clone(), to_cel(v, additional, false));
                } else if schema.preserve_unknown || schema.properties.is_empty() {
                    out.insert(k.clone(), to_cel(v, &Schema::default(), false));
                }
            }
            out.into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(text: &str, message: Option<&str>) -> CelRule {
        let mut stats = RuleStats::default();
        let mut v = json!({"rule": text});
        if let Some(m) = message {
            v["message"] = json!(m);
        }
        CelRule::compile(&v, &mut stats)
    }

    fn run(r: &CelRule, value: Value) -> Verdict {
        let ctx = context();
        let mut scope = ctx.new_inner_scope();
        scope.add_variable_from_value("self", to_cel(&value, &Schema::default(), false));
        r.evaluate(&scope)
    }

    #[test]
    fn kubernetes_library_functions() {
        let r = rule("self.all(h, !isIP(h))", Some("no IPs"));
        assert_eq!(run(&r, json!(["a.com"])), Verdict::Holds);
        assert_eq!(
            run(&r, json!(["10.0.0.1"])),
            Verdict::Fails("no IPs".into())
        );
        let r = rule(
            "size(self) == 0 || format.dns1123Label().validate(self) == null",
            None,
        );
        assert_eq!(run(&r, json!("my-port")), Verdict::Holds);
        assert!(
            matches!(run(&r, json!("My_Port")), Verdict::Fails(m) if m.starts_with("failed rule: size(self)"))
        );
        let r = rule("isCIDR(self) && isURL('https://a.b/c')", None);
        assert_eq!(run(&r, json!("10.0.0.0/8")), Verdict::Holds);
        let r = rule("self.isSorted() && self.sum() == 6", None);
        assert_eq!(run(&r, json!([1, 2, 3])), Verdict::Holds);
        assert!(matches!(run(&r, json!([2, 1, 4])), Verdict::Fails(_)));
        let r = rule("duration(self) <= duration('1h')", None);
        assert_eq!(
            run(&r, json!("90m")),
            Verdict::Fails("failed rule: duration(self) <= duration('1h')".into())
        );
    }

    #[test]
    fn errors_and_transition_rules() {
        let r = rule("self.missing == 'x'", Some("needs missing"));
        assert!(
            matches!(run(&r, json!({})), Verdict::Error(e) if e.ends_with("evaluating rule: needs missing"))
        );
        let r = rule("self == oldSelf", Some("immutable"));
        assert!(r.transition);
        assert_eq!(run(&r, json!(1)), Verdict::Skipped);
    }

    #[test]
    fn property_names_are_escaped_as_the_api_server_escapes_them() {
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(
            escape("a.b-c/d").as_deref(),
            Some("a__dot__b__dash__c__slash__d")
        );
        assert_eq!(escape("x__y").as_deref(), Some("x__underscores__y"));
        assert_eq!(escape("9lives"), None);
        assert_eq!(escape("a b"), None);
    }
}
