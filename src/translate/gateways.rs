//! GatewayClasses, Gateways and their listeners: which are ours, where each
//! listener binds, which listeners conflict, and their status.
//!
//! Per the spec: each listener in a set of listeners MUST be distinct
//! (unique port, protocol and, for HTTP, hostname); indistinct listeners are
//! `Conflicted`, and "ALL indistinct Listeners must not be accepted for
//! processing" while the distinct ones still serve. sluice treats every
//! listener of every one of its Gateways that binds the same socket as one
//! set, so two Gateways may share a port when their hostnames differ.
//!
//! HTTPS listeners terminate TLS with the certificate their
//! `tls.certificateRefs` name (see [`tls`]). A listener whose certificate
//! does not resolve is not served and takes no part in conflicts, so it
//! never stops the other listeners.

mod tls;

pub(crate) use tls::{ListenerTls, for_listener as listener_tls};

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use gateway_api::experimental::gatewayclasses::GatewayClassStatus;
use gateway_api::experimental::gateways::{
    GatewayListeners, GatewayListenersAllowedRoutesNamespacesFrom,
    GatewayListenersAllowedRoutesNamespacesSelector, GatewayStatus, GatewayStatusAddresses,
    GatewayStatusListeners, GatewayStatusListenersSupportedKinds,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use rustls::sign::CertifiedKey;

use super::TranslateOptions;
use super::conditions::{ConditionMaker, ConditionType, Reason, find, is_true};
use super::listenersets::ListenerSetView;
use super::meta::sort_key;
use super::output::{ObjectStatus, StatusMetadata, api_version};
use super::references::Referrer;
use crate::resources::{CONTROLLER_NAME, GATEWAY_GROUP, Gateway, GatewayClass, Snapshot};
use crate::route::{HostPattern, RouteKind, TlsMode};

/// Which namespaces a listener accepts routes from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AllowedNamespaces {
    Same,
    All,
    Selector(Option<GatewayListenersAllowedRoutesNamespacesSelector>),
}

/// One listener of one of our Gateways, as translate sees it.
#[derive(Debug)]
pub(crate) struct ListenerView {
    pub name: String,
    pub port: i32,
    pub protocol: String,
    pub hostname: HostPattern,
    /// Sockets the listener is served on (one per Gateway address).
    pub binds: Vec<SocketAddr>,
    /// The route kinds this listener accepts: those its protocol serves
    /// (HTTPRoute and GRPCRoute on HTTP and HTTPS, TLSRoute on TLS), or
    /// the ones of them `allowedRoutes.kinds` names.
    pub kinds: Vec<RouteKind>,
    /// `allowedRoutes.kinds` entries sluice does not support here.
    pub invalid_kinds: Vec<String>,
    /// A TLS listener's `tls.mode`; `None` for other protocols.
    pub tls_mode: Option<TlsMode>,
    pub namespaces: AllowedNamespaces,
    /// Why the listener is not accepted for what it asks (its protocol, or
    /// TLS settings sluice does not support).
    pub unsupported: Option<String>,
    /// HTTPS, and TLS in `Terminate` mode: the certificate TLS is
    /// terminated with, when one resolved.
    pub certificate: Option<Arc<CertifiedKey>>,
    /// HTTPS and TLS `Terminate`: `(reason, message)` of
    /// `ResolvedRefs=False` for its certificateRefs.
    pub tls_unresolved: Option<(Reason, String)>,
    /// HTTPS: client certificate validation (Gateway `spec.tls.frontend`).
    pub frontend: tls::frontend::ListenerFrontend,
    /// (reason, message) of the `Conflicted=True` condition.
    pub conflict: Option<(Reason, String)>,
    /// Accepted routes attached to this listener.
    pub attached_routes: i32,
    /// Where the listener is defined: `None` in the Gateway's own
    /// `spec.listeners`, `Some(i)` in its `listener_sets[i]`.
    pub owner: Option<usize>,
}

impl ListenerView {
    /// Accepted: a supported protocol and no conflict.
    pub fn valid(&self) -> bool {
        self.unsupported.is_none() && self.conflict.is_none() && self.frontend.accepted()
    }

