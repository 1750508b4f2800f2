//! TLS listeners (protocol `TLS`): each connection is routed by the server
//! name (SNI) of its ClientHello to a TLSRoute, whose weighted backendRefs
//! are chosen per connection (the exact split of every rule), and its
//! bytes are relayed both ways.
//!
//! - `Passthrough`: the gateway reads the ClientHello without answering
//!   it, connects to the endpoint, sends it the ClientHello and relays
//!   everything after: the backend terminates TLS.
//! - `Terminate`: the gateway completes the handshake with the listener's
//!   certificate (chosen by SNI, as on HTTPS listeners) and relays the
//!   decrypted bytes, in cleartext or, when a BackendTLSPolicy targets the
//!   backend's Service, over a new TLS connection to it.
//!
//! Refusals close the connection without a word (no TLS alert, no bytes):
//! a connection without SNI or whose SNI no route owns, a backendRef that
//! does not resolve or has no ready endpoint ("Request rejections must
//! respect weight; if an invalid backend is requested to have 80% of
//! requests, then 80% of requests must be rejected instead"), an endpoint
//! that cannot be reached.
//!
//! Limits ([`ProxyLimits`](crate::proxy::ProxyLimits)): a client must send its
//! whole ClientHello within `client_hello_timeout` (Envoy's
//! `listener_filters_timeout`, 15 s) and in at most `max_client_hello_bytes`
//! (Envoy's TLS inspector: 64 KiB); the connection to the endpoint must be
//! made within [`CONNECT_TIMEOUT`] (Envoy's `connect_timeout`, 5 s); a
//! relay with no byte in either direction for `idle_timeout` is closed
//! (Envoy's `tcp_proxy` idle timeout, 1 h). A half-close travels: when one
//! side is done sending, the other side's write half is shut down and the
//! other direction goes on.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::tls;
use crate::metrics::TlsOutcome;
use crate::proxy::Shared;
use crate::route::{
    Backend, BackendChoice, BackendTarget, EndpointSet, Failure, StreamLookup, TlsMode,
    normalize_host,
};

/// How long the connection to an endpoint may take (Envoy's cluster
/// `connect_timeout`).
pub(in crate::proxy) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Serve one connection accepted on a socket of TLS listeners. `_permits`
/// hold its places under the connection limits.
pub(in crate::proxy) async fn serve(
    shared: Arc<Shared>,
    mut stream: TcpStream,
    client: SocketAddr,
    bind: SocketAddr,
    _permits: super::accept::Permits,
) {
    let limits = &shared.limits;
    let hello = match tokio::time::timeout(
        limits.client_hello_timeout,
        read_client_hello(&mut stream, limits.max_client_hello_bytes),
    )
    .await
    {
        Ok(Ok(hello)) => hello,
        Ok(Err(HelloError::Closed)) => {
            tracing::debug!(%client, %bind, "closed before a whole ClientHello");
            shared.metrics.record_tls("", "", TlsOutcome::Closed);
            return;
        }
        Ok(Err(e)) => {
            tracing::debug!(%client, %bind, error = %e, "no usable ClientHello; closing");
            shared
                .metrics
                .record_tls("", "", TlsOutcome::BadClientHello);
            return;
        }
        Err(_) => {
            tracing::debug!(%client, %bind, "no ClientHello in time; closing");
            shared
                .metrics
                .record_tls("", "", TlsOutcome::ClientHelloTimeout);
            return;
        }
    };
    let table = shared.table.load_full();
    let found = match (&hello.server_name, table.port(bind)) {
        (Some(name), Some(port)) => port.stream_route(&normalize_host(name)),
        _ => StreamLookup::NoListener,
    };
    let StreamLookup::Matched { listener, rule } = found else {
        tracing::debug!(%client, sni = ?hello.server_name, "no TLSRoute for this server name; closing");
        shared.metrics.record_tls("", "", TlsOutcome::NoRoute);
        return;
    };
    let route = format!("TLSRoute {}/{}", rule.id.namespace, rule.id.route);
    let backend = match rule.backends.choose() {
        BackendChoice::Backend(b) => b,
        BackendChoice::AllWeightsZero | BackendChoice::NoBackends => {
            shared.metrics.record_tls(&route, "", TlsOutcome::Rejected);
            return;
        }
    };
    let BackendTarget::Endpoints(endpoints) = &backend.target else {
        tracing::debug!(%client, backend = %backend.id, "backend unresolved or without endpoints; closing");
        shared
            .metrics
            .record_tls(&route, &backend.service, TlsOutcome::Rejected);
        return;
    };
    let mode = listener.stream.as_ref().map(|s| s.mode);
    let outcome = match mode {
        Some(TlsMode::Terminate) => {
            let prefixed = Prefixed {
                prefix: hello.bytes,
                at: 0,
                inner: stream,
            };
            let acceptor = TlsAcceptor::from(tls::stream_server_config(shared.clone(), bind));
            match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, acceptor.accept(prefixed)).await {
                Ok(Ok(client_tls)) => forward(&shared, client_tls, backend, endpoints, &[]).await,
                _ => TlsOutcome::BadClientHello,
            }
        }
        _ => forward(&shared, stream, backend, endpoints, &hello.bytes).await,
    };
    shared.metrics.record_tls(&route, &backend.service, outcome);
}

