//! translate: the pure function from a [`Snapshot`] to what sluice serves
//! ([`RouteTable`]) and what it reports ([`StatusReport`]).
//!
//! All Gateway API semantics of *configuration* live here: which Gateways
//! are ours, which routes attach to which listeners, hostname intersection,
//! ReferenceGrant checks, backend resolution, status conditions and reasons.
//! No I/O: manifests in, table and status out.

use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

use crate::resources::Snapshot;
use crate::route::RouteTable;

/// Settings that are not part of the manifests.
#[derive(Debug, Clone)]
pub struct TranslateOptions {
    /// Address listeners bind on when their Gateway has no `spec.addresses`.
    pub default_bind: IpAddr,
}

/// Everything translate produces.
#[derive(Debug)]
pub struct Translation {
    pub table: RouteTable,
    pub status: StatusReport,
    /// Every HTTPRoute rule that is attached somewhere, with its backends'
    /// shares (what `sluice check` prints), in (namespace, name, rule) order.
    pub rules: Vec<RuleSummary>,
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
    pub listener: String,
    pub bind: SocketAddr,
}

/// One rule's backends and their shares, for `sluice check`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RuleSummary {
    /// `<namespace>/<name>` of the HTTPRoute.
    pub route: String,
    pub rule: usize,
    pub backends: Vec<BackendSummary>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BackendSummary {
    /// `<namespace>/<name>:<port>` (kind prefixed when not a Service).
    pub name: String,
    pub weight: u32,
    /// The weight was omitted in the manifest (so it is 1).
    pub weight_omitted: bool,
    /// Percentage of the rule's traffic, `100 * weight / sum`.
    pub share_percent: f64,
    pub outcome: BackendOutcome,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum BackendOutcome {
    /// Resolved, with this many ready endpoints.
    Serves { ready_endpoints: usize },
    /// Resolved but no ready endpoint: its share gets 503.
    NoReadyEndpoints,
    /// Does not resolve: its share gets 500. `reason` is the spec's
    /// (`BackendNotFound`, `InvalidKind`, `RefNotPermitted`).
    Unresolved { reason: String, message: String },
}

/// Build the route table and status for a snapshot.
pub fn translate(snapshot: &Snapshot, options: &TranslateOptions) -> Translation {
    let _ = (snapshot, options);
    Translation {
        table: RouteTable::default(),
        status: StatusReport::default(),
        rules: Vec::new(),
        warnings: Vec::new(),
    }
}
