//! `sluice demo` end to end: the embedded examples served by the in-process
//! gateway to echo pods, with the counts the pods received.

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
        stdout.contains("All 1250 requests answered 200."),
        "{stdout}"
    );
}