/// Connect to an endpoint of `endpoints` (over TLS when they have a
/// BackendTLSPolicy and the client's TLS was terminated here), send
/// `first` (the ClientHello in passthrough), and relay until both sides
/// are done. Endpoints ejected as outliers are skipped, and whether the
/// connection could be made counts towards ejection.
async fn forward<S>(
    shared: &Shared,
    client: S,
    backend: &Backend,
    endpoints: &EndpointSet,
    first: &[u8],
) -> TlsOutcome
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let health = shared.health.of(&backend.service, endpoints);
    let index = shared.health.pick(endpoints, health);
    let endpoint = endpoints.addrs()[index];
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(endpoint)).await;
    let Ok(Ok(backend)) = connected else {
        tracing::debug!(%endpoint, "endpoint unreachable; closing");
        shared.health.record(health, index, Some(Failure::Connect));
        return TlsOutcome::Unreachable;
    };
    shared.health.record(health, index, None);
    let _ = backend.set_nodelay(true);
    let idle = shared.limits.idle_timeout;
    // Re-encrypt to the backend when a BackendTLSPolicy says so (only in
    // Terminate mode: in passthrough the client's TLS is the backend's).
    match (&endpoints.tls, first.is_empty()) {
        (Some(policy), true) => {
            let Ok(config) = policy.config.clone() else {
                return TlsOutcome::Unreachable;
            };
            let connector = tokio_rustls::TlsConnector::from(config);
            let handshake = connector.connect(policy.server_name.clone(), backend);
            match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(backend)) => relay(client, backend, &[], idle).await,
                _ => TlsOutcome::Unreachable,
            }
        }
        _ => relay(client, backend, first, idle).await,
    }
}

/// Send `first` to the backend, then copy both ways until both sides are
/// done (each side's end shuts down the other's write half), or until
/// nothing has moved for `idle`.
async fn relay<A, B>(client: A, backend: B, first: &[u8], idle: Duration) -> TlsOutcome
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Arc::new(Activity::new());
    let mut client = Active {
        inner: client,
        activity: activity.clone(),
    };
    let mut backend = Active {
        inner: backend,
        activity: activity.clone(),
    };
    if !first.is_empty() && backend.write_all(first).await.is_err() {
        return TlsOutcome::Unreachable;
    }
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut backend) => {
            if let Err(e) = copied {
                tracing::debug!(error = %e, "relay ended with an error");
            }
            TlsOutcome::Forwarded
        }
        _ = activity.idle_for(idle) => {
            tracing::debug!("relay idle; closing");
            TlsOutcome::Forwarded
        }
    }
}

/// When bytes last moved on a relay.
struct Activity {
    since: Instant,
    last: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            since: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let at = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.fetch_max(at, Ordering::Relaxed);
    }

    /// Resolves once nothing has moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.since + Duration::from_nanos(self.last.load(Ordering::Relaxed));
            let deadline = last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// Writes go straight to the wrapped stream (`inner`): the wrappers
/// below only change reading.
macro_rules! write_through {
    ($wrapper:ident) => {
        impl<S: AsyncWrite + Unpin> AsyncWrite for $wrapper<S> {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.inner).poll_write(cx, buf)
            }

            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_shutdown(cx)
            }
        }
    };
}

/// A stream that stamps [`Activity`] whenever bytes are read from it.
struct Active<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Active<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

write_through!(Active);

/// A stream whose first bytes were already read (the ClientHello): they
/// are read again first, then the stream itself.
struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = (self.prefix.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

write_through!(Prefixed);

/// A ClientHello as read off the wire.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::proxy) struct ClientHello {
    /// Every byte read so far (the records holding the ClientHello, and
    /// whatever the client sent right after), to be replayed.
    pub bytes: Vec<u8>,
    /// The `server_name` extension's host name.
    pub server_name: Option<String>,
}

