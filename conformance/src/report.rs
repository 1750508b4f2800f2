//! Results: totals, the upstream `ConformanceReport` YAML (the shape of
//! `conformance/apis/v1/conformancereport.go` and `profilereport.go`), and
//! the markdown table of `docs/conformance.md`.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde_json::json;

use crate::registry::{Profile, Test};

/// Gateway API release whose suite this runner reproduces.
pub const GATEWAY_API_VERSION: &str = "v1.6.1";

#[derive(Debug, Clone)]
pub enum Outcome {
    Pass,
    Fail(String),
    /// Cannot apply outside a cluster; why.
    NotApplicable(String),
}

pub struct TestResult {
    pub test: &'static Test,
    pub outcome: Outcome,
}

impl TestResult {
    /// Does `profile` report this test?
    pub fn in_profile(&self, profile: Profile) -> bool {
        self.test.profiles().any(|p| p == profile)
    }
}

#[derive(Debug, Default)]
pub struct Totals {
    pub passed: usize,
    pub failed: usize,
    pub not_applicable: usize,
    pub core_passed: usize,
    pub core_total: usize,
    pub extended_passed: usize,
    pub extended_total: usize,
}

impl Totals {
    /// The totals of `profile`: the results of the tests it reports.
    pub fn of(results: &[TestResult], profile: Profile) -> Totals {
        let mut t = Totals::default();
        for r in results.iter().filter(|r| r.in_profile(profile)) {
            let pass = matches!(r.outcome, Outcome::Pass);
            match r.outcome {
                Outcome::Pass => t.passed += 1,
                Outcome::Fail(_) => t.failed += 1,
                Outcome::NotApplicable(_) => t.not_applicable += 1,
            }
            if r.test.is_core(profile) {
                t.core_total += 1;
                t.core_passed += usize::from(pass);
            } else {
                t.extended_total += 1;
                t.extended_passed += usize::from(pass);
            }
        }
        t
    }
}

fn section(profile: Profile, results: &[&TestResult], extended: bool) -> serde_json::Value {
    let passed = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Pass))
        .count();
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .map(|r| r.test.name)
        .collect();
    let skipped: Vec<&str> = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::NotApplicable(_)))
        .map(|r| r.test.name)
        .collect();
    let result = if !failed.is_empty() {
        "failure"
    } else if !skipped.is_empty() {
        "partial"
    } else {
        "success"
    };
    let mut out = json!({
        "result": result,
        "statistics": {"Passed": passed, "Skipped": skipped.len(), "Failed": failed.len()},
    });
    if !failed.is_empty() {
        out["failedTests"] = json!(failed);
    }
    if !skipped.is_empty() {
        out["skippedTests"] = json!(skipped);
    }
    if extended {
        // A feature is supported when every test that exercises it passes.
        let mut all = BTreeSet::new();
        let mut broken = BTreeSet::new();
        for r in results {
            for f in r.test.extended_features(profile) {
                all.insert(f);
                if !matches!(r.outcome, Outcome::Pass) {
                    broken.insert(f);
                }
            }
        }
        let supported: Vec<&str> = all.difference(&broken).copied().collect();
        let unsupported: Vec<&str> = broken.into_iter().collect();
        out["supportedFeatures"] = json!(supported);
        out["unsupportedFeatures"] = json!(unsupported);
    }
    out
}

/// The ConformanceReport YAML.
pub fn conformance_report(results: &[TestResult]) -> anyhow::Result<String> {
    let profiles: Vec<serde_json::Value> = Profile::ALL
        .iter()
        .filter_map(|&p| profile_report(p, results))
        .collect();
    let report = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "ConformanceReport",
        "implementation": {
            "organization": "sluice",
            "project": "sluice",
            // From Cargo.toml's `repository` (empty until the project has one).
            "url": env!("CARGO_PKG_REPOSITORY"),
            "version": env!("CARGO_PKG_VERSION"),
            "contact": [],
        },
        "date": today(),
        "gatewayAPIVersion": GATEWAY_API_VERSION,
        "gatewayAPIChannel": "experimental",
        "mode": "standalone",
        "profiles": profiles,
    });
    Ok(sluice::yaml::to_string(&report)?)
}

