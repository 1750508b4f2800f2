//! Accepting client connections on a bound socket: the connection limits
//! (per socket, in total, per client address), then, per connection, what
//! it speaks: TLS listeners go to [`passthrough`], HTTPS sockets through
//! the TLS handshake (ALPN picks HTTP/2 or HTTP/1.1), cleartext sockets by
//! their first bytes (the HTTP/2 preface or not).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use super::conn::ClientSlot;
use super::{h1_conn, h2_conn, passthrough, tls};
use crate::proxy::request::handler;
use crate::proxy::{Shared, TlsConnection};

/// What holds a client connection's places under the connection limits:
/// per socket, in total, and per client address (when limited).
pub(in crate::proxy) type Permits = (
    OwnedSemaphorePermit,
    OwnedSemaphorePermit,
    Option<ClientSlot>,
);

pub(in crate::proxy) fn listen(bind: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if bind.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(bind)?;
    socket.listen(1024)
}

pub(in crate::proxy) async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    bind: SocketAddr,
    per_listener: Arc<Semaphore>,
) {
    // Built once per socket (and worker); the certificate is picked per
    // handshake from the current table, so reloads change certificates
    // without rebinding.
    let acceptor = TlsAcceptor::from(tls::server_config(shared.clone(), bind));
    loop {
        let (stream, client) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: back off briefly
                // instead of spinning.
                tracing::warn!(%bind, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Over a limit: close at once (the client sees the connection
        // closed before any response); open connections are untouched.
        let Ok(listener_permit) = per_listener.clone().try_acquire_owned() else {
            tracing::debug!(%bind, %client, "listener connection limit reached; closing");
            continue;
        };
        let Ok(total_permit) = shared.connections.clone().try_acquire_owned() else {
            tracing::debug!(%bind, %client, "connection limit reached; closing");
            continue;
        };
        let per_client = match shared.limits.max_connections_per_client {
            0 => None,
            max => match shared.per_client.admit(client.ip(), max) {
                Some(slot) => Some(slot),
                None => {
                    tracing::debug!(%bind, %client, "connection limit per client reached; closing");
                    continue;
                }
            },
        };
        let permits = (listener_permit, total_permit, per_client);
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        // Whether the socket terminates TLS is read per connection: a
        // reload may turn a port's listeners from HTTP to HTTPS (or TLS).
        let (is_tls, is_stream) = shared
            .table
            .load()
            .port(bind)
            .map_or((false, false), |p| (p.is_tls(), p.is_stream()));
        if is_stream {
            // TLS listeners: routed by SNI, relayed (passthrough.rs).
            tokio::spawn(passthrough::serve(shared, stream, client, bind, permits));
            continue;
        }
        if !is_tls {
            tokio::spawn(serve_cleartext(shared, stream, client, bind, permits));
            continue;
        }
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            // Boxed: the handshake's future is freed once it is done, instead
            // of sizing the connection's task for the connection's whole life
            // (3.7 KB more per idle TLS connection, measured with DHAT).
            let handshake = Box::pin(acceptor.accept(stream));
            let stream = match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(%client, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%client, "TLS handshake timed out");
                    return;
                }
            };
            let server_name = stream.get_ref().1.server_name().map(Arc::from);
            let tls = Some(TlsConnection { server_name });
            if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                // A task of its own, as HTTP/1.1's below.
                tokio::spawn(h2_conn::serve(shared, stream, tls, client, bind, permits));
            } else {
                let head_by = tokio::time::Instant::now() + shared.limits.request_header_timeout;
                // A task of its own: this one (the handshake's) ends, and
                // the idle connection's task is no larger than its loop.
                let peer = handler::Peer::new(client);
                let h1 = h1_conn::serve(shared, stream, tls, peer, bind, permits, Some(head_by));
                tokio::spawn(h1);
            }
        });
    }
}

/// Serve a cleartext connection: HTTP/2 with prior knowledge (h2c) through
/// hyper, anything else on the lean HTTP/1.1 path. The first bytes are
/// peeked, not read, so either gets them all.
async fn serve_cleartext(
    shared: Arc<Shared>,
    stream: tokio::net::TcpStream,
    client: SocketAddr,
    bind: SocketAddr,
    permits: Permits,
) {
    let deadline = tokio::time::Instant::now() + shared.limits.request_header_timeout;
    let mut draining = shared.draining.subscribe();
    let h2 = tokio::select! {
        h2 = starts_with_h2_preface(&stream, deadline) => h2,
        // A connection that has sent nothing yet is idle: close it.
        _ = draining.wait_for(|d| *d) => return,
    };
    // Either protocol's connection is a task of its own, not awaited here:
    // this future's arguments and the peek would stay in the connection's
    // task for its whole life (500 bytes per idle HTTP/1.1 connection).
    if h2 {
        tokio::spawn(h2_conn::serve(shared, stream, None, client, bind, permits));
    } else {
        // The first head is due by the same deadline as the first bytes.
        let peer = handler::Peer::new(client);
        let h1 = h1_conn::serve(shared, stream, None, peer, bind, permits, Some(deadline));
        tokio::spawn(h1);
    }
}

/// Whether the client's first bytes start the HTTP/2 preface (`PRI`, a
/// method nothing else uses). `false` as soon as they cannot, or when the
/// connection closes or sends nothing before `deadline` (the HTTP/1.1 loop
/// then sees the same).
async fn starts_with_h2_preface(
    stream: &tokio::net::TcpStream,
    deadline: tokio::time::Instant,
) -> bool {
    const START: &[u8; 3] = b"PRI";
    let mut first = [0u8; 3];
    loop {
        match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
            Ok(Ok(n)) if n > 0 => {
                if first[..n] != START[..n] {
                    return false;
                }
                if n == START.len() {
                    return true;
                }
                // `P` or `PR` so far (a POST or PUT could still follow).
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            _ => return false,
        }
    }
}
