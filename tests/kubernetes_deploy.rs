//! `deploy/` stays consistent with the binary: every manifest parses, the
//! kustomization lists files that exist, the Deployment's arguments are ones
//! `sluice serve` accepts, its probes hit the admin endpoints, and RBAC
//! grants what the Kubernetes mode uses and no more than that.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn documents(file: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    sluice::yaml::documents(&text)
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .into_iter()
        .map(|d| d.value)
        .collect()
}

fn of_kind(file: &str, kind: &str) -> Vec<Value> {
    documents(file)
        .into_iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn kustomization_lists_existing_files() {
    let k = &documents("kustomization.yaml")[0];
    let resources = strings(&k["resources"]);
    assert!(resources.len() >= 6, "{resources:?}");
    for r in resources {
        assert!(!documents(&r).is_empty(), "{r} has objects");
    }
}

#[test]
fn deployment_runs_kubernetes_mode_safely_with_probes_on_the_admin_port() {
    let d = &of_kind("deployment.yaml", "Deployment")[0];
    assert_eq!(d["spec"]["replicas"].as_u64(), Some(2));
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    let c = &pod["containers"][0];
    assert_eq!(
        c["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
    assert!(c["resources"]["requests"]["cpu"].as_str().is_some());
    assert!(c["resources"]["requests"]["memory"].as_str().is_some());
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert_eq!(
        c["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    let args = strings(&c["args"]);
    assert!(args.contains(&"--kubernetes".to_string()), "{args:?}");
    assert!(
        args.iter().any(|a| a.starts_with("--admin=0.0.0.0:")),
        "probes reach the admin port from outside the pod: {args:?}"
    );

    // The binary accepts exactly these arguments (clap rejects unknown
    // ones before anything starts); --help stops before connecting.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(&args)
        .arg("--help")
        .output()
        .expect("the sluice binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn rbac_grants_reads_status_patches_and_the_lease_only() {
    let role = &of_kind("rbac.yaml", "ClusterRole")[0];
    let mut grants = Vec::new();
    for rule in role["rules"].as_array().expect("rules") {
        for resource in strings(&rule["resources"]) {
            for verb in strings(&rule["verbs"]) {
                grants.push(format!("{resource}:{verb}"));
            }
        }
    }
    // Every kind the Kubernetes source watches, from the source itself
    // (with the Ingresses of `--ingress-class`).
    for kind in sluice::source::kubernetes::kinds(true) {
        for verb in ["list", "watch"] {
            let grant = format!("{}:{verb}", kind.plural);
            assert!(grants.contains(&grant), "{grant}");
        }
    }
    for status in [
        "gatewayclasses/status",
        "gateways/status",
        "listenersets/status",
        "httproutes/status",
        "grpcroutes/status",
        "tlsroutes/status",
        "backendtlspolicies/status",
        "ingresses/status",
    ] {
        assert!(grants.contains(&format!("{status}:patch")), "{status}");
    }
    let writes: Vec<&String> = grants
        .iter()
        .filter(|g| !g.ends_with(":get") && !g.ends_with(":list") && !g.ends_with(":watch"))
        .collect();
    assert!(
        writes.iter().all(|g| g.contains("/status:patch")),
        "cluster-wide writes are status patches only: {writes:?}"
    );
    let lease = &of_kind("rbac.yaml", "Role")[0];
    assert_eq!(
        lease["metadata"]["namespace"].as_str(),
        Some("sluice-system")
    );
    assert_eq!(strings(&lease["rules"][0]["resources"]), ["leases"]);
    assert_eq!(
        strings(&lease["rules"][0]["verbs"]),
        ["get", "create", "update"]
    );
    // The rollout counts: one Lease per replica, applied (patch), read by
    // the leader (list, watch), withdrawn on shutdown (delete).
    let counts = &of_kind("rbac.yaml", "Role")[1];
    assert_eq!(
        counts["metadata"]["namespace"].as_str(),
        Some("sluice-system")
    );
    assert_eq!(strings(&counts["rules"][0]["resources"]), ["leases"]);
    assert_eq!(
        strings(&counts["rules"][0]["verbs"]),
        ["list", "watch", "patch", "delete"]
    );
    let bindings = of_kind("rbac.yaml", "RoleBinding");
    assert!(
        bindings
            .iter()
            .any(|b| b["roleRef"]["name"] == counts["metadata"]["name"]),
        "the counts Role is bound"
    );
}

#[test]
fn gateway_class_is_ours_and_the_service_is_the_one_named_in_the_args() {
    let class = &of_kind("gatewayclass.yaml", "GatewayClass")[0];
    assert_eq!(
        class["spec"]["controllerName"].as_str(),
        Some(sluice::resources::CONTROLLER_NAME)
    );
    let svc = &of_kind("service.yaml", "Service")[0];
    let named = format!(
        "--gateway-service={}/{}",
        svc["metadata"]["namespace"].as_str().unwrap_or(""),
        svc["metadata"]["name"].as_str().unwrap_or("")
    );
    let d = &of_kind("deployment.yaml", "Deployment")[0];
    let args = strings(&d["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(args.contains(&named), "{named} in {args:?}");
}

/// The RolloutPolicy CRD refuses what `sluice serve -f` refuses: its
/// patterns accept exactly the percentages and durations sluice parses,
/// its enums are sluice's, and the status subresource is there for the
/// leader to write. RBAC lets sluice read the policies and patch their
/// status.
#[test]
fn rollout_policy_crd_agrees_with_sluice() {
    use sluice::resources::{
        Percent, ROLLOUT_POLICY_API_VERSION, SLUICE_GROUP, parse_gateway_duration,
    };

    let crd = &of_kind("rolloutpolicy-crd.yaml", "CustomResourceDefinition")[0];
    let spec = &crd["spec"];
    assert_eq!(spec["group"].as_str(), Some(SLUICE_GROUP));
    assert_eq!(spec["names"]["kind"].as_str(), Some("RolloutPolicy"));
    let version = &spec["versions"][0];
    assert_eq!(
        format!(
            "{}/{}",
            SLUICE_GROUP,
            version["name"].as_str().unwrap_or("")
        ),
        ROLLOUT_POLICY_API_VERSION
    );
    assert!(version["subresources"]["status"].is_object());
    let schema = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(
        strings(&schema["required"]),
        ["targetRefs", "steps", "interval"]
    );
    let props = &schema["properties"];
    assert_eq!(strings(&props["onFailure"]["enum"]), ["Rollback", "Pause"]);
    assert_eq!(
        strings(&props["targetRefs"]["items"]["properties"]["kind"]["enum"]),
        ["HTTPRoute"]
    );
    let pattern = |v: &Value| {
        regex::Regex::new(v["pattern"].as_str().expect("a pattern")).expect("a valid pattern")
    };
    let step = pattern(&props["steps"]["items"]);
    let rate = pattern(&props["analysis"]["properties"]["maxErrorRate"]);
    for text in [
        "0.5%", "5%", "25%", "100%", "100.000%", "0.001%", "0%", "0.0625%", "100.5%", "101%",
        "1000%", "5", ".5%", "1.%", "-1%", " 5%", "1e2%", "99.999%",
    ] {
        let ours = Percent::parse(text).is_ok();
        assert_eq!(step.is_match(text), ours, "steps pattern on {text:?}");
        assert_eq!(
            rate.is_match(text),
            ours,
            "maxErrorRate pattern on {text:?}"
        );
    }
    let interval = pattern(&props["interval"]);
    let latency = pattern(&props["analysis"]["properties"]["maxLatency"]);
    for text in [
        "5m",
        "300ms",
        "1h2m3s4ms",
        "0s",
        "10",
        "1.5s",
        "100000s",
        "1d",
        "1h1h1h1h1h",
        "",
    ] {
        let ours = parse_gateway_duration(text).is_ok();
        assert_eq!(
            interval.is_match(text),
            ours,
            "interval pattern on {text:?}"
        );
        assert_eq!(
            latency.is_match(text),
            ours,
            "maxLatency pattern on {text:?}"
        );
    }

    let role = &of_kind("rbac.yaml", "ClusterRole")[0];
    let grants: Vec<String> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|r| strings(&r["apiGroups"]) == [SLUICE_GROUP])
        .flat_map(|r| {
            let verbs = strings(&r["verbs"]);
            strings(&r["resources"]).into_iter().flat_map(move |res| {
                verbs
                    .iter()
                    .map(move |v| format!("{res}:{v}"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for grant in [
        "rolloutpolicies:list",
        "rolloutpolicies:watch",
        "rolloutpolicies/status:patch",
    ] {
        assert!(grants.contains(&grant.to_string()), "{grant} in {grants:?}");
    }
}

/// Every field sluice writes in a RolloutPolicy's `status.rollouts[]` is
/// in the CRD's schema: an API server prunes the fields a structural
/// schema does not name, so a missing one would be lost in a cluster.
#[test]
fn rollout_policy_crd_names_every_status_field_sluice_writes() {
    use sluice::rollout::users::StepUsers;
    use sluice::rollout::{GateReport, Rollout, RolloutStatus, StepCounts};

    let crd = &of_kind("rolloutpolicy-crd.yaml", "CustomResourceDefinition")[0];
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        ["rollouts"]["items"]["properties"];
    let rollout = Rollout {
        step: sluice::resources::Percent::parse("5%").ok(),
        step_started_at: "2026-12-02T11:00:00Z".parse().ok(),
        rule_name: Some("main".into()),
        held_for: Some(1),
        ..Rollout::default()
    };
    let counts = StepCounts {
        p99: Some(std::time::Duration::from_millis(3)),
        gates: vec![GateReport {
            gate: "5xx <= 1%".into(),
            canary: String::new(),
            stable: String::new(),
            evidence: 1.0,
            needed: 100.0,
            detects: String::new(),
            powered: true,
        }],
        users: Some(StepUsers {
            canary: 3,
            stable: 30,
            estimated: true,
            ..StepUsers::default()
        }),
        ..StepCounts::default()
    };
    let status = serde_json::to_value(RolloutStatus::new(&rollout, Some(1), counts)).unwrap();
    let written = status.as_object().expect("an object");
    for field in written.keys() {
        assert!(
            schema[field.as_str()].is_object(),
            "status.rollouts[].{field} is not in the CRD schema"
        );
    }
    for field in [
        "canaryUsers",
        "stableUsers",
        "canaryUsersShare",
        "usersEstimated",
    ] {
        assert!(written.contains_key(field), "{field} written");
    }
    for field in written["evidence"][0].as_object().expect("a gate").keys() {
        assert!(
            schema["evidence"]["items"]["properties"][field.as_str()].is_object(),
            "status.rollouts[].evidence[].{field} is not in the CRD schema"
        );
    }
}
