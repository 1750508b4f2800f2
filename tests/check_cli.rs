//! `sluice check`: exit codes 0/1/2, shares as percentages, warnings and
//! errors, on manifests written by each test.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use sluice::cli::check;

/// A directory of manifests, removed on drop.
struct Manifests {
    dir: PathBuf,
}

impl Manifests {
    fn new(files: &[(&str, &str)]) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sluice-check-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        for (name, text) in files {
            let path = dir.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("create sub dir");
            }
            std::fs::write(path, text).expect("write manifest");
        }
        Manifests { dir }
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Manifests {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn check(paths: &[&Path]) -> (i32, String) {
    let paths: Vec<PathBuf> = paths.iter().map(|p| p.to_path_buf()).collect();
    let mut out = Vec::new();
    let code = check::run(&paths, &[], None, check::Output::Text, &mut out);
    let out = String::from_utf8(out).expect("check prints UTF-8");
    // Shown with `--nocapture`.
    println!("--- sluice check (exit {code})\n{out}");
    (code, out)
}

const GATEWAY: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sluice}
spec: {controllerName: sluice.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec:
  gatewayClassName: sluice
  listeners:
  - {name: http, protocol: HTTP, port: 8080}
";

/// A Service `name` with one ready endpoint (or none).
fn service(name: &str, endpoints: usize) -> String {
    let mut text = format!(
        "---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: default
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints:
"
    );
    if endpoints == 0 {
        text.push_str("- {addresses: [\"127.0.0.1\"], conditions: {ready: false}}\n");
    }
    for i in 0..endpoints {
        text.push_str(&format!("- {{addresses: [\"127.0.0.{}\"]}}\n", i + 1));
    }
    text
}

fn route(backend_refs: &str) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: web, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
  - backendRefs:
{backend_refs}"
    )
}

#[test]
fn the_examples_are_accepted_and_print_the_canary_shares() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let (code, out) = check(&[&examples]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("HTTPRoute default/autocomplete"), "{out}");
    assert!(out.contains("99.5%"), "{out}");
    assert!(out.contains("0.5%"), "{out}");
    assert!(out.contains("47 ready endpoint"), "{out}");
    assert!(out.contains("Accepted=True"), "{out}");
    assert!(out.contains("ResolvedRefs=True"), "{out}");
    assert!(out.contains("OK:"), "{out}");
}

