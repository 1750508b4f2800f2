//! ingress-nginx to the Gateway API: `sluice convert ingress-nginx`, and
//! `serve --ingress-class`, which serves Ingresses through the same
//! conversion.
//!
//! ingress-nginx (retired by SIG Network) configured canaries and most
//! behaviour through annotations. This module reads them the way its
//! controller and its Lua balancer act on them (not only as documented),
//! writes the HTTPRoutes that serve every request the same way on sluice,
//! and reports, per annotation per object, how exact that is. Pure: the
//! caller reads files and prints (`src/cli/convert.rs`). The annotation
//! table with every verdict is docs/migrating-from-ingress-nginx.md.

pub mod annotations;
pub mod convert;
pub mod report;

pub use convert::{Conversion, Input, Options, convert, ingress_class};
pub use report::{Report, ReportLine, Verdict};

use serde_json::Value;

/// Add the Ingresses, Services and Secrets of one file's documents to `input`; a
/// document that does not fit its type is an error naming file and line.
pub fn read_documents_into(
    file: &str,
    docs: &[crate::yaml::Document],
    input: &mut Input,
    errors: &mut Vec<String>,
) {
    for doc in docs {
        let kind = doc.value.get("kind").and_then(Value::as_str).unwrap_or("");
        let api = doc
            .value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let at = format!("{file}:{}", doc.line);
        match (api, kind) {
            ("networking.k8s.io/v1", "Ingress") => {
                match serde_path_to_error::deserialize(doc.value.clone()) {
                    Ok(i) => input.ingresses.push(i),
                    Err(e) => errors.push(format!("{at}: Ingress: {}: {}", e.path(), e.inner())),
                }
            }
            ("v1", "Service") => match serde_path_to_error::deserialize(doc.value.clone()) {
                Ok(s) => input.services.push(s),
                Err(e) => errors.push(format!("{at}: Service: {}: {}", e.path(), e.inner())),
            },
            ("v1", "Secret") => match serde_path_to_error::deserialize(doc.value.clone()) {
                Ok(s) => input.secrets.push(s),
                Err(e) => errors.push(format!("{at}: Secret: {}: {}", e.path(), e.inner())),
            },
            (a, "Ingress") => errors.push(format!(
                "{at}: Ingress of apiVersion {a:?}: only networking.k8s.io/v1 is read"
            )),
            _ => {}
        }
    }
}
