//! What the proxy watches on each client connection besides its requests:
//! whether a request is in flight (for the idle timeout) and, on HTTP/2
//! connections, the frames a client sends that cost the proxy work without
//! asking for any (PING and SETTINGS floods, rapid reset).
//!
//! hyper and h2 answer each PING and SETTINGS frame in turn and stop
//! reading while they cannot write, so a flood only fills socket buffers;
//! but it still holds the connection and a share of the CPU. Counting frame
//! headers as they are read lets the proxy close such a connection, which
//! is what Envoy does with its flood limits.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::proxy::body::ResponseBody;

/// Open client connections per client address, for
/// `max_connections_per_client`.
#[derive(Debug, Default)]
pub(in crate::proxy) struct PerClient {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One open connection of a client address, counted until dropped.
#[derive(Debug)]
pub(in crate::proxy) struct ClientSlot {
    clients: Arc<PerClient>,
    ip: IpAddr,
}

impl PerClient {
    /// Count a connection from `ip`, unless `max` are open already.
    pub fn admit(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            clients: self.clone(),
            ip,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Requests in flight on one connection: counted from when the request
/// arrives until its response body has been sent (or dropped), and when the
/// last one ended.
///
/// Nothing here wakes anyone or touches a timer per request: the idle
/// timer ([`InFlight::idle_for`]) is one sleep per idle period that, when it
/// fires, looks at these two numbers and sleeps again if the connection
/// was busy meanwhile.
#[derive(Debug)]
pub(in crate::proxy) struct InFlight {
    active: AtomicUsize,
    /// When the last request ended, in nanoseconds after `since`.
    last_end: AtomicU64,
    since: Instant,
}

impl InFlight {
    pub fn new() -> Arc<Self> {
        Arc::new(InFlight {
            active: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            since: Instant::now(),
        })
    }

    pub fn begin(self: &Arc<Self>) -> RequestGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        RequestGuard(self.clone())
    }

    fn last_end(&self) -> Instant {
        self.since + Duration::from_nanos(self.last_end.load(Ordering::Acquire))
    }

    /// Resolves once the connection has had no request in flight for
    /// `idle` without interruption.
    pub async fn idle_for(&self, idle: Duration) {
        let sleep = tokio::time::sleep(idle);
        tokio::pin!(sleep);
        loop {
            sleep.as_mut().await;
            let now = Instant::now();
            let next = if self.active.load(Ordering::Acquire) > 0 {
                // Busy now: it cannot be idle for `idle` before then.
                now + idle
            } else {
                let deadline = self.last_end() + idle;
                if deadline <= now {
                    return;
                }
                deadline
            };
            sleep.as_mut().reset(next);
        }
    }
}

/// One request in flight; dropping it ends the request.
#[derive(Debug)]
pub(in crate::proxy) struct RequestGuard(Arc<InFlight>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let flight = &self.0;
        // Saturates after ~584 years of one connection.
        let at = u64::try_from(flight.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // Stored before the count drops, so a timer that sees the count at
        // zero also sees this end.
        flight.last_end.fetch_max(at, Ordering::AcqRel);
        flight.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as in flight until the
/// body is done.
#[derive(Debug)]
pub(in crate::proxy) struct TrackedBody {
    body: ResponseBody,
    guard: Option<RequestGuard>,
}

impl TrackedBody {
    pub fn new(body: ResponseBody, guard: RequestGuard) -> Self {
        TrackedBody {
            body,
            guard: Some(guard),
        }
    }
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = <ResponseBody as Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = &polled {
            this.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The client preface that starts every HTTP/2 connection.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const FRAME_DATA: u8 = 0x0;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_PRIORITY: u8 = 0x2;
const FRAME_RST_STREAM: u8 = 0x3;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_PING: u8 = 0x6;
const FLAG_ACK: u8 = 0x1;
const FLAG_END_STREAM: u8 = 0x1;

/// The HTTP/2 flood limits of one connection.
#[derive(Debug, Clone, Copy)]
pub(in crate::proxy) struct FloodLimits {
    pub max_control_frames: u32,
    pub reset_streams_threshold: u32,
}

/// Reads HTTP/2 frame headers as the bytes go by (the payloads are not
/// looked at) and says when a client is flooding.
#[derive(Debug)]
pub(in crate::proxy) struct FrameWatch {
    limits: FloodLimits,
    phase: Phase,
    /// Frames that do no work since the last HEADERS or DATA frame.
    idle_frames: u32,
    streams: u32,
    resets: u32,
}

#[derive(Debug)]
enum Phase {
    /// Matching the client preface; this many bytes matched so far.
    Preface(usize),
    /// Not HTTP/2: nothing to watch.
    Plain,
    Header {
        buf: [u8; 9],
        filled: usize,
    },
    Payload {
        remaining: usize,
    },
}

/// Why a connection was closed for flooding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::proxy) enum Flood {
    ControlFrames,
    RapidReset,
}

impl std::fmt::Display for Flood {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Flood::ControlFrames => "HTTP/2 control frame flood",
            Flood::RapidReset => "HTTP/2 rapid reset",
        })
    }
}

impl FrameWatch {
    pub fn new(limits: FloodLimits) -> Self {
        FrameWatch {
            limits,
            phase: Phase::Preface(0),
            idle_frames: 0,
            streams: 0,
            resets: 0,
        }
    }

