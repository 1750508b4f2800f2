//! Field errors worded as the API server words them
//! (`k8s.io/apimachinery/pkg/util/validation/field`): `spec.x: Invalid
//! value: "abc": <detail>`, `spec.y: Required value`, `spec.z: Unsupported
//! value: "Foo": supported values: "A", "B"`, `spec.w: Too many: 17: must
//! have at most 16 items`.

use std::fmt;

use serde_json::Value;

/// A path in an object: `spec.rules[0].matches[1]`, `metadata.labels[a/b]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldPath(String);

impl FieldPath {
    pub fn root() -> FieldPath {
        FieldPath(String::new())
    }

    pub fn child(&self, name: &str) -> FieldPath {
        if self.0.is_empty() {
            FieldPath(name.to_string())
        } else {
            FieldPath(format!("{}.{name}", self.0))
        }
    }

    pub fn index(&self, i: usize) -> FieldPath {
        FieldPath(format!("{}[{i}]", self.0))
    }

    pub fn key(&self, key: &str) -> FieldPath {
        FieldPath(format!("{}[{key}]", self.0))
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FieldPath {
    /// The root prints as the API server prints a nil path: `<nil>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("<nil>")
        } else {
            f.write_str(&self.0)
        }
    }
}

/// The kind of a field error (`field.ErrorType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    Required,
    Forbidden,
    TooLong,
    Internal,
    Invalid,
    /// A value of the wrong type: prints as `Invalid value`, but blocks the
    /// CEL rules like the others below.
    TypeInvalid,
    NotSupported,
    TooMany,
    Duplicate,
    /// A field the schema does not have (strict field validation): the
    /// body is only the detail, `unknown field "spec.x"`.
    UnknownField,
}

impl ErrorType {
    fn text(self) -> &'static str {
        match self {
            ErrorType::Required => "Required value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
            ErrorType::Internal => "Internal error",
            ErrorType::Invalid | ErrorType::TypeInvalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::TooMany => "Too many",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::UnknownField => "",
        }
    }

    /// The API server skips CEL rules when the schema found one of these:
    /// the object does not have the shape its rules were written for.
    pub fn blocks_rules(self) -> bool {
        matches!(
            self,
            ErrorType::NotSupported
                | ErrorType::Required
                | ErrorType::TooLong
                | ErrorType::TooMany
                | ErrorType::TypeInvalid
        )
    }
}

/// The offending value as the error prints it.
#[derive(Debug, Clone, PartialEq)]
pub enum BadValue {
    /// Printed as Go prints the JSON value (`"abc"`, `80`, `true`, `null`).
    Json(Value),
    /// A count (`Too many: 17`).
    Count(usize),
}

/// One problem with one field.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub path: FieldPath,
    pub kind: ErrorType,
    pub value: Option<BadValue>,
    pub detail: String,
}

impl FieldError {
    pub fn new(path: FieldPath, kind: ErrorType, value: Option<BadValue>, detail: String) -> Self {
        FieldError {
            path,
            kind,
            value,
            detail,
        }
    }

    pub fn required(path: FieldPath, detail: &str) -> Self {
        Self::new(path, ErrorType::Required, None, detail.to_string())
    }

    pub fn invalid(path: FieldPath, value: &Value, detail: String) -> Self {
        Self::new(
            path,
            ErrorType::Invalid,
            Some(BadValue::Json(value.clone())),
            detail,
        )
    }

    /// What follows the path: `Invalid value: "abc": <detail>`.
    pub fn body(&self) -> String {
        if self.kind == ErrorType::UnknownField {
            return self.detail.clone();
        }
        let mut s = self.kind.text().to_string();
        let shows_value = !matches!(
            self.kind,
            ErrorType::Required | ErrorType::Forbidden | ErrorType::TooLong | ErrorType::Internal
        );
        if shows_value {
            s.push_str(": ");
            match &self.value {
                Some(BadValue::Count(n)) => s.push_str(&n.to_string()),
                Some(BadValue::Json(v)) => s.push_str(&go_value(v)),
                None => s.push_str(r#""null""#),
            }
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.body())
    }
}

/// A JSON value as `field.Error` prints a decoded (unstructured) value:
/// strings and scalars simply, a nil as `"null"`, maps and lists the way
/// Go's `%#v` does.
pub fn go_value(v: &Value) -> String {
    match v {
        Value::String(s) => go_quote(s),
        Value::Null => r#""null""#.into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other => go_sharp_v(other),
    }
}

fn go_sharp_v(v: &Value) -> String {
    match v {
        Value::Null => "interface {}(nil)".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => go_quote(s),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(go_sharp_v).collect();
            format!("[]interface {{}}{{{}}}", inner.join(", "))
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", go_quote(k), go_sharp_v(&map[k])))
                .collect();
            format!("map[string]interface {{}}{{{}}}", inner.join(", "))
        }
    }
}

/// Go's `%q`: double quotes, backslash escapes for quotes, backslashes and
/// control characters.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bodies_are_worded_as_the_api_server_words_them() {
        let p = FieldPath::root().child("spec").child("rules").index(0);
        assert_eq!(
            FieldError::invalid(p.child("name"), &json!("a b"), "bad".into()).to_string(),
            r#"spec.rules[0].name: Invalid value: "a b": bad"#
        );
        assert_eq!(
            FieldError::required(p.child("name"), "").to_string(),
            "spec.rules[0].name: Required value"
        );
        let too_many = FieldError::new(
            FieldPath::root().child("spec").child("rules"),
            ErrorType::TooMany,
            Some(BadValue::Count(17)),
            "must have at most 16 items".into(),
        );
        assert_eq!(
            too_many.to_string(),
            "spec.rules: Too many: 17: must have at most 16 items"
        );
        let note = FieldError::invalid(FieldPath::root(), &Value::Null, "x".into());
        assert_eq!(note.to_string(), r#"<nil>: Invalid value: "null": x"#);
        assert_eq!(
            go_value(&json!({"name": "a", "port": 80})),
            r#"map[string]interface {}{"name":"a", "port":80}"#
        );
    }
}
