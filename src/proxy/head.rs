//! Header fields as the proxy forwards them, and the request and response
//! heads the codec-independent handler works on.
//!
//! An HTTP/1.1 head is kept as the bytes it arrived in, its fields parsed
//! in place ([`RawFields`]); the route's changes (hop-by-hop removal,
//! `X-Forwarded-*`, header filters, upgrade fields) are a short list of
//! edits applied while the head is written out again, never a header map
//! built and re-encoded per message. HTTP/2 heads (hyper's) and the answers
//! the proxy makes itself are header maps, edited in place. Either way the
//! handler reads and edits fields through one type, [`Fields`]; a header
//! map is built only for a consumer that needs one (hyper, for HTTP/2
//! clients and h2c backends).

use std::ops::Range;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri, Version};

use super::body::{RequestBody, ResponseBody};
use super::tls::TlsConnection;
use super::upgrade::ClientUpgrade;

/// Where one field of a raw head is: name and value, as offsets into its
/// bytes.
#[derive(Debug, Clone)]
pub struct Field {
    pub name: Range<u32>,
    pub value: Range<u32>,
}

impl Field {
    pub fn new(name: Range<usize>, value: Range<usize>) -> Self {
        // Heads are far below 4 GiB (the head limit says so).
        let narrow = |r: Range<usize>| r.start as u32..r.end as u32;
        Field {
            name: narrow(name),
            value: narrow(value),
        }
    }
}

/// One change to a raw head's fields, in the order the route made them.
#[derive(Debug, Clone)]
enum Edit {
    /// Replace every field of the name with this one.
    Set(HeaderName, HeaderValue),
    /// Add a field (after the ones the name has).
    Append(HeaderName, HeaderValue),
    /// Drop every field of the name.
    Remove(HeaderName),
}

impl Edit {
    fn name(&self) -> &HeaderName {
        match self {
            Edit::Set(n, _) | Edit::Append(n, _) | Edit::Remove(n) => n,
        }
    }

    /// Does this edit replace the fields of its name made before it?
    fn replaces(&self) -> bool {
        !matches!(self, Edit::Append(..))
    }
}

/// The fields of a head as received, with the edits made since.
#[derive(Debug, Clone)]
pub struct RawFields {
    /// The head's bytes (fields index into them).
    bytes: Bytes,
    fields: Vec<Field>,
    edits: Vec<Edit>,
}

/// Names equal ignoring ASCII case (`HeaderName`s are lower case).
fn is(raw: &[u8], name: &HeaderName) -> bool {
    raw.eq_ignore_ascii_case(name.as_str().as_bytes())
}

impl RawFields {
    pub fn new(bytes: Bytes, fields: Vec<Field>) -> Self {
        RawFields {
            bytes,
            fields,
            edits: Vec::new(),
        }
    }

    fn name_of(&self, f: &Field) -> &[u8] {
        &self.bytes[f.name.start as usize..f.name.end as usize]
    }

    fn value_of(&self, f: &Field) -> &[u8] {
        &self.bytes[f.value.start as usize..f.value.end as usize]
    }

    /// The value of the first edit from `from` on that adds a `name`.
    fn first_added(&self, name: &HeaderName, from: usize) -> Option<&[u8]> {
        self.edits[from..].iter().find_map(|e| match e {
            Edit::Append(n, v) if n == name => Some(v.as_bytes()),
            _ => None,
        })
    }

    /// The last edit of `name` that replaced its fields, if any: its index.
    fn replaced_at(&self, name: &HeaderName) -> Option<usize> {
        self.edits
            .iter()
            .rposition(|e| e.replaces() && e.name() == name)
    }

    /// Is a received field with this raw name dropped by an edit?
    fn dropped(&self, raw: &[u8]) -> bool {
        self.edits.iter().any(|e| e.replaces() && is(raw, e.name()))
    }

