//! `sluice check -f PATH...`: load manifests exactly as `serve` would,
//! translate them, and print what sluice would do with them — every
//! object's conditions, every rule's backend shares as percentages, the
//! traps worth a warning and the manifest errors — without binding anything.
//!
//! Rules a RolloutPolicy governs show their spec shares and the shares
//! `sluice serve` would serve now side by side: from the rollout state it
//! recorded (`--state-dir`, by default the one `serve` uses), run through
//! the same state machine; without recorded state, a gateway starting on
//! these manifests serves the spec shares.
//!
//! Exit codes: 0 when every object is accepted and every reference
//! resolved; 1 when something is refused, not accepted or not resolved;
//! 2 when the input cannot be read at all (missing path, unreadable file,
//! a file that is not YAML/JSON).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::metrics::BackendTotals;
use crate::resources::{Generations, LoadedObject, Object, Snapshot, parse_manifests};
use crate::rollout::{FileStore, PolicyKey, RolloutReport, Rollouts};
use crate::source::files::read_all;
use crate::source::{ConfigError, FileSet};
use crate::translate::{
    BackendOutcome, BackendSummary, ConditionType, ObjectStatus, RuleSummary, TranslateOptions,
    Translation, rollout_inputs, translate_served,
};

/// Everything is accepted and resolved.
pub const EXIT_OK: i32 = 0;
/// Something is refused, not accepted or not resolved.
pub const EXIT_PROBLEMS: i32 = 1;
/// The input could not be read.
pub const EXIT_UNREADABLE: i32 = 2;

/// Manifests loaded and translated the way `serve` does it.
#[derive(Debug)]
pub struct Checked {
    pub translation: Translation,
    /// Number of objects loaded.
    pub objects: usize,
    /// Paths, files or documents that could not be read or parsed at all.
    pub unreadable: Vec<ConfigError>,
    /// Objects refused by validation, duplicates.
    pub refused: Vec<ConfigError>,
    /// Documents of kinds sluice does not read (not an error).
    pub ignored: Vec<String>,
    /// Every rollout, as `sluice serve` would run it now.
    pub rollouts: RolloutReport,
    /// Where the served shares come from (printed when a RolloutPolicy
    /// governs a rule).
    pub served_from: String,
}

/// Read, parse, validate and translate the manifests under `paths`, with
/// the rollouts recorded in `state_dir` (when given and present).
pub fn load(paths: &[PathBuf], state_dir: Option<&Path>) -> Checked {
    let listing = read_all(paths);
    let mut unreadable = listing.problems;
    let mut ignored = Vec::new();
    for read in &listing.reads {
        match &read.content {
            Err(message) => unreadable.push(ConfigError {
                file: read.file.clone(),
                line: None,
                object: None,
                field: None,
                message: format!("cannot read file: {message}"),
            }),
            Ok(text) => {
                // Errors tied to neither an object nor a field mean the text
                // itself is not a manifest stream (YAML/JSON syntax): the
                // file is unreadable.
                let parsed = parse_manifests(text, &read.file);
                ignored.extend(parsed.ignored);
                unreadable.extend(
                    parsed
                        .errors
                        .iter()
                        .filter(|e| e.object.is_none() && e.field.is_none())
                        .map(ConfigError::from),
                );
            }
        }
    }

    let mut files = FileSet::new();
    files.update(listing.reads);
    let (loaded, errors) = files.merged();
    let refused = errors
        .into_iter()
        .filter(|e| !unreadable.contains(e))
        .collect();

    let mut objects: Vec<Object> = loaded.into_iter().map(|l: LoadedObject| l.object).collect();
    Generations::default().assign(&mut objects, k8s_openapi::jiff::Timestamp::now());
    let count = objects.len();
    let snapshot = Snapshot::from_objects(objects);
    let (recorded, served_from) = match state_dir.map(|d| (d, FileStore::read(d))) {
        None => (
            Vec::new(),
            "no state directory: a gateway starting on these manifests serves the spec shares"
                .to_string(),
        ),
        Some((dir, Ok(None))) => (
            Vec::new(),
            format!(
                "no rollout state in {}: a gateway starting on these manifests serves the spec shares",
                dir.display()
            ),
        ),
        Some((dir, Ok(Some(records)))) => (
            records,
            format!(
                "the rollout state in {}, as `sluice serve --state-dir {}` would serve it now",
                FileStore::new(dir).path().display(),
                dir.display()
            ),
        ),
        Some((dir, Err(e))) => {
            unreadable.push(ConfigError {
                file: FileStore::new(dir).path().display().to_string(),
                line: None,
                object: None,
                field: None,
                message: e.clone(),
            });
            (Vec::new(), format!("{e}: the spec shares are shown"))
        }
    };
    // The state machine as `serve` runs it at start-up: no traffic counted.
    let mut rollouts = Rollouts::restore(recorded);
    let evaluation = rollouts.evaluate(
        &rollout_inputs(&snapshot, &[]),
        &|_, _| BackendTotals::default(),
        k8s_openapi::jiff::Timestamp::now(),
    );
    let translation = translate_served(
        &snapshot,
        &TranslateOptions {
            default_bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        },
        &evaluation.served,
    );
    Checked {
        translation,
        objects: count,
        unreadable,
        refused,
        ignored,
        rollouts: RolloutReport::new(&rollouts, None),
        served_from,
    }
}

