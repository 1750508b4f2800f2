//! RolloutPolicy (`sluice.dev/v1alpha1`): how a change of an HTTPRoute's
//! weights is served, in steps judged by the gateway, instead of at once.
//!
//! The route's weights say where traffic ends up; the policy, attached to
//! the route with GEP-713 `targetRefs`, says how it gets there (see
//! `docs/rollouts.md`). This module holds the object as a manifest spells
//! it, and [`RolloutPolicy::settings`], which checks it and turns it into
//! exact values: percentages as integers in thousandths of a percent
//! ([`Percent`]), durations as [`Duration`]s. Floats never enter the step
//! arithmetic.

use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::{GATEWAY_GROUP, parse_gateway_duration};
use crate::rollout::gates::{Bound, Confidence, Gate, Signal};

/// The API group of sluice's own kinds.
pub const SLUICE_GROUP: &str = "sluice.dev";
/// `apiVersion` of RolloutPolicy.
pub const ROLLOUT_POLICY_API_VERSION: &str = "sluice.dev/v1alpha1";
/// The most steps a policy may list (the CRD's `maxItems`).
pub const MAX_STEPS: usize = 32;
/// The most targetRefs a policy may list (GEP-713's `maxItems`).
pub const MAX_TARGET_REFS: usize = 16;

/// A RolloutPolicy as read from a manifest or the API server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutPolicy {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: RolloutPolicySpec,
    /// What the API server holds (written by the leader in Kubernetes
    /// mode); never read by translate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// `spec` of a RolloutPolicy. Unknown fields are refused: a misspelt gate
/// (`maxErrorrate`) must not silently turn a gate off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutPolicySpec {
    /// GEP-713 policy attachment: HTTPRoutes of the policy's namespace,
    /// optionally one named rule (`sectionName`).
    pub target_refs: Vec<RolloutTargetRef>,
    /// Percentages of the way from the served shares to the spec shares,
    /// increasing, ending at `"100%"`: `["0.5%", "5%", "25%", "100%"]`.
    pub steps: Vec<String>,
    /// Bake time of each step, a Gateway API duration (`5m`, `300ms`).
    pub interval: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<RolloutAnalysis>,
    /// What a failed gate does: `Rollback` (the default) or `Pause`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailure>,
    /// Hold the current step (gates still judge, and roll back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Place requests carrying this header or cookie by a hash of its
    /// value, so a user stays on the backend it reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_by: Option<ConsistentBy>,
}

/// GEP-713 `LocalPolicyTargetReferenceWithSectionName`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutTargetRef {
    pub group: String,
    pub kind: String,
    pub name: String,
    /// The `name` of one rule of the route; absent: every rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

/// The gates each step is judged by.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutAnalysis {
    /// Responses of the incoming backends a step needs before it can pass
    /// (and before a gate can fail it). Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_requests: Option<u64>,
    /// Largest 5xx share of the incoming backends' responses, `"1%"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_error_rate: Option<String>,
    /// Largest p99 latency of the incoming backends: at most 1% of their
    /// responses slower than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_latency: Option<String>,
    /// How sure a gate must be before it fails a step, `"99%"` (the
    /// default): a rollout within its limits is failed with probability at
    /// most 1 - confidence, however often it is looked at. Above 50%, at
    /// most 99.99%.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<String>,
    /// `Stable`: judge the incoming backends against the outgoing ones of
    /// the same rule over the same time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Baseline>,
    /// With `baseline: Stable`: how much worse than the stable, relatively,
    /// the canary's 5xx (and slow-response) rate may be, `"25%"` (the
    /// default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_degradation: Option<String>,
}

/// `spec.analysis.baseline`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Baseline {
    /// The outgoing backends of the same rule, over the same time.
    Stable,
}

/// The default `maxDegradation`, in thousandths of a percent: 25%.
pub const DEFAULT_MAX_DEGRADATION: u32 = 25_000;
/// The largest `maxDegradation`: 10,000% (the canary at 101x the stable).
pub const MAX_DEGRADATION: u32 = 10_000_000;

/// `spec.onFailure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum OnFailure {
    /// Serve `from` until the route's weights change again.
    #[default]
    Rollback,
    /// Hold the current step until the policy's spec changes.
    Pause,
}

/// `spec.consistentBy`: exactly one of `header` and `cookie`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConsistentBy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
}

/// A percentage in thousandths of a percent: `"0.125%"` is 125, `"100%"`
/// is 100,000. Exact: what the manifest says, no float in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Percent(u32);

