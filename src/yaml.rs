//! YAML in and out, in one place: which crate, with which options, and the
//! line of every node so that errors can point at the field at fault.
//!
//! The crate is `serde-saphyr` (`serde_yaml` is archived upstream): it is
//! maintained, has no `unsafe` and is fuzzed not to panic on malformed
//! input, and it reports the line and column of syntax errors and of every
//! node (its `Spanned` wrapper), which is what turns `spec.rules[0].
//! backendRefs[1].weight` into a line number for `sluice check`.
//!
//! Values are read with YAML 1.2's core schema, as `serde_yaml` read them
//! (`yes`, `on` and `0755` stay strings), so a manifest means what it meant
//! before the change of crate.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde::de::{Deserialize, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_saphyr::Spanned;

/// A YAML syntax error (or text that has no JSON equivalent), with the line
/// it was found on (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for YamlError {}

impl From<serde_saphyr::Error> for YamlError {
    fn from(e: serde_saphyr::Error) -> Self {
        let line = e
            .location()
            .map_or(1, |l| usize::try_from(l.line()).unwrap_or(1).max(1));
        YamlError {
            line,
            message: e.without_snippet().to_string(),
        }
    }
}

/// The reading options: YAML 1.2 booleans and numbers (see the module doc),
/// and a budget sized for configurations rather than for one document.
fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        budget: Some(budget()),
    }
}

/// serde-saphyr's default budget caps a stream at 1,024 documents and
/// 250,000 nodes: one file of 2,000 HTTPRoutes (or the 10,000 of the scale
/// bench) would be refused as a whole. What the budget is for, alias and
/// anchor expansion (a few bytes that expand to gigabytes), keeps the
/// crate's limits; the counts that only grow with the file's size are
/// raised so that a file's size is its limit, as it was with serde_yaml.
fn budget() -> serde_saphyr::Budget {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_documents = 10_000_000;
    budget.max_nodes = 100_000_000;
    budget.max_events = 400_000_000;
    budget.max_total_scalar_bytes = 1 << 32;
    budget
}

/// One YAML document as JSON, with the line of each of its nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// First line of the document's content (1-based).
    pub line: usize,
    pub value: Value,
    pub lines: Lines,
}

/// The line of every node of a document, to name the line of a field path.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Lines {
    line: usize,
    children: Children,
}

#[derive(Debug, Clone, PartialEq, Default)]
enum Children {
    #[default]
    None,
    Items(Vec<Lines>),
    Fields(BTreeMap<String, Lines>),
}

impl Lines {
    /// Lines known only for the document as a whole (JSON input).
    pub fn whole(line: usize) -> Lines {
        Lines {
            line,
            children: Children::None,
        }
    }

    /// The line of the field at `path` (`spec.rules[0].backendRefs[1].weight`,
    /// `metadata.labels[app.kubernetes.io/name]`), or of its nearest
    /// ancestor that exists (a missing required field is reported on the
    /// line of the object that lacks it).
    pub fn of(&self, path: &str) -> usize {
        let mut node = self;
        for segment in path_segments(path) {
            let next = match (&node.children, segment) {
                (Children::Items(items), Segment::Index(i)) => items.get(i),
                (Children::Fields(fields), Segment::Key(k)) => fields.get(k),
                (Children::Fields(fields), Segment::Index(i)) => fields.get(&i.to_string()),
                _ => None,
            };
            match next {
                Some(n) => node = n,
                None => break,
            }
        }
        node.line
    }

    /// The lines of the `i`th item of this node (a `kind: List`'s items).
    pub fn item(&self, i: usize) -> Option<&Lines> {
        match &self.children {
            Children::Items(items) => items.get(i),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

/// `a.b[0][x.y].c` -> `a`, `b`, `0`, `x.y`, `c`.
fn path_segments(path: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']').unwrap_or(after.len());
            let inner = &after[..end];
            out.push(match inner.parse::<usize>() {
                Ok(i) => Segment::Index(i),
                Err(_) => Segment::Key(inner),
            });
            rest = after.get(end + 1..).unwrap_or("");
        } else if let Some(after) = rest.strip_prefix('.') {
            rest = after;
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            out.push(Segment::Key(&rest[..end]));
            rest = &rest[end..];
        }
    }
    out
}

/// Every non-empty document of `text`, in order.
pub fn documents(text: &str) -> Result<Vec<Document>, YamlError> {
    let nodes: Vec<Spanned<Node>> = serde_saphyr::from_multiple_with_options(text, options())?;
    nodes
        .into_iter()
        .map(|node| {
            let line = line_of(&node);
            let (value, lines) = convert(node)?;
            Ok(Document { line, value, lines })
        })
        .collect()
}

/// One value from YAML text (a single document).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    Ok(serde_saphyr::from_str_with_options(text, options())?)
}

/// YAML text of a value: block style, long strings kept on one line,
/// multi-line strings as literal blocks.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, YamlError> {
    let options = serde_saphyr::ser_options! {
        folded_wrap_chars: usize::MAX,
    };
    serde_saphyr::to_string_with_options(value, options).map_err(|e| YamlError {
        line: 1,
        message: e.to_string(),
    })
}

