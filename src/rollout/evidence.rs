//! The statistics a rollout's gates judge by: anytime-valid sequential
//! tests on counts, so that a gate looked at after every response is
//! wrong no more often than its stated error rate (`docs/rollouts.md`).
//!
//! One shape serves every gate. A gate watches trials and hits: for an
//! absolute limit the trials are the canary's responses and a hit is a
//! 5xx (or a response slower than `maxLatency`); against the stable
//! traffic, the trials are the events (5xx, or slow responses) of both
//! sides and a hit is an event that fell on the canary. Under the null
//! each hit happens with probability at most `theta0`: the limit, or, for
//! the relative test, `r0 * s / (r0 * s + 1 - s)` where `s` is the
//! canary's share of the requests and `r0 = 1 + maxDegradation` (Lindon &
//! Malek 2022; Netflix's counting-process test).
//!
//! [`Sequential`] is a mixture sequential probability ratio test (Robbins'
//! method of mixtures; Johari et al. 2017): the likelihood ratio of the
//! counts under alternatives whose odds are `rho` times the null's, mixed
//! over a fixed grid of `rho > 1` with equal weights. For every
//! alternative the ratio is a nonnegative supermartingale under any
//! `theta <= theta0` (each factor's expectation is `theta * rho * ... + ...
//! <= 1`, equal to 1 at `theta0`), so is the mixture, and Ville's
//! inequality bounds the probability that it *ever* reaches `1/alpha` by
//! `alpha`: however often it is looked at, whatever the stopping rule.
//!
//! Everything here is pure `f64` arithmetic on counts: no clock, no I/O.

/// Odds ratios of the alternatives the mixture is over (the odds of a hit
/// are `rho` times the null's): from a small regression to a backend
/// failing everything. More points cost `ln(len)` of evidence each test.
pub const ALTERNATIVES: [f64; 13] = [
    1.25, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 40.0, 100.0, 300.0, 1_000.0, 10_000.0,
];

/// The ratios a step's power is reported at: the smallest that the
/// counts would catch (on expected counts) is said.
pub const DETECTABLE: [f64; 12] = [
    1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1_000.0, 10_000.0,
];

/// A mixture SPRT: the log likelihood ratio of each alternative so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sequential {
    log_lr: [f64; ALTERNATIVES.len()],
}

impl Default for Sequential {
    fn default() -> Self {
        Sequential {
            log_lr: [0.0; ALTERNATIVES.len()],
        }
    }
}

impl Sequential {
    /// Add `hits` of `trials`, each a hit with probability at most
    /// `theta0` under the null (given as its odds, `theta0 / (1 -
    /// theta0)`). Odds of 0 or infinity (a side without requests) carry no
    /// information and change nothing.
    pub fn observe(&mut self, hits: f64, trials: f64, null_odds: f64) {
        if !(null_odds > 0.0 && null_odds.is_finite()) || trials <= 0.0 {
            return;
        }
        let hits = hits.clamp(0.0, trials);
        for (l, rho) in self.log_lr.iter_mut().zip(ALTERNATIVES) {
            // Per trial: ln(theta/theta0) for a hit, ln((1-theta)/(1-theta0))
            // for a miss; with odds o0 and rho * o0, these are ln(rho) +
            // ln((1+o0)/(1+rho*o0)) and ln((1+o0)/(1+rho*o0)).
            let miss = ((1.0 + null_odds) / (1.0 + rho * null_odds)).ln();
            *l += hits * rho.ln() + trials * miss;
        }
    }

    /// The natural log of the mixture likelihood ratio (the e-value).
    pub fn log_evidence(&self) -> f64 {
        let max = self
            .log_lr
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = self.log_lr.iter().map(|l| (l - max).exp()).sum();
        max + sum.ln() - (ALTERNATIVES.len() as f64).ln()
    }

    /// The mixture likelihood ratio, capped for printing.
    pub fn evidence(&self) -> f64 {
        self.log_evidence().min(700.0).exp()
    }

    /// Whether the null is rejected at level `alpha`: the mixture reached
    /// `1 / alpha`.
    pub fn rejects(&self, alpha: f64) -> bool {
        self.log_evidence() >= (1.0 / alpha).ln()
    }
}

/// Odds of a probability (`p / (1 - p)`), infinite at 1.
pub fn odds(p: f64) -> f64 {
    if p >= 1.0 {
        f64::INFINITY
    } else {
        p / (1.0 - p)
    }
}

/// The null odds of an event falling on the canary when its share of the
/// requests is `canary / (canary + stable)` and its rate may be `r0`
/// times the stable's: `r0 * s / (1 - s)`.
pub fn relative_odds(canary_requests: f64, stable_requests: f64, r0: f64) -> f64 {
    if canary_requests <= 0.0 {
        return 0.0;
    }
    if stable_requests <= 0.0 {
        return f64::INFINITY;
    }
    r0 * canary_requests / stable_requests
}

