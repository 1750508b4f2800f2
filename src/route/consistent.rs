//! Consistent users during a rollout: a request carrying the rule's key
//! (a header or a cookie) is placed by a hash of the key's value, so that
//! a user who reached an incoming backend at one step stays there at every
//! later step, and a rollback (served = from) moves everyone back.
//!
//! How: the key's value is hashed ([`super::stable_hash`]: FNV-1a with a
//! fixed finalizer, the same in every process and replica, as session
//! tokens use it) to a point of
//! `[0, 2^32)`. Each incoming backend (its share grows from `from` to
//! `to`) owns a reserved interval as long as its `to` share, laid out from
//! 0 in backend order, and serves the prefix of it that its served share
//! covers. As the step grows, the prefix grows, so a point inside it stays
//! inside. Every other point (the unserved tails and the rest of the
//! range) goes to the other backends in proportion to their served shares.
//! Requests without the key keep the exact per-request split.
//!
//! Stickiness holds within one rollout (fixed `from` and `to`); a new
//! rollout lays the range out again.

use http::HeaderMap;

use super::session::cookie_values;

/// Points of the placement range: `[0, 2^32)`.
const RANGE: u128 = 1 << 32;

/// Where a request's consistency key is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The first value of this request header.
    Header(http::HeaderName),
    /// This cookie of the `Cookie` header(s).
    Cookie(String),
}

impl KeySource {
    /// The key's value in `headers`; `None` when absent or empty.
    pub fn value<'h>(&self, headers: &'h HeaderMap) -> Option<&'h [u8]> {
        let value = match self {
            KeySource::Header(name) => headers.get(name).map(|v| v.as_bytes()),
            KeySource::Cookie(name) => cookie_values(headers, name).next(),
        };
        value.filter(|v| !v.is_empty())
    }
}

/// The placement of keyed requests over a rule's backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consistent {
    pub key: KeySource,
    /// Incoming backends in layout order: (backend, region length, served
    /// prefix length), in points.
    incoming: Vec<(usize, u64, u64)>,
    /// The other backends with a served share: (backend, upper bound of its
    /// part of the leftover points, exclusive).
    others: Vec<(usize, u64)>,
}

impl Consistent {
    /// Lay out the range for backends with these `from`, `to` and `served`
    /// weights (one entry per backend, same order as the rule's picker).
    pub fn new(key: KeySource, from: &[u64], to: &[u64], served: &[u64]) -> Consistent {
        let n = served.len();
        let at = |w: &[u64], i: usize| u128::from(w.get(i).copied().unwrap_or(0));
        let f_sum: u128 = (0..n).map(|i| at(from, i)).sum();
        let t_sum: u128 = (0..n).map(|i| at(to, i)).sum();
        let s_sum: u128 = (0..n).map(|i| at(served, i)).sum();
        let mut incoming = Vec::new();
        let mut other_weights = Vec::new();
        for i in 0..n {
            // Share grows: t_i / T > f_i / F, cross-multiplied.
            let grows = t_sum > 0 && at(to, i) * f_sum > at(from, i) * t_sum;
            if grows {
                let region = at(to, i) * RANGE / t_sum;
                let prefix = (at(served, i) * RANGE)
                    .checked_div(s_sum)
                    .map_or(0, |p| p.min(region));
                // Both are at most RANGE = 2^32.
                incoming.push((i, region as u64, prefix as u64));
            } else if at(served, i) > 0 {
                other_weights.push((i, at(served, i)));
            }
        }
        let taken: u128 = incoming.iter().map(|(_, _, p)| u128::from(*p)).sum();
        let leftover = RANGE - taken.min(RANGE);
        let others_sum: u128 = other_weights.iter().map(|(_, w)| w).sum();
        let mut cumulative = 0u128;
        let others = other_weights
            .into_iter()
            .map(|(i, w)| {
                cumulative += w;
                (i, (leftover * cumulative / others_sum) as u64)
            })
            .collect();
        Consistent {
            key,
            incoming,
            others,
        }
    }

    /// The backend for a key whose [`super::stable_hash`] is `hash`; `None` when
    /// no backend has a served share.
    pub fn place(&self, hash: u64) -> Option<usize> {
        let point = hash >> 32;
        // Rank of the point among the leftover points.
        let mut rank = point;
        let mut start = 0u64;
        for &(backend, region, prefix) in &self.incoming {
            if point < start + region {
                if point < start + prefix {
                    return Some(backend);
                }
                rank -= prefix;
                return self.leftover(rank);
            }
            start += region;
            rank -= prefix;
        }
        self.leftover(rank)
    }