    /// A listener that terminates TLS (HTTPS, or TLS in `Terminate`
    /// mode) none of whose certificates resolved: it cannot be served.
    pub fn lacks_certificate(&self) -> bool {
        (self.protocol == "HTTPS" || self.tls_mode == Some(TlsMode::Terminate))
            && self.certificate.is_none()
    }

    /// Does this listener accept routes of `kind`?
    pub fn accepts(&self, kind: RouteKind) -> bool {
        self.kinds.contains(&kind)
    }
}

/// One of our Gateways.
#[derive(Debug)]
pub(crate) struct GatewayView {
    pub namespace: String,
    pub name: String,
    pub cond: ConditionMaker,
    /// (reason, message) when the Gateway as a whole is not accepted.
    pub rejected: Option<(Reason, String)>,
    pub addresses: Vec<IpAddr>,
    /// The Gateway's own listeners, then those of its admitted
    /// ListenerSets in precedence order.
    pub listeners: Vec<ListenerView>,
    /// Every ListenerSet whose parentRef names this Gateway, admitted or
    /// not, in precedence order (creation time, then namespace/name).
    pub listener_sets: Vec<ListenerSetView>,
}

impl GatewayView {
    /// Is this listener served (its Gateway accepted, its protocol
    /// supported, not conflicted)?
    pub fn serves(&self, listener: usize) -> bool {
        let l = &self.listeners[listener];
        self.rejected.is_none() && l.valid() && !l.lacks_certificate()
    }

    /// The certificate an HTTPS listener terminates TLS with (`None` for
    /// HTTP).
    pub fn certificate(&self, listener: usize) -> Option<Arc<CertifiedKey>> {
        self.listeners[listener].certificate.clone()
    }

    /// `gateway/<ns>/<name>/listener/<listener>` (or
    /// `listenerset/<ns>/<name>/listener/<listener>`), the route table's id.
    pub fn listener_id(&self, listener: usize) -> String {
        let l = &self.listeners[listener];
        match l.owner {
            None => format!(
                "gateway/{}/{}/listener/{}",
                self.namespace, self.name, l.name
            ),
            Some(s) => format!(
                "listenerset/{}/{}/listener/{}",
                self.listener_sets[s].namespace, self.listener_sets[s].name, l.name
            ),
        }
    }

    /// The namespace the listener is defined in (its Gateway's or its
    /// ListenerSet's): `allowedRoutes` `Same` means this one.
    pub fn listener_namespace(&self, listener: usize) -> &str {
        match self.listeners[listener].owner {
            None => &self.namespace,
            Some(s) => &self.listener_sets[s].namespace,
        }
    }

    /// Indices of the listeners one owner defines (`None`: the Gateway).
    pub fn listeners_of(&self, owner: Option<usize>) -> impl Iterator<Item = usize> + '_ {
        (0..self.listeners.len()).filter(move |&l| self.listeners[l].owner == owner)
    }
}

/// Status of our GatewayClasses, and the names of the accepted ones.
pub(crate) fn gateway_classes(
    snapshot: &Snapshot,
    now: Timestamp,
) -> (Vec<ObjectStatus>, BTreeSet<String>) {
    let mut ours: Vec<&GatewayClass> = snapshot
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == CONTROLLER_NAME)
        .collect();
    ours.sort_by_key(|c| sort_key(&c.metadata));
    let mut statuses = Vec::new();
    let mut names = BTreeSet::new();
    for class in ours {
        let name = class.metadata.name.clone().unwrap_or_default();
        let generation = class.metadata.generation.unwrap_or(0);
        let cond = ConditionMaker { generation, now };
        let status = GatewayClassStatus {
            conditions: Some(vec![cond.make(
                ConditionType::Accepted,
                true,
                Reason::Accepted,
                format!("handled by {CONTROLLER_NAME}"),
            )]),
            supported_features: None,
        };
        statuses.push(ObjectStatus {
            api_version: api_version(),
            kind: "GatewayClass".into(),
            metadata: StatusMetadata {
                name: name.clone(),
                namespace: None,
                generation,
            },
            status: serde_json::to_value(status).unwrap_or_default(),
        });
        names.insert(name);
    }
    (statuses, names)
}

