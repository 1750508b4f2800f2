//! HTTP/1.1 framing of our own (RFC 9112), for the lean HTTP/1 path:
//! request heads parsed in place with `httparse`, the extent of the body
//! decided once from the head, and chunked bodies walked byte by byte
//! without being decoded, so that a body can be forwarded as the bytes it
//! is (no re-chunking, no buffering).
//!
//! Because heads and bodies are forwarded as received, everything a
//! backend could read differently from the gateway is refused here with
//! 400 and the connection closed (request smuggling): line ends other than
//! CRLF, Content-Length together with Transfer-Encoding, any transfer
//! coding but a lone `chunked`, duplicate or list-valued Content-Length,
//! whitespace or overlong digits in chunk sizes, control characters in
//! chunk extensions or trailers. hyper accepts some of these and rewrites
//! them on the way out; since the bytes are not rewritten here, they are
//! refused instead. Everything hyper refuses is refused too: the
//! differential fuzz target (`sluice::fuzzing::h1_framing`) feeds the
//! same bytes to this parser and to hyper's server and fails when hyper
//! refuses a request this parser accepts, or when both accept and
//! disagree on the requests or where their bodies end.
//!
//! Limits (head size, header count, target length, `_` in names) are
//! [`HeadLimits`]; refusals are [`ProxyError`]s, whose one
//! `into_response` makes every error answer.

use std::ops::Range;

use http::{Method, StatusCode, Uri};

use super::error::ProxyError;

/// What a request head may be (from [`ProxyLimits`](super::ProxyLimits)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLimits {
    /// Request line and header fields, in bytes: larger gets 431.
    pub max_head_bytes: usize,
    /// Header fields: more gets 431.
    pub max_headers: usize,
    /// Request target: longer gets 414.
    pub max_uri_bytes: usize,
    /// Refuse `_` in header names (400).
    pub reject_underscore_headers: bool,
}

impl HeadLimits {
    pub fn from_limits(limits: &super::ProxyLimits) -> Self {
        HeadLimits {
            max_head_bytes: limits.max_request_header_bytes,
            max_headers: limits.max_request_headers,
            max_uri_bytes: limits.max_uri_bytes,
            reject_underscore_headers: limits.reject_underscore_headers,
        }
    }
}

/// Where a message body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked: ends with the last chunk and the trailer section.
    Chunked,
}

/// A parsed request head. Ranges index the buffer it was parsed from.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// Length of the head, its final CRLF included.
    pub len: usize,
    pub method: Method,
    /// The request target as a URI (origin-form, absolute-form, `*`).
    pub uri: Uri,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor: u8,
    /// Each header field: name and value.
    pub headers: Vec<(Range<usize>, Range<usize>)>,
    /// The Host field's value, if any.
    pub host: Option<Range<usize>>,
    pub framing: Framing,
    /// The client may send another request on this connection.
    pub keep_alive: bool,
    /// `Connection: upgrade` with an `Upgrade` field, on HTTP/1.1.
    pub upgrade: bool,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
}

fn bad(why: &'static str) -> ProxyError {
    ProxyError::BadRequest(why)
}

