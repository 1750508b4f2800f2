//! HTTPRoute rule `retry` (GEP-1731), compiled, and the decision it makes
//! after each try: send the request again (after how long), or answer with
//! what the last try got.
//!
//! Per the spec, `attempts` is the number of retries "in addition to the
//! initial request" (an explicit 0 disables them); `backoff` is the base
//! interval, and "unsuccessful backend requests are not retried before the
//! configured minimum duration". Connection failures are retried ("the
//! connection could not be established"), and so are tries cut off by
//! `timeouts.backendRequest`; failures after the request may have been
//! processed (a reset mid-exchange) are not.

use std::time::Duration;

use http::StatusCode;

/// Retries when `attempts` is not given (the spec leaves it to us).
pub const DEFAULT_RETRY_ATTEMPTS: u32 = 1;
/// Base backoff when `backoff` is not given.
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(25);
/// The backoff doubles after each retry up to this many times the base.
const BACKOFF_CAP_FACTOR: u32 = 8;

/// A rule's retry policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Response codes that are retried (400..=599).
    pub codes: Vec<StatusCode>,
    /// Retries after the first try; 0 disables retries.
    pub attempts: u32,
    /// Wait at least this long before the first retry.
    pub backoff: Duration,
}

/// How one try to a backend ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryOutcome {
    /// The backend answered with this status.
    Answered(StatusCode),
    /// No connection could be made: the backend never saw the request.
    ConnectFailed,
    /// `timeouts.backendRequest` passed without response headers.
    TimedOut,
    /// The exchange failed after the request may have reached the backend.
    Broken,
}

impl RetryPolicy {
    /// After try number `tried` (the first is 1) ended with `outcome`:
    /// `Some(wait)` to try again after `wait`, `None` to answer with it.
    pub fn next_try(&self, tried: u32, outcome: TryOutcome) -> Option<Duration> {
        if tried > self.attempts {
            return None;
        }
        let retriable = match outcome {
            TryOutcome::Answered(status) => self.codes.contains(&status),
            TryOutcome::ConnectFailed | TryOutcome::TimedOut => true,
            TryOutcome::Broken => false,
        };
        retriable.then(|| self.backoff_before(tried))
    }

    /// The wait before retry number `retry` (the first is 1): the base,
    /// doubled for each earlier retry, capped at 8 times the base.
    pub fn backoff_before(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX)
            .min(BACKOFF_CAP_FACTOR);
        self.backoff.saturating_mul(factor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(codes: &[u16], attempts: u32) -> RetryPolicy {
        RetryPolicy {
            codes: codes
                .iter()
                .map(|c| StatusCode::from_u16(*c).expect("test code"))
                .collect(),
            attempts,
            backoff: Duration::from_millis(100),
        }
    }

    fn answered(code: u16) -> TryOutcome {
        TryOutcome::Answered(StatusCode::from_u16(code).expect("test code"))
    }

    /// Tries made for a backend that answers `code` `failures` times, then 200.
    fn tries(p: &RetryPolicy, code: u16, failures: u32) -> (u32, u16) {
        let mut tried = 1;
        loop {
            let outcome = if tried <= failures {
                answered(code)
            } else {
                answered(200)
            };
            match p.next_try(tried, outcome) {
                Some(_) => tried += 1,
                None => {
                    let TryOutcome::Answered(s) = outcome else {
                        unreachable!()
                    };
                    return (tried, s.as_u16());
                }
            }
        }
    }

    #[test]
    fn attempts_count_retries_after_the_first_try() {
        // The conformance cases: codes [500], attempts 3.
        let p = policy(&[500], 3);
        assert_eq!(tries(&p, 500, 2), (3, 200), "succeeds after 2 retries");
        assert_eq!(tries(&p, 500, 3), (4, 200), "the 3rd retry succeeds");
        assert_eq!(tries(&p, 500, 4), (4, 500), "the original error surfaces");
        assert_eq!(tries(&p, 503, 2), (1, 503), "503 is not in codes");
        // codes [500, 502, 503, 504], attempts 2.
        let p = policy(&[500, 502, 503, 504], 2);
        for code in [500, 502, 503, 504] {
            assert_eq!(tries(&p, code, 1), (2, 200), "{code}");
            assert_eq!(tries(&p, code, 3), (3, code), "{code}");
        }
    }

    #[test]
    fn zero_attempts_never_retry() {
        let p = policy(&[500], 0);
        assert_eq!(p.next_try(1, answered(500)), None);
        assert_eq!(p.next_try(1, TryOutcome::ConnectFailed), None);
    }

    #[test]
    fn connection_failures_and_timeouts_retry_broken_exchanges_do_not() {
        let p = policy(&[], 2);
        assert!(p.next_try(1, TryOutcome::ConnectFailed).is_some());
        assert!(p.next_try(2, TryOutcome::TimedOut).is_some());
        assert_eq!(p.next_try(3, TryOutcome::ConnectFailed), None);
        assert_eq!(p.next_try(1, TryOutcome::Broken), None);
        assert_eq!(p.next_try(1, answered(500)), None, "no codes configured");
    }

    #[test]
    fn backoff_never_below_the_base_and_capped() {
        let p = policy(&[500], 10);
        let ms = |r| p.backoff_before(r).as_millis();
        assert_eq!(ms(1), 100);
        assert_eq!(ms(2), 200);
        assert_eq!(ms(3), 400);
        assert_eq!(ms(4), 800);
        assert_eq!(ms(5), 800);
        assert_eq!(ms(40), 800, "no overflow");
        assert_eq!(
            p.next_try(2, answered(500)),
            Some(Duration::from_millis(200))
        );
    }
}
