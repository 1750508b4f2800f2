//! How sluice's cost grows with its configuration, and what reloading a big
//! configuration costs the traffic (driven by `bench/driver.py`).
//!
//! `scale N [--one-host]`: parse and translate `N` generated HTTPRoutes,
//! report parse and translate time, resident memory, and the time to match
//! a request, as one JSON object.
//!
//! `reload N --listen ADDR --stable ADDR --canary ADDR [--interval-ms 100]
//! [--reloads 1000]`: serve `N` generated HTTPRoutes plus the route `bench`
//! (no hostname, 995/5 over the two backends) with sluice's proxy, print
//! `ready`, wait for a line on stdin, then rebuild the route table every
//! interval (translate of the whole snapshot, `bench` flipping between 995/5
//! and 90/10, swapped into the proxy as `sluice serve` does) and report the
//! resident memory after the first and after the last rebuild. Stops after
//! `--max-seconds` (150) if the rebuilds take longer than the interval.
//!
//! `overview N`: with `N` generated HTTPRoutes translated and one request
//! counted per backend, the cost of what the dashboard polls (`/overview`,
//! built and serialized) and of a `/metrics` scrape (every share gauge and
//! per-backend histogram), median of 20 of each, as one JSON object.
//!
//! `manifests N`: print the generated configuration of `N` routes (to
//! serve it with a `sluice` binary and read its admin listener).
//!
//! `flip N [--flips K]`: what `sluice serve -f` does for a weight flip
//! with `N` more routes loaded, by phase, without the proxy or the file
//! watch: `N` routes in one file and the flipped route in another (as the
//! flip row has them), then `K` (10) times: rewrite the flipped file, read
//! the files into a snapshot (`FileSource::reload`: read, parse what
//! changed, merge, generations) and translate it reusing the last
//! translation's compiled routes, up to the table (what the flip waits
//! for) and to the end (status). Medians of this thread's CPU time, ms,
//! as one JSON object.
//!
//! Built with `cargo bench --no-run`.

use std::io::BufRead;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::metrics::Metrics;
use sluice::proxy::Proxy;
use sluice::route::{Lookup, RouteTable};
use sluice::translate::{TranslateOptions, translate};

#[path = "support/routes.rs"]
mod routes;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("scale") => scale(&args[1..]),
        Some("reload") => reload(&args[1..]),
        Some("overview") => overview(&args[1..]),
        Some("flip") => flip(&args[1..]),
        Some("manifests") => count(&args[1..]).map(|n| {
            print!(
                "{}{}",
                routes::infrastructure(&routes::Layout::default()),
                routes::routes(n, false)
            )
        }),
        // `cargo bench` runs every bench target with `--bench`: nothing to do.
        _ => {
            eprintln!(
                "usage: scale scale N [--one-host] | scale reload N --listen A --stable A --canary A [--interval-ms MS] [--reloads N]"
            );
            return;
        }
    };
    if let Err(e) = result {
        eprintln!("scale: {e}");
        std::process::exit(2);
    }
}

