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
    // Every kind the Kubernetes source watches, from the source itself.
    for kind in sluice::source::kubernetes::WATCHED_KINDS {
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
