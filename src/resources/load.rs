//! Manifest text to typed objects: multi-document YAML, JSON, `kind: List`.
//!
//! Pure: the caller reads the file and passes its text and name. A file that
//! does not parse fails whole (one error naming file and line, no objects),
//! so the caller keeps what it loaded from that file before. A document that
//! parses but does not fit its type, or that the API server's CRD schema
//! would refuse, is refused alone; every other object is kept.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::crd::{self, Crds};
use super::defaults::apply_defaults;
use super::validate::validate;
use super::{DEFAULT_NAMESPACE, is_namespaced_kind, object_id};
use crate::yaml::{Document, Lines};

pub use super::Object;

/// One object read from a manifest file.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedObject {
    pub file: String,
    /// First line of the document the object came from (1-based).
    pub line: usize,
    pub object: Object,
    /// `(rule, backendRef)` indices of a route's backendRefs whose
    /// weight the manifest omitted: the CRD default made them 1, and `check`
    /// still points out an omitted weight next to explicit ones.
    pub omitted_weights: Vec<(usize, usize)>,
}

/// Everything read from one file.
#[derive(Debug, Clone, Default)]
pub struct ParsedFile {
    pub objects: Vec<LoadedObject>,
    pub errors: Vec<LoadError>,
    /// Documents of kinds sluice does not read (`file:line: Kind ns/name
    /// (apiVersion)`): not errors, a manifest directory may hold anything.
    pub ignored: Vec<String>,
}

