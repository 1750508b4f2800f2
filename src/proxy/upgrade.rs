//! HTTP/1.1 protocol upgrades (WebSocket, `appProtocol: kubernetes.io/ws`)
//! passed through.
//!
//! `Upgrade` and `Connection` are hop-by-hop, so the forwarding path strips
//! them; for a request that asks to upgrade they are put back on the way to
//! the backend, and when the backend answers 101 Switching Protocols on the
//! way back. Both connections are then handed over (the client's by the
//! lean HTTP/1.1 loop, the backend's by the response of sluice's HTTP/1.1
//! client) and the bytes are copied both ways by a task of their own,
//! which holds no route table: a reload never cuts an upgraded connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::header::{CONNECTION, UPGRADE};
use http::{HeaderValue, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use super::body::ResponseBody;
use super::head::{Fields, ProxyResponse};

/// A client request that asks to switch protocols.
pub(super) struct UpgradeRequest {
    /// The `Upgrade` header value (`websocket`).
    protocol: HeaderValue,
    client: oneshot::Receiver<Upgraded>,
}

/// What the lean HTTP/1.1 loop hands over after a 101: the connection and
/// the bytes the client sent after its request head.
pub(super) struct Upgraded {
    pub io: Box<dyn UpgradedIo>,
    pub read_ahead: Bytes,
}

/// A connection that can be handed over.
pub(super) trait UpgradedIo: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> UpgradedIo for T {}

/// Where the lean loop will hand a client's connection over, for a request
/// its parser found asking to upgrade (`Connection: upgrade` and an
/// `Upgrade` field, on HTTP/1.1).
pub(super) struct ClientUpgrade(pub oneshot::Receiver<Upgraded>);

impl UpgradeRequest {
    /// The upgrade a request asks for, if the client's connection can be
    /// handed over (HTTP/2 has no such upgrades).
    pub fn take(version: Version, headers: &Fields, client: Option<ClientUpgrade>) -> Option<Self> {
        let client = client?;
        if version != Version::HTTP_11 {
            return None;
        }
        let protocol = headers.value(&UPGRADE)?;
        Some(UpgradeRequest {
            protocol,
            client: client.0,
        })
    }

    /// Put the upgrade headers back on the request to the backend (after
    /// hop-by-hop headers were stripped).
    pub fn restore_request_headers(&self, headers: &mut Fields) {
        set_upgrade_headers(headers, self.protocol.clone());
    }

    /// The backend answered. On 101 Switching Protocols: put the upgrade
    /// headers back on the response to the client and splice the two
    /// connections once both are handed over. Otherwise the upgrade is
    /// dropped and the response is an ordinary one.
    pub fn finish(self, resp: &mut ProxyResponse) {
        if resp.status != StatusCode::SWITCHING_PROTOCOLS {
            return;
        }
        let backend = match &mut resp.body {
            ResponseBody::Pooled(body) => body.take_upgraded(),
            _ => None,
        };
        let Some((io, read_ahead)) = backend else {
            // Only sluice's HTTP/1.1 client carries upgrades; without the
            // backend's half there is nothing to splice.
            tracing::warn!("backend answered 101 but its connection cannot be taken over");
            resp.status = StatusCode::BAD_GATEWAY;
            return;
        };
        set_upgrade_headers(&mut resp.headers, self.protocol);
        let backend = ReadAhead {
            first: read_ahead,
            io: Box::new(io),
        };
        tokio::spawn(splice(self.client, backend));
    }
}

fn set_upgrade_headers(headers: &mut Fields, protocol: HeaderValue) {
    headers.set(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.set(UPGRADE, protocol);
}

/// Copy bytes both ways until either side closes.
async fn splice(client: oneshot::Receiver<Upgraded>, mut backend: ReadAhead) {
    let mut client = match client.await {
        Ok(up) => ReadAhead {
            first: up.read_ahead,
            io: up.io,
        },
        // The loop did not hand the connection over (it closed).
        Err(_) => return,
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