    /// Every value of `name` after the edits, in order, until `f` says stop
    /// (returns `true`). Returns whether it stopped.
    fn any_value(&self, name: &HeaderName, mut f: impl FnMut(&[u8]) -> bool) -> bool {
        let from = match self.replaced_at(name) {
            Some(at) => {
                if let Edit::Set(_, v) = &self.edits[at]
                    && f(v.as_bytes())
                {
                    return true;
                }
                at + 1
            }
            None => {
                for field in &self.fields {
                    if is(self.name_of(field), name) && f(self.value_of(field)) {
                        return true;
                    }
                }
                0
            }
        };
        self.edits[from..].iter().any(|e| match e {
            Edit::Append(n, v) if n == name => f(v.as_bytes()),
            _ => false,
        })
    }

    /// The value of `name` as a shared header value (no copy for a
    /// received field).
    fn value(&self, name: &HeaderName) -> Option<HeaderValue> {
        let from = match self.replaced_at(name) {
            Some(at) => {
                if let Edit::Set(_, v) = &self.edits[at] {
                    return Some(v.clone());
                }
                at + 1
            }
            None => {
                if let Some(field) = self.fields.iter().find(|f| is(self.name_of(f), name)) {
                    let range = field.value.start as usize..field.value.end as usize;
                    return HeaderValue::from_maybe_shared(self.bytes.slice(range)).ok();
                }
                0
            }
        };
        self.edits[from..].iter().find_map(|e| match e {
            Edit::Append(n, v) if n == name => Some(v.clone()),
            _ => None,
        })
    }

    /// Every field after the edits: the received ones kept, in their order
    /// and spelling, then the ones the edits added.
    fn for_each(&self, mut f: impl FnMut(&[u8], &[u8])) {
        for field in &self.fields {
            let name = self.name_of(field);
            if !self.dropped(name) {
                f(name, self.value_of(field));
            }
        }
        for (i, edit) in self.edits.iter().enumerate() {
            let (name, value) = match edit {
                Edit::Set(n, v) | Edit::Append(n, v) => (n, v),
                Edit::Remove(_) => continue,
            };
            // Replaced again later: this one is gone.
            if self.edits[i + 1..]
                .iter()
                .any(|later| later.replaces() && later.name() == name)
            {
                continue;
            }
            f(name.as_str().as_bytes(), value.as_bytes());
        }
    }
}

/// The header fields of a request or response, as the handler reads and
/// edits them.
#[derive(Debug, Clone)]
pub enum Fields {
    /// An HTTP/1.1 head's, as received, plus edits.
    Raw(RawFields),
    /// A header map's (HTTP/2, answers made by the proxy).
    Map(HeaderMap),
}

impl Default for Fields {
    fn default() -> Self {
        Fields::Map(HeaderMap::new())
    }
}

impl From<HeaderMap> for Fields {
    fn from(map: HeaderMap) -> Self {
        Fields::Map(map)
    }
}

impl Fields {
    /// The first value of `name`.
    pub fn get(&self, name: &HeaderName) -> Option<&[u8]> {
        match self {
            Fields::Map(m) => m.get(name).map(HeaderValue::as_bytes),
            Fields::Raw(r) => match r.replaced_at(name) {
                Some(at) => match &r.edits[at] {
                    Edit::Set(_, v) => Some(v.as_bytes()),
                    _ => r.first_added(name, at + 1),
                },
                None => r
                    .fields
                    .iter()
                    .find(|f| is(r.name_of(f), name))
                    .map(|f| r.value_of(f))
                    .or_else(|| r.first_added(name, 0)),
            },
        }
    }

    /// The first value of `name` as a header value.
    pub fn value(&self, name: &HeaderName) -> Option<HeaderValue> {
        match self {
            Fields::Map(m) => m.get(name).cloned(),
            Fields::Raw(r) => r.value(name),
        }
    }

    pub fn contains(&self, name: &HeaderName) -> bool {
        self.get(name).is_some()
    }

