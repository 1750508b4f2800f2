//! Validation by the CRDs themselves: given CustomResourceDefinitions
//! (`--crds`, or CRD documents among the manifests), each object of a kind
//! they define is checked as the API server checks it before storing it:
//! its version's `openAPIV3Schema` (types, required, enums, patterns,
//! formats, bounds, lengths, item counts, unknown fields), the list types,
//! and the CEL rules (`x-kubernetes-validations`), with the API server's
//! messages (`spec.x: Invalid value: "...": <message>`). The object is
//! defaulted by the schema on the way, as the API server defaults it.
//!
//! Without CRDs, the hand-written checks of `validate.rs` apply instead.
//! See [`validate`] for unknown fields (refused, as `kubectl apply` has
//! them refused) and [`cel`] for the rules (and what a stateless check does
//! with transition rules).

mod cel;
mod errors;
mod schema;
mod validate;

use std::collections::BTreeMap;

use serde_json::Value;

pub use cel::rules_not_run;
pub use errors::{ErrorType, FieldError, FieldPath};
pub use schema::RuleStats;
use schema::Schema;

/// The `apiVersion` of CustomResourceDefinitions.
pub const CRD_API_VERSION: &str = "apiextensions.k8s.io/v1";

/// The CRDs given, by group and kind.
#[derive(Debug, Default)]
pub struct Crds {
    kinds: BTreeMap<(String, String), CrdKind>,
}

#[derive(Debug)]
struct CrdKind {
    /// Where the CRD came from (`file:line`).
    origin: String,
    versions: BTreeMap<String, CrdVersion>,
    stats: RuleStats,
}

#[derive(Debug)]
struct CrdVersion {
    served: bool,
    /// With a status subresource, a create or update of the object ignores
    /// its `status`.
    status_subresource: bool,
    schema: Option<Schema>,
}

/// Whether a document is a CustomResourceDefinition.
pub fn is_crd(value: &Value) -> bool {
    value.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition")
        && value.get("apiVersion").and_then(Value::as_str) == Some(CRD_API_VERSION)
}

fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.rsplit_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

impl Crds {
    pub fn new() -> Crds {
        Crds::default()
    }

    /// Add (or replace) the CRD of a document; `origin` names it in
    /// messages. Errors say why the document is not a usable CRD.
    pub fn add(&mut self, crd: &Value, origin: &str) -> Result<(), String> {
        let spec = &crd["spec"];
        let group = spec["group"].as_str().ok_or("spec.group: Required value")?;
        let kind = spec["names"]["kind"]
            .as_str()
            .ok_or("spec.names.kind: Required value")?;
        let mut stats = RuleStats::default();
        let mut versions = BTreeMap::new();
        for v in spec["versions"].as_array().into_iter().flatten() {
            let Some(name) = v["name"].as_str() else {
                continue;
            };
            let schema = v["schema"]
                .get("openAPIV3Schema")
                .map(|s| Schema::parse(s, &mut stats));
            versions.insert(
                name.to_string(),
                CrdVersion {
                    served: v["served"].as_bool().unwrap_or(false),
                    status_subresource: v["subresources"].get("status").is_some(),
                    schema,
                },
            );
        }
        if versions.is_empty() {
            return Err("spec.versions: Required value".into());
        }
        self.kinds.insert(
            (group.to_string(), kind.to_string()),
            CrdKind {
                origin: origin.to_string(),
                versions,
                stats,
            },
        );
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// `group/kind (origin)` of every CRD given.
    pub fn describe(&self) -> Vec<String> {
        self.kinds
            .iter()
            .map(|((g, k), c)| format!("{k}.{g} ({})", c.origin))
            .collect()
    }

    /// What the CRDs' rules came to: compiled, could not compile, transition.
    pub fn stats(&self) -> RuleStats {
        let mut total = RuleStats::default();
        for k in self.kinds.values() {
            total.compiled += k.stats.compiled;
            total.transition += k.stats.transition;
            total.failed.extend(k.stats.failed.iter().cloned());
        }
        total
    }

    /// Whether a CRD defines this kind (in any version).
    pub fn covers(&self, api_version: &str, kind: &str) -> bool {
        let (group, _) = split_api_version(api_version);
        self.kinds
            .contains_key(&(group.to_string(), kind.to_string()))
    }

    /// Check an object as the API server would on a create: `None` when no
    /// CRD defines its kind, else every problem found (empty: admitted).
    /// The object is defaulted by the schema, and its `status` dropped
    /// when the version has a status subresource (a create ignores it).
    pub fn admit(
        &self,
        api_version: &str,
        kind: &str,
        object: &mut Value,
    ) -> Option<Vec<FieldError>> {
        let (group, version) = split_api_version(api_version);
        let crd = self.kinds.get(&(group.to_string(), kind.to_string()))?;
        let Some(v) = crd.versions.get(version).filter(|v| v.served) else {
            return Some(vec![FieldError::new(
                FieldPath::root(),
                ErrorType::UnknownField,
                None,
                format!("no matches for kind \"{kind}\" in version \"{api_version}\""),
            )]);
        };
        if v.status_subresource
            && let Value::Object(map) = object
        {
            map.remove("status");
        }
        let schema = v.schema.as_ref()?;
        Some(validate::admit(schema, object, true, &FieldPath::root()))
    }

    /// Check a `status` body against its kind's status schema (what a
    /// status write must satisfy). `None` when no CRD defines the kind or
    /// its schema has no `status`.
    pub fn admit_status(
        &self,
        api_version: &str,
        kind: &str,
        status: &mut Value,
    ) -> Option<Vec<FieldError>> {
        let (group, version) = split_api_version(api_version);
        let crd = self.kinds.get(&(group.to_string(), kind.to_string()))?;
        let schema = crd
            .versions
            .get(version)?
            .schema
            .as_ref()?
            .properties
            .get("status")?;
        let base = FieldPath::root().child("status");
        Some(validate::admit(schema, status, false, &base))
    }
}

#[cfg(test)]
mod tests;