/// Run `sluice check` on `paths` (served shares from the rollout state in
/// `state_dir`), writing the report to `out`. Returns the process exit
/// code.
pub fn run(paths: &[PathBuf], state_dir: Option<&Path>, out: &mut impl Write) -> i32 {
    let checked = load(paths, state_dir);
    match report(&checked, out) {
        Ok(code) => code,
        // The report could not be written (closed pipe): nothing sensible
        // to print either.
        Err(_) => EXIT_UNREADABLE,
    }
}

/// Print the report for already loaded manifests; returns the exit code.
pub fn report(checked: &Checked, out: &mut impl Write) -> std::io::Result<i32> {
    let translation = &checked.translation;
    let mut problems: Vec<String> = Vec::new();

    let mut rules_by_route: BTreeMap<(String, String), Vec<&RuleSummary>> = BTreeMap::new();
    for rule in &translation.rules {
        rules_by_route
            .entry((rule.kind.clone(), rule.route.clone()))
            .or_default()
            .push(rule);
    }

    if translation.rules.iter().any(|r| r.rollout.is_some()) {
        writeln!(out, "served shares: {}", checked.served_from)?;
        writeln!(out)?;
    }
    for object in &translation.status.objects {
        let mut object = object.clone();
        if object.kind == "RolloutPolicy" {
            let key = PolicyKey {
                namespace: object.metadata.namespace.clone().unwrap_or_default(),
                name: object.metadata.name.clone(),
            };
            checked.rollouts.complete(&key, &mut object.status);
        }
        let object = &object;
        write_object(object, out, &mut problems)?;
        let key = format!(
            "{}/{}",
            object.metadata.namespace.as_deref().unwrap_or("default"),
            object.metadata.name
        );
        if let Some(rules) = rules_by_route.remove(&(object.kind.clone(), key)) {
            for rule in rules {
                write_rule(rule, out, &mut problems)?;
            }
        }
    }
    // Rules of routes without a status entry (should not happen, but the
    // shares are still worth showing).
    for rules in rules_by_route.values() {
        for rule in rules {
            writeln!(out, "{} {}", rule.kind, rule.route)?;
            write_rule(rule, out, &mut problems)?;
        }
    }

    if !translation.warnings.is_empty() {
        writeln!(out)?;
        writeln!(out, "warnings:")?;
        for warning in &translation.warnings {
            writeln!(out, "  {warning}")?;
        }
    }
    if !checked.ignored.is_empty() {
        writeln!(out)?;
        writeln!(out, "ignored (kinds sluice does not read):")?;
        for ignored in &checked.ignored {
            writeln!(out, "  {ignored}")?;
        }
    }
    if !checked.refused.is_empty() || !checked.unreadable.is_empty() {
        writeln!(out)?;
        writeln!(out, "errors:")?;
        for error in checked.unreadable.iter().chain(&checked.refused) {
            writeln!(out, "  {error}")?;
        }
    }

    writeln!(out)?;
    let code = if !checked.unreadable.is_empty() {
        writeln!(
            out,
            "FAIL: {} input(s) could not be read (see errors above); \
             what they hold was not checked",
            checked.unreadable.len()
        )?;
        EXIT_UNREADABLE
    } else if checked.objects == 0 {
        writeln!(out, "FAIL: no objects found in the given paths")?;
        EXIT_PROBLEMS
    } else if !problems.is_empty() || !checked.refused.is_empty() {
        let refused = checked.refused.iter().map(ToString::to_string);
        let all: Vec<String> = refused.chain(problems).collect();
        writeln!(out, "FAIL: {} problem(s):", all.len())?;
        for problem in &all {
            writeln!(out, "  {problem}")?;
        }
        EXIT_PROBLEMS
    } else {
        writeln!(
            out,
            "OK: {} object(s), everything accepted and resolved",
            checked.objects
        )?;
        EXIT_OK
    };
    Ok(code)
}

