//! `GET /overview`: what the dashboard shows, as one JSON document.
//!
//! Built from what the admin listener already holds (the published status
//! and rule summaries, the rollout report) and one reading of the
//! per-backend counters; nothing is computed per route on the request
//! path. The names are those of `/status` and `sluice check --json`'s
//! types (the same serializers): a backend is a [`BackendSummary`] with
//! its live figures ([`BackendView`]) next to it.
//!
//! A rollout in flight carries `history`: what its gates judged over time
//! ([`crate::rollout::history`]: counts, each side's rate bounds, the
//! limits, the step boundaries), in columns of numbers, at most 600
//! points; what the dashboard charts.
//!
//! Bounded: at most `rules` rules (default 100, at most 1,000; rules a
//! rollout governs first, then the busiest over the last minute) and 100
//! errors, so that a page left open on a gateway of 10,000 routes reads a
//! few hundred KB every poll, not the whole configuration.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::Published;
use crate::metrics::{BackendStatsKey, BackendView, Metrics, OBSERVED_WINDOW};
use crate::rollout::{History, RolloutReport, RolloutStatus, Rollouts};
use crate::source::ConfigError;
use crate::translate::{BackendSummary, ObjectStatus, RuleRollout, RuleSummary};

/// How much `/overview` returns.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub rules: usize,
    pub errors: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            rules: 100,
            errors: 100,
        }
    }
}

impl Limits {
    /// `?rules=N` (at most 1,000).
    pub fn from_query(query: Option<&str>) -> Self {
        let mut limits = Limits::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            if k == "rules"
                && let Ok(n) = v.parse::<usize>()
            {
                limits.rules = n.min(1000);
            }
        }
        limits
    }
}

/// The dashboard's document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Overview<'a> {
    /// Number of the route table in service.
    pub generation: u64,
    /// How far back the observed shares and rates look, in seconds.
    pub window_seconds: f64,
    /// Gateways and ListenerSets as `/status` shows them (listeners with
    /// their conditions and attached routes).
    pub gateways: Vec<&'a ObjectStatus>,
    pub rules_total: usize,
    pub rules: Vec<RuleView<'a>>,
    pub rollouts: Vec<RolloutView<'a>>,
    pub errors_total: usize,
    pub errors: &'a [ConfigError],
}

/// One rule and its backends, live.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleView<'a> {
    pub kind: &'a str,
    pub route: &'a str,
    pub rule: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<&'a RuleRollout>,
    pub backends: Vec<BackendLive<'a>>,
}

/// A backend as `/status` and `check` name it, with its live figures.
#[derive(Debug, Serialize)]
pub struct BackendLive<'a> {
    #[serde(flatten)]
    pub summary: &'a BackendSummary,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub live: Option<BackendView>,
}

/// One governed rule of a RolloutPolicy, as its status says it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutView<'a> {
    /// `<namespace>/<name>` of the RolloutPolicy.
    pub policy: String,
    #[serde(flatten)]
    pub status: &'a RolloutStatus,
    /// What each step is judged by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gates: Option<&'a Gates>,
    /// What the gates judged over time, while this process judges the
    /// rollout (the leader, or a standalone gateway) and since its first
    /// step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<&'a History>,
}

/// A RolloutPolicy's gates, as the machine judges them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Gates {
    /// How long each step lasts at least (`5m`).
    pub interval: String,
    /// Responses a step needs before it passes (never for a rollback).
    pub min_requests: u64,
    /// `99%`: how sure a gate is before it fails a step.
    pub confidence: String,
    /// Each gate: `5xx <= 1%`, `5xx <= 1.25x stable`, `p99 <= 500ms`.
    pub judged: Vec<String>,
}

/// The gates of every RolloutPolicy, by `<namespace>/<name>`.
pub type GateLimits = BTreeMap<String, Gates>;

/// Each rollout's history, by the policy's `<namespace>/<name>`, the
/// route and the rule index (as its status names it).
pub type Histories = BTreeMap<(String, String, usize), History>;

/// The histories of the rollouts `machine` judges (none for a follower's,
/// which judges nothing).
pub fn histories(machine: &Rollouts) -> Histories {
    machine
        .histories()
        .filter(|(_, h)| !h.is_empty())
        .map(|(r, h)| {
            let key = (r.policy.to_string(), r.rule.route.clone(), r.rule.rule);
            (key, h.clone())
        })
        .collect()
}

impl<'a> Overview<'a> {
    pub fn build(
        published: &'a Published,
        rollouts: &'a RolloutReport,
        gates: &'a GateLimits,
        histories: &'a Histories,
        metrics: &Metrics,
        limits: Limits,
    ) -> Self {
        let mut live: HashMap<BackendStatsKey, BackendView> = metrics
            .backend_view()
            .into_iter()
            .map(|v| (v.key.clone(), v))
            .collect();
        let key = |rule: &RuleSummary, backend: &BackendSummary| rule.stats_key(backend);
        // Governed rules first, then the busiest, then table order.
        let traffic = |rule: &RuleSummary| -> u64 {
            rule.backends
                .iter()
                .filter_map(|b| live.get(&key(rule, b)))
                .map(|v| v.window_requests)
                .sum()
        };
        let mut order: Vec<(bool, u64, usize)> = published
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| (r.rollout.is_none(), u64::MAX - traffic(r), i))
            .collect();
        order.sort_unstable();
        order.truncate(limits.rules);
        order.sort_unstable_by_key(|(_, _, i)| *i);
        let rules = order
            .into_iter()
            .map(|(_, _, i)| {
                let rule = &published.rules[i];
                RuleView {
                    kind: &rule.kind,
                    route: &rule.route,
                    rule: rule.rule,
                    rollout: rule.rollout.as_ref(),
                    backends: rule
                        .backends
                        .iter()
                        .map(|b| BackendLive {
                            summary: b,
                            live: live.remove(&key(rule, b)),
                        })
                        .collect(),
                }
            })
            .collect();
        let gateways = published
            .status
            .objects
            .iter()
            .filter(|o| o.kind == "Gateway" || o.kind == "ListenerSet")
            .take(100)
            .collect();
        let rollouts = rollouts
            .policies
            .iter()
            .flat_map(|(policy, list)| {
                let name = policy.to_string();
                let gates = gates.get(&name);
                list.iter().map(move |status| RolloutView {
                    history: histories.get(&(name.clone(), status.route.clone(), status.rule)),
                    policy: name.clone(),
                    status,
                    gates,
                })
            })
            .take(limits.rules)
            .collect();
        let errors = &published.errors[..published.errors.len().min(limits.errors)];
        Overview {
            generation: published.generation,
            window_seconds: OBSERVED_WINDOW.as_secs_f64(),
            gateways,
            rules_total: published.rules.len(),
            rules,
            rollouts,
            errors_total: published.errors.len(),
            errors,
        }
    }
}