/// Our Gateways (those whose class is one of `classes`), with listeners,
/// binds and conflicts worked out. Gateways of other classes are not
/// returned: they get no status and no routes.
///
/// Admitted ListenerSets add their listeners to their Gateway's (see
/// [`super::listenersets`]) before conflicts are judged, since the spec
/// treats a Gateway and its ListenerSets as one merged list of listeners.
pub(crate) fn gateways(
    snapshot: &Snapshot,
    classes: &BTreeSet<String>,
    options: &TranslateOptions,
    labels: &dyn Fn(&str) -> BTreeMap<String, String>,
    now: Timestamp,
    warnings: &mut Vec<String>,
) -> Vec<GatewayView> {
    let mut ours: Vec<&Gateway> = Vec::new();
    for gw in &snapshot.gateways {
        let class = &gw.spec.gateway_class_name;
        if classes.contains(class) {
            ours.push(gw);
        } else if !snapshot
            .gateway_classes
            .iter()
            .any(|c| c.metadata.name.as_ref() == Some(class))
        {
            warnings.push(format!(
                "Gateway {}/{}: GatewayClass {class} not found; the Gateway is ignored",
                gw.metadata.namespace.as_deref().unwrap_or("default"),
                gw.metadata.name.as_deref().unwrap_or("")
            ));
        }
    }
    ours.sort_by_key(|g| sort_key(&g.metadata));
    let mut views: Vec<GatewayView> = ours
        .into_iter()
        .map(|gw| gateway_view(snapshot, gw, options, now))
        .collect();
    super::listenersets::admit(snapshot, &mut views, labels, now, warnings);
    find_conflicts(&mut views);
    views
}

fn gateway_view(
    snapshot: &Snapshot,
    gw: &Gateway,
    options: &TranslateOptions,
    now: Timestamp,
) -> GatewayView {
    let namespace = gw
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = gw.metadata.name.clone().unwrap_or_default();
    let cond = ConditionMaker {
        generation: gw.metadata.generation.unwrap_or(0),
        now,
    };
    let mut rejected = None;
    let mut addresses: Vec<IpAddr> = Vec::new();
    for (i, a) in gw.spec.addresses.iter().flatten().enumerate() {
        let ty = a.r#type.as_deref().unwrap_or("IPAddress");
        if ty != "IPAddress" {
            rejected = Some((
                Reason::UnsupportedAddress,
                format!(
                    "spec.addresses[{i}]: address type {ty} is not supported; sluice binds IPAddress addresses only"
                ),
            ));
            continue;
        }
        match a.value.as_deref() {
            // No value: the implementation picks one.
            None | Some("") => addresses.push(options.default_bind),
            Some(v) => match v.parse::<IpAddr>() {
                Ok(ip) => addresses.push(ip),
                Err(_) => {
                    rejected = Some((
                        Reason::UnsupportedAddress,
                        format!("spec.addresses[{i}]: {v:?} is not an IP address"),
                    ));
                }
            },
        }
    }
    // sluice takes no parameters: whatever a parametersRef names is not a
    // kind it supports (the spec's `InvalidParameters`).
    if rejected.is_none()
        && let Some(p) = gw
            .spec
            .infrastructure
            .as_ref()
            .and_then(|i| i.parameters_ref.as_ref())
    {
        rejected = Some((
            Reason::InvalidParameters,
            format!(
                "spec.infrastructure.parametersRef: {}/{} {} is not supported; sluice takes no parameters",
                p.group, p.kind, p.name
            ),
        ));
    }
    if gw.spec.addresses.as_ref().is_none_or(Vec::is_empty) {
        addresses.push(options.default_bind);
    }
    let mut seen = BTreeSet::new();
    addresses.retain(|a| seen.insert(*a));
    if rejected.is_some() {
        addresses.clear();
    }

    let listeners = gw
        .spec
        .listeners
        .iter()
        .map(|l| {
            let from = Referrer {
                kind: "Gateway",
                namespace: &namespace,
            };
            let tls = tls::for_listener(snapshot, from, l, Some((gw, &namespace)));
            listener_view(l, &addresses, tls, None)
        })
        .collect();
    GatewayView {
        namespace,
        name,
        cond,
        rejected,
        addresses,
        listeners,
        listener_sets: Vec::new(),
    }
}

