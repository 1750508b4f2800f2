//! io_uring for the client side of cleartext HTTP/1.1 connections
//! (`--io-uring`, cargo feature `io-uring`; issue 23, item 3): a prototype,
//! kept to measure whether completion-based I/O makes a request cheaper
//! than tokio's readiness-based sockets (epoll). The verdict and its A/B
//! are in docs/performance.md ("Issue 23, item 3: io_uring").
//!
//! Each worker thread ([`super::workers`]) owns one ring ([`install`]) and
//! runs its driver as a task of its runtime: the ring's descriptor is
//! registered with tokio's reactor (it is readable when completions are
//! waiting), and the driver submits what the thread's connections queued
//! since it last ran, in one `io_uring_enter`, then wakes the connections
//! whose operations completed. Everything else on the thread (timers, the
//! upstream pool's sockets, TLS and HTTP/2 connections) stays on tokio's
//! epoll reactor.
//!
//! [`UringStream`] is the client connection as the HTTP/1.1 loop
//! ([`super::inbound::h1_conn`]) reads and writes it: `AsyncRead` and
//! `AsyncWrite` over owned buffers. A read submits a `recv` into a buffer
//! of the stream's own and, once it completes, copies out what came (a
//! read left in flight when its future is dropped, as the loop's `select!`
//! does, is taken up by the next read); a write copies the bytes into the
//! stream's send buffer and queues one `send`, and a flush returns once it
//! is queued (see [`UringStream::poll_flush`]). A stream dropped with a receive in flight cancels it
//! (and submits at once, before its descriptor is closed, so that no queued
//! operation names a descriptor number that may be reused).
//!
//! Why not tokio-uring: its sockets are `!Send` and its runtime spawns
//! connection tasks locally, while the loop's connections and upgraded
//! (WebSocket) connections are `Send` tasks; and a dropped read of
//! tokio-uring stays in flight with no cancellation, so an idle connection
//! closed by its timeout would keep its socket open until the client sent
//! something. Here a stream is `Send` but checks, on every operation, that
//! it is used on the thread whose ring it belongs to (it always is: a
//! worker's connections and their upgrades never leave it).
//!
//! This module is the only one with `unsafe` code (the crate forbids it
//! when the feature is off): handing the kernel a buffer is unsafe, and
//! is sound here because every buffer of an operation in flight is owned
//! by the thread's table of operations until the kernel completes it.

#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::mem::ManuallyDrop;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker, ready};

use io_uring::{IoUring, opcode, squeue, types};
use slab::Slab;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Submission queue entries per ring (completions: twice as many; the
/// kernel keeps overflowing completions rather than dropping them).
const ENTRIES: u32 = 256;
/// The most one `recv` asks for.
const MAX_RECV: usize = 64 * 1024;
/// `user_data` of cancellations, whose completions are ignored.
const CANCEL: u64 = u64::MAX;

/// Rings handed out, to tell one thread's from another's.
static RINGS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static DRIVER: RefCell<Option<Driver>> = const { RefCell::new(None) };
    /// The calling thread's ring (0: none).
    static RING: Cell<u64> = const { Cell::new(0) };
}

/// Whether io_uring can be used here (a ring can be set up: kernels
/// before 5.6, seccomp filters of containers and
/// `kernel.io_uring_disabled` refuse it).
pub(crate) fn probe() -> io::Result<()> {
    IoUring::new(2).map(drop)
}

/// Whether the calling thread has a ring ([`install`]).
pub(crate) fn active() -> bool {
    RING.get() != 0
}

/// Set up the calling thread's ring and return its driver, to be spawned
/// on the thread's own (current-thread) runtime, inside whose context this
/// is called. The ring lives as long as the thread.
pub(crate) fn install() -> io::Result<impl Future<Output = ()> + Send + 'static> {
    let ring = IoUring::new(ENTRIES)?;
    // A descriptor of its own for the reactor: open as long as it is
    // registered.
    let polled = ring.as_fd().try_clone_to_owned()?;
    // SAFETY: `polled` is owned by the registration.
    let fd = unsafe { AsyncFd::register_with_interest(polled, tokio::io::Interest::READABLE) }?;
    let id = RINGS.fetch_add(1, Ordering::Relaxed) + 1;
    DRIVER.set(Some(Driver {
        ring,
        ops: Slab::new(),
        driver: None,
        count: 0,
    }));
    RING.set(id);
    Ok(std::future::poll_fn(move |cx| drive(&fd, cx)))
}

/// One operation in flight and its buffer.
struct Op {
    state: State,
    buf: Vec<u8>,
    /// Its `user_data`: the key and a count of the driver's operations,
    /// so that a late completion or cancellation never meets the next
    /// operation that took the same key.
    tag: u64,
}