/// The absolute test on cumulative counts: `hits` of `trials` against a
/// rate of at most `limit`.
pub fn absolute(hits: u64, trials: u64, limit: f64) -> Sequential {
    let mut s = Sequential::default();
    s.observe(hits as f64, trials as f64, odds(limit));
    s
}

/// The lowest rate the absolute test still rejects at `alpha` given
/// `hits` of `trials`: the canary's rate is above it at that confidence
/// (the lower end of the confidence sequence). 0 when nothing is
/// rejected.
pub fn lower_bound(hits: u64, trials: u64, alpha: f64) -> f64 {
    if !absolute(hits, trials, 1e-12).rejects(alpha) {
        return 0.0;
    }
    let (mut lo, mut hi) = (1e-12_f64, 1.0_f64);
    for _ in 0..60 {
        let mid = (lo * hi).sqrt().max(lo + (hi - lo) * 1e-3);
        if absolute(hits, trials, mid).rejects(alpha) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Kullback-Leibler divergence of Bernoulli(q) from Bernoulli(p).
fn kl(p: f64, q: f64) -> f64 {
    let term = |a: f64, b: f64| if a <= 0.0 { 0.0 } else { a * (a / b).ln() };
    term(p, q) + term(1.0 - p, 1.0 - q)
}

/// An upper `1 - delta` confidence bound for a rate from `hits` of
/// `trials` seen once (the Chernoff bound: the largest `q` with `trials *
/// KL(hits/trials, q) <= ln(1/delta)`). 1 without trials.
pub fn upper_bound(hits: u64, trials: u64, delta: f64) -> f64 {
    if trials == 0 {
        return 1.0;
    }
    let n = trials as f64;
    let p = (hits as f64 / n).min(1.0);
    let budget = (1.0 / delta).ln();
    let (mut lo, mut hi) = (p, 1.0_f64);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if n * kl(p, mid) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The smallest ratio of [`DETECTABLE`] that a test at `alpha` would
/// reject on the expected counts: `trials` trials whose hits come at
/// ratio `r` on the null's odds. `None` when even the largest would not.
pub fn detectable_ratio(trials: f64, null_odds: f64, alpha: f64) -> Option<f64> {
    if !(null_odds > 0.0 && null_odds.is_finite()) || trials <= 0.0 {
        return None;
    }
    DETECTABLE.into_iter().find(|r| {
        let o = r * null_odds;
        let hits = trials * o / (1.0 + o);
        let mut s = Sequential::default();
        s.observe(hits, trials, null_odds);
        s.rejects(alpha)
    })
}

/// The fewest trials after which a test at `alpha` rejects on the
/// expected counts when each trial is a hit with probability `theta` (the
/// null's odds `null_odds`): how much traffic a gate needs to catch a
/// given regression, for planning. `None` beyond a billion trials (or for
/// a `theta` the null allows).
pub fn trials_to_catch(theta: f64, null_odds: f64, alpha: f64) -> Option<u64> {
    const MOST: u64 = 1_000_000_000;
    let rejects = |n: u64| {
        let mut s = Sequential::default();
        s.observe(theta * n as f64, n as f64, null_odds);
        s.rejects(alpha)
    };
    // The log likelihood ratio of each alternative is linear in the
    // trials at expected counts, so rejection is monotone.
    smallest(1, MOST, rejects)
}

/// The smallest `n >= start` where `holds` (taken as monotone): double
/// from `start`, then halve the gap. `None` once past `most`.
fn smallest(start: u64, most: u64, holds: impl Fn(u64) -> bool) -> Option<u64> {
    let mut hi = start.max(1);
    while !holds(hi) {
        if hi >= most {
            return None;
        }
        hi *= 2;
    }
    let mut lo = hi / 2;
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if holds(mid) { hi = mid } else { lo = mid }
    }
    Some(hi)
}

/// The fewest hits of `trials` the test at `alpha` rejects with (the
/// null's odds `null_odds`); `None` when even all of them would not.
fn hits_to_reject(trials: u64, null_odds: f64, alpha: f64) -> Option<u64> {
    let rejects = |x: u64| {
        let mut s = Sequential::default();
        s.observe(x as f64, trials as f64, null_odds);
        s.rejects(alpha)
    };
    if !rejects(trials) {
        return None;
    }
    // More hits of the same trials is more evidence for every
    // alternative: rejection is monotone in the hits.
    let (mut lo, mut hi) = (0u64, trials);
    if rejects(0) {
        return Some(0);
    }
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if rejects(mid) { hi = mid } else { lo = mid }
    }
    Some(hi)
}

/// `P(X < k)` for `X ~ Binomial(n, theta)`, summed in log space (the
/// terms of a large `n` underflow one by one).
fn binomial_below(k: u64, n: u64, theta: f64) -> f64 {
    if k == 0 {
        return 0.0;
    }
    if theta <= 0.0 {
        return 1.0;
    }
    if theta >= 1.0 {
        return if k > n { 1.0 } else { 0.0 };
    }
    let (lt, lq) = (theta.ln(), (1.0 - theta).ln());
    let mut log_pmf = n as f64 * lq;
    let mut terms = Vec::with_capacity(k.min(n + 1) as usize);
    for x in 0..k.min(n + 1) {
        terms.push(log_pmf);
        log_pmf += ((n - x) as f64).ln() - ((x + 1) as f64).ln() + lt - lq;
    }
    let max = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = terms.iter().map(|t| (t - max).exp()).sum();
    (max + sum.ln()).exp().min(1.0)
}

/// The probability that the test at `alpha` rejects at `trials` trials,
/// each a hit with probability `theta` (the null's odds `null_odds`):
/// the power of one look. The sequential test looks at every count up to
/// there too, so its power by then is at least this.
pub fn power_at(trials: u64, theta: f64, null_odds: f64, alpha: f64) -> f64 {
    match hits_to_reject(trials, null_odds, alpha) {
        Some(k) => 1.0 - binomial_below(k, trials, theta),
        None => 0.0,
    }
}

/// The fewest trials after which the test at `alpha` has rejected with
/// probability at least `power` when each trial is a hit with probability
/// `theta`: what a step needs to catch such a canary (almost) surely, not
/// only on expected counts as [`trials_to_catch`] says. `None` beyond ten
/// million trials.
pub fn trials_to_catch_surely(theta: f64, null_odds: f64, alpha: f64, power: f64) -> Option<u64> {
    const MOST: u64 = 10_000_000;
    let start = trials_to_catch(theta, null_odds, alpha)?;
    let enough = |n: u64| power_at(n, theta, null_odds, alpha) >= power;
    // Power grows with the trials but for the steps of the discrete
    // hits: from the expected-count figure (a result within a few trials
    // of the smallest).
    smallest(start, MOST, enough)
}

/// `3x`, `1.5x`, `10,000x`.
pub fn ratio_text(r: f64) -> String {
    if r >= 1000.0 {
        let n = r.round() as u64;
        let text = n.to_string();
        let mut out = String::new();
        for (i, c) in text.chars().enumerate() {
            if i > 0 && (text.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        return format!("{out}x");
    }
    let text = format!("{r:.2}");
    format!("{}x", text.trim_end_matches('0').trim_end_matches('.'))
}

/// A rate as a percentage for messages: `0.52%`, `30%`, `0.0041%`.
pub fn rate_text(rate: f64) -> String {
    let pct = rate * 100.0;
    if pct == 0.0 {
        return "0%".into();
    }
    let digits = if pct >= 10.0 {
        1
    } else if pct >= 0.1 {
        2
    } else {
        (2.0 - pct.log10().floor()) as usize
    };
    let text = format!("{pct:.digits$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    };
    format!("{text}%")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for the Monte Carlo checks.
    struct Lcg(u64);
    impl Lcg {
        fn unit(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn no_evidence_before_any_count() {
        let s = Sequential::default();
        assert!((s.log_evidence()).abs() < 1e-12);
        assert!(!s.rejects(0.01));
    }

    #[test]
    fn a_backend_failing_everything_is_rejected_after_a_handful() {
        // Limit 1%, 99%: the second or third failure of the first few.
        let first = (1..=20u64)
            .find(|n| absolute(*n, *n, 0.01).rejects(0.01))
            .expect("rejected within 20");
        assert!(first <= 3, "after {first}");
        assert!(
            !absolute(1, 1, 0.01).rejects(0.01),
            "one error is not enough"
        );
    }

    #[test]
    fn a_rate_at_the_limit_is_not_rejected_while_a_rate_far_above_is() {
        assert!(!absolute(100, 10_000, 0.01).rejects(0.01));
        assert!(!absolute(110, 10_000, 0.01).rejects(0.01));
        assert!(absolute(200, 10_000, 0.01).rejects(0.01));
        assert!(absolute(30, 1_000, 0.01).rejects(0.01));
    }

    #[test]
    fn evidence_under_the_null_is_never_beyond_what_ville_allows() {
        // 2,000 healthy canaries (0.5% against a 1% limit), looked at after
        // every response for 5,000 responses: rejected at most about 1%.
        let mut rng = Lcg(7);
        let mut rejected = 0;
        let runs = 2_000;
        for _ in 0..runs {
            let mut hits = 0;
            for n in 1..=5_000u64 {
                if rng.unit() < 0.01 {
                    hits += 1;
                }
                if absolute(hits, n, 0.01).rejects(0.01) {
                    rejected += 1;
                    break;
                }
            }
        }
        // At the limit itself (the worst case of the null) 1% is the bound;
        // a binomial 99.9% margin over 2,000 runs.
        assert!(rejected <= 20 + 14, "{rejected} of {runs}");
    }

    #[test]
    fn the_relative_test_blames_only_a_worse_canary() {
        // 5% canary share; both sides at 3%: no evidence however long.
        let r0 = 1.25;
        let mut both = Sequential::default();
        let mut worse = Sequential::default();
        for _ in 0..100 {
            // Per 1,000 requests: 50 on the canary, 950 on stable.
            let o = relative_odds(50.0, 950.0, r0);
            both.observe(1.5, 30.0, o); // 1.5 of 30 events on the canary
            worse.observe(15.0, 43.5, o); // canary at 10x
        }
        assert!(!both.rejects(0.01), "{}", both.evidence());
        assert!(worse.rejects(0.01), "{}", worse.evidence());
    }

    #[test]
    fn a_side_without_requests_carries_no_evidence() {
        let mut s = Sequential::default();
        s.observe(5.0, 5.0, relative_odds(100.0, 0.0, 1.25));
        s.observe(0.0, 5.0, relative_odds(0.0, 100.0, 1.25));
        assert_eq!(s, Sequential::default());
    }

    #[test]
    fn bounds_bracket_the_rate() {
        let lo = lower_bound(30, 1_000, 0.01);
        assert!(lo > 0.01 && lo < 0.03, "{lo}");
        assert!(lower_bound(5, 1_000, 0.01) < 0.005);
        assert_eq!(lower_bound(0, 1_000, 0.01), 0.0);
        let hi = upper_bound(5, 1_000, 0.01);
        assert!(hi > 0.005 && hi < 0.02, "{hi}");
        let zero = upper_bound(0, 1_000, 0.01);
        assert!((zero - (1.0 - 0.01_f64.powf(1.0 / 1000.0))).abs() < 1e-3);
        assert_eq!(upper_bound(0, 0, 0.01), 1.0);
    }

    #[test]
    fn power_grows_with_the_counts() {
        let o = odds(0.01);
        let few = detectable_ratio(200.0, o, 0.01).expect("a failing backend at least");
        let many = detectable_ratio(100_000.0, o, 0.01).expect("some ratio");
        assert!(few > many, "{few} > {many}");
        assert!(many <= 1.5, "{many}");
        assert_eq!(detectable_ratio(0.0, o, 0.01), None);
    }

    #[test]
    fn the_binomial_tail_is_exact_on_small_counts() {
        // P(X < 2) for Binomial(3, 0.5) = (1 + 3) / 8.
        assert!((binomial_below(2, 3, 0.5) - 0.5).abs() < 1e-12);
        assert_eq!(binomial_below(0, 10, 0.3), 0.0);
        assert!((binomial_below(11, 10, 0.3) - 1.0).abs() < 1e-12);
        // A large n whose single terms underflow still sums right:
        // Binomial(1e6, 0.05) has mean 50,000 and sd about 218.
        let below = binomial_below(50_000, 1_000_000, 0.05);
        assert!((below - 0.5).abs() < 0.01, "{below}");
    }

    #[test]
    fn a_surely_caught_canary_is_caught_that_often_by_the_counts() {
        // 5% against a 1% limit, at the budget of two gates at 99%.
        let (theta, o, alpha) = (0.05, odds(0.01), 0.005);
        let median = trials_to_catch(theta, o, alpha).unwrap();
        let sure = trials_to_catch_surely(theta, o, alpha, 0.99).unwrap();
        assert!(sure > median, "{sure} > {median}");
        assert!(power_at(sure, theta, o, alpha) >= 0.99);
        assert!(power_at(median, theta, o, alpha) < 0.9);
        // Monte Carlo: the counts at `sure` trials reject about as often
        // as the power says.
        let mut rng = Lcg(7);
        let runs = 2_000;
        let caught = (0..runs)
            .filter(|_| {
                let hits = (0..sure).filter(|_| rng.unit() < theta).count() as u64;
                absolute(hits, sure, 0.01).rejects(alpha)
            })
            .count();
        assert!(caught as f64 / runs as f64 >= 0.97, "{caught} of {runs}");
        // A rate the null allows is never surely caught.
        assert!(power_at(1_000, 0.01, o, alpha) < alpha * 10.0);
    }

    #[test]
    fn texts() {
        assert_eq!(ratio_text(3.0), "3x");
        assert_eq!(ratio_text(1.25), "1.25x");
        assert_eq!(ratio_text(10_000.0), "10,000x");
        assert_eq!(rate_text(0.005), "0.5%");
        assert_eq!(rate_text(0.3), "30%");
        assert_eq!(rate_text(0.000_041), "0.0041%");
        assert_eq!(rate_text(0.0), "0%");
    }
}
