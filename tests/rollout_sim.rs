//! The rollout simulator's parts (`benches/support/rollout_sim.rs`) on
//! their own: the traffic it draws, the two threshold checks sluice is
//! compared with on hand-made counts, and its loop driving sluice's state
//! machine. Seeded and in simulated time: nothing here reads a clock.

#[path = "../benches/support/rollout_sim.rs"]
mod sim;

use sim::{
    Check, EveryTick, Judging, MILLISECOND, PerInterval, Random, SECOND, Served, Side, Sluice,
    State, Thresholds, Traffic, run, settings,
};

fn mean_and_variance(draws: &[f64]) -> (f64, f64) {
    let n = draws.len() as f64;
    let mean = draws.iter().sum::<f64>() / n;
    let var = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var)
}

#[test]
fn poisson_draws_have_the_mean_and_variance_asked_for() {
    let mut rng = Random::new(1);
    // Both methods: multiplication below 10, transformed rejection above.
    for mean in [0.05, 0.7, 4.0, 9.9, 10.0, 37.0, 600.0, 60_000.0] {
        let n = 20_000;
        let draws: Vec<f64> = (0..n).map(|_| rng.poisson(mean) as f64).collect();
        let (m, v) = mean_and_variance(&draws);
        // Six standard errors of the mean; the variance within 10%.
        let se = (mean / n as f64).sqrt();
        assert!((m - mean).abs() < 6.0 * se, "mean {mean}: drew {m}");
        assert!((v / mean - 1.0).abs() < 0.1, "mean {mean}: variance {v}");
    }
    assert_eq!(rng.poisson(0.0), 0);
}

#[test]
fn gaps_are_exponential_with_the_rate_asked_for() {
    let mut rng = Random::new(2);
    let n = 50_000;
    let draws: Vec<f64> = (0..n)
        .map(|_| rng.gap(4.0) as f64 / SECOND as f64)
        .collect();
    let (m, v) = mean_and_variance(&draws);
    assert!((m - 0.25).abs() < 0.01, "{m}");
    assert!((v / 0.0625 - 1.0).abs() < 0.05, "{v}");
    assert_eq!(rng.gap(0.0), u64::MAX);
}

#[test]
fn traffic_splits_by_the_share_and_fails_at_each_sides_rate() {
    let mut rng = Random::new(3);
    let t = Traffic {
        rps: 1000.0,
        stable_errors: 0.005,
        canary_errors: 0.05,
    };
    let mut served = Served::default();
    // 100 passes of one second at a 10% share.
    for _ in 0..100 {
        served.pass(&t, 0.1, SECOND, &mut rng);
    }
    let (c, s) = (served.canary, served.stable);
    assert!((c.requests as f64 - 10_000.0).abs() < 500.0, "{c:?}");
    assert!((s.requests as f64 - 90_000.0).abs() < 1_500.0, "{s:?}");
    assert!((c.errors as f64 - 500.0).abs() < 120.0, "{c:?}");
    assert!((s.errors as f64 - 450.0).abs() < 120.0, "{s:?}");
}

fn thresholds(limit: Option<u32>, tolerance: Option<f64>) -> Thresholds {
    Thresholds {
        steps: vec![0.05, 0.5, 1.0],
        interval: 60 * SECOND,
        min_requests: 100,
        limit,
        tolerance,
    }
}

fn side(requests: u64, errors: u64) -> Side {
    Side { requests, errors }
}

#[test]
fn the_flagger_style_check_on_hand_made_counts() {
    let t = thresholds(Some(1_000), None);
    assert_eq!(t.check(&side(0, 0), &side(1_000, 5)), Check::NoData);
    assert_eq!(
        t.check(&side(100, 1), &side(1_000, 5)),
        Check::Passed,
        "1% is not above 1%"
    );
    assert_eq!(t.check(&side(100, 2), &side(1_000, 5)), Check::AboveLimit);
    // Against the stable: 2% against 1% is worse than 1.25x, 1.2% is not.
    let t = thresholds(Some(5_000), Some(1.25));
    assert_eq!(
        t.check(&side(100, 2), &side(1_000, 10)),
        Check::WorseThanStable
    );
    assert_eq!(t.check(&side(1_000, 12), &side(1_000, 10)), Check::Passed);
    // One 5xx against a stable with none in the interval is worse.
    assert_eq!(
        t.check(&side(100, 1), &side(1_000, 0)),
        Check::WorseThanStable
    );
    // No stable traffic (the 100% step): only the limit.
    assert_eq!(t.check(&side(100, 4), &side(0, 0)), Check::Passed);
    assert_eq!(t.check(&side(100, 6), &side(0, 0)), Check::AboveLimit);
}

