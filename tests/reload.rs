//! Reloading through real sockets: `sluice::serve::start` on manifests in a
//! temp directory, backends started here, files edited while traffic flows.

mod serve_harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::StatusCode;
use serve_harness::{Client, DEADLINE, Fixture, rename_replace, route_yaml, write};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_a_file_changes_routing() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    fx.wait_for_backend("/", "blue").await;

    write(fx.dir.path(), "route.yaml", &route_yaml("web", "/", 0, 1));
    fx.wait_for_backend("/", "green").await;

    // A new route in a new file is picked up too.
    write(
        fx.dir.path(),
        "extra.yaml",
        &route_yaml("extra", "/extra", 1, 0),
    );
    fx.wait_for_backend("/extra", "blue").await;
    fx.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_replace_of_a_file_is_picked_up_every_time() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    fx.wait_for_backend("/", "blue").await;
    // Twice: a watch on the replaced file's old inode would hear only once.
    rename_replace(fx.dir.path(), "route.yaml", &route_yaml("web", "/", 0, 1));
    fx.wait_for_backend("/", "green").await;
    rename_replace(fx.dir.path(), "route.yaml", &route_yaml("web", "/", 1, 0));
    fx.wait_for_backend("/", "blue").await;
    fx.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_file_path_is_watched_through_rename_replace() {
    // `-f FILE` rather than a directory: the watch must survive the file's
    // inode being replaced.
    let blue = serve_harness::start_backend("blue").await;
    let green = serve_harness::start_backend("green").await;
    let port = serve_harness::free_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let all = |b: u32, g: u32| {
        format!(
            "{}---\n{}---\n{}---\n{}",
            serve_harness::gateway_yaml(port),
            serve_harness::service_yaml("blue", blue),
            serve_harness::service_yaml("green", green),
            route_yaml("web", "/", b, g)
        )
    };
    write(dir.path(), "all.yaml", &all(1, 0));
    // A file next to it that is not configured: never read.
    write(
        dir.path(),
        "other.yaml",
        &route_yaml("other", "/other", 1, 0),
    );
    let gateway = sluice::serve::start(sluice::serve::ServeConfig {
        paths: vec![dir.path().join("all.yaml")],
        bind: std::net::Ipv4Addr::LOCALHOST.into(),
        admin: (std::net::Ipv4Addr::LOCALHOST, 0).into(),
        crds: Vec::new(),
    })
    .await
    .expect("gateway starts");
    let listener = (std::net::Ipv4Addr::LOCALHOST, port).into();
    let wait_for = |path: &'static str, want: &'static str| async move {
        serve_harness::wait_for(listener, path, want, |_, body| body == want)
            .await
            .0
    };
    assert_eq!(wait_for("/", "blue").await, StatusCode::OK);
    rename_replace(dir.path(), "all.yaml", &all(0, 1));
    assert_eq!(wait_for("/", "green").await, StatusCode::OK);
    rename_replace(dir.path(), "all.yaml", &all(1, 0));
    assert_eq!(wait_for("/", "blue").await, StatusCode::OK);
    // `other.yaml` was never served: `/other` falls to the `/` route.
    assert_eq!(serve_harness::get(listener, "/other").await.1, "blue");
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_file_removes_its_routes() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    write(
        fx.dir.path(),
        "extra.yaml",
        &route_yaml("extra", "/extra", 0, 1),
    );
    fx.wait_for_backend("/extra", "green").await;

    std::fs::remove_file(fx.path("extra.yaml")).expect("remove extra.yaml");
    // `/extra` falls back to the `/` route of route.yaml...
    fx.wait_for_backend("/extra", "blue").await;

    // ...and with route.yaml gone nothing routes at all.
    std::fs::remove_file(fx.path("route.yaml")).expect("remove route.yaml");
    fx.wait_for_response("/", "404", |status, _| status == StatusCode::NOT_FOUND)
        .await;
    let status = fx.status().await;
    let routes = status
        .as_array()
        .expect("/status is an array")
        .iter()
        .filter(|o| o["kind"] == "HTTPRoute")
        .count();
    assert_eq!(routes, 0, "{status:#}");
    fx.gateway.shutdown().await;
}