/// One listener (of a Gateway, or of a ListenerSet as the same fields),
/// with its TLS settings already resolved against the namespace it is
/// defined in.
pub(crate) fn listener_view(
    l: &GatewayListeners,
    addresses: &[IpAddr],
    tls: ListenerTls,
    owner: Option<usize>,
) -> ListenerView {
    let serves = protocol_kinds(&l.protocol);
    let mut kinds = Vec::new();
    let mut invalid_kinds = Vec::new();
    match l.allowed_routes.as_ref().and_then(|a| a.kinds.as_ref()) {
        Some(allowed) if !allowed.is_empty() => {
            for k in allowed {
                let group = k.group.as_deref().unwrap_or(GATEWAY_GROUP);
                match serves
                    .iter()
                    .find(|s| group == GATEWAY_GROUP && k.kind == s.as_str())
                {
                    Some(kind) if !kinds.contains(kind) => kinds.push(*kind),
                    Some(_) => {}
                    None => invalid_kinds.push(if group.is_empty() {
                        k.kind.clone()
                    } else {
                        format!("{}.{group}", k.kind)
                    }),
                }
            }
        }
        _ => kinds = serves.to_vec(),
    }
    let namespaces = match l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
    {
        None => AllowedNamespaces::Same,
        Some(n) => match n.from {
            None | Some(GatewayListenersAllowedRoutesNamespacesFrom::Same) => {
                AllowedNamespaces::Same
            }
            Some(GatewayListenersAllowedRoutesNamespacesFrom::All) => AllowedNamespaces::All,
            Some(GatewayListenersAllowedRoutesNamespacesFrom::Selector) => {
                AllowedNamespaces::Selector(n.selector.clone())
            }
        },
    };
    let unsupported = match l.protocol.as_str() {
        "HTTP" => None,
        "HTTPS" | "TLS" => tls.unsupported,
        other => Some(format!(
            "protocol {other} is not supported yet; sluice serves HTTP, HTTPS and TLS listeners"
        )),
    };
    let tls_mode = (l.protocol == "TLS").then(|| tls::tls_mode(l));
    let binds = match u16::try_from(l.port) {
        Ok(port) if unsupported.is_none() => addresses
            .iter()
            .map(|ip| SocketAddr::new(*ip, port))
            .collect(),
        _ => Vec::new(),
    };
    ListenerView {
        name: l.name.clone(),
        port: l.port,
        protocol: l.protocol.clone(),
        hostname: HostPattern::parse(l.hostname.as_deref()),
        binds,
        kinds,
        invalid_kinds,
        tls_mode,
        namespaces,
        unsupported,
        certificate: tls.certificate,
        tls_unresolved: tls.unresolved,
        frontend: tls.frontend,
        conflict: None,
        attached_routes: 0,
        owner,
    }
}

/// The route kinds a listener of `protocol` serves.
pub(crate) fn protocol_kinds(protocol: &str) -> &'static [RouteKind] {
    match protocol {
        "HTTP" | "HTTPS" => &[RouteKind::Http, RouteKind::Grpc],
        "TLS" => &[RouteKind::Tls],
        _ => &[],
    }
}

