//! The dashboard in a real browser: headless chromium loads the admin
//! listener's `/` from a gateway with traffic flowing and a rollout, runs
//! the page's polling, and the DOM it renders is checked for what a
//! person would see: route names, shares written as percentages, the
//! rollout's phase; then again after a weight change, with the chart of
//! the rollout's evidence drawn from `/overview`'s series.
//!
//! Skipped, with the reason on stderr, when no chromium is installed, and
//! a failure then with `SLUICE_REQUIRE_ALL=1` (`.ci/run` sets it and
//! installs Debian's `chromium`). `SLUICE_CHROMIUM` names the binary.
//!
//! The screenshot is taken from `sluice demo --keep-running`, what a new
//! user looks at: always into the test's temporary directory (checked to
//! be a PNG), and to `SLUICE_DASHBOARD_SCREENSHOT=path.png` when set (how
//! docs/dashboard.png is made).

mod demo_process;
mod serve_harness;

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::StatusCode;
use serde_json::Value;
use serve_harness::{DEADLINE, Fixture, route_yaml, write};

const POLICY: &str = "apiVersion: sluice.dev/v1alpha1
kind: RolloutPolicy
metadata: {name: web-rollout, namespace: default}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: web}]
  steps: ['50%', '100%']
  interval: 1h
  analysis: {minRequests: 1000000, maxErrorRate: '5%', maxLatency: 10s}
";

/// The browser: `$SLUICE_CHROMIUM`, else the first chromium on `PATH`;
/// or why there is none.
fn chromium() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("SLUICE_CHROMIUM") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("SLUICE_CHROMIUM={} is not a file", path.display()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err("no chromium found on PATH (install Debian's `chromium`, or set SLUICE_CHROMIUM)".into())
}

/// Load `url` in headless chromium, let the page poll for a few seconds of
/// virtual time, and return the DOM it rendered.
async fn render(chromium: &Path, url: String, screenshot: Option<PathBuf>) -> String {
    let chromium = chromium.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let profile = tempfile::tempdir().expect("temp profile");
        let mut command = std::process::Command::new(&chromium);
        command.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
            // Virtual time runs the page's 2 s polling a few times; it
            // stands still while a fetch is in flight.
            "--virtual-time-budget=5000",
        ]);
        command.arg(format!("--user-data-dir={}", profile.path().display()));
        match &screenshot {
            Some(path) => command.arg(format!("--screenshot={}", path.display())),
            None => command.arg("--dump-dom"),
        };
        let out = command.arg(&url).output().expect("chromium runs");
        assert!(
            out.status.success(),
            "chromium failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8 DOM")
    })
    .await
    .expect("chromium task")
}

/// The text of the `<b data-share="kind">` in the table row of `backend`.
fn share(dom: &str, backend: &str, kind: &str) -> String {
    let row_start = dom
        .find(&format!("data-backend=\"{backend}\""))
        .unwrap_or_else(|| panic!("no row for {backend} in\n{dom}"));
    let row = &dom[row_start..];
    let row = &row[..row.find("</tr>").expect("row ends")];
    let marker = format!("data-share=\"{kind}\">");
    let at = row
        .find(&marker)
        .unwrap_or_else(|| panic!("no {kind} share in {row}"))
        + marker.len();
    row[at..at + row[at..].find('<').expect("share ends")].to_string()
}