fn write_object(
    object: &ObjectStatus,
    out: &mut impl Write,
    problems: &mut Vec<String>,
) -> std::io::Result<()> {
    let namespace = object.metadata.namespace.as_deref();
    let name = match namespace {
        Some(namespace) => format!("{} {namespace}/{}", object.kind, object.metadata.name),
        None => format!("{} {}", object.kind, object.metadata.name),
    };
    writeln!(out, "{name} (generation {})", object.metadata.generation)?;
    let status = &object.status;
    write_conditions(status.get("conditions"), "  ", &name, out, problems)?;
    for listener in array(status.get("listeners")) {
        let listener_name = listener.get("name").and_then(Value::as_str).unwrap_or("?");
        let attached = listener
            .get("attachedRoutes")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        writeln!(
            out,
            "  listener {listener_name}: {attached} attached route(s)"
        )?;
        let context = format!("{name} listener {listener_name}");
        write_conditions(listener.get("conditions"), "    ", &context, out, problems)?;
    }
    for parent in array(status.get("parents")) {
        let parent_name = describe_parent_ref(parent.get("parentRef"), namespace);
        writeln!(out, "  parent {parent_name}:")?;
        let context = format!("{name} parent {parent_name}");
        write_conditions(parent.get("conditions"), "    ", &context, out, problems)?;
    }
    for ancestor in array(status.get("ancestors")) {
        let ancestor_name = describe_parent_ref(ancestor.get("ancestorRef"), namespace);
        writeln!(out, "  ancestor {ancestor_name}:")?;
        let context = format!("{name} ancestor {ancestor_name}");
        write_conditions(ancestor.get("conditions"), "    ", &context, out, problems)?;
    }
    for rollout in array(status.get("rollouts")) {
        let field = |key: &str| rollout.get(key).and_then(Value::as_str).unwrap_or("");
        let step = match field("step") {
            "" => String::new(),
            step => format!(" at step {step}"),
        };
        writeln!(
            out,
            "  rollout HTTPRoute {}/{} rule {}: {}{step}: {}",
            namespace.unwrap_or("default"),
            field("route"),
            rollout.get("rule").and_then(Value::as_u64).unwrap_or(0),
            field("phase"),
            field("message"),
        )?;
    }
    Ok(())
}