fn flip(args: &[String]) -> Result<(), String> {
    use sluice::rollout::ServedShares;
    use sluice::source::files::FileSource;
    use sluice::translate::{CompiledRoutes, translate_reusing};

    let n = count(args)?;
    let flips: usize = flag(args, "--flips", Some(10))?;
    let layout = routes::Layout::default();
    let options = TranslateOptions {
        default_bind: layout.listen.ip(),
    };
    let dir = std::env::temp_dir().join(format!("sluice-scale-flip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"))
    };
    write("a-infrastructure.yaml", &routes::infrastructure(&layout))?;
    write("b-routes.yaml", &routes::routes(n, false))?;
    // The flipped route: the flip row's, no hostname, its weights swapped
    // at each flip.
    let flipped = |i: usize| {
        if i.is_multiple_of(2) {
            routes::hot_route(0, 1)
        } else {
            routes::hot_route(1, 0)
        }
    };
    write("c-flip.yaml", &flipped(1))?;
    let mut source = FileSource::new(vec![dir.clone()], Arc::new(Metrics::new()));
    let served = ServedShares::default();
    let mut compiled = CompiledRoutes::new();
    let first = source
        .reload()
        .ok_or("the first reload gives a configuration")?;
    let snapshot = Arc::new(first.snapshot);
    translate_reusing(
        &snapshot,
        &options,
        &served,
        k8s_openapi::jiff::Timestamp::now(),
        &mut compiled,
        |_| {},
    );
    drop(snapshot);
    let (mut reads, mut tables, mut totals) = (Vec::new(), Vec::new(), Vec::new());
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for i in 0..flips {
        write("c-flip.yaml", &flipped(i))?;
        let cpu = thread_cpu();
        let update = source.reload().ok_or("a flip changes the configuration")?;
        let snapshot = Arc::new(update.snapshot);
        let read = thread_cpu();
        let mut table = None;
        let mut routing = None;
        translate_reusing(
            &snapshot,
            &options,
            &served,
            k8s_openapi::jiff::Timestamp::now(),
            &mut compiled,
            |r| {
                table = Some(thread_cpu());
                routing = Some(r);
            },
        );
        let end = thread_cpu();
        if compiled.last_counts().0 != 1 {
            return Err(format!(
                "flip {i}: {:?} routes (compiled, reused), expected one compiled",
                compiled.last_counts()
            ));
        }
        reads.push(ms(read - cpu));
        tables.push(ms(table.ok_or("the routing is handed over")? - read));
        totals.push(ms(end - read));
        drop(routing);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "{{\"routes\":{n},\"flips\":{flips},\"reload_cpu_ms\":{:.1},\"translate_to_table_cpu_ms\":{:.1},\"translate_cpu_ms\":{:.1}}}",
        median(&mut reads),
        median(&mut tables),
        median(&mut totals)
    );
    Ok(())
}

/// Resident set size and its peak, in KiB, from `/proc/self/status`.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU time this thread has run, from `/proc/thread-self/schedstat` (in
/// nanoseconds): on a shared machine, wall time also counts the time other
/// processes held the core.
fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map(Duration::from_nanos)
        .unwrap_or_default()
}

fn flag<T: std::str::FromStr>(
    args: &[String],
    name: &str,
    default: Option<T>,
) -> Result<T, String> {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or(format!("{name} needs a valid value")),
        None => default.ok_or(format!("{name} is required")),
    }
}

fn count(args: &[String]) -> Result<usize, String> {
    args.first()
        .and_then(|n| n.parse().ok())
        .ok_or("the first argument is the number of HTTPRoutes".to_string())
}

