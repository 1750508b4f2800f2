//! The demo's rollout acts (examples/rollout.yaml, with second-long
//! steps): an automatic promotion of `recommend-canary` through 0.5%, 5%,
//! 25% and 100%, and a `payments-canary` that starts failing at 25% and is
//! rolled back.
//!
//! Each step's printed batch is sized to give the canary one request fewer
//! than `minRequests`, so the step cannot pass while it is sent and its
//! counts (taken from the pods) are the step's exact split; then requests
//! go one by one until the canary answered one more, and the step passes
//! once its interval is over.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use http::StatusCode;
use serde_json::Value;

use super::{TempDir, find_route, kind_of, name_of, request_raw, write_documents};
use crate::echo::{EchoResponse, EchoServer};
use crate::rollout::{PolicyKey, RolloutStatus, Weights};
use crate::serve::RunningGateway;

const ROLLOUT_FILE: &str = "rollout.yaml";
const RECOMMEND_HOST: &str = "recommend.example.com";
const PAYMENTS_HOST: &str = "payments.example.com";
/// The demo's steps last a second (the example says minutes).
const DEMO_INTERVAL: &str = "1s";
/// minRequests of the demo's policies.
const PROMOTION_MIN_REQUESTS: u64 = 6;
const ROLLBACK_MIN_REQUESTS: u64 = 20;
/// Longest wait for a step to pass.
const STEP_DEADLINE: Duration = Duration::from_secs(30);

/// What one step of a rollout act sent and what the pods received.
#[derive(Debug, Clone)]
pub struct RolloutStepReport {
    /// `0.5%`, or `after` for the traffic once the rollout ended.
    pub step: String,
    /// The served shares, `99.5/0.5`.
    pub served: String,
    pub sent: usize,
    /// Requests received per Service, counted by its pods.
    pub received: BTreeMap<String, u64>,
    /// Requests not answered 200.
    pub failed: usize,
    /// Those failures were the point (a canary told to fail).
    pub failures_expected: bool,
}

/// One rollout act: its steps, how it ended and what traffic did then.
#[derive(Debug, Clone)]
pub struct RolloutAct {
    /// `default/recommend`.
    pub policy: String,
    pub steps: Vec<RolloutStepReport>,
    /// Complete or RolledBack.
    pub phase: String,
    pub message: String,
    /// Traffic once the rollout ended.
    pub after: RolloutStepReport,
    /// Requests sent one by one between batches, until the canary had
    /// answered minRequests (not in any step's counts), and how many of
    /// them failed.
    pub nudges: usize,
    pub nudges_failed: usize,
}

impl RolloutAct {
    /// Requests that failed without being meant to.
    pub fn unexpected_failures(&self) -> usize {
        self.steps
            .iter()
            .chain([&self.after])
            .filter(|s| !s.failures_expected)
            .map(|s| s.failed)
            .sum::<usize>()
            + self.nudges_failed
    }

    pub fn sent(&self) -> usize {
        self.steps
            .iter()
            .chain([&self.after])
            .map(|s| s.sent)
            .sum::<usize>()
            + self.nudges
    }

    pub fn expected_failures(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| s.failures_expected)
            .map(|s| s.failed)
            .sum()
    }
}

/// Give the examples' RolloutPolicies second-long steps and small
/// `minRequests`, so the acts take seconds, not hours.
pub(super) fn for_the_demo(files: &mut [(String, Vec<Value>)]) {
    for document in files.iter_mut().flat_map(|(_, d)| d.iter_mut()) {
        if kind_of(document) != "RolloutPolicy" {
            continue;
        }
        let min = if name_of(document) == "payments" {
            ROLLBACK_MIN_REQUESTS
        } else {
            PROMOTION_MIN_REQUESTS
        };
        if let Some(spec) = document.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("interval".into(), DEMO_INTERVAL.into());
            let analysis = spec
                .entry("analysis")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(analysis) = analysis.as_object_mut() {
                analysis.insert("minRequests".into(), min.into());
                analysis.insert("maxErrorRate".into(), "1%".into());
            }
        }
    }
}

