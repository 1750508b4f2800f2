//! `conformance`: the Gateway API conformance suite's GATEWAY-HTTP,
//! GATEWAY-GRPC and GATEWAY-TLS checks, rewritten by us and run against
//! sluice on loopback.
//!
//! The upstream suite needs a cluster; this runner reads the same manifests
//! (`--manifests DIR` holding `base/manifests.yaml` and `tests/*.yaml` of
//! kubernetes-sigs/gateway-api v1.6.1), stands in for the cluster with
//! in-process echo pods and synthesized EndpointSlices (see `env`), starts
//! sluice in-process on each test's manifests, and makes the requests and
//! status checks each upstream test makes.
//!
//! Where things are: `registry` is the one list of tests (profile,
//! features, manifests, checks); the checks live by area in `suite`
//! (Gateway and HTTPRoute), `grpc` (GRPCRoute), `tls_route` (TLSRoute),
//! `listenerset`, `client_cert`, `backend_tls` and `backend_tls_policy`,
//! written with `ctx` (the running test), `client` (the suite's requests),
//! `expect` (what a response must look like) and `status` (what published
//! status must say); `env`, `backend` and `ws` stand in for the cluster and
//! its echo pods; `report` writes the results.
//!
//! Output: one line per test (PASS, FAIL with the reason, N/A with why),
//! totals, optionally the upstream `ConformanceReport` YAML (`--report`) and
//! the table of `docs/conformance.md` (`--markdown`). Exit status 1 when a
//! test listed in `conformance/expected-pass.txt` fails, when a test passes
//! that the list leaves out, or when the list names no test of ours.

mod backend;
mod backend_tls;
mod backend_tls_policy;
mod client;
mod client_cert;
mod ctx;
mod env;
mod expect;
mod grpc;
mod listenerset;
mod registry;
mod report;
mod status;
mod suite;
mod tls_route;
mod ws;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

use crate::ctx::Ctx;
use crate::env::{ManifestFile, Pods, PortMap};
use crate::registry::{Applicability, Checks, Test};
use crate::report::{Outcome, TestResult};

/// Bound on one test (a test that hangs fails, the run goes on).
const TEST_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, Parser)]
#[command(
    about = "Run the Gateway API conformance checks (GATEWAY-HTTP, GATEWAY-GRPC, GATEWAY-TLS) against sluice"
)]
struct Args {
    /// Folder of upstream conformance manifests (`base/manifests.yaml`, `tests/*.yaml`).
    #[arg(long)]
    manifests: PathBuf,
    /// Write a ConformanceReport YAML here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Write the markdown table of docs/conformance.md here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Run only this test (repeatable).
    #[arg(long)]
    only: Vec<String>,
    /// Tests that must pass (one name a line).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/expected-pass.txt"))]
    expected: PathBuf,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("conformance: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let started = Instant::now();
    let base = env::parse_file(&args.manifests.join("base/manifests.yaml"), "base.yaml")?;
    let mut pods = Pods::default();
    pods.start_deployments(std::slice::from_ref(&base)).await?;

    let expected = read_expected(&args.expected)?;
    let mut results = Vec::new();
    for test in registry::TESTS {
        if !args.only.is_empty() && !args.only.iter().any(|o| o == test.name) {
            continue;
        }
        let t0 = Instant::now();
        let outcome = match test.applies {
            Applicability::NotApplicable(why) => Outcome::NotApplicable(why.to_owned()),
            Applicability::Runs(checks) => {
                match run_one(&args.manifests, &base, &mut pods, test, checks).await {
                    Ok(()) => Outcome::Pass,
                    Err(e) => Outcome::Fail(format!("{e:#}")),
                }
            }
        };
        let line = match &outcome {
            Outcome::Pass => format!("PASS  {}", test.name),
            Outcome::Fail(why) => format!("FAIL  {}: {}", test.name, one_line(why)),
            Outcome::NotApplicable(why) => format!("N/A   {}: {why}", test.name),
        };
        println!("{line}  ({} ms)", t0.elapsed().as_millis());
        results.push(TestResult { test, outcome });
    }

    println!(
        "\n{} tests in {:.1} s: {} passed, {} failed, {} not applicable",
        results.len(),
        started.elapsed().as_secs_f64(),
        results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Pass))
            .count(),
        results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
            .count(),
        results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::NotApplicable(_)))
            .count(),
    );
    for &profile in registry::Profile::ALL {
        let t = report::Totals::of(&results, profile);
        let tests = t.passed + t.failed + t.not_applicable;
        if tests > 0 {
            println!(
                "  {}: {tests} tests, {} passed, {} failed, {} not applicable (core {}/{} passed, extended {}/{} passed)",
                profile.name(),
                t.passed,
                t.failed,
                t.not_applicable,
                t.core_passed,
                t.core_total,
                t.extended_passed,
                t.extended_total
            );
        }
    }

    if let Some(path) = &args.report {
        write_file(path, &report::conformance_report(&results)?)?;
        println!("report written to {}", path.display());
    }
    if let Some(path) = &args.markdown {
        write_file(path, &report::markdown(&results))?;
        println!("markdown written to {}", path.display());
    }

    let problems = verdict(&results, &expected, &args.expected);
    for problem in &problems {
        println!("{problem}");
    }
    Ok(problems.is_empty())
}

