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
//! With `--ingress-class NAME --ingress-gateway NS/NAME` (the flags
//! `serve` takes), the Ingresses of that class among the manifests are
//! converted as `serve` converts them (`sluice convert ingress-nginx
//! --gateway NS/NAME`): the converted routes are checked with the rest,
//! the conversion report is printed, one line per annotation per object,
//! and its inexact lines are problems, as they are configuration errors
//! in `serve` (`/errors`).
//!
//! Exit codes: 0 when every object is accepted and every reference
//! resolved; 1 when something is refused, not accepted or not resolved;
//! 2 when the input cannot be read at all (missing path, unreadable file,
//! a file that is not YAML/JSON).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::metrics::BackendTotals;
use crate::resources::crd::Crds;
use crate::resources::read_documents;
use crate::resources::{Generations, Snapshot};
use crate::rollout::gates::plan;
use crate::rollout::{FileStore, PolicyKey, RolloutReport, Rollouts, StateRead};
use crate::source::files::{IngressServing, converted_ingresses, ingress_input, read_all};
use crate::source::{ConfigError, FileSet};
use crate::translate::{
    BackendOutcome, BackendSummary, ConditionType, ObjectStatus, RuleSummary, TranslateOptions,
    Translation, rollout_inputs, translate_served,
};
use crate::yaml::{Document, Lines};

/// Everything is accepted and resolved.
pub const EXIT_OK: i32 = 0;
/// Something is refused, not accepted or not resolved.
pub const EXIT_PROBLEMS: i32 = 1;
/// The input could not be read.
pub const EXIT_UNREADABLE: i32 = 2;

/// How `check` prints its findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Output {
    /// Every object's conditions and every rule's shares, then one line
    /// per problem (`file:line: Kind ns/name: field: message`).
    #[default]
    Text,
    /// One JSON document: problems, warnings, status and rule shares.
    Json,
}

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
    /// `(Kind namespace/name, rule, backendRef)` of the backendRefs whose
    /// weight the manifest omitted (the CRD default made it 1).
    pub omitted_weights: BTreeSet<(String, usize, usize)>,
    /// Where each object loaded came from: `Kind ns/name` -> (file, line).
    pub locations: BTreeMap<String, (String, usize)>,
    /// The line of each field of an object's document (`Kind ns/name` ->
    /// lines), so that a problem found after loading (an unresolved
    /// backendRef) is placed at its field, as validation errors are.
    pub field_lines: BTreeMap<String, Lines>,
    /// The CRDs objects were validated with (`--crds` and CRD documents
    /// among the manifests).
    pub crds: Arc<Crds>,
    /// Every rollout, as `sluice serve` would run it now.
    pub rollouts: RolloutReport,
    /// Where the served shares come from (printed when a RolloutPolicy
    /// governs a rule).
    pub served_from: String,
    /// `--ingress-class`: the class, the Gateway and the conversion's
    /// report.
    pub ingress_conversion: Option<(IngressServing, crate::ingress_nginx::Report)>,
    /// Each valid RolloutPolicy's power (`ns/name` -> its confidence and
    /// one line per gate): what its gates catch, after how much traffic.
    pub power: BTreeMap<String, (String, Vec<String>)>,
}

/// Read, parse, validate (by the CRDs in `crd_paths` and among the
/// manifests, else by hand) and translate the manifests under `paths`,
/// with the rollouts recorded in `state_dir` (when given and present).
pub fn load(paths: &[PathBuf], crd_paths: &[PathBuf], state_dir: Option<&Path>) -> Checked {
    load_with_ingresses(paths, crd_paths, state_dir, None)
}

