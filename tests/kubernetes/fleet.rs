//! The whole fleet's counts, through three real replicas: each follower
//! publishes its counts per step in its own Lease, and the leader judges
//! the sum, so a canary failing only on a follower's traffic is rolled
//! back by the leader, and a step passes on traffic the leader never saw.
//! The fake API server records every Lease write, so the write rate of
//! each replica is counted over the run.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::fake_apiserver::{FakeApiServer, LeaseWrite};
use super::rollouts::{LEASE, policy_writes, recorded, recorded_at};
use super::{HOST, Replica, answered_by, cluster, echo, eventually, free_port, get, route};

/// The counts interval the replicas are started with.
const INTERVAL: Duration = Duration::from_millis(500);
const ENV: &[(&str, &str)] = &[("SLUICE_ROLLOUT_COUNTS_INTERVAL", "500ms")];

fn policy(interval: &str) -> Value {
    json!({"apiVersion": "sluice.dev/v1alpha1", "kind": "RolloutPolicy",
        "metadata": {"name": "autocomplete", "namespace": "default"},
        "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                                 "name": "autocomplete"}],
                 "steps": ["25%", "100%"], "interval": interval,
                 "analysis": {"minRequests": 20, "maxErrorRate": "10%"}}})
}

/// `n` requests to `addr` on one connection, added to `counts` by who
/// answered (`<500>`: the failing canary).
async fn send(addr: SocketAddr, n: usize, counts: &mut BTreeMap<String, usize>) {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the replica");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
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
}

/// The writes of counts Leases, by the token of the replica that wrote.
fn counts_writes(api: &FakeApiServer) -> BTreeMap<String, Vec<LeaseWrite>> {
    let mut by = BTreeMap::<String, Vec<LeaseWrite>>::new();
    for w in api.lease_writes() {
        if w.name.starts_with("sluice-counts-") {
            by.entry(w.token.clone()).or_default().push(w);
        }
    }
    by
}

/// The counts a Lease write carried for the canary: (requests, errors),
/// summed over the steps it holds.
fn canary_counts(write: &LeaseWrite) -> (u64, u64) {
    let text = write.object["metadata"]["annotations"]["sluice.dev/rollout-counts"]
        .as_str()
        .unwrap_or("{}");
    let publication: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let mut sum = (0, 0);
    for step in publication["steps"].as_array().into_iter().flatten() {
        let canary = &step["backends"]["default/canary:80"];
        sum.0 += canary["requests"].as_u64().unwrap_or(0);
        sum.1 += canary["errors"].as_u64().unwrap_or(0);
    }
    sum
}

/// At most one write per interval: `n` writes need `n - 1` intervals
/// between the first and the last (one interval of slack for the time a
/// write takes to arrive).
fn within_rate(writes: &[LeaseWrite]) -> bool {
    let (Some(first), Some(last)) = (writes.first(), writes.last()) else {
        return true;
    };
    let span = last.at.duration_since(first.at).as_secs_f64();
    let allowed = (span / INTERVAL.as_secs_f64()).floor() as usize + 2;
    writes.len() <= allowed
}