fn array(value: Option<&Value>) -> &[Value] {
    value.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn write_conditions(
    conditions: Option<&Value>,
    indent: &str,
    context: &str,
    out: &mut impl Write,
    problems: &mut Vec<String>,
) -> std::io::Result<()> {
    for condition in array(conditions) {
        let field = |key: &str| condition.get(key).and_then(Value::as_str).unwrap_or("");
        let (kind, status, reason, message) = (
            field("type"),
            field("status"),
            field("reason"),
            field("message"),
        );
        let mut line = format!("{kind}={status} {reason}");
        if !message.is_empty() {
            line.push_str(": ");
            line.push_str(message);
        }
        if condition_is_problem(kind, status) {
            writeln!(out, "{indent}{line}   <-- problem")?;
            problems.push(format!("{context}: {line}"));
        } else {
            writeln!(out, "{indent}{line}")?;
        }
    }
    Ok(())
}

/// Whether a condition says something is wrong. Most Gateway API
/// conditions are positive (`Accepted`, `ResolvedRefs`, `Programmed`: True
/// is good); a few are negative (`Conflicted`, `PartiallyInvalid`,
/// `OverlappingTLSConfig`: True is bad). Unknown types are not judged.
fn condition_is_problem(kind: &str, status: &str) -> bool {
    use ConditionType::*;
    match ConditionType::parse(kind) {
        Some(Accepted | ResolvedRefs | Programmed) => status != "True",
        Some(Conflicted | PartiallyInvalid | OverlappingTLSConfig) => status == "True",
        Some(InsecureFrontendValidationMode) | None => false,
    }
}

fn describe_parent_ref(parent_ref: Option<&Value>, route_namespace: Option<&str>) -> String {
    let Some(parent_ref) = parent_ref else {
        return "?".to_owned();
    };
    let field = |key: &str| parent_ref.get(key).and_then(Value::as_str);
    let kind = field("kind").unwrap_or("Gateway");
    let namespace = field("namespace").or(route_namespace).unwrap_or("default");
    let mut text = format!("{kind} {namespace}/{}", field("name").unwrap_or("?"));
    if let Some(section) = field("sectionName") {
        text.push_str(&format!(" section {section}"));
    }
    if let Some(port) = parent_ref.get("port").and_then(Value::as_i64) {
        text.push_str(&format!(" port {port}"));
    }
    text
}

fn write_rule(
    rule: &RuleSummary,
    out: &mut impl Write,
    problems: &mut Vec<String>,
) -> std::io::Result<()> {
    match &rule.rollout {
        None => writeln!(out, "  rule {}:", rule.rule)?,
        Some(r) => {
            let step = r
                .step
                .as_deref()
                .map(|s| format!(" at step {s}"))
                .unwrap_or_default();
            writeln!(
                out,
                "  rule {}: RolloutPolicy {}: {}{step}; spec and served shares:",
                rule.rule, r.policy, r.phase
            )?
        }
    }
    if rule.backends.is_empty() {
        writeln!(
            out,
            "    no backendRefs ({})",
            Failure::of(&rule.kind).no_backends
        )?;
        return Ok(());
    }
    let width = rule
        .backends
        .iter()
        .map(|b| b.name.len())
        .max()
        .unwrap_or(0);
    let weights: Vec<String> = rule
        .backends
        .iter()
        .map(|b| {
            if b.weight_omitted {
                format!("{} (omitted)", b.weight)
            } else {
                b.weight.to_string()
            }
        })
        .collect();
    let weight_width = weights.iter().map(String::len).max().unwrap_or(0);
    for (backend, weight) in rule.backends.iter().zip(&weights) {
        let (outcome, problem) = describe_outcome(&rule.kind, backend);
        let served = match (&rule.rollout, backend.served_percent) {
            (Some(_), Some(served)) => {
                let removed = if backend.removed_from_spec {
                    " (removed from the spec)"
                } else {
                    ""
                };
                format!("  served {:>8}{removed}", format_share(served))
            }
            _ => String::new(),
        };
        writeln!(
            out,
            "    {:<width$}  weight {:<weight_width$}  {:>8}{served}  {outcome}",
            backend.name,
            weight,
            format_share(backend.share_percent),
        )?;
        if problem {
            problems.push(format!(
                "{} {} rule {}: backend {}: {outcome}",
                rule.kind, rule.route, rule.rule, backend.name
            ));
        }
    }
    Ok(())
}

/// What a share the gateway cannot serve gets, by route kind: HTTP
/// statuses, gRPC's UNAVAILABLE (see `proxy::grpc`), or a closed TLS
/// connection.
struct Failure {
    unresolved: &'static str,
    no_endpoints: &'static str,
    no_backends: &'static str,
}

impl Failure {
    fn of(kind: &str) -> Failure {
        match kind {
            "GRPCRoute" => Failure {
                unresolved: "share gets UNAVAILABLE",
                no_endpoints: "share gets UNAVAILABLE",
                no_backends: "answers UNAVAILABLE",
            },
            "TLSRoute" => Failure {
                unresolved: "share of connections closed",
                no_endpoints: "share of connections closed",
                no_backends: "connections closed",
            },
            _ => Failure {
                unresolved: "share gets 500",
                no_endpoints: "share gets 503",
                no_backends: "answers 500",
            },
        }
    }
}

/// What a backend of a `kind` route does with its share, and whether that
/// is a problem for the exit code (an unresolved reference is; an empty
/// Service is only a warning, as its route is still accepted and
/// resolved).
fn describe_outcome(kind: &str, backend: &BackendSummary) -> (String, bool) {
    let failure = Failure::of(kind);
    match &backend.outcome {
        BackendOutcome::Serves { ready_endpoints } => {
            (format!("{ready_endpoints} ready endpoint(s)"), false)
        }
        BackendOutcome::NoReadyEndpoints => (
            format!("no ready endpoints: {}", failure.no_endpoints),
            false,
        ),
        BackendOutcome::Unresolved { reason, message } => (
            format!("unresolved ({reason}: {message}): {}", failure.unresolved),
            true,
        ),
    }
}

/// A share as a short percentage: `99.5%`, `0.5%`, `100%`, `33.33%`. A
/// non-zero share never prints as `0%`: tiny ones get more digits
/// (1 of 1,000,001 prints `0.0001%`).
pub fn format_share(percent: f64) -> String {
    if !percent.is_finite() {
        return "?%".to_owned();
    }
    let mut text = format!("{percent:.2}");
    for decimals in 3..=6 {
        if percent == 0.0 || !text.trim_end_matches(['0', '.']).is_empty() {
            break;
        }
        text = format!("{percent:.decimals$}");
    }
    if text.contains('.') {
        text = text.trim_end_matches('0').trim_end_matches('.').to_owned();
    }
    format!("{text}%")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_print_short_and_never_round_to_zero() {
        assert_eq!(format_share(99.5), "99.5%");
        assert_eq!(format_share(0.5), "0.5%");
        assert_eq!(format_share(100.0), "100%");
        assert_eq!(format_share(0.0), "0%");
        assert_eq!(format_share(100.0 / 3.0), "33.33%");
        assert_eq!(format_share(50.0), "50%");
        assert_eq!(format_share(100.0 / 1_000_001.0), "0.0001%");
        assert_eq!(format_share(10.0), "10%");
    }

    #[test]
    fn negative_polarity_conditions_are_problems_when_true() {
        assert!(!condition_is_problem("Accepted", "True"));
        assert!(condition_is_problem("Accepted", "False"));
        assert!(condition_is_problem("ResolvedRefs", "Unknown"));
        assert!(condition_is_problem("Conflicted", "True"));
        assert!(!condition_is_problem("Conflicted", "False"));
        assert!(!condition_is_problem("SomethingNew", "False"));
    }

    #[test]
    fn what_a_failed_share_gets_depends_on_the_route_kind() {
        let backend = |outcome| BackendSummary {
            name: "default/web:80".into(),
            weight: 1,
            weight_omitted: false,
            share_percent: 100.0,
            outcome,
            key: crate::rollout::BackendKey::service("default", "web", Some(80)),
            served_weight: None,
            served_percent: None,
            removed_from_spec: false,
        };
        let unresolved = backend(BackendOutcome::Unresolved {
            reason: "BackendNotFound".into(),
            message: "not found".into(),
        });
        let empty = backend(BackendOutcome::NoReadyEndpoints);
        for (kind, unresolved_gets, empty_gets) in [
            ("HTTPRoute", "share gets 500", "share gets 503"),
            (
                "GRPCRoute",
                "share gets UNAVAILABLE",
                "share gets UNAVAILABLE",
            ),
            (
                "TLSRoute",
                "share of connections closed",
                "share of connections closed",
            ),
        ] {
            let (text, problem) = describe_outcome(kind, &unresolved);
            assert!(problem && text.ends_with(unresolved_gets), "{kind}: {text}");
            let (text, problem) = describe_outcome(kind, &empty);
            assert!(!problem && text.ends_with(empty_gets), "{kind}: {text}");
        }
    }

    #[test]
    fn parent_refs_default_to_the_route_namespace() {
        let parent = serde_json::json!({"name": "demo", "sectionName": "http"});
        assert_eq!(
            describe_parent_ref(Some(&parent), Some("shop")),
            "Gateway shop/demo section http"
        );
        let parent = serde_json::json!({"name": "gw", "namespace": "infra", "port": 80});
        assert_eq!(
            describe_parent_ref(Some(&parent), Some("shop")),
            "Gateway infra/gw port 80"
        );
    }
}
