//! `sluice serve`: wires the file source, translate, the proxy and the admin
//! listener together.
//!
//! Start-up loads the manifests, translates them, applies the route table
//! to the proxy and publishes status and errors on the admin listener. A
//! reload task then repeats that on every (debounced) file change. A reload
//! is an atomic table swap in the proxy: requests in flight finish on the
//! table they started with, a broken file keeps its last good objects, and
//! nothing a manifest says can make the process exit.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admin::{AdminServer, AdminState, Published};
use crate::metrics::Metrics;
use crate::proxy::Proxy;
use crate::route::RouteTable;
use crate::source::{FileSource, FileWatch, SourceUpdate};
use crate::translate::{TranslateOptions, translate};

/// Settings of `sluice serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Manifest files or directories (read recursively).
    pub paths: Vec<PathBuf>,
    /// Address listeners bind on when their Gateway has no addresses.
    pub bind: IpAddr,
    /// Admin listener (`/status`, `/errors`, `/metrics`, `/healthz`, `/readyz`).
    pub admin: SocketAddr,
}

/// A gateway started in this process. Dropping it leaves the gateway
/// running; call [`RunningGateway::shutdown`] to stop it.
pub struct RunningGateway {
    admin: AdminServer,
    state: Arc<AdminState>,
    metrics: Arc<Metrics>,
    proxy: Proxy,
    shutdown: watch::Sender<bool>,
    reloads: JoinHandle<()>,
}

impl RunningGateway {
    /// The admin listener's actual address (useful when port 0 was asked).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.addr()
    }

    /// The process's metrics (what `/metrics` serves).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// What `/status` and `/errors` currently serve.
    pub fn published(&self) -> Arc<Published> {
        self.state.published()
    }

    /// Stop watching, close the admin listener and every proxy listener.
    /// Connections already accepted by the proxy finish what they are doing.
    pub async fn shutdown(self) {
        // Receivers only go away when their tasks ended: nothing to signal then.
        let _ = self.shutdown.send(true);
        if let Err(error) = self.reloads.await {
            tracing::error!(%error, "reload task failed");
        }
        self.admin.join().await;
        let failures = self.proxy.apply(RouteTable::default()).await;
        debug_assert!(failures.is_empty(), "an empty table binds nothing");
        tracing::info!("gateway stopped");
    }
}

/// Load the manifests, serve them, and keep watching them.
///
/// Fails only when the process cannot start at all: the admin address
/// cannot be bound or a configured path cannot be watched. Problems in the
/// manifests are reported on `/errors` and in the logs, never fatal.
pub async fn start(config: ServeConfig) -> anyhow::Result<RunningGateway> {
    let metrics = Metrics::shared();
    let source = FileSource::new(config.paths.clone(), metrics.clone());
    // Watch before the first read so that no change in between is missed.
    let watch = source
        .watch()
        .with_context(|| format!("cannot watch {:?}", config.paths))?;

    let (shutdown, shutdown_rx) = watch::channel(false);
    let state = Arc::new(AdminState::new(metrics.clone()));
    let admin = AdminServer::start(config.admin, state.clone(), shutdown_rx.clone())
        .await
        .with_context(|| format!("cannot bind the admin listener on {}", config.admin))?;
    tracing::info!(addr = %admin.addr(), "admin listener started");

    let proxy = Proxy::new(metrics.clone());
    let mut reloader = Reloader {
        options: TranslateOptions {
            default_bind: config.bind,
        },
        proxy: proxy.clone(),
        state: state.clone(),
        metrics: metrics.clone(),
        generation: 0,
    };
    let source = Arc::new(Mutex::new(source));
    if let Some(update) = reload(&source).await {
        reloader.apply(update).await;
    }
    state.set_ready();

    let reloads = tokio::spawn(reload_loop(source, watch, reloader, shutdown_rx));
    Ok(RunningGateway {
        admin,
        state,
        metrics,
        proxy,
        shutdown,
        reloads,
    })
}

/// Turns each configuration into a served table and published status.
struct Reloader {
    options: TranslateOptions,
    proxy: Proxy,
    state: Arc<AdminState>,
    metrics: Arc<Metrics>,
    /// Number of the last table applied.
    generation: u64,
}

impl Reloader {
    async fn apply(&mut self, update: SourceUpdate) {
        let mut translation = translate(&update.snapshot, &self.options);
        for warning in &translation.warnings {
            tracing::warn!("{warning}");
        }
        let failures = self.proxy.apply(translation.table).await;
        if !failures.is_empty() {
            for failure in &failures {
                tracing::warn!(bind = %failure.bind, error = %failure.error, "cannot listen");
            }
            let failures: Vec<(SocketAddr, String)> =
                failures.into_iter().map(|f| (f.bind, f.error)).collect();
            translation.status.apply_bind_failures(&failures);
        }
        self.generation += 1;
        self.metrics.record_reload(self.generation);
        tracing::info!(
            generation = self.generation,
            objects = update.objects,
            errors = update.errors.len(),
            "configuration applied"
        );
        self.state.publish(Published {
            status: translation.status,
            errors: update.errors,
        });
    }
}

/// Read the files again (off the async workers). `None` when nothing
/// changed, or when reading panicked: that is logged, the current table
/// keeps serving and the next change is tried again.
async fn reload(source: &Arc<Mutex<FileSource>>) -> Option<SourceUpdate> {
    let source = source.clone();
    let result = tokio::task::spawn_blocking(move || {
        // A previous reload that panicked poisoned the lock; the source's
        // state is still a consistent last-good set, so go on with it.
        source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reload()
    })
    .await;
    match result {
        Ok(update) => update,
        Err(error) => {
            tracing::error!(%error, "reading the manifests failed; keeping the current configuration");
            None
        }
    }
}

async fn reload_loop(
    source: Arc<Mutex<FileSource>>,
    mut watch: FileWatch,
    mut reloader: Reloader,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let changed = tokio::select! {
            changed = watch.changed() => changed,
            _ = crate::admin::stopped(&mut shutdown) => return,
        };
        if !changed {
            tracing::warn!("file watch stopped; configuration is no longer reloaded");
            return;
        }
        if let Some(update) = reload(&source).await {
            reloader.apply(update).await;
        }
    }
}