/// What the acts share.
pub(super) struct Stage<'a> {
    pub out: &'a mut (dyn Write + Send),
    pub dir: &'a TempDir,
    pub files: &'a mut [(String, Vec<Value>)],
    pub pods: &'a BTreeMap<String, Vec<EchoServer>>,
    pub gateway: SocketAddr,
    pub running: &'a RunningGateway,
}

impl Stage<'_> {
    /// Set the weights of a route of rollout.yaml and write the file.
    fn set_weights(&mut self, route: &str, weights: [u64; 2]) -> anyhow::Result<()> {
        set_rollout_weights(self.files, self.dir, route, weights)
    }

    fn rollout(&self, policy: &str) -> Option<RolloutStatus> {
        rollout_status(self.running, policy)
    }

    async fn wait(
        &self,
        policy: &str,
        what: &str,
        check: impl Fn(&RolloutStatus) -> bool,
    ) -> anyhow::Result<RolloutStatus> {
        let deadline = Instant::now() + STEP_DEADLINE;
        loop {
            let current = self.rollout(policy);
            if let Some(r) = current.as_ref().filter(|r| check(r)) {
                return Ok(r.clone());
            }
            if Instant::now() > deadline {
                bail!("RolloutPolicy default/{policy} never {what}: {current:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Wait for the rollout of `policy` to end in `phase`; then send `n`
    /// requests for `host`. Returns its status then, when it got there,
    /// and the requests' counts.
    async fn end(
        &self,
        policy: &str,
        phase: crate::rollout::Phase,
        host: &str,
        n: usize,
    ) -> anyhow::Result<(RolloutStatus, Instant, RolloutStepReport)> {
        let what = format!("reached {}", phase.as_str());
        let status = self.wait(policy, &what, |r| r.phase == phase).await?;
        let reached = Instant::now();
        let after = self.batch(host, "after", served(&status), n).await;
        Ok((status, reached, after))
    }

    /// Send `n` requests for `host` (one connection, one at a time) and
    /// count what the pods received.
    async fn batch(&self, host: &str, step: &str, served: String, n: usize) -> RolloutStepReport {
        let before = super::counts(self.pods);
        let mut sender = None;
        let mut failed = 0;
        for i in 0..n {
            let path = format!("/demo/rollout/{i}");
            match request_raw(&mut sender, self.gateway, host, &[], &path).await {
                Ok((StatusCode::OK, _)) => {}
                Ok(_) => failed += 1,
                Err(_) => {
                    failed += 1;
                    sender = None;
                }
            }
        }
        let received = self.received_since(&before);
        RolloutStepReport {
            step: step.into(),
            served,
            sent: n,
            received,
            failed,
            failures_expected: false,
        }
    }

    /// Requests each Service's pods received since `before` (a reading of
    /// their counters), for the Services that received any.
    fn received_since(&self, before: &BTreeMap<String, Vec<u64>>) -> BTreeMap<String, u64> {
        super::counts(self.pods)
            .into_iter()
            .map(|(service, counts)| {
                let was: u64 = before.get(&service).map_or(0, |c| c.iter().sum());
                let now: u64 = counts.iter().sum();
                (service, now - was)
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Send requests one at a time until `service` answered `n` of them
    /// (whatever their status). Returns how many were sent and failed.
    async fn until(&self, host: &str, service: &str, n: usize) -> anyhow::Result<(usize, usize)> {
        self.until_or(host, service, n, None).await
    }

    /// [`Stage::until`], stopping early once the rollout of `policy` is
    /// rolled back (`stop`).
    async fn until_or(
        &self,
        host: &str,
        service: &str,
        n: usize,
        stop: Option<&str>,
    ) -> anyhow::Result<(usize, usize)> {
        let mut sender = None;
        let (mut sent, mut failed, mut seen) = (0, 0, 0);
        let deadline = Instant::now() + STEP_DEADLINE;
        while seen < n {
            if let Some(policy) = stop
                && self
                    .rollout(policy)
                    .is_some_and(|r| r.phase == crate::rollout::Phase::RolledBack)
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("{service} did not answer {n} requests for {host}");
            }
            sent += 1;
            match request_raw(&mut sender, self.gateway, host, &[], "/demo/rollout/more").await {
                Ok((status, body)) => {
                    failed += usize::from(status != StatusCode::OK);
                    let echoed: Option<EchoResponse> = serde_json::from_slice(&body).ok();
                    if echoed.is_some_and(|e| e.service == service) {
                        seen += 1;
                    }
                }
                Err(_) => {
                    failed += 1;
                    sender = None;
                }
            }
        }
        Ok((sent, failed))
    }
}

/// Set the weights of a route of rollout.yaml and write the file (the
/// acts and the live demo both).
pub(super) fn set_rollout_weights(
    files: &mut [(String, Vec<Value>)],
    dir: &TempDir,
    route: &str,
    weights: [u64; 2],
) -> anyhow::Result<()> {
    let (name, documents) = files
        .iter_mut()
        .find(|(name, _)| name == ROLLOUT_FILE)
        .ok_or_else(|| anyhow!("examples/{ROLLOUT_FILE} is missing"))?;
    let route = find_route(documents, route)?;
    let refs = super::backend_refs_mut(route)?;
    for (backend, weight) in refs.iter_mut().zip(weights) {
        if let Some(backend) = backend.as_object_mut() {
            backend.insert("weight".into(), weight.into());
        }
    }
    write_documents(&dir.path.join(name.as_str()), documents)
}

/// The status of the first rollout of RolloutPolicy `default/{policy}`.
pub(super) fn rollout_status(running: &RunningGateway, policy: &str) -> Option<RolloutStatus> {
    let key = PolicyKey {
        namespace: "default".into(),
        name: policy.into(),
    };
    running.rollouts().policies.get(&key)?.first().cloned()
}

/// The served shares over the spec's backends: `99.5/0.5`, `100/0`.
fn served(r: &RolloutStatus) -> String {
    let to = Weights::from_shares(&r.to);
    let served = Weights::from_shares(&r.served);
    served.ratio_text(&to.union_keys(&served))
}

/// Act 1: recommend 1000/0 -> 0/1000, promoted step by step.
pub(super) async fn promotion(stage: &mut Stage<'_>) -> anyhow::Result<RolloutAct> {
    let (stable, canary) = ("recommend-stable", "recommend-canary");
    writeln!(
        stage.out,
        "RolloutPolicy default/recommend: the route's weights go from 1000/0 to 0/1000 (a promotion of {canary});\n\
         sluice serves steps 0.5%, 5%, 25%, 100% instead, each held {DEMO_INTERVAL} and passed once the canary answered\n\
         {PROMOTION_MIN_REQUESTS} requests with at most 1% 5xx (examples/rollout.yaml says 5m and 200; the demo shortens them).\n\
         Each batch gives the canary one request fewer than that, so it is the step's exact split, counted by the pods."
    )?;
    stage.set_weights("recommend", [0, 1000])?;
    let started = Instant::now();
    let mut steps = Vec::new();
    let (mut nudges, mut nudges_failed) = (0, 0);
    for (step, n) in [("0.5%", 1000), ("5%", 100), ("25%", 20), ("100%", 5)] {
        let r = stage
            .wait("recommend", &format!("reached step {step}"), |r| {
                r.phase == crate::rollout::Phase::Progressing && r.step.as_deref() == Some(step)
            })
            .await?;
        steps.push(stage.batch(RECOMMEND_HOST, step, served(&r), n).await);
        let (sent, failed) = stage.until(RECOMMEND_HOST, canary, 1).await?;
        nudges += sent;
        nudges_failed += failed;
    }
    let (done, reached, after) = stage
        .end(
            "recommend",
            crate::rollout::Phase::Complete,
            RECOMMEND_HOST,
            100,
        )
        .await?;
    let took = reached - started;
    let act = RolloutAct {
        policy: "default/recommend".into(),
        steps,
        phase: "Complete".into(),
        message: done.message.clone(),
        after,
        nudges,
        nudges_failed,
    };
    print_act(stage.out, &act, [stable, canary])?;
    writeln!(
        stage.out,
        "  Complete {:.1} s after the weights changed: {}\n",
        took.as_secs_f64(),
        done.message
    )?;
    Ok(act)
}

/// Act 2: payments 1000/0 -> 0/1000; the canary starts answering 500 at
/// 25% and is rolled back.
pub(super) async fn rollback(stage: &mut Stage<'_>) -> anyhow::Result<RolloutAct> {
    let (stable, canary) = ("payments-stable", "payments-canary");
    writeln!(
        stage.out,
        "RolloutPolicy default/payments: 1000/0 to 0/1000 in steps 5%, 25%, 100% ({DEMO_INTERVAL} each, minRequests {ROLLBACK_MIN_REQUESTS},\n\
         at most 1% 5xx). At 25% the {canary} pod is told to answer 500 to everything."
    )?;
    stage.set_weights("payments", [0, 1000])?;
    let mut steps = Vec::new();
    let r = stage
        .wait("payments", "reached step 5%", |r| {
            r.step.as_deref() == Some("5%")
        })
        .await?;
    // 10 of 200 to the canary, then 10 more: minRequests.
    steps.push(stage.batch(PAYMENTS_HOST, "5%", served(&r), 200).await);
    let (nudges, nudges_failed) = stage.until(PAYMENTS_HOST, canary, 10).await?;
    let r = stage
        .wait("payments", "reached step 25%", |r| {
            r.step.as_deref() == Some("25%")
        })
        .await?;
    for pod in stage.pods.get(canary).into_iter().flatten() {
        pod.fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    }
    let failing = Instant::now();
    // Requests until the rollback: a handful of failures prove it, long
    // before minRequests (a rollback never waits for it).
    let before = super::counts(stage.pods);
    let (sent, failed) = stage
        .until_or(
            PAYMENTS_HOST,
            canary,
            ROLLBACK_MIN_REQUESTS as usize,
            Some("payments"),
        )
        .await?;
    let received = stage.received_since(&before);
    steps.push(RolloutStepReport {
        step: "25%".into(),
        served: served(&r),
        sent,
        received,
        failed,
        failures_expected: true,
    });
    let (back, reached, after) = stage
        .end(
            "payments",
            crate::rollout::Phase::RolledBack,
            PAYMENTS_HOST,
            200,
        )
        .await?;
    let took = reached - failing;
    for pod in stage.pods.get(canary).into_iter().flatten() {
        pod.fail_with(None);
    }
    let act = RolloutAct {
        policy: "default/payments".into(),
        steps,
        phase: "RolledBack".into(),
        message: back.message.clone(),
        after,
        nudges,
        nudges_failed,
    };
    print_act(stage.out, &act, [stable, canary])?;
    writeln!(
        stage.out,
        "  RolledBack {:.1} s after the canary began failing: {}\n",
        took.as_secs_f64(),
        back.message
    )?;
    Ok(act)
}

fn print_act(
    out: &mut (dyn Write + Send),
    act: &RolloutAct,
    services: [&str; 2],
) -> anyhow::Result<()> {
    let [stable, canary] = services;
    writeln!(
        out,
        "  {:<6}  {:>10}  {:>5}  {:>w1$}  {:>w2$}",
        "step",
        "served",
        "sent",
        stable,
        canary,
        w1 = stable.len(),
        w2 = canary.len()
    )?;
    for s in act.steps.iter().chain([&act.after]) {
        let got = |service: &str| s.received.get(service).copied().unwrap_or(0);
        let failed = if s.failed > 0 {
            format!("  ({} answered 5xx)", s.failed)
        } else {
            String::new()
        };
        writeln!(
            out,
            "  {:<6}  {:>10}  {:>5}  {:>w1$}  {:>w2$}{failed}",
            s.step,
            s.served,
            s.sent,
            got(stable),
            got(canary),
            w1 = stable.len(),
            w2 = canary.len()
        )?;
    }
    Ok(())
}
