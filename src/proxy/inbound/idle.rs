//! Idle HTTP/1.1 keep-alive connections parked off their task.
//!
//! Why: a connection waiting for its next request is a suspended task, a
//! 512-byte tokio allocation (its future: the read, a timer, the drain's
//! notification) on top of what the connection is (its socket's
//! registration with the reactor, its [`ConnInfo`]). An edge proxy's
//! connections spend most of their life idle between requests (a browser
//! keeps one open for the whole keep-alive timeout), so that task is most
//! of what sluice holds per connection: nginx holds an idle connection as
//! a plain structure in its event loop instead.
//!
//! A cleartext connection that has been idle for [`PARK_AFTER`] is handed
//! here, and its task ends: its socket and [`ConnInfo`] wait in one slot of
//! its worker's [`Table`], its keep-alive deadline in the table's heap.
//! The socket's readiness wakes the slot (a small waker per slot, made when
//! it is parked) and a new task serves the connection from its next wait
//! for a head, with what was left of its keep-alive deadline. The table's
//! own task ends the connections whose deadline passed, and all of them on
//! drain. Busy connections never come here: a second of quiet costs one
//! task spawn when the next request comes.
//!
//! TLS connections are not parked: rustls keeps its buffers per connection
//! (8 KiB), which parking would not free, and may hold bytes already read.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::poll_fn;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use super::h1_conn::{self, ConnInfo};
use crate::proxy::{Shared, workers};

/// How long a connection waits for its next request in its own task
/// before it is parked.
pub(in crate::proxy) const PARK_AFTER: Duration = Duration::from_secs(1);

/// An idle connection, parked.
pub(in crate::proxy) struct Parked {
    pub io: TcpStream,
    pub info: Box<ConnInfo>,
    /// When it closes if no request has started (its keep-alive deadline).
    pub by: Instant,
}

/// The tables of one proxy, one per worker (by [`workers::current`], the
/// first for threads that are none), each made by the first connection
/// parked on it and kept by its own task while it runs.
pub(in crate::proxy) struct IdleTables {
    tables: Box<[Mutex<Weak<Table>>]>,
}

impl IdleTables {
    pub fn new(workers: usize) -> Self {
        IdleTables {
            tables: (0..=workers).map(|_| Mutex::default()).collect(),
        }
    }

    /// Connections parked now, in all tables.
    pub fn parked(&self) -> usize {
        self.tables
            .iter()
            .filter_map(|t| lock(t).upgrade())
            .map(|t| t.lock().len)
            .sum()
    }
}

/// Park `parked` in the calling thread's table; it is given back when it
/// cannot be: it is readable already (the caller reads on), or the proxy
/// is draining (the caller sees the flag and closes it).
pub(in crate::proxy) fn park(parked: Parked) -> Result<(), Parked> {
    let shared = parked.info.shared.clone();
    let Some(slot) = shared
        .idle
        .tables
        .get(workers::current())
        .or(shared.idle.tables.first())
    else {
        return Err(parked);
    };
    let table = {
        let mut slot = lock(slot);
        match slot.upgrade() {
            Some(table) => table,
            None if *shared.draining.borrow() => return Err(parked),
            None => {
                let table = Arc::new(Table::default());
                *slot = Arc::downgrade(&table);
                tokio::spawn(run(table.clone(), shared.clone()));
                table
            }
        }
    };
    table.park(&table, parked)
}

/// The idle connections of one worker.
#[derive(Default)]
pub(in crate::proxy) struct Table {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    slots: Vec<Slot>,
    /// Slots free for the next connection parked.
    free: Vec<u32>,
    /// Slots whose socket became ready, for the table's task: (index,
    /// generation).
    ready: Vec<(u32, u32)>,
    /// Every parked connection's deadline (earliest first), with its slot;
    /// those of connections no longer there are skipped when they come up.
    deadlines: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    /// The table's task, to wake when there is work for it.
    task: Option<Waker>,
    /// Set on drain: nothing more is parked.
    closed: bool,
    len: usize,
}

#[derive(Default)]
struct Slot {
    /// Counts the connections the slot has held, so that a wake meant for
    /// an earlier one is told apart.
    generation: u32,
    parked: Option<Parked>,
}

