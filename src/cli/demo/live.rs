//! `sluice demo --keep-running`: after the acts, the gateway and its pods
//! stay up with traffic on every route, and the two rollouts of
//! examples/rollout.yaml play again and again (a promotion of `recommend`,
//! then a `payments` canary that fails and is rolled back), so that the
//! dashboard has something live to show. It prints where to look and what
//! to try, and stops cleanly on Ctrl-C (or SIGTERM).

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;
use tokio::sync::watch;

use super::{AUTOCOMPLETE_HOST, CHECKOUT_HOST, SEARCH_HOST, TempDir, request_raw};
use crate::echo::EchoServer;
use crate::rollout::Phase;
use crate::serve::RunningGateway;

const RECOMMEND_HOST: &str = "recommend.example.com";
const PAYMENTS_HOST: &str = "payments.example.com";
/// Longest wait for a rollout to end before the loop moves on (it says so).
const ROLLOUT_DEADLINE: Duration = Duration::from_secs(120);
/// Pause between two rollouts, so each end state can be seen.
const PAUSE: Duration = Duration::from_secs(3);

/// What the live demo shares with the acts.
pub(super) struct Live<'a> {
    pub out: &'a mut (dyn Write + Send),
    pub dir: &'a TempDir,
    pub files: &'a mut [(String, Vec<Value>)],
    pub pods: &'a BTreeMap<String, Vec<EchoServer>>,
    pub gateway: SocketAddr,
    pub running: &'a RunningGateway,
}

/// Requests the traffic loops sent, and how many were not answered 200.
#[derive(Default)]
struct Sent {
    sent: AtomicU64,
    not_ok: AtomicU64,
}

/// Serve until `stop` resolves: traffic on every host, rollouts in a loop.
pub(super) async fn keep_running(
    live: &mut Live<'_>,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let admin = live.running.admin_addr();
    let port = live.gateway.port();
    writeln!(
        live.out,
        "Keeping the gateway running (Ctrl-C stops it): traffic on every route, and the two rollouts again and again.\n\
         \n  dashboard:  http://{admin}/\n\
         \x20 try:        curl -s -H 'Host: {AUTOCOMPLETE_HOST}' http://{gw}/\n\
         \x20 explain:    sluice explain -f {dir} GET http://{AUTOCOMPLETE_HOST}:{port}/\n\
         \x20 status:     curl -s http://{admin}/status\n",
        gw = live.gateway,
        dir = live.dir.path.display(),
    )?;
    live.out.flush()?;

    let (stop_traffic, stopped) = watch::channel(false);
    let sent = Arc::new(Sent::default());
    let mut traffic = Vec::new();
    for (host, pause) in [
        (AUTOCOMPLETE_HOST, Duration::from_millis(10)),
        (SEARCH_HOST, Duration::from_millis(40)),
        (CHECKOUT_HOST, Duration::from_millis(40)),
        (RECOMMEND_HOST, Duration::from_millis(2)),
        (PAYMENTS_HOST, Duration::from_millis(2)),
    ] {
        traffic.push(tokio::spawn(drive(
            live.gateway,
            host,
            pause,
            sent.clone(),
            stopped.clone(),
        )));
    }

    let started = Instant::now();
    let outcome = tokio::select! {
        result = rollouts(live) => result,
        () = stop => Ok(()),
    };
    let _ = stop_traffic.send(true);
    for task in traffic {
        let _ = task.await;
    }
    for pod in live.pods.values().flatten() {
        pod.fail_with(None);
    }
    writeln!(
        live.out,
        "\nStopped after {:.0} s: {} requests sent by the demo's traffic, {} not answered 200 \
         (the failing canary's, while it was rolled back).",
        started.elapsed().as_secs_f64(),
        sent.sent.load(Ordering::Relaxed),
        sent.not_ok.load(Ordering::Relaxed),
    )?;
    outcome
}

