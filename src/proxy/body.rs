//! Bodies on both sides of the proxy, streamed frame by frame.
//!
//! Nothing here buffers a whole body. A request that is mirrored has its
//! body teed: each frame goes to the backend and, through a small bounded
//! channel filled with `try_send`, to each mirror. A mirror that falls
//! behind is cut off (its copy fails) so it can never slow the client down.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::sync::mpsc;
use tokio::time::Sleep;

use super::error::ProxyError;
use super::outbound::h1_client::PooledBody;

/// The error type of bodies sent upstream.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Frames a mirror may lag behind the backend before it is dropped.
pub const MIRROR_BUFFER_FRAMES: usize = 64;

/// A request body as the client connection delivers it: hyper's (HTTP/2,
/// and HTTP/1.1 before the lean path), or the lean HTTP/1.1 path's.
#[derive(Debug)]
pub enum RequestBody {
    Hyper(Incoming),
    Lean(LeanBody),
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            RequestBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            RequestBody::Lean(b) => b.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Hyper(b) => b.is_end_stream(),
            RequestBody::Lean(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Hyper(b) => b.size_hint(),
            RequestBody::Lean(b) => b.size_hint(),
        }
    }
}

/// A request body read by the lean HTTP/1.1 connection loop
/// ([`super::inbound::h1_conn`]): its frames arrive through a small channel that
/// the loop fills as the client's bytes come (so a body is read only as
/// fast as the backend takes it).
#[derive(Debug)]
pub struct LeanBody {
    rx: Option<mpsc::Receiver<Result<Bytes, BoxError>>>,
    /// Bytes still to come, for a Content-Length body.
    remaining: Option<u64>,
}

impl LeanBody {
    /// A request without a body.
    pub fn empty() -> Self {
        LeanBody {
            rx: None,
            remaining: Some(0),
        }
    }