    fn leftover(&self, rank: u64) -> Option<usize> {
        match self.others.iter().find(|(_, upper)| rank < *upper) {
            Some((backend, _)) => Some(*backend),
            // Rounding slack, or every share is on incoming backends: the
            // incoming backend with the largest served prefix.
            None => self.others.last().map(|(b, _)| *b).or_else(|| {
                self.incoming
                    .iter()
                    .filter(|(_, _, p)| *p > 0)
                    .max_by_key(|(_, _, p)| *p)
                    .map(|(b, _, _)| *b)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::stable_hash;
    use http::HeaderValue;
    use http::header::COOKIE;

    fn keys(n: u32) -> Vec<u64> {
        (0..n)
            .map(|i| stable_hash(format!("user-{i}").as_bytes()))
            .collect()
    }

    fn layout(from: &[u64], to: &[u64], served: &[u64]) -> Consistent {
        Consistent::new(
            KeySource::Header(http::HeaderName::from_static("x-user")),
            from,
            to,
            served,
        )
    }

    #[test]
    fn keys_spread_like_the_served_shares() {
        // Steps of 1000/0 -> 0/1000: 995/5, 950/50, 750/250.
        for (served, canary_share) in [([995u64, 5], 0.005), ([950, 50], 0.05), ([750, 250], 0.25)]
        {
            let c = layout(&[1000, 0], &[0, 1000], &served);
            let n = 100_000;
            let canary = keys(n)
                .into_iter()
                .filter(|h| c.place(*h) == Some(1))
                .count() as f64;
            let share = canary / f64::from(n);
            assert!(
                (share - canary_share).abs() < 0.01 * canary_share.max(0.05),
                "{served:?}: {share}"
            );
        }
    }

    #[test]
    fn a_key_on_an_incoming_backend_stays_there_at_every_later_step() {
        let ladder = [[1000u64, 0], [995, 5], [950, 50], [750, 250], [0, 1000]];
        let layouts: Vec<Consistent> = ladder
            .iter()
            .map(|s| layout(&[1000, 0], &[0, 1000], s))
            .collect();
        for h in keys(20_000) {
            let mut on_canary = false;
            for c in &layouts {
                let here = c.place(h) == Some(1);
                assert!(!on_canary || here, "a canary user moved back");
                on_canary = here;
            }
            assert!(on_canary, "at 100% every user is on the canary");
        }
        // Rollback: served = from, nobody on the canary.
        let back = layout(&[1000, 0], &[0, 1000], &[1000, 0]);
        assert!(keys(5_000).into_iter().all(|h| back.place(h) == Some(0)));
    }

    #[test]
    fn three_backends_and_a_removed_one() {
        // from: a 50, b 50; to: a 50, c 50 (b removed). Incoming: c.
        let c = layout(&[50, 50, 0], &[50, 0, 50], &[50, 25, 25]);
        let mut counts = [0u32; 3];
        for h in keys(60_000) {
            counts[c.place(h).expect("a backend")] += 1;
        }
        for (i, want) in [(0, 0.5), (1, 0.25), (2, 0.25)] {
            let share = f64::from(counts[i]) / 60_000.0;
            assert!((share - want).abs() < 0.02, "{counts:?}");
        }
        // Zero served share never gets a key.
        let c = layout(&[1, 0], &[0, 1], &[0, 1]);
        assert!(keys(1_000).into_iter().all(|h| c.place(h) == Some(1)));
        let none = layout(&[0, 0], &[0, 0], &[0, 0]);
        assert_eq!(none.place(42), None);
    }

    #[test]
    fn keys_are_read_from_headers_and_cookies() {
        let mut headers = HeaderMap::new();
        headers.insert("x-user", HeaderValue::from_static("alice"));
        headers.append(COOKIE, HeaderValue::from_static("a=1; session=s-42"));
        headers.append(COOKIE, HeaderValue::from_static("session=later"));
        let header = KeySource::Header(http::HeaderName::from_static("x-user"));
        assert_eq!(header.value(&headers), Some(&b"alice"[..]));
        let cookie = KeySource::Cookie("session".into());
        assert_eq!(cookie.value(&headers), Some(&b"s-42"[..]));
        assert_eq!(KeySource::Cookie("sess".into()).value(&headers), None);
        assert_eq!(
            KeySource::Cookie("a".into()).value(&headers),
            Some(&b"1"[..])
        );
        headers.insert("x-user", HeaderValue::from_static(""));
        assert_eq!(header.value(&headers), None);
    }
}