/// Does `list` (a comma-separated field value) hold `token`?
fn has_token(list: &[u8], token: &[u8]) -> bool {
    list.split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// Parse the request head at the start of `buf`. `Ok(None)`: the head is
/// not complete yet (and within the limits so far).
pub fn parse_request(buf: &[u8], limits: &HeadLimits) -> Result<Option<RequestHead>, ProxyError> {
    // Uninitialized room for the fields: on the stack for the usual limit
    // (a zeroed heap array of 100 fields per request was 3 KB to fill).
    let mut on_stack = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; 128];
    let mut on_heap = Vec::new();
    let fields = if limits.max_headers <= on_stack.len() {
        &mut on_stack[..limits.max_headers.max(1)]
    } else {
        on_heap.resize_with(limits.max_headers, std::mem::MaybeUninit::uninit);
        &mut on_heap[..]
    };
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, fields) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            return if buf.len() >= limits.max_head_bytes {
                Err(ProxyError::HeadTooLarge)
            } else {
                Ok(None)
            };
        }
        Err(httparse::Error::TooManyHeaders) => return Err(ProxyError::HeadTooLarge),
        Err(httparse::Error::Version) => return Err(bad("unsupported HTTP version")),
        Err(_) => return Err(bad("malformed request head")),
    };
    if len > limits.max_head_bytes {
        return Err(ProxyError::HeadTooLarge);
    }
    // Only CRLF ends a line: a bare LF read as a line end here may not be
    // one for the backend that gets these bytes.
    let head = &buf[..len];
    if head
        .iter()
        .enumerate()
        .any(|(i, b)| *b == b'\n' && (i == 0 || head[i - 1] != b'\r'))
    {
        return Err(bad("bare LF in the request head"));
    }
    let minor = req.version.unwrap_or(1);
    let method = Method::from_bytes(req.method.unwrap_or("").as_bytes())
        .map_err(|_| bad("malformed method"))?;
    let target = req.path.unwrap_or("");
    if target.len() > limits.max_uri_bytes {
        return Err(ProxyError::UriTooLong);
    }
    let uri: Uri = target
        .parse()
        .map_err(|_| bad("malformed request target"))?;

    let offset = |s: &[u8]| s.as_ptr() as usize - buf.as_ptr() as usize;
    let mut headers = Vec::with_capacity(req.headers.len());
    let mut host = None;
    let mut hosts = 0;
    let mut length: Option<u64> = None;
    let mut lengths = 0;
    let mut te: Option<&[u8]> = None;
    let mut tes = 0;
    let mut connection_close = false;
    let mut connection_keep_alive = false;
    let mut connection_upgrade = false;
    let mut has_upgrade = false;
    let mut expect_continue = false;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        let value = h.value;
        if limits.reject_underscore_headers && name.contains(&b'_') {
            return Err(bad("underscore in a header name"));
        }
        let start = offset(name);
        let vstart = offset(value);
        headers.push((start..start + name.len(), vstart..vstart + value.len()));
        if name.eq_ignore_ascii_case(b"host") {
            hosts += 1;
            host = Some(vstart..vstart + value.len());
        } else if name.eq_ignore_ascii_case(b"content-length") {
            lengths += 1;
            length = Some(parse_length(value)?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            tes += 1;
            te = Some(value);
        } else if name.eq_ignore_ascii_case(b"connection") {
            connection_close |= has_token(value, b"close");
            connection_keep_alive |= has_token(value, b"keep-alive");
            connection_upgrade |= has_token(value, b"upgrade");
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            has_upgrade = true;
        } else if name.eq_ignore_ascii_case(b"expect") {
            expect_continue = value.eq_ignore_ascii_case(b"100-continue");
        }
    }
    if hosts > 1 {
        return Err(bad("more than one Host"));
    }
    // Host (and an absolute-form target's authority, which takes its
    // place) is `host[:port]`: nothing a backend could read as another
    // host, a path or credentials.
    if host.as_ref().is_some_and(|h| !valid_host(&buf[h.clone()]))
        || uri
            .authority()
            .is_some_and(|a| !valid_host(a.as_str().as_bytes()))
    {
        return Err(bad("malformed Host"));
    }
    if hosts == 0 && minor == 1 && uri.authority().is_none() {
        return Err(bad("missing Host"));
    }
    if lengths > 1 {
        return Err(bad("more than one Content-Length"));
    }
    let framing = match (te, length) {
        (Some(_), Some(_)) => return Err(bad("both Content-Length and Transfer-Encoding")),
        (Some(_), None) if minor == 0 => return Err(bad("Transfer-Encoding on HTTP/1.0")),
        (Some(te), None) if tes == 1 && te.trim_ascii().eq_ignore_ascii_case(b"chunked") => {
            Framing::Chunked
        }
        (Some(_), None) => return Err(bad("a transfer coding other than chunked")),
        (None, Some(0)) | (None, None) => Framing::None,
        (None, Some(n)) => Framing::Length(n),
    };
    let keep_alive = if minor == 1 {
        !connection_close
    } else {
        connection_keep_alive && !connection_close
    };
    Ok(Some(RequestHead {
        len,
        method,
        uri,
        minor,
        headers,
        host,
        framing,
        keep_alive,
        upgrade: minor == 1 && connection_upgrade && has_upgrade,
        expect_continue,
    }))
}

/// A Content-Length value: decimal digits only (no sign, no list), at
/// most 19 of them (fits a `u64`).
fn parse_length(value: &[u8]) -> Result<u64, ProxyError> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return Err(bad("malformed Content-Length"));
    }
    Ok(value.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// Where a response body ends (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFraming {
    /// No body: the answer to HEAD, 1xx, 204, 304, `Content-Length: 0`.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked.
    Chunked,
    /// Until the connection closes (no length given).
    UntilClose,
}

