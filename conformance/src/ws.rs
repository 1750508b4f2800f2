//! Just enough WebSocket (RFC 6455) for the WebSocket conformance test: the
//! opening handshake's accept key, and reading and writing single frames.
//! The runner is both ends (the test's client and the echo pod's server),
//! so only unfragmented frames are produced; fragmented ones are refused.

use std::io;

use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncReadExt};

pub const TEXT: u8 = 0x1;
pub const BINARY: u8 = 0x2;
pub const CLOSE: u8 = 0x8;
pub const PING: u8 = 0x9;
pub const PONG: u8 = 0xA;

/// Largest payload accepted (the test sends a few bytes).
const MAX_PAYLOAD: u64 = 1 << 20;

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A request asking for a WebSocket upgrade.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    let has = |name: http::header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    has(http::header::UPGRADE, "websocket") && has(http::header::CONNECTION, "upgrade")
}

/// `Sec-WebSocket-Accept` for the request's `Sec-WebSocket-Key`.
pub fn accept_key(headers: &HeaderMap) -> Option<String> {
    let key = headers.get("sec-websocket-key")?.to_str().ok()?;
    Some(accept_for(key.trim()))
}

/// `base64(SHA-1(key + GUID))`.
pub fn accept_for(key: &str) -> String {
    crate::env::base64(&sha1(format!("{key}{GUID}").as_bytes()))
}

/// One frame as read.
pub struct Frame {
    pub opcode: u8,
    pub payload: Vec<u8>,
}

/// Read one frame; `None` at a clean end of stream.
pub async fn read_frame<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 2];
    match stream.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    if head[0] & 0x80 == 0 {
        return Err(io::Error::other(
            "fragmented WebSocket frames are not supported",
        ));
    }
    let opcode = head[0] & 0x0F;
    let masked = head[1] & 0x80 != 0;
    let len = match head[1] & 0x7F {
        126 => u64::from(stream.read_u16().await?),
        127 => stream.read_u64().await?,
        n => u64::from(n),
    };
    if len > MAX_PAYLOAD {
        return Err(io::Error::other(format!("WebSocket frame of {len} bytes")));
    }
    let mut mask = [0u8; 4];
    if masked {
        stream.read_exact(&mut mask).await?;
    }
    let mut payload = vec![0u8; usize::try_from(len).map_err(io::Error::other)?];
    stream.read_exact(&mut payload).await?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Ok(Some(Frame { opcode, payload }))
}

/// One final frame; clients must give a `mask`, servers none.
pub fn encode(opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(mask_bit | n as u8),
        n if n <= usize::from(u16::MAX) => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(mask) => {
            out.extend_from_slice(&mask);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        }
        None => out.extend_from_slice(payload),
    }
    out
}

/// SHA-1 (FIPS 180-4), for the handshake only.
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0];
    let mut message = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    message.push(0x80);
    while message.len() % 64 != 56 {
        message.push(0);
    }
    message.extend_from_slice(&bit_len.to_be_bytes());
    for block in message.chunks(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A827999),
                20..=39 => (b ^ c ^ d, 0x6ED9EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1BBCDC),
                _ => (b ^ c ^ d, 0xCA62C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (hi, v) in h.iter_mut().zip([a, b, c, d, e]) {
            *hi = hi.wrapping_add(v);
        }
    }
    let mut out = [0u8; 20];
    for (i, v) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&v.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_key_is_rfc_6455s_example() {
        assert_eq!(
            accept_for("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn sha1_of_abc() {
        let hex: String = sha1(b"abc").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "a9993e364706816aba3e25717850c26c9cd0d89d");
    }

    #[tokio::test]
    async fn frames_round_trip_masked_and_long() {
        for payload in [b"hi".to_vec(), vec![7u8; 300], vec![1u8; 70_000]] {
            let bytes = encode(BINARY, &payload, Some([1, 2, 3, 4]));
            let frame = read_frame(&mut bytes.as_slice()).await.unwrap().unwrap();
            assert_eq!(frame.opcode, BINARY);
            assert_eq!(frame.payload, payload);
        }
        assert!(read_frame(&mut &b""[..]).await.unwrap().is_none());
    }
}