impl Percent {
    /// 100%, in thousandths of a percent.
    pub const SCALE: u32 = 100_000;
    pub const ZERO: Percent = Percent(0);
    pub const HUNDRED: Percent = Percent(Self::SCALE);

    /// [`Percent::from_thousandths`] in constants.
    pub const fn from_thousandths_const(thousandths: u32) -> Percent {
        if thousandths > Self::SCALE {
            Percent(Self::SCALE)
        } else {
            Percent(thousandths)
        }
    }

    /// `thousandths` thousandths of a percent, at most 100%.
    pub fn from_thousandths(thousandths: u32) -> Percent {
        Percent(thousandths.min(Self::SCALE))
    }

    pub fn thousandths(self) -> u32 {
        self.0
    }

    /// Parse `"0.5%"`, `"5%"`, `"100%"`, `"0.125%"`: digits, at most 3
    /// decimals, a `%`, at most 100%.
    pub fn parse(text: &str) -> Result<Percent, String> {
        let invalid = || format!("{text:?} is not a percentage like \"0.5%\" or \"25%\"");
        let number = text.strip_suffix('%').ok_or_else(invalid)?;
        let (whole, decimals) = match number.split_once('.') {
            Some((w, d)) => (w, d),
            None => (number, ""),
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(whole) || (number.contains('.') && !digits(decimals)) {
            return Err(invalid());
        }
        if decimals.len() > 3 {
            return Err(format!(
                "{text:?} has more than 3 decimals (the finest step is 0.001%)"
            ));
        }
        if whole.len() > 3 {
            return Err(format!("{text:?} is over 100%"));
        }
        let whole: u32 = whole.parse().map_err(|_| invalid())?;
        let mut fraction: u32 = if decimals.is_empty() {
            0
        } else {
            decimals.parse().map_err(|_| invalid())?
        };
        for _ in decimals.len()..3 {
            fraction *= 10;
        }
        let value = whole * 1000 + fraction;
        if value > Self::SCALE {
            return Err(format!("{text:?} is over 100%"));
        }
        Ok(Percent(value))
    }
}

impl fmt::Display for Percent {
    /// `0.5%`, `5%`, `100%`, `0.125%`: the shortest exact form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / 1000;
        let fraction = self.0 % 1000;
        if fraction == 0 {
            write!(f, "{whole}%")
        } else {
            let digits = format!("{fraction:03}");
            write!(f, "{whole}.{}%", digits.trim_end_matches('0'))
        }
    }
}

/// Where a consistent user's key is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ConsistentKey {
    /// A request header (lower-cased name).
    Header(http::HeaderName),
    /// A cookie of the `Cookie` header.
    Cookie(String),
}

/// A RolloutPolicy's spec, checked and in exact form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutSettings {
    /// Strictly increasing, the last one 100%.
    pub steps: Vec<Percent>,
    pub interval: Duration,
    /// Responses of the incoming backends a step needs before it passes
    /// (never needed for a rollback).
    pub min_requests: u64,
    /// Every gate, in the order the spec writes them: maxErrorRate,
    /// maxLatency, then against the stable.
    pub gates: Vec<Gate>,
    pub confidence: Confidence,
    pub on_failure: OnFailure,
    pub paused: bool,
    pub consistent_by: Option<ConsistentKey>,
}

impl RolloutSettings {
    /// The latency gates' threshold: a response slower than this is an
    /// event.
    pub fn slow_after(&self) -> Option<Duration> {
        self.gates.iter().find_map(|g| match g.signal {
            Signal::SlowerThan(d) => Some(d),
            Signal::Errors => None,
        })
    }

    /// Whether a gate judges against the stable traffic.
    pub fn against_stable(&self) -> bool {
        self.gates
            .iter()
            .any(|g| matches!(g.bound, Bound::Stable { .. }))
    }
}

