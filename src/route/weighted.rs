//! Exact, lock-free weighted choice.
//!
//! Per the spec, a backendRef's share is `weight / sum(weights)`. Random
//! choice only gets close to the share; sluice makes it exact: request number
//! `n` (one atomic `fetch_add` per request, shared by every worker thread) is
//! mapped to a backend by a pure function of `n` such that after any `n`
//! requests each backend has received its share within half a request per
//! level of a balanced binary tree over the backends (within 1 for two
//! backends, within 2 for up to 16).
//!
//! How: the backends with a non-zero weight are leaves of a balanced binary
//! tree. A node that has received `c` requests before this one has sent
//! `L(c) = floor((c * w_left + w / 2) / w)` of them left, where `w` is the
//! node's weight and `w_left` its left child's. The request goes left when
//! `L(c + 1) > L(c)` (it is the left child's request number `L(c)`), and
//! right otherwise (the right child's request number `c - L(c)`). Each level
//! rounds once, so the error is bounded by the depth, never by time.
//!
//! Nothing is expanded by weight (weights go up to 1,000,000) and there is no
//! burst: a 995/5 split sends the canary one request in every 200, evenly.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
enum Node {
    Leaf(usize),
    Split {
        weight: u128,
        left_weight: u128,
        left: Box<Node>,
        right: Box<Node>,
    },
}

/// Chooses an index into a list of weights, exactly in proportion.
#[derive(Debug)]
pub struct WeightedPicker {
    root: Option<Node>,
    counter: AtomicU64,
}

impl WeightedPicker {
    /// Weights of 0 never get picked. If all are 0, [`pick`](Self::pick)
    /// returns `None`.
    pub fn new(weights: &[u64]) -> Self {
        let leaves: Vec<(usize, u128)> = weights
            .iter()
            .enumerate()
            .filter(|(_, w)| **w > 0)
            .map(|(i, w)| (i, u128::from(*w)))
            .collect();
        WeightedPicker {
            root: build(&leaves),
            counter: AtomicU64::new(0),
        }
    }

    /// The index of the weight that gets the next request.
    pub fn pick(&self) -> Option<usize> {
        let root = self.root.as_ref()?;
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        Some(pick_nth(root, n))
    }
}

fn build(leaves: &[(usize, u128)]) -> Option<Node> {
    match leaves {
        [] => None,
        [(i, _)] => Some(Node::Leaf(*i)),
        _ => {
            let (l, r) = leaves.split_at(leaves.len() / 2);
            let left_weight: u128 = l.iter().map(|(_, w)| w).sum();
            let right_weight: u128 = r.iter().map(|(_, w)| w).sum();
            Some(Node::Split {
                weight: left_weight + right_weight,
                left_weight,
                left: Box::new(build(l)?),
                right: Box::new(build(r)?),
            })
        }
    }
}

/// The leaf that request number `n` (counting from 0) goes to.
fn pick_nth(mut node: &Node, n: u64) -> usize {
    let mut c = u128::from(n);
    loop {
        match node {
            Node::Leaf(i) => return *i,
            Node::Split {
                weight,
                left_weight,
                left,
                right,
            } => {
                let sent_left = |c: u128| (c * left_weight + weight / 2) / weight;
                let before = sent_left(c);
                if sent_left(c + 1) > before {
                    node = left;
                    c = before;
                } else {
                    node = right;
                    c -= before;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(weights: &[u64], n: usize) -> Vec<u64> {
        let p = WeightedPicker::new(weights);
        let mut c = vec![0u64; weights.len()];
        for _ in 0..n {
            c[p.pick().unwrap()] += 1;
        }
        c
    }

    /// Largest distance, over every prefix of the run, between what each
    /// backend got and its exact share.
    fn worst_deviation(weights: &[u64], n: usize) -> f64 {
        let p = WeightedPicker::new(weights);
        let total: u64 = weights.iter().sum();
        let mut c = vec![0u64; weights.len()];
        let mut worst: f64 = 0.0;
        for k in 1..=n {
            c[p.pick().unwrap()] += 1;
            for (i, w) in weights.iter().enumerate() {
                let ideal = k as f64 * *w as f64 / total as f64;
                worst = worst.max((c[i] as f64 - ideal).abs());
            }
        }
        worst
    }

    #[test]
    fn canary_995_5_over_20000_gets_exactly_100() {
        assert_eq!(counts(&[995, 5], 20_000), vec![19_900, 100]);
    }

    #[test]
    fn two_backends_never_drift_by_a_whole_request() {
        for weights in [[995u64, 5], [90, 10], [1, 1], [1_000_000, 1], [3, 7]] {
            assert!(worst_deviation(&weights, 5_000) <= 1.0, "{weights:?}");
        }
    }

    #[test]
    fn many_backends_stay_within_the_tree_depth() {
        let weights = [1u64, 2, 3, 4, 5, 6, 7, 1_000];
        // depth 3: at most 1.5 requests off at any point in the run
        assert!(worst_deviation(&weights, 20_000) <= 1.5);
        let weights = [7u64; 5];
        assert!(worst_deviation(&weights, 1_000) <= 1.5);
    }

    #[test]
    fn zero_weight_gets_nothing_and_all_zero_picks_none() {
        assert_eq!(counts(&[0, 3, 0, 1], 400), vec![0, 300, 0, 100]);
        assert_eq!(WeightedPicker::new(&[0, 0]).pick(), None);
        assert_eq!(WeightedPicker::new(&[]).pick(), None);
    }

    #[test]
    fn canary_requests_are_spread_evenly_not_in_a_burst() {
        let p = WeightedPicker::new(&[995, 5]);
        let canary_at: Vec<usize> = (0..1_000).filter(|_| p.pick() == Some(1)).collect();
        assert_eq!(canary_at.len(), 5);
        for pair in canary_at.windows(2) {
            assert_eq!(pair[1] - pair[0], 200);
        }
    }

    #[test]
    fn huge_counter_values_do_not_overflow() {
        let root = build(&[(0, 1_000_000), (1, 1_000_000), (2, 3)]).unwrap();
        for n in [u64::MAX - 2, u64::MAX - 1, u64::MAX] {
            assert!(pick_nth(&root, n) < 3);
        }
    }

    #[test]
    fn concurrent_pickers_still_split_exactly() {
        let p = std::sync::Arc::new(WeightedPicker::new(&[995, 5]));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || (0..5_000).filter(|_| p.pick() == Some(1)).count())
            })
            .collect();
        let canary: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(canary, 100);
    }
}
