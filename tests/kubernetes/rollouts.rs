//! RolloutPolicy in Kubernetes mode, through the real binary: the Lease
//! leader judges each rollout and records it in the policy's status; every
//! other replica serves the step recorded there, and a new leader continues
//! from it.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::fake_apiserver::FakeApiServer;
use super::{HOST, Replica, answered_by, cluster, echo, eventually, free_port, get, route};

pub(super) const LEASE: (&str, &str) = ("sluice-system", "sluice-gateway-controller");

/// RolloutPolicy `default/autocomplete` on the route of [`route`].
fn policy(interval: &str, steps: &[&str]) -> Value {
    json!({"apiVersion": "sluice.dev/v1alpha1", "kind": "RolloutPolicy",
        "metadata": {"name": "autocomplete", "namespace": "default"},
        "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                                 "name": "autocomplete"}],
                 "steps": steps, "interval": interval}})
}

/// The rollout recorded in the policy's status: (phase, step,
/// stepStartedAt).
pub(super) fn recorded(api: &FakeApiServer) -> Option<(String, Option<String>, Option<String>)> {
    let policy = api.get("RolloutPolicy", Some("default"), "autocomplete")?;
    let r = &policy["status"]["rollouts"][0];
    Some((
        r["phase"].as_str()?.to_string(),
        r["step"].as_str().map(str::to_string),
        r["stepStartedAt"].as_str().map(str::to_string),
    ))
}

/// Wait until the policy's status records `phase` (and `step`).
pub(super) async fn recorded_at(
    api: &FakeApiServer,
    phase: &str,
    step: Option<&str>,
) -> (String, Option<String>, Option<String>) {
    eventually(
        &format!("a recorded rollout {phase} {step:?}"),
        async || recorded(api).filter(|r| r.0 == phase && r.1.as_deref() == step),
    )
    .await
}

/// `n` requests on one keep-alive connection, counted by who answered.
async fn split(addr: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the replica");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let req = Request::get("/complete?q=a")
            .header("host", HOST)
            .body(Full::new(Bytes::new()))
            .expect("a request");
        send.ready().await.expect("the connection stays open");
        let resp = send.send_request(req).await.expect("a response");
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("a body").to_bytes();
        *counts.entry(answered_by(status, &body)).or_default() += 1;
    }
    counts
}

/// Wait until `n` requests to `addr` split as `canary` of them to the
/// canary (within 3 points: the split is exact per replica, but a table
/// swap in the middle of a sample restarts its sequence) and the rest to
/// stable.
async fn serves(addr: SocketAddr, n: usize, canary: usize) -> BTreeMap<String, usize> {
    let slack = n * 3 / 100;
    eventually(
        &format!("{canary} of {n} requests to the canary at {addr}"),
        async || {
            let counts = split(addr, n).await;
            let c = counts.get("canary").copied().unwrap_or(0);
            let s = counts.get("stable").copied().unwrap_or(0);
            (c + s == n && c.abs_diff(canary) <= slack).then_some(counts)
        },
    )
    .await
}

/// The generation of `default/autocomplete` the replica serves (its
/// `/status`).
async fn route_generation(replica: &Replica) -> Option<i64> {
    let (_, body) = get(replica.admin, "admin", "/status").await.ok()?;
    let objects: Vec<Value> = serde_json::from_slice(&body).ok()?;
    objects
        .iter()
        .find(|o| o["kind"] == "HTTPRoute" && o["metadata"]["name"] == "autocomplete")
        .and_then(|o| o["metadata"]["generation"].as_i64())
}

/// The rollout a replica shows on `/status`: (phase, step).
async fn shown(replica: &Replica) -> Option<(String, Option<String>)> {
    let (_, body) = get(replica.admin, "admin", "/status").await.ok()?;
    let objects: Vec<Value> = serde_json::from_slice(&body).ok()?;
    let policy = objects
        .iter()
        .find(|o| o["kind"] == "RolloutPolicy" && o["metadata"]["name"] == "autocomplete")?;
    let r = &policy["status"]["rollouts"][0];
    Some((
        r["phase"].as_str()?.to_string(),
        r["step"].as_str().map(str::to_string),
    ))
}

/// The step a replica's `sluice_rollout_step_percent` shows for the
/// policy's rule.
async fn metric_step(replica: &Replica) -> Option<String> {
    let (_, body) = get(replica.admin, "admin", "/metrics").await.ok()?;
    let text = String::from_utf8(body.to_vec()).ok()?;
    let prefix = r#"sluice_rollout_step_percent{policy="default/autocomplete",route="default/autocomplete",rule="0"} "#;
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map(str::to_string)
}

