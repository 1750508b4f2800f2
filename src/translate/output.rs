//! What translate hands back: the route table to serve, the status of
//! every object (in the shape Kubernetes holds it), and what `sluice check`
//! prints (rule summaries, warnings).
//!
//! serve, status, admin and the CLI read these types; nothing in them
//! depends on how translate computed them.

use std::net::SocketAddr;
use std::sync::Arc;

use serde::Serialize;

use crate::resources::GATEWAY_GROUP;
use crate::rollout::BackendKey;
use crate::route::RouteTable;

/// Everything translate produces.
#[derive(Debug)]
pub struct Translation {
    pub table: RouteTable,
    pub status: StatusReport,
    /// Every route rule that is attached somewhere, with its backends'
    /// shares (what `sluice check` prints), in (kind, namespace, name,
    /// rule) order.
    pub rules: Vec<Arc<RuleSummary>>,
    /// Traps worth a warning that are not errors (an omitted weight next to
    /// explicit ones, a backend whose share will get 500 or 503, ...).
    pub warnings: Vec<String>,
}

/// The status of every object, in the shape Kubernetes would hold it.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(transparent)]
pub struct StatusReport {
    pub objects: Vec<ObjectStatus>,
    /// Which socket each Gateway listener is served on, so that runtime bind
    /// failures can be reported against the right listener.
    #[serde(skip)]
    pub listener_binds: Vec<ListenerBind>,
}

/// `{apiVersion, kind, metadata, status}` of one object.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStatus {
    pub api_version: String,
    pub kind: String,
    pub metadata: StatusMetadata,
    pub status: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StatusMetadata {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub generation: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListenerBind {
    pub gateway_namespace: String,
    pub gateway_name: String,
    /// `(namespace, name)` of the ListenerSet that defines the listener;
    /// `None` for one of the Gateway's own listeners.
    pub listener_set: Option<(String, String)>,
    pub listener: String,
    pub bind: SocketAddr,
}

/// One rule's backends and their shares, for `sluice check`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuleSummary {
    /// The route's kind (`HTTPRoute`, `GRPCRoute`, `TLSRoute`).
    pub kind: String,
    /// `<namespace>/<name>` of the route.
    pub route: String,
    pub rule: usize,
    pub backends: Vec<BackendSummary>,
    /// The RolloutPolicy governing the rule, when one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RuleRollout>,
}

impl RuleSummary {
    /// The key of one of the rule's backends' outcome counters.
    pub fn stats_key(&self, backend: &BackendSummary) -> crate::metrics::BackendStatsKey {
        use crate::route::RouteKind;
        let (namespace, route) = self.route.split_once('/').unwrap_or(("", &self.route));
        let kind = [RouteKind::Http, RouteKind::Grpc, RouteKind::Tls]
            .into_iter()
            .find(|k| k.as_str() == self.kind)
            .unwrap_or(RouteKind::Http);
        crate::metrics::BackendStatsKey {
            kind: kind.metrics_prefix(),
            namespace: namespace.to_string(),
            route: route.to_string(),
            rule: self.rule,
            backend: backend.name.clone(),
        }
    }

    /// The rule's backends as the share gauges show them (fractions of 1;
    /// a backend served with a share only a rollout gives has spec 0).
    pub fn share_rows(&self) -> impl Iterator<Item = crate::metrics::ShareRow> + '_ {
        self.backends.iter().map(move |b| crate::metrics::ShareRow {
            key: self.stats_key(b),
            spec: if b.removed_from_spec {
                0.0
            } else {
                b.share_percent / 100.0
            },
            served: b.served_percent.unwrap_or(b.share_percent) / 100.0,
        })
    }
}

/// Which rollout governs a rule, and where it is.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuleRollout {
    /// `<namespace>/<name>` of the RolloutPolicy.
    pub policy: String,
    pub phase: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackendSummary {
    /// `<namespace>/<name>:<port>` (kind prefixed when not a Service).
    pub name: String,
    pub weight: u32,
    /// Percentage of the rule's traffic, `100 * weight / sum`.
    pub share_percent: f64,
    pub outcome: BackendOutcome,
    /// What the backendRef points at (its identity across reorderings).
    #[serde(skip)]
    pub key: BackendKey,
    /// The weight served when a rollout governs the rule (the spec's
    /// `weight` otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_weight: Option<u64>,
    /// Percentage of the rule's traffic served, when a rollout governs it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_percent: Option<f64>,
    /// The spec no longer lists the backend; a rollout still serves it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub removed_from_spec: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(
    tag = "outcome",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum BackendOutcome {
    /// Resolved, with this many ready endpoints.
    Serves { ready_endpoints: usize },
    /// Resolved but no ready endpoint: its share gets 503 (gRPC calls get
    /// UNAVAILABLE, TLS connections are closed).
    NoReadyEndpoints,
    /// Does not resolve: its share gets 500 (gRPC calls get UNAVAILABLE,
    /// TLS connections are closed). `reason` is the spec's
    /// (`BackendNotFound`, `InvalidKind`, `RefNotPermitted`).
    Unresolved { reason: String, message: String },
}

/// The `apiVersion` of every Gateway API status translate writes: those
/// objects are all of group `gateway.networking.k8s.io`, version `v1`
/// (RolloutPolicy is sluice's own: `sluice.dev/v1alpha1`).
pub(crate) fn api_version() -> String {
    format!("{GATEWAY_GROUP}/v1")
}