    /// Account for bytes the client sent, in order.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), Flood> {
        while !bytes.is_empty() {
            match &mut self.phase {
                Phase::Plain => return Ok(()),
                Phase::Preface(matched) => {
                    let take = (H2_PREFACE.len() - *matched).min(bytes.len());
                    if bytes[..take] != H2_PREFACE[*matched..*matched + take] {
                        self.phase = Phase::Plain;
                        return Ok(());
                    }
                    *matched += take;
                    bytes = &bytes[take..];
                    if *matched == H2_PREFACE.len() {
                        self.phase = Phase::Header {
                            buf: [0; 9],
                            filled: 0,
                        };
                    }
                }
                Phase::Header { buf, filled } => {
                    let take = (9 - *filled).min(bytes.len());
                    buf[*filled..*filled + take].copy_from_slice(&bytes[..take]);
                    *filled += take;
                    bytes = &bytes[take..];
                    if *filled == 9 {
                        let head = *buf;
                        let len = usize::from(head[0]) << 16
                            | usize::from(head[1]) << 8
                            | usize::from(head[2]);
                        self.phase = Phase::Payload { remaining: len };
                        self.on_frame(head[3], head[4], len)?;
                    }
                }
                Phase::Payload { remaining } => {
                    let take = (*remaining).min(bytes.len());
                    *remaining -= take;
                    bytes = &bytes[take..];
                    if *remaining == 0 {
                        self.phase = Phase::Header {
                            buf: [0; 9],
                            filled: 0,
                        };
                    }
                }
            }
        }
        // A frame with an empty payload ends as soon as its header does.
        if let Phase::Payload { remaining: 0 } = self.phase {
            self.phase = Phase::Header {
                buf: [0; 9],
                filled: 0,
            };
        }
        Ok(())
    }

