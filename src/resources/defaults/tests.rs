//! Every `default:` of the upstream CRDs and of ours (`deploy/`) is
//! applied: the schemas (upstream: `../shared/gateway-api/crds/`, see
//! [`crate::testdata`]) are walked, and for each default a minimal
//! object reaching the defaulted field (its ancestors present, their
//! required fields filled, the field itself absent) is loaded, defaulted and
//! looked at.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::apply_defaults;
use crate::resources::load::typed_object;

/// The CRD files: the upstream channels (when present) and our own
/// `deploy/`, whose kinds get their defaults the same way.
fn crd_files(upstream: Option<&Path>) -> Vec<PathBuf> {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let dirs = upstream
        .into_iter()
        .flat_map(|dir| [dir.join("standard"), dir.join("experimental")])
        .chain([deploy]);
    let mut files = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// One step from an object to its field: a property, or "the first item".
#[derive(Debug, Clone)]
enum Step {
    Field(String),
    Item,
}

fn path_text(steps: &[Step]) -> String {
    let mut out = String::new();
    for s in steps {
        match s {
            Step::Field(f) => {
                out.push('.');
                out.push_str(f);
            }
            Step::Item => out.push_str("[0]"),
        }
    }
    out
}

/// A value the schema accepts and that deserializes into the typed
/// structs: required properties filled in, the first enum value, one item
/// where items are required.
fn minimal(schema: &Value) -> Value {
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    match schema["type"].as_str() {
        Some("object") => {
            let mut m = Map::new();
            for name in schema["required"].as_array().into_iter().flatten() {
                let name = name.as_str().expect("required names are strings");
                m.insert(name.into(), minimal(&schema["properties"][name]));
            }
            Value::Object(m)
        }
        Some("array") => {
            if schema["minItems"].as_u64().unwrap_or(0) > 0 {
                json!([minimal(&schema["items"])])
            } else {
                json!([])
            }
        }
        Some("integer") => json!(schema["minimum"].as_i64().unwrap_or(1).max(1)),
        Some("boolean") => json!(false),
        _ if schema["format"] == "date-time" => json!("1970-01-01T00:00:00Z"),
        _ => json!("x"),
    }
}

/// The object of `kind` that reaches the parent of the defaulted field at
/// `steps` (the field itself left out), built from the root schema.
fn object_reaching(root: &Value, steps: &[Step]) -> Value {
    fn build(schema: &Value, steps: &[Step]) -> Value {
        let mut value = minimal(schema);
        let Some((step, rest)) = steps.split_first() else {
            return value;
        };
        match step {
            Step::Field(name) => {
                let map = value.as_object_mut().expect("a field steps into an object");
                if rest.is_empty() {
                    map.remove(name);
                } else {
                    map.insert(name.clone(), build(&schema["properties"][name], rest));
                }
            }
            Step::Item => {
                value = json!([build(&schema["items"], rest)]);
            }
        }
        value
    }
    build(root, steps)
}

/// Every (path, default) of a schema.
fn defaults(schema: &Value, steps: &mut Vec<Step>, out: &mut Vec<(Vec<Step>, Value)>) {
    if let Some(d) = schema.get("default") {
        out.push((steps.clone(), d.clone()));
    }
    if let Some(props) = schema["properties"].as_object() {
        for (name, s) in props {
            steps.push(Step::Field(name.clone()));
            defaults(s, steps, out);
            steps.pop();
        }
    }
    if schema.get("items").is_some() {
        steps.push(Step::Item);
        defaults(&schema["items"], steps, out);
        steps.pop();
    }
}

/// Whether `have` holds everything `want` says (objects may hold more: a
/// defaulted object is defaulted inside too).
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| contains(hv, v))),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(a, b)| contains(a, b))
        }
        _ => have == want,
    }
}

fn at<'a>(value: &'a Value, steps: &[Step]) -> Option<&'a Value> {
    let mut v = value;
    for s in steps {
        v = match s {
            Step::Field(f) => v.get(f)?,
            Step::Item => v.get(0)?,
        };
    }
    Some(v)
}

