//! Bind failures: sockets the proxy could not listen on, reported on the
//! listeners served there once translation is done.
//!
//! Translation cannot know whether a port is free; serve binds the sockets
//! of [`StatusReport::listener_binds`] and hands back what failed, and the
//! status it writes then says so on the listeners concerned (per the spec,
//! `PortUnavailable` "the port is already in use").

use std::collections::BTreeMap;
use std::net::SocketAddr;

use gateway_api::experimental::gateways::GatewayStatus;
use gateway_api::experimental::listenersets::ListenerSetStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use super::StatusReport;
use super::conditions::{ConditionMaker, ConditionType, Reason, find, set_condition};

impl StatusReport {
    /// Report sockets the proxy could not listen on: their listeners get
    /// `Accepted=False` (reason `PortUnavailable`, "the port is already in
    /// use") and `Programmed=False` (reason `Pending`), with the OS error
    /// as message; a Gateway none of whose listeners is programmed any more
    /// gets `Programmed=False` with reason `AddressNotUsable`, a ListenerSet
    /// likewise with reason `PortUnavailable`.
    pub fn apply_bind_failures(&mut self, failures: &[(SocketAddr, String)]) {
        // (kind, ns, name) of the object defining the listener -> listener
        // -> errors
        let mut failed: BTreeMap<(&str, &str, &str), BTreeMap<&str, Vec<String>>> = BTreeMap::new();
        for b in &self.listener_binds {
            for (addr, error) in failures {
                if *addr == b.bind {
                    let owner = match &b.listener_set {
                        None => (
                            "Gateway",
                            b.gateway_namespace.as_str(),
                            b.gateway_name.as_str(),
                        ),
                        Some((ns, name)) => ("ListenerSet", ns.as_str(), name.as_str()),
                    };
                    failed
                        .entry(owner)
                        .or_default()
                        .entry(&b.listener)
                        .or_default()
                        .push(format!("cannot listen on {addr}: {error}"));
                }
            }
        }
        for ((kind, ns, name), listeners) in failed {
            let Some(object) = self.objects.iter_mut().find(|o| {
                o.kind == kind
                    && o.metadata.namespace.as_deref() == Some(ns)
                    && o.metadata.name == name
            }) else {
                continue;
            };
            let cond = ConditionMaker {
                generation: object.metadata.generation,
                now: Timestamp::now(),
            };
            let mark = |listener: &str, conditions: &mut Vec<Condition>| {
                if let Some(errors) = listeners.get(listener) {
                    let message = errors.join("; ");
                    set_condition(
                        conditions,
                        cond.make(
                            ConditionType::Accepted,
                            false,
                            Reason::PortUnavailable,
                            message.clone(),
                        ),
                    );
                    set_condition(
                        conditions,
                        cond.make(ConditionType::Programmed, false, Reason::Pending, message),
                    );
                }
            };
            let message = listeners
                .iter()
                .map(|(l, e)| format!("listener {l}: {}", e.join("; ")))
                .collect::<Vec<_>>()
                .join("; ");
            let updated = if kind == "Gateway" {
                let Ok(mut status) = serde_json::from_value::<GatewayStatus>(object.status.clone())
                else {
                    continue;
                };
                mark_listeners(
                    status
                        .listeners
                        .iter_mut()
                        .flatten()
                        .map(|l| (l.name.as_str(), &mut l.conditions)),
                    mark,
                    &mut status.conditions,
                    cond.make(
                        ConditionType::Programmed,
                        false,
                        Reason::AddressNotUsable,
                        message,
                    ),
                );
                serde_json::to_value(status)
            } else {
                let Ok(mut status) =
                    serde_json::from_value::<ListenerSetStatus>(object.status.clone())
                else {
                    continue;
                };
                mark_listeners(
                    status
                        .listeners
                        .iter_mut()
                        .flatten()
                        .map(|l| (l.name.as_str(), &mut l.conditions)),
                    mark,
                    &mut status.conditions,
                    cond.make(
                        ConditionType::Programmed,
                        false,
                        Reason::PortUnavailable,
                        message,
                    ),
                );
                serde_json::to_value(status)
            };
            if let Ok(v) = updated {
                object.status = v;
            }
        }
    }
}

/// Apply `mark` to each (name, conditions) of one Gateway's or
/// ListenerSet's listener statuses; when none of them is programmed
/// afterwards, `not_programmed` is set among the object's `conditions`.
fn mark_listeners<'a>(
    listeners: impl Iterator<Item = (&'a str, &'a mut Vec<Condition>)>,
    mark: impl Fn(&str, &mut Vec<Condition>),
    conditions: &mut Option<Vec<Condition>>,
    not_programmed: Condition,
) {
    let mut any_programmed = false;
    for (name, listener_conditions) in listeners {
        mark(name, listener_conditions);
        any_programmed |= find(listener_conditions, ConditionType::Programmed, true).is_some();
    }
    if !any_programmed {
        set_condition(conditions.get_or_insert_with(Vec::new), not_programmed);
    }
}

#[cfg(test)]
mod tests {
    use crate::translate::testing::{
        TWO_LISTENERS, bind, condition, listener, status, translate_yaml,
    };

    #[test]
    fn bind_failures_mark_listeners_and_the_gateway() {
        let mut t = translate_yaml(TWO_LISTENERS);
        t.status
            .apply_bind_failures(&[(bind(9090), "Address already in use (os error 98)".into())]);
        let gw = status(&t, "Gateway", "gw");
        let other = &listener(gw, "other")["conditions"];
        assert_eq!(
            condition(other, "Programmed"),
            ("False".into(), "Pending".into())
        );
        assert_eq!(
            condition(other, "Accepted"),
            ("False".into(), "PortUnavailable".into())
        );
        assert_eq!(
            condition(&listener(gw, "foo")["conditions"], "Programmed"),
            ("True".into(), "Programmed".into())
        );
        // Other listeners still serve: the Gateway stays programmed.
        assert_eq!(
            condition(&gw["conditions"], "Programmed"),
            ("True".into(), "Programmed".into())
        );

        t.status
            .apply_bind_failures(&[(bind(8080), "denied".into())]);
        assert_eq!(
            condition(&status(&t, "Gateway", "gw")["conditions"], "Programmed"),
            ("False".into(), "AddressNotUsable".into())
        );
    }
}
