//! Validation by the upstream Gateway API CRDs (`../shared/gateway-api/crds`,
//! or `$SLUICE_GATEWAY_API`). When they are absent the tests that need them
//! skip with the reason on stderr, or fail with `SLUICE_REQUIRE_ALL=1`
//! (see `sluice::testdata`).

use std::path::Path;
use std::sync::OnceLock;

use sluice::resources::crd::{Crds, is_crd};
use sluice::testdata::or_skip;

fn load_crds(dir: &Path) -> Crds {
    let mut crds = Crds::new();
    add_crds(&mut crds, dir);
    crds
}

/// Add the CRDs of the YAML files in `dir` to `crds`.
fn add_crds(crds: &mut Crds, dir: &Path) {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        for doc in sluice::yaml::documents(&text).expect("YAML") {
            if is_crd(&doc.value) {
                crds.add(&doc.value, &format!("{}:{}", file.display(), doc.line))
                    .expect("a usable CRD");
            }
        }
    }
}

/// The upstream CRDs of `channel` (`standard`, `experimental`), loaded
/// once for all the tests of this file; `None` (the test skips) after
/// [`or_skip`] reported them missing.
fn upstream(channel: &str) -> Option<&'static Crds> {
    static STANDARD: OnceLock<Result<Crds, String>> = OnceLock::new();
    static EXPERIMENTAL: OnceLock<Result<Crds, String>> = OnceLock::new();
    let cell = if channel == "standard" {
        &STANDARD
    } else {
        &EXPERIMENTAL
    };
    let crds = cell.get_or_init(|| {
        sluice::testdata::gateway_api_dir("crds").map(|dir| load_crds(&dir.join(channel)))
    });
    or_skip(crds.as_ref().map_err(Clone::clone))
}

#[test]
fn every_rule_of_the_upstream_crds_compiles() {
    for channel in ["standard", "experimental"] {
        let Some(crds) = upstream(channel) else {
            return;
        };
        let stats = crds.stats();
        println!(
            "{channel}: {} CEL rules evaluated, {} transition rules, {} could not compile: {:?}",
            stats.compiled,
            stats.transition,
            stats.failed.len(),
            stats.failed
        );
        assert!(stats.failed.is_empty(), "{channel}: {:?}", stats.failed);
        assert!(stats.compiled > 200, "{channel}: {stats:?}");
    }
}