/// `"25%"`, `"150%"`, `"2.5%"`: thousandths of a percent, at most
/// [`MAX_DEGRADATION`].
fn parse_degradation(text: &str) -> Result<u32, String> {
    if text.trim_start().starts_with('-') {
        return Err(format!(
            "{text:?} is negative: it is how much worse than the stable the canary may be"
        ));
    }
    let number = text
        .strip_suffix('%')
        .ok_or_else(|| format!("{text:?} is not a percentage like \"25%\""))?;
    let (whole, decimals) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (number.contains('.') && !digits(decimals)) || decimals.len() > 3 {
        return Err(format!(
            "{text:?} is not a percentage like \"25%\" (at most 3 decimals)"
        ));
    }
    let too_large = || format!("{text:?} is over {}%", MAX_DEGRADATION / 1000);
    let whole: u64 = whole.parse().map_err(|_| too_large())?;
    let mut fraction: u64 = if decimals.is_empty() {
        0
    } else {
        decimals.parse().map_err(|_| too_large())?
    };
    for _ in decimals.len()..3 {
        fraction *= 10;
    }
    let value = whole.saturating_mul(1000).saturating_add(fraction);
    u32::try_from(value)
        .ok()
        .filter(|v| *v <= MAX_DEGRADATION)
        .ok_or_else(too_large)
}

impl RolloutPolicy {
    /// The spec in exact form, or every problem as `(field, message)`.
    pub fn settings(&self) -> Result<RolloutSettings, Vec<(String, String)>> {
        let spec = &self.spec;
        let mut problems = Vec::new();
        let mut push = |field: String, message: String| problems.push((field, message));

        if spec.target_refs.is_empty() || spec.target_refs.len() > MAX_TARGET_REFS {
            push(
                "spec.targetRefs".into(),
                format!(
                    "has {} entries; 1 to {MAX_TARGET_REFS} are allowed",
                    spec.target_refs.len()
                ),
            );
        }
        for (i, t) in spec.target_refs.iter().enumerate() {
            let f = format!("spec.targetRefs[{i}]");
            if t.group != GATEWAY_GROUP {
                push(
                    format!("{f}.group"),
                    format!("{:?} is not supported; only {GATEWAY_GROUP:?}", t.group),
                );
            }
            if t.kind != "HTTPRoute" {
                push(
                    format!("{f}.kind"),
                    format!("{:?} is not supported; only \"HTTPRoute\"", t.kind),
                );
            }
            if t.name.is_empty() {
                push(format!("{f}.name"), "is required".into());
            }
            if t.section_name.as_deref() == Some("") {
                push(format!("{f}.sectionName"), "must not be empty".into());
            }
        }

        let mut steps = Vec::new();
        if spec.steps.is_empty() || spec.steps.len() > MAX_STEPS {
            push(
                "spec.steps".into(),
                format!(
                    "has {} entries; 1 to {MAX_STEPS} are allowed",
                    spec.steps.len()
                ),
            );
        }
        for (i, s) in spec.steps.iter().enumerate() {
            let f = format!("spec.steps[{i}]");
            match Percent::parse(s) {
                Ok(p) if p == Percent::ZERO => push(f, "must be above 0%".into()),
                Ok(p) => {
                    if let Some(prev) = steps.last()
                        && p <= *prev
                    {
                        push(
                            f,
                            format!("{p} does not increase on the step before it ({prev})"),
                        );
                    } else {
                        steps.push(p);
                    }
                }
                Err(e) => push(f, e),
            }
        }
        if let Some(last) = spec.steps.last()
            && Percent::parse(last).is_ok_and(|p| p != Percent::HUNDRED)
        {
            push(
                format!("spec.steps[{}]", spec.steps.len() - 1),
                format!("the last step is {last:?}; it must be \"100%\""),
            );
        }

        let interval = parse_gateway_duration(&spec.interval)
            .map_err(|e| push("spec.interval".into(), e))
            .unwrap_or_default();

        let analysis = spec.analysis.clone().unwrap_or_default();
        let max_error_rate = analysis.max_error_rate.as_deref().and_then(|r| {
            Percent::parse(r)
                .map_err(|e| push("spec.analysis.maxErrorRate".into(), e))
                .ok()
        });
        let max_latency =
            analysis
                .max_latency
                .as_deref()
                .and_then(|l| match parse_gateway_duration(l) {
                    Ok(d) if d.is_zero() => {
                        push(
                            "spec.analysis.maxLatency".into(),
                            format!("{l:?} is zero; no request is that fast"),
                        );
                        None
                    }
                    Ok(d) => Some(d),
                    Err(e) => {
                        push("spec.analysis.maxLatency".into(), e);
                        None
                    }
                });

        let confidence = match analysis.confidence.as_deref() {
            None => Confidence::DEFAULT,
            Some(c) => match Percent::parse(c) {
                Ok(p) if p.thousandths() > 50_000 && p.thousandths() <= 99_990 => Confidence(p),
                Ok(_) => {
                    push(
                        "spec.analysis.confidence".into(),
                        format!("{c:?} is outside (50%, 99.99%]"),
                    );
                    Confidence::DEFAULT
                }
                Err(e) => {
                    push("spec.analysis.confidence".into(), e);
                    Confidence::DEFAULT
                }
            },
        };
        let degradation = match analysis.max_degradation.as_deref() {
            None => DEFAULT_MAX_DEGRADATION,
            Some(d) => {
                if analysis.baseline.is_none() {
                    push(
                        "spec.analysis.maxDegradation".into(),
                        "is a tolerance against the stable: it needs baseline: Stable".into(),
                    );
                }
                parse_degradation(d)
                    .map_err(|e| push("spec.analysis.maxDegradation".into(), e))
                    .unwrap_or(DEFAULT_MAX_DEGRADATION)
            }
        };
        let mut gates = Vec::new();
        if let Some(p) = max_error_rate {
            gates.push(Gate {
                signal: Signal::Errors,
                bound: Bound::Limit(p),
            });
        }
        if let Some(d) = max_latency {
            gates.push(Gate {
                signal: Signal::SlowerThan(d),
                bound: Bound::Limit(Percent::from_thousandths(1_000)),
            });
        }
        if analysis.baseline == Some(Baseline::Stable) {
            gates.push(Gate {
                signal: Signal::Errors,
                bound: Bound::Stable { degradation },
            });
            if let Some(d) = max_latency {
                gates.push(Gate {
                    signal: Signal::SlowerThan(d),
                    bound: Bound::Stable { degradation },
                });
            }
        }

        let consistent_by = match &spec.consistent_by {
            None => None,
            Some(ConsistentBy {
                header: Some(_),
                cookie: Some(_),
            })
            | Some(ConsistentBy {
                header: None,
                cookie: None,
            }) => {
                push(
                    "spec.consistentBy".into(),
                    "give exactly one of header and cookie".into(),
                );
                None
            }
            Some(ConsistentBy {
                header: Some(h), ..
            }) => match http::HeaderName::from_bytes(h.as_bytes()) {
                Ok(name) => Some(ConsistentKey::Header(name)),
                Err(_) => {
                    push(
                        "spec.consistentBy.header".into(),
                        format!("{h:?} is not a valid header name"),
                    );
                    None
                }
            },
            Some(ConsistentBy {
                cookie: Some(c), ..
            }) => {
                if is_cookie_name(c) {
                    Some(ConsistentKey::Cookie(c.clone()))
                } else {
                    push(
                        "spec.consistentBy.cookie".into(),
                        format!("{c:?} is not a valid cookie name (an RFC 6265 token)"),
                    );
                    None
                }
            }
        };

        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(RolloutSettings {
            steps,
            interval,
            min_requests: analysis.min_requests.unwrap_or(0),
            gates,
            confidence,
            on_failure: spec.on_failure.unwrap_or_default(),
            paused: spec.paused.unwrap_or(false),
            consistent_by,
        })
    }