    /// Does any value of `name` satisfy `f`?
    pub fn any_value(&self, name: &HeaderName, mut f: impl FnMut(&[u8]) -> bool) -> bool {
        match self {
            Fields::Map(m) => m.get_all(name).iter().any(|v| f(v.as_bytes())),
            Fields::Raw(r) => r.any_value(name, f),
        }
    }

    /// Every value of `name`, in order.
    pub fn values(&self, name: &HeaderName) -> Vec<&[u8]> {
        let mut out = Vec::new();
        match self {
            Fields::Map(m) => out.extend(m.get_all(name).iter().map(HeaderValue::as_bytes)),
            Fields::Raw(r) => {
                // Collected through positions, so the slices borrow `self`.
                let from = match r.replaced_at(name) {
                    Some(at) => {
                        if let Edit::Set(_, v) = &r.edits[at] {
                            out.push(v.as_bytes());
                        }
                        at + 1
                    }
                    None => {
                        out.extend(
                            r.fields
                                .iter()
                                .filter(|f| is(r.name_of(f), name))
                                .map(|f| r.value_of(f)),
                        );
                        0
                    }
                };
                out.extend(r.edits[from..].iter().filter_map(|e| match e {
                    Edit::Append(n, v) if n == name => Some(v.as_bytes()),
                    _ => None,
                }));
            }
        }
        out
    }

    /// Every field name, as spelled (edited names lower case).
    pub fn any_name(&self, mut f: impl FnMut(&[u8]) -> bool) -> bool {
        match self {
            Fields::Map(m) => m.keys().any(|n| f(n.as_str().as_bytes())),
            Fields::Raw(r) => {
                let mut hit = false;
                r.for_each(|n, _| hit = hit || f(n));
                hit
            }
        }
    }

    /// Replace every field of `name` with one of `value`.
    pub fn set(&mut self, name: HeaderName, value: HeaderValue) {
        match self {
            Fields::Map(m) => {
                m.insert(name, value);
            }
            Fields::Raw(r) => r.edits.push(Edit::Set(name, value)),
        }
    }

    /// Add a field of `name`.
    pub fn append(&mut self, name: HeaderName, value: HeaderValue) {
        match self {
            Fields::Map(m) => {
                m.append(name, value);
            }
            Fields::Raw(r) => r.edits.push(Edit::Append(name, value)),
        }
    }

    /// Drop every field of `name`.
    pub fn remove(&mut self, name: &HeaderName) {
        match self {
            Fields::Map(m) => {
                m.remove(name);
            }
            Fields::Raw(r) => {
                if r.fields.iter().any(|f| is(r.name_of(f), name))
                    || r.edits.iter().any(|e| e.name() == name)
                {
                    r.edits.push(Edit::Remove(name.clone()));
                }
            }
        }
    }

    /// Every field after the edits, as name and value bytes.
    pub fn for_each(&self, mut f: impl FnMut(&[u8], &[u8])) {
        match self {
            Fields::Map(m) => {
                for (n, v) in m {
                    f(n.as_str().as_bytes(), v.as_bytes());
                }
            }
            Fields::Raw(r) => r.for_each(f),
        }
    }

    /// Write every field but those `skip` names as `name: value` lines.
    pub fn write(&self, out: &mut Vec<u8>, skip: impl Fn(&[u8]) -> bool) {
        self.for_each(|name, value| {
            if !skip(name) {
                field_line(out, name, value);
            }
        });
    }