    /// A body whose frames come from `rx`; `length` when Content-Length
    /// gave it.
    pub fn new(rx: mpsc::Receiver<Result<Bytes, BoxError>>, length: Option<u64>) -> Self {
        LeanBody {
            rx: Some(rx),
            remaining: length,
        }
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(rx) = &mut self.rx else {
            return Poll::Ready(None);
        };
        match ready!(rx.poll_recv(cx)) {
            Some(Ok(data)) => {
                if let Some(left) = &mut self.remaining {
                    *left = left.saturating_sub(data.len() as u64);
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Some(Err(e)) => {
                self.rx = None;
                Poll::Ready(Some(Err(e)))
            }
            None => {
                self.rx = None;
                match self.remaining {
                    Some(left) if left > 0 => {
                        Poll::Ready(Some(Err("the request body was cut short".into())))
                    }
                    _ => Poll::Ready(None),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none() || self.remaining == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}

/// The client's request body, with its first frame possibly read ahead so
/// that a malformed body is refused before anything reaches a backend.
/// Its errors are [`ClientBodyError`]s, so a failed exchange can tell a
/// broken client body (400) from a broken backend (502).
#[derive(Debug)]
pub struct ClientBody {
    first: Option<Frame<Bytes>>,
    inner: RequestBody,
    /// HTTP/2 (hyper's bodies): how long the client may send nothing
    /// while the body is waited for. The lean HTTP/1.1 path times its
    /// reads itself. Boxed: every request's future holds this body.
    idle: Option<Box<IdleTimer>>,
}

/// How long a body may wait for the client: armed when a wait starts,
/// disarmed when a frame comes (one timer per body, reset for each wait).
#[derive(Debug)]
struct IdleTimer {
    limit: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl IdleTimer {
    /// The body is waiting for the client: has it waited too long?
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = tokio::time::Instant::now() + self.limit;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            sleep.as_mut().reset(deadline);
            self.armed = true;
        }
        sleep.as_mut().poll(cx).is_ready()
    }
}

/// The client's request body failed (malformed chunked encoding, a reset).
#[derive(Debug, thiserror::Error)]
#[error("client request body: {0}")]
pub struct ClientBodyError(#[source] pub BoxError);

impl ClientBody {
    /// The client's body; a hyper body fails with [`BodyTimedOut`] once
    /// the client sent nothing of it for `idle` while it was waited for.
    pub fn new(inner: RequestBody, idle: Duration) -> Self {
        let idle = matches!(inner, RequestBody::Hyper(_)).then(|| {
            Box::new(IdleTimer {
                limit: idle,
                sleep: None,
                armed: false,
            })
        });
        ClientBody {
            first: None,
            inner,
            idle,
        }
    }

    /// Read the first frame now (it is sent first when the body is polled).
    pub async fn read_ahead(&mut self) -> Result<(), BoxError> {
        use http_body_util::BodyExt;
        if let Some(frame) = self.inner.frame().await.transpose()? {
            self.first = Some(frame);
        }
        Ok(())
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(frame) = this.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Some(idle) = &mut this.idle {
            if polled.is_ready() {
                idle.armed = false;
            } else if idle.expired(cx) {
                this.idle = None;
                return Poll::Ready(Some(Err(ClientBodyError(Box::new(BodyTimedOut)))));
            }
        }
        polled.map_err(ClientBodyError)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.first {
            None => self.inner.size_hint(),
            Some(_) => SizeHint::default(),
        }
    }
}

/// The client sent nothing of its request body for the body timeout.
#[derive(Debug, thiserror::Error)]
#[error("the client sent nothing of its request body for too long")]
pub struct BodyTimedOut;

/// How the client's body failed, when `err` or anything it was caused by
/// is a failure of it: it stalled past the body timeout (408), or it broke
/// (400).
pub fn client_body_failure(err: &(dyn std::error::Error + 'static)) -> Option<ProxyError> {
    let mut cur = Some(err);
    let mut client = false;
    while let Some(e) = cur {
        if e.is::<BodyTimedOut>() {
            return Some(ProxyError::BodyTimeout);
        }
        client |= e.is::<ClientBodyError>();
        cur = e.source();
    }
    client.then_some(ProxyError::BadRequest("malformed request body"))
}

/// A response body sent to the client: the backend's, streamed, or a short
/// one made by the proxy (errors, redirects).
#[derive(Debug)]
pub enum ResponseBody {
    Upstream(Incoming),
    /// The backend's, on a connection of the HTTP/1.1 pool.
    Pooled(PooledBody),
    Full(Option<Bytes>),
}

impl ResponseBody {
    pub fn full(text: &'static str) -> Self {
        ResponseBody::Full(Some(Bytes::from_static(text.as_bytes())))
    }

    pub fn empty() -> Self {
        ResponseBody::Full(None)
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ResponseBody::Upstream(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            ResponseBody::Pooled(b) => Pin::new(b).poll_frame(cx),
            ResponseBody::Full(b) => Poll::Ready(b.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Upstream(b) => b.is_end_stream(),
            ResponseBody::Pooled(b) => b.is_end_stream(),
            ResponseBody::Full(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Upstream(b) => b.size_hint(),
            ResponseBody::Pooled(b) => b.size_hint(),
            ResponseBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ResponseBody::Full(None) => SizeHint::with_exact(0),
        }
    }
}

/// A request body sent to a backend or a mirror.
#[derive(Debug)]
pub enum UpstreamBody {
    Empty,
    /// The client's body, passed through.
    Incoming(ClientBody),
    /// The client's body, copied to mirrors as it passes through.
    Tee(Tee),
    /// A mirror's copy of the client's body.
    Mirror(MirrorCopy),
    /// The client's body as one try of several sends it (a retry policy;
    /// see [`super::outbound::replay`]).
    Replay(super::outbound::replay::ReplayBody),
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            UpstreamBody::Empty => Poll::Ready(None),
            UpstreamBody::Incoming(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpstreamBody::Tee(t) => t.poll_frame(cx),
            UpstreamBody::Mirror(m) => m.poll_frame(cx),
            UpstreamBody::Replay(r) => Pin::new(r).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Empty => true,
            UpstreamBody::Incoming(b) => b.is_end_stream(),
            UpstreamBody::Tee(t) => t.inner.is_end_stream(),
            UpstreamBody::Mirror(m) => m.done,
            UpstreamBody::Replay(r) => r.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Empty => SizeHint::with_exact(0),
            UpstreamBody::Incoming(b) => b.size_hint(),
            UpstreamBody::Tee(t) => t.inner.size_hint(),
            UpstreamBody::Mirror(m) => m.size,
            UpstreamBody::Replay(r) => r.size_hint(),
        }
    }
}

enum MirrorFrame {
    Frame(Frame<Bytes>),
    /// The client's body ended normally.
    End,
}

impl std::fmt::Debug for MirrorFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MirrorFrame::Frame(_) => f.write_str("Frame"),
            MirrorFrame::End => f.write_str("End"),
        }
    }
}

/// The client's body on its way to the backend, copying every frame to the
/// mirrors that keep up.
#[derive(Debug)]
pub struct Tee {
    inner: ClientBody,
    mirrors: Vec<mpsc::Sender<MirrorFrame>>,
}

impl Tee {
    /// Wrap `inner`; call [`Tee::add_mirror`] for each mirror.
    pub fn new(inner: ClientBody) -> Self {
        Tee {
            inner,
            mirrors: Vec::new(),
        }
    }

    /// A new copy of the body for one mirror. It starts where the body is
    /// now, so add mirrors before the body is polled.
    pub fn add_mirror(&mut self) -> MirrorCopy {
        let (tx, rx) = mpsc::channel(MIRROR_BUFFER_FRAMES);
        self.mirrors.push(tx);
        MirrorCopy {
            rx,
            size: self.inner.size_hint(),
            done: false,
        }
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                let copy = if let Some(d) = f.data_ref() {
                    Some(Frame::data(d.clone()))
                } else {
                    f.trailers_ref().map(|t| Frame::trailers(t.clone()))
                };
                if let Some(copy) = copy {
                    self.send(copy);
                }
                if self.inner.is_end_stream() {
                    self.finish();
                }
            }
            // The body ended: tell the mirrors it is complete.
            None => self.finish(),
            // The client's body failed: dropping the senders fails the copies.
            Some(Err(_)) => self.mirrors.clear(),
        }
        Poll::Ready(frame.map(|r| r.map_err(Into::into)))
    }

    fn send(&mut self, frame: Frame<Bytes>) {
        match self.mirrors.len() {
            0 => {}
            1 => {
                if self.mirrors[0].try_send(MirrorFrame::Frame(frame)).is_err() {
                    self.mirrors.clear();
                }
            }
            _ => self.mirrors.retain(|tx| {
                let copy = match (frame.data_ref(), frame.trailers_ref()) {
                    (Some(d), _) => Frame::data(d.clone()),
                    (None, Some(t)) => Frame::trailers(t.clone()),
                    (None, None) => return true,
                };
                tx.try_send(MirrorFrame::Frame(copy)).is_ok()
            }),
        }
    }

    fn finish(&mut self) {
        for tx in self.mirrors.drain(..) {
            // A full channel here means the mirror lagged: its copy fails.
            let _ = tx.try_send(MirrorFrame::End);
        }
    }
}

/// A mirror's copy of the client's body. It fails (rather than ending
/// early and looking complete) when the mirror fell behind.
#[derive(Debug)]
pub struct MirrorCopy {
    rx: mpsc::Receiver<MirrorFrame>,
    size: SizeHint,
    done: bool,
}

impl MirrorCopy {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match ready!(self.rx.poll_recv(cx)) {
            Some(MirrorFrame::Frame(f)) => Poll::Ready(Some(Ok(f))),
            Some(MirrorFrame::End) => {
                self.done = true;
                Poll::Ready(None)
            }
            None => {
                self.done = true;
                Poll::Ready(Some(Err(
                    "mirror fell behind or the client's body failed".into()
                )))
            }
        }
    }
}
