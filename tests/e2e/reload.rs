//! Reloads under load: weights flipped while keep-alive clients keep
//! sending; nothing may fail. A broken file keeps the last good config.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::*;

fn flip_route(blue: u32, green: u32) -> String {
    route(
        "default",
        "checkout",
        &format!(
            "  rules:\n  - backendRefs:\n    - {{name: blue, port: 8080, weight: {blue}}}\n    - {{name: green, port: 8080, weight: {green}}}"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flipping_weights_under_keep_alive_traffic_drops_nothing() {
    let blue = Pods::start("default", "blue", 2).await;
    let green = Pods::start("default", "green", 2).await;
    let gw = Sluice::start(&[
        (
            "base.yaml",
            gateway() + &blue.manifests() + &green.manifests(),
        ),
        ("route.yaml", flip_route(1, 0)),
    ])
    .await;

    let reloads_before = gw.metric("sluice_config_reloads_total").await;
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let mut conn = gw.connect().await;
        let (stop, ok) = (stop.clone(), ok.clone());
        clients.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = conn.get("checkout.example.com", "/").await;
                if r.status == 200 {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failures.push(r.status);
                }
            }
            failures
        }));
    }
    // Ten flips, each waited for until it is served, under continuous load.
    for flip in 0..10 {
        let (b, g, want) = if flip % 2 == 0 {
            (0, 1, "green")
        } else {
            (1, 0, "blue")
        };
        gw.write("route.yaml", &flip_route(b, g));
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let pod = gw
                .connect()
                .await
                .get("checkout.example.com", "/")
                .await
                .pod();
            if pod.starts_with(want) {
                break;
            }
            assert!(Instant::now() < deadline, "flip {flip} never took effect");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for c in clients {
        failures.extend(c.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "failed requests during reloads: {failures:?}"
    );
    assert!(ok.load(Ordering::Relaxed) > 100);
    assert!(blue.requests() > 0 && green.requests() > 0);
    // Each flip was served, so each was a reload: the counter moved by at
    // least ten (a flip's write may be seen as more than one change).
    let reloads = gw.metric("sluice_config_reloads_total").await - reloads_before;
    assert!(
        reloads >= 10.0,
        "{reloads} reloads counted for ten flips:\n{}",
        gw.metrics().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_file_keeps_its_last_good_objects_serving() {
    let app = Pods::start("default", "app", 1).await;
    let gw = Sluice::start(&[
        ("base.yaml", gateway() + &app.manifests()),
        (
            "route.yaml",
            route(
                "default",
                "app",
                "  rules:\n  - backendRefs: [{name: app, port: 8080}]",
            ),
        ),
    ])
    .await;
    assert_eq!(gw.connect().await.get("h", "/").await.pod(), "app-0");
    // A YAML syntax error on line 4 of route.yaml.
    gw.write(
        "route.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: [unclosed\n",
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let errors = gw.errors().await.to_string();
        if errors.contains("route.yaml") {
            assert!(errors.contains("line") || errors.contains(":4"), "{errors}");
            break;
        }
        assert!(Instant::now() < deadline, "parse error never reported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Still served by the route the file held before it broke.
    for _ in 0..20 {
        assert_eq!(gw.connect().await.get("h", "/").await.pod(), "app-0");
    }
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("sluice_config_errors_total{file="),
        "{metrics}"
    );
}

/// Route `r{i}` on hostname `r{i}.example.com`, all of it to `blue` or all
/// of it to `green`.
fn one_of_many(i: usize, to_green: bool) -> String {
    let (b, g) = if to_green { (0, 1) } else { (1, 0) };
    route(
        "default",
        &format!("r{i}"),
        &format!(
            "  hostnames: [r{i}.example.com]\n  rules:\n  - backendRefs:\n    - {{name: blue, port: 8080, weight: {b}}}\n    - {{name: green, port: 8080, weight: {g}}}"
        ),
    )
}

/// Many routes in one file, `to_green(i)` saying where each one sends.
fn many_routes(n: usize, to_green: impl Fn(usize) -> bool) -> String {
    (0..n).map(|i| one_of_many(i, to_green(i))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_one_route_among_many_in_a_file_changes_that_route_only() {
    const ROUTES: usize = 60;
    const CHANGED: usize = 17;
    let blue = Pods::start("default", "blue", 1).await;
    let green = Pods::start("default", "green", 1).await;
    let before = |i: usize| i % 2 == 1;
    let gw = Sluice::start(&[
        (
            "base.yaml",
            gateway() + &blue.manifests() + &green.manifests(),
        ),
        ("routes.yaml", many_routes(ROUTES, before)),
    ])
    .await;
    let mut conn = gw.connect().await;
    for i in 0..ROUTES {
        let pod = conn.get(&format!("r{i}.example.com"), "/").await.pod();
        assert_eq!(
            pod.starts_with("green"),
            before(i),
            "route r{i} before: {pod}"
        );
    }
    let generation = |status: serde_json::Value| status["metadata"]["generation"].clone();
    assert_eq!(
        generation(gw.object_status("HTTPRoute", Some("default"), "r17").await),
        1
    );

    // The same file, with one route's split turned around.
    let after = |i: usize| if i == CHANGED { !before(i) } else { before(i) };
    gw.write("routes.yaml", &many_routes(ROUTES, after));
    gw.eventually(&format!("r{CHANGED}.example.com"), "/", |r| {
        r.pod()
            .starts_with(if after(CHANGED) { "green" } else { "blue" })
    })
    .await;
    // Served only by the new split from now on; every other route as before.
    let mut conn = gw.connect().await;
    for _ in 0..10 {
        let pod = conn
            .get(&format!("r{CHANGED}.example.com"), "/")
            .await
            .pod();
        assert!(pod.starts_with("green") == after(CHANGED), "{pod}");
    }
    for i in 0..ROUTES {
        let pod = conn.get(&format!("r{i}.example.com"), "/").await.pod();
        assert_eq!(
            pod.starts_with("green"),
            after(i),
            "route r{i} after: {pod}"
        );
    }
    // The status follows once published: the changed route's spec is at
    // generation 2 and observed there; the others stay at 1.
    let observed = |status: &serde_json::Value| {
        status["status"]["parents"][0]["conditions"][0]["observedGeneration"].clone()
    };
    poll_until(
        "the changed route's status to show generation 2",
        || gw.log(),
        async || {
            let s = gw.object_status("HTTPRoute", Some("default"), "r17").await;
            generation(s.clone()) == 2 && observed(&s) == 2
        },
    )
    .await;
    let other = gw.object_status("HTTPRoute", Some("default"), "r16").await;
    assert_eq!(generation(other.clone()), 1, "{other:#}");
    assert_eq!(observed(&other), 1, "{other:#}");
}

/// `routes` served by the routes of `one_of_many` (`to_green(i)` saying
/// where each one sends): each route's pod prefix, in order.
async fn served_pods(gw: &Sluice, routes: std::ops::Range<usize>) -> Vec<(usize, String)> {
    let mut conn = gw.connect().await;
    let mut pods = Vec::new();
    for i in routes {
        pods.push((i, conn.get(&format!("r{i}.example.com"), "/").await.pod()));
    }
    pods
}

fn want(routes: std::ops::Range<usize>, to_green: impl Fn(usize) -> bool) -> Vec<(usize, String)> {
    routes
        .map(|i| {
            (
                i,
                if to_green(i) { "green-0" } else { "blue-0" }.to_string(),
            )
        })
        .collect()
}

/// The files source changes the snapshot in place: the unchanged files'
/// routes are kept as they were read (not parsed again, not copied), and
/// must go on serving, at their generation and with their conditions'
/// times, exactly as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_one_file_of_several_serves_it_and_keeps_the_others_as_they_were() {
    let blue = Pods::start("default", "blue", 1).await;
    let green = Pods::start("default", "green", 1).await;
    // Three files of ten routes each: r0-r9, r10-r19, r20-r29.
    let file = |f: usize, to_green: &dyn Fn(usize) -> bool| -> String {
        (10 * f..10 * f + 10)
            .map(|i| one_of_many(i, to_green(i)))
            .collect()
    };
    let before = |i: usize| i.is_multiple_of(3);
    let gw = Sluice::start(&[
        (
            "base.yaml",
            gateway() + &blue.manifests() + &green.manifests(),
        ),
        ("routes-0.yaml", file(0, &before)),
        ("routes-1.yaml", file(1, &before)),
        ("routes-2.yaml", file(2, &before)),
    ])
    .await;
    assert_eq!(served_pods(&gw, 0..30).await, want(0..30, before));
    let r5_before = gw.object_status("HTTPRoute", Some("default"), "r5").await;
    let r25_before = gw.object_status("HTTPRoute", Some("default"), "r25").await;

    // The middle file: every route of it turned around.
    let after = |i: usize| {
        if (10..20).contains(&i) {
            !before(i)
        } else {
            before(i)
        }
    };
    gw.write("routes-1.yaml", &file(1, &after));
    gw.eventually("r10.example.com", "/", |r| r.pod() == "green-0")
        .await;
    assert_eq!(served_pods(&gw, 0..30).await, want(0..30, after));

    // Status, once published: the changed file's routes at generation 2,
    // the others' untouched (generation 1, same creation time, same
    // condition times).
    poll_until(
        "r15's status to show generation 2",
        || gw.log(),
        async || {
            let s = gw.object_status("HTTPRoute", Some("default"), "r15").await;
            s["metadata"]["generation"] == 2
                && s["status"]["parents"][0]["conditions"][0]["observedGeneration"] == 2
        },
    )
    .await;
    assert_eq!(
        gw.object_status("HTTPRoute", Some("default"), "r5").await,
        r5_before
    );
    assert_eq!(
        gw.object_status("HTTPRoute", Some("default"), "r25").await,
        r25_before
    );

    // A route added to the last file and one removed from the first: both
    // seen, the rest as they were.
    gw.write("routes-2.yaml", &(file(2, &after) + &one_of_many(30, true)));
    gw.write(
        "routes-0.yaml",
        &(1..10)
            .map(|i| one_of_many(i, after(i)))
            .collect::<String>(),
    );
    gw.eventually("r30.example.com", "/", |r| r.pod() == "green-0")
        .await;
    gw.eventually("r0.example.com", "/", |r| r.status == 404)
        .await;
    assert_eq!(served_pods(&gw, 1..30).await, want(1..30, after));
    assert!(gw.errors().await.as_array().is_some_and(|e| e.is_empty()));
}

/// DESIGN.md's standalone contract: a file that does not parse keeps
/// serving its last good objects (and is reported); an object refused by
/// validation is dropped alone. With several files, a later change to
/// another file must not lose the broken file's last good objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_edit_to_one_file_of_several_keeps_that_files_last_good_objects() {
    let blue = Pods::start("default", "blue", 1).await;
    let green = Pods::start("default", "green", 1).await;
    let gw = Sluice::start(&[
        (
            "base.yaml",
            gateway() + &blue.manifests() + &green.manifests(),
        ),
        ("a.yaml", many_routes(5, |_| false)),
        ("b.yaml", (5..10).map(|i| one_of_many(i, false)).collect()),
    ])
    .await;
    assert_eq!(served_pods(&gw, 0..10).await, want(0..10, |_| false));

    // b.yaml stops parsing (an unclosed flow sequence on its last line).
    let broken = (5..10).map(|i| one_of_many(i, true)).collect::<String>() + "---\nkind: [\n";
    gw.write("b.yaml", &broken);
    poll_until(
        "b.yaml's parse error on /errors",
        || gw.log(),
        async || gw.errors().await.to_string().contains("b.yaml"),
    )
    .await;
    assert_eq!(served_pods(&gw, 0..10).await, want(0..10, |_| false));

    // Another file changes while b.yaml is still broken: that change is
    // served, b.yaml's last good routes still are, its error still shown.
    gw.write("a.yaml", &many_routes(5, |i| i == 2));
    gw.eventually("r2.example.com", "/", |r| r.pod() == "green-0")
        .await;
    assert_eq!(served_pods(&gw, 0..10).await, want(0..10, |i| i == 2));
    assert!(gw.errors().await.to_string().contains("b.yaml"));

    // b.yaml fixed, with one route refused by validation: that route alone
    // is dropped, the rest of the file serves its new version.
    let mut fixed: String = (5..10)
        .filter(|i| *i != 7)
        .map(|i| one_of_many(i, true))
        .collect();
    fixed += &route(
        "default",
        "r7",
        "  hostnames: [r7.example.com]\n  rules:\n  - backendRefs:\n    - {name: green, port: 8080, weight: 2000000}",
    );
    gw.write("b.yaml", &fixed);
    gw.eventually("r5.example.com", "/", |r| r.pod() == "green-0")
        .await;
    gw.eventually("r7.example.com", "/", |r| r.status == 404)
        .await;
    let want_after = want(0..10, |i| i == 2 || i >= 5);
    let served: Vec<_> = served_pods(&gw, 0..10)
        .await
        .into_iter()
        .filter(|(i, _)| *i != 7)
        .collect();
    let want_after: Vec<_> = want_after.into_iter().filter(|(i, _)| *i != 7).collect();
    assert_eq!(served, want_after);
    // The parse error is gone; what is left is r7's refusal.
    let errors = gw.errors().await;
    let of_b: Vec<&serde_json::Value> = errors
        .as_array()
        .expect("/errors is an array")
        .iter()
        .filter(|e| e["file"].as_str().is_some_and(|f| f.ends_with("b.yaml")))
        .collect();
    assert_eq!(of_b.len(), 1, "{errors:#}");
    assert_eq!(of_b[0]["object"], "HTTPRoute default/r7", "{errors:#}");
    assert!(
        of_b[0]["field"]
            .as_str()
            .is_some_and(|f| f.ends_with("weight")),
        "{errors:#}"
    );
}