/// Wakes the table's task for one slot.
struct SlotWaker {
    table: Weak<Table>,
    index: u32,
    generation: u32,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(table) = self.table.upgrade() {
            let task = {
                let mut inner = table.lock();
                inner.ready.push((self.index, self.generation));
                inner.task.take()
            };
            if let Some(task) = task {
                task.wake();
            }
        }
    }
}

impl Table {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    fn park(&self, this: &Arc<Table>, parked: Parked) -> Result<(), Parked> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(parked);
        }
        let index = match inner.free.pop() {
            Some(index) => index,
            None => {
                let Ok(index) = u32::try_from(inner.slots.len()) else {
                    return Err(parked);
                };
                inner.slots.push(Slot::default());
                index
            }
        };
        let generation = inner.slots[index as usize].generation;
        let waker = Waker::from(Arc::new(SlotWaker {
            table: Arc::downgrade(this),
            index,
            generation,
        }));
        // Under the lock: a wake from another thread's reactor waits for
        // the slot to be filled. (tokio wakes after letting go of the
        // socket's own lock, so this lock is never taken inside it.)
        if parked
            .io
            .poll_read_ready(&mut Context::from_waker(&waker))
            .is_ready()
        {
            inner.free.push(index);
            return Err(parked);
        }
        let earliest = inner.deadlines.peek().is_none_or(|e| parked.by < e.0.0);
        inner
            .deadlines
            .push(Reverse((parked.by, index, generation)));
        inner.slots[index as usize].parked = Some(parked);
        inner.len += 1;
        let task = earliest.then(|| inner.task.take()).flatten();
        drop(inner);
        if let Some(task) = task {
            task.wake();
        }
        Ok(())
    }
}

impl Inner {
    /// Take the connection out of slot `index`, if it still holds the one
    /// of `generation`.
    fn take(&mut self, index: u32, generation: u32) -> Option<Parked> {
        let slot = self.slots.get_mut(index as usize)?;
        if slot.generation != generation {
            return None;
        }
        let parked = slot.parked.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        self.len -= 1;
        Some(parked)
    }
}

/// What the table's task found to do.
struct Work {
    /// Readable again: each gets a task.
    resumed: Vec<Parked>,
    /// Past their keep-alive deadline: closed.
    expired: Vec<Parked>,
}

/// The table's task: resume the connections that became readable, close
/// those past their deadline, and all of them when the proxy drains (or
/// is gone).
async fn run(table: Arc<Table>, shared: Arc<Shared>) {
    let mut draining = shared.draining.subscribe();
    let mut drained = pin!(async move {
        let _ = draining.wait_for(|d| *d).await;
    });
    let mut timer = pin!(tokio::time::sleep_until(Instant::now()));
    let mut timer_set = false;
    loop {
        let work = poll_fn(|cx| {
            if drained.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            let mut inner = table.lock();
            inner.task = Some(cx.waker().clone());
            let mut work = Work {
                resumed: Vec::new(),
                expired: Vec::new(),
            };
            for (index, generation) in std::mem::take(&mut inner.ready) {
                work.resumed.extend(inner.take(index, generation));
            }
            let now = Instant::now();
            while let Some(&Reverse((by, index, generation))) = inner.deadlines.peek() {
                if by > now {
                    timer.as_mut().reset(by);
                    timer_set = true;
                    break;
                }
                inner.deadlines.pop();
                work.expired.extend(inner.take(index, generation));
            }
            if inner.deadlines.is_empty() {
                timer_set = false;
            }
            drop(inner);
            if !work.resumed.is_empty() || !work.expired.is_empty() {
                return Poll::Ready(Some(work));
            }
            if timer_set && timer.as_mut().poll(cx).is_ready() {
                // Come back at once: the deadline is due.
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        })
        .await;
        let Some(work) = work else { break };
        // Closed outside the lock (a socket's deregistration).
        drop(work.expired);
        for parked in work.resumed {
            tokio::spawn(h1_conn::resume(parked));
        }
    }
    let all: Vec<Parked> = {
        let mut inner = table.lock();
        inner.closed = true;
        inner.len = 0;
        inner.deadlines.clear();
        inner.slots.drain(..).filter_map(|s| s.parked).collect()
    };
    drop(all);
}

/// A lock that a panic elsewhere does not make unusable: what it guards is
/// left whole by every holder.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
