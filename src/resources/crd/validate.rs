//! What the API server does to a custom resource before storing it, in its
//! order: unknown fields, nulls and defaults, the OpenAPI schema (worded as
//! kube-openapi words its errors), list types, then the CEL rules unless the
//! schema already found the object misshapen.
//!
//! Unknown fields are refused (`unknown field "spec.x"`), as `kubectl
//! apply` has them refused by default (its `--validate=strict`, the API
//! server's strict field validation). Without strict validation the API
//! server prunes them instead; refusing is the answer a user applying the
//! file gets, and it names the typo a pruned field would hide.

use std::collections::BTreeSet;

use serde_json::Value;

use super::cel::{Verdict, context, to_cel};
use super::errors::{BadValue, ErrorType, FieldError, FieldPath, go_quote};
use super::schema::Schema;

/// Refuse unknown fields, apply nulls and defaults, and validate `value` (a
/// whole object, `resource`, or a part such as its `status`, at `base`)
/// against `schema`. `value` is left defaulted.
pub(crate) fn admit(
    schema: &Schema,
    value: &mut Value,
    resource: bool,
    base: &FieldPath,
) -> Vec<FieldError> {
    let root = resource;
    let mut errors = Vec::new();
    unknown_fields(schema, value, base, root, &mut errors);
    if !errors.is_empty() {
        // Strict decoding fails before anything is validated.
        return errors;
    }
    default(schema, value, root);
    check(schema, value, base, &mut errors);
    list_types(schema, value, base, &mut errors);
    if errors.iter().any(|e| e.kind.blocks_rules()) {
        errors.push(FieldError::new(
            FieldPath::root(),
            ErrorType::Invalid,
            None,
            "some validation rules were not checked because the object was invalid; \
             correct the existing errors to complete validation"
                .into(),
        ));
    } else {
        let ctx = context();
        rules(schema, value, base, root, &ctx, &mut errors);
    }
    let mut seen = BTreeSet::new();
    errors.retain(|e| seen.insert(e.to_string()));
    errors
}

/// The fields every object and embedded resource has, whatever its schema.
const OBJECT_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

fn unknown_fields(
    schema: &Schema,
    value: &Value,
    path: &FieldPath,
    resource: bool,
    errors: &mut Vec<FieldError>,
) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let child = path.child(k);
                if resource && OBJECT_FIELDS.contains(&k.as_str()) {
                    if k != "metadata"
                        && let Some(p) = schema.properties.get(k)
                    {
                        unknown_fields(p, v, &child, false, errors);
                    }
                    continue;
                }
                if let Some(p) = schema.properties.get(k) {
                    unknown_fields(p, v, &child, p.embedded_resource, errors);
                } else if let Some(a) = &schema.additional {
                    unknown_fields(a, v, &path.key(k), a.embedded_resource, errors);
                } else if !schema.preserve_unknown && !schema.int_or_string {
                    // `kubectl apply`'s strict decoding error, per field.
                    let detail = format!("unknown field {}", go_quote(child.as_str()));
                    errors.push(FieldError::new(
                        child,
                        ErrorType::UnknownField,
                        None,
                        detail,
                    ));
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = &schema.items {
                for (i, v) in items.iter().enumerate() {
                    unknown_fields(item, v, &path.index(i), item.embedded_resource, errors);
                }
            }
        }
        _ => {}
    }
}