/// A YAML node as read, before it becomes JSON: the `Spanned` wrapper of
/// each item and field value carries its line.
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    String(String),
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(String, Spanned<Node>)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
                Ok(Node::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Int(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
                Ok(Node::UInt(v))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Node, E> {
                Ok(Node::String(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Node, E> {
                Ok(Node::String(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<Spanned<Node>>()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut fields = Vec::new();
                while let Some(entry) = map.next_entry::<KeyText, Spanned<Node>>()? {
                    fields.push((entry.0.0, entry.1));
                }
                Ok(Node::Map(fields))
            }
        }
        deserializer.deserialize_any(NodeVisitor)
    }
}

/// A mapping key as text: JSON objects have string keys, so `80: x` and
/// `true: x` become `"80"` and `"true"`, as they did with `serde_yaml`.
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = KeyText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar mapping key")
            }
            fn visit_unit<E>(self) -> Result<KeyText, E> {
                Ok(KeyText("null".into()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_str<E>(self, v: &str) -> Result<KeyText, E> {
                Ok(KeyText(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<KeyText, E> {
                Ok(KeyText(v))
            }
        }
        deserializer.deserialize_any(KeyVisitor)
    }
}

fn line_of(node: &Spanned<Node>) -> usize {
    usize::try_from(node.referenced.line()).unwrap_or(0).max(1)
}

fn convert(node: Spanned<Node>) -> Result<(Value, Lines), YamlError> {
    let line = line_of(&node);
    let leaf = |value: Value| {
        Ok((
            value,
            Lines {
                line,
                children: Children::None,
            },
        ))
    };
    match node.value {
        Node::Null => leaf(Value::Null),
        Node::Bool(b) => leaf(Value::Bool(b)),
        Node::Int(i) => leaf(Value::from(i)),
        Node::UInt(u) => leaf(Value::from(u)),
        Node::Float(f) => match serde_json::Number::from_f64(f) {
            Some(n) => leaf(Value::Number(n)),
            None => Err(YamlError {
                line,
                message: format!("{f} has no JSON equivalent"),
            }),
        },
        Node::String(s) => leaf(Value::String(s)),
        Node::Seq(items) => {
            let mut values = Vec::with_capacity(items.len());
            let mut lines = Vec::with_capacity(items.len());
            for item in items {
                let (v, l) = convert(item)?;
                values.push(v);
                lines.push(l);
            }
            Ok((
                Value::Array(values),
                Lines {
                    line,
                    children: Children::Items(lines),
                },
            ))
        }
        Node::Map(fields) => {
            let mut values = serde_json::Map::new();
            let mut lines = BTreeMap::new();
            for (key, field) in fields {
                let (v, l) = convert(field)?;
                values.insert(key.clone(), v);
                lines.insert(key, l);
            }
            Ok((
                Value::Object(values),
                Lines {
                    line,
                    children: Children::Fields(lines),
                },
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration in one file with more documents than
    /// serde-saphyr's default budget allows (1,024).
    #[test]
    fn a_file_of_thousands_of_documents_is_read() {
        let route = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  \
                     name: r\nspec:\n  rules:\n  - matches:\n    - path: {type: PathPrefix, \
                     value: /a}\n    backendRefs:\n    - {name: a, port: 80, weight: 1}\n";
        let text = vec![route; 2_000].join("---\n");
        let docs = documents(&text).expect("2,000 documents are read");
        assert_eq!(docs.len(), 2_000);
        assert_eq!(docs[1_999].value["kind"], "HTTPRoute");
    }

    #[test]
    fn documents_carry_their_first_line_and_every_field_line() {
        let text = "# comment\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  \
                    labels: {app.kubernetes.io/name: x}\nspec:\n  ports:\n  - port: 80\n    \
                    name: http\n---\n\n---\na: 1\n";
        let docs = documents(text).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].line, 3);
        assert_eq!(docs[0].value["spec"]["ports"][0]["port"], 80);
        let lines = &docs[0].lines;
        assert_eq!(lines.of("metadata.name"), 6);
        assert_eq!(lines.of("metadata.labels[app.kubernetes.io/name]"), 7);
        assert_eq!(lines.of("spec.ports[0].name"), 11);
        // A field that is not there: the line of its nearest ancestor.
        assert_eq!(lines.of("spec.ports[0].targetPort"), 10);
        assert_eq!(lines.of("spec.ports[7]"), 10);
        assert_eq!(docs[1].line, 15);
    }

    #[test]
    fn values_are_read_with_yaml_1_2_core_schema() {
        let docs = documents("a: yes\nb: on\nc: 0755\nd: true\ne: 1.5\nf: ~\n80: port\n").unwrap();
        assert_eq!(
            docs[0].value,
            serde_json::json!({"a": "yes", "b": "on", "c": "0755", "d": true, "e": 1.5, "f": null, "80": "port"})
        );
    }

    #[test]
    fn syntax_errors_name_their_line() {
        let e = documents("a: 1\nb:\n  c: [1, 2\n").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        let e = documents("a: 1\na: 2\n").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("duplicate"), "{e}");
    }

    #[test]
    fn written_yaml_reads_back_the_same() {
        let value = serde_json::json!({"message": "a: b ".repeat(40), "multi": "a\nb\n", "n": 1, "s": "true"});
        let text = to_string(&value).unwrap();
        assert!(
            !text.contains(">-"),
            "long strings stay on one line: {text}"
        );
        assert_eq!(from_str::<Value>(&text).unwrap(), value);
    }
}
