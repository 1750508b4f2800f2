//! `sluice demo` end to end: the embedded examples served by the in-process
//! gateway to echo pods, with the counts the pods received.

mod demo_process;

use sluice::cli::demo::{self, DemoOptions, PhaseReport};

fn received(phase: &PhaseReport, service: &str) -> u64 {
    phase
        .received
        .get(service)
        .unwrap_or_else(|| panic!("no pods for {service}"))
        .requests
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_splits_exactly_and_flips_blue_green() {
    let mut out: Vec<u8> = Vec::new();
    let report = demo::run_with_output(
        DemoOptions {
            requests: 2000,
            verbose: false,
            keep_running: false,
        },
        &mut out,
    )
    .await
    .expect("demo runs");
    let printed = String::from_utf8(out).expect("UTF-8 output");
    // Shown with `--nocapture`: what a user of `sluice demo` sees.
    println!("{printed}");
    assert_eq!(report.failed(), 0, "{printed}");
    assert_eq!(report.phases.len(), 5, "{printed}");

    // 995/5 over 2000 requests: the canary gets 10, within a couple.
    let canary = &report.phases[0];
    assert_eq!(canary.sent, 2000);
    let stable_count = received(canary, "autocomplete-stable");
    let canary_count = received(canary, "autocomplete-canary");
    assert_eq!(stable_count + canary_count, 2000, "{printed}");
    assert!(
        canary_count.abs_diff(10) <= 2,
        "canary got {canary_count}: {printed}"
    );
    let stable = canary.received["autocomplete-stable"];
    assert_eq!(
        (stable.pods_with_traffic, stable.pods),
        (47, 47),
        "{printed}"
    );
    let canary_pods = canary.received["autocomplete-canary"];
    assert_eq!(canary_pods.pods, 2, "{printed}");
    assert!(printed.contains("99.5%"), "{printed}");
    assert!(printed.contains("47/47"), "{printed}");
    // The gateway's own observed share (sluice_backend_observed_share)
    // is printed next to the configured one: the first route's traffic is
    // all the rule saw, so it is the split the backends counted.
    let canary_row = printed
        .lines()
        .find(|l| l.trim_start().starts_with("autocomplete-canary"))
        .expect("a row for the canary");
    let columns: Vec<&str> = canary_row.split_whitespace().collect();
    assert_eq!(columns[2], "0.5%", "configured: {canary_row}");
    assert_eq!(columns[5], columns[4], "observed = actual: {canary_row}");
    assert!(
        printed.contains("sluice_backend_observed_share"),
        "{printed}"
    );

    // Header-tagged testers reach the canary, everyone else stable.
    let untagged = &report.phases[1];
    assert_eq!(received(untagged, "search-stable"), untagged.sent as u64);
    assert_eq!(received(untagged, "search-canary"), 0);
    let tagged = &report.phases[2];
    assert_eq!(received(tagged, "search-canary"), tagged.sent as u64);
    assert_eq!(received(tagged, "search-stable"), 0);

    // Blue-green: all green, then all blue after the flip.
    let before = &report.phases[3];
    assert_eq!(received(before, "checkout-green"), before.sent as u64);
    assert_eq!(received(before, "checkout-blue"), 0);
    let after = &report.phases[4];
    assert_eq!(received(after, "checkout-blue"), after.sent as u64);
    assert_eq!(received(after, "checkout-green"), 0);

    // The promotion: each step's batch is its exact split.
    let promotion = &report.rollouts[0];
    assert_eq!(promotion.phase, "Complete", "{printed}");
    let steps: Vec<(&str, &str, u64, u64)> = promotion
        .steps
        .iter()
        .map(|s| {
            let got = |svc: &str| s.received.get(svc).copied().unwrap_or(0);
            (
                s.step.as_str(),
                s.served.as_str(),
                got("recommend-stable"),
                got("recommend-canary"),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            ("0.5%", "99.5/0.5", 995, 5),
            ("5%", "95/5", 95, 5),
            ("25%", "75/25", 15, 5),
            ("100%", "0/100", 0, 5),
        ],
        "{printed}"
    );
    assert_eq!(
        promotion.after.received.get("recommend-canary").copied(),
        Some(promotion.after.sent as u64)
    );
    assert!(printed.contains("Complete "), "{printed}");

    // The failing canary: rolled back, everyone on stable again.
    let rollback = &report.rollouts[1];
    assert_eq!(rollback.phase, "RolledBack", "{printed}");
    // A statistical rollback: the counts on both sides, the bound, the
    // confidence; after a handful of errors, not minRequests (20).
    let message = &rollback.message;
    assert!(
        message.starts_with("payments-canary 5xx ")
            && message.contains(" is above maxErrorRate 1% at 99% confidence (its rate is above ")
            && message.contains("; the stable: 0 of ")
            && message.ends_with(
                " over the same time: rolled back to 100/0 (payments-stable/payments-canary)"
            ),
        "{message}"
    );
    let failing = &rollback.steps[1];
    assert_eq!(failing.step.as_str(), "25%");
    assert!((2..20).contains(&failing.failed), "{printed}");
    assert_eq!(
        failing.received.get("payments-canary").copied(),
        Some(failing.failed as u64)
    );
    assert_eq!(
        rollback.after.received.get("payments-stable").copied(),
        Some(rollback.after.sent as u64)
    );
    assert_eq!(rollback.after.failed, 0);
    assert!(printed.contains("RolledBack "), "{printed}");
}

#[test]
fn the_binary_runs_the_demo() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["demo", "--requests", "1000"])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the sluice binary");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("autocomplete-canary"), "{stdout}");
    assert!(stdout.contains("47/47"), "{stdout}");
    assert!(
        stdout.contains("the failing canary answered 500 before it was rolled back."),
        "{stdout}"
    );
    assert!(stdout.contains("at 99% confidence"), "{stdout}");
    assert!(
        stdout.contains("RolloutPolicy default/recommend"),
        "{stdout}"
    );
    assert!(stdout.contains("RolledBack "), "{stdout}");
}

/// `sluice demo --keep-running` through the real binary: after the acts the
/// dashboard is served at the address it prints, the rollouts go round (a
/// promotion, then a failing canary rolled back), and Ctrl-C (SIGINT)
/// stops it cleanly.
#[test]
fn keep_running_serves_the_dashboard_and_loops_the_rollouts_until_ctrl_c() {
    let mut demo = demo_process::LiveDemo::start();
    let page = demo.get("/");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("<html"), "the dashboard page: {page}");
    assert!(
        demo.printed
            .contains("curl -s -H 'Host: autocomplete.example.com'"),
        "{}",
        demo.printed
    );
    assert!(
        demo.printed.contains("sluice explain -f "),
        "{}",
        demo.printed
    );
    demo.wait_for_a_cycle();
    // While it runs, the gateway serves the split on its status.
    let status = demo.get("/status");
    assert!(status.contains("RolloutPolicy"), "{status}");
    let (code, printed) = demo.interrupt();
    assert!(code.success(), "exit {code:?}:\n{printed}");
    assert!(printed.contains("Stopped after"), "{printed}");
}