async fn overview(fx: &Fixture) -> Value {
    let (code, body) = fx.admin("/overview").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

/// Poll `/overview` until the rollout is in `phase`.
async fn wait_for_phase(fx: &Fixture, phase: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let o = overview(fx).await;
        if o["rollouts"][0]["phase"] == phase {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rollout never {phase}: {o:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Poll `/overview` until the rollout's history has at least two points
/// with requests, the newest counting `sent` requests on both sides; the
/// number of points with requests to the incoming backend then (a rate
/// to draw).
async fn wait_for_history(fx: &Fixture, sent: u64) -> usize {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let o = overview(fx).await;
        let h = &o["rollouts"][0]["history"];
        let points = h["t"].as_array().map_or(0, Vec::len);
        let newest = |column: &str| h[column][points.max(1) - 1].as_u64().unwrap_or(0);
        let with_requests = (0..points)
            .filter(|i| h["requests"][i].as_u64() > Some(0))
            .count();
        if with_requests >= 2 && newest("requests") + newest("stableRequests") == sent {
            return with_requests;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no history of {sent} requests: {o:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `(x, y)` pairs of an SVG `points` attribute.
fn coordinates(points: &str) -> Vec<(f64, f64)> {
    points
        .split_whitespace()
        .map(|p| {
            let (x, y) = p.split_once(',').expect("x,y");
            (x.parse().expect("x"), y.parse().expect("y"))
        })
        .collect()
}

/// The value of attribute `name` in the first element of `dom` that has
/// `marker`.
fn attribute(dom: &str, marker: &str, name: &str) -> String {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker} in\n{dom}"));
    let start = dom[..at + 1].rfind('<').expect("element start");
    let element = &dom[start..start + dom[start..].find('>').expect("element end")];
    let key = format!(" {name}=\"");
    let value = &element[element
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {element}"))
        + key.len()..];
    value[..value.find('"').expect("value end")].to_string()
}

/// The 5xx chart of the rollout in flight: the canary's rate line with a
/// point for each of the series' with requests (at least `points`: the
/// page polled later), left to right; its band; the limit (5%) drawn flat on the
/// axis's 5% line; the first step's boundary labelled 50%; the legend;
/// and the chart of slow responses.
fn check_chart(dom: &str, points: usize) {
    let chart = &dom[dom
        .find("<svg class=\"chart\" data-chart=\"errorRate\"")
        .unwrap_or_else(|| panic!("no 5xx chart in\n{dom}"))..];
    let chart = &chart[..chart.find("</svg>").expect("chart ends")];
    let drawn: usize = attribute(chart, "data-chart=", "data-points")
        .parse()
        .expect("a count");
    assert!(
        drawn >= points,
        "{drawn} points drawn, {points} in the series"
    );
    let canary = coordinates(&attribute(chart, "data-series=\"canary\"", "points"));
    assert!(
        canary.len() >= points && canary.len() <= drawn,
        "{points} to {drawn} points: {chart}"
    );
    assert_eq!(
        attribute(chart, "data-series=\"canary\"", "data-points"),
        canary.len().to_string()
    );
    assert!(canary.windows(2).all(|w| w[0].0 < w[1].0), "{canary:?}");
    assert!(chart.contains("data-series=\"canaryBand\""), "{chart}");
    assert!(chart.contains("data-series=\"stable\""), "{chart}");
    let limit = coordinates(&attribute(chart, "data-series=\"limit\"", "points"));
    assert_eq!(limit.len(), drawn);
    // The axis's 5% label sits 3 px below its grid line.
    let label = chart
        .find("text-anchor=\"end\">5%</text>")
        .unwrap_or_else(|| panic!("no 5% on the axis: {chart}"));
    let text = chart[..label].rfind("<text ").expect("the label's element");
    let y = attribute(&chart[text..], "<text", "y")
        .parse::<f64>()
        .expect("y")
        - 3.0;
    assert!(
        limit.iter().all(|p| (p.1 - y).abs() < 0.05),
        "the limit is drawn at 5% (y {y}): {limit:?}"
    );
    assert_eq!(
        attribute(chart, "data-boundary=\"started\"", "data-step"),
        "50%"
    );
    assert!(chart.contains(">50%</text>"), "{chart}");
    assert!(dom.contains("<b>5xx rate</b>"), "{dom}");
    assert!(dom.contains("limit 5%"), "{dom}");
    // maxLatency is set: the slow responses' chart too, its limit 1% (a
    // p99).
    let slow = &dom[dom
        .find("<svg class=\"chart\" data-chart=\"slowRate\"")
        .unwrap_or_else(|| panic!("no chart of slow responses in\n{dom}"))..];
    let slow = &slow[..slow.find("</svg>").expect("chart ends")];
    assert!(slow.contains("data-series=\"canary\""), "{slow}");
    assert!(slow.contains("data-series=\"limit\""), "{slow}");
    assert!(dom.contains("<b>slower than maxLatency</b>"), "{dom}");
    assert!(dom.contains("limit 1%"), "{dom}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_shares_and_rollouts_in_a_browser() {
    let Some(chromium) = sluice::testdata::or_skip(chromium()) else {
        return;
    };
    let fx = Fixture::start(&route_yaml("web", "/", 3, 1)).await;
    write(fx.dir.path(), "policy.yaml", POLICY);
    wait_for_phase(&fx, "Complete").await;
    for _ in 0..40 {
        assert_eq!(fx.request("/").await.0, StatusCode::OK);
    }
    let url = format!("http://{}/", fx.gateway.admin_addr());

    let dom = render(&chromium, url.clone(), None).await;
    assert!(
        dom.contains("data-polls=\""),
        "the page never polled:\n{dom}"
    );
    assert!(dom.contains("HTTPRoute default/web · rule 0"), "{dom}");
    assert_eq!(share(&dom, "default/blue:80", "spec"), "75%");
    assert_eq!(share(&dom, "default/green:80", "spec"), "25%");
    assert_eq!(share(&dom, "default/green:80", "served"), "25%");
    // 40 requests split exactly 3:1.
    assert_eq!(share(&dom, "default/green:80", "observed"), "25%");
    assert!(dom.contains("Gateway default/gw"), "{dom}");
    assert!(dom.contains("<td>1 ready</td>"), "ready endpoints: {dom}");
    assert!(dom.contains("<td class=\"phase\">Complete</td>"), "{dom}");

    // All to green: the rollout serves half of the way at its first step.
    let generation = fx.generation().await;
    write(fx.dir.path(), "route.yaml", &route_yaml("web", "/", 0, 1));
    fx.wait_for_generation_after(generation).await;
    wait_for_phase(&fx, "Progressing").await;
    let dom = render(&chromium, url.clone(), None).await;
    assert_eq!(share(&dom, "default/green:80", "spec"), "100%");
    assert_eq!(share(&dom, "default/blue:80", "spec"), "0%");
    assert_eq!(share(&dom, "default/green:80", "served"), "62.5%");
    assert!(
        dom.contains("<td class=\"phase\">Progressing</td>"),
        "{dom}"
    );
    assert!(dom.contains("default/web-rollout"), "{dom}");
    // Gate values against the policy's limits.
    assert!(dom.contains("(needs 1000000 req"), "{dom}");
    assert!(dom.contains("1h per step)"), "{dom}");

    // Traffic at the step: the chart of its evidence.
    for _ in 0..20 {
        assert_eq!(fx.request("/").await.0, StatusCode::OK);
    }
    let points = wait_for_history(&fx, 20).await;
    let dom = render(&chromium, url.clone(), None).await;
    check_chart(&dom, points);

    fx.gateway.shutdown().await;
}

/// The dashboard of `sluice demo --keep-running` (the real binary) in the
/// browser, mid-cycle: the demo's routes and both rollout policies shown,
/// and the screenshot taken from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keep_running_demo_s_dashboard_in_a_browser() {
    let Some(chromium) = sluice::testdata::or_skip(chromium()) else {
        return;
    };
    let mut demo = tokio::task::spawn_blocking(|| {
        let mut demo = demo_process::LiveDemo::start();
        demo.wait_for_a_cycle();
        demo
    })
    .await
    .expect("demo");
    let url = format!("http://{}/", demo.admin);
    let dom = render(&chromium, url.clone(), None).await;
    for shown in [
        "default/autocomplete",
        "default/checkout",
        "default/recommend",
        "default/payments",
    ] {
        assert!(dom.contains(shown), "{shown} not on the dashboard: {dom}");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let shot = dir.path().join("dashboard.png");
    render(&chromium, url.clone(), Some(shot.clone())).await;
    let png = std::fs::read(&shot).expect("a screenshot was written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    if let Some(path) = std::env::var_os("SLUICE_DASHBOARD_SCREENSHOT") {
        std::fs::copy(&shot, path).expect("copy the screenshot");
    }
    demo.next_line();
    let (code, printed) = demo.interrupt();
    assert!(code.success(), "exit {code:?}:\n{printed}");
}
