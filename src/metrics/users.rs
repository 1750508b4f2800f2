//! Distinct users per backend per rollout step, counted on the request
//! path: with a RolloutPolicy's `consistentBy`, 10% of the requests is not
//! 10% of the users, and one user's retry storm is not many users failing.
//!
//! A request carrying the rule's consistent-users key comes with the
//! key's 64-bit hash (the one its placement computed,
//! [`crate::route::stable_hash`]). Each backend a rollout tracks users for
//! keeps, for the step being served ([`StepUsers`], replaced when a step
//! starts):
//! - an exact set of the users' hashes, each with one bit saying whether
//!   the user saw a 5xx in this step: a lock-free open-addressing table of
//!   [`EXACT_USERS`] entries at most (twice as many slots: 64 KiB),
//!   allocated at the step's first keyed request;
//! - two HyperLogLog sketches (2^12 one-byte registers each, 4 KiB), of
//!   every user and of the users with a 5xx, fed always, read only once a
//!   user did not fit in the table: then the counts are estimates, with a
//!   relative standard error of 1.04 / sqrt(4096) = 1.6% (Flajolet et al.
//!   2007; linear counting below 2.5 x 4096 users, Heule et al. 2013).
//!
//! What the request learns back: whether its 5xx is a *repeated* error
//! (the user already had one in this step), which the error gates do not
//! judge (`docs/rollouts.md`, "Users"). A user that did not fit in the
//! table has no memory: its errors count as first errors, as every error
//! did before users were counted.
//!
//! The counts are cumulative over steps ([`UserCounts`]: each step's
//! final counts are kept as the next step's base), so that, like every
//! other outcome counter, the difference of two readings is what happened
//! in between: the distinct users of a step are its reading minus the
//! reading at its start.
//!
//! The table's slot and the sketches' registers are chosen by a remix of
//! the hash: placement uses its top 32 bits, so the users of one backend
//! share a range of them, which would crowd one end of the table and a
//! few registers.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

/// Users counted exactly per backend and step; beyond, estimated.
pub const EXACT_USERS: u64 = 4096;

/// Slots of the exact table: twice its entries, so that probes stay short.
const SLOTS: usize = 2 * EXACT_USERS as usize;

/// Register index bits of a sketch: 2^12 registers.
const HLL_BITS: u32 = 12;
const REGISTERS: usize = 1 << HLL_BITS;

/// The cumulative counts of one backend's users (the sum over the steps
/// counted so far, the current one as it stands).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserCounts {
    /// Distinct users per step, summed over the steps.
    pub users: u64,
    /// Of those, users that saw at least one 5xx in the step.
    pub with_errors: u64,
    /// Steps whose users did not all fit in the exact table (their counts
    /// are estimates).
    pub estimated: u64,
}

/// The users of one backend in one step (or, not tracking, only the
/// counts of the steps before).
#[derive(Debug)]
pub struct StepUsers {
    /// The step counted ([`crate::rollout::fleet::step_id`]); `None`: not
    /// tracking users.
    step: Option<String>,
    /// The counts of the steps before this one.
    base: UserCounts,
    tables: OnceLock<Box<Tables>>,
}

#[derive(Debug)]
struct Tables {
    /// 0: empty; otherwise the user's hash with its lowest bit cleared
    /// (see [`identity`]), that bit set once the user saw a 5xx.
    slots: Box<[AtomicU64]>,
    /// Users in `slots`, and of those with an error.
    exact: AtomicU64,
    exact_errors: AtomicU64,
    /// A user did not fit: `users` is an estimate; a user with a 5xx did
    /// not fit: `with_errors` is.
    full: AtomicBool,
    errors_full: AtomicBool,
    all: Sketch,
    errored: Sketch,
}

impl StepUsers {
    /// Counting the users of `step`, after the counts `base` of the steps
    /// before.
    pub fn new(step: Option<String>, base: UserCounts) -> StepUsers {
        StepUsers {
            step,
            base,
            tables: OnceLock::new(),
        }
    }

    /// The step counted; `None` when not tracking.
    pub fn step(&self) -> Option<&str> {
        self.step.as_deref()
    }