    /// A fingerprint of the spec, equal across processes and restarts for
    /// an equal spec: a `Pause` after a failure holds "until the policy's
    /// spec changes", and generations restart with a standalone process.
    pub fn spec_fingerprint(&self) -> u64 {
        let text = serde_json::to_string(&self.spec).unwrap_or_default();
        crate::route::stable_hash(text.as_bytes())
    }
}

/// An RFC 6265 cookie name: an RFC 7230 token.
fn is_cookie_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(spec: &str) -> RolloutPolicy {
        crate::yaml::from_str(&format!("metadata: {{name: p}}\nspec:\n{spec}"))
            .expect("test policy parses")
    }

    const VALID: &str =
        "  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}]
  steps: ['0.5%', '5%', '25%', '100%']
  interval: 5m
";

    #[test]
    fn percentages_are_exact_thousandths() {
        for (text, value) in [
            ("0.5%", 500),
            ("5%", 5_000),
            ("0.125%", 125),
            ("100%", 100_000),
            ("100.000%", 100_000),
            ("0.001%", 1),
            ("33.3%", 33_300),
            ("0%", 0),
        ] {
            assert_eq!(Percent::parse(text), Ok(Percent(value)), "{text}");
        }
        for (value, text) in [
            (500, "0.5%"),
            (125, "0.125%"),
            (100_000, "100%"),
            (1, "0.001%"),
        ] {
            assert_eq!(Percent(value).to_string(), text);
        }
    }

    #[test]
    fn bad_percentages_say_why() {
        for (text, why) in [
            ("0.0625%", "more than 3 decimals"),
            ("100.5%", "over 100%"),
            ("1000%", "over 100%"),
            ("5", "not a percentage"),
            ("%", "not a percentage"),
            ("-1%", "not a percentage"),
            ("1.%", "not a percentage"),
            (".5%", "not a percentage"),
            ("1e2%", "not a percentage"),
            (" 5%", "not a percentage"),
        ] {
            let e = Percent::parse(text).expect_err(text);
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn a_valid_policy_has_exact_settings_and_defaults() {
        let s = policy(VALID).settings().expect("valid");
        assert_eq!(
            s.steps,
            [
                Percent(500),
                Percent(5_000),
                Percent(25_000),
                Percent(100_000)
            ]
        );
        assert_eq!(s.interval, Duration::from_secs(300));
        assert_eq!(s.min_requests, 0);
        assert_eq!(s.gates, []);
        assert_eq!(s.confidence, Confidence::DEFAULT);
        assert_eq!(s.on_failure, OnFailure::Rollback);
        assert!(!s.paused);
        let s = policy(&format!(
            "{VALID}  analysis: {{minRequests: 200, maxErrorRate: '1%', maxLatency: 500ms}}\n  onFailure: Pause\n  paused: true\n  consistentBy: {{cookie: session}}\n"
        ))
        .settings()
        .expect("valid");
        assert_eq!(s.min_requests, 200);
        assert_eq!(
            s.gates,
            [
                Gate {
                    signal: Signal::Errors,
                    bound: Bound::Limit(Percent(1_000))
                },
                Gate {
                    signal: Signal::SlowerThan(Duration::from_millis(500)),
                    bound: Bound::Limit(Percent(1_000))
                }
            ]
        );
        assert_eq!(s.on_failure, OnFailure::Pause);
        assert!(s.paused);
        assert_eq!(
            s.consistent_by,
            Some(ConsistentKey::Cookie("session".into()))
        );
        assert_eq!(s.slow_after(), Some(Duration::from_millis(500)));
        assert!(!s.against_stable());
        let s = policy(&format!(
            "{VALID}  analysis: {{maxErrorRate: '1%', baseline: Stable, maxDegradation: '150.5%', confidence: '99.9%'}}\n"
        ))
        .settings()
        .expect("valid");
        assert_eq!(s.confidence, Confidence(Percent(99_900)));
        assert_eq!(
            s.gates[1],
            Gate {
                signal: Signal::Errors,
                bound: Bound::Stable {
                    degradation: 150_500
                }
            }
        );
        let s = policy(&format!("{VALID}  analysis: {{baseline: Stable}}\n"))
            .settings()
            .expect("valid");
        assert_eq!(
            s.gates,
            [Gate {
                signal: Signal::Errors,
                bound: Bound::Stable {
                    degradation: DEFAULT_MAX_DEGRADATION
                }
            }]
        );
    }

    /// Every way a spec can be wrong, with the field the error names.
    #[test]
    fn validation_table() {
        let target =
            "  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}]\n";
        let rest = "  interval: 1s\n";
        let steps = "  steps: ['5%', '100%']\n";
        for (spec, field, why) in [
            (
                format!("{target}  steps: ['5%', '5%', '100%']\n{rest}"),
                "spec.steps[1]",
                "does not increase",
            ),
            (
                format!("{target}  steps: ['25%', '5%', '100%']\n{rest}"),
                "spec.steps[1]",
                "does not increase",
            ),
            (
                format!("{target}  steps: ['5%', '50%']\n{rest}"),
                "spec.steps[1]",
                "must be \"100%\"",
            ),
            (
                format!("{target}  steps: ['0.0625%', '100%']\n{rest}"),
                "spec.steps[0]",
                "more than 3 decimals",
            ),
            (
                format!("{target}  steps: ['5%', '150%']\n{rest}"),
                "spec.steps[1]",
                "over 100%",
            ),
            (
                format!("{target}  steps: ['0%', '100%']\n{rest}"),
                "spec.steps[0]",
                "above 0%",
            ),
            (
                format!("{target}  steps: []\n{rest}"),
                "spec.steps",
                "1 to 32",
            ),
            (
                format!("{target}{steps}  interval: 5 minutes\n"),
                "spec.interval",
                "not a Gateway API duration",
            ),
            (
                format!("{target}{steps}{rest}  analysis: {{maxErrorRate: one}}\n"),
                "spec.analysis.maxErrorRate",
                "not a percentage",
            ),
            (
                format!("{target}{steps}{rest}  analysis: {{maxErrorRate: '101%'}}\n"),
                "spec.analysis.maxErrorRate",
                "over 100%",
            ),
            (
                format!("{target}{steps}{rest}  analysis: {{maxLatency: 1d}}\n"),
                "spec.analysis.maxLatency",
                "not a Gateway API duration",
            ),
            (
                format!("{target}{steps}{rest}  analysis: {{maxLatency: 0s}}\n"),
                "spec.analysis.maxLatency",
                "zero",
            ),
            (
                format!("{target}{steps}{rest}  analysis: {{confidence: '50%'}}\n"),
                "spec.analysis.confidence",
                "outside (50%, 99.99%]",
            ),
            (
                format!("{target}{steps}{rest}  analysis: {{confidence: '99.995%'}}\n"),
                "spec.analysis.confidence",
                "outside (50%, 99.99%]",
            ),
            (
                format!("{target}{steps}{rest}  analysis: {{confidence: sure}}\n"),
                "spec.analysis.confidence",
                "not a percentage",
            ),
            (
                format!(
                    "{target}{steps}{rest}  analysis: {{baseline: Stable, maxDegradation: '-5%'}}\n"
                ),
                "spec.analysis.maxDegradation",
                "negative",
            ),
            (
                format!(
                    "{target}{steps}{rest}  analysis: {{baseline: Stable, maxDegradation: much}}\n"
                ),
                "spec.analysis.maxDegradation",
                "not a percentage",
            ),
            (
                format!(
                    "{target}{steps}{rest}  analysis: {{baseline: Stable, maxDegradation: '20000%'}}\n"
                ),
                "spec.analysis.maxDegradation",
                "over 10000%",
            ),
            (
                format!("{target}{steps}{rest}  analysis: {{maxDegradation: '25%'}}\n"),
                "spec.analysis.maxDegradation",
                "needs baseline: Stable",
            ),
            (
                format!("{target}{steps}{rest}  consistentBy: {{header: x-user, cookie: s}}\n"),
                "spec.consistentBy",
                "exactly one",
            ),
            (
                format!("{target}{steps}{rest}  consistentBy: {{}}\n"),
                "spec.consistentBy",
                "exactly one",
            ),
            (
                format!("{target}{steps}{rest}  consistentBy: {{header: 'bad header'}}\n"),
                "spec.consistentBy.header",
                "not a valid header name",
            ),
            (
                format!("{target}{steps}{rest}  consistentBy: {{cookie: 'a=b'}}\n"),
                "spec.consistentBy.cookie",
                "not a valid cookie name",
            ),
            (
                format!(
                    "  targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: g}}]\n{steps}{rest}"
                ),
                "spec.targetRefs[0].kind",
                "only \"HTTPRoute\"",
            ),
            (
                format!("  targetRefs: [{{group: '', kind: HTTPRoute, name: r}}]\n{steps}{rest}"),
                "spec.targetRefs[0].group",
                "not supported",
            ),
            (
                format!("  targetRefs: []\n{steps}{rest}"),
                "spec.targetRefs",
                "1 to 16",
            ),
        ] {
            let problems = policy(&spec).settings().expect_err(&spec);
            assert!(
                problems.iter().any(|(f, m)| f == field && m.contains(why)),
                "{spec}: expected {field}: ...{why}..., got {problems:?}"
            );
        }
    }

    #[test]
    fn unknown_fields_and_values_are_type_errors() {
        for spec in [
            format!("{VALID}  onFailure: Retry\n"),
            format!("{VALID}  analysis: {{maxErrorrate: '1%'}}\n"),
            format!("{VALID}  analysis: {{baseline: Canary}}\n"),
            format!("{VALID}  surprise: true\n"),
        ] {
            let parsed: Result<RolloutPolicy, _> =
                crate::yaml::from_str(&format!("metadata: {{name: p}}\nspec:\n{spec}"));
            assert!(parsed.is_err(), "{spec}");
        }
    }

    #[test]
    fn fingerprints_follow_the_spec() {
        let a = policy(VALID);
        let mut b = a.clone();
        b.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        assert_eq!(a.spec_fingerprint(), b.spec_fingerprint());
        b.spec.paused = Some(true);
        assert_ne!(a.spec_fingerprint(), b.spec_fingerprint());
    }
}
