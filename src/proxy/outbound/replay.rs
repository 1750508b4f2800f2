//! The replay buffer that lets a retry policy cover requests with a body
//! (`--retry-buffer-bytes`, 64 KiB by default).
//!
//! The body is still streamed: each try reads it through a
//! [`ReplayBody`] handle, and the frames read from the client are kept
//! (shared, not copied) until they add up to more than the limit. A
//! retry's handle first sends the frames kept, then goes on reading from
//! the client where the earlier try stopped. Once the body outgrew the
//! limit the frames are dropped and the request is not sent again: a
//! larger body is streamed once, as before.
//!
//! Only the newest try's handle may read: a handle an earlier try's
//! connection still holds fails when polled, so two tries never read the
//! client's body in turns. linkerd2-proxy's `ReplayBody` works the same
//! way.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Method;
use http_body::{Body, Frame, SizeHint};

use crate::proxy::body::{BoxError, UpstreamBody};
use crate::route::TryOutcome;

/// A request body several tries can send.
#[derive(Debug, Clone)]
pub struct Replay {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    /// The client's body, until it ended.
    rest: Option<UpstreamBody>,
    /// Every frame read so far, while they fit the limit.
    kept: Vec<Frame<Bytes>>,
    kept_bytes: usize,
    limit: usize,
    /// The body outgrew the limit: it cannot be sent again.
    overflowed: bool,
    /// Some of it went to a try.
    sent_any: bool,
    /// The try whose handle may read.
    current: u64,
    size: SizeHint,
}

/// One try's view of a [`Replay`]: the frames kept, then the rest of the
/// client's body.
#[derive(Debug)]
pub struct ReplayBody {
    state: Arc<Mutex<State>>,
    try_number: u64,
    /// Next frame of `kept` to send.
    at: usize,
    done: bool,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Nothing under this lock panics halfway through a change.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// RFC 9110 §9.2.2: sending these twice has the effect of sending once.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

impl Replay {
    /// Keep up to `limit` bytes of `body` for retries.
    pub fn new(body: UpstreamBody, limit: usize) -> Self {
        let size = body.size_hint();
        Replay {
            state: Arc::new(Mutex::new(State {
                rest: Some(body),
                kept: Vec::new(),
                kept_bytes: 0,
                limit,
                overflowed: false,
                sent_any: false,
                current: 0,
                size,
            })),
        }
    }

    /// The body for the next try; earlier tries' handles stop reading.
    pub fn next_try(&self) -> ReplayBody {
        let mut state = lock(&self.state);
        state.current += 1;
        ReplayBody {
            state: self.state.clone(),
            try_number: state.current,
            at: 0,
            done: false,
        }
    }

