//! Gateway API durations (`10s`, `1m30s`, `500ms`), as HTTPRoute timeouts
//! use them.
//!
//! Per the spec (GEP-2257): a Duration matches
//! `^([0-9]{1,5}(h|m|s|ms)){1,4}$`; "0s" means no timeout.

use std::time::Duration;

/// Parse a Gateway API duration.
pub fn parse_gateway_duration(text: &str) -> Result<Duration, String> {
    let invalid =
        || format!("{text:?} is not a Gateway API duration (like \"10s\", \"1m30s\", \"500ms\")");
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut parts = 0;
    let mut total = Duration::ZERO;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &text[start..i];
        if digits.is_empty() || digits.len() > 5 {
            return Err(invalid());
        }
        let n: u64 = digits.parse().map_err(|_| invalid())?;
        let rest = &text[i..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else {
            return Err(invalid());
        };
        i += len;
        parts += 1;
        if parts > 4 {
            return Err(invalid());
        }
        // At most 4 parts of at most 99999h: no overflow.
        total += unit * u32::try_from(n).map_err(|_| invalid())?;
    }
    if parts == 0 {
        return Err(invalid());
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_spec_examples() {
        assert_eq!(parse_gateway_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_gateway_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(
            parse_gateway_duration("500ms"),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(
            parse_gateway_duration("1h2m3s4ms"),
            Ok(Duration::from_millis(3_723_004))
        );
        assert_eq!(parse_gateway_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_what_the_pattern_refuses() {
        for bad in [
            "",
            "10",
            "s",
            "1.5s",
            "100000s",
            "1h1h1h1h1h",
            "10 s",
            "-1s",
            "1d",
        ] {
            assert!(parse_gateway_duration(bad).is_err(), "{bad:?}");
        }
    }
}
