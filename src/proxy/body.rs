//! Bodies on both sides of the proxy, streamed frame by frame.
//!
//! Nothing here buffers a whole body. A request that is mirrored has its
//! body teed: each frame goes to the backend and, through a small bounded
//! channel filled with `try_send`, to each mirror. A mirror that falls
//! behind is cut off (its copy fails) so it can never slow the client down.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::sync::mpsc;

use super::h1::ChunkedWalker;
use super::h1_client::PooledBody;

/// The error type of bodies sent upstream.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Frames a mirror may lag behind the backend before it is dropped.
pub const MIRROR_BUFFER_FRAMES: usize = 64;

/// How a request body goes to an HTTP/1.1 endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body.
    Empty,
    /// This many bytes (Content-Length).
    Length(u64),
    /// The chunks an HTTP/1.1 client sent, framing included: passed on as
    /// they are.
    Chunked,
    /// Data of a length not known in advance (HTTP/2 without
    /// `content-length`): chunked on the way out.
    Unknown,
}

/// A request body as the client connection delivers it: hyper's (HTTP/2),
/// or the lean HTTP/1.1 path's.
#[derive(Debug)]
pub enum RequestBody {
    Hyper(Incoming),
    Lean(LeanBody),
}

impl RequestBody {
    /// How the body is framed; see [`BodyFraming`].
    pub fn framing(&self) -> BodyFraming {
        match self {
            RequestBody::Lean(b) if b.chunked && !b.is_end_stream() => BodyFraming::Chunked,
            _ if self.is_end_stream() => BodyFraming::Empty,
            _ => match self.size_hint().exact() {
                Some(n) => BodyFraming::Length(n),
                None => BodyFraming::Unknown,
            },
        }
    }
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
/// ([`super::h1_conn`]): its frames arrive through a small channel that
/// the loop fills as the client's bytes come (so a body is read only as
/// fast as the backend takes it). A chunked body's frames are its bytes as
/// received, chunk framing included (see [`BodyFraming::Chunked`]).
#[derive(Debug)]
pub struct LeanBody {
    rx: Option<mpsc::Receiver<Result<Bytes, BoxError>>>,
    /// Bytes still to come, for a Content-Length body.
    remaining: Option<u64>,
    chunked: bool,
}

impl LeanBody {
    /// A request without a body.
    pub fn empty() -> Self {
        LeanBody {
            rx: None,
            remaining: Some(0),
            chunked: false,
        }
    }

    /// A body whose frames come from `rx`: `length` bytes when
    /// Content-Length gave it, else chunks as received.
    pub fn new(rx: mpsc::Receiver<Result<Bytes, BoxError>>, length: Option<u64>) -> Self {
        LeanBody {
            rx: Some(rx),
            remaining: length,
            chunked: length.is_none(),
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
    /// As it was before anything was read.
    framing: BodyFraming,
}

/// The client's request body failed (malformed chunked encoding, a reset).
#[derive(Debug, thiserror::Error)]
#[error("client request body: {0}")]
pub struct ClientBodyError(#[source] pub BoxError);

impl ClientBody {
    pub fn new(inner: RequestBody) -> Self {
        ClientBody {
            first: None,
            framing: inner.framing(),
            inner,
        }
    }

    /// Its frames are chunks as an HTTP/1.1 client sent them.
    pub fn is_chunked(&self) -> bool {
        self.framing == BodyFraming::Chunked
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
        Pin::new(&mut this.inner)
            .poll_frame(cx)
            .map_err(ClientBodyError)
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

/// Is `err`, or anything it was caused by, a failure of the client's body?
pub fn caused_by_client_body(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<ClientBodyError>() {
            return true;
        }
        cur = e.source();
    }
    false
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
    /// A chunked body's data without its framing (for HTTP/2 endpoints).
    Dechunked(Box<Dechunked>),
}

impl UpstreamBody {
    /// How the body goes to an HTTP/1.1 endpoint.
    pub fn framing(&self) -> BodyFraming {
        match self {
            UpstreamBody::Empty => BodyFraming::Empty,
            UpstreamBody::Incoming(b) => b.framing,
            UpstreamBody::Tee(t) => t.inner.framing,
            UpstreamBody::Mirror(m) => m.framing,
            UpstreamBody::Dechunked(_) => BodyFraming::Unknown,
        }
    }

    /// The body as data frames only (chunks decoded): what an HTTP/2
    /// endpoint gets.
    pub fn dechunked(self) -> Self {
        if self.framing() == BodyFraming::Chunked {
            UpstreamBody::Dechunked(Box::new(Dechunked {
                inner: self,
                walker: ChunkedWalker::default(),
            }))
        } else {
            self
        }
    }
}

/// A chunked body's data, its framing walked off.
#[derive(Debug)]
pub struct Dechunked {
    inner: UpstreamBody,
    walker: ChunkedWalker,
}

impl Dechunked {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            let raw = match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(raw) => raw,
                    Err(_) => continue,
                },
                other => return Poll::Ready(other),
            };
            let mut data = Vec::new();
            if let Err(e) = self
                .walker
                .walk_with(&raw, |r| data.extend_from_slice(&raw[r]))
            {
                return Poll::Ready(Some(Err(Box::new(e))));
            }
            if !data.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(data.into()))));
            }
        }
    }
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
            UpstreamBody::Dechunked(d) => d.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Empty => true,
            UpstreamBody::Incoming(b) => b.is_end_stream(),
            UpstreamBody::Tee(t) => t.inner.is_end_stream(),
            UpstreamBody::Mirror(m) => m.done,
            UpstreamBody::Dechunked(d) => d.walker.is_done() || d.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Empty => SizeHint::with_exact(0),
            UpstreamBody::Incoming(b) => b.size_hint(),
            UpstreamBody::Tee(t) => t.inner.size_hint(),
            UpstreamBody::Mirror(m) => m.size,
            UpstreamBody::Dechunked(_) => SizeHint::default(),
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
            framing: self.inner.framing,
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
    framing: BodyFraming,
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