    /// Whether a try that ended with `outcome` may be followed by another
    /// (the retry policy has its say first): never once the body outgrew
    /// the buffer; after a timeout only if none of the body reached the
    /// backend or `method` is idempotent (the backend may be acting on
    /// it); after a failed connection (nothing was sent) or an answer the
    /// policy retries, yes.
    pub fn can_send_again(&self, outcome: TryOutcome, method: &Method) -> bool {
        let state = lock(&self.state);
        if state.overflowed {
            return false;
        }
        match outcome {
            TryOutcome::ConnectFailed | TryOutcome::Answered(_) => true,
            TryOutcome::TimedOut => !state.sent_any || is_idempotent(method),
            TryOutcome::Broken => false,
        }
    }
}

impl Body for ReplayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let mut state = lock(&this.state);
        if state.current != this.try_number {
            this.done = true;
            return Poll::Ready(Some(Err("the request is being sent again".into())));
        }
        if let Some(frame) = state.kept.get(this.at) {
            let copy = copy_frame(frame);
            this.at += 1;
            state.sent_any = true;
            return Poll::Ready(Some(Ok(copy)));
        }
        let Some(rest) = state.rest.as_mut() else {
            this.done = true;
            return Poll::Ready(None);
        };
        match Pin::new(rest).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                state.rest = None;
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.done = true;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(Some(Ok(frame))) => {
                state.sent_any = true;
                if !state.overflowed {
                    let len = frame.data_ref().map_or(0, Bytes::len);
                    if state.kept_bytes + len > state.limit {
                        // Too large to send again: stop keeping it.
                        state.overflowed = true;
                        state.kept = Vec::new();
                    } else {
                        state.kept_bytes += len;
                        state.kept.push(copy_frame(&frame));
                        this.at += 1;
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.done {
            return true;
        }
        let state = lock(&self.state);
        self.at >= state.kept.len() && state.rest.as_ref().is_none_or(|rest| rest.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        // Every try sends the whole body.
        lock(&self.state).size
    }
}

/// A frame's data or trailers, shared (no copy of the bytes).
fn copy_frame(frame: &Frame<Bytes>) -> Frame<Bytes> {
    match (frame.data_ref(), frame.trailers_ref()) {
        (Some(data), _) => Frame::data(data.clone()),
        (None, Some(trailers)) => Frame::trailers(trailers.clone()),
        (None, None) => Frame::data(Bytes::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::body::{ClientBody, LeanBody, RequestBody};
    use http_body_util::BodyExt;
    use tokio::sync::mpsc;

    /// A client body fed by the test, frame by frame.
    fn client_body() -> (mpsc::Sender<Result<Bytes, BoxError>>, UpstreamBody) {
        let (tx, rx) = mpsc::channel(16);
        let body = ClientBody::new(
            RequestBody::Lean(LeanBody::new(rx, None)),
            std::time::Duration::from_secs(60),
        );
        (tx, UpstreamBody::Incoming(body))
    }

    async fn read_all(mut body: ReplayBody) -> Result<Vec<u8>, BoxError> {
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Some(d) = frame?.data_ref() {
                out.extend_from_slice(d);
            }
        }
        Ok(out)
    }

    #[tokio::test]
    async fn a_retry_sends_the_body_again_and_the_rest_as_it_comes() {
        let (tx, body) = client_body();
        let replay = Replay::new(body, 64);
        let mut first = replay.next_try();
        tx.send(Ok(Bytes::from_static(b"hello "))).await.unwrap();
        let f = first.frame().await.unwrap().unwrap();
        assert_eq!(f.data_ref().unwrap(), "hello ");
        // The backend answered 503 before the body ended: send it again.
        assert!(replay.can_send_again(
            TryOutcome::Answered(http::StatusCode::SERVICE_UNAVAILABLE),
            &Method::POST
        ));
        let second = replay.next_try();
        assert!(
            first.frame().await.unwrap().is_err(),
            "the first try's handle no longer reads"
        );
        tx.send(Ok(Bytes::from_static(b"world"))).await.unwrap();
        drop(tx);
        assert_eq!(read_all(second).await.unwrap(), b"hello world");
        // And once more, all from the buffer.
        assert_eq!(read_all(replay.next_try()).await.unwrap(), b"hello world");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_streamed_once() {
        let (tx, body) = client_body();
        let replay = Replay::new(body, 8);
        let first = replay.next_try();
        tx.send(Ok(Bytes::from_static(b"0123456"))).await.unwrap();
        tx.send(Ok(Bytes::from_static(b"789"))).await.unwrap();
        drop(tx);
        assert_eq!(read_all(first).await.unwrap(), b"0123456789");
        assert!(!replay.can_send_again(TryOutcome::ConnectFailed, &Method::PUT));
    }

    #[tokio::test]
    async fn a_timed_out_try_is_sent_again_only_if_nothing_went_or_it_is_idempotent() {
        let (tx, body) = client_body();
        let replay = Replay::new(body, 64);
        let timed_out = TryOutcome::TimedOut;
        assert!(
            replay.can_send_again(timed_out, &Method::POST),
            "nothing sent"
        );
        let mut first = replay.next_try();
        tx.send(Ok(Bytes::from_static(b"part"))).await.unwrap();
        first.frame().await.unwrap().unwrap();
        assert!(!replay.can_send_again(timed_out, &Method::POST));
        assert!(!replay.can_send_again(timed_out, &Method::PATCH));
        assert!(replay.can_send_again(timed_out, &Method::PUT));
        assert!(replay.can_send_again(timed_out, &Method::DELETE));
        assert!(replay.can_send_again(TryOutcome::ConnectFailed, &Method::POST));
        assert!(!replay.can_send_again(TryOutcome::Broken, &Method::PUT));
    }
}
