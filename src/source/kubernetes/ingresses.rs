//! Ingresses served as they are, in Kubernetes mode (`serve --kubernetes
//! --ingress-class NAME --ingress-gateway NS/NAME`).
//!
//! The cache watches Ingresses and IngressClasses too ([`INGRESS_KINDS`])
//! and keeps them as the API server sent them; at every snapshot this
//! module picks the Ingresses of the class and converts them with the code
//! files mode uses ([`crate::source::files::converted_ingresses`], the
//! conversion of `sluice convert ingress-nginx`), so both modes serve the
//! same routes for the same Ingresses. Pure: values in, objects out.
//!
//! Which Ingresses are served: those whose class
//! ([`crate::ingress_nginx::ingress_class`]: `spec.ingressClassName`, else
//! the `kubernetes.io/ingress.class` annotation) is NAME, and those without
//! a class when the IngressClass NAME is the cluster's default
//! (`ingressclass.kubernetes.io/is-default-class: "true"`), as ingress-nginx
//! serves class-less Ingresses only for the default class. The served
//! Ingresses ([`ServedIngress`]) are also what the leader writes
//! `status.loadBalancer` to.

use k8s_openapi::api::networking::v1::Ingress;
use serde_json::Value;

use super::cache::WatchedKind;
use crate::resources::crd::Crds;
use crate::resources::{Object, Service};
use crate::source::ConfigError;
use crate::source::files::{IngressServing, converted_ingresses};

/// The annotation that makes an IngressClass the cluster's default.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

/// The kinds watched on top of [`super::WATCHED_KINDS`] when Ingresses are
/// served. Both are core kinds of every cluster: not optional.
pub const INGRESS_KINDS: [WatchedKind; 2] = [
    WatchedKind {
        kind: "Ingress",
        group: "networking.k8s.io",
        version: "v1",
        plural: "ingresses",
        field_selector: None,
        optional: false,
    },
    WatchedKind {
        kind: "IngressClass",
        group: "networking.k8s.io",
        version: "v1",
        plural: "ingressclasses",
        field_selector: None,
        optional: false,
    },
];

/// Whether a watched kind is one of [`INGRESS_KINDS`]: kept as sent, not
/// loaded as gateway configuration.
pub fn is_ingress_kind(kind: &WatchedKind) -> bool {
    INGRESS_KINDS.iter().any(|k| k.kind == kind.kind)
}

/// One Ingress sluice serves, with the `status.loadBalancer` it has now.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedIngress {
    pub namespace: String,
    pub name: String,
    /// `metadata.resourceVersion`: a status write is sent again once the
    /// Ingress changed since the last one.
    pub resource_version: Option<String>,
    /// `status.loadBalancer` as the API server holds it (`Null` if none).
    pub load_balancer: Value,
}

/// What serving the Ingresses made of one snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServedIngresses {
    /// The Ingresses of the class, main and canary alike.
    pub ingresses: Vec<ServedIngress>,
    /// `Kind namespace/name` of the converted objects: they are not in the
    /// API server, so nobody writes their status.
    pub converted: Vec<String>,
    /// The conversion report, one line per annotation per object.
    pub report: Vec<String>,
    /// Whether each report line is inexact (same order as `report`).
    pub inexact: Vec<bool>,
}