/// One keep-alive connection's requests for `host`, a pause between them.
async fn drive(
    gateway: SocketAddr,
    host: &'static str,
    pause: Duration,
    sent: Arc<Sent>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut sender = None;
    let mut i: u64 = 0;
    loop {
        if *stopped.borrow() {
            return;
        }
        i += 1;
        let path = format!("/demo/live/{i}");
        let ok = matches!(
            request_raw(&mut sender, gateway, host, &[], &path).await,
            Ok((StatusCode::OK, _))
        );
        if !ok && sender.is_none() {
            // A connection that failed: wait before reconnecting.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        sent.sent.fetch_add(1, Ordering::Relaxed);
        sent.not_ok.fetch_add(u64::from(!ok), Ordering::Relaxed);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stopped.changed() => {}
        }
    }
}

/// The rollouts, in a loop: promote recommend's other side, then roll back
/// a failing payments canary.
async fn rollouts(live: &mut Live<'_>) -> anyhow::Result<()> {
    // After the acts, recommend serves its canary (0/1000) and payments
    // its stable (the rollback restored 1000/0; the spec still says
    // 0/1000): settle payments on its stable first.
    roll(live, "payments", [1000, 0], None).await?;
    let mut recommend = [0u64, 1000];
    for cycle in 1.. {
        tokio::time::sleep(PAUSE).await;
        recommend.reverse();
        let to = if recommend[0] > 0 {
            "recommend-stable"
        } else {
            "recommend-canary"
        };
        writeln!(
            live.out,
            "[cycle {cycle}] RolloutPolicy default/recommend: promoting {to} (weights {}/{})",
            recommend[0], recommend[1]
        )?;
        live.out.flush()?;
        roll(live, "recommend", recommend, Some(Phase::Complete)).await?;

        tokio::time::sleep(PAUSE).await;
        writeln!(
            live.out,
            "[cycle {cycle}] RolloutPolicy default/payments: payments-canary answers 500 to everything; weights 0/1000"
        )?;
        live.out.flush()?;
        for pod in live.pods.get("payments-canary").into_iter().flatten() {
            pod.fail_with(Some(StatusCode::INTERNAL_SERVER_ERROR));
        }
        roll(live, "payments", [0, 1000], Some(Phase::RolledBack)).await?;
        for pod in live.pods.get("payments-canary").into_iter().flatten() {
            pod.fail_with(None);
        }
        // Back to the weights the stable is served at: nothing to ramp.
        roll(live, "payments", [1000, 0], None).await?;
    }
    Ok(())
}

/// The spec shares of `policy`'s rollout as shown now, to tell a new
/// rollout from the one before.
fn target(live: &Live<'_>, policy: &str) -> String {
    super::rollouts::rollout_status(live.running, policy)
        .map(|r| serde_json::to_string(&r.to).unwrap_or_default())
        .unwrap_or_default()
}

/// Set `route`'s weights, wait for the rollout towards them to end in
/// `expected` and print how it ended.
async fn roll(
    live: &mut Live<'_>,
    route: &str,
    weights: [u64; 2],
    expected: Option<Phase>,
) -> anyhow::Result<()> {
    let before = target(live, route);
    super::rollouts::set_rollout_weights(live.files, live.dir, route, weights)?;
    let started = Instant::now();
    let ended = loop {
        if let Some(r) = super::rollouts::rollout_status(live.running, route)
            && serde_json::to_string(&r.to).unwrap_or_default() != before
            && expected.is_none_or(|phase| r.phase == phase)
        {
            break Some(r);
        }
        if started.elapsed() > ROLLOUT_DEADLINE {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let Some(expected) = expected else {
        return Ok(());
    };
    match ended {
        Some(r) => writeln!(
            live.out,
            "  {} after {:.1} s: {}",
            r.phase.as_str(),
            started.elapsed().as_secs_f64(),
            r.message
        )?,
        None => writeln!(
            live.out,
            "  not {} within {} s ({:?}); going on",
            expected.as_str(),
            ROLLOUT_DEADLINE.as_secs(),
            super::rollouts::rollout_status(live.running, route).map(|r| r.phase.as_str())
        )?,
    }
    live.out.flush()?;
    Ok(())
}
