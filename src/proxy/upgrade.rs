//! HTTP/1.1 protocol upgrades (WebSocket, `appProtocol: kubernetes.io/ws`)
//! passed through.
//!
//! `Upgrade` and `Connection` are hop-by-hop, so the forwarding path strips
//! them; for a request that asks to upgrade they are put back on the way to
//! the backend, and when the backend answers 101 Switching Protocols on the
//! way back. Both connections are then handed over (the client's by
//! sluice's HTTP/1.1 connection loop, [`super::inbound::h1_conn`], the
//! backend's by its HTTP/1.1 client, [`super::outbound::h1_client`]) and the
//! bytes are copied both ways by a task of their own, which holds no route
//! table: a reload never cuts an upgraded connection.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::header::{CONNECTION, UPGRADE};
use http::{HeaderMap, HeaderValue, StatusCode, Version, request, response};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use super::outbound::h1_client::{BackendUpgrade, BackendUpgraded};

/// A client request that asks to switch protocols.
pub(super) struct UpgradeRequest {
    /// The `Upgrade` header value (`websocket`).
    protocol: HeaderValue,
    client: ClientSide,
}

/// The client's connection once it is handed over.
enum ClientSide {
    Hyper(OnUpgrade),
    Lean(oneshot::Receiver<Upgraded>),
}

/// What the lean HTTP/1.1 loop hands over after a 101: the connection and
/// the bytes the client sent after its request head.
pub(super) struct Upgraded {
    pub io: Box<dyn UpgradedIo>,
    pub read_ahead: Bytes,
}

/// A client connection that can be handed over.
pub(super) trait UpgradedIo: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> UpgradedIo for T {}

/// A request extension of the lean loop's upgrade requests: where the loop
/// will hand the connection over (an extension must be `Clone`).
#[derive(Clone)]
pub(super) struct LeanUpgrade(pub Arc<Mutex<Option<oneshot::Receiver<Upgraded>>>>);

impl UpgradeRequest {
    /// Take the upgrade out of an HTTP/1.1 request that carries
    /// `Connection: upgrade` and an `Upgrade` header; `None` for any other
    /// request (HTTP/2 has no such upgrades).
    pub fn take(parts: &mut request::Parts) -> Option<Self> {
        if parts.version != Version::HTTP_11 {
            return None;
        }
        // Most requests have no Upgrade field: one lookup decides.
        let protocol = parts.headers.get(UPGRADE)?.clone();
        let asks = parts
            .headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
        if !asks {
            return None;
        }
        let client = match parts.extensions.remove::<OnUpgrade>() {
            Some(hyper) => ClientSide::Hyper(hyper),
            None => ClientSide::Lean(
                parts
                    .extensions
                    .remove::<LeanUpgrade>()?
                    .0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()?,
            ),
        };
        Some(UpgradeRequest { protocol, client })
    }

    /// Put the upgrade headers back on the request to the backend (after
    /// hop-by-hop headers were stripped).
    pub fn restore_request_headers(&self, headers: &mut HeaderMap) {
        set_upgrade_headers(headers, self.protocol.clone());
    }

    /// The backend answered. On 101 Switching Protocols: put the upgrade
    /// headers back on the response to the client and splice the two
    /// connections once both are handed over. Otherwise the upgrade is
    /// dropped and the response is an ordinary one.
    pub fn finish(self, parts: &mut response::Parts) {
        if parts.status != StatusCode::SWITCHING_PROTOCOLS {
            return;
        }
        let Some(backend) = parts
            .extensions
            .remove::<BackendUpgrade>()
            .and_then(|b| b.take())
        else {
            // Cannot happen (the HTTP/1.1 client hands 101s over); without
            // the backend's half there is nothing to splice.
            tracing::warn!("backend answered 101 but its connection cannot be taken over");
            parts.status = StatusCode::BAD_GATEWAY;
            return;
        };
        set_upgrade_headers(&mut parts.headers, self.protocol);
        tokio::spawn(splice(self.client, backend));
    }
}

fn set_upgrade_headers(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, protocol);
}

/// Copy bytes both ways until either side closes. The backend's side
/// first gives back what it sent after its 101.
async fn splice(client: ClientSide, backend: BackendUpgraded) {
    let mut backend = ReadAhead {
        first: backend.read_ahead,
        io: Box::new(backend.io),
    };
    let mut client: Box<dyn UpgradedIo> = match client {
        ClientSide::Hyper(client) => match client.await {
            Ok(client) => Box::new(TokioIo::new(client)),
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed");
                return;
            }
        },
        ClientSide::Lean(client) => match client.await {
            Ok(up) => Box::new(ReadAhead {
                first: up.read_ahead,
                io: up.io,
            }),
            // The loop did not hand the connection over (it closed).
            Err(_) => return,
        },
    };
    match tokio::io::copy_bidirectional(&mut client, &mut backend).await {
        Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
        Err(e) => tracing::debug!(error = %e, "upgraded connection ended with an error"),
    }
}

/// A handed-over connection that first gives back the bytes read from it
/// already.
struct ReadAhead {
    first: Bytes,
    io: Box<dyn UpgradedIo>,
}

impl AsyncRead for ReadAhead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.first.has_remaining() {
            let n = this.first.len().min(buf.remaining());
            buf.put_slice(&this.first[..n]);
            this.first.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for ReadAhead {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