    /// Count a request of the user whose key hashes to `user`, with a 5xx
    /// or not. Whether it is a repeated error: a 5xx of a user that had
    /// one before in this step (and fitted in the table). Lock-free: a
    /// few atomic loads, one compare-and-swap for a new user.
    pub fn see(&self, user: u64, error: bool) -> bool {
        if self.step.is_none() {
            return false;
        }
        let t = self.tables.get_or_init(|| Box::new(Tables::new()));
        let id = identity(user);
        let mixed = spread(id);
        t.all.insert(mixed);
        if error {
            t.errored.insert(mixed);
        }
        let mask = SLOTS - 1;
        let mut i = (mixed as usize) & mask;
        for _ in 0..SLOTS {
            let slot = &t.slots[i];
            let mut v = slot.load(Ordering::Acquire);
            if v == 0 {
                if t.exact.load(Ordering::Relaxed) >= EXACT_USERS {
                    break;
                }
                let new = id | u64::from(error);
                match slot.compare_exchange(0, new, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        t.exact.fetch_add(1, Ordering::Relaxed);
                        if error {
                            t.exact_errors.fetch_add(1, Ordering::Relaxed);
                        }
                        return false;
                    }
                    // Taken meanwhile: perhaps by this very user.
                    Err(actual) => v = actual,
                }
            }
            if v & !1 == id {
                if !error || v & 1 == 1 {
                    return error;
                }
                let before = slot.fetch_or(1, Ordering::AcqRel);
                if before & 1 == 1 {
                    return true;
                }
                t.exact_errors.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            i = (i + 1) & mask;
        }
        // No room: counted by the sketches only, with no memory of its
        // errors (each counts as a first error).
        t.full.store(true, Ordering::Relaxed);
        if error {
            t.errors_full.store(true, Ordering::Relaxed);
        }
        false
    }

    /// This step's counts (exact, or estimates once a user did not fit).
    pub fn step_counts(&self) -> UserCounts {
        let Some(t) = self.tables.get() else {
            return UserCounts::default();
        };
        let exact = t.exact.load(Ordering::Relaxed);
        let exact_errors = t.exact_errors.load(Ordering::Relaxed);
        let full = t.full.load(Ordering::Relaxed);
        let errors_full = t.errors_full.load(Ordering::Relaxed);
        UserCounts {
            users: if full {
                exact.max(t.all.estimate())
            } else {
                exact
            },
            with_errors: if errors_full {
                exact_errors.max(t.errored.estimate())
            } else {
                exact_errors
            },
            estimated: u64::from(full || errors_full),
        }
    }

    /// The counts of the steps before and this one's so far.
    pub fn totals(&self) -> UserCounts {
        let step = self.step_counts();
        UserCounts {
            users: self.base.users + step.users,
            with_errors: self.base.with_errors + step.with_errors,
            estimated: self.base.estimated + step.estimated,
        }
    }
}

impl Tables {
    fn new() -> Tables {
        Tables {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            exact: AtomicU64::new(0),
            exact_errors: AtomicU64::new(0),
            full: AtomicBool::new(false),
            errors_full: AtomicBool::new(false),
            all: Sketch::new(),
            errored: Sketch::new(),
        }
    }
}

/// A user's entry in the table: its hash without the lowest bit (which
/// says whether it saw a 5xx), never 0 (an empty slot).
fn identity(user: u64) -> u64 {
    match user & !1 {
        0 => 2,
        id => id,
    }
}