    /// The fields as a header map (for hyper). Fields whose name or value
    /// a map cannot hold are left out (the HTTP/1.1 parser refuses them
    /// before they get here).
    pub fn into_map(self) -> HeaderMap {
        match self {
            Fields::Map(m) => m,
            Fields::Raw(r) => {
                let mut map = HeaderMap::with_capacity(r.fields.len() + r.edits.len());
                let bytes = &r.bytes;
                for field in &r.fields {
                    let name = r.name_of(field);
                    if r.dropped(name) {
                        continue;
                    }
                    let range = field.value.start as usize..field.value.end as usize;
                    if let (Ok(n), Ok(v)) = (
                        HeaderName::from_bytes(name),
                        HeaderValue::from_maybe_shared(bytes.slice(range)),
                    ) {
                        map.append(n, v);
                    }
                }
                for (i, edit) in r.edits.iter().enumerate() {
                    if let Edit::Set(n, v) | Edit::Append(n, v) = edit
                        && !r.edits[i + 1..]
                            .iter()
                            .any(|later| later.replaces() && later.name() == n)
                    {
                        map.append(n.clone(), v.clone());
                    }
                }
                map
            }
        }
    }
}

impl crate::route::HeaderSource for Fields {
    fn any_value(&self, name: &HeaderName, f: &mut dyn FnMut(&[u8]) -> bool) -> bool {
        Fields::any_value(self, name, f)
    }
}

/// `name: value\r\n`.
pub fn field_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Fields that describe one hop and are never forwarded (RFC 9110 §7.6.1,
/// plus the legacy ones proxies are expected to drop).
pub const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

/// Is `name` one of [`HOP_BY_HOP`]?
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    // Every one of them is 2..=19 bytes long; most names are not.
    HOP_BY_HOP.iter().any(|h| is(name, h))
}