enum State {
    /// Submitted or queued; the task to wake when it completes.
    Waiting(Option<Waker>),
    /// Completed with this result (bytes, or minus an errno).
    Done(i32),
    /// Its stream is gone: freed when it completes.
    Orphaned,
}

struct Driver {
    ring: IoUring,
    ops: Slab<Op>,
    /// The driver's task, woken when an operation is queued.
    driver: Option<Waker>,
    /// Operations queued so far.
    count: u32,
}

impl Driver {
    /// The `user_data` of a new operation with `key`.
    fn tag(&mut self, key: usize) -> u64 {
        self.count = self.count.wrapping_add(1);
        (u64::from(self.count) << 32) | (key as u64 & 0xffff_ffff)
    }

    /// Queue `entry`; the driver submits it when it next runs.
    ///
    /// # Safety
    ///
    /// What `entry` points to must stay valid until it completes.
    unsafe fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        // SAFETY: the caller's.
        while unsafe { self.ring.submission().push(entry) }.is_err() {
            // Full: submit what is queued to make room.
            self.ring.submit()?;
        }
        if let Some(driver) = self.driver.take() {
            driver.wake();
        }
        Ok(())
    }

    /// Queue a `recv` of up to `len` bytes into a buffer of the table's;
    /// the operation's key.
    fn recv(
        &mut self,
        fd: RawFd,
        mut buf: Vec<u8>,
        len: usize,
        waker: &Waker,
    ) -> io::Result<usize> {
        buf.clear();
        buf.reserve(len);
        let key = self.ops.vacant_key();
        let tag = self.tag(key);
        let op = self.ops.vacant_entry().insert(Op {
            state: State::Waiting(Some(waker.clone())),
            buf,
            tag,
        });
        // All the buffer's room: what does not fit the caller's read waits
        // in it for the next.
        let room = u32::try_from(op.buf.capacity().min(MAX_RECV)).unwrap_or(u32::MAX);
        let sqe = opcode::Recv::new(types::Fd(fd), op.buf.as_mut_ptr(), room)
            .build()
            .user_data(tag);
        // SAFETY: the buffer is the operation's, in the table until the
        // kernel completes it (a Vec's heap allocation does not move when
        // the table grows, and it is not touched meanwhile).
        if let Err(e) = unsafe { self.push(&sqe) } {
            self.ops.remove(key);
            return Err(e);
        }
        Ok(key)
    }

    /// Queue a `send` of `buf[from..]`; the operation's key.
    fn send(&mut self, fd: RawFd, buf: Vec<u8>, from: usize, waker: &Waker) -> io::Result<usize> {
        let key = self.ops.vacant_key();
        let tag = self.tag(key);
        let op = self.ops.vacant_entry().insert(Op {
            state: State::Waiting(Some(waker.clone())),
            buf,
            tag,
        });
        let rest = &op.buf[from..];
        let len = u32::try_from(rest.len()).unwrap_or(u32::MAX);
        let sqe = opcode::Send::new(types::Fd(fd), rest.as_ptr(), len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(tag);
        // SAFETY: as in `recv`.
        if let Err(e) = unsafe { self.push(&sqe) } {
            self.ops.remove(key);
            return Err(e);
        }
        Ok(key)
    }

    /// The operation `key`'s result and buffer once it completed;
    /// otherwise `waker` is woken when it does.
    fn poll(&mut self, key: usize, waker: &Waker) -> Poll<(i32, Vec<u8>)> {
        let op = &mut self.ops[key];
        match &mut op.state {
            State::Done(res) => {
                let res = *res;
                let op = self.ops.remove(key);
                Poll::Ready((res, op.buf))
            }
            State::Waiting(w) => {
                if !w.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    *w = Some(waker.clone());
                }
                Poll::Pending
            }
            // A stream's own operations are never orphaned while it
            // polls them.
            State::Orphaned => Poll::Pending,
        }
    }

    /// The stream owning `key` is gone: free the operation when it
    /// completes, cancelling it first if `cancel` (a `recv`, which may
    /// otherwise wait for the client forever).
    fn orphan(&mut self, key: usize, cancel: bool) {
        let op = &mut self.ops[key];
        if let State::Done(_) = op.state {
            self.ops.remove(key);
            return;
        }
        op.state = State::Orphaned;
        if cancel {
            let sqe = opcode::AsyncCancel::new(op.tag).build().user_data(CANCEL);
            // SAFETY: a cancellation points to no memory.
            let _ = unsafe { self.push(&sqe) };
        }
    }

    /// Take the completions in, waking their tasks; how many there were.
    fn reap(&mut self, wake: &mut Vec<Waker>) -> usize {
        let mut n = 0;
        for cqe in self.ring.completion() {
            n += 1;
            let tag = cqe.user_data();
            if tag == CANCEL {
                continue;
            }
            let key = (tag & 0xffff_ffff) as usize;
            let Some(op) = self.ops.get_mut(key).filter(|op| op.tag == tag) else {
                continue;
            };
            match std::mem::replace(&mut op.state, State::Done(cqe.result())) {
                State::Waiting(w) => wake.extend(w),
                State::Orphaned => {
                    self.ops.remove(key);
                }
                State::Done(_) => {}
            }
        }
        n
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The thread ends. Buffers of operations still in flight are
        // leaked rather than freed under the kernel (the ring's teardown
        // cancels them asynchronously).
        for op in self.ops.drain() {
            if matches!(op.state, State::Waiting(_) | State::Orphaned) {
                std::mem::forget(op.buf);
            }
        }
    }
}