/// A bijective remix of a hash (splitmix64's finalizer, after an odd
/// offset): every bit depends on every bit of `h`.
fn spread(h: u64) -> u64 {
    let mut z = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A HyperLogLog sketch of 2^12 one-byte registers, updated with atomic
/// maxima (a load first: most updates change nothing).
#[derive(Debug)]
struct Sketch {
    registers: Box<[AtomicU8]>,
}

impl Sketch {
    fn new() -> Sketch {
        Sketch {
            registers: (0..REGISTERS).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    /// Add a (well-mixed) hash: its top bits choose the register, the rank
    /// of the first 1 among the others is kept if larger.
    fn insert(&self, mixed: u64) {
        let index = (mixed >> (64 - HLL_BITS)) as usize;
        let rest = mixed << HLL_BITS;
        // At most 64 - 12 + 1 = 53: fits a byte.
        let rank = (rest.leading_zeros().min(64 - HLL_BITS) + 1) as u8;
        let register = &self.registers[index];
        if register.load(Ordering::Relaxed) < rank {
            register.fetch_max(rank, Ordering::Relaxed);
        }
    }

    /// The estimated number of distinct hashes added: the harmonic-mean
    /// estimate, or linear counting (from the empty registers) while it is
    /// at most 2.5 times the registers.
    fn estimate(&self) -> u64 {
        let m = REGISTERS as f64;
        let mut sum = 0.0;
        let mut zeros = 0u32;
        for r in self.registers.iter() {
            let r = r.load(Ordering::Relaxed);
            sum += 2f64.powi(-i32::from(r));
            zeros += u32::from(r == 0);
        }
        let alpha = 0.7213 / (1.0 + 1.079 / m);
        let raw = alpha * m * m / sum;
        let estimate = if raw <= 2.5 * m && zeros > 0 {
            m * (m / f64::from(zeros)).ln()
        } else {
            raw
        };
        estimate.round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::stable_hash;

    fn user(i: u64) -> u64 {
        stable_hash(format!("user-{i}").as_bytes())
    }

    fn step(name: &str) -> StepUsers {
        StepUsers::new(Some(name.into()), UserCounts::default())
    }

    #[test]
    fn users_are_counted_exactly_below_the_cap_and_repeated_errors_are_told() {
        let s = step("5%@t");
        assert_eq!(s.step_counts(), UserCounts::default());
        for i in 0..1000 {
            assert!(!s.see(user(i), false));
            assert!(!s.see(user(i), false), "a second request is no error");
        }
        // User 7 fails three times: its first error, then two repeats.
        assert!(!s.see(user(7), true));
        assert!(s.see(user(7), true));
        assert!(s.see(user(7), true));
        // A new user's first request failing is a first error.
        assert!(!s.see(user(5000), true));
        assert!(s.see(user(5000), true));
        assert_eq!(
            s.step_counts(),
            UserCounts {
                users: 1001,
                with_errors: 2,
                estimated: 0
            }
        );
    }

    #[test]
    fn beyond_the_cap_the_counts_are_estimates_within_a_few_percent() {
        let s = step("25%@t");
        let n = 50_000;
        for i in 0..n {
            s.see(user(i), i % 10 == 0);
        }
        let c = s.step_counts();
        assert_eq!(c.estimated, 1);
        let off = |estimate: u64, truth: u64| (estimate as f64 / truth as f64 - 1.0).abs();
        // 1.6% standard error: 5% is more than three of them.
        assert!(off(c.users, n) < 0.05, "{c:?}");
        assert!(off(c.with_errors, n / 10) < 0.05, "{c:?}");
        // Users that fitted still have their memory.
        s.see(user(0), true);
        assert!(s.see(user(0), true));
    }

    #[test]
    fn users_of_one_placement_range_are_counted_as_well() {
        // The users one backend gets share the top bits of their hash (a
        // canary's 5%): the remix spreads them over the sketch anyway.
        let s = step("5%@t");
        let mut n = 0;
        let mut i = 0;
        while n < 20_000 {
            let h = user(i);
            i += 1;
            if h >> 32 < (1 << 32) / 20 {
                s.see(h, false);
                n += 1;
            }
        }
        let c = s.step_counts();
        assert!(
            (c.users as f64 / 20_000.0 - 1.0).abs() < 0.05,
            "{c:?} for 20,000 users"
        );
    }

    #[test]
    fn a_new_step_counts_afresh_after_the_steps_before() {
        let first = step("5%@t1");
        for i in 0..10 {
            first.see(user(i), i < 3);
        }
        let next = StepUsers::new(Some("25%@t2".into()), first.totals());
        assert_eq!(next.step_counts(), UserCounts::default());
        // The same users again: new in this step; their errors are first
        // errors again.
        for i in 0..4 {
            assert!(!next.see(user(i), true));
        }
        assert_eq!(
            next.totals(),
            UserCounts {
                users: 14,
                with_errors: 7,
                estimated: 0
            }
        );
        // Not tracking: nothing counted, the counts before kept.
        let idle = StepUsers::new(None, next.totals());
        assert!(!idle.see(user(1), true));
        assert!(!idle.see(user(1), true));
        assert_eq!(idle.totals(), next.totals());
    }

    #[test]
    fn a_sketch_estimates_small_and_large_counts() {
        let s = Sketch::new();
        assert_eq!(s.estimate(), 0);
        for i in 0..100 {
            s.insert(spread(i));
            s.insert(spread(i));
        }
        assert!((95..=105).contains(&s.estimate()), "{}", s.estimate());
        for i in 100..200_000 {
            s.insert(spread(i));
        }
        let e = s.estimate() as f64;
        assert!((e / 200_000.0 - 1.0).abs() < 0.05, "{e}");
    }

    #[test]
    fn the_hash_zero_is_a_user_like_any_other() {
        let s = step("1%@t");
        assert!(!s.see(0, true));
        assert!(s.see(0, true));
        // 63 bits of identity: hashes differing in the lowest bit only
        // are one user (one in 2^63 pairs).
        assert!(s.see(1, true));
        assert!(!s.see(2, false));
        assert_eq!(s.step_counts().users, 1);
        assert!(!s.see(4, false));
        assert_eq!(s.step_counts().users, 2);
    }
}