/// Every upstream conformance manifest is one a cluster with the
/// experimental CRDs accepts (the suite applies them): no false refusals.
#[test]
fn every_conformance_manifest_passes_validation() {
    let Some(crds) = upstream("experimental") else {
        return;
    };
    let Some(dir) = or_skip(sluice::testdata::gateway_api_dir("conformance")) else {
        return;
    };
    let mut files = Vec::new();
    for sub in ["base", "tests"] {
        for e in std::fs::read_dir(dir.join(sub)).expect("conformance folder") {
            let path = e.expect("entry").path();
            if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut refused = Vec::new();
    let mut validated = 0;
    for file in &files {
        let text = fill_placeholders(&std::fs::read_to_string(file).expect("readable"));
        let parsed =
            sluice::resources::parse_manifests_with(&text, &file.display().to_string(), crds);
        validated += parsed
            .objects
            .iter()
            .filter(|o| crds.covers("gateway.networking.k8s.io/v1", o.object.kind()))
            .count();
        refused.extend(parsed.errors.iter().map(ToString::to_string));
    }
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
    assert!(
        validated > 200,
        "only {validated} objects validated by a CRD"
    );
    println!(
        "{} files, {validated} Gateway API objects validated, none refused",
        files.len()
    );
}

/// The table of invalid manifests (`tests/crd_validation/invalid.yaml`):
/// each is refused with exactly the errors it lists.
#[test]
fn invalid_manifests_get_the_api_servers_messages() {
    let Some(crds) = upstream("standard") else {
        return;
    };
    let table = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/crd_validation/invalid.yaml");
    let text = std::fs::read_to_string(&table).expect("the table is readable");
    let cases: Vec<serde_json::Value> = sluice::yaml::from_str(&text).expect("the table is YAML");
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let mut wrong = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().expect("a case has a name");
        let object = match case.get("object") {
            Some(o) => o.clone(),
            None => {
                let mut route = serde_json::json!({
                    "apiVersion": "gateway.networking.k8s.io/v1",
                    "kind": "HTTPRoute",
                    "metadata": {"name": "r"},
                    "spec": {"parentRefs": [{"name": "gw"}],
                             "rules": [{"backendRefs": [{"name": "a", "port": 80}]}]},
                });
                for (k, v) in case["spec"].as_object().expect("a case has spec or object") {
                    route["spec"][k] = v.clone();
                }
                route
            }
        };
        let manifest = sluice::yaml::to_string(&object).expect("serializes");
        let parsed = sluice::resources::parse_manifests_with(&manifest, "case.yaml", crds);
        let got: Vec<String> = parsed
            .errors
            .iter()
            .map(|e| match &e.field {
                Some(f) => format!("{f}: {}", e.message),
                None => e.message.clone(),
            })
            .collect();
        let want: Vec<String> = case["expect"]
            .as_array()
            .expect("a case has expect")
            .iter()
            .map(|e| e.as_str().expect("expectations are strings").to_string())
            .collect();
        if got != want || !parsed.objects.is_empty() {
            wrong.push(format!("{name}:\n  want {want:#?}\n  got  {got:#?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases differ:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

/// A conformance manifest as the suite applies it: placeholders filled in.
fn fill_placeholders(text: &str) -> String {
    text.replace("{GATEWAY_CLASS_NAME}", "sluice")
        .replace("{GATEWAY_CONTROLLER_NAME}", "sluice.dev/gateway-controller")
        .replace("PLACEHOLDER_USABLE_ADDRS", "192.0.2.1")
        .replace("PLACEHOLDER_UNUSABLE_ADDRS", "198.51.100.1")
}

/// Every manifest set the repository and the upstream suite have: the
/// golden inputs, and each conformance test's manifests with the base ones
/// and our GatewayClass, as the suite applies them. A set is its name and
/// its texts (the shared base is one `Arc`, loaded once).
fn manifest_sets() -> Vec<(String, Vec<std::sync::Arc<str>>)> {
    let mut sets = Vec::new();
    if let Some(dir) = or_skip(sluice::testdata::gateway_api_dir("conformance")) {
        let class = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\n\
                     metadata: {name: sluice}\nspec: {controllerName: sluice.dev/gateway-controller}\n";
        let base =
            std::fs::read_to_string(dir.join("base/manifests.yaml")).expect("base manifests");
        let base: std::sync::Arc<str> = fill_placeholders(&format!("{class}---\n{base}")).into();
        let mut tests: Vec<_> = std::fs::read_dir(dir.join("tests"))
            .expect("conformance tests")
            .map(|e| e.expect("entry").path())
            .collect();
        tests.sort();
        for path in tests {
            let text = fill_placeholders(&std::fs::read_to_string(&path).expect("readable"));
            sets.push((path.display().to_string(), vec![base.clone(), text.into()]));
        }
    }
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/translate");
    let mut inputs: Vec<_> = std::fs::read_dir(&golden)
        .expect("golden inputs")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".in.yaml"))
        .collect();
    inputs.sort();
    for p in inputs {
        let text = std::fs::read_to_string(&p).expect("readable");
        sets.push((p.display().to_string(), vec![text.into()]));
    }
    sets
}

/// Every status body sluice writes, on `/status` and in the Kubernetes
/// mode's server-side apply bodies, is one the CRD's status schema (and its
/// CEL rules) accepts: the upstream CRDs' and our own (`deploy/`).
#[test]
fn every_status_body_sluice_writes_fits_the_crd_status_schema() {
    use sluice::resources::{Generations, Snapshot};
    use sluice::translate::{TranslateOptions, translate_at};

    let Some(crds) = upstream("experimental") else {
        return;
    };
    let ours = load_crds(&Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy"));
    let mut checked = 0;
    let mut per_kind = std::collections::BTreeMap::<String, usize>::new();
    let mut with_rollouts = 0;
    let mut refused = Vec::new();
    // Each text is loaded once (the conformance base is in every set).
    let mut loaded = std::collections::HashMap::<std::sync::Arc<str>, Vec<_>>::new();
    for (name, texts) in manifest_sets() {
        let mut objects = Vec::new();
        for text in &texts {
            objects.extend(
                loaded
                    .entry(text.clone())
                    .or_insert_with(|| {
                        sluice::resources::parse_manifests_with(text, &name, crds).objects
                    })
                    .iter()
                    .cloned(),
            );
        }
        let snapshot = Snapshot::from_loaded(objects, |objects| {
            Generations::new().assign(objects, k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        });
        let options = TranslateOptions {
            default_bind: std::net::Ipv4Addr::LOCALHOST.into(),
        };
        let translation = translate_at(&snapshot, &options, k8s_openapi::jiff::Timestamp::now());
        let addresses = [
            gateway_api::experimental::gateways::GatewayStatusAddresses {
                r#type: Some("IPAddress".into()),
                value: "192.0.2.10".into(),
            },
        ];
        let rollouts = rollouts_at_first_step(&snapshot);
        let patches =
            sluice::status::plan(&snapshot, &translation.status, Some(&addresses), &rollouts);
        let bodies = translation
            .status
            .objects
            .iter()
            .map(|o| {
                let mut status = o.status.clone();
                if o.kind == "RolloutPolicy" {
                    let key = sluice::rollout::PolicyKey {
                        namespace: o.metadata.namespace.clone().unwrap_or_default(),
                        name: o.metadata.name.clone(),
                    };
                    rollouts.complete(&key, &mut status);
                }
                ("/status", o.api_version.clone(), o.kind.clone(), status)
            })
            .chain(patches.iter().map(|p| {
                (
                    "apply",
                    p.body["apiVersion"].as_str().unwrap_or("").to_string(),
                    p.kind.to_string(),
                    p.body["status"].clone(),
                )
            }));
        for (place, api_version, kind, mut status) in bodies {
            if status["rollouts"].as_array().is_some_and(|r| !r.is_empty()) {
                with_rollouts += 1;
            }
            let errors = crds
                .admit_status(&api_version, &kind, &mut status)
                .or_else(|| ours.admit_status(&api_version, &kind, &mut status));
            let Some(errors) = errors else {
                continue;
            };
            checked += 1;
            *per_kind.entry(kind.clone()).or_default() += 1;
            refused.extend(
                errors
                    .iter()
                    .map(|e| format!("{name}: {place} {kind}: {e}")),
            );
        }
    }
    assert!(
        refused.is_empty(),
        "status refused:\n{}",
        refused.join("\n")
    );
    assert!(checked > 1000, "only {checked} status bodies checked");
    assert!(
        with_rollouts > 0,
        "no RolloutPolicy status with rollouts was checked"
    );
    // The check can fail: a condition status the schema does not allow.
    let mut bad = serde_json::json!({"conditions": [{"type": "Accepted", "status": "Maybe",
        "reason": "Accepted", "message": "", "lastTransitionTime": "1970-01-01T00:00:00Z"}]});
    let errors = crds
        .admit_status("gateway.networking.k8s.io/v1", "GatewayClass", &mut bad)
        .expect("GatewayClass has a status schema");
    assert_eq!(
        errors[0].to_string(),
        "status.conditions[0].status: Unsupported value: \"Maybe\": supported values: \"True\", \"False\", \"Unknown\""
    );
    println!(
        "{checked} status bodies checked ({with_rollouts} RolloutPolicy ones with rollouts): {per_kind:?}"
    );
}

/// Every rule a RolloutPolicy governs in `snapshot`, at a first step (so
/// that the policies' `status.rollouts` carry every field they can).
fn rollouts_at_first_step(
    snapshot: &sluice::resources::Snapshot,
) -> sluice::rollout::RolloutReport {
    use sluice::rollout::{Phase, Rollout, RolloutReport, Rollouts};
    let inputs = sluice::translate::rollout_inputs(snapshot, &[]);
    let records = inputs.rules.iter().map(|g| Rollout {
        policy: g.policy.clone(),
        rule: g.rule.clone(),
        rule_name: g.rule_name.clone(),
        phase: Phase::Progressing,
        step: sluice::resources::Percent::parse("5%").ok(),
        step_started_at: Some(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        from: g.spec.clone(),
        to: g.spec.clone(),
        held_for: None,
        message: "started: step 5%".into(),
    });
    RolloutReport::new(&Rollouts::restore(records), None)
}

/// Our own CRDs (`deploy/*.yaml`) go through the same validator: each has
/// fixtures in `tests/crd_validation/deploy/<kind>.yaml` whose `good`
/// objects are accepted and whose `bad` ones get exactly their `expect`.
/// A CRD without fixtures fails: its schema is tested, not just written.
#[test]
fn deploy_crds_accept_good_and_refuse_bad_manifests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let crds = load_crds(&root.join("deploy"));
    let fixtures_dir = root.join("tests/crd_validation/deploy");
    let mut fixtures: Vec<_> = std::fs::read_dir(&fixtures_dir)
        .expect("fixtures folder")
        .map(|e| e.expect("entry").path())
        .collect();
    fixtures.sort();
    let mut covered = Vec::new();
    let mut wrong = Vec::new();
    for path in fixtures {
        let text = std::fs::read_to_string(&path).expect("readable");
        let fixture: serde_json::Value = sluice::yaml::from_str(&text).expect("fixture is YAML");
        let kind = fixture["kind"].as_str().expect("fixture kind");
        let api_version = fixture["apiVersion"].as_str().expect("fixture apiVersion");
        assert!(
            crds.covers(api_version, kind),
            "{}: fixtures for {kind}, but deploy/ has no CRD for it",
            path.display()
        );
        covered.push(kind.to_string());
        let object = |spec: &serde_json::Value, i: usize| {
            serde_json::json!({"apiVersion": api_version, "kind": kind,
                               "metadata": {"name": format!("case-{i}"), "namespace": "default"},
                               "spec": spec})
        };
        let cases = fixture["good"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| (c, Vec::new()));
        let bad = fixture["bad"].as_array().into_iter().flatten().map(|c| {
            let want: Vec<String> = c["expect"]
                .as_array()
                .expect("a bad case has expect")
                .iter()
                .map(|e| e.as_str().expect("strings").to_string())
                .collect();
            (c, want)
        });
        for (i, (case, want)) in cases.chain(bad).enumerate() {
            let mut value = object(&case["spec"], i);
            let got: Vec<String> = crds
                .admit(api_version, kind, &mut value)
                .expect("covered")
                .iter()
                .map(|e| {
                    if e.path.is_root() {
                        e.body()
                    } else {
                        e.to_string()
                    }
                })
                .collect();
            if got != want {
                wrong.push(format!(
                    "{kind} case {i}:\n  want {want:#?}\n  got  {got:#?}"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    for described in crds.describe() {
        let kind = described.split('.').next().unwrap_or("");
        assert!(
            covered.iter().any(|k| k == kind),
            "deploy/ defines {described} but tests/crd_validation/deploy has no fixtures for it"
        );
    }
}
