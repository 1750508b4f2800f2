//! What translate reads from every object's metadata: its namespace, and
//! its place in the order objects are processed in.
//!
//! Every kind is processed oldest first, then by namespace and name, so
//! that the output never depends on file order; the same key breaks ties
//! between routes in the route table (the spec's "the oldest Route based
//! on creation timestamp", then "alphabetical order by {namespace}/{name}").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::resources::DEFAULT_NAMESPACE;

/// The object's namespace, `default` when the manifest leaves it out.
pub(crate) fn namespace_of(meta: &ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
}

/// (creationTimestamp, namespace, name): the order inputs are processed
/// in, so that the output never depends on file order.
pub(crate) fn sort_key(meta: &ObjectMeta) -> (i128, String, String) {
    (
        created_nanos(meta),
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// [`sort_key`] on borrowed strings, for sorting many objects without
/// cloning their names at every comparison.
pub(crate) fn sort_key_ref(meta: &ObjectMeta) -> (i128, &str, &str) {
    (
        created_nanos(meta),
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// creationTimestamp in nanoseconds since the Unix epoch (0 when unset:
/// objects without one come first).
pub(crate) fn created_nanos(meta: &ObjectMeta) -> i128 {
    meta.creation_timestamp
        .as_ref()
        .map(|t| t.0.as_nanosecond())
        .unwrap_or(0)
}
