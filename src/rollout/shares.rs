//! Backend identities, weights, and the exact arithmetic of a step.
//!
//! A rollout serves, per backend, `from + p * (to - from)` of the shares,
//! where `p` is the step. With from-weights `f_i` (sum `F`), to-weights
//! `t_i` (sum `T`) and `p = P / 100,000` ([`Percent`]), the served weight
//! of backend `i` is
//!
//! ```text
//! s_i = f_i * T * (100,000 - P) + t_i * F * P
//! ```
//!
//! since `s_i / sum(s) = (1 - p) * f_i / F + p * t_i / T` (the sum is
//! `F * T * 100,000`). Integers all the way, reduced by their gcd: from
//! 1000/0 to 0/1000, 0.5% serves exactly 199:1 (995/5) and 25% exactly 3:1
//! (750/250).
//!
//! Fitting the picker's `u64` (and Kubernetes' `int64`, where the policy's
//! status records them): every weight of `to` is a spec weight (at
//! most 1,000,000; a backend listed twice weighs the sum) and `from` is
//! kept within the same bound by [`Weights::bounded`]. With at most 16
//! backends on each side, `F, T <= 1.6e7`, so each term is at most
//! `1e6 * 1.6e7 * 1e5 = 1.6e18` and `s_i <= max(f_i * T, t_i * F) * 1e5 <=
//! 1.6e18 < 2^63`: exact. The products are computed in `u128`, so larger
//! rules (a backend listed many times, a `from` left with more than 16
//! backends by interrupted rollouts) cannot overflow; their weights are
//! scaled below 2^63 after the gcd, each share off by less than 2^-62.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::resources::Percent;

/// The largest weight the spec allows; `from` weights are kept within it.
pub const MAX_WEIGHT: u64 = 1_000_000;

/// What a backendRef points at (group, kind, namespace, name, port), not
/// where it sits in the list: adding or removing a backendRef changes the
/// indices of the others, not their identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackendKey {
    /// `""` for the core group.
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub port: Option<i32>,
}

impl BackendKey {
    /// A core Service.
    pub fn service(namespace: &str, name: &str, port: Option<i32>) -> BackendKey {
        BackendKey {
            group: String::new(),
            kind: "Service".into(),
            namespace: namespace.into(),
            name: name.into(),
            port,
        }
    }

    pub fn is_service(&self) -> bool {
        self.group.is_empty() && self.kind == "Service"
    }
}

impl fmt::Display for BackendKey {
    /// The label of summaries and metrics: `<namespace>/<name>:<port>` for
    /// a Service, kind-prefixed otherwise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.is_service() {
            if self.group.is_empty() {
                write!(f, "{} ", self.kind)?;
            } else {
                write!(f, "{}.{} ", self.kind, self.group)?;
            }
        }
        write!(f, "{}/{}", self.namespace, self.name)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// Weights by backend, in a stable order: a rule's backendRef order, then
/// backends that only an earlier configuration had.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Weights(Vec<(BackendKey, u64)>);

impl Weights {
    pub fn new() -> Weights {
        Weights(Vec::new())
    }