/// The key acceptance test: weights flip between 1/0 and 0/1 over
/// and over while several keep-alive clients send requests without pause.
/// Every response must be a 200 from blue or green, on the connection each
/// client opened at the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipping_weights_under_keep_alive_traffic_drops_nothing() {
    const CLIENTS: usize = 4;
    const FLIPS: usize = 16;
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    fx.wait_for_backend("/", "blue").await;

    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let stop = stop.clone();
        let mut client = Client::connect(fx.listener).await.expect("connect");
        clients.push(tokio::spawn(async move {
            let (mut blue, mut green, mut failures) = (0usize, 0usize, Vec::new());
            let deadline = tokio::time::Instant::now() + DEADLINE * 3;
            while !stop.load(Ordering::Relaxed) && tokio::time::Instant::now() < deadline {
                match client.get("/").await {
                    Ok((StatusCode::OK, body)) if body == "blue" => blue += 1,
                    Ok((StatusCode::OK, body)) if body == "green" => green += 1,
                    Ok(other) => failures.push(format!("{other:?}")),
                    Err(error) => {
                        // The connection is gone: that is a drop too, and
                        // nothing more can be sent on it.
                        failures.push(format!("connection: {error}"));
                        break;
                    }
                }
            }
            (blue, green, failures)
        }));
    }

    // Flip, and wait for each flip to be applied (about every 200 ms with
    // the source's debounce) before the next one.
    let mut generation = fx.generation().await;
    for flip in 0..FLIPS {
        let (b, g) = if flip % 2 == 0 { (0, 1) } else { (1, 0) };
        rename_replace(fx.dir.path(), "route.yaml", &route_yaml("web", "/", b, g));
        generation = fx.wait_for_generation_after(generation).await;
    }
    stop.store(true, Ordering::Relaxed);

    let (mut blue, mut green) = (0, 0);
    for client in clients {
        let (b, g, failures) = client.await.expect("client task");
        assert!(
            failures.is_empty(),
            "{} requests dropped or failed, first ones: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
        blue += b;
        green += g;
    }
    // Both weights were in force for a while, so both backends answered.
    assert!(blue > 0 && green > 0, "blue {blue}, green {green}");
    fx.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_changes_bump_the_generation_in_status() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    let generation_of_web = |status: &serde_json::Value| {
        status
            .as_array()
            .expect("/status is an array")
            .iter()
            .find(|o| o["kind"] == "HTTPRoute" && o["metadata"]["name"] == "web")
            .map(|o| o["metadata"]["generation"].clone())
    };
    assert_eq!(
        generation_of_web(&fx.status().await),
        Some(serde_json::json!(1))
    );
    // Same spec, rewritten: no new generation for the object.
    let applied = fx.generation().await;
    write(fx.dir.path(), "route.yaml", &route_yaml("web", "/", 1, 0));
    write(
        fx.dir.path(),
        "unrelated.yaml",
        &route_yaml("x", "/x", 1, 0),
    );
    fx.wait_for_generation_after(applied).await;
    assert_eq!(
        generation_of_web(&fx.status().await),
        Some(serde_json::json!(1))
    );

    write(fx.dir.path(), "route.yaml", &route_yaml("web", "/", 0, 1));
    fx.wait_for_backend("/", "green").await;
    let status = fx.status().await;
    assert_eq!(generation_of_web(&status), Some(serde_json::json!(2)));
    let route = status
        .as_array()
        .expect("/status is an array")
        .iter()
        .find(|o| o["kind"] == "HTTPRoute" && o["metadata"]["name"] == "web")
        .expect("web in /status");
    for condition in route["status"]["parents"][0]["conditions"]
        .as_array()
        .expect("conditions")
    {
        assert_eq!(condition["observedGeneration"], 2, "{route:#}");
    }
    fx.gateway.shutdown().await;
}

/// The `lastTransitionTime` of each condition of route `name`'s first
/// parent, by type.
fn route_condition_times(status: &serde_json::Value, name: &str) -> Vec<(String, String, String)> {
    let route = status
        .as_array()
        .expect("/status is an array")
        .iter()
        .find(|o| o["kind"] == "HTTPRoute" && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("route {name} not in /status: {status:#}"));
    route["status"]["parents"][0]["conditions"]
        .as_array()
        .expect("conditions is an array")
        .iter()
        .map(|c| {
            (
                c["type"].as_str().expect("type").to_string(),
                c["status"].as_str().expect("status").to_string(),
                c["lastTransitionTime"]
                    .as_str()
                    .expect("lastTransitionTime")
                    .to_string(),
            )
        })
        .collect()
}