#[test]
fn every_crd_default_is_applied() {
    let upstream = crate::testdata::or_skip(
        crate::testdata::gateway_api_dir("crds")
            .map_err(|why| format!("{why}; the upstream CRDs' defaults are not checked")),
    );
    let mut checked = 0;
    let mut missing = Vec::new();
    for file in crd_files(upstream.as_deref()) {
        let text = std::fs::read_to_string(&file).expect("CRD file readable");
        for doc in crate::yaml::documents(&text).expect("CRD file is YAML") {
            let crd = doc.value;
            if crd["kind"] != "CustomResourceDefinition" {
                continue;
            }
            let group = crd["spec"]["group"].as_str().unwrap_or("");
            let kind = crd["spec"]["names"]["kind"].as_str().unwrap_or("");
            for version in crd["spec"]["versions"].as_array().into_iter().flatten() {
                let api_version = format!("{group}/{}", version["name"].as_str().unwrap_or(""));
                let schema = &version["schema"]["openAPIV3Schema"];
                let mut found = Vec::new();
                defaults(schema, &mut Vec::new(), &mut found);
                for (steps, default) in found {
                    let mut value = object_reaching(schema, &steps);
                    value["apiVersion"] = json!(api_version);
                    value["kind"] = json!(kind);
                    value["metadata"] = json!({"name": "x", "namespace": "default"});
                    let Some(mut object) = typed_minimal(schema, kind, &api_version, value) else {
                        // A kind or version sluice does not read.
                        break;
                    };
                    apply_defaults(&mut object);
                    let stored = object_json(&object);
                    checked += 1;
                    match at(&stored, &steps) {
                        Some(v) if contains(v, &default) => {}
                        got => missing.push(format!(
                            "{kind} {api_version} {}: default {default}, got {got:?}",
                            path_text(&steps)
                        )),
                    }
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "defaults not applied:\n{}",
        missing.join("\n")
    );
    assert!(
        upstream.is_none() || checked > 50,
        "only {checked} defaults found: the CRDs went missing?"
    );
    println!("{checked} CRD defaults checked");
}

/// The typed object of a minimal value (`None`: a kind or version sluice
/// does not read). Where sluice's types want a field the schema leaves
/// optional (TLSRoute's `hostnames` before v1), it is filled in from the
/// schema and the value tried again.
fn typed_minimal(
    schema: &Value,
    kind: &str,
    api_version: &str,
    mut value: Value,
) -> Option<crate::resources::Object> {
    for _ in 0..8 {
        match typed_object(kind, api_version, value.clone())? {
            Ok(object) => return Some(object),
            Err((path, message)) => {
                let missing = message
                    .strip_prefix("missing field `")
                    .and_then(|m| m.split('`').next())
                    .unwrap_or_else(|| panic!("{kind} {api_version}: minimal object: {message}"));
                let mut node = &mut value;
                let mut node_schema = schema;
                for step in path
                    .as_deref()
                    .unwrap_or("")
                    .split('.')
                    .filter(|s| !s.is_empty())
                {
                    node = &mut node[step];
                    node_schema = &node_schema["properties"][step];
                }
                node[missing] = minimal(&node_schema["properties"][missing]);
            }
        }
    }
    panic!("{kind} {api_version}: no minimal object fits sluice's types");
}

fn object_json(object: &crate::resources::Object) -> Value {
    use crate::resources::Object;
    match object {
        Object::GatewayClass(o) => serde_json::to_value(o),
        Object::Gateway(o) => serde_json::to_value(o),
        Object::HttpRoute(o) => serde_json::to_value(&**o),
        Object::ReferenceGrant(o) => serde_json::to_value(o),
        Object::ListenerSet(o) => serde_json::to_value(o),
        Object::BackendTlsPolicy(o) => serde_json::to_value(o),
        Object::GrpcRoute(o) => serde_json::to_value(o),
        Object::TlsRoute(o) => serde_json::to_value(o),
        Object::RolloutPolicy(o) => serde_json::to_value(o),
        other => panic!("not a Gateway API kind: {}", other.kind()),
    }
    .expect("typed objects serialize")
}

#[test]
fn parent_refs_get_group_and_kind_backend_refs_weight_and_kind() {
    let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\n\
                spec:\n  parentRefs: [{name: gw}]\n  rules:\n  - backendRefs: [{name: a, port: 80}]\n    \
                matches: [{headers: [{name: x, value: y}]}]\n";
    let parsed = crate::resources::parse_manifests(text, "r.yaml");
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let value = object_json(&parsed.objects[0].object);
    assert_eq!(
        value["spec"]["parentRefs"][0],
        json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"})
    );
    assert_eq!(
        value["spec"]["rules"][0]["backendRefs"][0],
        json!({"group": "", "kind": "Service", "name": "a", "port": 80, "weight": 1})
    );
    assert_eq!(
        value["spec"]["rules"][0]["matches"][0],
        json!({"headers": [{"name": "x", "type": "Exact", "value": "y"}],
               "path": {"type": "PathPrefix", "value": "/"}})
    );
}

#[test]
fn explicit_values_are_kept() {
    let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\n\
                spec:\n  parentRefs: [{name: s, kind: ListenerSet, group: gateway.networking.k8s.io}]\n  \
                rules:\n  - backendRefs: [{name: a, port: 80, weight: 0}]\n";
    let parsed = crate::resources::parse_manifests(text, "r.yaml");
    let value = object_json(&parsed.objects[0].object);
    assert_eq!(value["spec"]["parentRefs"][0]["kind"], "ListenerSet");
    assert_eq!(value["spec"]["rules"][0]["backendRefs"][0]["weight"], 0);
}
