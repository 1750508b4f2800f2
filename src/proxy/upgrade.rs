//! HTTP/1.1 protocol upgrades (WebSocket, `appProtocol: kubernetes.io/ws`)
//! passed through.
//!
//! `Upgrade` and `Connection` are hop-by-hop, so the forwarding path strips
//! them; for a request that asks to upgrade they are put back on the way to
//! the backend, and when the backend answers 101 Switching Protocols on the
//! way back. Both connections are then handed over by hyper and the bytes
//! are copied both ways by a task of their own, which holds no route table:
//! a reload never cuts an upgraded connection.

use http::header::{CONNECTION, UPGRADE};
use http::{HeaderMap, HeaderValue, StatusCode, Version, request, response};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// A client request that asks to switch protocols.
pub(super) struct UpgradeRequest {
    /// The `Upgrade` header value (`websocket`).
    protocol: HeaderValue,
    client: OnUpgrade,
}

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
        let client = parts.extensions.remove::<OnUpgrade>()?;
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
        let Some(backend) = parts.extensions.remove::<OnUpgrade>() else {
            // Cannot happen with the HTTP/1.1 pool (it serves upgrades);
            // without the backend's half there is nothing to splice.
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

/// Copy bytes both ways until either side closes.
async fn splice(client: OnUpgrade, backend: OnUpgrade) {
    let (client, backend) = match tokio::try_join!(client, backend) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(error = %e, "upgrade failed");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut backend = TokioIo::new(backend);
    match tokio::io::copy_bidirectional(&mut client, &mut backend).await {
        Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
        Err(e) => tracing::debug!(error = %e, "upgraded connection ended with an error"),
    }
}