/// A parsed response head. Ranges index the buffer it was parsed from.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    /// Length of the head, its final CRLF included.
    pub len: usize,
    pub status: StatusCode,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor: u8,
    /// Each header field: name and value.
    pub fields: Vec<(Range<usize>, Range<usize>)>,
    pub framing: ResponseFraming,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
}

/// Most bytes of a response head (hyper's client read up to ~400 KiB;
/// nginx's `proxy_buffer_size` is 4-8 KiB).
pub const MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;
/// Most fields of a response head (as hyper's client allowed).
pub const MAX_RESPONSE_FIELDS: usize = 100;

/// Why a backend's response head was refused (the client gets 502).
#[derive(Debug, thiserror::Error)]
#[error("invalid response head from the backend: {0}")]
pub struct BadResponse(pub &'static str);

/// Parse the response head at the start of `buf`, the answer to a request
/// whose method was HEAD when `head_request`. `Ok(None)`: not complete
/// yet.
///
/// What the proxy could forward ambiguously (response smuggling) is
/// refused: line ends other than CRLF, Content-Length together with
/// Transfer-Encoding, differing or malformed Content-Lengths,
/// Transfer-Encoding on HTTP/1.0. A Transfer-Encoding whose last coding
/// is not chunked means the body ends with the connection (RFC 9112
/// §6.3).
pub fn parse_response(buf: &[u8], head_request: bool) -> Result<Option<ResponseHead>, BadResponse> {
    let mut on_stack =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_RESPONSE_FIELDS];
    let mut resp = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut on_stack,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_RESPONSE_HEAD_BYTES => {
            return Err(BadResponse("head too large"));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(BadResponse("too many fields")),
        Err(_) => return Err(BadResponse("malformed head")),
    };
    if len > MAX_RESPONSE_HEAD_BYTES {
        return Err(BadResponse("head too large"));
    }
    let head = &buf[..len];
    if head
        .iter()
        .enumerate()
        .any(|(i, b)| *b == b'\n' && (i == 0 || head[i - 1] != b'\r'))
    {
        return Err(BadResponse("bare LF"));
    }
    let minor = resp.version.unwrap_or(1);
    let status = resp
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(BadResponse("malformed status"))?;
    let offset = |s: &[u8]| s.as_ptr() as usize - buf.as_ptr() as usize;
    let mut fields = Vec::with_capacity(resp.headers.len());
    let mut length: Option<u64> = None;
    let mut te_chunked: Option<bool> = None;
    let mut close = false;
    let mut keep_alive = false;
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        let value = h.value;
        let start = offset(name);
        let vstart = offset(value);
        fields.push((start..start + name.len(), vstart..vstart + value.len()));
        if name.eq_ignore_ascii_case(b"content-length") {
            // `n` or `n, n, ...` (all alike), as often as it comes.
            for part in value.split(|b| *b == b',') {
                let n = parse_length(part.trim_ascii())
                    .map_err(|_| BadResponse("malformed Content-Length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(BadResponse("differing Content-Lengths"));
                }
                length = Some(n);
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // The last coding of the last field decides.
            let last = value.rsplit(|b| *b == b',').next().unwrap_or(b"");
            te_chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            close |= has_token(value, b"close");
            keep_alive |= has_token(value, b"keep-alive");
        }
    }
    let bodiless = head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = match (te_chunked, length) {
        (Some(_), Some(_)) => {
            return Err(BadResponse("both Content-Length and Transfer-Encoding"));
        }
        (Some(_), None) if minor == 0 => {
            return Err(BadResponse("Transfer-Encoding on HTTP/1.0"));
        }
        _ if bodiless => ResponseFraming::None,
        (Some(true), None) => ResponseFraming::Chunked,
        (Some(false), None) => ResponseFraming::UntilClose,
        (None, Some(0)) => ResponseFraming::None,
        (None, Some(n)) => ResponseFraming::Length(n),
        (None, None) => ResponseFraming::UntilClose,
    };
    let keep_alive = if minor == 1 {
        !close
    } else {
        keep_alive && !close
    };
    Ok(Some(ResponseHead {
        len,
        status,
        minor,
        fields,
        framing,
        keep_alive: keep_alive && framing != ResponseFraming::UntilClose,
    }))
}

/// Most hex digits in a chunk size (a `u64`).
const MAX_CHUNK_SIZE_DIGITS: u8 = 16;
/// Most bytes of chunk extensions over a whole body.
pub const MAX_CHUNK_EXTENSION_BYTES: u64 = 4096;
/// Most bytes of a trailer section.
pub const MAX_TRAILER_BYTES: u64 = 16 * 1024;

/// Where a chunked body walker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading the size's hex digits (this many so far).
    Size {
        digits: u8,
        size: u64,
    },
    /// In a chunk extension, after `;`.
    Extension {
        size: u64,
    },
    /// After the size line's CR.
    SizeLf {
        size: u64,
    },
    /// Chunk data, this many bytes left.
    Data(u64),
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final CRLF).
    TrailerStart,
    /// In a trailer field line.
    Trailer {
        colon: bool,
        name: bool,
    },
    TrailerLf,
    /// The CR of the final CRLF seen.
    EndLf,
    Done,
}

