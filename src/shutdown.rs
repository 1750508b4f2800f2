//! Stopping: the one shutdown signal every long-running task of `serve`
//! (sources, rollout driver, lease, listeners, admin) waits on, and the
//! process signals that raise it. Its own module so that nothing lower than
//! `serve` has to import the admin listener to learn that it should stop.

use tokio::sync::watch;

/// Resolves once shutdown is signalled (or its sender is gone).
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // An error means the sender was dropped: nobody can stop us any more
    // than that, so treat it as a stop.
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM, whichever comes first.
pub async fn signalled() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