/// What makes the run fail, one line each: a test listed in `expected`
/// that did not pass (a regression), a test that passed but is not listed
/// (the list must say what runs, so that a test dropping out of it is
/// seen), and a listed name no test has (a typo, which would never run).
fn verdict(results: &[TestResult], expected: &BTreeSet<String>, list: &Path) -> Vec<String> {
    let list = list.display();
    let mut problems = Vec::new();
    for r in results {
        let listed = expected.contains(r.test.name);
        match (&r.outcome, listed) {
            (Outcome::Pass, false) => problems.push(format!(
                "UNLISTED: {} passes but {list} leaves it out: add it",
                r.test.name
            )),
            (Outcome::Fail(_) | Outcome::NotApplicable(_), true) => problems.push(format!(
                "REGRESSION: {} is in {list} but did not pass",
                r.test.name
            )),
            _ => {}
        }
    }
    for name in expected {
        if !registry::TESTS.iter().any(|t| t.name == name) {
            problems.push(format!(
                "UNKNOWN: {list} lists {name}, which is no test of the runner"
            ));
        }
    }
    problems
}

fn one_line(s: &str) -> String {
    let s = s.replace('\n', " ");
    if s.len() > 400 {
        let mut end = 400;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    } else {
        s
    }
}

fn read_expected(path: &Path) -> anyhow::Result<BTreeSet<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeSet::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Set up one test's manifests, start sluice on them, run its checks, stop.
async fn run_one(
    dir: &Path,
    base: &ManifestFile,
    pods: &mut Pods,
    test: &Test,
    checks: Checks,
) -> anyhow::Result<()> {
    let mut files = vec![base.clone()];
    for (i, manifest) in test.manifests.iter().enumerate() {
        files.push(env::parse_file(
            &dir.join("tests").join(manifest),
            &format!("test-{i}.yaml"),
        )?);
    }
    pods.start_deployments(&files).await?;
    let temp = TempDir::new()?;
    let mut ports = PortMap::default();
    env::render(&temp.0, &files, pods, &mut ports)?;
    let gateway = sluice::serve::start(sluice::serve::ServeConfig {
        paths: vec![temp.0.clone()],
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        admin: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        crds: Vec::new(),
    })
    .await
    .context("cannot start sluice")?;
    let mut cx = Ctx {
        dir: temp.0.clone(),
        files,
        ports,
        pods,
        gateway,
    };
    let result = match tokio::time::timeout(TEST_DEADLINE, checks(&mut cx)).await {
        Ok(result) => result,
        Err(_) => Err(anyhow::anyhow!("did not finish within {TEST_DEADLINE:?}")),
    };
    cx.gateway.shutdown().await;
    drop(temp);
    result
}

/// A directory of rendered manifests, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<TempDir> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("sluice-conformance-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Write `text` to `path`, creating its folder first (`target/` may not
/// exist yet when the target directory is elsewhere).
fn write_file(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn the_list_must_say_exactly_what_passes() {
        let (a, b) = (&registry::TESTS[0], &registry::TESTS[1]);
        let results = [
            TestResult {
                test: a,
                outcome: Outcome::Pass,
            },
            TestResult {
                test: b,
                outcome: Outcome::Fail("no".into()),
            },
        ];
        let list = Path::new("expected-pass.txt");
        assert!(verdict(&results, &names(&[a.name]), list).is_empty());
        assert_eq!(
            verdict(&results, &names(&[]), list),
            [format!(
                "UNLISTED: {} passes but expected-pass.txt leaves it out: add it",
                a.name
            )]
        );
        assert_eq!(
            verdict(&results, &names(&[a.name, b.name]), list),
            [format!(
                "REGRESSION: {} is in expected-pass.txt but did not pass",
                b.name
            )]
        );
        assert_eq!(
            verdict(&results, &names(&[a.name, "HTTPRouteNoSuchTest"]), list),
            [
                "UNKNOWN: expected-pass.txt lists HTTPRouteNoSuchTest, which is no test of the runner"
            ]
        );
    }
}