/// Mark listeners that cannot all be served: on one socket, different
/// protocols (ProtocolConflict) or equal hostnames (HostnameConflict); on
/// one port, a wildcard address next to a specific one (they cannot both
/// be bound: PortUnavailable).
fn find_conflicts(views: &mut [GatewayView]) {
    // Every (gateway, listener) that has a port, by socket. Listeners with
    // an unsupported protocol still count for protocol conflicts (the spec
    // judges distinctness by the manifest), so they are placed on the
    // sockets their Gateway's addresses give.
    let mut by_socket: BTreeMap<SocketAddr, Vec<(usize, usize)>> = BTreeMap::new();
    for (g, view) in views.iter().enumerate() {
        for (l, listener) in view.listeners.iter().enumerate() {
            let Ok(port) = u16::try_from(listener.port) else {
                continue;
            };
            if listener.lacks_certificate() && listener.unsupported.is_none() {
                // An HTTPS listener without a usable certificate is never
                // served: it takes neither port nor hostname from the others.
                continue;
            }
            for ip in &view.addresses {
                by_socket
                    .entry(SocketAddr::new(*ip, port))
                    .or_default()
                    .push((g, l));
            }
        }
    }
    let id = |views: &[GatewayView], (g, l): (usize, usize)| {
        let v = &views[g];
        match v.listeners[l].owner {
            None => format!("{}/{}/{}", v.namespace, v.name, v.listeners[l].name),
            Some(s) => format!(
                "ListenerSet {}/{} listener {}",
                v.listener_sets[s].namespace, v.listener_sets[s].name, v.listeners[l].name
            ),
        }
    };
    let mut conflicts: BTreeMap<(usize, usize), (Reason, String)> = BTreeMap::new();
    for (socket, members) in &by_socket {
        // The Gateways' own listeners: every indistinct one is conflicted.
        let own: Vec<(usize, usize)> = members
            .iter()
            .copied()
            .filter(|&(g, l)| views[g].listeners[l].owner.is_none())
            .collect();
        let protocols: BTreeSet<&str> = own
            .iter()
            .map(|&(g, l)| views[g].listeners[l].protocol.as_str())
            .collect();
        if protocols.len() > 1 {
            let list: Vec<&str> = protocols.into_iter().collect();
            for &m in &own {
                conflicts.entry(m).or_insert((
                    Reason::ProtocolConflict,
                    format!(
                        "listeners on {socket} use different protocols ({})",
                        list.join(", ")
                    ),
                ));
            }
        } else {
            for &m in &own {
                let host = &views[m.0].listeners[m.1].hostname;
                let others: Vec<String> = own
                    .iter()
                    .filter(|&&o| o != m && &views[o.0].listeners[o.1].hostname == host)
                    .map(|&o| id(views, o))
                    .collect();
                if !others.is_empty() {
                    conflicts.entry(m).or_insert((
                        Reason::HostnameConflict,
                        format!(
                            "listener(s) {} on {socket} have the same hostname {host}",
                            others.join(", ")
                        ),
                    ));
                }
            }
        }
        // ListenerSet listeners, per the spec's precedence (the parent
        // Gateway first, then ListenerSets oldest first, then by
        // namespace/name): each is conflicted by an accepted listener that
        // comes before it, and the earlier one keeps serving.
        let mut before: Vec<(usize, usize)> = own
            .iter()
            .copied()
            .filter(|m| {
                !conflicts.contains_key(m) && views[m.0].listeners[m.1].unsupported.is_none()
            })
            .collect();
        for &m in members
            .iter()
            .filter(|&&(g, l)| views[g].listeners[l].owner.is_some())
        {
            let lv = |o: (usize, usize)| &views[o.0].listeners[o.1];
            let this = lv(m);
            let conflict =
                if let Some(&o) = before.iter().find(|&&o| lv(o).protocol != this.protocol) {
                    Some((
                        Reason::ProtocolConflict,
                        format!(
                            "listener {} on {socket} comes first and uses protocol {}",
                            id(views, o),
                            lv(o).protocol
                        ),
                    ))
                } else {
                    before
                        .iter()
                        .find(|&&o| lv(o).hostname == this.hostname)
                        .map(|&o| {
                            (
                                Reason::HostnameConflict,
                                format!(
                                    "listener {} on {socket} comes first with the same hostname {}",
                                    id(views, o),
                                    this.hostname
                                ),
                            )
                        })
                };
            match conflict {
                Some(c) => {
                    conflicts.insert(m, c);
                }
                None if this.unsupported.is_none() => before.push(m),
                None => {}
            }
        }
    }
    // A wildcard address and another address on one port cannot both be
    // bound.
    let sockets: Vec<&SocketAddr> = by_socket.keys().collect();
    for (i, a) in sockets.iter().enumerate() {
        for b in &sockets[i + 1..] {
            let overlap =
                a.port() == b.port() && (a.ip().is_unspecified() || b.ip().is_unspecified());
            if !overlap {
                continue;
            }
            let served = |m: &(usize, usize)| views[m.0].listeners[m.1].unsupported.is_none();
            for (this, other) in [(a, b), (b, a)] {
                for m in by_socket[this].iter().filter(|m| served(m)) {
                    conflicts.entry(*m).or_insert((
                        Reason::PortUnavailable,
                        format!("{this} and {other} cannot both be bound"),
                    ));
                }
            }
        }
    }
    for ((g, l), c) in conflicts {
        views[g].listeners[l].conflict = Some(c);
    }
}