fn scale(args: &[String]) -> Result<(), String> {
    let n = count(args)?;
    let one_host = args.iter().any(|a| a == "--one-host");
    let layout = routes::Layout::default();
    let options = TranslateOptions {
        default_bind: layout.listen.ip(),
    };
    let (rss_start, _) = rss_kib();
    let text = routes::infrastructure(&layout) + &routes::routes(n, one_host);
    let t = Instant::now();
    let snapshot = routes::snapshot(&text);
    let parse = t.elapsed();
    drop(text);
    let (rss_snapshot, _) = rss_kib();

    let (t, cpu) = (Instant::now(), thread_cpu());
    let translation = translate(&snapshot, &options);
    let first_translate = translate_time(t);
    let first_cpu = (thread_cpu() - cpu).as_secs_f64() * 1e3;
    // What a gateway serving these routes holds: the snapshot and one
    // translation (table, status, rule summaries).
    let (rss_translated, _) = rss_kib();
    // Two more runs for a steadier figure (the first pays for page faults).
    let mut runs = vec![first_translate];
    let mut cpu_runs = vec![first_cpu];
    for _ in 0..2 {
        let (t, cpu) = (Instant::now(), thread_cpu());
        let again = translate(&snapshot, &options);
        runs.push(translate_time(t));
        cpu_runs.push((thread_cpu() - cpu).as_secs_f64() * 1e3);
        // Freeing a table is the reload's cost, not translate's.
        drop(again);
    }
    runs.sort_by(f64::total_cmp);
    cpu_runs.sort_by(f64::total_cmp);
    let (rss_after_runs, peak) = rss_kib();

    // Time to match: every route once (a different request each time),
    // repeated until at least 200,000 lookups, median of the batches.
    let requests: Vec<_> = (0..n.min(4096))
        .map(|k| routes::request_for(k * n / n.min(4096), one_host))
        .collect();
    let mut batches = Vec::new();
    let mut done = 0usize;
    // The CPU clock is updated at scheduler ticks: count it over all the
    // batches, not per batch.
    let lookup_cpu = thread_cpu();
    while done < 200_000 {
        let t = Instant::now();
        for (host, method, path, headers) in &requests {
            let found = translation
                .table
                .lookup(layout.listen, host, method, path, None, headers);
            assert!(matches!(found, Lookup::Matched(_)), "{host}{path}");
            std::hint::black_box(found);
        }
        batches.push(t.elapsed().as_nanos() as f64 / requests.len() as f64);
        done += requests.len();
    }
    batches.sort_by(f64::total_cmp);
    let lookup_cpu = (thread_cpu() - lookup_cpu).as_nanos() as f64 / done as f64;
    println!(
        "{{\"routes\":{n},\"one_host\":{one_host},\"parse_ms\":{:.1},\"translate_ms\":{:.1},\
         \"translate_first_ms\":{first_translate:.1},\"translate_cpu_ms\":{:.1},\
         \"translate_first_cpu_ms\":{first_cpu:.1},\"lookup_ns\":{:.0},\"lookup_cpu_ns\":{:.0},\
         \"rss_start_kib\":{rss_start},\"rss_snapshot_kib\":{rss_snapshot},\
         \"rss_translated_kib\":{rss_translated},\"rss_after_runs_kib\":{rss_after_runs},\
         \"peak_kib\":{peak}}}",
        parse.as_secs_f64() * 1e3,
        runs[runs.len() / 2],
        cpu_runs[cpu_runs.len() / 2],
        batches[batches.len() / 2],
        lookup_cpu,
    );
    drop(translation);
    Ok(())
}

fn overview(args: &[String]) -> Result<(), String> {
    use sluice::admin::{Published, overview::Limits, overview::Overview};
    use sluice::metrics::RequestKey;
    let n = count(args)?;
    let layout = routes::Layout::default();
    let text = routes::infrastructure(&layout) + &routes::routes(n, false);
    let snapshot = routes::snapshot(&text);
    let translation = translate(
        &snapshot,
        &TranslateOptions {
            default_bind: layout.listen.ip(),
        },
    );
    let metrics = Metrics::new();
    metrics.set_shares(
        translation
            .rules
            .iter()
            .flat_map(|r| r.share_rows())
            .collect(),
    );
    let mut backends = 0usize;
    for rule in &translation.rules {
        let (namespace, route) = rule.route.split_once('/').unwrap_or(("", &rule.route));
        for b in &rule.backends {
            metrics.record(
                &RequestKey {
                    kind: "",
                    namespace,
                    route,
                    rule: Some(rule.rule),
                    backend: &b.name,
                    code: 200,
                },
                Duration::from_millis(1),
            );
            backends += 1;
        }
    }
    let published = Published {
        status: translation.status,
        errors: Vec::new(),
        rules: Arc::new(translation.rules),
        generation: 1,
    };
    let rollouts = sluice::rollout::RolloutReport::default();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut overview_ms, mut metrics_ms) = (Vec::new(), Vec::new());
    let (mut overview_bytes, mut metrics_bytes) = (0, 0);
    for _ in 0..20 {
        let t = Instant::now();
        let body = serde_json::to_vec_pretty(&Overview::build(
            &published,
            &rollouts,
            &Default::default(),
            &Default::default(),
            &metrics,
            Limits::default(),
        ))
        .map_err(|e| e.to_string())?;
        overview_ms.push(t.elapsed().as_secs_f64() * 1e3);
        overview_bytes = body.len();
        let t = Instant::now();
        let text = metrics.encode();
        metrics_ms.push(t.elapsed().as_secs_f64() * 1e3);
        metrics_bytes = text.len();
    }
    println!(
        "{{\"routes\":{n},\"backends\":{backends},\"overview_ms\":{:.2},\"overview_bytes\":{overview_bytes},\
         \"metrics_ms\":{:.2},\"metrics_bytes\":{metrics_bytes}}}",
        median(overview_ms),
        median(metrics_ms),
    );
    Ok(())
}

