//! HTTP/2 client connections (h2c with prior knowledge, or TLS with ALPN
//! `h2`), served by hyper: each request goes to the same
//! codec-independent [`handler`] as HTTP/1.1's, and the connection is
//! closed when idle too long or when the proxy drains.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::accept::Permits;
use super::conn::{FloodLimits, InFlight, TrackedBody, Watched};
use crate::proxy::body::RequestBody;
use crate::proxy::limits;
use crate::proxy::request::handler;
use crate::proxy::{Shared, TlsConnection};

/// Serve the requests of one HTTP/2 client connection (h2c, or TLS with
/// ALPN `h2`) through hyper, until the client closes it, it has been idle
/// too long, or the proxy drains. `_permits` hold its places under the
/// connection limits. (HTTP/1.1 connections are served by
/// [`h1_conn::serve`](super::h1_conn::serve); hyper's auto server still detects the version.)
pub(in crate::proxy) async fn serve<S>(
    shared: Arc<Shared>,
    stream: S,
    tls: Option<TlsConnection>,
    client: SocketAddr,
    bind: SocketAddr,
    _permits: Permits,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let in_flight = InFlight::new();
    let for_requests = shared.clone();
    let requests = in_flight.clone();
    let peer = handler::Peer::new(client);
    let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        let guard = requests.begin();
        let shared = for_requests.clone();
        let peer = peer.clone();
        if let Some(tls) = &tls {
            req.extensions_mut().insert(tls.clone());
        }
        async move {
            let resp = match limits::refuse(&shared.limits, &req) {
                Some(refused) => {
                    if let Some(reason) = refused.refusal_reason() {
                        shared.metrics.record_refusal(reason);
                    }
                    refused.into_response()
                }
                None => handler::handle(&shared, req.map(RequestBody::Hyper), &peer, bind).await,
            };
            Ok::<_, Infallible>(resp.map(|body| TrackedBody::new(body, guard)))
        }
    });
    let flood = FloodLimits {
        max_control_frames: shared.limits.http2_max_control_frames,
        reset_streams_threshold: shared.limits.http2_reset_streams_threshold,
    };
    let conn = shared
        .server
        .serve_connection_with_upgrades(TokioIo::new(Watched::new(stream, flood)), service);
    tokio::pin!(conn);
    let mut draining = shared.draining.subscribe();
    let mut closing = false;
    loop {
        tokio::select! {
            // The connection first: it is what wakes this task for nearly
            // every request, and its end ends the loop.
            biased;
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(%client, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = in_flight.idle_for(shared.limits.idle_timeout), if !closing => {
                tracing::debug!(%client, "idle timeout; closing the connection");
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = draining.wait_for(|d| *d), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