#[test]
fn the_flagger_style_judge_checks_each_interval_and_rolls_back_on_the_first_failure() {
    let mut j = PerInterval::start(thresholds(Some(1_000), None));
    assert_eq!(j.next_look(), 60 * SECOND);
    let mut served = Served {
        canary: side(300, 3),
        ..Served::default()
    };
    j.look(60 * SECOND, &served);
    assert_eq!(j.state(), State::Step(1), "3 of 300 is 1%");
    assert_eq!(j.canary_share(), 0.5);
    // The next window counts from the check: 3,000 more with 31 5xx.
    served.canary = side(3_300, 34);
    j.look(120 * SECOND, &served);
    assert_eq!(j.state(), State::RolledBack(1));
    assert_eq!(j.canary_share(), 0.0);
    // No data is a failed check.
    let mut j = PerInterval::start(thresholds(Some(1_000), None));
    j.look(60 * SECOND, &Served::default());
    assert_eq!(j.state(), State::RolledBack(0));
}

#[test]
fn the_old_gate_waits_for_min_requests_then_compares_every_tick() {
    let mut j = EveryTick::start(thresholds(Some(1_000), None));
    let mut served = Served {
        canary: side(99, 50),
        ..Served::default()
    };
    j.look(250 * MILLISECOND, &served);
    assert_eq!(
        j.state(),
        State::Step(0),
        "short of minRequests, whatever the rate"
    );
    served.canary = side(100, 1);
    j.look(60 * SECOND, &served);
    assert_eq!(
        j.state(),
        State::Step(1),
        "1 of 100 is not above 1%; the interval is over"
    );
    // The step's counts start again: 2 of the next 100 fail.
    served.canary = side(200, 3);
    j.look(60 * SECOND + 250 * MILLISECOND, &served);
    assert_eq!(j.state(), State::RolledBack(1));
}

#[test]
fn the_policy_is_read_by_sluices_parser() {
    let t = Thresholds::of(&settings("5%", "1%", true));
    assert_eq!(t.steps, vec![0.05, 0.5, 1.0]);
    assert_eq!((t.interval, t.min_requests), (60 * SECOND, 100));
    assert_eq!((t.limit, t.tolerance), (Some(1_000), Some(1.25)));
    let t = Thresholds::of(&settings("1%", "2%", false));
    assert_eq!((t.limit, t.tolerance), (Some(2_000), None));
}

#[test]
fn without_errors_every_judge_promotes_at_the_end_of_the_third_interval() {
    let traffic = Traffic {
        rps: 100.0,
        stable_errors: 0.0,
        canary_errors: 0.0,
    };
    let s = settings("5%", "1%", true);
    let limit = 3_600 * SECOND;
    let sluice = run(
        &mut Sluice::start(s.clone()),
        &traffic,
        &mut Random::new(4),
        limit,
    );
    let old = run(
        &mut EveryTick::start(Thresholds::of(&s)),
        &traffic,
        &mut Random::new(4),
        limit,
    );
    let flagger = run(
        &mut PerInterval::start(Thresholds::of(&s)),
        &traffic,
        &mut Random::new(4),
        limit,
    );
    for o in [sluice, old, flagger] {
        assert_eq!(
            (o.state, o.at, o.canary_errors),
            (State::Promoted, 180 * SECOND, 0)
        );
    }
}

#[test]
fn sluice_rolls_back_a_canary_failing_everything_on_the_5xx_that_proves_it() {
    let traffic = Traffic {
        rps: 100.0,
        stable_errors: 0.005,
        canary_errors: 1.0,
    };
    for seed in 0..20 {
        let mut judge = Sluice::start(settings("5%", "1%", true));
        let o = run(&mut judge, &traffic, &mut Random::new(seed), 3_600 * SECOND);
        assert_eq!(o.state, State::RolledBack(0), "{}", judge.message());
        assert!(o.canary_errors <= 6, "{o:?}: {}", judge.message());
        // 5 per second reach the canary: a few seconds at most.
        assert!(o.at < 10 * SECOND, "{o:?}");
    }
}
