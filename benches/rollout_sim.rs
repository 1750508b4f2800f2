//! A simulator benchmark of sluice's rollout judge: sluice's own state
//! machine (`sluice::rollout::sim`) driven by simulated traffic and a
//! simulated clock, side by side with the gate sluice had before the
//! sequential tests (a threshold checked every 250 ms) and a
//! Flagger-style check once per interval. No wall clock decides anything:
//! the figures depend only on the seed and the run counts.
//!
//! `cargo bench --bench rollout_sim -- [--healthy-runs N] [--runs N]
//! [--threads N] [--seed S]` (or `bash bench/run.sh --rollouts ...`)
//! prints Markdown tables on stdout (progress on stderr):
//! - healthy canaries (10,000 rollouts per row by default): how often
//!   each judge rolls back a canary within its limits;
//! - regressions (1,000 per row): a canary at 2x, 4x and 10x the stable's
//!   5xx rate and one failing everything, at 10, 100 and 1,000 requests
//!   per second, first step 1%, 5% and 25%: how often, how fast and after
//!   how many 5xx served each judge rolls back;
//! - the checks, each with what was measured.
//!
//! What is simulated and how: `benches/support/rollout_sim.rs`. The
//! table, the command and a reading: `docs/rollouts.md`, "The simulator".

use std::time::Instant;

#[path = "support/rollout_sim.rs"]
mod sim;

use sim::{
    EveryTick, Outcome, PerInterval, Random, SECOND, Sluice, State, Thresholds, Traffic, run,
    settings,
};
use sluice::resources::RolloutSettings;

/// No simulated rollout runs longer than this (a step that never gets its
/// requests would).
const LIMIT: u64 = 6 * 3600 * SECOND;

struct Args {
    /// Only the low-traffic table (a quicker run).
    low_traffic_only: bool,
    healthy_runs: usize,
    runs: usize,
    threads: usize,
    seed: u64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        low_traffic_only: false,
        healthy_runs: 10_000,
        runs: 1_000,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        seed: 21,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            it.next()
                .ok_or_else(|| format!("{name} needs a value"))?
                .parse()
                .map_err(|e| format!("{name}: {e}"))
        };
        match flag.as_str() {
            // `cargo bench` passes `--bench` to every bench target.
            "--bench" => {}
            "--low-traffic-only" => a.low_traffic_only = true,
            "--healthy-runs" => a.healthy_runs = value("--healthy-runs")? as usize,
            "--runs" => a.runs = value("--runs")? as usize,
            "--threads" => a.threads = (value("--threads")? as usize).max(1),
            "--seed" => a.seed = value("--seed")?,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: rollout_sim [--low-traffic-only] [--healthy-runs N] [--runs N] [--threads N] [--seed S]"
                ));
            }
        }
    }
    if a.healthy_runs == 0 || a.runs == 0 {
        return Err("--healthy-runs and --runs must be at least 1".into());
    }
    Ok(a)
}

/// The three judges compared.
#[derive(Clone, Copy)]
enum Judge {
    Sluice,
    EveryTick,
    PerInterval,
}

const JUDGES: [Judge; 3] = [Judge::Sluice, Judge::EveryTick, Judge::PerInterval];