/// The driver's task: submit what was queued, take completions in, and
/// wait for more of either.
fn drive(fd: &AsyncFd<OwnedFd>, cx: &mut Context<'_>) -> Poll<()> {
    let mut wake = Vec::new();
    loop {
        let reaped = DRIVER.with_borrow_mut(|driver| {
            let driver = driver.as_mut()?;
            if !driver
                .driver
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                driver.driver = Some(cx.waker().clone());
            }
            if !driver.ring.submission().is_empty()
                && let Err(e) = driver.ring.submit()
            {
                // EBUSY/EAGAIN: completions to take in first; retried on
                // the next pass.
                tracing::debug!(error = %e, "io_uring submit failed");
            }
            Some(driver.reap(&mut wake))
        });
        let Some(reaped) = reaped else {
            return Poll::Ready(());
        };
        // Woken outside the table's borrow.
        wake.drain(..).for_each(Waker::wake);
        match ready!(fd.poll_read_ready(cx)) {
            Ok(mut readable) => {
                if reaped == 0 {
                    readable.clear_ready();
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "io_uring's descriptor cannot be polled; its connections stall");
                return Poll::Ready(());
            }
        }
    }
}

fn with_driver<T>(ring: u64, f: impl FnOnce(&mut Driver) -> io::Result<T>) -> io::Result<T> {
    if RING.get() != ring {
        return Err(io::Error::other(
            "an io_uring connection was used off the thread of its ring",
        ));
    }
    DRIVER.with_borrow_mut(|driver| match driver.as_mut() {
        Some(driver) => f(driver),
        None => Err(io::Error::other("the thread's io_uring is gone")),
    })
}

/// What the stream's receive side is doing.
enum RecvSide {
    /// Nothing in flight; the buffer to receive into next.
    Idle(Vec<u8>),
    /// A `recv` in flight (its key).
    InFlight(usize),
    /// Received bytes not yet read: `buf[at..]`.
    Ready { buf: Vec<u8>, at: usize },
    /// The client closed its side (or the receive failed, once).
    Eof,
}

/// What the stream's send side is doing.
enum SendSide {
    /// Nothing in flight; the buffer to send from next.
    Idle(Vec<u8>),
    /// A `send` of the buffer from `from` in flight (its key).
    InFlight { key: usize, from: usize },
}

/// A client connection read and written through the thread's ring.
pub(crate) struct UringStream {
    /// Closed on drop once no queued operation names it.
    io: ManuallyDrop<TcpStream>,
    ring: u64,
    recv: RecvSide,
    send: SendSide,
}

impl UringStream {
    /// Take over a connection on the calling thread's ring. It is made
    /// blocking: io_uring answers a non-blocking socket that has nothing
    /// with `EAGAIN` instead of waiting.
    pub(crate) fn new(io: TcpStream) -> io::Result<UringStream> {
        if !active() {
            return Err(io::Error::other("this thread has no io_uring"));
        }
        io.set_nonblocking(false)?;
        Ok(UringStream {
            io: ManuallyDrop::new(io),
            ring: RING.get(),
            recv: RecvSide::Idle(Vec::new()),
            send: SendSide::Idle(Vec::new()),
        })
    }

    /// Wait for the `send` in flight to have sent everything.
    fn poll_sent(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let SendSide::InFlight { key, from } = self.send else {
                return Poll::Ready(Ok(()));
            };
            let fd = self.io.as_raw_fd();
            let (res, mut buf) = match with_driver(self.ring, |d| Ok(d.poll(key, cx.waker()))) {
                Err(e) => return Poll::Ready(Err(e)),
                Ok(Poll::Pending) => return Poll::Pending,
                Ok(Poll::Ready(done)) => done,
            };
            let done = if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else {
                let sent = from + res as usize;
                if sent < buf.len() && res > 0 {
                    // A short send: the rest.
                    let key = with_driver(self.ring, |d| d.send(fd, buf, sent, cx.waker()))?;
                    self.send = SendSide::InFlight { key, from: sent };
                    continue;
                }
                if sent < buf.len() {
                    Err(io::ErrorKind::WriteZero.into())
                } else {
                    Ok(())
                }
            };
            buf.clear();
            self.send = SendSide::Idle(buf);
            return Poll::Ready(done);
        }
    }
}