/// The report of `profile` (its `ProfileReport`), if any of its tests ran.
fn profile_report(profile: Profile, results: &[TestResult]) -> Option<serde_json::Value> {
    let of: Vec<&TestResult> = results.iter().filter(|r| r.in_profile(profile)).collect();
    if of.is_empty() {
        return None;
    }
    let core: Vec<&TestResult> = of
        .iter()
        .copied()
        .filter(|r| r.test.is_core(profile))
        .collect();
    let extended: Vec<&TestResult> = of
        .iter()
        .copied()
        .filter(|r| !r.test.is_core(profile))
        .collect();
    Some(json!({
        "name": profile.name(),
        "summary": format!(
            "Core tests {}. Extended tests {}.",
            summary(&core),
            summary(&extended)
        ),
        "core": section(profile, &core, false),
        "extended": section(profile, &extended, true),
    }))
}

/// The suite's `buildReportSummary` wording for one section.
fn summary(results: &[&TestResult]) -> String {
    let failed = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .count();
    let skipped = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::NotApplicable(_)))
        .count();
    if failed > 0 {
        format!("failed with {failed} test failures")
    } else if skipped > 0 {
        format!("partially succeeded with {skipped} test skips")
    } else {
        "succeeded".to_owned()
    }
}

/// Today's date (UTC) as YYYY-MM-DD, from the system clock.
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// docs/conformance.md: how the runner works, then per profile its totals,
/// a Core and an Extended table, and the Extended features.
pub fn markdown(results: &[TestResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Gateway API conformance ({profiles}, {GATEWAY_API_VERSION}, standalone)\n\n\
         Generated by sluice's conformance runner (`conformance/`), which\n\
         reads the upstream conformance manifests and reproduces the checks of the\n\
         upstream tests (`conformance/tests/*.go`) against sluice on loopback: echo\n\
         pods in-process, EndpointSlices synthesized per pod, each Gateway's\n\
         listener ports moved to free loopback ports (ports in requests, parentRefs\n\
         and redirect locations are translated back). It is not the upstream Go\n\
         suite; the report it writes (`--report`) has the upstream\n\
         `ConformanceReport` shape so that it can be compared.\n\n\
         Regenerate this page (the folder is the `conformance/` directory of\n\
         kubernetes-sigs/gateway-api at tag {GATEWAY_API_VERSION}):\n\n\
         ```sh\n\
         cargo run -p sluice-conformance -- --manifests ../shared/gateway-api/conformance --markdown docs/conformance.md\n\
         ```\n\n\
         Each test runs once and is reported in every profile whose Core and\n\
         Extended features hold all of its features (the suite's\n\
         `getConformanceProfilesForTest`: a test of Gateways alone counts in\n\
         all three profiles), and in the profile of the route kind it is about\n\
         (`HTTPRouteDisallowedKind` names HTTPRoute and TLSRoute, which no\n\
         profile holds together; `GRPCRouteNamedRule` names a feature upstream\n\
         puts in no profile). A test is Core in a profile when its features are\n\
         all Core there; Extended otherwise (the suite's `isTestExtended`). FAIL\n\
         lines give the runner's reason. Names are the upstream tests'\n\
         `ShortName`s.\n\n\
         Requests are judged as the suite judges them: where the upstream test\n\
         waits for an eventually consistent response, a request must be\n\
         answered as expected three times in a row (`RequiredConsecutiveSuccesses`)\n\
         within 30 s (`MaxTimeToConsistency`), and a test's requests are sent\n\
         concurrently, as its parallel subtests are. The run fails when a test\n\
         listed in `conformance/expected-pass.txt` does not pass, and when a\n\
         test passes that the list leaves out: the list is exactly what passes.\n\n\
         Scope: the tests whose manifests are in the {GATEWAY_API_VERSION}\n\
         `conformance/tests/` folder for Gateway, GatewayClass, HTTPRoute,\n\
         GRPCRoute, TLSRoute, ReferenceGrant, ListenerSet and BackendTLSPolicy\n\
         (TCPRoute, UDPRoute and mesh tests are not in it). Tests of features\n\
         sluice claims where the upstream test then checks nothing (it returns\n\
         early when the implementation supports the feature) check the\n\
         supported behaviour instead, and say so in the runner's code.\n\n\
         How the cluster is stood in for: the suite's TLS Secrets and CA\n\
         ConfigMaps are issued by CAs generated per run, which the runner's TLS\n\
         clients trust (with Go's server-name rules, as the suite's client); the\n\
         static-address placeholders become `127.0.0.1` (usable) and `192.0.2.1`\n\
         (unusable, TEST-NET-1); echo pods serve echo-basic's HTTP port (with\n\
         WebSocket on `/ws`), its h2c port, its HTTPS port (`TLS_SERVER_CERT`),\n\
         its gRPC service (`GRPC_ECHO_SERVER`: `GrpcEcho` over h2c, written with\n\
         `sluice::grpc_echo`) and its TCP echo server (`TCP_ECHO_SERVER`: the\n\
         welcome line, `PING`, `IS_TLS`, `TEST`, in cleartext and over TLS), and\n\
         its retry simulation; the service-types test's manual EndpointSlices\n\
         are filled with infra-backend-v1's pods.\n",
        profiles = Profile::ALL
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for &profile in Profile::ALL {
        let of: Vec<&TestResult> = results.iter().filter(|r| r.in_profile(profile)).collect();
        if of.is_empty() {
            continue;
        }
        let totals = Totals::of(results, profile);
        let _ = writeln!(s, "## {}\n", profile.name());
        let _ = writeln!(
            s,
            "Totals: {} tests, {} PASS, {} FAIL, {} not applicable. Core: {}/{} pass. Extended: {}/{} pass.\n",
            of.len(),
            totals.passed,
            totals.failed,
            totals.not_applicable,
            totals.core_passed,
            totals.core_total,
            totals.extended_passed,
            totals.extended_total
        );
        for (title, core) in [("Core", true), ("Extended", false)] {
            let _ = writeln!(s, "### {} {title}\n", profile.name());
            let _ = writeln!(s, "| Test | Features | Result |");
            let _ = writeln!(s, "|---|---|---|");
            for r in of.iter().filter(|r| r.test.is_core(profile) == core) {
                let result = match &r.outcome {
                    Outcome::Pass => "PASS".to_owned(),
                    Outcome::Fail(why) => format!("FAIL: {}", cell(why)),
                    Outcome::NotApplicable(why) => format!("not applicable: {}", cell(why)),
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {result} |",
                    r.test.name,
                    r.test.features.join(", ")
                );
            }
            let _ = writeln!(s);
        }
        let extended: Vec<&TestResult> = of
            .iter()
            .copied()
            .filter(|r| !r.test.is_core(profile))
            .collect();
        let sec = section(profile, &extended, true);
        let list = |v: &serde_json::Value| {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default()
        };
        let _ = writeln!(
            s,
            "Supported extended features: {}\n",
            list(&sec["supportedFeatures"])
        );
        let _ = writeln!(
            s,
            "Unsupported extended features: {}\n",
            list(&sec["unsupportedFeatures"])
        );
    }
    s.truncate(s.trim_end().len());
    s.push('\n');
    s
}

fn cell(s: &str) -> String {
    let s = s.replace('\n', " ").replace('|', "\\|");
    if s.len() > 160 {
        let mut end = 160;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    } else {
        s
    }
}