/// Nulls of non-nullable fields are dropped or replaced by the default;
/// absent fields with a default get it; then each present child in turn.
fn default(schema: &Schema, value: &mut Value, resource: bool) {
    match value {
        Value::Object(map) => {
            for (k, p) in &schema.properties {
                if resource && k == "metadata" {
                    continue;
                }
                match map.get(k) {
                    None => {
                        if let Some(d) = &p.default {
                            map.insert(k.clone(), d.clone());
                        }
                    }
                    Some(Value::Null) if !p.nullable => match &p.default {
                        Some(d) => {
                            map.insert(k.clone(), d.clone());
                        }
                        None => {
                            map.remove(k);
                        }
                    },
                    Some(_) => {}
                }
            }
            for (k, v) in map.iter_mut() {
                if resource && k == "metadata" {
                    continue;
                }
                if let Some(p) = schema.properties.get(k) {
                    default(p, v, p.embedded_resource);
                } else if let Some(a) = &schema.additional {
                    default(a, v, a.embedded_resource);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = &schema.items {
                for v in items.iter_mut() {
                    default(item, v, item.embedded_resource);
                }
            }
        }
        _ => {}
    }
}

/// The JSON type of a value, as the schema names types.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(schema: &Schema, v: &Value) -> bool {
    if schema.int_or_string {
        return matches!(json_type(v), "integer" | "string")
            || v.as_f64().is_some_and(|f| f.fract() == 0.0);
    }
    match schema.ty.as_deref() {
        None | Some("") => true,
        Some("integer") => {
            json_type(v) == "integer" || v.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        Some("number") => v.is_number(),
        Some(t) => json_type(v) == t,
    }
}

/// A bound as kube-openapi prints it: `1000000`, not `1e+06`.
fn bound(b: f64) -> String {
    if b.fract() == 0.0 && b.abs() < 1e15 {
        format!("{}", b as i64)
    } else {
        format!("{b}")
    }
}

/// The OpenAPI value validations. Errors name the field and say what
/// kube-openapi says (`<path> in body should ...`).
fn check(schema: &Schema, v: &Value, path: &FieldPath, errors: &mut Vec<FieldError>) {
    let name = path.as_str();
    if v.is_null() {
        if !schema.nullable && (schema.ty.is_some() || schema.int_or_string) {
            let ty = schema.ty.as_deref().unwrap_or("integer,string");
            errors.push(FieldError::new(
                path.clone(),
                ErrorType::TypeInvalid,
                Some(BadValue::Json(Value::String("null".into()))),
                format!("{name} in body must be of type {ty}: \"null\""),
            ));
        }
        return;
    }
    if !type_matches(schema, v) {
        let ty = schema.ty.as_deref().unwrap_or("integer,string");
        let actual = json_type(v);
        errors.push(FieldError::new(
            path.clone(),
            ErrorType::TypeInvalid,
            Some(BadValue::Json(Value::String(actual.into()))),
            format!("{name} in body must be of type {ty}: \"{actual}\""),
        ));
        return;
    }

    composites(schema, v, path, errors);

    if let Value::String(s) = v {
        let chars = s.chars().count() as u64;
        if let Some(max) = schema.max_length
            && chars > max
        {
            errors.push(FieldError::new(
                path.clone(),
                ErrorType::TooLong,
                None,
                format!("may not be longer than {max}"),
            ));
        }
        if let Some(min) = schema.min_length
            && chars < min
        {
            errors.push(FieldError::invalid(
                path.clone(),
                v,
                format!("{name} in body should be at least {min} chars long"),
            ));
        }
        if let Some((pattern, Some(re))) = &schema.pattern
            && !re.is_match(s)
        {
            errors.push(FieldError::invalid(
                path.clone(),
                v,
                format!("{name} in body should match '{pattern}'"),
            ));
        }
        if let Some(format) = &schema.format
            && !format_holds(format, s)
        {
            errors.push(FieldError::new(
                path.clone(),
                ErrorType::TypeInvalid,
                Some(BadValue::Json(v.clone())),
                format!("{name} in body must be of type {format}: {}", go_quote(s)),
            ));
        }
    }

    if let Some(n) = v.as_f64().filter(|_| v.is_number()) {
        // (limit, exclusive, whether n is beyond it, the message's words)
        let limits = [
            schema.maximum.map(|max| {
                let beyond = if schema.exclusive_maximum {
                    n >= max
                } else {
                    n > max
                };
                (max, schema.exclusive_maximum, beyond, "less than")
            }),
            schema.minimum.map(|min| {
                let beyond = if schema.exclusive_minimum {
                    n <= min
                } else {
                    n < min
                };
                (min, schema.exclusive_minimum, beyond, "greater than")
            }),
        ];
        for (limit, exclusive, _, words) in limits.into_iter().flatten().filter(|l| l.2) {
            let or_equal = if exclusive { "" } else { " or equal to" };
            errors.push(FieldError::invalid(
                path.clone(),
                v,
                format!(
                    "{name} in body should be {words}{or_equal} {}",
                    bound(limit)
                ),
            ));
        }
    }

    if let Value::Array(items) = v {
        if let Some(min) = schema.min_items
            && (items.len() as u64) < min
        {
            errors.push(FieldError::invalid(
                path.clone(),
                &Value::from(items.len()),
                format!("{name} in body should have at least {min} items"),
            ));
        }
        if let Some(max) = schema.max_items
            && (items.len() as u64) > max
        {
            errors.push(FieldError::new(
                path.clone(),
                ErrorType::TooMany,
                Some(BadValue::Count(items.len())),
                format!("must have at most {max} items"),
            ));
        }
        if schema.unique_items && has_duplicates(items) {
            errors.push(FieldError::invalid(
                path.clone(),
                v,
                format!("{name} in body shouldn't contain duplicates"),
            ));
        }
        if let Some(item) = &schema.items {
            for (i, x) in items.iter().enumerate() {
                check(item, x, &path.index(i), errors);
            }
        }
    }

    if let Some(allowed) = &schema.enumeration
        && !allowed.contains(v)
    {
        let values: Vec<String> = allowed
            .iter()
            .map(|a| match a {
                Value::String(s) => go_quote(s),
                other => go_quote(&other.to_string()),
            })
            .collect();
        errors.push(FieldError::new(
            path.clone(),
            ErrorType::NotSupported,
            Some(BadValue::Json(v.clone())),
            format!("supported values: {}", values.join(", ")),
        ));
    }

    if let Value::Object(map) = v {
        for r in &schema.required {
            if !map.contains_key(r) {
                errors.push(FieldError::required(path.child(r), ""));
            }
        }
        if let Some(max) = schema.max_properties
            && (map.len() as u64) > max
        {
            errors.push(FieldError::new(
                path.clone(),
                ErrorType::TooMany,
                Some(BadValue::Count(map.len())),
                format!("must have at most {max} items"),
            ));
        }
        if let Some(min) = schema.min_properties
            && (map.len() as u64) < min
        {
            errors.push(FieldError::invalid(
                path.clone(),
                &Value::from(map.len()),
                format!("{name} in body should have at least {min} properties"),
            ));
        }
        for (k, x) in map {
            if path.is_root() && k == "metadata" {
                continue;
            }
            if let Some(p) = schema.properties.get(k) {
                check(p, x, &path.child(k), errors);
            } else if let Some(a) = &schema.additional {
                check(a, x, &path.key(k), errors);
            }
        }
    }
}

/// `allOf`, `anyOf`, `oneOf`, `not`: kube-openapi reports a failure as a
/// message about the whole object (`"<path>" must validate ...`) and the
/// errors of the alternative that came closest.
fn composites(schema: &Schema, v: &Value, path: &FieldPath, errors: &mut Vec<FieldError>) {
    let run = |s: &Schema| {
        let mut e = Vec::new();
        check(s, v, path, &mut e);
        e
    };
    let whole = |message: String| {
        FieldError::new(
            FieldPath::root(),
            ErrorType::Invalid,
            Some(BadValue::Json(Value::String(String::new()))),
            message,
        )
    };
    // kube-openapi keeps the errors of the alternative with the most
    // checks passed; the properties it validated are the measure here.
    let best = |alternatives: &[Schema], results: Vec<Vec<FieldError>>| {
        alternatives
            .iter()
            .zip(results)
            .map(|(s, errs)| {
                let passed = s
                    .properties
                    .keys()
                    .filter(|k| v.get(k.as_str()).is_some())
                    .filter(|k| {
                        let p = path.child(k);
                        !errs.iter().any(|e| e.path.as_str().starts_with(p.as_str()))
                    })
                    .count();
                (passed, errs)
            })
            .max_by(|(pa, ea), (pb, eb)| pa.cmp(pb).then(eb.len().cmp(&ea.len())))
            .map(|(_, errs)| errs)
            .unwrap_or_default()
    };
    for s in &schema.all_of {
        errors.extend(run(s));
    }
    if !schema.any_of.is_empty() {
        let results: Vec<Vec<FieldError>> = schema.any_of.iter().map(run).collect();
        if results.iter().all(|r| !r.is_empty()) {
            errors.push(whole(format!(
                "{} must validate at least one schema (anyOf)",
                go_quote(path.as_str())
            )));
            errors.extend(best(&schema.any_of, results));
        }
    }
    if !schema.one_of.is_empty() {
        let results: Vec<Vec<FieldError>> = schema.one_of.iter().map(run).collect();
        let valid = results.iter().filter(|r| r.is_empty()).count();
        if valid != 1 {
            let detail = if valid == 0 {
                "Found none valid".to_string()
            } else {
                format!("Found {valid} valid alternatives")
            };
            errors.push(whole(format!(
                "{} must validate one and only one schema (oneOf). {detail}",
                go_quote(path.as_str())
            )));
            if valid == 0 {
                errors.extend(best(&schema.one_of, results));
            }
        }
    }
    if let Some(not) = &schema.not
        && run(not).is_empty()
    {
        errors.push(whole(format!(
            "{} must not validate the schema (not)",
            go_quote(path.as_str())
        )));
    }
}

fn has_duplicates(items: &[Value]) -> bool {
    items
        .iter()
        .enumerate()
        .any(|(i, a)| items[..i].contains(a))
}

/// The formats kube-openapi checks that the Gateway API CRDs use (and a
/// few more); others are not checked, as kube-openapi ignores formats it
/// does not know.
fn format_holds(format: &str, s: &str) -> bool {
    match format {
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "date-time" | "datetime" => s.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
        "date" => s.parse::<k8s_openapi::jiff::civil::Date>().is_ok(),
        "cidr" => s.split_once('/').is_some_and(|(ip, bits)| {
            ip.parse::<std::net::IpAddr>().is_ok() && bits.parse::<u8>().is_ok()
        }),
        "uuid" => {
            let parts: Vec<&str> = s.split('-').collect();
            parts.len() == 5
                && parts
                    .iter()
                    .zip([8, 4, 4, 4, 12])
                    .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
        }
        _ => true,
    }
}

/// `x-kubernetes-list-type: set` and `map`: no two items (or no two items
/// with the same key fields) alike.
fn list_types(schema: &Schema, v: &Value, path: &FieldPath, errors: &mut Vec<FieldError>) {
    match v {
        Value::Array(items) => {
            match schema.list_type.as_deref() {
                Some("set") => {
                    for (i, x) in items.iter().enumerate() {
                        if items[..i].contains(x) {
                            errors.push(FieldError::new(
                                path.index(i),
                                ErrorType::Duplicate,
                                Some(BadValue::Json(x.clone())),
                                String::new(),
                            ));
                        }
                    }
                }
                Some("map") if !schema.list_map_keys.is_empty() => {
                    let key_of = |x: &Value| {
                        let mut key = serde_json::Map::new();
                        for k in &schema.list_map_keys {
                            if let Some(kv) = x.get(k) {
                                key.insert(k.clone(), kv.clone());
                            }
                        }
                        Value::Object(key)
                    };
                    let keys: Vec<Value> = items.iter().map(key_of).collect();
                    for (i, key) in keys.iter().enumerate() {
                        if keys[..i].contains(key) {
                            errors.push(FieldError::new(
                                path.index(i),
                                ErrorType::Duplicate,
                                Some(BadValue::Json(key.clone())),
                                String::new(),
                            ));
                        }
                    }
                }
                _ => {}
            }
            if let Some(item) = &schema.items {
                for (i, x) in items.iter().enumerate() {
                    list_types(item, x, &path.index(i), errors);
                }
            }
        }
        Value::Object(map) => {
            for (k, x) in map {
                if let Some(p) = schema.properties.get(k) {
                    list_types(p, x, &path.child(k), errors);
                } else if let Some(a) = &schema.additional {
                    list_types(a, x, &path.key(k), errors);
                }
            }
        }
        _ => {}
    }
}

/// The CEL rules of every node that has a value, outermost first.
fn rules(
    schema: &Schema,
    v: &Value,
    path: &FieldPath,
    resource: bool,
    ctx: &cel::Context<'_, '_>,
    errors: &mut Vec<FieldError>,
) {
    if v.is_null() {
        return;
    }
    let nodes = std::iter::once(schema).chain(&schema.all_of);
    for node in nodes {
        if node.rules.is_empty() {
            continue;
        }
        let mut scope = ctx.new_inner_scope();
        scope.add_variable_from_value("self", to_cel(v, schema, resource));
        for rule in &node.rules {
            let detail = match rule.evaluate(&scope) {
                Verdict::Holds | Verdict::Skipped => continue,
                Verdict::Fails(message) => message,
                Verdict::Error(message) => {
                    errors.push(FieldError::new(
                        path.clone(),
                        ErrorType::Invalid,
                        Some(BadValue::Json(Value::String(schema.type_name().into()))),
                        message,
                    ));
                    continue;
                }
            };
            let at = match rule.field_path.as_deref() {
                Some(fp) => relative(path, fp),
                None => path.clone(),
            };
            let type_value = Some(BadValue::Json(Value::String(schema.type_name().into())));
            errors.push(match rule.reason.as_deref() {
                Some("FieldValueForbidden") => {
                    FieldError::new(at, ErrorType::Forbidden, None, detail)
                }
                Some("FieldValueRequired") => {
                    FieldError::new(at, ErrorType::Required, None, detail)
                }
                Some("FieldValueDuplicate") => {
                    FieldError::new(at, ErrorType::Duplicate, type_value, String::new())
                }
                _ => FieldError::new(at, ErrorType::Invalid, type_value, detail),
            });
        }
    }
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                if resource && k == "metadata" {
                    continue;
                }
                if let Some(p) = schema.properties.get(k) {
                    rules(p, x, &path.child(k), p.embedded_resource, ctx, errors);
                } else if let Some(a) = &schema.additional {
                    rules(a, x, &path.key(k), a.embedded_resource, ctx, errors);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = &schema.items {
                for (i, x) in items.iter().enumerate() {
                    rules(item, x, &path.index(i), item.embedded_resource, ctx, errors);
                }
            }
        }
        _ => {}
    }
}

/// A rule's `fieldPath` (`.spec.x`, `.a['b.c']`) below the rule's node.
fn relative(path: &FieldPath, field_path: &str) -> FieldPath {
    let mut out = path.clone();
    let mut rest = field_path;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("['") {
            let end = after.find("']").unwrap_or(after.len());
            out = out.child(&after[..end]);
            rest = after.get(end + 2..).unwrap_or("");
        } else if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            out = out.child(&after[..end]);
            rest = &after[end..];
        } else {
            break;
        }
    }
    out
}