/// The Ingresses of `serving`'s class among `ingresses` (the API objects,
/// with `apiVersion` and `kind`) converted, as objects of the snapshot and
/// configuration errors.
pub fn convert(
    serving: &IngressServing,
    ingresses: &[&Value],
    classes: &[&Value],
    services: &[Service],
    crds: &Crds,
) -> (Vec<Object>, Vec<ConfigError>, ServedIngresses) {
    let default_class = classes.iter().any(|c| {
        c["metadata"]["name"].as_str() == Some(serving.class.as_str())
            && c["metadata"]["annotations"][DEFAULT_CLASS_ANNOTATION].as_str() == Some("true")
    });
    let mut errors = Vec::new();
    let mut input = crate::ingress_nginx::Input {
        ingresses: Vec::new(),
        services: services.to_vec(),
        // sluice reads only the Secrets its configuration names: a
        // `proxy-ssl-secret` is reported as not in the input.
        secrets: Vec::new(),
    };
    let mut served = ServedIngresses::default();
    for value in ingresses {
        let ingress: Ingress = match serde_path_to_error::deserialize(*value) {
            Ok(i) => i,
            Err(e) => {
                let ns = value["metadata"]["namespace"].as_str().unwrap_or_default();
                let name = value["metadata"]["name"].as_str().unwrap_or_default();
                errors.push(ConfigError {
                    file: "kubernetes".into(),
                    line: None,
                    object: Some(format!("Ingress {ns}/{name}")),
                    field: Some(e.path().to_string()),
                    message: e.inner().to_string(),
                });
                continue;
            }
        };
        let ours = match crate::ingress_nginx::ingress_class(&ingress) {
            Some(class) => class == serving.class,
            None => default_class,
        };
        if !ours {
            continue;
        }
        served.ingresses.push(ServedIngress {
            namespace: ingress
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| crate::resources::DEFAULT_NAMESPACE.into()),
            name: ingress.metadata.name.clone().unwrap_or_default(),
            resource_version: ingress.metadata.resource_version.clone(),
            load_balancer: value["status"]["loadBalancer"].clone(),
        });
        input.ingresses.push(ingress);
    }
    let (loaded, conversion_errors, report) = converted_ingresses(serving, &input, crds);
    errors.extend(conversion_errors);
    served.report = report.lines.iter().map(ToString::to_string).collect();
    served.inexact = report
        .lines
        .iter()
        .map(|l| l.verdict.is_inexact())
        .collect();
    let objects: Vec<Object> = loaded.into_iter().map(|l| l.object).collect();
    served.converted = objects.iter().map(Object::id).collect();
    (objects, errors, served)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ingress(name: &str, class: Option<&str>, annotations: Value) -> Value {
        let mut spec = json!({"rules": [{"host": "shop.example", "http": {"paths": [
            {"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": name, "port": {"number": 80}}}}]}}]});
        if let Some(class) = class {
            spec["ingressClassName"] = json!(class);
        }
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
               "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
               "spec": spec,
               "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}})
    }

    fn class(name: &str, default: bool) -> Value {
        let mut c = json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
                           "metadata": {"name": name},
                           "spec": {"controller": "k8s.io/ingress-nginx"}});
        if default {
            c["metadata"]["annotations"] = json!({DEFAULT_CLASS_ANNOTATION: "true"});
        }
        c
    }

    fn serving() -> IngressServing {
        IngressServing {
            class: "nginx".into(),
            gateway: ("edge".into(), "gw".into()),
        }
    }

    fn names(served: &ServedIngresses) -> Vec<&str> {
        served.ingresses.iter().map(|i| i.name.as_str()).collect()
    }

    #[test]
    fn ingresses_of_the_class_are_converted_and_others_are_not() {
        let web = ingress("web", Some("nginx"), json!({}));
        let canary = ingress(
            "web-canary",
            Some("nginx"),
            json!({"nginx.ingress.kubernetes.io/canary": "true",
                   "nginx.ingress.kubernetes.io/canary-by-header": "X-Canary"}),
        );
        let other = ingress("other", Some("traefik"), json!({}));
        let bare = ingress("bare", None, json!({}));
        let (objects, errors, served) = convert(
            &serving(),
            &[&web, &canary, &other, &bare],
            &[&class("nginx", false)],
            &[],
            &Crds::default(),
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(names(&served), ["web", "web-canary"]);
        assert_eq!(served.converted, ["HTTPRoute shop/web"]);
        let Object::HttpRoute(route) = &objects[0] else {
            panic!("an HTTPRoute: {objects:?}");
        };
        let parent = &route.spec.parent_refs.as_ref().expect("parentRefs")[0];
        assert_eq!(
            (parent.namespace.as_deref(), parent.name.as_str()),
            (Some("edge"), "gw")
        );
        let mut backends: Vec<&str> = route
            .spec
            .rules
            .iter()
            .flatten()
            .flat_map(|r| r.backend_refs.iter().flatten())
            .map(|b| b.name.as_str())
            .collect();
        backends.sort();
        backends.dedup();
        assert_eq!(backends, ["web", "web-canary"]);
        assert!(
            served
                .report
                .iter()
                .any(|l| l.contains("Ingress shop/web-canary")),
            "{:?}",
            served.report
        );
        assert_eq!(
            served.ingresses[0].load_balancer,
            json!({"ingress": [{"ip": "192.0.2.1"}]})
        );
    }

    #[test]
    fn ingresses_without_a_class_are_served_only_for_the_default_class() {
        let bare = ingress("bare", None, json!({}));
        let annotated = ingress(
            "annotated",
            None,
            json!({"kubernetes.io/ingress.class": "nginx"}),
        );
        for (classes, expected) in [
            (vec![], vec!["annotated"]),
            (vec![class("nginx", false)], vec!["annotated"]),
            (vec![class("other", true)], vec!["annotated"]),
            (vec![class("nginx", true)], vec!["annotated", "bare"]),
        ] {
            let classes: Vec<&Value> = classes.iter().collect();
            let (_, _, served) = convert(
                &serving(),
                &[&annotated, &bare],
                &classes,
                &[],
                &Crds::default(),
            );
            assert_eq!(names(&served), expected, "{classes:?}");
        }
    }

    #[test]
    fn an_ingress_that_does_not_fit_its_type_is_an_error_naming_it() {
        let mut bad = ingress("bad", Some("nginx"), json!({}));
        bad["spec"]["rules"] = json!("not a list");
        let (objects, errors, served) = convert(&serving(), &[&bad], &[], &[], &Crds::default());
        assert!(objects.is_empty());
        assert!(served.ingresses.is_empty());
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].object.as_deref(), Some("Ingress shop/bad"));
        assert_eq!(errors[0].field.as_deref(), Some("spec.rules"));
    }
}