/// Who wrote the policy's status, in order: (token, phase, step).
pub(super) fn policy_writes(api: &FakeApiServer) -> Vec<(String, String, Option<String>)> {
    api.patches()
        .iter()
        .filter(|p| p.plural == "rolloutpolicies")
        .map(|p| {
            let r = &p.body["status"]["rollouts"][0];
            (
                p.token.clone(),
                r["phase"].as_str().unwrap_or("").to_string(),
                r["step"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// The steps `token` recorded, as indices into `steps`, in the order
/// written (a write that carries no step is left out). The status writer
/// sends the latest status, so a step that lasted less than a write may
/// be skipped; the order never goes back.
fn recorded_steps(api: &FakeApiServer, token: &str, steps: &[&str]) -> Vec<usize> {
    policy_writes(api)
        .iter()
        .filter(|(t, _, _)| t == token)
        .filter_map(|(_, _, step)| {
            let step = step.as_deref()?;
            Some(
                steps
                    .iter()
                    .position(|s| *s == step)
                    .unwrap_or_else(|| panic!("{step} is not a step of {steps:?}")),
            )
        })
        .collect()
}

/// A cluster with stable and canary, the route at 1000/0 and the policy;
/// replica a leads (it has recorded the idle rollout), replica b follows.
async fn two_replicas(
    api: &FakeApiServer,
    steps: &[&str],
) -> (Replica, Replica, [sluice::echo::EchoServer; 2]) {
    let (stable, canary) = (
        echo("stable", "stable-0").await,
        echo("canary", "canary-0").await,
    );
    let port = free_port();
    cluster(api, port, &[("stable", &stable), ("canary", &canary)]);
    api.apply(route(1000, 0));
    api.apply(policy("1h", steps));
    let a = Replica::start(api, "replica-a", "127.0.0.1", port);
    a.wait_ready().await;
    recorded_at(api, "Complete", None).await;
    let b = Replica::start(api, "replica-b", "127.0.0.2", port);
    b.wait_ready().await;
    (a, b, [stable, canary])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_follower_serves_the_step_the_leader_recorded() {
    let api = FakeApiServer::start().await;
    let (a, b, _backends) = two_replicas(&api, &["25%", "100%"]).await;
    serves(b.listener, 200, 0).await;

    // Where traffic ends up: the canary. The leader starts the rollout at
    // its first step and records it; the follower serves that step.
    api.apply(route(0, 1000));
    let (_, _, started) = recorded_at(&api, "Progressing", Some("25%")).await;
    assert!(started.is_some(), "stepStartedAt is recorded");
    let counts = serves(b.listener, 400, 100).await;
    assert_eq!(counts.len(), 2, "{counts:?}");
    serves(a.listener, 400, 100).await;
    assert_eq!(
        shown(&b).await,
        Some(("Progressing".into(), Some("25%".into()))),
        "the follower shows the recorded step on /status"
    );
    assert_eq!(
        metric_step(&b).await.as_deref(),
        Some("25.0"),
        "and in /metrics"
    );
    // While the step bakes (judged every 250 ms), nothing is rewritten.
    let at_step = policy_writes(&api).len();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(policy_writes(&api).len(), at_step, "a tick is not a write");
    // A replica started mid-rollout serves the recorded step from its
    // first table, not the spec.
    let c = Replica::start(&api, "replica-c", "127.0.0.3", b.listener.port());
    c.wait_ready().await;
    let counts = split(c.listener, 400).await;
    let canary = counts.get("canary").copied().unwrap_or(0);
    assert!(
        counts.get("stable").copied().unwrap_or(0) + canary == 400 && canary.abs_diff(100) <= 12,
        "{counts:?}; log:\n{}",
        c.log()
    );
    let writes = policy_writes(&api);
    assert!(
        writes.iter().all(|(t, _, _)| t == "replica-a"),
        "only the leader records: {writes:?}"
    );

    // A short interval: the leader passes the steps (it judges on its own
    // traffic sample: no gate counts requests here), records each, and
    // the follower ends on the spec shares.
    api.apply(policy("1s", &["25%", "100%"]));
    recorded_at(&api, "Complete", Some("100%")).await;
    serves(b.listener, 100, 100).await;
    let steps = recorded_steps(&api, "replica-a", &["25%", "100%"]);
    assert!(
        steps.is_sorted() && steps.first() == Some(&0),
        "the steps are recorded in order: {steps:?}\nleader log:\n{}",
        a.log()
    );

    // A recorded rollout is not rewritten once it settled (a write is not
    // a reason to write again).
    let settled = api.patches().len();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(
        api.patches().len(),
        settled,
        "unchanged status is not rewritten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_rollout_policy_crd_serves_and_picks_it_up_later() {
    let api = FakeApiServer::start().await;
    api.uninstall("rolloutpolicies");
    let (stable, canary) = (
        echo("stable", "stable-0").await,
        echo("canary", "canary-0").await,
    );
    let port = free_port();
    cluster(&api, port, &[("stable", &stable), ("canary", &canary)]);
    api.apply(route(1000, 0));
    let a = Replica::start(&api, "replica-a", "127.0.0.1", port);
    a.wait_ready().await;
    serves(a.listener, 100, 0).await;
    // Without policies a weight change applies at once, as the spec says.
    api.apply(route(0, 1000));
    serves(a.listener, 100, 100).await;

    // The CRD is installed later: picked up without a restart.
    api.install("rolloutpolicies");
    api.apply(policy("1h", &["25%", "100%"]));
    recorded_at(&api, "Complete", None).await;
    api.apply(route(1000, 0));
    recorded_at(&api, "Progressing", Some("25%")).await;
    serves(a.listener, 400, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_keeps_its_shares_until_the_leader_records_the_rollout() {
    let api = FakeApiServer::start().await;
    let (a, b, _backends) = two_replicas(&api, &["25%", "100%"]).await;
    serves(b.listener, 200, 0).await;

    // The leader cannot record (its status writes fail) while both see the
    // new weights.
    api.refuse_status("rolloutpolicies");
    api.apply(route(0, 1000));
    eventually(
        "the follower serves the new route's generation",
        async || (route_generation(&b).await == Some(2)).then_some(()),
    )
    .await;
    // The leader has started the rollout on its own traffic...
    serves(a.listener, 400, 100).await;
    // ...but nothing is recorded: the follower serves what it served.
    let counts = split(b.listener, 400).await;
    assert_eq!(
        counts,
        BTreeMap::from([("stable".to_string(), 400)]),
        "follower log:\n{}",
        b.log()
    );
    assert_eq!(
        recorded(&api).map(|r| r.0),
        Some("Complete".into()),
        "still the record from before the change"
    );

    // The write goes through: the follower serves the recorded step.
    api.accept_status();
    recorded_at(&api, "Progressing", Some("25%")).await;
    serves(b.listener, 400, 100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_continues_from_the_recorded_step() {
    let api = FakeApiServer::start().await;
    let (mut a, b, _backends) = two_replicas(&api, &["25%", "50%", "100%"]).await;
    let holder = api.lease_holder(LEASE.0, LEASE.1).expect("a leader");

    api.apply(route(0, 1000));
    let (_, _, started) = recorded_at(&api, "Progressing", Some("25%")).await;
    serves(b.listener, 400, 100).await;

    // The leader dies mid-rollout without releasing the lease.
    let _ = a.child.kill();
    let _ = a.child.wait();
    eventually("replica b takes the lease", async || {
        api.lease_holder(LEASE.0, LEASE.1).filter(|h| *h != holder)
    })
    .await;
    // The new leader continues from the recorded step, its clock from the
    // recorded start: never ahead of it.
    eventually("replica b leads", async || {
        b.log().contains("leading the rollouts").then_some(())
    })
    .await;
    serves(b.listener, 400, 100).await;
    assert_eq!(
        recorded(&api),
        Some(("Progressing".into(), Some("25%".into()), started)),
        "the step and its start as the old leader recorded them"
    );
    assert_eq!(
        shown(&b).await,
        Some(("Progressing".into(), Some("25%".into())))
    );

    // The rollout completes under the new leader, step by step.
    api.apply(policy("1s", &["25%", "50%", "100%"]));
    recorded_at(&api, "Complete", Some("100%")).await;
    serves(b.listener, 100, 100).await;
    let by_a = recorded_steps(&api, "replica-a", &["25%", "50%", "100%"]);
    assert_eq!(by_a.last(), Some(&0), "the old leader reached 25% only");
    let by_b = recorded_steps(&api, "replica-b", &["25%", "50%", "100%"]);
    assert!(
        by_b.is_sorted() && by_b.last() == Some(&2),
        "the new leader records the steps after the recorded one, in order: {by_b:?}\nlog:\n{}",
        b.log()
    );
}