fn translate_time(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn reload(args: &[String]) -> Result<(), String> {
    let n = count(args)?;
    let layout = routes::Layout {
        listen: flag::<SocketAddr>(args, "--listen", None)?,
        stable: flag::<SocketAddr>(args, "--stable", None)?,
        canary: flag::<SocketAddr>(args, "--canary", None)?,
    };
    let interval = Duration::from_millis(flag(args, "--interval-ms", Some(100u64))?);
    let reloads: usize = flag(args, "--reloads", Some(1000))?;
    // A bound on the whole rebuild run, whatever translate costs.
    let max = Duration::from_secs(flag(args, "--max-seconds", Some(150u64))?);
    let options = TranslateOptions {
        default_bind: layout.listen.ip(),
    };
    let base = routes::infrastructure(&layout) + &routes::routes(n, false);
    let flips = [
        Arc::new(routes::snapshot(
            &(base.clone() + &routes::hot_route(995, 5)),
        )),
        Arc::new(routes::snapshot(&(base + &routes::hot_route(90, 10)))),
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async move {
        let proxy = Proxy::new(Metrics::shared());
        let failures = proxy.apply(translate(&flips[0], &options).table).await;
        if let Some(f) = failures.first() {
            return Err(format!("cannot listen on {}: {}", f.bind, f.error));
        }
        let (rss_ready, _) = rss_kib();
        println!("ready {{\"rss_ready_kib\":{rss_ready}}}");
        // Wait for the driver's go (a line on stdin), off the workers.
        tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
        })
        .await
        .map_err(|e| e.to_string())?;

        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut translate_ms = Vec::with_capacity(reloads);
        let mut rss_first = 0;
        let mut rss_every_100 = Vec::new();
        let start = Instant::now();
        for i in 0..reloads {
            if start.elapsed() > max {
                break;
            }
            ticks.tick().await;
            let snapshot = flips[(i + 1) % 2].clone();
            let options = options.clone();
            // Translate off the async workers, as a reload should.
            let (table, took) = tokio::task::spawn_blocking(move || {
                // The table replaced last time is freed before this one is
                // built in its memory.
                RouteTable::wait_for_freed_tables();
                let t = Instant::now();
                let translation = translate(&snapshot, &options);
                let took = t.elapsed();
                // Status and rule summaries are freed here, off the async
                // workers (freeing 10,000 routes' status takes milliseconds).
                (translation.table, took)
            })
            .await
            .map_err(|e| e.to_string())?;
            translate_ms.push(took.as_secs_f64() * 1e3);
            proxy.apply(table).await;
            if i == 0 {
                rss_first = rss_kib().0;
            }
            if (i + 1) % 100 == 0 {
                rss_every_100.push(rss_kib().0);
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        let (rss_last, peak) = rss_kib();
        translate_ms.sort_by(f64::total_cmp);
        println!(
            "{{\"routes\":{n},\"reloads\":{},\"elapsed_s\":{elapsed:.1},\
             \"translate_p50_ms\":{:.1},\"translate_max_ms\":{:.1},\
             \"rss_ready_kib\":{rss_ready},\"rss_after_first_kib\":{rss_first},\
             \"rss_after_last_kib\":{rss_last},\"rss_every_100_kib\":{rss_every_100:?},\
             \"peak_kib\":{peak}}}",
            translate_ms.len(),
            translate_ms[translate_ms.len() / 2],
            translate_ms.last().copied().unwrap_or(0.0),
        );
        proxy.shutdown();
        Ok(())
    })
}