    fn on_frame(&mut self, kind: u8, flags: u8, len: usize) -> Result<(), Flood> {
        let no_work = match kind {
            FRAME_HEADERS => {
                self.streams = self.streams.saturating_add(1);
                false
            }
            FRAME_DATA => len == 0 && flags & FLAG_END_STREAM == 0,
            FRAME_PING | FRAME_SETTINGS => flags & FLAG_ACK == 0,
            FRAME_PRIORITY => true,
            FRAME_RST_STREAM => {
                self.resets = self.resets.saturating_add(1);
                let threshold = self.limits.reset_streams_threshold;
                if self.streams >= threshold && self.resets.saturating_mul(2) >= self.streams {
                    return Err(Flood::RapidReset);
                }
                false
            }
            _ => false,
        };
        if no_work {
            self.idle_frames += 1;
            if self.idle_frames > self.limits.max_control_frames {
                return Err(Flood::ControlFrames);
            }
        } else if matches!(kind, FRAME_HEADERS | FRAME_DATA) {
            self.idle_frames = 0;
        }
        Ok(())
    }
}

/// A client connection's transport, with its HTTP/2 frames watched.
pub(in crate::proxy) struct Watched<S> {
    inner: S,
    watch: FrameWatch,
    flooded: Option<Flood>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, limits: FloodLimits) -> Self {
        Watched {
            inner,
            watch: FrameWatch::new(limits),
            flooded: None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(flood) = this.flooded {
            return Poll::Ready(Err(io::Error::other(flood.to_string())));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled
            && let Err(flood) = this.watch.feed(&buf.filled()[before..])
        {
            this.flooded = Some(flood);
            tracing::info!(reason = %flood, "closing the connection");
            return Poll::Ready(Err(io::Error::other(flood.to_string())));
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_counted_per_client_address() {
        let clients = Arc::new(PerClient::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = clients.admit(a, 2).expect("first");
        let _second = clients.admit(a, 2).expect("second");
        assert!(clients.admit(a, 2).is_none(), "a third from a");
        let _other = clients.admit(b, 2).expect("b has its own count");
        drop(first);
        let _again = clients.admit(a, 2).expect("room again");
        drop((_second, _again, _other));
        assert!(
            clients.open.lock().unwrap().is_empty(),
            "nothing left behind"
        );
    }

    const LIMITS: FloodLimits = FloodLimits {
        max_control_frames: 3,
        reset_streams_threshold: 4,
    };

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&[0, 0, 0, 1]);
        f.extend_from_slice(payload);
        f
    }

    fn h2(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut out = H2_PREFACE.to_vec();
        for f in frames {
            out.extend_from_slice(f);
        }
        out
    }

    /// Feed `bytes` one byte at a time (frames split anywhere must count
    /// the same).
    fn feed_bytewise(watch: &mut FrameWatch, bytes: &[u8]) -> Result<(), Flood> {
        for b in bytes {
            watch.feed(std::slice::from_ref(b))?;
        }
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn idle_is_the_period_after_the_last_request_ended() {
        let idle = Duration::from_secs(10);
        // No request at all: idle after one period.
        let quiet = InFlight::new();
        let start = Instant::now();
        quiet.idle_for(idle).await;
        assert_eq!(start.elapsed(), idle);

        // A request in flight through the first period, then another that
        // starts and ends within the next one: idle one period after the
        // last end, not before.
        let flight = InFlight::new();
        let first = flight.begin();
        let start = Instant::now();
        let timer = tokio::spawn({
            let flight = flight.clone();
            async move {
                flight.idle_for(idle).await;
                Instant::now()
            }
        });
        tokio::time::sleep(Duration::from_secs(15)).await;
        drop(first);
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(flight.begin());
        let last_end = Instant::now();
        let fired = timer.await.expect("the timer task ends");
        assert!(
            fired >= last_end + idle,
            "fired {:?} after start",
            fired - start
        );
        assert!(fired <= last_end + idle + Duration::from_millis(2));
    }

    #[test]
    fn http1_is_never_watched() {
        let mut w = FrameWatch::new(LIMITS);
        let mut req = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        req.extend(std::iter::repeat_n(FRAME_PING, 1000));
        assert_eq!(w.feed(&req), Ok(()));
        assert!(matches!(w.phase, Phase::Plain));
    }

    #[test]
    fn pings_in_a_row_beyond_the_limit_are_a_flood() {
        let ping = frame(FRAME_PING, 0, &[0; 8]);
        let mut w = FrameWatch::new(LIMITS);
        let ok = h2(&[
            frame(FRAME_SETTINGS, 0, &[]),
            ping.clone(),
            ping.clone(),
            // A request resets the count.
            frame(FRAME_HEADERS, 0x4, &[0x82]),
            ping.clone(),
            // ACKs are answers, not requests for work.
            frame(FRAME_PING, FLAG_ACK, &[0; 8]),
            frame(FRAME_SETTINGS, FLAG_ACK, &[]),
            ping.clone(),
            ping.clone(),
        ]);
        assert_eq!(feed_bytewise(&mut w, &ok), Ok(()));
        assert_eq!(w.feed(&ping), Err(Flood::ControlFrames));
    }

    #[test]
    fn empty_data_frames_count_but_end_of_stream_does_not() {
        let mut w = FrameWatch::new(LIMITS);
        let empty = frame(FRAME_DATA, 0, &[]);
        let end = frame(FRAME_DATA, FLAG_END_STREAM, &[]);
        let ok = h2(&[
            empty.clone(),
            empty.clone(),
            end,
            empty.clone(),
            empty.clone(),
        ]);
        assert_eq!(w.feed(&ok), Ok(()));
        assert_eq!(w.feed(&empty), Ok(()));
        assert_eq!(w.feed(&empty), Err(Flood::ControlFrames));
    }

    #[test]
    fn resetting_half_the_streams_past_the_threshold_is_rapid_reset() {
        let headers = frame(FRAME_HEADERS, 0x5, &[0x82]);
        let rst = frame(FRAME_RST_STREAM, 0, &[0, 0, 0, 8]);
        let mut w = FrameWatch::new(LIMITS);
        // Below the threshold of streams, resets are tolerated.
        let few = h2(&[headers.clone(), rst.clone(), headers.clone(), rst.clone()]);
        assert_eq!(feed_bytewise(&mut w, &few), Ok(()));
        assert_eq!(w.feed(&headers), Ok(()));
        assert_eq!(w.feed(&headers), Ok(()));
        // Four streams opened, three reset: at least half, a flood.
        assert_eq!(w.feed(&rst), Err(Flood::RapidReset));

        let mut calm = FrameWatch::new(LIMITS);
        let mostly_ok = h2(&[
            headers.clone(),
            headers.clone(),
            headers.clone(),
            headers.clone(),
            headers.clone(),
            rst.clone(),
        ]);
        assert_eq!(calm.feed(&mostly_ok), Ok(()));
    }
}
