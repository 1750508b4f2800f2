//! A CRD version's `openAPIV3Schema`, read once into a tree that the
//! validator walks: the structural parts (type, properties, items,
//! additionalProperties), the value validations, the defaults, the
//! `x-kubernetes-*` extensions and the compiled CEL rules.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::Value;

use super::cel::CelRule;

/// One schema node.
#[derive(Debug, Default)]
pub(crate) struct Schema {
    /// `object`, `array`, `string`, `integer`, `number`, `boolean`.
    pub ty: Option<String>,
    pub properties: BTreeMap<String, Schema>,
    /// `additionalProperties`: the schema of a map's values.
    pub additional: Option<Box<Schema>>,
    pub items: Option<Box<Schema>>,
    pub required: Vec<String>,
    pub enumeration: Option<Vec<Value>>,
    /// The pattern as written, and compiled (`None`: Rust's regex syntax
    /// does not accept it, and it is not checked).
    pub pattern: Option<(String, Option<Regex>)>,
    pub format: Option<String>,
    pub minimum: Option<f64>,
    pub exclusive_minimum: bool,
    pub maximum: Option<f64>,
    pub exclusive_maximum: bool,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub min_properties: Option<u64>,
    pub max_properties: Option<u64>,
    pub unique_items: bool,
    pub default: Option<Value>,
    pub nullable: bool,
    pub preserve_unknown: bool,
    pub int_or_string: bool,
    pub embedded_resource: bool,
    /// `x-kubernetes-list-type`: `atomic`, `set` or `map`.
    pub list_type: Option<String>,
    pub list_map_keys: Vec<String>,
    pub all_of: Vec<Schema>,
    pub any_of: Vec<Schema>,
    pub one_of: Vec<Schema>,
    pub not: Option<Box<Schema>>,
    /// `x-kubernetes-validations`.
    pub rules: Vec<CelRule>,
}

/// What reading a schema's rules and patterns found, for the report.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RuleStats {
    /// CEL rules that compiled and are evaluated.
    pub compiled: usize,
    /// Rules (or patterns) that could not be compiled: `(rule, error)`.
    /// They are not evaluated.
    pub failed: Vec<(String, String)>,
    /// Transition rules (they use `oldSelf`): evaluated only on an update,
    /// and a file has no previous version, so never (as on a create).
    pub transition: usize,
}

impl Schema {
    pub fn parse(v: &Value, stats: &mut RuleStats) -> Schema {
        let str_of = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let u64_of = |k: &str| v.get(k).and_then(Value::as_u64);
        let bool_of = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
        let strings = |k: &str| -> Vec<String> {
            let items = v.get(k).and_then(Value::as_array).into_iter().flatten();
            items
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        };
        let list = |k: &str, stats: &mut RuleStats| -> Vec<Schema> {
            v.get(k)
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|s| Schema::parse(s, stats)).collect())
                .unwrap_or_default()
        };
        let properties = v
            .get("properties")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, s)| (k.clone(), Schema::parse(s, stats)))
                    .collect()
            })
            .unwrap_or_default();
        let additional = match v.get("additionalProperties") {
            Some(Value::Object(_)) => {
                Some(Box::new(Schema::parse(&v["additionalProperties"], stats)))
            }
            Some(Value::Bool(true)) => Some(Box::new(Schema {
                preserve_unknown: true,
                ..Schema::default()
            })),
            _ => None,
        };
        let pattern = str_of("pattern").map(|p| {
            let compiled = Regex::new(&p);
            if let Err(e) = &compiled {
                stats.failed.push((format!("pattern: {p}"), e.to_string()));
            }
            (p, compiled.ok())
        });
        let rules = v
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
            .map(|rules| rules.iter().map(|r| CelRule::compile(r, stats)).collect())
            .unwrap_or_default();
        Schema {
            ty: str_of("type"),
            properties,
            additional,
            items: v
                .get("items")
                .filter(|i| i.is_object())
                .map(|i| Box::new(Schema::parse(i, stats))),
            required: strings("required"),
            enumeration: v.get("enum").and_then(Value::as_array).cloned(),
            pattern,
            format: str_of("format"),
            minimum: v.get("minimum").and_then(Value::as_f64),
            exclusive_minimum: bool_of("exclusiveMinimum"),
            maximum: v.get("maximum").and_then(Value::as_f64),
            exclusive_maximum: bool_of("exclusiveMaximum"),
            min_length: u64_of("minLength"),
            max_length: u64_of("maxLength"),
            min_items: u64_of("minItems"),
            max_items: u64_of("maxItems"),
            min_properties: u64_of("minProperties"),
            max_properties: u64_of("maxProperties"),
            unique_items: bool_of("uniqueItems"),
            default: v.get("default").cloned(),
            nullable: bool_of("nullable"),
            preserve_unknown: bool_of("x-kubernetes-preserve-unknown-fields"),
            int_or_string: bool_of("x-kubernetes-int-or-string"),
            embedded_resource: bool_of("x-kubernetes-embedded-resource"),
            list_type: str_of("x-kubernetes-list-type"),
            list_map_keys: strings("x-kubernetes-list-map-keys"),
            all_of: list("allOf", stats),
            any_of: list("anyOf", stats),
            one_of: list("oneOf", stats),
            not: v
                .get("not")
                .filter(|n| n.is_object())
                .map(|n| Box::new(Schema::parse(n, stats))),
            rules,
        }
    }

    /// The type name CEL errors print as the offending value
    /// (`Invalid value: "object": ...`).
    pub fn type_name(&self) -> &str {
        self.ty.as_deref().unwrap_or("")
    }
}