/// Walks a chunked body as its bytes go by, without changing them: says
/// where the body ends and refuses malformed chunking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkedWalker {
    state: Chunk,
    extension_bytes: u64,
    trailer_bytes: u64,
    /// Sum of the chunk sizes so far.
    pub decoded: u64,
}

impl Default for ChunkedWalker {
    fn default() -> Self {
        ChunkedWalker {
            state: Chunk::Size { digits: 0, size: 0 },
            extension_bytes: 0,
            trailer_bytes: 0,
            decoded: 0,
        }
    }
}

fn malformed() -> ProxyError {
    bad("malformed chunked body")
}

impl ChunkedWalker {
    /// The body has ended (last chunk and trailer section read).
    pub fn is_done(&self) -> bool {
        self.state == Chunk::Done
    }

    /// Walk `bytes`, the next bytes of the body. Returns how many belong to
    /// the body: all of them, or fewer when it ended within them.
    pub fn walk(&mut self, bytes: &[u8]) -> Result<usize, ProxyError> {
        self.walk_with(bytes, |_| {})
    }

    /// [`ChunkedWalker::walk`], calling `on_data` with each range of
    /// `bytes` that is chunk data (to decode the body on the way).
    pub fn walk_with(
        &mut self,
        bytes: &[u8],
        mut on_data: impl FnMut(Range<usize>),
    ) -> Result<usize, ProxyError> {
        let mut i = 0;
        while i < bytes.len() {
            if let Chunk::Data(left) = self.state {
                let take = usize::try_from(left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len() - i);
                on_data(i..i + take);
                i += take;
                let left = left - take as u64;
                self.state = if left == 0 {
                    Chunk::DataCr
                } else {
                    Chunk::Data(left)
                };
                continue;
            }
            let b = bytes[i];
            i += 1;
            self.state = match self.state {
                Chunk::Size { digits, size } => match (b as char).to_digit(16) {
                    Some(d) if digits < MAX_CHUNK_SIZE_DIGITS => Chunk::Size {
                        digits: digits + 1,
                        size: size << 4 | u64::from(d),
                    },
                    Some(_) => return Err(malformed()),
                    None if digits == 0 => return Err(malformed()),
                    None => match b {
                        b';' => Chunk::Extension { size },
                        b'\r' => Chunk::SizeLf { size },
                        _ => return Err(malformed()),
                    },
                },
                Chunk::Extension { size } => {
                    self.extension_bytes += 1;
                    if self.extension_bytes > MAX_CHUNK_EXTENSION_BYTES {
                        return Err(malformed());
                    }
                    match b {
                        b'\r' => Chunk::SizeLf { size },
                        b'\t' | b' '..=b'~' | 0x80..=0xff => Chunk::Extension { size },
                        _ => return Err(malformed()),
                    }
                }
                Chunk::SizeLf { size } => match b {
                    b'\n' if size == 0 => Chunk::TrailerStart,
                    b'\n' => {
                        self.decoded = self.decoded.saturating_add(size);
                        Chunk::Data(size)
                    }
                    _ => return Err(malformed()),
                },
                Chunk::Data(_) => unreachable!("handled above"),
                Chunk::DataCr if b == b'\r' => Chunk::DataLf,
                Chunk::DataLf if b == b'\n' => Chunk::Size { digits: 0, size: 0 },
                Chunk::DataCr | Chunk::DataLf => return Err(malformed()),
                Chunk::TrailerStart => match b {
                    b'\r' => Chunk::EndLf,
                    _ => self.trailer_byte(b, false, false)?,
                },
                Chunk::Trailer { colon, name } => match b {
                    b'\r' if colon => Chunk::TrailerLf,
                    _ => self.trailer_byte(b, colon, name)?,
                },
                Chunk::TrailerLf if b == b'\n' => Chunk::TrailerStart,
                Chunk::EndLf if b == b'\n' => {
                    self.state = Chunk::Done;
                    return Ok(i);
                }
                Chunk::TrailerLf | Chunk::EndLf => return Err(malformed()),
                Chunk::Done => return Ok(i - 1),
            };
        }
        Ok(i)
    }