    /// Add `weight` to `key` (a backend listed twice weighs the sum).
    pub fn add(&mut self, key: BackendKey, weight: u64) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, w)) => *w = w.saturating_add(weight),
            None => self.0.push((key, weight)),
        }
    }

    pub fn get(&self, key: &BackendKey) -> u64 {
        self.0.iter().find(|(k, _)| k == key).map_or(0, |(_, w)| *w)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&BackendKey, u64)> + '_ {
        self.0.iter().map(|(k, w)| (k, *w))
    }

    pub fn keys(&self) -> impl Iterator<Item = &BackendKey> + '_ {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn total(&self) -> u128 {
        self.0.iter().map(|(_, w)| u128::from(*w)).sum()
    }

    /// The backends of `self`, then those only `other` has (for listing
    /// `from` and `to` together).
    pub fn union_keys<'a>(&'a self, other: &'a Weights) -> Vec<&'a BackendKey> {
        let mut keys: Vec<&BackendKey> = self.keys().collect();
        for k in other.keys() {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        keys
    }

    /// Whether every backend has the same share in both (weights may
    /// differ by a factor). Two sets with all weights 0 are the same.
    pub fn same_shares(&self, other: &Weights) -> bool {
        let (a_total, b_total) = (self.total(), other.total());
        if a_total == 0 || b_total == 0 {
            return a_total == b_total;
        }
        self.union_keys(other).into_iter().all(|k| {
            cmp_products(
                u128::from(self.get(k)),
                b_total,
                u128::from(other.get(k)),
                a_total,
            ) == Ordering::Equal
        })
    }

    /// Backends whose share is smaller in `to` than in `from`: the stable
    /// side a rollout from `from` to `to` compares the incoming ones with
    /// (`baseline: Stable`).
    pub fn outgoing<'a>(from: &'a Weights, to: &'a Weights) -> Vec<&'a BackendKey> {
        let (f_total, t_total) = (from.total(), to.total());
        from.keys()
            .filter(|k| {
                cmp_products(
                    u128::from(to.get(k)),
                    f_total,
                    u128::from(from.get(k)),
                    t_total,
                ) == Ordering::Less
            })
            .collect()
    }

    /// Backends whose share is larger in `to` than in `from`: the ones a
    /// rollout from `from` to `to` judges.
    pub fn incoming<'a>(from: &'a Weights, to: &'a Weights) -> Vec<&'a BackendKey> {
        let (f_total, t_total) = (from.total(), to.total());
        to.keys()
            .filter(|k| {
                cmp_products(
                    u128::from(to.get(k)),
                    f_total,
                    u128::from(from.get(k)),
                    t_total,
                ) == Ordering::Greater
            })
            .collect()
    }

    /// The weights served at `step` of the way from `from` to `to`, in the
    /// order of [`Weights::union_keys`] of `to` and `from`. Both must have
    /// a weight above 0 (otherwise there is no share to ramp from or to).
    pub fn interpolate(from: &Weights, to: &Weights, step: Percent) -> Weights {
        let (f_total, t_total) = (from.total(), to.total());
        let p = u128::from(step.thousandths());
        let rest = u128::from(Percent::SCALE) - p;
        let keys = to.union_keys(from);
        let served: Vec<u128> = keys
            .iter()
            .map(|k| u128::from(from.get(k)) * t_total * rest + u128::from(to.get(k)) * f_total * p)
            .collect();
        let fitted = fit_u64(&served);
        Weights(keys.into_iter().cloned().zip(fitted).collect())
    }

    /// The same shares with every weight at most [`MAX_WEIGHT`]: exact
    /// when the weights reduced by their gcd fit, otherwise scaled so the
    /// largest is `MAX_WEIGHT` (each share off by less than a millionth of
    /// the largest; a non-zero weight stays at least 1). Backends with
    /// weight 0 are dropped.
    pub fn bounded(&self) -> Weights {
        let nonzero: Vec<(BackendKey, u128)> = self
            .0
            .iter()
            .filter(|(_, w)| *w > 0)
            .map(|(k, w)| (k.clone(), u128::from(*w)))
            .collect();
        let divisor = nonzero.iter().fold(0u128, |g, (_, w)| gcd(g, *w)).max(1);
        let max = nonzero.iter().map(|(_, w)| w / divisor).max().unwrap_or(0);
        let limit = u128::from(MAX_WEIGHT);
        Weights(
            nonzero
                .into_iter()
                .map(|(k, w)| {
                    let w = w / divisor;
                    let w = if max > limit {
                        ((w * limit + max / 2) / max).max(1)
                    } else {
                        w
                    };
                    // At most MAX_WEIGHT: fits.
                    (k, w as u64)
                })
                .collect(),
        )
    }

    /// `key`'s share as a percentage, for people: `99.5%`, `33.333%`,
    /// `0%`; never `0%` for a non-zero share.
    pub fn share_text(&self, key: &BackendKey) -> String {
        share_text(u128::from(self.get(key)), self.total())
    }

    /// The shares as `a/b/...` percentages of `keys`: `99.5/0.5`.
    pub fn ratio_text(&self, keys: &[&BackendKey]) -> String {
        keys.iter()
            .map(|k| self.share_text(k).trim_end_matches('%').to_string())
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// `part / total` as a percentage with at most 3 decimals.
pub fn share_text(part: u128, total: u128) -> String {
    if total == 0 || part == 0 {
        return "0%".into();
    }
    // Thousandths of a percent, rounded to nearest.
    let thousandths = (part * u128::from(Percent::SCALE) * 2 + total) / (total * 2);
    if thousandths == 0 {
        return "<0.001%".into();
    }
    Percent::from_thousandths(thousandths.min(u128::from(Percent::SCALE)) as u32).to_string()
}

/// Reduce by the gcd; scale down below 2^63 if still too large.
fn fit_u64(weights: &[u128]) -> Vec<u64> {
    let divisor = weights.iter().fold(0u128, |g, w| gcd(g, *w)).max(1);
    let reduced: Vec<u128> = weights.iter().map(|w| w / divisor).collect();
    let max = reduced.iter().copied().max().unwrap_or(0);
    let limit = i64::MAX as u128;
    reduced
        .into_iter()
        .map(|w| {
            let w = if max > limit {
                // Only for a rule listing one backend many times (see the
                // module doc): divided by a whole factor, the largest
                // falls below the limit; a non-zero weight stays non-zero.
                (w / (max / limit + 1)).max(u128::from(w > 0))
            } else {
                w
            };
            u64::try_from(w).unwrap_or(i64::MAX as u64)
        })
        .collect()
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `a * b` compared with `c * d`, exactly (256-bit products).
fn cmp_products(a: u128, b: u128, c: u128, d: u128) -> Ordering {
    widening_mul(a, b).cmp(&widening_mul(c, d))
}

/// `a * b` as (high, low) 128-bit halves.
fn widening_mul(a: u128, b: u128) -> (u128, u128) {
    const MASK: u128 = u64::MAX as u128;
    let (a1, a0) = (a >> 64, a & MASK);
    let (b1, b0) = (b >> 64, b & MASK);
    let (p00, p01, p10, p11) = (a0 * b0, a0 * b1, a1 * b0, a1 * b1);
    let mid = (p00 >> 64) + (p01 & MASK) + (p10 & MASK);
    let low = (p00 & MASK) | (mid << 64);
    let high = p11 + (p01 >> 64) + (p10 >> 64) + (mid >> 64);
    (high, low)
}

/// One backend's weight as status and the state file show it: the
/// backendRef's fields (group and kind only when not a core Service), the
/// exact weight (what a resumed rollout computes with) and the share in
/// percent (what a person reads; derived, ignored when read back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendShare {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(default = "service_kind", skip_serializing_if = "is_service_kind")]
    pub kind: String,
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    pub weight: u64,
    #[serde(default)]
    pub share: String,
}

fn service_kind() -> String {
    "Service".into()
}

fn is_service_kind(kind: &str) -> bool {
    kind == "Service"
}

impl Weights {
    /// The weights as [`BackendShare`]s.
    pub fn to_shares(&self) -> Vec<BackendShare> {
        self.0
            .iter()
            .map(|(k, w)| BackendShare {
                group: k.group.clone(),
                kind: k.kind.clone(),
                namespace: k.namespace.clone(),
                name: k.name.clone(),
                port: k.port,
                weight: *w,
                share: self.share_text(k),
            })
            .collect()
    }

    /// Back from [`BackendShare`]s (their `share` is ignored).
    pub fn from_shares(shares: &[BackendShare]) -> Weights {
        let mut w = Weights::new();
        for s in shares {
            w.add(
                BackendKey {
                    group: s.group.clone(),
                    kind: s.kind.clone(),
                    namespace: s.namespace.clone(),
                    name: s.name.clone(),
                    port: s.port,
                },
                s.weight,
            );
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> BackendKey {
        BackendKey::service("default", name, Some(8080))
    }

    fn weights(pairs: &[(&str, u64)]) -> Weights {
        let mut w = Weights::new();
        for (name, weight) in pairs {
            w.add(key(name), *weight);
        }
        w
    }

    fn pct(text: &str) -> Percent {
        Percent::parse(text).expect("test percentage")
    }

    #[test]
    fn the_seeds_ladder_is_exact() {
        let from = weights(&[("stable", 1000), ("canary", 0)]);
        let to = weights(&[("stable", 0), ("canary", 1000)]);
        for (step, stable, canary) in [
            ("0.5%", 199, 1),
            ("5%", 19, 1),
            ("25%", 3, 1),
            ("100%", 0, 1),
        ] {
            let served = Weights::interpolate(&from, &to, pct(step));
            assert_eq!(
                (served.get(&key("stable")), served.get(&key("canary"))),
                (stable, canary),
                "{step}"
            );
        }
        // The same ladder, as the seeds' runbook writes it.
        let served = Weights::interpolate(&from, &to, pct("0.5%"));
        assert!(served.same_shares(&weights(&[("stable", 995), ("canary", 5)])));
        assert!(
            Weights::interpolate(&from, &to, pct("5%"))
                .same_shares(&weights(&[("stable", 950), ("canary", 50)]))
        );
        assert!(
            Weights::interpolate(&from, &to, pct("25%"))
                .same_shares(&weights(&[("stable", 750), ("canary", 250)]))
        );
        assert_eq!(served.share_text(&key("canary")), "0.5%");
        assert_eq!(
            served.ratio_text(&[&key("stable"), &key("canary")]),
            "99.5/0.5"
        );
    }

    #[test]
    fn shares_compare_across_scales_and_backend_sets() {
        assert!(weights(&[("a", 1), ("b", 1)]).same_shares(&weights(&[("b", 7), ("a", 7)])));
        assert!(!weights(&[("a", 1), ("b", 1)]).same_shares(&weights(&[("a", 1), ("b", 2)])));
        // A backend at weight 0 is the same as no backend.
        assert!(weights(&[("a", 5)]).same_shares(&weights(&[("a", 1), ("b", 0)])));
        assert!(!weights(&[("a", 5)]).same_shares(&weights(&[("a", 1), ("b", 1)])));
        assert!(weights(&[("a", 0)]).same_shares(&weights(&[])));
        assert!(!weights(&[("a", 0)]).same_shares(&weights(&[("a", 1)])));
        // Huge weights (served weights are u64) compare exactly.
        let big = u64::MAX - 1;
        assert!(
            !weights(&[("a", big), ("b", 1)]).same_shares(&weights(&[("a", big - 1), ("b", 1)]))
        );
        assert!(
            weights(&[("a", big / 2), ("b", big / 2)]).same_shares(&weights(&[("a", 3), ("b", 3)]))
        );
    }

    #[test]
    fn incoming_backends_are_those_whose_share_grows() {
        let from = weights(&[("a", 50), ("b", 50)]);
        let to = weights(&[("a", 50), ("c", 50)]);
        let incoming: Vec<String> = Weights::incoming(&from, &to)
            .into_iter()
            .map(|k| k.name.clone())
            .collect();
        assert_eq!(incoming, ["c"]);
        // a keeps 50%: neither incoming nor judged.
        let to = weights(&[("a", 60), ("b", 40)]);
        let incoming: Vec<&str> = Weights::incoming(&from, &to)
            .into_iter()
            .map(|k| k.name.as_str())
            .collect();
        assert_eq!(incoming, ["a"]);
    }

    #[test]
    fn removed_and_added_backends_ramp_together() {
        // b removed, c added: at 50%, a keeps half, b and c a quarter each.
        let from = weights(&[("a", 1), ("b", 1)]);
        let to = weights(&[("a", 1), ("c", 1)]);
        let served = Weights::interpolate(&from, &to, pct("50%"));
        let names: Vec<(&str, u64)> = served.iter().map(|(k, w)| (k.name.as_str(), w)).collect();
        assert_eq!(names, [("a", 2), ("c", 1), ("b", 1)]);
    }

    #[test]
    fn every_step_of_extreme_rules_fits_exactly() {
        // 16 backends at the largest weight, every share moving.
        let names: Vec<String> = (0..16).map(|i| format!("b{i}")).collect();
        let mut from = Weights::new();
        let mut to = Weights::new();
        for (i, n) in names.iter().enumerate() {
            from.add(key(n), if i % 2 == 0 { MAX_WEIGHT } else { 1 });
            to.add(key(n), if i % 2 == 0 { 1 } else { MAX_WEIGHT });
        }
        for thousandths in [1, 500, 33_333, 99_999, 100_000] {
            let step = Percent::from_thousandths(thousandths);
            let served = Weights::interpolate(&from, &to, step);
            // Exact: the shares equal (1-p) f/F + p t/T, checked by
            // reconstructing them with a common denominator.
            let (f, t) = (from.total(), to.total());
            let scale = u128::from(Percent::SCALE);
            let p = u128::from(thousandths);
            let exact: Vec<u128> = names
                .iter()
                .map(|n| {
                    u128::from(from.get(&key(n))) * t * (scale - p)
                        + u128::from(to.get(&key(n))) * f * p
                })
                .collect();
            let mut expected = Weights::new();
            let g = exact.iter().fold(0, |g, w| gcd(g, *w));
            for (n, w) in names.iter().zip(&exact) {
                expected.add(key(n), u64::try_from(w / g).expect("fits u64"));
            }
            assert_eq!(served, expected, "{step}");
        }
    }

    #[test]
    fn bounded_weights_keep_exact_shares_when_they_can() {
        let served = weights(&[("a", 9_950_000_000), ("b", 50_000_000)]);
        assert_eq!(served.bounded(), weights(&[("a", 199), ("b", 1)]));
        // Coprime and large: scaled, the largest at MAX_WEIGHT, tiny kept.
        let odd = weights(&[("a", 3_000_000_017), ("b", 1), ("c", 0)]);
        let b = odd.bounded();
        assert_eq!(b.get(&key("a")), MAX_WEIGHT);
        assert_eq!(b.get(&key("b")), 1);
        assert_eq!(b.len(), 2, "zero weights are dropped");
    }

    #[test]
    fn labels_match_the_metrics_labels() {
        assert_eq!(key("web").to_string(), "default/web:8080");
        let other = BackendKey {
            group: "example.com".into(),
            kind: "Bucket".into(),
            namespace: "ns".into(),
            name: "b".into(),
            port: None,
        };
        assert_eq!(other.to_string(), "Bucket.example.com ns/b");
    }

    #[test]
    fn shares_round_trip_through_their_status_form() {
        let w = weights(&[("stable", 199), ("canary", 1)]);
        let shares = w.to_shares();
        assert_eq!(shares[0].share, "99.5%");
        let json = serde_json::to_value(&shares).expect("serializes");
        assert_eq!(
            json[1],
            serde_json::json!({"namespace": "default", "name": "canary", "port": 8080, "weight": 1, "share": "0.5%"})
        );
        let back: Vec<BackendShare> = serde_json::from_value(json).expect("parses");
        assert_eq!(Weights::from_shares(&back), w);
        assert_eq!(share_text(1, 3), "33.333%");
        assert_eq!(share_text(1, 1_000_000_000), "<0.001%");
    }

    #[test]
    fn oversized_weights_are_scaled_below_int64() {
        let huge = u128::from(u64::MAX) * 3;
        let fitted = fit_u64(&[huge, huge / 2, 1, 0]);
        assert!(fitted[0] <= i64::MAX as u64);
        assert_eq!(fitted[0] / 2, fitted[1]);
        assert_eq!(&fitted[2..], [1, 0]);
        assert_eq!(fit_u64(&[6, 4, 0]), [3, 2, 0]);
    }

    #[test]
    fn wide_products_compare_exactly() {
        let big = u128::MAX / 3;
        assert_eq!(cmp_products(big, 6, big * 2, 3), Ordering::Equal);
        assert_eq!(cmp_products(big, 7, big * 2, 3), Ordering::Greater);
        assert_eq!(cmp_products(3, 4, 2, 6), Ordering::Equal);
    }
}