/// Requests to the route that `replica` proxied itself (its `/metrics`).
async fn proxied(replica: &Replica) -> u64 {
    let (_, body) = get(replica.admin, "admin", "/metrics")
        .await
        .expect("the admin listener answers");
    let text = String::from_utf8(body.to_vec()).expect("text");
    text.lines()
        .filter(|l| l.starts_with(r#"sluice_requests_total{route="default/autocomplete""#))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The rollout a replica shows on `/status`: its phase.
async fn shown_phase(replica: &Replica) -> Option<String> {
    let (_, body) = get(replica.admin, "admin", "/status").await.ok()?;
    let objects: Vec<Value> = serde_json::from_slice(&body).ok()?;
    let policy = objects
        .iter()
        .find(|o| o["kind"] == "RolloutPolicy" && o["metadata"]["name"] == "autocomplete")?;
    policy["status"]["rollouts"][0]["phase"]
        .as_str()
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_judges_the_whole_fleets_counts() {
    let api = FakeApiServer::start().await;
    let (stable, canary) = (
        echo("stable", "stable-0").await,
        echo("canary", "canary-0").await,
    );
    let port = free_port();
    cluster(&api, port, &[("stable", &stable), ("canary", &canary)]);
    api.apply(route(1000, 0));
    api.apply(policy("1h"));
    let a = Replica::start_with(&api, "replica-a", "127.0.0.1", port, ENV);
    a.wait_ready().await;
    recorded_at(&api, "Complete", None).await;
    let b = Replica::start_with(&api, "replica-b", "127.0.0.2", port, ENV);
    let c = Replica::start_with(&api, "replica-c", "127.0.0.3", port, ENV);
    b.wait_ready().await;
    c.wait_ready().await;
    let holder = api.lease_holder(LEASE.0, LEASE.1).expect("a leader");
    assert!(
        holder.ends_with(&format!("-{}", a.child.id())),
        "replica a leads: {holder}"
    );

    // No rollout in flight: nothing is published.
    tokio::time::sleep(INTERVAL * 3).await;
    assert!(counts_writes(&api).is_empty(), "{:?}", counts_writes(&api));

    // The canary fails everything, and its traffic goes through replica b
    // only: the leader proxies none of it, and rolls it back on b's counts.
    canary.fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    api.refuse_lease_applies();
    api.apply(route(0, 1000));
    recorded_at(&api, "Progressing", Some("25%")).await;
    let mut answered = BTreeMap::new();
    // While b cannot publish, it serves on, says why in its log, retries
    // every interval, and the leader (seeing no failure) does not move.
    eventually("b retries its refused writes", async || {
        send(b.listener, 20, &mut answered).await;
        (api.refused_lease_applies() >= 3).then_some(())
    })
    .await;
    assert!(
        b.log()
            .contains("cannot publish this replica's rollout counts"),
        "{}",
        b.log()
    );
    assert_eq!(
        recorded(&api).map(|r| r.0).as_deref(),
        Some("Progressing"),
        "{answered:?}"
    );
    api.accept_lease_applies();
    let rolled_back = eventually("the leader rolls the canary back", async || {
        send(b.listener, 20, &mut answered).await;
        recorded(&api).filter(|r| r.0 == "RolledBack")
    })
    .await;
    assert_eq!(rolled_back.1.as_deref(), Some("25%"), "{answered:?}");
    assert!(
        answered.get("<500>").copied().unwrap_or(0) > 0,
        "the canary failed through b: {answered:?}"
    );
    assert_eq!(proxied(&a).await, 0, "the leader proxied none of it");
    assert_eq!(proxied(&c).await, 0);
    let writes = policy_writes(&api);
    let (by, _, _) = writes
        .iter()
        .find(|(_, phase, _)| phase == "RolledBack")
        .expect("the rollback is recorded");
    assert_eq!(by, "replica-a", "the leader recorded the rollback");
    let stored = api
        .get("RolloutPolicy", Some("default"), "autocomplete")
        .expect("the policy");
    let status = &stored["status"]["rollouts"][0];
    assert!(
        status["errors"].as_u64().unwrap_or(0) > 0,
        "the leader's counts are the fleet's: {status}\nleader log:\n{}",
        a.log()
    );

    // Replica b published its counts of the step; the leader none (it
    // reads its own live); replica c, with no traffic, its zeros at most
    // once.
    let published = counts_writes(&api);
    assert!(!published.contains_key("replica-a"), "{published:?}");
    let from_b = &published["replica-b"];
    let last = from_b.last().expect("b published");
    let (requests, errors) = canary_counts(last);
    assert!(requests > 0 && errors == requests, "{:?}", last.object);
    // (Its first write may come after the rollback reached it: none then.)
    let from_c: Vec<(u64, u64)> = published
        .get("replica-c")
        .map(|w| w.iter().map(canary_counts).collect())
        .unwrap_or_default();
    assert!(
        from_c.len() <= 1 && from_c.iter().all(|c| *c == (0, 0)),
        "unchanged counts are not written again: {from_c:?}"
    );

    // Rolled back: nothing in flight, nothing more published.
    eventually("b follows the rollback", async || {
        (shown_phase(&b).await.as_deref() == Some("RolledBack")).then_some(())
    })
    .await;
    tokio::time::sleep(INTERVAL).await;
    let settled: usize = counts_writes(&api).values().map(Vec::len).sum();
    tokio::time::sleep(INTERVAL * 3).await;
    assert_eq!(
        counts_writes(&api).values().map(Vec::len).sum::<usize>(),
        settled,
        "no writes while no rollout is in flight"
    );

    // A healthy canary: each step passes on b's requests, which the
    // leader never proxied (minRequests is counted on the fleet).
    canary.fail_with(None);
    api.apply(policy("1s"));
    api.apply(route(500, 500));
    recorded_at(&api, "Progressing", Some("25%")).await;
    let mut answered = BTreeMap::new();
    eventually(
        "the rollout completes on the follower's traffic",
        async || {
            send(b.listener, 20, &mut answered).await;
            recorded(&api).filter(|r| r.0 == "Complete" && r.1.as_deref() == Some("100%"))
        },
    )
    .await;
    assert_eq!(proxied(&a).await, 0, "the leader proxied none of it");
    assert!(!answered.contains_key("<500>"), "{answered:?}");

    // The bound held over the whole run, for every replica.
    let published = counts_writes(&api);
    assert!(!published.contains_key("replica-a"), "{published:?}");
    for (replica, writes) in &published {
        let gaps: Vec<u128> = writes
            .windows(2)
            .map(|w| w[1].at.duration_since(w[0].at).as_millis())
            .collect();
        let size = writes.last().map_or(0, |w| {
            w.object["metadata"]["annotations"]["sluice.dev/rollout-counts"]
                .as_str()
                .map_or(0, str::len)
        });
        eprintln!(
            "{replica}: {} counts writes, {gaps:?} ms apart; the last carried {size} bytes of counts",
            writes.len()
        );
        assert!(
            within_rate(writes),
            "{replica} wrote {} times, {gaps:?} ms apart",
            writes.len()
        );
    }
    let start = published["replica-b"][0].at;
    let run = Instant::now().duration_since(start);
    assert!(
        published["replica-b"].len() as f64 <= run.as_secs_f64() / INTERVAL.as_secs_f64() + 1.0,
        "{} writes in {run:?}",
        published["replica-b"].len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_judges_the_others_counts_and_not_its_own_twice() {
    let api = FakeApiServer::start().await;
    let (stable, canary) = (
        echo("stable", "stable-0").await,
        echo("canary", "canary-0").await,
    );
    let port = free_port();
    cluster(&api, port, &[("stable", &stable), ("canary", &canary)]);
    api.apply(route(1000, 0));
    api.apply(policy("1h"));
    let mut a = Replica::start_with(&api, "replica-a", "127.0.0.1", port, ENV);
    a.wait_ready().await;
    recorded_at(&api, "Complete", None).await;
    let b = Replica::start_with(&api, "replica-b", "127.0.0.2", port, ENV);
    let c = Replica::start_with(&api, "replica-c", "127.0.0.3", port, ENV);
    b.wait_ready().await;
    c.wait_ready().await;

    // A healthy step: both followers serve plenty of it and publish.
    api.apply(route(0, 1000));
    recorded_at(&api, "Progressing", Some("25%")).await;
    let mut answered = BTreeMap::new();
    eventually("both followers published traffic", async || {
        send(b.listener, 40, &mut answered).await;
        send(c.listener, 40, &mut answered).await;
        let published = counts_writes(&api);
        let with_traffic = |token: &str| {
            published
                .get(token)
                .and_then(|w| w.last())
                .is_some_and(|w| canary_counts(w).0 >= 50)
        };
        (with_traffic("replica-b") && with_traffic("replica-c")).then_some(())
    })
    .await;

    // The leader dies without releasing the lease; a follower takes over.
    let _ = a.child.kill();
    let _ = a.child.wait();
    let holder = eventually("a follower takes the lease", async || {
        api.lease_holder(LEASE.0, LEASE.1)
            .filter(|h| !h.ends_with(&format!("-{}", a.child.id())))
    })
    .await;
    let (leader, follower, follower_token) = if holder.ends_with(&format!("-{}", b.child.id())) {
        (&b, &c, "replica-c")
    } else {
        (&c, &b, "replica-b")
    };
    eventually("the new leader leads", async || {
        leader.log().contains("leading the rollouts").then_some(())
    })
    .await;
    // Every watch expires: the relist delivers every counts Lease again,
    // the new leader's own among them (it must not be summed with its live
    // counters) and the follower's (which must add nothing).
    let relists = api.lists("leases");
    api.expire_watches();
    eventually("the counts are listed again", async || {
        (api.lists("leases") > relists).then_some(())
    })
    .await;

    // The canary fails, through the remaining follower only: the new
    // leader rolls it back on that follower's counts.
    canary.fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
    let before = proxied(leader).await;
    eventually("the new leader rolls the canary back", async || {
        send(follower.listener, 20, &mut answered).await;
        recorded(&api).filter(|r| r.0 == "RolledBack")
    })
    .await;
    assert_eq!(
        proxied(leader).await,
        before,
        "the new leader proxied none of it"
    );
    let leader_token = if follower_token == "replica-b" {
        "replica-c"
    } else {
        "replica-b"
    };
    let writes = policy_writes(&api);
    assert!(
        writes
            .iter()
            .any(|(t, phase, _)| t == leader_token && phase == "RolledBack"),
        "{writes:?}"
    );
    // Its own Lease (at least 50 canary requests, published while it
    // followed) is not summed with its live counters: the step's counts
    // are the follower's (its whole step), and the new leader proxied
    // nothing since it took over.
    let stored = api
        .get("RolloutPolicy", Some("default"), "autocomplete")
        .expect("the policy");
    let step = &stored["status"]["rollouts"][0];
    let (requests, errors) = (
        step["requests"].as_u64().unwrap_or(0),
        step["errors"].as_u64().unwrap_or(0),
    );
    let published = counts_writes(&api);
    let (follower_requests, _) = published[follower_token]
        .last()
        .map_or((0, 0), canary_counts);
    assert!(
        errors > 0 && requests <= follower_requests,
        "recorded {requests} requests ({errors} 5xx), the follower published {follower_requests}\nleader log:\n{}",
        leader.log()
    );
}

/// One request of each user (`x-user`) to `addr`, on one connection: the
/// users each backend answered.
async fn send_users(addr: SocketAddr, users: &[String]) -> BTreeMap<String, usize> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the replica");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut by = BTreeMap::new();
    for user in users {
        let req = Request::get("/complete?q=a")
            .header("host", HOST)
            .header("x-user", user.as_str())
            .body(Full::new(Bytes::new()))
            .expect("a request");
        send.ready().await.expect("the connection stays open");
        let resp = send.send_request(req).await.expect("a response");
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("a body").to_bytes();
        *by.entry(answered_by(status, &body)).or_default() += 1;
    }
    by
}

/// With consistentBy, a follower counts the users it answered and
/// publishes them: the leader, which proxied none of them, shows the
/// fleet's distinct users per side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_counts_the_users_a_follower_answered() {
    let api = FakeApiServer::start().await;
    let (stable, canary) = (
        echo("stable", "stable-0").await,
        echo("canary", "canary-0").await,
    );
    let port = free_port();
    cluster(&api, port, &[("stable", &stable), ("canary", &canary)]);
    api.apply(route(1000, 0));
    let mut keyed = policy("1h");
    keyed["spec"]["consistentBy"] = json!({"header": "x-user"});
    keyed["spec"]["analysis"]["minRequests"] = json!(1000);
    api.apply(keyed);
    let a = Replica::start_with(&api, "replica-a", "127.0.0.1", port, ENV);
    a.wait_ready().await;
    recorded_at(&api, "Complete", None).await;
    let b = Replica::start_with(&api, "replica-b", "127.0.0.2", port, ENV);
    b.wait_ready().await;
    api.apply(route(0, 1000));
    recorded_at(&api, "Progressing", Some("25%")).await;
    eventually("b serves the step", async || {
        (shown_phase(&b).await.as_deref() == Some("Progressing")).then_some(())
    })
    .await;
    let users: Vec<String> = (0..40).map(|i| format!("user-{i}")).collect();
    // Each user twice: distinct users, not requests.
    let first = send_users(b.listener, &users).await;
    assert_eq!(send_users(b.listener, &users).await, first);
    let on = |side: &str| first.get(side).copied().unwrap_or(0) as u64;
    assert_eq!(on("stable") + on("canary"), 40, "{first:?}");
    assert!(on("canary") > 0 && on("stable") > 0, "{first:?}");
    let shown = eventually("the leader shows the follower's users", async || {
        let (_, body) = get(a.admin, "admin", "/status").await.ok()?;
        let objects: Vec<Value> = serde_json::from_slice(&body).ok()?;
        let r = objects
            .iter()
            .find(|o| o["kind"] == "RolloutPolicy")?
            .get("status")?["rollouts"][0]
            .clone();
        // Both rounds reported: the second adds requests, not users, and
        // may reach the leader a report after the first.
        (r["canaryUsers"].as_u64()? + r["stableUsers"].as_u64()? == 40
            && r["requests"].as_u64()? == 2 * on("canary"))
        .then_some(r)
    })
    .await;
    assert_eq!(shown["canaryUsers"], on("canary"), "{shown}");
    assert_eq!(shown["stableUsers"], on("stable"), "{shown}");
    assert_eq!(shown["requests"], 2 * on("canary"), "{shown}");
    assert_eq!(proxied(&a).await, 0, "the leader proxied none of it");
}