    /// One byte of a trailer field line (`name: value`, the name a token).
    fn trailer_byte(&mut self, b: u8, colon: bool, name: bool) -> Result<Chunk, ProxyError> {
        self.trailer_bytes += 1;
        if self.trailer_bytes > MAX_TRAILER_BYTES {
            return Err(malformed());
        }
        if colon {
            return match b {
                b'\t' | b' '..=b'~' | 0x80..=0xff => Ok(Chunk::Trailer { colon, name }),
                _ => Err(malformed()),
            };
        }
        match b {
            b':' if name => Ok(Chunk::Trailer {
                colon: true,
                name: true,
            }),
            b if is_token(b) => Ok(Chunk::Trailer {
                colon: false,
                name: true,
            }),
            _ => Err(malformed()),
        }
    }
}

/// A `tchar` of RFC 9110 §5.6.2.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Is `host` (a Host field value or URI authority) `host[:port]` as RFC
/// 3986 has it: a reg-name, an IPv4 address or a bracketed IPv6 literal,
/// then an optional port of digits; no userinfo, no path, no spaces. An
/// empty Host is valid (RFC 9112 §3.2: a target without an authority).
pub fn valid_host(host: &[u8]) -> bool {
    if host.is_empty() {
        return true;
    }
    let (name, port) = if let Some(rest) = host.strip_prefix(b"[") {
        let Some(end) = rest.iter().position(|b| *b == b']') else {
            return false;
        };
        let literal = &rest[..end];
        if literal.is_empty()
            || !literal
                .iter()
                .all(|b| b.is_ascii_hexdigit() || b":.".contains(b))
        {
            return false;
        }
        (&b""[..], &rest[end + 1..])
    } else {
        match host.iter().position(|b| *b == b':') {
            Some(colon) => (&host[..colon], &host[colon..]),
            None => (host, &b""[..]),
        }
    };
    let port_ok = match port {
        [] => true,
        [b':', digits @ ..] => digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    let name_ok = name
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(b));
    port_ok && name_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HeadLimits = HeadLimits {
        max_head_bytes: 1024,
        max_headers: 8,
        max_uri_bytes: 64,
        reject_underscore_headers: true,
    };

    fn parse(bytes: &[u8]) -> Result<Option<RequestHead>, ProxyError> {
        parse_request(bytes, &LIMITS)
    }

    fn refused(bytes: &[u8]) -> String {
        match parse(bytes) {
            Err(e) => format!("{} {e}", e.status().as_u16()),
            Ok(h) => panic!("accepted {:?}: {h:?}", String::from_utf8_lossy(bytes)),
        }
    }

    #[test]
    fn a_simple_head_is_parsed_in_place() {
        let buf = b"GET /a?b HTTP/1.1\r\nHost: example.com\r\nX-A: 1\r\n\r\nrest";
        let head = parse(buf).unwrap().unwrap();
        assert_eq!(head.len, buf.len() - 4);
        assert_eq!(head.method, Method::GET);
        assert_eq!(head.uri.path(), "/a");
        assert_eq!(head.uri.query(), Some("b"));
        assert_eq!(&buf[head.host.clone().unwrap()], b"example.com");
        assert_eq!(head.headers.len(), 2);
        let (n, v) = head.headers[1].clone();
        assert_eq!((&buf[n], &buf[v]), (&b"X-A"[..], &b"1"[..]));
        assert_eq!(head.framing, Framing::None);
        assert!(head.keep_alive);
        assert!(!head.upgrade && !head.expect_continue);
    }

    #[test]
    fn framing_comes_from_one_length_or_a_lone_chunked() {
        let framing = |extra: &str| {
            let buf = format!("POST / HTTP/1.1\r\nHost: h\r\n{extra}\r\n");
            parse(buf.as_bytes()).map(|h| h.unwrap().framing)
        };
        assert_eq!(
            framing("Content-Length: 5\r\n").unwrap(),
            Framing::Length(5)
        );
        assert_eq!(framing("Content-Length: 0\r\n").unwrap(), Framing::None);
        assert_eq!(
            framing("Transfer-Encoding: Chunked\r\n").unwrap(),
            Framing::Chunked
        );
        for bad in [
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Content-Length: 4\r\nContent-Length: 4\r\n",
            "Content-Length: 4, 4\r\n",
            "Content-Length: +4\r\n",
            "Content-Length: 0x4\r\n",
            "Content-Length: 99999999999999999999999\r\n",
            "Transfer-Encoding: chunked, identity\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Transfer-Encoding: xchunked\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        ] {
            assert_eq!(
                framing(bad).map_err(|e| e.status().as_u16()),
                Err(400),
                "{bad:?}"
            );
        }
        assert!(
            refused(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n").starts_with("400")
        );
    }

    #[test]
    fn malformed_and_oversized_heads_are_refused_with_their_status() {
        for (bytes, status) in [
            (&b"GET / HTTP/1.1\r\nX-A: 1\r\n\r\n"[..], "400"),
            (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "400"),
            (b"GET / HTTP/1.1\r\nHost: h\r\nX-A : 1\r\n\r\n", "400"),
            (
                b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n  folded\r\n\r\n",
                "400",
            ),
            (b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r2\r\n\r\n", "400"),
            (b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\x002\r\n\r\n", "400"),
            (b"GET / HTTP/1.1\nHost: h\n\n", "400"),
            (b"GET / HTTP/1.1\r\nHost: h\r\nX_A: 1\r\n\r\n", "400"),
            (b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", "400"),
        ] {
            assert!(refused(bytes).starts_with(status), "{bytes:?}");
        }
        let long = format!("GET /{} HTTP/1.1\r\nHost: h\r\n\r\n", "a".repeat(64));
        assert!(refused(long.as_bytes()).starts_with("414"));
        let many: String = (0..9).map(|i| format!("X-{i}: v\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\nHost: h\r\n{many}\r\n");
        assert!(refused(many.as_bytes()).starts_with("431"));
        let big = format!("GET / HTTP/1.1\r\nHost: h\r\nX: {}", "a".repeat(1100));
        assert!(refused(big.as_bytes()).starts_with("431"));
        // Incomplete within the limits: wait for more.
        assert!(parse(b"GET / HTTP/1.1\r\nHost: h\r\n").unwrap().is_none());
    }

    #[test]
    fn connection_options_are_read() {
        let head = |s: &str| parse(s.as_bytes()).unwrap().unwrap();
        assert!(!head("GET / HTTP/1.1\r\nHost: h\r\nConnection: Close\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(head("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
        let up = head(
            "GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n",
        );
        assert!(up.upgrade);
        assert!(!head("GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n").upgrade);
        assert!(
            !head("GET / HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n").upgrade
        );
        assert!(
            head("PUT / HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n")
                .expect_continue
        );
        // Absolute-form needs no Host.
        let abs = head("GET http://a.example/x HTTP/1.1\r\n\r\n");
        assert_eq!(abs.uri.host(), Some("a.example"));
        for bad in [
            "GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: user@a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a:xyz\r\n\r\n",
            "GET http://user@a/ HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            assert!(refused(bad.as_bytes()).starts_with("400"), "{bad:?}");
        }
    }

    fn walk_all(body: &[u8]) -> Result<(usize, u64, bool), ProxyError> {
        let mut w = ChunkedWalker::default();
        let n = w.walk(body)?;
        Ok((n, w.decoded, w.is_done()))
    }

    #[test]
    fn chunked_bodies_end_after_the_last_chunk_and_trailers() {
        let body = b"4\r\nabcd\r\n1;ext=v\r\nx\r\n0\r\nX-Sum: 1\r\n\r\nGET / ";
        assert_eq!(walk_all(body).unwrap(), (body.len() - 6, 5, true));
        assert_eq!(walk_all(b"0\r\n\r\n").unwrap(), (5, 0, true));
        // Split anywhere: the same end.
        let end = body.len() - 6;
        for cut in 0..body.len() {
            let mut w = ChunkedWalker::default();
            let a = w.walk(&body[..cut]).unwrap();
            assert_eq!(a, cut.min(end));
            let b = w.walk(&body[cut..]).unwrap();
            assert_eq!(a + b, end, "cut at {cut}");
            assert!(w.is_done());
        }
        // Incomplete.
        assert_eq!(walk_all(b"4\r\nab").unwrap(), (5, 4, false));
    }

    #[test]
    fn chunk_data_is_reported_as_it_goes_by() {
        let body = b"4\r\nabcd\r\n1;ext=v\r\nx\r\n0\r\n\r\n";
        for cut in 0..body.len() {
            let mut w = ChunkedWalker::default();
            let mut data = Vec::new();
            for part in [&body[..cut], &body[cut..]] {
                w.walk_with(part, |r| data.extend_from_slice(&part[r]))
                    .unwrap();
            }
            assert_eq!(data, b"abcdx", "cut at {cut}");
            assert!(w.is_done());
        }
    }

    #[test]
    fn malformed_chunking_is_refused() {
        for body in [
            &b"zz\r\nabcd\r\n0\r\n\r\n"[..],
            b"4 \r\nabcd\r\n0\r\n\r\n",
            b"4\nabcd\r\n0\r\n\r\n",
            b"4\r\nabcdX\r\n0\r\n\r\n",
            b"+4\r\nabcd\r\n0\r\n\r\n",
            b"00000000000000004\r\nabcd\r\n0\r\n\r\n",
            b"4;a\x00\r\nabcd\r\n0\r\n\r\n",
            b"0\r\nX-A : 1\r\n\r\n",
            b"0\r\nno colon\r\n\r\n",
            b"0\r\n\n",
        ] {
            assert!(
                walk_all(body).is_err(),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn hosts_are_host_and_port_only() {
        for ok in [
            &b"example.com"[..],
            b"",
            b"example.com:8080",
            b"127.0.0.1",
            b"[::1]:443",
            b"xn--bcher-kva.example",
        ] {
            assert!(valid_host(ok), "{}", String::from_utf8_lossy(ok));
        }
        for bad in [
            &b"a b"[..],
            b"a/b",
            b"user@a",
            b"a:xyz",
            b":80x",
            b"[::1",
            b"a:1:2",
            b"a:123456",
        ] {
            assert!(!valid_host(bad), "{}", String::from_utf8_lossy(bad));
        }
    }

    fn response(bytes: &[u8]) -> Result<Option<ResponseHead>, BadResponse> {
        parse_response(bytes, false)
    }

    #[test]
    fn response_heads_say_where_their_body_ends() {
        let framing = |b: &[u8]| response(b).unwrap().unwrap().framing;
        assert_eq!(
            framing(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
            ResponseFraming::Length(5)
        );
        assert_eq!(
            framing(b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n"),
            ResponseFraming::Length(5)
        );
        assert_eq!(
            framing(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            ResponseFraming::Chunked
        );
        assert_eq!(
            framing(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"),
            ResponseFraming::UntilClose
        );
        assert_eq!(
            framing(b"HTTP/1.1 200 OK\r\n\r\n"),
            ResponseFraming::UntilClose
        );
        assert_eq!(
            framing(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"),
            ResponseFraming::None
        );
        let head = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true)
            .unwrap()
            .unwrap();
        assert_eq!(head.framing, ResponseFraming::None);
        assert!(head.keep_alive);
        // Cut anywhere within the head: not complete yet.
        let whole = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
        for cut in 0..whole.len() {
            assert!(response(&whole[..cut]).unwrap().is_none(), "{cut}");
        }
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection() {
        let keep = |b: &[u8]| response(b).unwrap().unwrap().keep_alive;
        assert!(keep(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"));
        assert!(!keep(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        ));
        assert!(!keep(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"));
        assert!(keep(
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n"
        ));
        // A body that ends with the connection ends the connection.
        assert!(!keep(b"HTTP/1.1 200 OK\r\n\r\n"));
    }

    #[test]
    fn responses_that_could_be_framed_two_ways_are_refused() {
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\n",
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\nContent-Length: 5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\n\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
        ] {
            assert!(response(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let mut huge = b"HTTP/1.1 200 OK\r\n".to_vec();
        while huge.len() < MAX_RESPONSE_HEAD_BYTES {
            huge.extend_from_slice(b"x-filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert!(response(&huge).is_err());
    }
}