/// Why a file or an object was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    pub file: String,
    pub line: usize,
    /// `HTTPRoute default/foo`, when the error is about one object.
    pub object: Option<String>,
    /// `spec.rules[0].backendRefs[1].weight`, when about one field.
    pub field: Option<String>,
    pub message: String,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: ", self.file, self.line)?;
        if let Some(o) = &self.object {
            write!(f, "{o}: ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for LoadError {}

/// Parse one manifest file's text. `file` is only used in messages.
pub fn parse_manifests(text: &str, file: &str) -> ParsedFile {
    parse_manifests_with(text, file, &Crds::new())
}

/// Parse one manifest file's text, validating the kinds `crds` defines by
/// their CRD (see [`crate::resources::crd`]) and the others by hand.
pub fn parse_manifests_with(text: &str, file: &str, crds: &Crds) -> ParsedFile {
    match read_documents(text, file) {
        Ok(documents) => load_documents(&documents, file, crds),
        Err(e) => ParsedFile {
            errors: vec![e],
            ..ParsedFile::default()
        },
    }
}

/// Load the documents of one file (see [`read_documents`]).
pub fn load_documents(documents: &[Document], file: &str, crds: &Crds) -> ParsedFile {
    let mut out = ParsedFile::default();
    for doc in documents {
        let at = Doc {
            file,
            lines: &doc.lines,
            crds,
        };
        load_document(doc.value.clone(), &at, "", &mut out);
    }
    out
}

/// The documents of a file with the line of each node, or the syntax
/// error that makes the whole file fail.
pub fn read_documents(text: &str, file: &str) -> Result<Vec<Document>, LoadError> {
    let syntax = |line: usize, message: String| LoadError {
        file: file.to_string(),
        line,
        object: None,
        field: None,
        message,
    };
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        // JSON (one or more concatenated values). YAML would read most of
        // it too, but JSON's own parser gives better errors (and lines
        // only per document).
        let mut docs = Vec::new();
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        loop {
            let start = stream.byte_offset();
            match stream.next() {
                None => break,
                Some(Ok(value)) => {
                    let skipped = text[start..].len() - text[start..].trim_start().len();
                    let line = line_of(text, start + skipped);
                    docs.push(Document {
                        line,
                        value,
                        lines: Lines::whole(line),
                    });
                }
                Some(Err(e)) => {
                    return Err(syntax(e.line().max(1), format!("invalid JSON: {e}")));
                }
            }
        }
        return Ok(docs);
    }

    crate::yaml::documents(text).map_err(|e| syntax(e.line, format!("invalid YAML: {e}")))
}

fn line_of(text: &str, byte: usize) -> usize {
    text.as_bytes()[..byte.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Where a document came from, and what it is checked against.
struct Doc<'a> {
    file: &'a str,
    /// The lines of the file's document (of the whole `List` for its items).
    lines: &'a Lines,
    crds: &'a Crds,
}

impl Doc<'_> {
    /// An error about `field` (`None`: the whole object) on its line.
    fn error(&self, object: Option<&str>, field: Option<String>, message: String) -> LoadError {
        LoadError {
            file: self.file.to_string(),
            line: self.lines.of(field.as_deref().unwrap_or("")),
            object: object.map(str::to_string),
            field,
            message,
        }
    }
}

/// Load one document (or one item of a `List`, with `prefix` `items[3].`).
fn load_document(mut value: Value, at: &Doc<'_>, prefix: &str, out: &mut ParsedFile) {
    let here = (!prefix.is_empty()).then(|| prefix.trim_end_matches('.').to_string());
    let map = match &mut value {
        Value::Null => return, // an empty document
        Value::Object(m) => m,
        other => {
            let what = match other {
                Value::Array(_) => "a list",
                Value::String(_) => "a string",
                _ => "a scalar",
            };
            out.errors.push(at.error(
                None,
                here,
                format!("expected a Kubernetes object (a mapping with apiVersion and kind), found {what}"),
            ));
            return;
        }
    };
    let api_version = map
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let kind = map
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if kind.is_empty() || api_version.is_empty() {
        let missing = if api_version.is_empty() {
            "apiVersion"
        } else {
            "kind"
        };
        out.errors.push(at.error(
            None,
            Some(format!("{prefix}{missing}")),
            "is required".to_string(),
        ));
        return;
    }

    if kind == "List" {
        let items = match map.remove("items") {
            Some(Value::Array(items)) => items,
            Some(Value::Null) | None => Vec::new(),
            Some(_) => {
                out.errors.push(at.error(
                    None,
                    Some(format!("{prefix}items")),
                    "must be a list of objects".to_string(),
                ));
                return;
            }
        };
        for (i, item) in items.into_iter().enumerate() {
            load_document(item, at, &format!("{prefix}items[{i}]."), out);
        }
        return;
    }
    if kind == "CustomResourceDefinition" && api_version == crd::CRD_API_VERSION {
        // Read by the source, which validates with it (see `FileSet`).
        return;
    }
    let line = at.lines.of(prefix.trim_end_matches('.'));

    // Names for messages, before the document is known to fit its type.
    let namespaced = is_namespaced_kind(&kind);
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    let name = meta.get("name").and_then(Value::as_str).map(str::to_string);
    let namespace = if namespaced {
        let ns = meta
            .get("namespace")
            .and_then(Value::as_str)
            .filter(|ns| !ns.is_empty())
            .unwrap_or(DEFAULT_NAMESPACE)
            .to_string();
        if let Value::Object(m) = meta {
            m.insert("namespace".into(), Value::String(ns.clone()));
        }
        Some(ns)
    } else {
        None
    };
    let id = object_id(
        &kind,
        namespace.as_deref(),
        name.as_deref().unwrap_or("<unnamed>"),
    );
    let in_doc = |field: &str| format!("{prefix}{field}");

    // Before any default fills them in.
    let omitted_weights = omitted_weights(&kind, &value);
    // With a CRD for the kind, the API server's checks decide (and its
    // schema defaults apply); without, the hand-written ones.
    let by_crd = match at.crds.admit(&api_version, &kind, &mut value) {
        None => false,
        Some(problems) if problems.is_empty() => true,
        Some(problems) => {
            for p in problems {
                let field = (!p.path.is_root()).then(|| in_doc(p.path.as_str()));
                out.errors.push(at.error(Some(&id), field, p.body()));
            }
            return;
        }
    };

    let parsed = match typed_object(&kind, &api_version, value) {
        Some(parsed) => parsed,
        None => {
            out.ignored.push(format!(
                "{}:{line}: {id} ({api_version}): not a kind sluice reads",
                at.file
            ));
            return;
        }
    };
    let mut object = match parsed {
        Ok(o) => o,
        Err((field, message)) => {
            out.errors
                .push(at.error(Some(&id), field.map(|f| in_doc(&f)), message));
            return;
        }
    };
    if name.as_deref().is_none_or(str::is_empty) {
        out.errors.push(at.error(
            Some(&id),
            Some(in_doc("metadata.name")),
            "is required".to_string(),
        ));
        return;
    }
    apply_defaults(&mut object);
    let problems = if by_crd {
        Vec::new()
    } else {
        validate(&object)
    };
    if !problems.is_empty() {
        for (field, message) in problems {
            out.errors
                .push(at.error(Some(&id), Some(in_doc(&field)), message));
        }
        return;
    }
    out.objects.push(LoadedObject {
        file: at.file.to_string(),
        line,
        object,
        omitted_weights,
    });
}

/// The backendRefs of a route document (HTTPRoute, GRPCRoute, TLSRoute)
/// without a weight, before defaults.
fn omitted_weights(kind: &str, value: &Value) -> Vec<(usize, usize)> {
    if !matches!(kind, "HTTPRoute" | "GRPCRoute" | "TLSRoute") {
        return Vec::new();
    }
    let rules = value["spec"]["rules"].as_array().into_iter().flatten();
    rules
        .enumerate()
        .flat_map(|(i, rule)| {
            let refs = rule["backendRefs"].as_array().into_iter().flatten();
            refs.enumerate()
                .filter(|(_, b)| b.get("weight").is_none_or(Value::is_null))
                .map(move |(j, _)| (i, j))
        })
        .collect()
}

/// The typed object of a document of a kind sluice reads (`None` for other
/// kinds and versions), or the field at fault and why it does not fit.
pub(crate) fn typed_object(
    kind: &str,
    api_version: &str,
    value: Value,
) -> Option<Result<Object, (Option<String>, String)>> {
    let gateway = matches!(
        api_version,
        "gateway.networking.k8s.io/v1" | "gateway.networking.k8s.io/v1beta1"
    );
    Some(match (kind, api_version) {
        ("GatewayClass", _) if gateway => typed(value).map(Object::GatewayClass),
        ("Gateway", _) if gateway => typed(value).map(Object::Gateway),
        ("HTTPRoute", _) if gateway => {
            typed(value).map(|r| Object::HttpRoute(std::sync::Arc::new(r)))
        }
        // GRPCRoute is v1 since Gateway API 1.1 (v1alpha2 before, same
        // schema); TLSRoute is v1 since 1.5, whose schema v1alpha2 and
        // v1alpha3 manifests fit when they give hostnames and one rule.
        ("GRPCRoute", "gateway.networking.k8s.io/v1" | "gateway.networking.k8s.io/v1alpha2") => {
            typed(value).map(Object::GrpcRoute)
        }
        (
            "TLSRoute",
            "gateway.networking.k8s.io/v1"
            | "gateway.networking.k8s.io/v1alpha3"
            | "gateway.networking.k8s.io/v1alpha2",
        ) => typed(value).map(Object::TlsRoute),
        ("ReferenceGrant", _) if gateway => typed(value).map(Object::ReferenceGrant),
        ("ListenerSet", "gateway.networking.k8s.io/v1") => typed(value).map(Object::ListenerSet),
        ("BackendTLSPolicy", "gateway.networking.k8s.io/v1") => {
            typed(value).map(Object::BackendTlsPolicy)
        }
        ("ConfigMap", "v1") => typed(value).map(Object::ConfigMap),
        ("RolloutPolicy", super::ROLLOUT_POLICY_API_VERSION) => {
            typed(value).map(Object::RolloutPolicy)
        }
        ("Service", "v1") => typed(value).map(Object::Service),
        ("Namespace", "v1") => typed(value).map(Object::Namespace),
        ("Secret", "v1") => typed(value).map(Object::Secret),
        ("EndpointSlice", "discovery.k8s.io/v1") => typed(value).map(Object::EndpointSlice),
        _ => return None,
    })
}

/// Deserialize into a typed object, with the path of the field at fault.
fn typed<T: DeserializeOwned>(value: Value) -> Result<T, (Option<String>, String)> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = (path != "." && !path.is_empty()).then_some(path);
        (field, e.into_inner().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: checkout
spec:
  parentRefs: [{name: gw}]
  rules:
  - backendRefs:
    - {name: stable, port: 80, weight: 995}
    - {name: canary, port: 80, weight: 5}
";

    #[test]
    fn reads_multi_document_yaml_with_lines() {
        let text = format!(
            "# leading comment\n---\n{ROUTE}---\n\n---\napiVersion: v1\nkind: Service\n\
             metadata: {{name: stable, namespace: shop}}\nspec:\n  ports: [{{port: 80}}]\n"
        );
        let parsed = parse_manifests(&text, "r.yaml");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        assert_eq!(parsed.objects.len(), 2);
        assert_eq!(parsed.objects[0].line, 3);
        assert_eq!(parsed.objects[0].object.id(), "HTTPRoute default/checkout");
        assert_eq!(parsed.objects[1].line, 16);
        assert_eq!(parsed.objects[1].object.id(), "Service shop/stable");
    }

    #[test]
    fn first_document_without_marker_starts_at_its_first_line() {
        let text = format!("\n{ROUTE}---\n{ROUTE}");
        let parsed = parse_manifests(&text, "r.yaml");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let lines: Vec<usize> = parsed.objects.iter().map(|o| o.line).collect();
        assert_eq!(lines, vec![2, 13]);
    }

    #[test]
    fn reads_json_and_lists() {
        let json = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}
        ]}"#;
        let parsed = parse_manifests(json, "all.json");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let ids: Vec<String> = parsed.objects.iter().map(|o| o.object.id()).collect();
        assert_eq!(ids, vec!["Service default/a", "Namespace shop"]);
    }

    #[test]
    fn accepts_v1beta1_gateway_kinds() {
        let text = ROUTE.replace("/v1\n", "/v1beta1\n");
        let parsed = parse_manifests(&text, "r.yaml");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        assert!(matches!(parsed.objects[0].object, Object::HttpRoute(_)));
    }

    #[test]
    fn syntax_error_fails_the_whole_file_with_its_line() {
        let text = format!("{ROUTE}---\napiVersion: v1\nkind: Service\nmetadata: {{name: [oops\n");
        let parsed = parse_manifests(&text, "bad.yaml");
        assert!(parsed.objects.is_empty());
        assert_eq!(parsed.errors.len(), 1);
        let e = &parsed.errors[0];
        assert_eq!(e.file, "bad.yaml");
        assert!(e.line >= 14, "{e}");
        assert!(e.to_string().starts_with("bad.yaml:"), "{e}");
    }

    #[test]
    fn json_syntax_error_names_its_line() {
        let parsed = parse_manifests("{\n\"apiVersion\": \"v1\",\n\"kind\": }\n", "x.json");
        assert!(parsed.objects.is_empty());
        assert_eq!(parsed.errors.len(), 1);
        assert_eq!(parsed.errors[0].line, 3);
    }

    #[test]
    fn type_error_names_object_and_field_and_refuses_only_that_object() {
        let bad = ROUTE.replace("weight: 5}", "weight: many}");
        let text = format!("{bad}---\napiVersion: v1\nkind: Service\nmetadata: {{name: a}}\n");
        let parsed = parse_manifests(&text, "routes.yaml");
        assert_eq!(parsed.objects.len(), 1);
        assert_eq!(parsed.objects[0].object.kind(), "Service");
        assert_eq!(parsed.errors.len(), 1);
        let e = &parsed.errors[0];
        assert_eq!(e.object.as_deref(), Some("HTTPRoute default/checkout"));
        assert_eq!(
            e.field.as_deref(),
            Some("spec.rules[0].backendRefs[1].weight")
        );
        // The line of the field, not of the document.
        assert_eq!(e.line, 10);
    }

    #[test]
    fn validation_error_display_names_everything() {
        let bad = ROUTE.replace("weight: 5}", "weight: 2000000}");
        let parsed = parse_manifests(&bad, "routes.yaml");
        assert!(parsed.objects.is_empty());
        assert_eq!(
            parsed.errors[0].to_string(),
            "routes.yaml:10: HTTPRoute default/checkout: spec.rules[0].backendRefs[1].weight: \
             2000000 is outside 0..=1000000"
        );
    }

    #[test]
    fn missing_name_is_refused() {
        let parsed = parse_manifests("apiVersion: v1\nkind: Service\nmetadata: {}\n", "s.yaml");
        assert!(parsed.objects.is_empty());
        assert_eq!(parsed.errors[0].field.as_deref(), Some("metadata.name"));
    }

    #[test]
    fn reads_secrets_with_base64_data_and_string_data() {
        let text = "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: infra}\n\
                    type: kubernetes.io/tls\ndata: {tls.crt: SGVsbG8=}\nstringData: {tls.key: k}\n";
        let parsed = parse_manifests(text, "s.yaml");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let Object::Secret(s) = &parsed.objects[0].object else {
            panic!("not a Secret: {:?}", parsed.objects[0].object);
        };
        assert_eq!(s.data.as_ref().unwrap()["tls.crt"].0, b"Hello");
        assert_eq!(s.string_data.as_ref().unwrap()["tls.key"], "k");
        // Data that is not base64 is refused, naming the field.
        let bad = parse_manifests(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {tls.crt: \"not base64!\"}\n",
            "s.yaml",
        );
        assert_eq!(bad.errors.len(), 1);
        assert!(
            bad.errors[0].to_string().contains("data"),
            "{}",
            bad.errors[0]
        );
    }

    #[test]
    fn unknown_kinds_are_ignored_not_errors() {
        let text = "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: c}\n---\n\
                    apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {name: t}\n";
        let parsed = parse_manifests(text, "m.yaml");
        assert!(parsed.errors.is_empty());
        assert!(parsed.objects.is_empty());
        assert_eq!(parsed.ignored.len(), 2);
        assert!(
            parsed.ignored[1].starts_with("m.yaml:5: TCPRoute default/t"),
            "{:?}",
            parsed.ignored
        );
    }

    #[test]
    fn empty_documents_and_files_are_fine() {
        for text in ["", "---\n", "# nothing\n", "---\n---\n"] {
            let parsed = parse_manifests(text, "e.yaml");
            assert!(parsed.errors.is_empty(), "{text:?}: {:?}", parsed.errors);
            assert!(parsed.objects.is_empty());
        }
    }

    #[test]
    fn namespaces_default_except_for_cluster_scoped_kinds() {
        let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\n\
                    metadata: {name: c}\nspec: {controllerName: a/b}\n---\n\
                    apiVersion: v1\nkind: Service\nmetadata: {name: s}\n";
        let parsed = parse_manifests(text, "m.yaml");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        assert_eq!(parsed.objects[0].object.metadata().namespace, None);
        assert_eq!(
            parsed.objects[1].object.metadata().namespace.as_deref(),
            Some("default")
        );
    }

    #[test]
    fn a_non_object_document_is_an_error() {
        let parsed = parse_manifests("- a\n- b\n", "m.yaml");
        assert_eq!(parsed.errors.len(), 1);
        assert!(parsed.errors[0].message.contains("found a list"));
    }
}