/// Does a route in `route_ns` fall under a listener's allowedRoutes
/// namespaces? `labels` gives each namespace's labels.
pub(crate) fn namespace_allowed(
    allowed: &AllowedNamespaces,
    gateway_ns: &str,
    route_ns: &str,
    labels: &dyn Fn(&str) -> BTreeMap<String, String>,
) -> bool {
    match allowed {
        AllowedNamespaces::Same => gateway_ns == route_ns,
        AllowedNamespaces::All => true,
        AllowedNamespaces::Selector(None) => false,
        AllowedNamespaces::Selector(Some(sel)) => {
            let labels = labels(route_ns);
            let match_labels = sel
                .match_labels
                .iter()
                .flatten()
                .all(|(k, v)| labels.get(k) == Some(v));
            let match_expressions = sel.match_expressions.iter().flatten().all(|e| {
                let values = e.values.as_deref().unwrap_or_default();
                let value = labels.get(&e.key);
                match e.operator.as_str() {
                    "In" => value.is_some_and(|v| values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            });
            match_labels && match_expressions
        }
    }
}

/// One listener's status entry (Gateway and ListenerSet listeners have
/// the same shape). `conflict_first` (ListenerSet listeners, which lose
/// conflicts to earlier listeners): a conflicted listener gives the
/// conflict's reason for `Accepted=False` and `Programmed=False`, even when
/// its protocol is also unsupported.
pub(crate) fn listener_status(
    view: &GatewayView,
    i: usize,
    cond: &ConditionMaker,
    conflict_first: bool,
) -> GatewayStatusListeners {
    let c = cond;
    let l = &view.listeners[i];
    let mut conds: Vec<Condition> = Vec::new();
    let accepted = match (&l.conflict, &l.unsupported) {
        (Some((reason, message)), Some(_)) if conflict_first => {
            c.make(ConditionType::Accepted, false, *reason, message.clone())
        }
        (_, Some(message)) => c.make(
            ConditionType::Accepted,
            false,
            Reason::UnsupportedProtocol,
            message.clone(),
        ),
        (Some((reason, message)), None) => {
            c.make(ConditionType::Accepted, false, *reason, message.clone())
        }
        (None, None) if !l.frontend.accepted() => c.make(
            ConditionType::Accepted,
            false,
            Reason::NoValidCACertificate,
            l.frontend.rejection(),
        ),
        (None, None) => c.make(
            ConditionType::Accepted,
            true,
            Reason::Accepted,
            "listener accepted",
        ),
    };
    conds.push(accepted);
    conds.push(if view.serves(i) {
        c.make(
            ConditionType::Programmed,
            true,
            Reason::Programmed,
            format!(
                "served on {}",
                l.binds
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    } else if let Some((_, message)) = &view.rejected {
        c.make(
            ConditionType::Programmed,
            false,
            Reason::Invalid,
            format!("the Gateway is not accepted: {message}"),
        )
    } else if let (true, Some((reason, message))) = (conflict_first, &l.conflict) {
        c.make(ConditionType::Programmed, false, *reason, message.clone())
    } else if l.valid() && l.lacks_certificate() {
        c.make(
            ConditionType::Programmed,
            false,
            Reason::Invalid,
            "no certificate of the listener resolved; TLS cannot be terminated",
        )
    } else {
        c.make(
            ConditionType::Programmed,
            false,
            Reason::Invalid,
            "the listener is not accepted",
        )
    });
    conds.push(if let Some((reason, message)) = &l.tls_unresolved {
        c.make(ConditionType::ResolvedRefs, false, *reason, message.clone())
    } else if l.invalid_kinds.is_empty() {
        c.make(
            ConditionType::ResolvedRefs,
            true,
            Reason::ResolvedRefs,
            "all references resolved",
        )
    } else {
        c.make(
            ConditionType::ResolvedRefs,
            false,
            Reason::InvalidRouteKinds,
            format!(
                "route kinds {} are not supported on {} listeners, which serve {}",
                l.invalid_kinds.join(", "),
                l.protocol,
                protocol_kinds(&l.protocol)
                    .iter()
                    .map(|k| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    });
    conds.push(match &l.conflict {
        Some((reason, message)) => {
            c.make(ConditionType::Conflicted, true, *reason, message.clone())
        }
        None => c.make(
            ConditionType::Conflicted,
            false,
            Reason::NoConflicts,
            "no conflicts",
        ),
    });
    GatewayStatusListeners {
        attached_routes: l.attached_routes,
        conditions: conds,
        name: l.name.clone(),
        supported_kinds: Some(
            l.kinds
                .iter()
                .map(|k| GatewayStatusListenersSupportedKinds {
                    group: Some(GATEWAY_GROUP.into()),
                    kind: k.as_str().into(),
                })
                .collect(),
        ),
    }
}

/// The Gateway's status, once routes are attached. Its `listeners` are its
/// own; those of its ListenerSets are reported on the ListenerSets.
pub(crate) fn gateway_status(view: &GatewayView) -> ObjectStatus {
    let c = &view.cond;
    let mut listeners = Vec::new();
    let mut invalid = Vec::new();
    for i in view.listeners_of(None) {
        let status = listener_status(view, i, c, false);
        if let Some(a) = find(&status.conditions, ConditionType::Accepted, false) {
            invalid.push(format!("{} ({})", status.name, a.reason));
        }
        listeners.push(status);
    }
    let any_valid = view.listeners_of(None).any(|i| view.listeners[i].valid());
    let accepted = match &view.rejected {
        Some((reason, message)) => c.make(ConditionType::Accepted, false, *reason, message.clone()),
        None if !any_valid => c.make(
            ConditionType::Accepted,
            false,
            Reason::ListenersNotValid,
            format!("no listener is valid: {}", invalid.join(", ")),
        ),
        None if !invalid.is_empty() => c.make(
            ConditionType::Accepted,
            true,
            Reason::ListenersNotValid,
            format!(
                "listeners not accepted: {}; the others are served",
                invalid.join(", ")
            ),
        ),
        None => c.make(
            ConditionType::Accepted,
            true,
            Reason::Accepted,
            "Gateway accepted",
        ),
    };
    let any_served = view.listeners_of(None).any(|i| view.serves(i));
    let programmed = if is_true(&accepted) && any_served {
        c.make(
            ConditionType::Programmed,
            true,
            Reason::Programmed,
            "Gateway programmed",
        )
    } else if is_true(&accepted) {
        c.make(
            ConditionType::Programmed,
            false,
            Reason::Invalid,
            "no listener can be served",
        )
    } else {
        c.make(
            ConditionType::Programmed,
            false,
            Reason::Invalid,
            "the Gateway is not accepted",
        )
    };
    let status = GatewayStatus {
        addresses: (!view.addresses.is_empty()).then(|| {
            view.addresses
                .iter()
                .map(|ip| GatewayStatusAddresses {
                    r#type: Some("IPAddress".into()),
                    value: ip.to_string(),
                })
                .collect()
        }),
        // Only for a Gateway that ListenerSets name, so that the others'
        // status stays as it was (absent counts as 0).
        attached_listener_sets: (!view.listener_sets.is_empty()).then(|| {
            view.listener_sets
                .iter()
                .filter(|s| s.accepted(view))
                .count()
                .try_into()
                .unwrap_or(i32::MAX)
        }),
        conditions: Some(
            [accepted, programmed]
                .into_iter()
                .chain(tls::frontend::insecure_condition(view))
                .collect(),
        ),
        listeners: Some(listeners),
    };
    ObjectStatus {
        api_version: api_version(),
        kind: "Gateway".into(),
        metadata: StatusMetadata {
            name: view.name.clone(),
            namespace: Some(view.namespace.clone()),
            generation: c.generation,
        },
        status: serde_json::to_value(status).unwrap_or_default(),
    }
}
