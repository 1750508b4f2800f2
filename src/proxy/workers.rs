//! Thread per core: client connections served by worker threads that each
//! run a runtime of their own, as nginx's worker processes and HAProxy's
//! threads do.
//!
//! Why: on tokio's work-stealing runtime a connection's task is woken
//! wherever the I/O driver happens to be polled and may be stolen by
//! another worker, and the workers park and unpark each other through the
//! kernel. On two cores shared with the load generator that made sluice
//! slower than on one (docs/performance.md, "Many cores"). Here a
//! connection lives and dies on the worker that accepted it: its socket,
//! timers and wake-ups stay on that thread, and so do its pooled
//! connections to backends (one pool per worker, [`current`] picks it).
//! What the workers share is read-mostly: the route table (a reference
//! taken per request), the limits' semaphores and the metrics' counters.
//!
//! Every worker accepts on the same listening socket (its descriptor
//! duplicated into each worker's reactor): one bind per listener, so a
//! port another process holds still fails to bind, and an idle worker
//! takes new connections before a busy one. (SO_REUSEPORT would spread
//! them by the kernel's hash instead, and let a second gateway on the same
//! port split the traffic silently.)
//!
//! The control plane (file watch or Kubernetes, translation, status, the
//! admin listener) stays on the main runtime.

use std::cell::Cell;
use std::io;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    /// 1-based index of the worker this thread is; 0 off the workers.
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The worker the calling thread is, counted from 1; 0 when it is not one
/// of the proxy's workers (the main runtime, tests).
pub(crate) fn current() -> usize {
    INDEX.with(Cell::get)
}

/// Worker threads, each running a current-thread runtime until the set
/// is dropped.
pub(crate) struct Workers {
    handles: Vec<Handle>,
    /// Dropped with the set: each worker's runtime then ends, and with it
    /// the tasks still on it.
    _stop: Vec<oneshot::Sender<()>>,
}

impl Workers {
    /// Start `n` workers.
    pub fn start(n: usize) -> io::Result<Workers> {
        let mut handles = Vec::with_capacity(n);
        let mut stops = Vec::with_capacity(n);
        for i in 0..n {
            let (stop, stopped) = oneshot::channel::<()>();
            let (started, handle) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name(format!("sluice-worker-{}", i + 1))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(e) => {
                            let _ = started.send(Err(e));
                            return;
                        }
                    };
                    INDEX.with(|index| index.set(i + 1));
                    let _ = started.send(Ok(runtime.handle().clone()));
                    // Runs the connections' tasks until the set is dropped.
                    let _ = runtime.block_on(stopped);
                })?;
            let handle = handle
                .recv()
                .map_err(|_| io::Error::other("a proxy worker thread ended at start"))??;
            handles.push(handle);
            stops.push(stop);
        }
        Ok(Workers {
            handles,
            _stop: stops,
        })
    }

    /// Each worker's runtime, in worker order (worker `i + 1` at `i`).
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_worker_knows_its_index_and_other_threads_are_none() {
        assert_eq!(current(), 0);
        let workers = Workers::start(3).unwrap();
        let seen: Vec<usize> = workers
            .handles()
            .iter()
            .map(|h| {
                let (tx, rx) = std::sync::mpsc::channel();
                h.spawn(async move { tx.send(current()).unwrap() });
                rx.recv().unwrap()
            })
            .collect();
        assert_eq!(seen, vec![1, 2, 3]);
        assert_eq!(current(), 0);
    }
}