impl AsyncRead for UringStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match &mut this.recv {
                RecvSide::Eof => return Poll::Ready(Ok(())),
                RecvSide::Ready { buf, at } => {
                    let n = (buf.len() - *at).min(out.remaining());
                    out.put_slice(&buf[*at..*at + n]);
                    *at += n;
                    if *at == buf.len() {
                        this.recv = RecvSide::Idle(std::mem::take(buf));
                    }
                    return Poll::Ready(Ok(()));
                }
                RecvSide::Idle(buf) => {
                    if out.remaining() == 0 {
                        return Poll::Ready(Ok(()));
                    }
                    let buf = std::mem::take(buf);
                    let len = out.remaining().min(MAX_RECV);
                    let fd = this.io.as_raw_fd();
                    let key = with_driver(this.ring, |d| d.recv(fd, buf, len, cx.waker()))?;
                    this.recv = RecvSide::InFlight(key);
                    return Poll::Pending;
                }
                RecvSide::InFlight(key) => {
                    let key = *key;
                    let (res, mut buf) =
                        match with_driver(this.ring, |d| Ok(d.poll(key, cx.waker()))) {
                            Err(e) => return Poll::Ready(Err(e)),
                            Ok(Poll::Pending) => return Poll::Pending,
                            Ok(Poll::Ready(done)) => done,
                        };
                    if res < 0 {
                        this.recv = RecvSide::Eof;
                        return Poll::Ready(Err(io::Error::from_raw_os_error(-res)));
                    }
                    if res == 0 {
                        this.recv = RecvSide::Eof;
                        return Poll::Ready(Ok(()));
                    }
                    // SAFETY: the kernel wrote `res` bytes into the buffer,
                    // no more than it was given room for.
                    unsafe { buf.set_len(res as usize) };
                    this.recv = RecvSide::Ready { buf, at: 0 };
                }
            }
        }
    }
}

impl AsyncWrite for UringStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_sent(cx))?;
        if bytes.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let SendSide::Idle(buf) = &mut this.send else {
            // `poll_sent` leaves nothing in flight.
            return Poll::Ready(Err(io::Error::other("an io_uring send is still in flight")));
        };
        let mut buf = std::mem::take(buf);
        buf.extend_from_slice(bytes);
        let fd = this.io.as_raw_fd();
        let key = with_driver(this.ring, |d| d.send(fd, buf, 0, cx.waker()))?;
        this.send = SendSide::InFlight { key, from: 0 };
        // Taken: sent as a whole, which `poll_flush` waits for.
        Poll::Ready(Ok(bytes.len()))
    }

    /// Flushed once the bytes are queued on the ring, in order, in a
    /// buffer of the stream's own, not once the `send` completed: the
    /// driver submits them before the thread next waits, together with
    /// whatever the connection does next (the next request's `recv`), in
    /// one system call. A failed send is told by the next write, flush or
    /// shutdown; a write waits for the send before it (the back-pressure
    /// of a client that does not read), and so does a shutdown.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().poll_sent(cx) {
            Poll::Pending => Poll::Ready(Ok(())),
            done => done,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_sent(cx))?;
        Poll::Ready(this.io.shutdown(Shutdown::Write))
    }
}

impl Drop for UringStream {
    fn drop(&mut self) {
        let recv = match self.recv {
            RecvSide::InFlight(key) => Some(key),
            _ => None,
        };
        let send = match self.send {
            SendSide::InFlight { key, .. } => Some(key),
            _ => None,
        };
        let closable = (recv.is_none() && send.is_none())
            || with_driver(self.ring, |d| {
                if let Some(key) = recv {
                    d.orphan(key, true);
                }
                if let Some(key) = send {
                    d.orphan(key, false);
                }
                // Before the descriptor is closed: a queued operation
                // names it by number, which a new connection may get next.
                d.ring.submit()
            })
            .is_ok();
        if closable {
            // SAFETY: dropped once, here, and not used after.
            unsafe { ManuallyDrop::drop(&mut self.io) };
        }
        // Otherwise (off its thread, or the submit failed) the descriptor
        // may still be named by a queued operation: leaked rather than
        // closed under it.
    }
}