/// Remove hop-by-hop fields: the fixed list, and every field the
/// `Connection` field names.
pub fn strip_hop_by_hop(fields: &mut Fields) {
    // Most messages carry none: one pass over the names.
    if !fields.any_name(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = fields
        .values(&header::CONNECTION)
        .into_iter()
        .flat_map(|v| v.split(|b| *b == b','))
        .filter_map(|name| HeaderName::from_bytes(name.trim_ascii()).ok())
        .collect();
    for name in &named {
        fields.remove(name);
    }
    for name in &HOP_BY_HOP {
        fields.remove(name);
    }
}

/// A request as the handler takes it, from either codec.
pub struct ProxyRequest {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: Fields,
    pub body: RequestBody,
    /// The TLS connection it came over, if any.
    pub tls: Option<TlsConnection>,
    /// For an HTTP/1.1 request that asks to switch protocols: where the
    /// client's connection will be handed over after a 101.
    pub upgrade: Option<ClientUpgrade>,
}

/// A response as the handler gives it, to either codec.
#[derive(Debug)]
pub struct ProxyResponse {
    pub status: StatusCode,
    pub headers: Fields,
    pub body: ResponseBody,
}

impl ProxyResponse {
    /// A response with no fields yet.
    pub fn new(status: StatusCode, body: ResponseBody) -> Self {
        ProxyResponse {
            status,
            headers: Fields::Map(HeaderMap::new()),
            body,
        }
    }

    /// As hyper sends it (HTTP/2 clients).
    pub fn into_http(self) -> http::Response<ResponseBody> {
        let mut resp = http::Response::new(self.body);
        *resp.status_mut() = self.status;
        *resp.headers_mut() = self.headers.into_map();
        resp
    }
}

impl From<http::Response<ResponseBody>> for ProxyResponse {
    fn from(resp: http::Response<ResponseBody>) -> Self {
        let (parts, body) = resp.into_parts();
        ProxyResponse {
            status: parts.status,
            headers: Fields::Map(parts.headers),
            body,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(head: &str) -> Fields {
        let bytes = Bytes::copy_from_slice(head.as_bytes());
        let mut fields = Vec::new();
        let mut at = 0;
        for line in head.split("\r\n") {
            if let Some((n, v)) = line.split_once(": ") {
                let value = at + n.len() + 2;
                fields.push(Field::new(at..at + n.len(), value..value + v.len()));
            }
            at += line.len() + 2;
        }
        Fields::Raw(RawFields::new(bytes, fields))
    }

    fn written(f: &Fields) -> String {
        let mut out = Vec::new();
        f.write(&mut out, |_| false);
        String::from_utf8(out).unwrap()
    }

    fn name(s: &'static str) -> HeaderName {
        HeaderName::from_static(s)
    }

    fn value(s: &'static str) -> HeaderValue {
        HeaderValue::from_static(s)
    }

    /// Every edit gives what the same edits give on a header map.
    #[test]
    fn edits_read_and_write_as_a_header_map_would() {
        let head = "X-A: 1\r\nHost: h\r\nx-a: 2\r\nX-B: b\r\n\r\n";
        let edits: Vec<Box<dyn Fn(&mut Fields)>> = vec![
            Box::new(|f| f.set(name("x-a"), value("s"))),
            Box::new(|f| f.append(name("x-a"), value("3"))),
            Box::new(|f| f.remove(&name("x-a"))),
            Box::new(|f| f.append(name("x-c"), value("c"))),
            Box::new(|f| f.set(name("x-b"), value("bb"))),
            Box::new(|f| f.remove(&name("x-none"))),
        ];
        // Every ordered selection of edits (as bits).
        for mask in 0..(1u32 << edits.len()) {
            let mut raw_fields = raw(head);
            let mut map = raw(head).into_map();
            let mut map_fields = Fields::Map(map.clone());
            for (i, edit) in edits.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    edit(&mut raw_fields);
                    edit(&mut map_fields);
                }
            }
            if let Fields::Map(m) = map_fields {
                map = m;
            }
            for n in ["x-a", "x-b", "x-c", "host", "x-none"] {
                let n = name(n);
                let want: Vec<&[u8]> = map.get_all(&n).iter().map(|v| v.as_bytes()).collect();
                assert_eq!(raw_fields.values(&n), want, "{n} with edits {mask:b}");
                assert_eq!(raw_fields.get(&n), want.first().copied(), "{n} {mask:b}");
                assert_eq!(
                    raw_fields.value(&n).as_ref().map(HeaderValue::as_bytes),
                    want.first().copied()
                );
            }
            let mut sorted = |f: Fields| {
                let mut all: Vec<(String, String)> = Vec::new();
                f.for_each(|n, v| {
                    all.push((
                        String::from_utf8_lossy(n).to_ascii_lowercase(),
                        String::from_utf8_lossy(v).into_owned(),
                    ))
                });
                // Values of one name keep their order; names may not.
                all.sort_by(|a, b| a.0.cmp(&b.0));
                all
            };
            assert_eq!(
                sorted(raw_fields.clone()),
                sorted(Fields::Map(map.clone())),
                "{mask:b}"
            );
            assert_eq!(raw_fields.clone().into_map(), map, "{mask:b}");
        }
    }

    #[test]
    fn received_fields_keep_their_order_and_spelling() {
        let mut f = raw("Host: h\r\nX-Custom: 1\r\nAccept: */*\r\n\r\n");
        f.set(name("x-forwarded-for"), value("10.0.0.1"));
        assert_eq!(
            written(&f),
            "Host: h\r\nX-Custom: 1\r\nAccept: */*\r\nx-forwarded-for: 10.0.0.1\r\n"
        );
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_removed() {
        let mut f = raw(
            "Connection: keep-alive, X-Custom-Hop\r\nKeep-Alive: timeout=5\r\nX-Custom-Hop: 1\r\n\
             TE: trailers\r\nUpgrade: websocket\r\nProxy-Authorization: secret\r\n\
             Transfer-Encoding: chunked\r\nX-End-To-End: kept\r\n\r\n",
        );
        strip_hop_by_hop(&mut f);
        assert_eq!(written(&f), "X-End-To-End: kept\r\n");
        let mut none = raw("Host: h\r\n\r\n");
        strip_hop_by_hop(&mut none);
        assert_eq!(written(&none), "Host: h\r\n");
        if let Fields::Raw(r) = &none {
            assert!(r.edits.is_empty(), "nothing to strip, nothing edited");
        }
    }
}