#[test]
fn files_are_found_recursively_and_shares_are_weight_over_sum() {
    let manifests = Manifests::new(&[
        ("gateway.yaml", GATEWAY),
        (
            "apps/web/route.yml",
            &route("    - {name: a, port: 80, weight: 1}\n    - {name: b, port: 80, weight: 2}\n"),
        ),
        (
            "apps/web/services.yaml",
            &(service("a", 1) + &service("b", 1)),
        ),
        ("apps/README.md", "not a manifest: ignored"),
        (
            "apps/web/config.yaml",
            "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: settings}\n",
        ),
    ]);
    let (code, out) = check(&[manifests.path()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("PodTemplate"), "listed as ignored: {out}");
    assert!(out.contains("33.33%"), "{out}");
    assert!(out.contains("66.67%"), "{out}");
}

#[test]
fn a_missing_backend_is_exit_1_and_named() {
    let manifests = Manifests::new(&[
        ("gateway.yaml", GATEWAY),
        (
            "route.yaml",
            &(route(
                "    - {name: a, port: 80, weight: 995}\n    - {name: gone, port: 80, weight: 5}\n",
            ) + &service("a", 2)),
        ),
    ]);
    let (code, out) = check(&[manifests.path()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("ResolvedRefs=False"), "{out}");
    assert!(out.contains("BackendNotFound"), "{out}");
    assert!(out.contains("99.5%"), "{out}");
    assert!(out.contains("500"), "the 500 for the missing share: {out}");
    assert!(out.contains("FAIL"), "{out}");
    // Its lint line is at the backendRef's own line, not the route's.
    let route_file = manifests.path().join("route.yaml");
    let text = std::fs::read_to_string(&route_file).expect("readable");
    let gone = text
        .lines()
        .position(|l| l.contains("name: gone"))
        .expect("gone")
        + 1;
    let line = format!(
        "{}:{gone}: HTTPRoute default/web: spec.rules[0].backendRefs[1]: backend default/gone:80: unresolved",
        route_file.display()
    );
    assert!(
        out.lines().any(|l| l.starts_with(&line)),
        "no line starting {line:?} in:\n{out}"
    );
}

#[test]
fn an_out_of_range_weight_is_exit_1_naming_the_field() {
    let manifests = Manifests::new(&[
        ("gateway.yaml", GATEWAY),
        (
            "route.yaml",
            &(route("    - {name: a, port: 80, weight: 1000001}\n") + &service("a", 1)),
        ),
    ]);
    let (code, out) = check(&[manifests.path()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("HTTPRoute default/web"), "{out}");
    assert!(out.contains("weight"), "{out}");
    assert!(out.contains("route.yaml"), "{out}");
}

#[test]
fn omitted_weights_and_empty_services_are_warnings_not_failures() {
    let manifests = Manifests::new(&[
        ("gateway.yaml", GATEWAY),
        (
            "route.yaml",
            &(route("    - {name: a, port: 80, weight: 3}\n    - {name: b, port: 80}\n")
                + &service("a", 0)
                + &service("b", 1)),
        ),
    ]);
    let (code, out) = check(&[manifests.path()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("warnings:"), "{out}");
    assert!(out.contains("75%"), "{out}");
    assert!(out.contains("25%"), "{out}");
    assert!(out.contains("(omitted)"), "{out}");
    assert!(out.contains("503"), "{out}");
}

#[test]
fn a_missing_path_is_exit_2() {
    let manifests = Manifests::new(&[("gateway.yaml", GATEWAY)]);
    let missing = manifests.path().join("does-not-exist");
    let (code, out) = check(&[&missing]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("does-not-exist"), "{out}");
}

#[test]
fn a_yaml_syntax_error_is_exit_2_naming_file_and_line() {
    let manifests = Manifests::new(&[
        ("gateway.yaml", GATEWAY),
        (
            "broken.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: [oops\n",
        ),
    ]);
    let (code, out) = check(&[manifests.path()]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("broken.yaml:"), "{out}");
}

#[test]
fn no_objects_at_all_is_not_ok() {
    let manifests = Manifests::new(&[("notes.txt", "nothing here")]);
    let (code, out) = check(&[manifests.path()]);
    assert_eq!(code, 1, "{out}");
}

/// The built binary, as a user runs it.
fn sluice_check(paths: &[&Path]) -> (i32, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
    command.arg("check");
    for path in paths {
        command.arg("-f").arg(path);
    }
    let output = command.output().expect("run the sluice binary");
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 stdout");
    let code = output.status.code().expect("sluice exited, not killed");
    (code, stdout)
}

#[test]
fn the_binary_exits_0_1_2() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let (code, out) = sluice_check(&[&examples]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("99.5%") && out.contains("0.5%"), "{out}");

    let manifests = Manifests::new(&[
        ("gateway.yaml", GATEWAY),
        ("route.yaml", &route("    - {name: gone, port: 80}\n")),
    ]);
    let (code, out) = sluice_check(&[manifests.path()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("BackendNotFound"), "{out}");

    let missing = manifests.path().join("nope.yaml");
    let (code, out) = sluice_check(&[&examples, &missing]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("nope.yaml"), "{out}");
}

/// The built binary with arguments, as CI runs it.
fn sluice_check_args(args: &[&std::ffi::OsStr]) -> (i32, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check")
        .args(args)
        .output()
        .expect("run the sluice binary");
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 stdout");
    (output.status.code().expect("sluice exited"), stdout)
}

/// A CRD for HTTPRoute of our own making (the upstream ones are exercised
/// by tests/crd_validation.rs): weights at most 100.
const ROUTE_CRD: &str = include_str!("fixtures/httproute-weights-at-most-100.crd.yaml");

#[test]
fn crds_validate_and_each_problem_is_one_lint_line_or_json() {
    let manifests = Manifests::new(&[
        ("gateway.yaml", GATEWAY),
        (
            "route.yaml",
            &(route("    - {name: a, port: 80, weight: 101}\n") + &service("a", 1)),
        ),
        ("crds/route-crd.yaml", ROUTE_CRD),
    ]);
    let route_file = manifests.path().join("route.yaml");
    let crd_file = manifests.path().join("crds");
    // Without the CRD: sluice's own check (a weight of 101 is fine).
    let gateway_file = manifests.path().join("gateway.yaml");
    let (code, out) = sluice_check_args(&[
        "-f".as_ref(),
        route_file.as_os_str(),
        "-f".as_ref(),
        gateway_file.as_os_str(),
    ]);
    assert_eq!(code, 0, "{out}");

    // With it (--crds): refused with the API server's message, one line
    // naming file, line, object and field.
    let (code, out) = sluice_check_args(&[
        "-f".as_ref(),
        route_file.as_os_str(),
        "-f".as_ref(),
        gateway_file.as_os_str(),
        "--crds".as_ref(),
        crd_file.as_os_str(),
    ]);
    assert_eq!(code, 1, "{out}");
    let line = format!(
        "{}:{}: HTTPRoute default/web: spec.rules[0].backendRefs[0].weight: Invalid value: 101: \
         spec.rules[0].backendRefs[0].weight in body should be less than or equal to 100",
        route_file.display(),
        weight_line(&route_file),
    );
    assert!(
        out.lines().any(|l| l == line),
        "no line {line:?} in:\n{out}"
    );

    // A CRD document among the -f manifests counts too; --output json.
    let (code, out) = sluice_check_args(&[
        "-f".as_ref(),
        manifests.path().as_os_str(),
        "--output".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(code, 1, "{out}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("--output json is JSON");
    assert_eq!(doc["exitCode"], 1);
    let problem = &doc["problems"][0];
    assert_eq!(problem["object"], "HTTPRoute default/web", "{doc:#}");
    assert_eq!(
        problem["field"], "spec.rules[0].backendRefs[0].weight",
        "{doc:#}"
    );
    assert_eq!(problem["line"], weight_line(&route_file), "{doc:#}");
    assert_eq!(
        doc["crds"]["kinds"][0]
            .as_str()
            .map(|k| k.starts_with("HTTPRoute.")),
        Some(true)
    );
}

/// The line of `weight:` in a manifest file.
fn weight_line(file: &Path) -> usize {
    let text = std::fs::read_to_string(file).expect("readable");
    text.lines()
        .position(|l| l.contains("weight: 101"))
        .expect("a weight")
        + 1
}

/// Each RolloutPolicy's power, said before any traffic: what each gate
/// catches and after how many requests (or events), on expected counts.
/// The binary, on the example policies.
#[test]
fn rollout_policies_say_what_their_gates_catch_and_after_how_much() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rollout.yaml");
    let (code, out) = sluice_check(&[&example]);
    assert_eq!(code, 0, "{out}");
    let after = |line: &str, what: &str| -> u64 {
        let rest = &line[line
            .find(what)
            .unwrap_or_else(|| panic!("{what} in {line}"))
            + what.len()..];
        let digits: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',')
            .filter(char::is_ascii_digit)
            .collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("a count after {what} in {line}"))
    };
    let power = out
        .lines()
        .filter(|l| l.starts_with("  power at 99% confidence"))
        .count();
    assert_eq!(power, 2, "one power section per policy: {out}");
    let limit = out
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with("5xx <= 1%, in the canary's requests: ")
        })
        .unwrap_or_else(|| panic!("the maxErrorRate gate's line: {out}"));
    let (twice, tenfold) = (
        after(limit, "2x (2%) after about "),
        after(limit, "10x (10%) after about "),
    );
    assert!(tenfold < twice, "{limit}");
    // 99 in 100 of such canaries take more traffic than half of them.
    let from_twice = &limit[limit.find("2x (2%) after about ").expect("the 2x figure")..];
    assert!(after(from_twice, "(99 in 100 by ") > twice, "{limit}");
    // The policy's minRequests (200) alone, per step.
    assert!(
        limit.contains("; a step of minRequests 200 alone catches 2x "),
        "{limit}"
    );
    assert!(
        after(limit, "one failing everything after about ") <= 5,
        "{limit}"
    );
    let stable = out
        .lines()
        .find(|l| l.contains("stable, in the 5xx of both sides together: at step 5%, "))
        .unwrap_or_else(|| panic!("the baseline gate's line: {out}"));
    assert!(
        after(stable, "at step 25%, a canary at 2x after about ")
            < after(stable, "at step 5%, a canary at 2x after about "),
        "a larger step sees a regression in fewer events: {stable}"
    );
}