/// One configuration: a policy and the traffic it judges.
struct Config {
    name: String,
    settings: RolloutSettings,
    traffic: Traffic,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn one(config: &Config, judge: Judge, seed: u64) -> Outcome {
    let mut rng = Random::new(seed);
    match judge {
        Judge::Sluice => run(
            &mut Sluice::start(config.settings.clone()),
            &config.traffic,
            &mut rng,
            LIMIT,
        ),
        Judge::EveryTick => run(
            &mut EveryTick::start(Thresholds::of(&config.settings)),
            &config.traffic,
            &mut rng,
            LIMIT,
        ),
        Judge::PerInterval => run(
            &mut PerInterval::start(Thresholds::of(&config.settings)),
            &config.traffic,
            &mut rng,
            LIMIT,
        ),
    }
}

/// `runs` rollouts of `config` under each judge, run `i` seeded by the
/// seed, the configuration's name and `i` alone (the same traffic seed for
/// the three judges), so the figures do not depend on `threads`.
fn simulate(config: &Config, runs: usize, a: &Args) -> Vec<Vec<Outcome>> {
    simulate_judges(config, runs, a, &JUDGES)
}

/// [`simulate`] for some of the judges only.
fn simulate_judges(config: &Config, runs: usize, a: &Args, judges: &[Judge]) -> Vec<Vec<Outcome>> {
    let base = splitmix(a.seed ^ name_hash(&config.name));
    judges
        .iter()
        .map(|judge| {
            let mut all: Vec<(usize, Outcome)> = std::thread::scope(|scope| {
                let workers: Vec<_> = (0..a.threads)
                    .map(|w| {
                        scope.spawn(move || {
                            (w..runs)
                                .step_by(a.threads)
                                .map(|i| (i, one(config, *judge, splitmix(base ^ i as u64))))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .flat_map(|w| w.join().expect("a simulation thread"))
                    .collect()
            });
            all.sort_by_key(|(i, _)| *i);
            all.into_iter().map(|(_, o)| o).collect()
        })
        .collect()
}

/// What the tables say of one judge's runs of one configuration.
struct Summary {
    runs: usize,
    rolled_back: usize,
    promoted: usize,
    /// Rolled back at the first or second step.
    by_second_step: usize,
    /// Sorted; runs not rolled back are `u64::MAX`.
    times: Vec<u64>,
    errors: Vec<u64>,
    /// The most 5xx served by a canary that was rolled back.
    most_errors: u64,
}

impl Summary {
    fn of(outcomes: &[Outcome]) -> Summary {
        let caught = |o: &&Outcome| matches!(o.state, State::RolledBack(_));
        let mut times: Vec<u64> = outcomes
            .iter()
            .map(|o| if caught(&o) { o.at } else { u64::MAX })
            .collect();
        let mut errors: Vec<u64> = outcomes
            .iter()
            .map(|o| {
                if caught(&o) {
                    o.canary_errors
                } else {
                    u64::MAX
                }
            })
            .collect();
        times.sort_unstable();
        errors.sort_unstable();
        Summary {
            runs: outcomes.len(),
            rolled_back: outcomes.iter().filter(caught).count(),
            promoted: outcomes
                .iter()
                .filter(|o| o.state == State::Promoted)
                .count(),
            by_second_step: outcomes
                .iter()
                .filter(|o| matches!(o.state, State::RolledBack(s) if s <= 1))
                .count(),
            times,
            errors,
            most_errors: outcomes
                .iter()
                .filter(caught)
                .map(|o| o.canary_errors)
                .max()
                .unwrap_or(0),
        }
    }

    fn rate(&self) -> f64 {
        self.rolled_back as f64 / self.runs as f64
    }
}

/// The `q` quantile of sorted values (the smallest value with at least `q`
/// of them at or below it); `None` when it falls on a run not caught.
fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted.get(i).copied().filter(|v| *v != u64::MAX)
}

fn seconds(nanos: Option<u64>) -> String {
    match nanos {
        None => "not caught".into(),
        Some(n) => {
            let s = n as f64 / SECOND as f64;
            if s < 10.0 {
                format!("{s:.1} s")
            } else {
                format!("{s:.0} s")
            }
        }
    }
}

fn count(n: Option<u64>) -> String {
    n.map_or("—".into(), |n| n.to_string())
}

fn percent(x: f64) -> String {
    let p = 100.0 * x;
    if p == 0.0 || p >= 10.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.2}%")
    }
}

fn thousands(n: usize) -> String {
    let text = n.to_string();
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i > 0 && (text.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A 95% upper confidence bound of a proportion (Wilson's score).
fn upper95(k: usize, n: usize) -> f64 {
    let (k, n, z) = (k as f64, n as f64, 1.96_f64);
    let p = k / n;
    let centre = p + z * z / (2.0 * n);
    let spread = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    (centre + spread) / (1.0 + z * z / n)
}

struct Healthy {
    label: &'static str,
    policy: &'static str,
    rate: f64,
    baseline: bool,
    /// Whether a rollback is a false one (the canary is within the
    /// policy's limits).
    within: bool,
}

const HEALTHY: [Healthy; 4] = [
    Healthy {
        label: "both sides 0.5% 5xx",
        policy: "maxErrorRate 1%",
        rate: 0.005,
        baseline: false,
        within: true,
    },
    Healthy {
        label: "both sides 0.5% 5xx",
        policy: "maxErrorRate 1%, baseline Stable, maxDegradation 25%",
        rate: 0.005,
        baseline: true,
        within: true,
    },
    Healthy {
        label: "both sides 3% 5xx (a shared outage)",
        policy: "maxErrorRate 1%, baseline Stable, maxDegradation 25%",
        rate: 0.03,
        baseline: true,
        within: true,
    },
    Healthy {
        label: "both sides 1.5% 5xx (a shared outage)",
        policy: "maxErrorRate 1% alone",
        rate: 0.015,
        baseline: false,
        within: false,
    },
];

const HEALTHY_RPS: f64 = 100.0;
const HEALTHY_STEP: &str = "5%";
const STABLE_RATE: f64 = 0.005;
const REGRESSIONS: [(f64, &str); 4] = [
    (2.0, "2x (1%)"),
    (4.0, "4x (2%)"),
    (10.0, "10x (5%)"),
    (200.0, "failing everything (100%)"),
];
const RPS: [f64; 3] = [10.0, 100.0, 1000.0];
const FIRST_STEPS: [&str; 3] = ["1%", "5%", "25%"];

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rollout_sim: {e}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let mut checks: Vec<(String, String, bool)> = Vec::new();
    if !a.low_traffic_only {
        healthy_and_regressions(&a, &mut checks);
    }
    low_traffic(&a, &mut checks);

    println!("\nThe issue's checks (sluice's judge):\n");
    println!("| check | measured | holds |");
    println!("|---|---|---|");
    for (check, measured, holds) in &checks {
        println!(
            "| {check} | {measured} | {} |",
            if *holds { "yes" } else { "NO" }
        );
    }
    eprintln!(
        "rollout_sim: done in {:.0} s ({} threads)",
        started.elapsed().as_secs_f64(),
        a.threads
    );
}

/// The healthy table and the regressions table.
fn healthy_and_regressions(a: &Args, checks: &mut Vec<(String, String, bool)>) {
    println!(
        "Healthy canaries: {} rollouts per row, {} rps, steps [{HEALTHY_STEP}, 50%, 100%], interval 1m, minRequests 100, confidence 99%, seed {}.\n",
        thousands(a.healthy_runs),
        HEALTHY_RPS,
        a.seed
    );
    println!(
        "| canary and stable | policy | sluice | today's gate (every 250 ms) | Flagger-style (every 1m) |"
    );
    println!("|---|---|---|---|---|");
    for (i, h) in HEALTHY.iter().enumerate() {
        let config = Config {
            name: format!("healthy {} {}", h.label, h.policy),
            settings: settings(HEALTHY_STEP, "1%", h.baseline),
            traffic: Traffic {
                rps: HEALTHY_RPS,
                stable_errors: h.rate,
                canary_errors: h.rate,
            },
        };
        let t = Instant::now();
        let results = simulate(&config, a.healthy_runs, a);
        eprintln!(
            "rollout_sim: healthy {}/{}: {} ({:.1} s)",
            i + 1,
            HEALTHY.len(),
            config.name,
            t.elapsed().as_secs_f64()
        );
        let cells: Vec<String> = results
            .iter()
            .map(|r| {
                let s = Summary::of(r);
                let stuck = s.runs - s.rolled_back - s.promoted;
                let mut cell = format!(
                    "{} rolled back ({} of {})",
                    percent(s.rate()),
                    thousands(s.rolled_back),
                    thousands(s.runs)
                );
                if stuck > 0 {
                    cell.push_str(&format!(", {stuck} unfinished"));
                }
                cell
            })
            .collect();
        println!(
            "| {} | {} | {} | {} | {} |",
            h.label, h.policy, cells[0], cells[1], cells[2]
        );
        let s = Summary::of(&results[0]);
        if h.within {
            checks.push((
                format!("{}, {}: promoted in at least 99%", h.label, h.policy),
                format!(
                    "{} promoted ({} of {}; false rollbacks {}, 95% upper bound {})",
                    percent(s.promoted as f64 / s.runs as f64),
                    thousands(s.promoted),
                    thousands(s.runs),
                    percent(s.rate()),
                    percent(upper95(s.rolled_back, s.runs))
                ),
                s.promoted as f64 >= 0.99 * s.runs as f64,
            ));
        }
    }

    println!(
        "\nRegressions: the stable at 0.5% 5xx, policy maxErrorRate 1%, baseline Stable, maxDegradation 25%; steps [first, 50%, 100%], interval 1m, minRequests 100, confidence 99%; {} rollouts per row. Each cell: rolled back · median / p90 time to the rollback · median 5xx the canary served (over all runs; \"not caught\" when that quantile falls on a canary that was promoted).\n",
        thousands(a.runs)
    );
    println!(
        "| canary 5xx | rps | first step | sluice | today's gate (every 250 ms) | Flagger-style (every 1m) |"
    );
    println!("|---|---|---|---|---|---|");
    let total = REGRESSIONS.len() * RPS.len() * FIRST_STEPS.len();
    let mut done = 0;
    for (ratio, label) in REGRESSIONS {
        let canary = (STABLE_RATE * ratio).min(1.0);
        let mut worst_step = (0usize, 0usize, String::new());
        let mut most_errors = 0u64;
        for rps in RPS {
            for first in FIRST_STEPS {
                let config = Config {
                    name: format!("regression {label} {rps} {first}"),
                    settings: settings(first, "1%", true),
                    traffic: Traffic {
                        rps,
                        stable_errors: STABLE_RATE,
                        canary_errors: canary,
                    },
                };
                let t = Instant::now();
                let results = simulate(&config, a.runs, a);
                done += 1;
                eprintln!(
                    "rollout_sim: regression {done}/{total}: {} ({:.1} s)",
                    config.name,
                    t.elapsed().as_secs_f64()
                );
                let cells: Vec<String> = results
                    .iter()
                    .map(|r| {
                        let s = Summary::of(r);
                        format!(
                            "{} · {} / {} · {}",
                            percent(s.rate()),
                            seconds(quantile(&s.times, 0.5)),
                            seconds(quantile(&s.times, 0.9)),
                            count(quantile(&s.errors, 0.5)),
                        )
                    })
                    .collect();
                println!(
                    "| {label} | {rps} | {first} | {} | {} | {} |",
                    cells[0], cells[1], cells[2]
                );
                let s = Summary::of(&results[0]);
                let missed = s.runs - s.by_second_step;
                if missed > worst_step.0 {
                    worst_step = (missed, s.runs, format!("{rps} rps, first step {first}"));
                }
                most_errors = most_errors.max(if s.rolled_back == s.runs {
                    s.most_errors
                } else {
                    u64::MAX
                });
            }
        }
        if ratio == 10.0 {
            checks.push((
                "a canary at 10x the stable's rate rolled back at its first or second step".into(),
                if worst_step.0 == 0 {
                    "every one, in every row".into()
                } else {
                    format!(
                        "not {} of {} in the worst row ({})",
                        thousands(worst_step.0),
                        thousands(worst_step.1),
                        worst_step.2
                    )
                },
                worst_step.0 == 0,
            ));
        }
        if ratio >= 200.0 {
            checks.push((
                "a canary failing everything rolled back after at most 20 5xx served".into(),
                if most_errors == u64::MAX {
                    "some were not rolled back".into()
                } else {
                    format!("at most {most_errors} served, over every row")
                },
                most_errors <= 20,
            ));
        }
    }
}

/// At 10 rps a step sees few canary requests: the regressions table's
/// 10x canary (5% against the stable's 0.5%) with the policy's
/// `minRequests: 100`, and with the `minRequests` that catches it 99 times
/// in 100 within one step by the absolute gate alone
/// (`evidence::trials_to_catch_surely`, as `sluice check` computes it for
/// the multiples of the limit it prints), side by side with what that
/// minRequests costs a healthy canary (both sides 0.5%). sluice's judge
/// only: the table is about its power.
fn low_traffic(a: &Args, checks: &mut Vec<(String, String, bool)>) {
    use sluice::rollout::evidence::{odds, trials_to_catch_surely};
    const RPS: f64 = 10.0;
    let canary = STABLE_RATE * 10.0;
    let policy = settings("5%", "1%", true);
    let alpha = policy.confidence.alpha() / policy.gates.len() as f64;
    let sure =
        trials_to_catch_surely(canary, odds(0.01), alpha, 0.99).expect("a finite minRequests");
    println!(
        "\nLow traffic: {RPS} rps, the stable at 0.5% 5xx, policy maxErrorRate 1%, baseline Stable, maxDegradation 25%; steps [first, 50%, 100%], interval 1m, confidence 99%; {} rollouts per row. minRequests {} is the fewest canary requests after which the absolute gate has caught a 5% canary 99 times in 100. Columns: the 10x canary (5% 5xx) rolled back at its first or second step, rolled back at all, median 5xx it served; a healthy canary (both sides 0.5%) rolled back, and its median / p90 time to promotion.\n",
        thousands(a.runs),
        thousands(sure as usize)
    );
    println!(
        "| first step | minRequests | 10x: by the second step | 10x: rolled back | 10x: 5xx served | healthy: rolled back | healthy: time to promotion |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut worst = (0usize, 0usize, String::new());
    // The regressions table's worst rows at 10 rps (a 1% first step holds
    // a step for 1,000 s at minRequests 100 already, and for about 6,000
    // at the larger one: hours of simulation on 2 cores).
    for first in ["5%", "25%"] {
        for min_requests in [100, sure] {
            let mut policy = settings(first, "1%", true);
            policy.min_requests = min_requests;
            let at = |rate: f64, what: &str| Config {
                name: format!("low traffic {what} {first} {min_requests}"),
                settings: policy.clone(),
                traffic: Traffic {
                    rps: RPS,
                    stable_errors: STABLE_RATE,
                    canary_errors: rate,
                },
            };
            let t = Instant::now();
            let sluice = [Judge::Sluice];
            let bad = Summary::of(&simulate_judges(&at(canary, "10x"), a.runs, a, &sluice)[0]);
            let healthy =
                simulate_judges(&at(STABLE_RATE, "healthy"), a.runs, a, &sluice).swap_remove(0);
            eprintln!(
                "rollout_sim: low traffic, first step {first}, minRequests {min_requests} ({:.1} s)",
                t.elapsed().as_secs_f64()
            );
            let mut promoted: Vec<u64> = healthy
                .iter()
                .map(|o| {
                    if o.state == State::Promoted {
                        o.at
                    } else {
                        u64::MAX
                    }
                })
                .collect();
            promoted.sort_unstable();
            let h = Summary::of(&healthy);
            println!(
                "| {first} | {} | {} ({} of {}) | {} | {} | {} ({} of {}) | {} / {} |",
                thousands(min_requests as usize),
                percent(bad.by_second_step as f64 / bad.runs as f64),
                thousands(bad.by_second_step),
                thousands(bad.runs),
                percent(bad.rate()),
                count(quantile(&bad.errors, 0.5)),
                percent(h.rate()),
                thousands(h.rolled_back),
                thousands(h.runs),
                seconds(quantile(&promoted, 0.5)),
                seconds(quantile(&promoted, 0.9)),
            );
            if min_requests == sure && bad.runs - bad.by_second_step > worst.0 {
                worst = (
                    bad.runs - bad.by_second_step,
                    bad.runs,
                    format!("first step {first}"),
                );
            }
        }
    }
    checks.push((
        format!(
            "a canary at 10x the stable's rate rolled back at its first or second step at {RPS} rps, with the minRequests that catches it 99 times in 100 ({})",
            thousands(sure as usize)
        ),
        if worst.0 == 0 {
            "every one, in every row".into()
        } else {
            format!(
                "not {} of {} in the worst row ({})",
                thousands(worst.0),
                thousands(worst.1),
                worst.2
            )
        },
        worst.0 * 100 <= worst.1.max(1),
    ));
}
