//! RolloutPolicy through the binary: a route's weight change served in
//! steps, judged by the incoming backends' outcomes, rolled back, paused,
//! resumed after a restart, with consistent users; status, metrics and
//! `sluice check`.
//!
//! Steps are held by `minRequests`: a step cannot pass before the incoming
//! backends answered that many requests, so a test sends a batch smaller
//! than that, checks the exact split of the batch, then sends requests one
//! by one until the incoming backends reached `minRequests`, and stops:
//! the step passes at the next evaluation without a request in flight.
//! Every wait polls `/status` with a deadline that only bounds a hang.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;

use crate::support::{Pods, Sluice, admin_get, by_service, free_port, gateway, static_service};

const HOST: &str = "shop.example.com";
const DEADLINE: Duration = Duration::from_secs(60);

/// HTTPRoute default/shop: stable and canary (Services on port 8080).
fn route(stable: u64, canary: u64) -> String {
    format!(
        r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: shop, namespace: default}}
spec:
  parentRefs: [{{name: gw, namespace: default}}]
  hostnames: [{HOST}]
  rules:
  - backendRefs:
    - {{name: stable, port: 8080, weight: {stable}}}
    - {{name: canary, port: 8080, weight: {canary}}}
"#
    )
}

/// RolloutPolicy default/`name` targeting HTTPRoute shop, with `spec`
/// (lines indented by two spaces) after its targetRefs.
fn policy(name: &str, spec: &str) -> String {
    format!(
        r#"
---
apiVersion: sluice.dev/v1alpha1
kind: RolloutPolicy
metadata: {{name: {name}, namespace: default}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: shop}}]
{spec}"#
    )
}

struct Shop {
    /// Kept running for the test's length.
    stable: Pods,
    canary: Pods,
    sluice: Sluice,
}

impl Shop {
    /// The gateway on stable and canary pods (one each), the route at
    /// `weights`, and `policy` (file policy.yaml) when given.
    async fn start(weights: (u64, u64), policy: Option<String>, args: &[&str]) -> Shop {
        let stable = Pods::start("default", "stable", 1).await;
        let canary = Pods::start("default", "canary", 1).await;
        let mut files = vec![
            ("gateway.yaml", gateway()),
            (
                "backends.yaml",
                format!("{}{}", stable.manifests(), canary.manifests()),
            ),
            ("route.yaml", route(weights.0, weights.1)),
        ];
        if let Some(p) = policy {
            files.push(("policy.yaml", p));
        }
        let sluice = Sluice::start_with(&files, args).await;
        Shop {
            stable,
            canary,
            sluice,
        }
    }

    /// [`Shop::start`] at `from` with policy `shop` (`spec`); once it
    /// governs the route, change the weights to `to` and wait for the
    /// first step. Returns the rollout's status then.
    async fn promoting(
        spec: &str,
        from: (u64, u64),
        to: (u64, u64),
        first: &'static str,
    ) -> (Shop, Value) {
        let shop = Shop::start(from, Some(policy("shop", spec)), &[]).await;
        wait_rollout(&shop.sluice, "shop", "first seen", phase("Complete")).await;
        shop.set_weights(to.0, to.1);
        let r = wait_rollout(&shop.sluice, "shop", "first step", at("Progressing", first)).await;
        (shop, r)
    }

    fn set_weights(&self, stable: u64, canary: u64) {
        self.sluice.write("route.yaml", &route(stable, canary));
    }

    /// `n` GETs (with `headers`) on one connection, counted by service
    /// (`<500>` and the like when the gateway or a backend failed).
    async fn tally(&self, n: usize, headers: &[(&str, &str)]) -> BTreeMap<String, usize> {
        let mut conn = self.sluice.connect().await;
        by_service(&conn.tally(n, HOST, "/", headers).await)
    }

    /// Send requests one by one until the rollout of policy `shop` is
    /// RolledBack (looking after each response); the errors served until
    /// then. Paced at about 50 requests a second (a request every 20 ms),
    /// so that a loaded test machine's scheduling does not decide; gives
    /// up after `limit` errors plus 200 requests.
    async fn errors_until_rolled_back(&self, limit: usize) -> usize {
        let mut conn = self.sluice.connect().await;
        let mut errors = 0;
        for _ in 0..limit + 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let status = policy_status(&self.sluice, "shop").await;
            if status["rollouts"][0]["phase"] == "RolledBack" {
                return errors;
            }
            if conn.get(HOST, "/").await.status != StatusCode::OK {
                errors += 1;
            }
            if errors > limit {
                break;
            }
        }
        errors
    }

    /// Send requests one by one until `backend` answered `n` of them.
    async fn until(&self, backend: &str, n: usize) {
        let mut conn = self.sluice.connect().await;
        let mut seen = 0;
        while seen < n {
            let r = conn.get(HOST, "/").await;
            if r.status == StatusCode::OK && r.echo().service == backend
                || r.status != StatusCode::OK && backend == "<error>"
            {
                seen += 1;
            }
        }
    }
}

/// The status of RolloutPolicy default/`name`, or `Null`.
async fn policy_status(sluice: &Sluice, name: &str) -> Value {
    let all = sluice.status().await;
    all.as_array()
        .expect("/status is an array")
        .iter()
        .find(|o| o["kind"] == "RolloutPolicy" && o["metadata"]["name"] == name)
        .map(|o| o["status"].clone())
        .unwrap_or(Value::Null)
}