/// Why a connection's first bytes are no usable ClientHello.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(in crate::proxy) enum HelloError {
    #[error("not a TLS handshake record")]
    NotTls,
    #[error("the first handshake message is not a ClientHello")]
    NotClientHello,
    #[error("the ClientHello is larger than {0} bytes")]
    TooLarge(usize),
    #[error("malformed ClientHello")]
    Malformed,
    #[error("the connection closed before the ClientHello was complete")]
    Closed,
}

/// Read from `stream` until it has sent a whole ClientHello (which may
/// span several TLS records) of at most `max` bytes.
async fn read_client_hello<S: AsyncRead + Unpin>(
    stream: &mut S,
    max: usize,
) -> Result<ClientHello, HelloError> {
    let mut bytes = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|_| HelloError::Closed)?;
        if n == 0 {
            return Err(HelloError::Closed);
        }
        bytes.extend_from_slice(&chunk[..n]);
        if let Some(server_name) = parse_client_hello(&bytes, max)? {
            return Ok(ClientHello { bytes, server_name });
        }
    }
}

/// The TLS record content type of handshake messages, and the handshake
/// type of a ClientHello (RFC 8446 §5.1, §4).
const HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
/// The largest TLSPlaintext fragment (RFC 8446 §5.1: 2^14).
const MAX_RECORD: usize = 1 << 14;
/// The `server_name` extension (RFC 6066 §3) and its `host_name` entry.
const SERVER_NAME: u16 = 0;
const HOST_NAME: u8 = 0;

/// The SNI of the ClientHello at the start of `buf`: `Ok(None)` when more
/// bytes are needed, `Ok(Some(None))` for a ClientHello without SNI. The
/// message's type and length are judged as soon as its first four bytes
/// are in, so an oversized ClientHello is refused before it is read.
pub(in crate::proxy) fn parse_client_hello(
    buf: &[u8],
    max: usize,
) -> Result<Option<Option<String>>, HelloError> {
    let mut message = Vec::new();
    let mut at = 0;
    loop {
        let Some(header) = buf.get(at..at + 5) else {
            return Ok(None);
        };
        if header[0] != HANDSHAKE || header[1] != 3 {
            return Err(HelloError::NotTls);
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > MAX_RECORD {
            return Err(HelloError::Malformed);
        }
        let fragment = &buf[at + 5..buf.len().min(at + 5 + len)];
        // The handshake header: the first four bytes of the message, maybe
        // across this record and the ones before.
        let head: Vec<u8> = message.iter().chain(fragment).take(4).copied().collect();
        let body_len = match head[..] {
            [kind, a, b, c] => {
                if kind != CLIENT_HELLO {
                    return Err(HelloError::NotClientHello);
                }
                let body_len = (usize::from(a) << 16) | (usize::from(b) << 8) | usize::from(c);
                if body_len + 4 > max {
                    return Err(HelloError::TooLarge(max));
                }
                Some(body_len)
            }
            _ => None,
        };
        if fragment.len() < len {
            return Ok(None);
        }
        message.extend_from_slice(fragment);
        at += 5 + len;
        if let Some(body_len) = body_len
            && message.len() >= 4 + body_len
        {
            return server_name(&message[4..4 + body_len]).map(Some);
        }
    }
}

/// The `host_name` of the `server_name` extension of a ClientHello body.
fn server_name(body: &[u8]) -> Result<Option<String>, HelloError> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // legacy_version, random
    let session = r.u8()?;
    r.take(usize::from(session))?;
    let suites = r.u16()?;
    r.take(usize::from(suites))?;
    let compression = r.u8()?;
    r.take(usize::from(compression))?;
    if r.0.is_empty() {
        return Ok(None); // no extensions
    }
    let extensions = r.u16()?;
    let mut ext = Reader(r.take(usize::from(extensions))?);
    while !ext.0.is_empty() {
        let kind = ext.u16()?;
        let len = ext.u16()?;
        let data = ext.take(usize::from(len))?;
        if kind != SERVER_NAME {
            continue;
        }
        let mut list = Reader(data);
        let list_len = list.u16()?;
        let mut names = Reader(list.take(usize::from(list_len))?);
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let name_len = names.u16()?;
            let name = names.take(usize::from(name_len))?;
            if name_type == HOST_NAME {
                let name = std::str::from_utf8(name).map_err(|_| HelloError::Malformed)?;
                if name.is_empty() || !name.is_ascii() {
                    return Err(HelloError::Malformed);
                }
                return Ok(Some(name.to_owned()));
            }
        }
        return Ok(None);
    }
    Ok(None)
}