/// [`load`], and the Ingresses of `ingresses`' class converted and
/// checked with the rest, as `serve --ingress-class` serves them.
pub fn load_with_ingresses(
    paths: &[PathBuf],
    crd_paths: &[PathBuf],
    state_dir: Option<&Path>,
    ingresses: Option<&IngressServing>,
) -> Checked {
    let listing = read_all(paths);
    let crd_listing = read_all(crd_paths);
    let mut files = FileSet::new();
    files.update_crd_files(crd_listing.reads);
    let texts: BTreeMap<String, String> = listing
        .reads
        .iter()
        .filter_map(|r| Some((r.file.clone(), r.content.as_ref().ok()?.clone())))
        .collect();
    let ingress_read = ingresses.map(|_| ingress_input(&listing.reads));
    files.update(listing.reads);
    let (mut loaded, mut errors) = files.merged();
    let mut ingress_conversion = None;
    if let (Some(serving), Some((input, read_errors))) = (ingresses, ingress_read) {
        let (objects, conversion_errors, report) =
            converted_ingresses(serving, &input, &files.crds());
        loaded.extend(objects);
        // An Ingress that does not fit its schema cannot be read (object
        // and field unknown: below, unreadable), as for `convert`.
        errors.extend(read_errors);
        errors.extend(conversion_errors);
        ingress_conversion = Some((serving.clone(), report));
    }
    // Errors tied to neither an object nor a field mean the text itself is
    // not a manifest stream (YAML/JSON syntax, unreadable): the file is
    // unreadable.
    let (mut unreadable, refused): (Vec<ConfigError>, Vec<ConfigError>) = errors
        .into_iter()
        .partition(|e| e.object.is_none() && e.field.is_none());
    unreadable.splice(
        0..0,
        listing.problems.into_iter().chain(crd_listing.problems),
    );

    let locations = loaded
        .iter()
        .map(|l| (l.object.id(), (l.file.clone(), l.line)))
        .collect();
    let field_lines = field_lines(&texts, &locations);
    let count = loaded.len();
    let snapshot = Snapshot::from_loaded(loaded, |objects| {
        Generations::default().assign(objects, k8s_openapi::jiff::Timestamp::now());
    });
    let configuration = crate::rollout::configuration_of(paths);
    let state_file = |dir: &Path| FileStore::new(dir, Vec::new()).path().display().to_string();
    let (recorded, served_from) = match state_dir.map(|d| (d, FileStore::read(d, &configuration))) {
        None => (
            Vec::new(),
            "no state directory: a gateway starting on these manifests serves the spec shares"
                .to_string(),
        ),
        Some((dir, Ok(StateRead::Absent))) => (
            Vec::new(),
            format!(
                "no rollout state in {}: a gateway starting on these manifests serves the spec shares",
                dir.display()
            ),
        ),
        Some((dir, Ok(StateRead::OtherConfiguration(_)))) => (
            Vec::new(),
            format!(
                "the rollout state in {} was recorded for other manifests: a gateway starting \
                 on these sets it aside and serves the spec shares",
                state_file(dir)
            ),
        ),
        Some((dir, Ok(StateRead::Records(records)))) => (
            records,
            format!(
                "the rollout state in {}, as `sluice serve --state-dir {}` would serve it now",
                state_file(dir),
                dir.display()
            ),
        ),
        Some((dir, Err(e))) => {
            unreadable.push(ConfigError {
                file: state_file(dir),
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
    let power = snapshot
        .rollout_policies
        .iter()
        .filter_map(|policy| {
            let settings = policy.settings().ok()?;
            let key = format!(
                "{}/{}",
                policy.metadata.namespace.as_deref().unwrap_or("default"),
                policy.metadata.name.as_deref().unwrap_or_default()
            );
            let lines = plan(
                &settings.gates,
                settings.confidence,
                &settings.steps,
                settings.min_requests,
            );
            Some((key, (settings.confidence.0.to_string(), lines)))
        })
        .collect();
    Checked {
        power,
        ingress_conversion,
        translation,
        objects: count,
        unreadable,
        refused,
        ignored: files.ignored(),
        omitted_weights: snapshot.omitted_weights.clone(),
        locations,
        field_lines,
        crds: files.crds(),
        rollouts: RolloutReport::new(&rollouts, None),
        served_from,
    }
}

/// The lines of the document each object came from (`Kind ns/name` ->
/// lines), read again from the files' texts: only `check` wants them, so
/// the loader does not keep them for `serve`. An object whose document is
/// not found (an item of a `kind: List`) keeps its object's line.
fn field_lines(
    texts: &BTreeMap<String, String>,
    locations: &BTreeMap<String, (String, usize)>,
) -> BTreeMap<String, Lines> {
    let mut documents: BTreeMap<&str, Vec<Document>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for (id, (file, line)) in locations {
        let docs = documents.entry(file.as_str()).or_insert_with(|| {
            texts
                .get(file)
                .and_then(|text| read_documents(text, file).ok())
                .unwrap_or_default()
        });
        if let Some(doc) = docs.iter().find(|d| d.line == *line) {
            out.insert(id.clone(), doc.lines.clone());
        }
    }
    out
}

/// Run `sluice check` on `paths` (validated by the CRDs in `crd_paths`;
/// served shares from the rollout state in `state_dir`), writing the
/// report to `out`. Returns the process exit code.
pub fn run(
    paths: &[PathBuf],
    crd_paths: &[PathBuf],
    state_dir: Option<&Path>,
    output: Output,
    out: &mut impl Write,
) -> i32 {
    run_with_ingresses(paths, crd_paths, state_dir, None, output, out)
}

/// [`run`] with the Ingresses of a class converted and checked too
/// (`--ingress-class`, `--ingress-gateway`).
pub fn run_with_ingresses(
    paths: &[PathBuf],
    crd_paths: &[PathBuf],
    state_dir: Option<&Path>,
    ingresses: Option<&IngressServing>,
    output: Output,
    out: &mut impl Write,
) -> i32 {
    let checked = load_with_ingresses(paths, crd_paths, state_dir, ingresses);
    let written = match output {
        Output::Text => report(&checked, out),
        Output::Json => report_json(&checked, out),
    };
    match written {
        Ok(code) => code,
        // The report could not be written (closed pipe): nothing sensible
        // to print either.
        Err(_) => EXIT_UNREADABLE,
    }
}

/// What `check` found: the text report, the problems (one
/// `file:line: Kind ns/name: field: message` each) and the exit code.
struct Findings {
    text: Vec<u8>,
    problems: Vec<ConfigError>,
    code: i32,
}

fn findings(checked: &Checked) -> std::io::Result<Findings> {
    let translation = &checked.translation;
    let mut out = Vec::new();
    let mut problems = Problems {
        list: Vec::new(),
        locations: &checked.locations,
        field_lines: &checked.field_lines,
    };

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
        write_object(object, &mut out, &mut problems)?;
        let key = format!(
            "{}/{}",
            object.metadata.namespace.as_deref().unwrap_or("default"),
            object.metadata.name
        );
        if object.kind == "RolloutPolicy"
            && let Some((confidence, lines)) = checked.power.get(&key)
            && !lines.is_empty()
        {
            writeln!(
                out,
                "  power at {confidence} confidence (what each gate catches and after how much: on expected counts, about half of such canaries, and 99 in 100):"
            )?;
            for line in lines {
                writeln!(out, "    {line}")?;
            }
        }
        if let Some(rules) = rules_by_route.remove(&(object.kind.clone(), key)) {
            for rule in rules {
                write_rule(rule, &checked.omitted_weights, &mut out, &mut problems)?;
            }
        }
    }
    // Rules of routes without a status entry (should not happen, but the
    // shares are still worth showing).
    for rules in rules_by_route.values() {
        for rule in rules {
            writeln!(out, "{} {}", rule.kind, rule.route)?;
            write_rule(rule, &checked.omitted_weights, &mut out, &mut problems)?;
        }
    }

    if !translation.warnings.is_empty() {
        writeln!(out)?;
        writeln!(out, "warnings:")?;
        for warning in &translation.warnings {
            writeln!(out, "  {warning}")?;
        }
    }
    if let Some((serving, report)) = &checked.ingress_conversion {
        writeln!(out)?;
        writeln!(
            out,
            "ingress-nginx conversion (Ingresses of class {}, routes on Gateway {}/{}; inexact lines are problems):",
            serving.class, serving.gateway.0, serving.gateway.1
        )?;
        if report.lines.is_empty() {
            writeln!(out, "  no Ingress")?;
        }
        for line in &report.lines {
            writeln!(out, "  {line}")?;
        }
    }
    if !checked.ignored.is_empty() {
        writeln!(out)?;
        writeln!(out, "ignored (kinds sluice does not read):")?;
        for ignored in &checked.ignored {
            writeln!(out, "  {ignored}")?;
        }
    }
    if !checked.crds.is_empty() {
        let stats = checked.crds.stats();
        writeln!(out)?;
        writeln!(
            out,
            "validated by CRDs ({} CEL rules; {} transition rules need the stored object and are not run):",
            stats.compiled, stats.transition
        )?;
        for crd in checked.crds.describe() {
            writeln!(out, "  {crd}")?;
        }
        for (rule, error) in &stats.failed {
            writeln!(out, "  not evaluated (does not compile): {rule}: {error}")?;
        }
        for (rule, why) in crate::resources::crd::rules_not_run() {
            writeln!(out, "  not evaluated ({why}): {rule}")?;
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
    let mut all: Vec<ConfigError> = checked.refused.clone();
    all.extend(problems.list);
    let code = if !checked.unreadable.is_empty() {
        writeln!(
            out,
            "FAIL: {} input(s) could not be read (see errors above); \
             what they hold was not checked",
            checked.unreadable.len()
        )?;
        all.splice(0..0, checked.unreadable.iter().cloned());
        EXIT_UNREADABLE
    } else if checked.objects == 0 {
        writeln!(out, "FAIL: no objects found in the given paths")?;
        EXIT_PROBLEMS
    } else if !all.is_empty() {
        writeln!(out, "FAIL: {} problem(s):", all.len())?;
        for problem in &all {
            writeln!(out, "{problem}")?;
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
    Ok(Findings {
        text: out,
        problems: all,
        code,
    })
}

/// Print the report for already loaded manifests; returns the exit code.
pub fn report(checked: &Checked, out: &mut impl Write) -> std::io::Result<i32> {
    let f = findings(checked)?;
    out.write_all(&f.text)?;
    Ok(f.code)
}

/// The report as one JSON document; returns the exit code.
pub fn report_json(checked: &Checked, out: &mut impl Write) -> std::io::Result<i32> {
    let f = findings(checked)?;
    let stats = checked.crds.stats();
    let doc = serde_json::json!({
        "ok": f.code == EXIT_OK,
        "exitCode": f.code,
        "objects": checked.objects,
        "problems": f.problems,
        "warnings": checked.translation.warnings,
        "ignored": checked.ignored,
        "crds": {
            "kinds": checked.crds.describe(),
            "celRules": stats.compiled,
            "transitionRules": stats.transition,
            "notCompiled": stats.failed.iter().map(|(r, e)| serde_json::json!({"rule": r, "error": e})).collect::<Vec<_>>(),
            "notRun": crate::resources::crd::rules_not_run().iter().map(|(r, why)| serde_json::json!({"rule": r, "why": why})).collect::<Vec<_>>(),
        },
        "status": checked.translation.status.objects,
        "rules": checked.translation.rules.iter().map(|r| &**r).collect::<Vec<&crate::translate::RuleSummary>>(),
        "ingressConversion": checked.ingress_conversion.as_ref().map(|(_, report)| {
            report.lines.iter().map(|l| serde_json::json!({
                "object": l.object,
                "annotation": l.annotation,
                "verdict": l.verdict.to_string(),
                "exact": !l.verdict.is_inexact(),
            })).collect::<Vec<_>>()
        }),
    });
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(f.code)
}

/// The problems found in status and rules, each placed at its object's
/// file, on the line of its field when the manifest has it (a
/// `status.*` field is not in it: the object's line).
struct Problems<'a> {
    list: Vec<ConfigError>,
    locations: &'a BTreeMap<String, (String, usize)>,
    field_lines: &'a BTreeMap<String, Lines>,
}

impl Problems<'_> {
    fn push(&mut self, object: &str, field: String, message: String) {
        let (file, line) = match self.locations.get(object) {
            Some((file, line)) => {
                let line = self.field_lines.get(object).map_or(*line, |l| l.of(&field));
                (file.clone(), Some(line))
            }
            None => (String::from("-"), None),
        };
        self.list.push(ConfigError {
            file,
            line,
            object: Some(object.to_string()),
            field: Some(field),
            message,
        });
    }
}

fn write_object(
    object: &ObjectStatus,
    out: &mut impl Write,
    problems: &mut Problems<'_>,
) -> std::io::Result<()> {
    let namespace = object.metadata.namespace.as_deref();
    let name = match namespace {
        Some(namespace) => format!("{} {namespace}/{}", object.kind, object.metadata.name),
        None => format!("{} {}", object.kind, object.metadata.name),
    };
    writeln!(out, "{name} (generation {})", object.metadata.generation)?;
    let status = &object.status;
    let at = |field: String, suffix: String| (name.clone(), field, suffix);
    write_conditions(
        status.get("conditions"),
        "  ",
        at("status.conditions".into(), String::new()),
        out,
        problems,
    )?;
    for (i, listener) in array(status.get("listeners")).iter().enumerate() {
        let listener_name = listener.get("name").and_then(Value::as_str).unwrap_or("?");
        let attached = listener
            .get("attachedRoutes")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        writeln!(
            out,
            "  listener {listener_name}: {attached} attached route(s)"
        )?;
        write_conditions(
            listener.get("conditions"),
            "    ",
            at(
                format!("status.listeners[{i}]"),
                format!(" (listener {listener_name})"),
            ),
            out,
            problems,
        )?;
    }
    for (i, parent) in array(status.get("parents")).iter().enumerate() {
        let parent_name = describe_parent_ref(parent.get("parentRef"), namespace);
        writeln!(out, "  parent {parent_name}:")?;
        write_conditions(
            parent.get("conditions"),
            "    ",
            at(
                format!("status.parents[{i}]"),
                format!(" (parent {parent_name})"),
            ),
            out,
            problems,
        )?;
    }
    for (i, ancestor) in array(status.get("ancestors")).iter().enumerate() {
        let ancestor_name = describe_parent_ref(ancestor.get("ancestorRef"), namespace);
        writeln!(out, "  ancestor {ancestor_name}:")?;
        write_conditions(
            ancestor.get("conditions"),
            "    ",
            at(
                format!("status.ancestors[{i}]"),
                format!(" (ancestor {ancestor_name})"),
            ),
            out,
            problems,
        )?;
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

/// `(object, field, suffix)`: where a condition problem is reported.
type ConditionPlace = (String, String, String);

fn write_conditions(
    conditions: Option<&Value>,
    indent: &str,
    (object, field, suffix): ConditionPlace,
    out: &mut impl Write,
    problems: &mut Problems<'_>,
) -> std::io::Result<()> {
    for condition in array(conditions) {
        let get = |key: &str| condition.get(key).and_then(Value::as_str).unwrap_or("");
        let (kind, status, reason, message) =
            (get("type"), get("status"), get("reason"), get("message"));
        let mut line = format!("{kind}={status} {reason}");
        if !message.is_empty() {
            line.push_str(": ");
            line.push_str(message);
        }
        if condition_is_problem(kind, status) {
            writeln!(out, "{indent}{line}   <-- problem")?;
            problems.push(&object, field.clone(), format!("{line}{suffix}"));
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
    omitted_weights: &BTreeSet<(String, usize, usize)>,
    out: &mut impl Write,
    problems: &mut Problems<'_>,
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
        .enumerate()
        .map(|(j, b)| {
            if omitted_weights.contains(&(format!("{} {}", rule.kind, rule.route), rule.rule, j)) {
                format!("{} (omitted)", b.weight)
            } else {
                b.weight.to_string()
            }
        })
        .collect();
    let weight_width = weights.iter().map(String::len).max().unwrap_or(0);
    for (j, (backend, weight)) in rule.backends.iter().zip(&weights).enumerate() {
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
            problems.push(
                &format!("{} {}", rule.kind, rule.route),
                format!("spec.rules[{}].backendRefs[{j}]", rule.rule),
                format!("backend {}: {outcome}", backend.name),
            );
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