/// Poll until the first rollout of policy `name` satisfies `check`.
async fn wait_rollout(
    sluice: &Sluice,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let status = policy_status(sluice, name).await;
        let rollout = &status["rollouts"][0];
        if check(rollout) {
            return rollout.clone();
        }
        assert!(
            Instant::now() < deadline,
            "never {what}; last status {status:#}; log:\n{}",
            sluice.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until the clock (sluice's and the test's: one machine) is `ms`
/// past the step start the rollout `r` shows.
async fn past_step_start(r: &Value, ms: i64) {
    let started: k8s_openapi::jiff::Timestamp = r["stepStartedAt"]
        .as_str()
        .expect("stepStartedAt")
        .parse()
        .expect("a time");
    let until = started + k8s_openapi::jiff::SignedDuration::from_millis(ms);
    while k8s_openapi::jiff::Timestamp::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn at(phase: &'static str, step: &'static str) -> impl Fn(&Value) -> bool {
    move |r| r["phase"] == phase && r["step"] == step
}

fn phase(phase: &'static str) -> impl Fn(&Value) -> bool {
    move |r| r["phase"] == phase
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| (k.to_string(), *n))
        .collect()
}

/// The shares of `from`/`to`/`served` as `name share` pairs.
fn shares(list: &Value) -> Vec<(String, String)> {
    list.as_array()
        .map(|l| {
            l.iter()
                .map(|b| {
                    (
                        b["name"].as_str().unwrap_or("").to_string(),
                        b["share"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// The seeds' ladder: 1000/0 to 0/1000 with 0.5%, 5%, 25%, 100% serves
/// exactly 995/5, 950/50, 750/250, then 0/1000, each step passing once the
/// canary answered minRequests; then Complete. Status and metrics follow.
#[tokio::test]
async fn a_weight_change_is_served_step_by_step_exactly_and_completes() {
    let spec = "  steps: ['0.5%', '5%', '25%', '100%']
  interval: 300ms
  analysis: {minRequests: 6, maxErrorRate: '1%', maxLatency: 5s}
";
    let shop = Shop::start((1000, 0), Some(policy("shop", spec)), &[]).await;
    let s = &shop.sluice;
    let first = wait_rollout(s, "shop", "first seen", phase("Complete")).await;
    assert_eq!(
        first["message"],
        "serving the spec shares; a change of the route's weights starts a rollout"
    );
    shop.set_weights(0, 1000);
    // Each batch gives the canary 5 requests: one short of minRequests.
    for (step, index, batch, stable, canary) in [
        ("0.5%", 0, 1000, 995, 5),
        ("5%", 1, 100, 95, 5),
        ("25%", 2, 20, 15, 5),
        ("100%", 3, 5, 0, 5),
    ] {
        let r = wait_rollout(s, "shop", step, at("Progressing", step)).await;
        assert_eq!(r["stepIndex"], index);
        assert_eq!(
            shop.tally(batch, &[]).await,
            counts(&[("stable", stable), ("canary", canary)]),
            "step {step}"
        );
        let r = wait_rollout(s, "shop", "counted", |r| r["requests"] == 5).await;
        assert_eq!(r["step"], step, "{r:#}");
        shop.until("canary", 1).await;
    }
    let done = wait_rollout(s, "shop", "complete", phase("Complete")).await;
    assert!(
        done["message"].as_str().is_some_and(
            |m| m.starts_with("complete: the last step (100%) passed (6 requests, 5xx 0%")
        ),
        "{done:#}"
    );
    assert_eq!(
        shares(&done["served"]),
        pairs(&[("stable", "0%"), ("canary", "100%")])
    );
    assert_eq!(shop.tally(50, &[]).await, counts(&[("canary", 50)]));

    // The status shape: GEP-713 ancestors, then the rollouts.
    let status = policy_status(s, "shop").await;
    let ancestor = &status["ancestors"][0];
    assert_eq!(
        ancestor["ancestorRef"],
        serde_json::json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "default", "name": "gw"})
    );
    assert_eq!(ancestor["controllerName"], "sluice.dev/gateway-controller");
    assert_eq!(ancestor["conditions"][0]["type"], "Accepted");
    assert_eq!(ancestor["conditions"][0]["status"], "True");
    assert_eq!(
        ancestor["conditions"][0]["message"],
        "governs HTTPRoute default/shop rule 0"
    );
    let r = &status["rollouts"][0];
    assert_eq!(
        (r["route"].as_str(), r["rule"].as_u64()),
        (Some("shop"), Some(0))
    );
    assert_eq!(shares(&r["from"]), pairs(&[("stable", "100%")]));
    assert_eq!(
        shares(&r["to"]),
        pairs(&[("stable", "0%"), ("canary", "100%")])
    );
    assert_eq!(r["to"][1]["weight"], 1000);
    assert!(r["stepStartedAt"].as_str().is_some(), "{r:#}");

    let metrics = s.metrics().await;
    let labels = r#"policy="default/shop",route="default/shop",rule="0""#;
    for line in [
        format!(r#"sluice_rollout_phase{{{labels},phase="Complete"}} 1"#),
        format!(r#"sluice_rollout_phase{{{labels},phase="Progressing"}} 0"#),
        format!(r#"sluice_rollout_step_percent{{{labels}}} 100.0"#),
        format!(r#"sluice_rollout_served_share{{{labels},backend="default/canary:8080"}} 1.0"#),
        format!(r#"sluice_rollout_served_share{{{labels},backend="default/stable:8080"}} 0.0"#),
        format!(r#"sluice_rollout_transitions_total{{{labels},phase="Progressing"}} 4"#),
        format!(r#"sluice_rollout_transitions_total{{{labels},phase="Complete"}} 1"#),
        format!(r#"sluice_rollout_transitions_total{{{labels},phase="Waiting"}} 1"#),
    ] {
        assert!(metrics.contains(&line), "missing {line} in\n{metrics}");
    }
}

/// A step passes only when its interval elapsed and the incoming backends
/// answered minRequests (the stable backend's answers do not count).
#[tokio::test]
async fn a_step_waits_for_its_interval_and_its_requests() {
    let spec = "  steps: ['50%', '100%']
  interval: 500ms
  analysis: {minRequests: 6}
";
    let (shop, r) = Shop::promoting(spec, (1, 0), (0, 1), "50%").await;
    let s = &shop.sluice;
    assert_eq!(
        shop.tally(10, &[]).await,
        counts(&[("stable", 5), ("canary", 5)])
    );
    // Well past the interval, counted by sluice's clock, with 5 of 6
    // requests: still at the step.
    past_step_start(&r, 1500).await;
    let r = wait_rollout(s, "shop", "counted", |r| r["requests"] == 5).await;
    assert_eq!(r["step"], "50%", "{r:#}");
    assert!(
        r["message"]
            .as_str()
            .is_some_and(|m| m.contains("it passes after 500ms and 6 request(s) to canary")),
        "{r:#}"
    );
    shop.until("canary", 1).await;
    wait_rollout(s, "shop", "next step", at("Progressing", "100%")).await;
}

/// The seeds' trap: canary weight set, canary Service forgotten. The
/// rollout waits, serving the shares from before (no 500s), and says why;
/// once the Service exists, the first step starts.
#[tokio::test]
async fn an_unresolved_incoming_backend_makes_the_rollout_wait() {
    let stable = Pods::start("default", "stable", 1).await;
    let canary = Pods::start("default", "canary", 1).await;
    let spec = "  steps: ['50%', '100%']\n  interval: 1h\n";
    let sluice = Sluice::start(&[
        ("gateway.yaml", gateway()),
        ("backends.yaml", stable.manifests()),
        ("route.yaml", route(1000, 0)),
        ("policy.yaml", policy("shop", spec)),
    ])
    .await;
    wait_rollout(&sluice, "shop", "first seen", phase("Complete")).await;
    sluice.write("route.yaml", &route(995, 5));
    let r = wait_rollout(&sluice, "shop", "waiting", phase("Waiting")).await;
    assert_eq!(
        r["message"],
        "waiting before the first step: default/canary:8080 does not resolve (BackendNotFound); \
         serving 100/0 (stable/canary), the shares from before the change"
    );
    let mut conn = sluice.connect().await;
    assert_eq!(
        by_service(&conn.tally(400, HOST, "/", &[]).await),
        counts(&[("stable", 400)]),
        "no 500 for the forgotten canary"
    );
    // An EndpointSlice without ready endpoints is not enough either.
    sluice.write(
        "canary.yaml",
        &canary.manifests_with_readiness(|_| Some(false)),
    );
    wait_rollout(&sluice, "shop", "no ready endpoint", |r| {
        r["phase"] == "Waiting"
            && r["message"]
                .as_str()
                .is_some_and(|m| m.contains("has no ready endpoint"))
    })
    .await;
    sluice.write("canary.yaml", &canary.manifests());
    wait_rollout(&sluice, "shop", "first step", at("Progressing", "50%")).await;
    // Half way from 100/0 to 99.5/0.5: 99.75/0.25.
    assert_eq!(
        by_service(&conn.tally(400, HOST, "/", &[]).await),
        counts(&[("stable", 399), ("canary", 1)])
    );
}

/// A canary whose every request sluice answers itself (502: nothing
/// listens on its endpoint) is judged by those 5xx and rolled back as soon
/// as minRequests are counted, long before its interval. `from` is served
/// until the weights change again, which starts a new rollout from it.
#[tokio::test]
async fn errors_sluice_answers_for_the_canary_roll_it_back_at_once() {
    let stable = Pods::start("default", "stable", 1).await;
    let spec = "  steps: ['50%', '100%']
  interval: 1h
  analysis: {minRequests: 10, maxErrorRate: '10%'}
";
    let sluice = Sluice::start(&[
        ("gateway.yaml", gateway()),
        ("backends.yaml", stable.manifests()),
        // Resolves, with a ready endpoint, where nothing listens.
        (
            "canary.yaml",
            static_service("canary", None, 8080, None, free_port()),
        ),
        ("route.yaml", route(1, 0)),
        ("policy.yaml", policy("shop", spec)),
    ])
    .await;
    wait_rollout(&sluice, "shop", "first seen", phase("Complete")).await;
    sluice.write("route.yaml", &route(0, 1));
    wait_rollout(&sluice, "shop", "first step", at("Progressing", "50%")).await;
    let mut conn = sluice.connect().await;
    // minRequests (10) does not hold back a rollback: a few 502s prove it.
    // One request at a time: the rollback may land in the middle of any
    // batch (it is taken within ms of the 502 that forces it).
    let mut answered = 0;
    for _ in 0..40 {
        if policy_status(&sluice, "shop").await["rollouts"][0]["phase"] == "RolledBack" {
            break;
        }
        let seen = by_service(&conn.tally(1, HOST, "/", &[]).await);
        answered += seen.get("<502>").copied().unwrap_or(0);
    }
    assert!(
        (2..10).contains(&answered),
        "rolled back after a few 502s, before minRequests: {answered}"
    );
    let r = wait_rollout(&sluice, "shop", "rolled back", phase("RolledBack")).await;
    let message = r["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("canary 5xx ")
            && message.contains(
                " (100%) is above maxErrorRate 10% at 99% confidence (its rate is above "
            )
            && message.ends_with(" (0%) over the same time: rolled back to 100/0 (stable/canary)"),
        "{r:#}"
    );
    assert_eq!(r["step"], "50%", "the step it failed at");
    assert_eq!(shares(&r["served"]), pairs(&[("stable", "100%")]));
    assert_eq!(
        by_service(&conn.tally(100, HOST, "/", &[]).await),
        counts(&[("stable", 100)])
    );
    // The weights change again: a new rollout, from the shares served.
    sluice.write("route.yaml", &route(1, 1));
    let r = wait_rollout(&sluice, "shop", "new rollout", at("Progressing", "50%")).await;
    assert_eq!(shares(&r["from"]), pairs(&[("stable", "100%")]));
    assert_eq!(
        shares(&r["to"]),
        pairs(&[("stable", "50%"), ("canary", "50%")])
    );
    assert_eq!(
        shares(&r["served"]),
        pairs(&[("stable", "75%"), ("canary", "25%")])
    );
}

/// The last step is judged like the others: a canary failing at 100% is
/// rolled back from there.
#[tokio::test]
async fn the_last_step_is_judged_like_the_others() {
    let spec = "  steps: ['100%']
  interval: 1h
  analysis: {minRequests: 5, maxErrorRate: '1%'}
";
    let (shop, _) = Shop::promoting(spec, (1, 0), (0, 1), "100%").await;
    let s = &shop.sluice;
    assert_eq!(shop.tally(4, &[]).await, counts(&[("canary", 4)]));
    shop.canary.servers[0].fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    let served = shop.errors_until_rolled_back(20).await;
    assert!(served <= 20, "{served} errors served");
    let r = wait_rollout(s, "shop", "rolled back", phase("RolledBack")).await;
    let message = r["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("canary 5xx ")
            && message.contains(" is above maxErrorRate 1% at 99% confidence"),
        "{r:#}"
    );
    assert_eq!(shop.tally(20, &[]).await, counts(&[("stable", 20)]));
}

/// onFailure: Pause holds the step it failed at (traffic keeps that
/// split) until the policy's spec changes; then the step is judged again.
#[tokio::test]
async fn pause_on_failure_holds_the_step_until_the_policy_changes() {
    let spec = |min: u32| {
        format!(
            "  steps: ['50%', '100%']
  interval: 300ms
  analysis: {{minRequests: {min}, maxErrorRate: '1%'}}
  onFailure: Pause
"
        )
    };
    let (shop, _) = Shop::promoting(&spec(4), (1, 0), (0, 1), "50%").await;
    let s = &shop.sluice;
    shop.canary.servers[0].fail_with(Some(StatusCode::SERVICE_UNAVAILABLE));
    // Paused after two or three 503s (whatever minRequests says); the
    // step's split is held.
    let seen = shop.tally(8, &[]).await;
    assert_eq!(seen.values().sum::<usize>(), 8, "{seen:?}");
    assert!(seen.get("<503>").is_some_and(|n| *n >= 2), "{seen:?}");
    let r = wait_rollout(s, "shop", "paused", at("Paused", "50%")).await;
    let message = r["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("canary 5xx ")
            && message.contains(" (100%) is above maxErrorRate 1% at 99% confidence")
            && message.ends_with(": paused at 50% until the policy's spec changes"),
        "{r:#}"
    );
    // Held: the canary recovers, traffic flows at the step's split, and
    // nothing moves until the policy changes.
    shop.canary.servers[0].fail_with(None);
    assert_eq!(
        shop.tally(40, &[]).await,
        counts(&[("stable", 20), ("canary", 20)])
    );
    let r = policy_status(s, "shop").await["rollouts"][0].clone();
    assert_eq!(
        (r["phase"].as_str(), r["step"].as_str()),
        (Some("Paused"), Some("50%"))
    );
    s.write("policy.yaml", &policy("shop", &spec(5)));
    let r = wait_rollout(s, "shop", "resumed", at("Progressing", "50%")).await;
    assert!(
        r["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("the policy changed: resumed")),
        "{r:#}"
    );
    shop.until("canary", 5).await;
    wait_rollout(s, "shop", "next step", at("Progressing", "100%")).await;
}

/// spec.paused holds the step (even past its interval with its requests
/// counted) but a breached gate still rolls back.
#[tokio::test]
async fn paused_holds_the_step_but_still_rolls_back() {
    let spec = |paused: bool| {
        format!(
            "  steps: ['50%', '100%']
  interval: 300ms
  analysis: {{minRequests: 4, maxErrorRate: '1%'}}
  paused: {paused}
"
        )
    };
    let (shop, _) = Shop::promoting(&spec(false), (1, 0), (0, 1), "50%").await;
    let s = &shop.sluice;
    s.write("policy.yaml", &policy("shop", &spec(true)));
    let r = wait_rollout(s, "shop", "paused", at("Paused", "50%")).await;
    assert!(
        r["message"]
            .as_str()
            .is_some_and(|m| m.contains("(spec.paused is true)")),
        "{r:#}"
    );
    assert_eq!(
        shop.tally(20, &[]).await,
        counts(&[("stable", 10), ("canary", 10)])
    );
    past_step_start(&r, 1500).await;
    let r = wait_rollout(s, "shop", "counted", |r| r["requests"] == 10).await;
    assert_eq!(
        (r["phase"].as_str(), r["step"].as_str()),
        (Some("Paused"), Some("50%"))
    );
    shop.canary.servers[0].fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    let served = shop.errors_until_rolled_back(20).await;
    assert!(served <= 20, "{served} errors served");
    let r = wait_rollout(s, "shop", "rolled back", phase("RolledBack")).await;
    let message = r["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("canary 5xx ")
            && message.contains(" is above maxErrorRate 1% at 99% confidence"),
        "{r:#}"
    );
}

/// A weight change mid-rollout starts a new rollout from the shares being
/// served: at 5% of 100/0 -> 0/100 (95/5 served), 50/50 ramps from 95/5.
#[tokio::test]
async fn a_weight_change_mid_rollout_starts_from_the_served_shares() {
    let spec = "  steps: ['5%', '100%']
  interval: 1h
  analysis: {minRequests: 1000}
";
    let (shop, _) = Shop::promoting(spec, (100, 0), (0, 100), "5%").await;
    let s = &shop.sluice;
    assert_eq!(
        shop.tally(20, &[]).await,
        counts(&[("stable", 19), ("canary", 1)])
    );
    shop.set_weights(50, 50);
    let r = wait_rollout(s, "shop", "new rollout", |r| {
        r["phase"] == "Progressing" && r["to"][0]["weight"] == 50
    })
    .await;
    assert_eq!(r["step"], "5%");
    assert_eq!(
        shares(&r["from"]),
        pairs(&[("stable", "95%"), ("canary", "5%")])
    );
    // 95% + 5% of the way to 50%: 92.75/7.25, i.e. 371/29.
    assert_eq!(
        shares(&r["served"]),
        pairs(&[("stable", "92.75%"), ("canary", "7.25%")])
    );
    assert_eq!(
        shop.tally(400, &[]).await,
        counts(&[("stable", 371), ("canary", 29)])
    );
}

/// A policy removed mid-rollout: the spec shares apply at once.
#[tokio::test]
async fn a_policy_removed_mid_rollout_lets_the_spec_apply_at_once() {
    let spec = "  steps: ['5%', '100%']\n  interval: 1h\n";
    let (shop, _) = Shop::promoting(spec, (1, 0), (0, 1), "5%").await;
    let s = &shop.sluice;
    assert_eq!(
        shop.tally(20, &[]).await,
        counts(&[("stable", 19), ("canary", 1)])
    );
    std::fs::remove_file(s.path("policy.yaml")).expect("remove the policy");
    // The table without the policy is in service once its status is.
    let deadline = Instant::now() + DEADLINE;
    while policy_status(s, "shop").await != Value::Null {
        assert!(Instant::now() < deadline, "the policy is still in /status");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(shop.tally(50, &[]).await, counts(&[("canary", 50)]));
}

/// A policy created with nothing in flight changes nothing until the next
/// weight change. Created together with a weight change (one file), it
/// ramps from the shares served before.
#[tokio::test]
async fn a_new_policy_governs_from_the_next_weight_change() {
    let spec = "  steps: ['50%', '100%']\n  interval: 1h\n";
    let shop = Shop::start((0, 1), None, &[]).await;
    let s = &shop.sluice;
    assert_eq!(shop.tally(10, &[]).await, counts(&[("canary", 10)]));
    s.write("policy.yaml", &policy("shop", spec));
    let r = wait_rollout(s, "shop", "governed", phase("Complete")).await;
    assert_eq!(
        shares(&r["served"]),
        pairs(&[("stable", "0%"), ("canary", "100%")])
    );
    assert_eq!(shop.tally(10, &[]).await, counts(&[("canary", 10)]));
    shop.set_weights(1, 1);
    let r = wait_rollout(s, "shop", "rollout", at("Progressing", "50%")).await;
    assert_eq!(shares(&r["from"]), pairs(&[("canary", "100%")]));
    assert_eq!(
        shop.tally(4, &[]).await,
        counts(&[("stable", 1), ("canary", 3)])
    );

    // Created together with a weight change (one file written at once):
    // the rollout ramps from what the route served before.
    s.write(
        "third.yaml",
        &route(1, 0)
            .replace("name: shop,", "name: third,")
            .replace(HOST, "third.example.com"),
    );
    s.eventually("third.example.com", "/", |r| r.status == StatusCode::OK)
        .await;
    let third = format!(
        "{}{}",
        route(0, 1)
            .replace("name: shop,", "name: third,")
            .replace(HOST, "third.example.com"),
        policy("third", spec).replace("name: shop}]", "name: third}]")
    );
    s.write("third.yaml", &third);
    let r = wait_rollout(
        s,
        "third",
        "ramps from what was served",
        at("Progressing", "50%"),
    )
    .await;
    assert_eq!(shares(&r["from"]), pairs(&[("stable", "100%")]));
}

/// Two policies on one rule: the oldest wins, the other is Conflicted. A
/// policy whose target does not exist (no such route, no such rule name)
/// is not accepted: TargetNotFound.
#[tokio::test]
async fn conflicts_and_missing_targets_are_reported() {
    let spec = "  steps: ['100%']\n  interval: 1m\n";
    let older = policy("older", spec).replace(
        "namespace: default}",
        "namespace: default, creationTimestamp: '2024-01-01T00:00:00Z'}",
    );
    let newer = policy("newer", spec).replace(
        "namespace: default}",
        "namespace: default, creationTimestamp: '2024-02-01T00:00:00Z'}",
    );
    let missing = policy("missing", spec).replace("name: shop}]", "name: nope}]");
    let no_rule =
        policy("no-rule", spec).replace("name: shop}]", "name: shop, sectionName: main}]");
    let shop = Shop::start(
        (1, 0),
        Some(format!("{newer}{older}{missing}{no_rule}")),
        &[],
    )
    .await;
    let s = &shop.sluice;
    wait_rollout(s, "older", "governing", phase("Complete")).await;
    let newer = policy_status(s, "newer").await;
    let c = &newer["ancestors"][0]["conditions"][0];
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("Conflicted"))
    );
    assert_eq!(
        c["message"],
        "HTTPRoute default/shop rule 0 is governed by the older RolloutPolicy default/older"
    );
    assert_eq!(newer["rollouts"], serde_json::json!([]));
    let older = policy_status(s, "older").await;
    assert_eq!(older["ancestors"][0]["conditions"][0]["reason"], "Accepted");
    for (name, message) in [
        ("missing", "HTTPRoute default/nope does not exist"),
        (
            "no-rule",
            "HTTPRoute default/shop has no rule named \"main\"",
        ),
    ] {
        let status = policy_status(s, name).await;
        let ancestor = &status["ancestors"][0];
        assert_eq!(ancestor["ancestorRef"]["kind"], "HTTPRoute", "{status:#}");
        let c = &ancestor["conditions"][0];
        assert_eq!(
            (c["status"].as_str(), c["reason"].as_str()),
            (Some("False"), Some("TargetNotFound"))
        );
        assert_eq!(c["message"], message);
    }
}

/// Bad policies are refused with a message naming object and field;
/// nothing else is affected.
#[tokio::test]
async fn bad_policies_are_refused_naming_the_field() {
    let good = policy("good", "  steps: ['100%']\n  interval: 1m\n");
    let bad = [
        (
            "not-increasing",
            "  steps: ['5%', '5%', '100%']\n  interval: 1m\n",
            "spec.steps[1]",
            "does not increase",
        ),
        (
            "short",
            "  steps: ['5%', '50%']\n  interval: 1m\n",
            "spec.steps[1]",
            "must be \"100%\"",
        ),
        (
            "decimals",
            "  steps: ['0.0625%', '100%']\n  interval: 1m\n",
            "spec.steps[0]",
            "more than 3 decimals",
        ),
        (
            "over",
            "  steps: ['150%']\n  interval: 1m\n",
            "spec.steps[0]",
            "over 100%",
        ),
        (
            "duration",
            "  steps: ['100%']\n  interval: 5 minutes\n",
            "spec.interval",
            "not a Gateway API duration",
        ),
        (
            "rate",
            "  steps: ['100%']\n  interval: 1m\n  analysis: {maxErrorRate: 'lots'}\n",
            "spec.analysis.maxErrorRate",
            "not a percentage",
        ),
        (
            "failure",
            "  steps: ['100%']\n  interval: 1m\n  onFailure: Retry\n",
            "spec.onFailure",
            "unknown variant",
        ),
        (
            "both",
            "  steps: ['100%']\n  interval: 1m\n  consistentBy: {header: a, cookie: b}\n",
            "spec.consistentBy",
            "exactly one",
        ),
    ];
    let mut files = String::new();
    for (name, spec, _, _) in &bad {
        files.push_str(&policy(name, spec));
    }
    let shop = Shop::start((1, 1), Some(format!("{files}{good}")), &[]).await;
    let s = &shop.sluice;
    let errors = s.errors().await;
    for (name, _, field, why) in &bad {
        let object = format!("RolloutPolicy default/{name}");
        let found = errors.as_array().expect("errors").iter().any(|e| {
            e["object"] == object.as_str()
                && e["field"] == *field
                && e["message"].as_str().is_some_and(|m| m.contains(why))
        });
        assert!(found, "{object} {field} {why}: {errors:#}");
        assert_eq!(
            policy_status(s, name).await,
            Value::Null,
            "{name} is refused"
        );
    }
    wait_rollout(s, "good", "the good one", phase("Complete")).await;
    assert_eq!(
        shop.tally(10, &[]).await,
        counts(&[("stable", 5), ("canary", 5)])
    );
}

/// consistentBy a header: a user on the canary at one step stays there at
/// every later step; a rollback moves everyone back. Requests without the
/// header keep the exact split.
#[tokio::test]
async fn consistent_users_stay_on_the_canary_and_move_back_on_rollback() {
    let spec = "  steps: ['10%', '50%', '100%']
  interval: 300ms
  analysis: {minRequests: 250, maxErrorRate: '1%'}
  consistentBy: {header: x-user}
";
    let shop = Shop::start((1, 0), Some(policy("shop", spec)), &[]).await;
    let s = &shop.sluice;
    wait_rollout(s, "shop", "first seen", phase("Complete")).await;
    shop.set_weights(0, 1);
    let users: Vec<String> = (0..200).map(|i| format!("user-{i}")).collect();
    let on_canary = |step: &'static str| {
        let users = users.clone();
        async move {
            wait_rollout(s, "shop", step, at("Progressing", step)).await;
            let mut conn = s.connect().await;
            let mut canary = Vec::new();
            for (i, user) in users.iter().enumerate() {
                let a = conn
                    .get_with(HOST, "/", &[("x-user", user)])
                    .await
                    .echo()
                    .service;
                if i < 20 {
                    // Again: the same user gets the same backend.
                    let b = conn
                        .get_with(HOST, "/", &[("x-user", user)])
                        .await
                        .echo()
                        .service;
                    assert_eq!(a, b, "{user} moved within a step");
                }
                if a == "canary" {
                    canary.push(user.clone());
                }
            }
            canary
        }
    };
    let at_10 = on_canary("10%").await;
    // Without the header: the exact 90/10 split.
    assert_eq!(
        shop.tally(10, &[]).await,
        counts(&[("stable", 9), ("canary", 1)])
    );
    while policy_status(s, "shop").await["rollouts"][0]["step"] == "10%" {
        shop.tally(50, &[]).await;
    }
    let at_50 = on_canary("50%").await;
    assert!(
        at_10.iter().all(|u| at_50.contains(u)),
        "a canary user at 10% left it at 50%: {at_10:?} {at_50:?}"
    );
    assert!(
        (5..=40).contains(&at_10.len()) && (70..=130).contains(&at_50.len()),
        "users spread like the shares: {} at 10%, {} at 50%",
        at_10.len(),
        at_50.len()
    );
    shop.canary.servers[0].fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    // Failing canary requests until minRequests are counted.
    while policy_status(s, "shop").await["rollouts"][0]["phase"] != "RolledBack" {
        shop.tally(50, &[]).await;
    }
    let mut conn = s.connect().await;
    for user in &at_50 {
        let r = conn.get_with(HOST, "/", &[("x-user", user)]).await;
        assert_eq!(r.pod(), "stable-0", "{user} is back on stable");
    }
}

/// A restarted gateway resumes the recorded step: the split after the
/// restart is the step's, not the spec's. `sluice check` shows both.
#[tokio::test]
async fn a_restart_resumes_the_recorded_step_never_the_spec() {
    let spec = "  steps: ['5%', '100%']
  interval: 1h
  analysis: {minRequests: 1000}
";
    let (mut shop, before) = Shop::promoting(spec, (1, 0), (0, 1), "5%").await;
    assert_eq!(
        shop.tally(20, &[]).await,
        counts(&[("stable", 19), ("canary", 1)])
    );
    shop.sluice.restart().await;
    assert!(shop.sluice.log_before_restart().contains("Progressing"));
    // Served from the first table on: no wait for a rollout to show.
    assert_eq!(
        shop.tally(20, &[]).await,
        counts(&[("stable", 19), ("canary", 1)])
    );
    let after = policy_status(&shop.sluice, "shop").await["rollouts"][0].clone();
    assert_eq!(
        (after["phase"].as_str(), after["step"].as_str()),
        (Some("Progressing"), Some("5%"))
    );
    assert_eq!(
        after["stepStartedAt"], before["stepStartedAt"],
        "the step's clock goes on"
    );
    assert!(
        shop.sluice.log().contains("resuming recorded rollouts"),
        "{}",
        shop.sluice.log()
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check")
        .arg("-f")
        .arg(shop.sluice.dir.path())
        .arg("--state-dir")
        .arg(shop.sluice.state.path())
        .output()
        .expect("sluice check runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("served shares: the rollout state in "),
        "{text}"
    );
    assert!(
        text.contains(
            "rule 0: RolloutPolicy default/shop: Progressing at step 5%; spec and served shares:"
        ),
        "{text}"
    );
    let line = |text: &str, name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("default/{name}:8080")))
            .unwrap_or_else(|| panic!("no {name} line in {text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(
        line(&text, "stable").starts_with("default/stable:8080 weight 0 0% served 95%"),
        "{text}"
    );
    assert!(
        line(&text, "canary").starts_with("default/canary:8080 weight 1 100% served 5%"),
        "{text}"
    );
    // Without the state: the spec shares, said so.
    let empty = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "-f"])
        .arg(shop.sluice.dir.path())
        .arg("--state-dir")
        .arg(empty.path())
        .output()
        .expect("sluice check runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("a gateway starting on these manifests serves the spec shares"),
        "{text}"
    );
    assert!(
        line(&text, "canary").starts_with("default/canary:8080 weight 1 100% served 100%"),
        "{text}"
    );
}

/// A rule seen for the first time, with nothing recorded, serves its spec
/// shares as they are: there is no `from` to ramp from.
#[tokio::test]
async fn a_first_start_serves_the_spec_shares() {
    let spec = "  steps: ['5%', '100%']\n  interval: 1h\n";
    let shop = Shop::start((0, 1), Some(policy("shop", spec)), &[]).await;
    let r = wait_rollout(&shop.sluice, "shop", "first seen", phase("Complete")).await;
    assert_eq!(
        shares(&r["served"]),
        pairs(&[("stable", "0%"), ("canary", "100%")])
    );
    assert_eq!(shop.tally(20, &[]).await, counts(&[("canary", 20)]));
    let saved = std::fs::read_to_string(shop.sluice.state.path().join("rollouts.json"))
        .expect("the state file is written");
    assert!(saved.contains("\"phase\": \"Complete\""), "{saved}");
}

/// When the state cannot be written, sluice says so (log, /readyz, the
/// policy's status) and goes on in memory.
#[tokio::test]
async fn an_unwritable_state_dir_is_reported_and_rollouts_go_on_in_memory() {
    let blocker = tempfile::tempdir().expect("temp dir");
    let file = blocker.path().join("a-file");
    std::fs::write(&file, "not a directory").expect("write");
    let state = file.join("state").display().to_string();
    let spec = "  steps: ['5%', '100%']\n  interval: 1h\n";
    let shop = Shop::start((1, 0), Some(policy("shop", spec)), &["--state-dir", &state]).await;
    let s = &shop.sluice;
    wait_rollout(s, "shop", "first seen", phase("Complete")).await;
    let (code, body) = admin_get(s.admin, "/readyz").await.expect("admin answers");
    assert_eq!(code, StatusCode::OK, "still ready");
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.starts_with("ready\nrollout state not saved: cannot create "),
        "{body}"
    );
    let status = policy_status(s, "shop").await;
    let saved = status["ancestors"][0]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "StateSaved")
        .cloned()
        .expect("a StateSaved condition");
    assert_eq!(
        (saved["status"].as_str(), saved["reason"].as_str()),
        (Some("False"), Some("StateNotWritable"))
    );
    assert!(
        saved["message"]
            .as_str()
            .is_some_and(|m| m.contains("rollouts go on in memory only")),
        "{saved:#}"
    );
    assert!(
        s.log().contains("rollout state: cannot create"),
        "{}",
        s.log()
    );
    shop.set_weights(0, 1);
    wait_rollout(s, "shop", "first step", at("Progressing", "5%")).await;
    assert_eq!(
        shop.tally(20, &[]).await,
        counts(&[("stable", 19), ("canary", 1)])
    );
}

/// A backendRef removed and another added in one edit: the removed one
/// keeps being served, ramped down with the steps, instead of being cut.
#[tokio::test]
async fn a_removed_backend_ref_is_ramped_down_not_cut() {
    let spec = "  steps: ['50%', '100%']
  interval: 300ms
  analysis: {minRequests: 2}
";
    let shop = Shop::start((1, 1), Some(policy("shop", spec)), &[]).await;
    let v3 = Pods::start("default", "v3", 1).await;
    let s = &shop.sluice;
    s.write("v3.yaml", &v3.manifests());
    wait_rollout(s, "shop", "first seen", phase("Complete")).await;
    s.write(
        "route.yaml",
        &route(1, 1).replace("name: canary", "name: v3"),
    );
    let r = wait_rollout(s, "shop", "first step", at("Progressing", "50%")).await;
    assert_eq!(
        shares(&r["served"]),
        pairs(&[("stable", "50%"), ("v3", "25%"), ("canary", "25%")])
    );
    // v3 gets 1 of 4: one short of minRequests.
    assert_eq!(
        shop.tally(4, &[]).await,
        counts(&[("stable", 2), ("v3", 1), ("canary", 1)])
    );
    shop.until("v3", 1).await;
    wait_rollout(s, "shop", "last step", at("Progressing", "100%")).await;
    assert_eq!(
        shop.tally(4, &[]).await,
        counts(&[("stable", 2), ("v3", 2)])
    );
}

/// maxLatency judges the incoming backends' p99 over the step.
#[tokio::test]
async fn a_slow_canary_fails_the_latency_gate() {
    let spec = "  steps: ['50%', '100%']
  interval: 1h
  analysis: {minRequests: 3, maxLatency: 100ms}
";
    let (shop, _) = Shop::promoting(spec, (1, 0), (0, 1), "50%").await;
    let s = &shop.sluice;
    shop.canary.servers[0].delay_by(Duration::from_millis(300));
    // The gate may act before minRequests (it gates promotion only), so
    // requests go one by one until the rollback rather than in a batch
    // whose split the rollback would change halfway.
    let mut conn = s.connect().await;
    for _ in 0..40 {
        if policy_status(s, "shop").await["rollouts"][0]["phase"] == "RolledBack" {
            break;
        }
        assert_eq!(conn.get(HOST, "/").await.status, StatusCode::OK);
    }
    let r = wait_rollout(s, "shop", "rolled back", phase("RolledBack")).await;
    assert!(
        r["requests"].as_u64().unwrap_or(0) >= 2,
        "one slow response alone proves nothing: {r:#}"
    );
    let message = r["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("canary slower than 100ms ")
            && message
                .contains(" (100%) is above 1% (maxLatency 100ms is a p99) at 99% confidence"),
        "{r:#}"
    );
    assert_eq!(
        r["slow"], r["requests"],
        "every canary response was slow: {r:#}"
    );
}

/// A GRPCRoute named like the governed HTTPRoute, sending its calls to the
/// same canary Service: its requests and errors are counted apart (the
/// route kind is part of the counters' key), so they neither fail nor fill
/// the HTTPRoute's step.
#[tokio::test]
async fn a_grpcroute_of_the_same_name_never_counts_for_the_rollout() {
    let spec = "  steps: ['50%', '100%']
  interval: 300ms
  analysis: {minRequests: 10, maxErrorRate: '1%'}
";
    let shop = Shop::start((1, 0), Some(policy("shop", spec)), &[]).await;
    let s = &shop.sluice;
    wait_rollout(s, "shop", "first seen", phase("Complete")).await;
    s.write(
        "grpc.yaml",
        &crate::support::route_of_kind(
            "GRPCRoute",
            "default",
            "shop",
            "  hostnames: [api.example.com]\n  rules:\n  - backendRefs: [{name: canary, port: 8080}]\n",
        ),
    );
    let grpc_calls = |n: usize| async move {
        for _ in 0..n {
            // The echo pods answer HTTP, not gRPC: only the count matters.
            let _ = sluice::grpc_echo::call_h2c(s.addr(), "api.example.com", "Echo", &[]).await;
        }
    };
    crate::support::poll_until(
        "the GRPCRoute serves",
        || s.log(),
        async || {
            grpc_calls(1).await;
            shop.canary.requests() > 0
        },
    )
    .await;
    shop.set_weights(0, 1);
    wait_rollout(s, "shop", "first step", at("Progressing", "50%")).await;

    // 20 failing calls to the canary through the GRPCRoute: twice
    // minRequests, all 5xx.
    shop.canary.servers[0].fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    grpc_calls(20).await;
    shop.canary.servers[0].fail_with(None);
    let grpc_errors = r#"route="GRPCRoute default/shop",rule="0",backend="default/canary:8080",backend_namespace="default",backend_name="canary",backend_port="8080",code="500"} 20"#;
    let metrics = s.metrics().await;
    assert!(
        metrics.contains(grpc_errors),
        "{grpc_errors} not in\n{metrics}"
    );

    // The HTTPRoute's step counts its own 5 canary answers, nothing else.
    shop.until("canary", 5).await;
    let r = wait_rollout(s, "shop", "counted", |r| {
        r["requests"] == 5 || r["phase"] != "Progressing"
    })
    .await;
    assert_eq!(
        (
            r["phase"].as_str(),
            r["requests"].as_u64(),
            r["errors"].as_u64()
        ),
        (Some("Progressing"), Some(5), Some(0)),
        "{r:#}"
    );
    shop.until("canary", 5).await;
    wait_rollout(s, "shop", "next step", at("Progressing", "100%")).await;
}

/// Sessions and consistent users on one governed rule (docs/sessions.md):
/// a valid session wins over the rollout's key and its step, so a session
/// started on the canary survives a rollback; keyed users without a
/// session follow the rollout, back to stable.
#[tokio::test]
async fn a_session_on_the_canary_survives_a_rollback_while_keyed_users_follow_it() {
    use crate::sessions::{cookie_pair, set_cookies};
    let spec = "  steps: ['50%', '100%']
  interval: 300ms
  analysis: {minRequests: 20, maxErrorRate: '1%'}
  consistentBy: {header: x-user}
";
    let with_sessions = |stable, canary| {
        format!(
            "{}    sessionPersistence: {{sessionName: shop-session}}\n",
            route(stable, canary)
        )
    };
    let shop = Shop::start((1, 0), Some(policy("shop", spec)), &[]).await;
    let s = &shop.sluice;
    wait_rollout(s, "shop", "first seen", phase("Complete")).await;
    // Sessions on, the weights unchanged: no rollout.
    s.write("route.yaml", &with_sessions(1, 0));
    crate::support::poll_until(
        "sessions start",
        || s.log(),
        async || !set_cookies(&s.connect().await.get(HOST, "/").await).is_empty(),
    )
    .await;
    s.write("route.yaml", &with_sessions(0, 1));
    wait_rollout(s, "shop", "first step", at("Progressing", "50%")).await;

    // At 50%, keyed users are placed by their key (each request would
    // start a session; these users never send it back).
    let mut conn = s.connect().await;
    let mut placed: BTreeMap<String, String> = BTreeMap::new();
    let mut canary_session = None;
    for i in 0..40 {
        let user = format!("user-{i}");
        let r = conn.get_with(HOST, "/", &[("x-user", &user)]).await;
        let service = r.echo().service;
        if service == "canary" && canary_session.is_none() {
            let cookies = set_cookies(&r);
            assert_eq!(cookies.len(), 1, "{:?}", r.headers);
            canary_session = Some(cookie_pair(&cookies[0]));
        }
        placed.insert(user, service);
    }
    let session = canary_session.expect("a user placed on the canary");
    let stable_user = placed
        .iter()
        .find(|(_, service)| *service == "stable")
        .map(|(user, _)| user.clone())
        .expect("a user placed on stable");
    // The session wins over a key the rollout places on stable.
    let pinned = [
        ("cookie", session.as_str()),
        ("x-user", stable_user.as_str()),
    ];
    for _ in 0..5 {
        let r = conn.get_with(HOST, "/", &pinned).await;
        assert_eq!(r.pod(), "canary-0", "the session's pod");
        assert!(set_cookies(&r).is_empty(), "the session goes on");
    }

    // The canary fails: rolled back to 100/0.
    shop.canary.servers[0].fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    while policy_status(s, "shop").await["rollouts"][0]["phase"] != "RolledBack" {
        shop.tally(20, &[]).await;
    }
    shop.canary.servers[0].fail_with(None);

    // Keyed users without a session follow the rollout back to stable; the
    // session stays on its canary pod (a rollback does not end sessions).
    for user in placed.keys() {
        let r = conn.get_with(HOST, "/", &[("x-user", user)]).await;
        assert_eq!(r.echo().service, "stable", "{user} follows the rollback");
    }
    let r = conn.get_with(HOST, "/", &pinned).await;
    assert_eq!(r.pod(), "canary-0", "the session survives the rollback");
    assert_eq!(shop.tally(10, &[]).await, counts(&[("stable", 10)]));
}

/// A healthy canary (both sides answer every 200th request with a 500:
/// 0.5%, deterministic) with `maxErrorRate: 1%` looked at after every
/// error: promoted. The old gate compared the running share with the
/// limit at every look and rolled back 3 of 10 such canaries.
#[tokio::test]
async fn a_healthy_canary_at_half_the_limit_is_promoted() {
    promoted_while_both_sides_fail_one_in_200(
        "  steps: ['10%', '50%', '100%']
  interval: 300ms
  analysis: {minRequests: 100, maxErrorRate: '1%'}
",
    )
    .await;
}

/// The same healthy canary judged against the stable alone (baseline
/// Stable, maxDegradation 25%, no absolute limit): promoted too, the last
/// step judged against the stable's recorded rate.
#[tokio::test]
async fn a_healthy_canary_judged_against_the_stable_is_promoted() {
    promoted_while_both_sides_fail_one_in_200(
        "  steps: ['10%', '50%', '100%']
  interval: 300ms
  analysis: {minRequests: 100, baseline: Stable, maxDegradation: '25%'}
",
    )
    .await;
}

/// Both sides answer 1 request in 200 with a 500 (0.5%): the rollout
/// governed by `spec` completes, never rolled back, its message saying
/// what the counts could have caught.
async fn promoted_while_both_sides_fail_one_in_200(spec: &str) {
    let (shop, _) = Shop::promoting(spec, (1, 0), (0, 1), "10%").await;
    shop.stable.servers[0].fail_every(200, StatusCode::INTERNAL_SERVER_ERROR);
    shop.canary.servers[0].fail_every(200, StatusCode::INTERNAL_SERVER_ERROR);
    let mut conn = shop.sluice.connect().await;
    let deadline = Instant::now() + DEADLINE;
    while Instant::now() < deadline {
        conn.tally(100, HOST, "/", &[]).await;
        let r = policy_status(&shop.sluice, "shop").await["rollouts"][0].clone();
        assert_ne!(r["phase"], "RolledBack", "{r:#}");
        if r["phase"] == "Complete" {
            let message = r["message"].as_str().unwrap_or("");
            assert!(message.contains("would be caught at 99%"), "{r:#}");
            return;
        }
    }
    panic!(
        "never complete: {:#}",
        policy_status(&shop.sluice, "shop").await
    );
}

/// Both sides at 3% 5xx (every 33rd request), judged against the stable:
/// a shared outage does not blame the canary, which is promoted; the
/// status shows both sides' counts.
#[tokio::test]
async fn a_shared_outage_does_not_blame_the_canary() {
    let spec = "  steps: ['50%', '100%']
  interval: 300ms
  analysis: {minRequests: 600, maxErrorRate: '1%', baseline: Stable, maxDegradation: '25%'}
";
    let (shop, _) = Shop::promoting(spec, (1, 0), (0, 1), "50%").await;
    shop.stable.servers[0].fail_every(33, StatusCode::SERVICE_UNAVAILABLE);
    shop.canary.servers[0].fail_every(33, StatusCode::SERVICE_UNAVAILABLE);
    let mut conn = shop.sluice.connect().await;
    let mut excused = false;
    let deadline = Instant::now() + DEADLINE;
    while Instant::now() < deadline {
        conn.tally(100, HOST, "/", &[]).await;
        let r = policy_status(&shop.sluice, "shop").await["rollouts"][0].clone();
        assert_ne!(r["phase"], "RolledBack", "{r:#}");
        let message = r["message"].as_str().unwrap_or("");
        excused |= message.contains("but the stable fails too");
        if r["phase"] == "Complete" {
            assert!(excused, "the message said the stable fails too: {r:#}");
            return;
        }
    }
    panic!(
        "never complete: {:#}",
        policy_status(&shop.sluice, "shop").await
    );
}

/// A canary failing 10 times as often as the stable (5% against 0.5%),
/// judged against the stable: rolled back at its first or second step,
/// never promoted to the last. With steps that have the traffic to tell
/// (minRequests 300: on a loaded machine a 300 ms step ends at
/// minRequests, and 100 canary requests, about 5 errors, may not be
/// enough at 99%, as `sluice check`'s power lines say).
#[tokio::test]
async fn a_canary_at_ten_times_the_stable_s_errors_is_rolled_back_early() {
    let spec = "  steps: ['10%', '50%', '100%']
  interval: 300ms
  analysis: {minRequests: 300, baseline: Stable, maxDegradation: '25%'}
";
    let (shop, _) = Shop::promoting(spec, (1, 0), (0, 1), "10%").await;
    shop.stable.servers[0].fail_every(200, StatusCode::INTERNAL_SERVER_ERROR);
    shop.canary.servers[0].fail_every(20, StatusCode::INTERNAL_SERVER_ERROR);
    let mut conn = shop.sluice.connect().await;
    let deadline = Instant::now() + DEADLINE;
    let mut steps_seen = std::collections::BTreeSet::new();
    while Instant::now() < deadline {
        conn.tally(50, HOST, "/", &[]).await;
        let r = policy_status(&shop.sluice, "shop").await["rollouts"][0].clone();
        assert_ne!(r["phase"], "Complete", "promoted: {r:#}");
        if let Some(step) = r["step"].as_str() {
            steps_seen.insert(step.to_string());
        }
        if r["phase"] == "RolledBack" {
            assert!(
                !steps_seen.contains("100%"),
                "rolled back only at the last step: {steps_seen:?} {r:#}"
            );
            let message = r["message"].as_str().unwrap_or("");
            assert!(message.contains("99% confidence"), "{r:#}");
            return;
        }
    }
    panic!(
        "never rolled back: {:#}",
        policy_status(&shop.sluice, "shop").await
    );
}

/// A canary answering 500 to everything, judged against the stable: rolled
/// back after a handful of errors (at most 20 served), whatever
/// minRequests says; the message names the counts on both sides, the
/// bound and the confidence.
#[tokio::test]
async fn a_canary_failing_everything_is_rolled_back_after_a_handful_of_errors() {
    let spec = "  steps: ['10%', '50%', '100%']
  interval: 1h
  analysis: {minRequests: 200, baseline: Stable, maxDegradation: '25%'}
";
    let (shop, _) = Shop::promoting(spec, (1, 0), (0, 1), "10%").await;
    shop.stable.servers[0].fail_every(200, StatusCode::INTERNAL_SERVER_ERROR);
    shop.canary.servers[0].fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    let served = shop.errors_until_rolled_back(20).await;
    assert!(served <= 20, "{served} errors served");
    let r = wait_rollout(&shop.sluice, "shop", "rolled back", phase("RolledBack")).await;
    let message = r["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("canary 5xx ")
            && message.contains(" (100%) against the stable's ")
            && message.contains(
                "worse than 1.25x the stable's rate (maxDegradation 25%) at 99% confidence (evidence "
            )
            && message.ends_with(": rolled back to 100/0 (stable/canary)"),
        "{r:#}"
    );
}

/// `/overview` carries a rollout's evidence over time while it is in
/// flight (what the dashboard charts): the counts the gates judged on
/// both sides since the first step, each side's bounds around its rate,
/// the limits, and the step boundaries, through a step that passes; then
/// the rollback, its point showing the canary's lower bound past the
/// limit. The persisted status does not carry it.
#[tokio::test]
async fn overview_carries_the_evidence_over_time_of_a_rollout_in_flight() {
    let spec = "  steps: ['50%', '100%']
  interval: 300ms
  analysis: {minRequests: 20, maxErrorRate: '5%', maxLatency: 5s, baseline: Stable, maxDegradation: '25%'}
";
    let (shop, first) = Shop::promoting(spec, (1, 0), (0, 1), "50%").await;
    // The canary fails 1 in 25 (4%, under the limit), the stable nothing:
    // every error the client sees is the canary's (its 25th request
    // fails).
    shop.canary.servers[0].fail_every(25, StatusCode::INTERNAL_SERVER_ERROR);
    let mut conn = shop.sluice.connect().await;
    let mut errors = 0u64;
    while shop.canary.requests() < 25 {
        if conn.get(HOST, "/").await.status != StatusCode::OK {
            errors += 1;
        }
    }
    past_step_start(&first, 300).await;
    wait_rollout(
        &shop.sluice,
        "shop",
        "second step",
        at("Progressing", "100%"),
    )
    .await;
    // Fewer than minRequests at the last step: it stays in flight.
    for _ in 0..5 {
        if conn.get(HOST, "/").await.status != StatusCode::OK {
            errors += 1;
        }
    }
    let (canary, stable) = (shop.canary.requests(), shop.stable.requests());
    let column = |h: &Value, name: &str| -> Vec<f64> {
        h[name]
            .as_array()
            .unwrap_or_else(|| panic!("history.{name} is an array: {h:#}"))
            .iter()
            .map(|v| v.as_f64().unwrap_or(f64::NAN))
            .collect()
    };
    // The history takes the last counts at the next look (a second at
    // most).
    let deadline = Instant::now() + DEADLINE;
    let history = loop {
        let (code, body) = admin_get(shop.sluice.admin, "/overview")
            .await
            .expect("admin answers");
        assert_eq!(code, StatusCode::OK);
        let o: Value = serde_json::from_slice(&body).expect("JSON");
        let h = o["rollouts"][0]["history"].clone();
        if h.is_object()
            && column(&h, "requests").last() == Some(&(canary as f64))
            && column(&h, "stableRequests").last() == Some(&(stable as f64))
        {
            break h;
        }
        assert!(
            Instant::now() < deadline,
            "the history never caught up with {canary} canary and {stable} stable requests: {o:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let t = column(&history, "t");
    assert!(t.len() >= 2, "{history:#}");
    assert_eq!(t[0], 0.0);
    assert!(t.windows(2).all(|w| w[0] <= w[1]), "{t:?}");
    assert!(history["since"].is_string(), "{history:#}");
    assert_eq!(column(&history, "errors").last(), Some(&(errors as f64)));
    assert_eq!(column(&history, "stableErrors").last(), Some(&0.0));
    assert!(errors >= 1, "1 in 25 of at least 25 canary requests");
    let (requests, failed) = (column(&history, "requests"), column(&history, "errors"));
    let rates = &history["errorRate"];
    let (low, high) = (column(rates, "canaryLow"), column(rates, "canaryHigh"));
    for i in 0..t.len() {
        for name in ["stableRequests", "slow", "stableSlow", "stableErrors"] {
            assert_eq!(column(&history, name).len(), t.len(), "{name}");
        }
        if requests[i] > 0.0 {
            // Bounds are given to 4 significant digits.
            let rate = failed[i] / requests[i];
            assert!(
                low[i] <= rate * 1.001 && rate * 0.999 <= high[i] && high[i] <= 1.0,
                "point {i}: {rate} in [{}, {}]",
                low[i],
                high[i]
            );
        }
    }
    // The band narrows with the counts: below the no-data 1.0 of the
    // first point, and, at the same errors, lower with more requests (an
    // error between two points may widen it: the rate rose).
    let last = t.len() - 1;
    assert!(high[last] < high[0], "narrower than with no data: {high:?}");
    if let Some(j) = (0..last)
        .find(|&j| requests[j] > 0.0 && failed[j] == failed[last] && requests[j] < requests[last])
    {
        assert!(
            high[last] < high[j],
            "the band narrows with the counts: {high:?} over {requests:?} requests, {failed:?} errors"
        );
    }
    assert!(column(rates, "limit").iter().all(|l| *l == 0.05), "{rates}");
    assert!(
        column(&history["slowRate"], "limit")
            .iter()
            .all(|l| *l == 0.01),
        "maxLatency is a p99: {history:#}"
    );
    // Against the stable: 1.25 times its rate (0) while both sides serve;
    // at the last step, 1.25 times the bound on its rate the judge uses
    // (above 0, below 1).
    let stable_limit = column(rates, "stableLimit");
    let last = *stable_limit.last().expect("a point");
    assert!(last > 0.0 && last < 1.0, "{stable_limit:?}");
    assert!(stable_limit.contains(&0.0), "{stable_limit:?}");
    let steps = history["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2, "{history:#}");
    assert_eq!(
        (
            &steps[0]["t"],
            &steps[0]["step"],
            &steps[0]["stepIndex"],
            &steps[0]["outcome"]
        ),
        (
            &serde_json::json!(0.0),
            &serde_json::json!("50%"),
            &serde_json::json!(0),
            &serde_json::json!("started")
        )
    );
    assert_eq!(
        (
            &steps[1]["step"],
            &steps[1]["stepIndex"],
            &steps[1]["outcome"]
        ),
        (
            &serde_json::json!("100%"),
            &serde_json::json!(1),
            &serde_json::json!("passed")
        )
    );
    assert!(steps[1]["t"].as_f64() > Some(0.0), "{history:#}");
    let status = policy_status(&shop.sluice, "shop").await;
    assert!(
        status["rollouts"][0].get("history").is_none(),
        "the status is persisted; the history is not: {status:#}"
    );

    // The canary fails everything: rolled back when its lower bound
    // passes the limit, which the history's last point shows, with the
    // boundary; the chart stays.
    shop.canary.servers[0].fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    shop.errors_until_rolled_back(30).await;
    let r = wait_rollout(&shop.sluice, "shop", "rolled back", phase("RolledBack")).await;
    assert!(
        r["message"]
            .as_str()
            .unwrap_or("")
            .contains("is above maxErrorRate 5% at 99% confidence"),
        "{r:#}"
    );
    let (_, body) = admin_get(shop.sluice.admin, "/overview")
        .await
        .expect("admin answers");
    let o: Value = serde_json::from_slice(&body).expect("JSON");
    let history = &o["rollouts"][0]["history"];
    let steps = history["steps"].as_array().expect("steps");
    assert_eq!(
        (&steps[2]["step"], &steps[2]["outcome"]),
        (&serde_json::json!("100%"), &serde_json::json!("rolledBack")),
        "{history:#}"
    );
    let low = *column(&history["errorRate"], "canaryLow")
        .last()
        .expect("a point");
    assert!(low >= 0.05, "the lower bound passed the limit: {history:#}");
    assert_eq!(
        column(history, "t").last(),
        steps[2]["t"].as_f64().as_ref(),
        "the last point is the rollback's"
    );
}

const USERS_SPEC: &str = "  steps: ['20%', '100%']
  interval: 1h
  analysis: {minRequests: 20, maxErrorRate: '1%'}
  consistentBy: {header: x-user}
";

/// Send one request of each user (`x-user`), then a second one of each;
/// the users each backend answered.
async fn users_by_backend(shop: &Shop, users: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut conn = shop.sluice.connect().await;
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for user in users {
        let r = conn.get_with(HOST, "/", &[("x-user", user)]).await;
        assert_eq!(r.status, StatusCode::OK, "{user}");
        seen.entry(r.echo().service).or_default().push(user.clone());
        conn.get_with(HOST, "/", &[("x-user", user)]).await;
    }
    seen
}

/// consistentBy: the status counts the step's distinct users on each side
/// (each user sent two requests; requests without the header are no
/// users), their share, and the metrics show the same by side.
#[tokio::test]
async fn consistent_users_are_counted_per_side_in_status_and_metrics() {
    let (shop, _) = Shop::promoting(USERS_SPEC, (1, 0), (0, 1), "20%").await;
    let s = &shop.sluice;
    let users: Vec<String> = (0..60).map(|i| format!("user-{i}")).collect();
    let seen = users_by_backend(&shop, &users).await;
    shop.tally(7, &[]).await;
    let on = |backend: &str| seen.get(backend).map_or(0, Vec::len) as u64;
    let (canary, stable) = (on("canary"), on("stable"));
    assert_eq!(canary + stable, 60, "{seen:?}");
    assert!(canary > 0 && stable > 0, "{seen:?}");
    // The status shows the counts of the last look (at least every second).
    let r = wait_rollout(s, "shop", "the users counted", |r| {
        r["canaryUsers"].as_u64().unwrap_or(0) + r["stableUsers"].as_u64().unwrap_or(0) == 60
            && r["requests"].as_u64().unwrap_or(0) >= 2 * canary
    })
    .await;
    assert_eq!(r["canaryUsers"], canary, "{r:#}");
    assert_eq!(r["stableUsers"], stable, "{r:#}");
    assert_eq!(r["canaryUsersWithErrors"], 0, "{r:#}");
    assert_eq!(r["stableUsersWithErrors"], 0, "{r:#}");
    assert_eq!(r["repeatedErrors"], 0, "{r:#}");
    assert!(r.get("usersEstimated").is_none(), "{r:#}");
    let share = 100.0 * canary as f64 / 60.0;
    let shown: f64 = r["canaryUsersShare"]
        .as_str()
        .and_then(|s| s.strip_suffix('%'))
        .and_then(|s| s.parse().ok())
        .expect("a percentage");
    assert!((shown - share).abs() < 0.001, "{shown} for {share}: {r:#}");
    let labels = r#"policy="default/shop",route="default/shop",rule="0""#;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let text = s.metrics().await;
        let users = |side: &str| {
            crate::support::metric(
                &text,
                &format!(r#"sluice_rollout_users{{{labels},side="{side}"}}"#),
            )
        };
        if users("canary") == Some(canary as f64) {
            assert_eq!(users("stable"), Some(stable as f64), "{text}");
            assert_eq!(
                crate::support::metric(
                    &text,
                    &format!(r#"sluice_rollout_users_with_errors{{{labels},side="canary"}}"#)
                ),
                Some(0.0),
                "{text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// consistentBy: one user hammering a failing canary with retries is one
/// user with errors, whose repeated errors are not judged: the step is
/// neither failed nor filled by them. Other users failing roll it back
/// after a handful, and the message says how many users the errors came
/// from.
#[tokio::test]
async fn one_users_retries_are_one_user_and_many_users_failing_roll_it_back() {
    let (shop, _) = Shop::promoting(USERS_SPEC, (1, 0), (0, 1), "20%").await;
    let s = &shop.sluice;
    let users: Vec<String> = (0..200).map(|i| format!("user-{i}")).collect();
    let seen = users_by_backend(&shop, &users).await;
    let on_canary = seen.get("canary").cloned().unwrap_or_default();
    assert!(on_canary.len() >= 10, "{seen:?}");
    let before = wait_rollout(s, "shop", "the users counted", |r| {
        r["canaryUsers"] == on_canary.len() && r["requests"] == 2 * on_canary.len()
    })
    .await;
    assert_eq!(before["canaryUsersWithErrors"], 0, "{before:#}");
    shop.canary.servers[0].fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    // One canary user retries its failing request 40 times.
    let storm = &on_canary[0];
    let mut conn = s.connect().await;
    for _ in 0..40 {
        let r = conn.get_with(HOST, "/", &[("x-user", storm)]).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    // Looked at after every 5xx: the last look has judged all 40.
    let r = wait_rollout(s, "shop", "the storm judged", |r| r["errors"] == 40).await;
    assert_eq!(r["phase"], "Progressing", "{r:#}");
    assert_eq!(r["step"], "20%", "{r:#}");
    assert_eq!(r["canaryUsersWithErrors"], 1, "{r:#}");
    assert_eq!(r["repeatedErrors"], 39, "{r:#}");
    assert_eq!(r["canaryUsers"], on_canary.len(), "{r:#}");
    let judged = r["evidence"][0]["canary"].as_str().unwrap_or("");
    assert!(
        judged.starts_with(&format!("1 of {} (", 2 * on_canary.len() + 1)),
        "the storm is one error among the judged requests: {r:#}"
    );
    // Other canary users fail, one request each. After each, the look
    // that judged it: the next request is sent only when that look kept
    // the canary (a request sent before could race a rollback).
    let mut failing = 1;
    let mut r = r;
    for user in &on_canary[1..] {
        let answer = conn.get_with(HOST, "/", &[("x-user", user)]).await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR, "{user}");
        failing += 1;
        r = wait_rollout(s, "shop", "the failing user judged", |r| {
            r["errors"] == 39 + failing
        })
        .await;
        if r["phase"] != "Progressing" {
            break;
        }
    }
    assert_eq!(r["phase"], "RolledBack", "{r:#}");
    // After 110 good canary answers, 7 failing users of 117 judged
    // requests are what 99% against a 1% limit needs (the storm alone
    // was 40 errors).
    let failed: u64 = r["canaryUsersWithErrors"].as_u64().expect("counted");
    assert!(
        (2..=10).contains(&failed) && failed == failing,
        "{failed} users failing, {failing} sent: {r:#}"
    );
    let message = r["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("canary 5xx ")
            && message.contains(" is above maxErrorRate 1% at 99% confidence")
            && message.contains(&format!(
                "; in this step {} errors from {failed} users (of {} users; 39 repeated errors not judged)",
                39 + failed,
                on_canary.len()
            ))
            && message.ends_with(": rolled back to 100/0 (stable/canary)"),
        "{r:#}"
    );
    // Rolled back: every user is on the stable again.
    assert_eq!(
        users_by_backend(&shop, &on_canary)
            .await
            .keys()
            .collect::<Vec<_>>(),
        ["stable"]
    );
}