/// Big-endian reads off a byte slice; running out is [`HelloError::Malformed`].
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HelloError> {
        if self.0.len() < n {
            return Err(HelloError::Malformed);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, HelloError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, HelloError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello body with these extensions (type, data).
    fn hello_body(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut b = vec![3, 3];
        b.extend([7u8; 32]);
        b.push(32);
        b.extend([1u8; 32]);
        b.extend([0, 2, 0x13, 0x01]);
        b.extend([1, 0]);
        let mut ext = Vec::new();
        for (kind, data) in extensions {
            ext.extend(kind.to_be_bytes());
            ext.extend((data.len() as u16).to_be_bytes());
            ext.extend(data);
        }
        b.extend((ext.len() as u16).to_be_bytes());
        b.extend(ext);
        b
    }

    fn sni(name: &str) -> (u16, Vec<u8>) {
        let mut entry = vec![HOST_NAME];
        entry.extend((name.len() as u16).to_be_bytes());
        entry.extend(name.as_bytes());
        let mut data = (entry.len() as u16).to_be_bytes().to_vec();
        data.extend(entry);
        (SERVER_NAME, data)
    }

    /// The handshake message for `body`, cut into records of `record` bytes.
    fn records(body: &[u8], record: usize) -> Vec<u8> {
        let mut message = vec![CLIENT_HELLO];
        message.extend(&(body.len() as u32).to_be_bytes()[1..]);
        message.extend(body);
        let mut out = Vec::new();
        for part in message.chunks(record) {
            out.extend([HANDSHAKE, 3, 1]);
            out.extend((part.len() as u16).to_be_bytes());
            out.extend(part);
        }
        out
    }

    #[test]
    fn the_server_name_is_read_whatever_the_records_and_extensions() {
        let body = hello_body(&[
            (10, vec![0, 2, 0, 29]),
            sni("abc.example.com"),
            (16, vec![0; 5]),
        ]);
        for record in [16_384, 100, 7] {
            let wire = records(&body, record);
            assert_eq!(
                parse_client_hello(&wire, 65_536),
                Ok(Some(Some("abc.example.com".into()))),
                "records of {record} bytes"
            );
            // Every strict prefix needs more bytes.
            for cut in [0, 3, 5, wire.len() / 2, wire.len() - 1] {
                assert_eq!(
                    parse_client_hello(&wire[..cut], 65_536),
                    Ok(None),
                    "cut at {cut}"
                );
            }
        }
        let without = records(&hello_body(&[(10, vec![0, 2, 0, 29])]), 16_384);
        assert_eq!(parse_client_hello(&without, 65_536), Ok(Some(None)));
    }

    #[test]
    fn what_is_not_a_client_hello_is_refused() {
        assert_eq!(
            parse_client_hello(b"GET / HTTP/1.1\r\n", 65_536),
            Err(HelloError::NotTls)
        );
        let mut finished = records(&hello_body(&[sni("a.b")]), 16_384);
        finished[5] = 20;
        assert_eq!(
            parse_client_hello(&finished, 65_536),
            Err(HelloError::NotClientHello)
        );
        let big = records(&hello_body(&[sni("a.b"), (21, vec![0; 3000])]), 16_384);
        assert_eq!(
            parse_client_hello(&big, 1024),
            Err(HelloError::TooLarge(1024))
        );
        let mut truncated_ext = hello_body(&[sni("a.b")]);
        let n = truncated_ext.len();
        truncated_ext[n - 3] = 200; // the name claims more bytes than follow
        assert_eq!(
            parse_client_hello(&records(&truncated_ext, 16_384), 65_536),
            Err(HelloError::Malformed)
        );
        let mut zero = vec![HANDSHAKE, 3, 3, 0, 0];
        zero.extend([0; 4]);
        assert_eq!(
            parse_client_hello(&zero, 65_536),
            Err(HelloError::Malformed)
        );
    }

    #[tokio::test]
    async fn a_hello_is_read_off_a_stream_and_replayed() {
        let wire = records(&hello_body(&[sni("x.y")]), 50);
        let (mut a, mut b) = tokio::io::duplex(64);
        let sent = wire.clone();
        let writer = tokio::spawn(async move {
            for part in sent.chunks(13) {
                a.write_all(part).await.unwrap();
            }
            a.write_all(b"after").await.unwrap();
            a
        });
        let hello = read_client_hello(&mut b, 65_536).await.unwrap();
        assert_eq!(hello.server_name.as_deref(), Some("x.y"));
        assert!(hello.bytes.starts_with(&wire));
        let _a = writer.await.unwrap();
        let mut replay = Prefixed {
            prefix: hello.bytes.clone(),
            at: 0,
            inner: b,
        };
        let mut got = vec![0u8; wire.len() + 5];
        replay.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[..wire.len()], &wire[..]);
        assert_eq!(&got[wire.len()..], b"after");
    }
}