/// Poll until the wall clock is a whole second past every time in `times`,
/// so that a condition stamped anew shows a different `lastTransitionTime`
/// (it has a resolution of one second).
async fn wait_until_after(times: &[(String, String, String)]) {
    use k8s_openapi::jiff::{Timestamp, ToSpan};
    let latest = times
        .iter()
        .map(|(_, _, t)| t.parse::<Timestamp>().expect("RFC 3339 time"))
        .max()
        .expect("at least one condition");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while Timestamp::now() < latest + 1.second() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "clock stuck before {latest}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_conditions_keep_their_transition_time_across_reloads() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    let before = route_condition_times(&fx.status().await, "web");
    let time_of = |times: &[(String, String, String)], type_: &str| {
        times
            .iter()
            .find(|(t, _, _)| t == type_)
            .map(|(_, status, time)| (status.clone(), time.clone()))
            .unwrap_or_else(|| panic!("no {type_} condition in {times:?}"))
    };
    assert_eq!(time_of(&before, "Accepted").0, "True", "{before:?}");
    assert_eq!(time_of(&before, "ResolvedRefs").0, "True", "{before:?}");

    // A reload caused by an unrelated object: web's conditions are the
    // same, and so are their times.
    wait_until_after(&before).await;
    let applied = fx.generation().await;
    write(
        fx.dir.path(),
        "unrelated.yaml",
        &route_yaml("x", "/x", 1, 0),
    );
    fx.wait_for_generation_after(applied).await;
    let after_unrelated = route_condition_times(&fx.status().await, "web");
    assert_eq!(after_unrelated, before);

    // web now points at a Service that does not exist: ResolvedRefs flips
    // and gets a new time; Accepted stays True (at a new generation) and
    // keeps its time.
    wait_until_after(&before).await;
    write(
        fx.dir.path(),
        "route.yaml",
        &route_yaml("web", "/", 1, 0).replace("name: blue", "name: missing"),
    );
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let flipped = loop {
        let times = route_condition_times(&fx.status().await, "web");
        if time_of(&times, "ResolvedRefs").0 == "False" {
            break times;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "ResolvedRefs still True: {times:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    };
    assert_eq!(time_of(&flipped, "Accepted"), time_of(&before, "Accepted"));
    assert_ne!(
        time_of(&flipped, "ResolvedRefs").1,
        time_of(&before, "ResolvedRefs").1,
        "{flipped:?}"
    );
    fx.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subdirectory_created_after_startup_is_watched() {
    let fx = Fixture::start(&route_yaml("web", "/", 1, 0)).await;
    fx.wait_for_backend("/", "blue").await;
    let sub = fx.dir.path().join("team-a").join("routes");
    std::fs::create_dir_all(&sub).expect("create subdirectory");
    write(&sub, "a.yaml", &route_yaml("a", "/a", 0, 1));
    fx.wait_for_backend("/a", "green").await;
    // Later edits inside the new directory are heard as well.
    write(&sub, "a.yaml", &route_yaml("a", "/a", 1, 0));
    fx.wait_for_backend("/a", "blue").await;
    rename_replace(&sub, "a.yaml", &route_yaml("a", "/a", 0, 1));
    fx.wait_for_backend("/a", "green").await;
    fx.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_directory_that_appears_after_startup_is_watched() {
    let blue = serve_harness::start_backend("blue").await;
    let green = serve_harness::start_backend("green").await;
    let port = serve_harness::free_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().join("base");
    std::fs::create_dir(&base).expect("create base");
    write(&base, "gateway.yaml", &serve_harness::gateway_yaml(port));
    write(
        &base,
        "services.yaml",
        &format!(
            "{}---\n{}",
            serve_harness::service_yaml("blue", blue),
            serve_harness::service_yaml("green", green)
        ),
    );
    write(&base, "route.yaml", &route_yaml("web", "/", 1, 0));
    // Configured but not there yet (a volume mounted late, say).
    let later = dir.path().join("later");
    let gateway = sluice::serve::start(sluice::serve::ServeConfig {
        paths: vec![base.clone(), later.clone()],
        bind: std::net::Ipv4Addr::LOCALHOST.into(),
        admin: (std::net::Ipv4Addr::LOCALHOST, 0).into(),
        crds: Vec::new(),
    })
    .await
    .expect("gateway starts with a configured path missing");
    let listener: std::net::SocketAddr = (std::net::Ipv4Addr::LOCALHOST, port).into();
    let admin = gateway.admin_addr();
    let wait_for = |path: &'static str, want: &'static str| async move {
        serve_harness::wait_for(listener, path, want, |_, body| body == want)
            .await
            .0
    };
    assert_eq!(wait_for("/", "blue").await, StatusCode::OK);
    let errors = serve_harness::get(admin, "/errors").await.1;
    assert!(
        errors.contains("later"),
        "missing path not reported: {errors}"
    );

    // The directory appears (empty), and once that is applied a manifest
    // is written into it: the write must be heard on its own.
    std::fs::create_dir(&later).expect("create later");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while serve_harness::get(admin, "/errors")
        .await
        .1
        .contains("later")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new directory was never read"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    write(&later, "late.yaml", &route_yaml("late", "/late", 0, 1));
    assert_eq!(wait_for("/late", "green").await, StatusCode::OK);
    // Nested directories inside it are watched too.
    let nested = later.join("nested");
    std::fs::create_dir(&nested).expect("create nested");
    write(&nested, "n.yaml", &route_yaml("n", "/n", 0, 1));
    assert_eq!(wait_for("/n", "green").await, StatusCode::OK);

    // Deleted, and created again: the new directory is watched in turn.
    std::fs::remove_dir_all(&later).expect("remove later");
    assert_eq!(wait_for("/late", "blue").await, StatusCode::OK);
    std::fs::create_dir(&later).expect("create later again");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !serve_harness::get(admin, "/errors").await.1.contains("[]") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the recreated directory was never read"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    write(&later, "late.yaml", &route_yaml("late", "/late", 0, 1));
    assert_eq!(wait_for("/late", "green").await, StatusCode::OK);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_directory_deleted_and_created_again_is_watched() {
    // Served by routes' presence in `/status`: no backends needed.
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().join("base");
    std::fs::create_dir(&base).expect("create base");
    write(
        &base,
        "gateway.yaml",
        &serve_harness::gateway_yaml(serve_harness::free_port()),
    );
    // A second configured directory, there at startup.
    let teams = dir.path().join("teams");
    std::fs::create_dir(&teams).expect("create teams");
    write(&teams, "t.yaml", &route_yaml("t", "/t", 0, 1));
    let gateway = sluice::serve::start(sluice::serve::ServeConfig {
        paths: vec![base, teams.clone()],
        bind: std::net::Ipv4Addr::LOCALHOST.into(),
        admin: (std::net::Ipv4Addr::LOCALHOST, 0).into(),
        crds: Vec::new(),
    })
    .await
    .expect("gateway starts");
    let admin = gateway.admin_addr();
    let has_route = |name: &'static str| async move {
        let body = serve_harness::get(admin, "/status").await.1;
        let status: serde_json::Value = serde_json::from_str(&body).expect("/status is JSON");
        status
            .as_array()
            .expect("/status is an array")
            .iter()
            .any(|o| o["kind"] == "HTTPRoute" && o["metadata"]["name"] == name)
    };
    let wait_for_route = |name: &'static str, present: bool| async move {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while has_route(name).await != present {
            assert!(
                tokio::time::Instant::now() < deadline,
                "route {name} present: expected {present}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
    };
    wait_for_route("t", true).await;
    std::fs::remove_dir_all(&teams).expect("remove teams");
    wait_for_route("t", false).await;
    std::fs::create_dir(&teams).expect("create teams again");
    write(&teams, "u.yaml", &route_yaml("u", "/u", 0, 1));
    wait_for_route("u", true).await;
    // And files edited in it later are heard too.
    write(&teams, "v.yaml", &route_yaml("v", "/v", 0, 1));
    wait_for_route("v", true).await;
    gateway.shutdown().await;
}
