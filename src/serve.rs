//! `sluice serve`: wires the file source, translate, the proxy and the admin
//! listener together.
//!
//! Start-up loads the manifests, translates them, applies the route table
//! to the proxy and publishes status and errors on the admin listener. A
//! reload task then repeats that on every (debounced) file change. A reload
//! is an atomic table swap in the proxy: requests in flight finish on the
//! table they started with, a broken file keeps its last good objects, and
//! nothing a manifest says can make the process exit.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admin::{AdminServer, AdminState, Published};
use crate::metrics::Metrics;
use crate::proxy::{Proxy, ProxyLimits};
use crate::route::RouteTable;
use crate::source::{FileSource, FileWatch, SourceUpdate};
use crate::translate::{ObjectStatus, StatusReport, TranslateOptions, translate};

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

    /// Stop watching, close the admin listener and every proxy listener,
    /// then drain: connections already accepted finish their requests in
    /// flight within the drain period ([`ProxyLimits::drain_timeout`]).
    pub async fn shutdown(self) {
        // Receivers only go away when their tasks ended: nothing to signal then.
        let _ = self.shutdown.send(true);
        if let Err(error) = self.reloads.await {
            tracing::error!(%error, "reload task failed");
        }
        self.admin.join().await;
        // The table stays: requests still arriving on open connections
        // while they drain are served as before.
        let cut = self.proxy.drain().await;
        if cut > 0 {
            tracing::warn!(
                connections = cut,
                "connections closed before their requests finished"
            );
        }
        tracing::info!("gateway stopped");
    }
}

/// Load the manifests, serve them, and keep watching them.
///
/// Fails only when the process cannot start at all: the admin address
/// cannot be bound or a configured path cannot be watched. Problems in the
/// manifests are reported on `/errors` and in the logs, never fatal.
pub async fn start(config: ServeConfig) -> anyhow::Result<RunningGateway> {
    start_with_limits(config, ProxyLimits::default()).await
}

/// [`start`], with the proxy held to `limits`.
pub async fn start_with_limits(
    config: ServeConfig,
    limits: ProxyLimits,
) -> anyhow::Result<RunningGateway> {
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

    let proxy = Proxy::with_limits(metrics.clone(), limits);
    state.show_endpoints_of(proxy.clone());
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
        // Translate off the async workers: with 10,000 routes it takes a few
        // hundred milliseconds that requests must not wait behind.
        let SourceUpdate {
            snapshot,
            objects,
            errors,
        } = update;
        let options = self.options.clone();
        let previous = self.state.published();
        let translated = tokio::task::spawn_blocking(move || {
            // Build the new table once the one it replaced last time is
            // freed, so that the two never overlap in memory.
            RouteTable::wait_for_freed_tables();
            let mut translation = translate(&snapshot, &options);
            // Conditions whose status did not change keep the time it last
            // changed, as in Kubernetes mode. The previous status is as
            // large as the configuration: walk it here, off the async
            // workers.
            keep_transition_times(&mut translation.status, &previous.status);
            (translation, previous)
        })
        .await;
        let (mut translation, previous) = match translated {
            Ok(t) => t,
            Err(error) => {
                tracing::error!(%error, "translate failed; keeping the current configuration");
                return;
            }
        };
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
            // A listener that failed to bind at the previous reload too
            // keeps that failure's time (rare: walked on the async worker).
            keep_transition_times(&mut translation.status, &previous.status);
        }
        // The previous status is freed with `replaced` below.
        drop(previous);
        self.generation += 1;
        self.metrics.record_reload(self.generation);
        tracing::info!(
            generation = self.generation,
            objects,
            errors = errors.len(),
            "configuration applied"
        );
        let replaced = self.state.publish(Published {
            status: translation.status,
            errors,
        });
        // The replaced status and this translation's rule summaries are as
        // large as the configuration: free them off the async workers.
        let rules = translation.rules;
        tokio::task::spawn_blocking(move || drop((replaced, rules)));
    }
}

/// Copy each condition's `lastTransitionTime` from the status published
/// before (same kind, namespace and name) when its type and status did not
/// change: a condition's time is when its status last changed, not when
/// sluice last translated it. Conditions that are new or flipped keep the
/// translation's time.
fn keep_transition_times(new: &mut StatusReport, old: &StatusReport) {
    let key = |o: &ObjectStatus| {
        (
            o.kind.clone(),
            o.metadata.namespace.clone(),
            o.metadata.name.clone(),
        )
    };
    let old: HashMap<_, &ObjectStatus> = old.objects.iter().map(|o| (key(o), o)).collect();
    for object in &mut new.objects {
        if let Some(previous) = old.get(&key(object)) {
            crate::status::keep_transition_times(&mut object.status, &previous.status);
        }
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

/// Settings of `sluice serve --kubernetes`.
#[derive(Debug, Clone)]
pub struct KubernetesConfig {
    /// Kubeconfig file; `None` infers the configuration (in-cluster service
    /// account, else `$KUBECONFIG` / `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// Address listeners bind on when their Gateway has no addresses.
    pub bind: IpAddr,
    /// Admin listener (`/status`, `/errors`, `/metrics`, `/healthz`, `/readyz`).
    pub admin: SocketAddr,
    /// `(namespace, name)` of the Service in front of the gateway pods,
    /// whose addresses become every Gateway's `status.addresses`.
    pub gateway_service: Option<(String, String)>,
    /// The leader lease (only the leader writes status). Its namespace
    /// defaults to `$POD_NAMESPACE`, else the client's default namespace;
    /// its identity to `$POD_NAME`, else `$HOSTNAME`, plus the process id.
    pub lease_namespace: Option<String>,
    pub lease_name: String,
    pub lease_duration: std::time::Duration,
}

/// What the serve loop last served: the snapshot and the status translate
/// computed for it (after the proxy swapped in its table).
struct Served {
    snapshot: crate::resources::Snapshot,
    published: Arc<Published>,
}

/// Watch the API server, serve what it holds, and (as leader) write status
/// back.
///
/// Fails only when the process cannot start: no usable client
/// configuration, or the admin address cannot be bound. The API server
/// being unreachable is not fatal: watches retry with backoff and `/readyz`
/// stays 503 until the first complete snapshot is served.
pub async fn start_kubernetes(config: KubernetesConfig) -> anyhow::Result<RunningGateway> {
    start_kubernetes_with_limits(config, ProxyLimits::default()).await
}

/// [`start_kubernetes`], with the proxy held to `limits`.
pub async fn start_kubernetes_with_limits(
    config: KubernetesConfig,
    limits: ProxyLimits,
) -> anyhow::Result<RunningGateway> {
    use crate::source::kubernetes::{self as kube_source, SourceOptions};
    use crate::status::StatusWriter;
    use crate::status::lease::{self, LeaderElector, LeaseConfig};

    let client = kube_client(config.kubeconfig.as_deref()).await?;
    let metrics = Metrics::shared();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let state = Arc::new(AdminState::new(metrics.clone()));
    let admin = AdminServer::start(config.admin, state.clone(), shutdown_rx.clone())
        .await
        .with_context(|| format!("cannot bind the admin listener on {}", config.admin))?;
    tracing::info!(addr = %admin.addr(), "admin listener started");
    let proxy = Proxy::with_limits(metrics.clone(), limits);
    state.show_endpoints_of(proxy.clone());

    let (updates_tx, updates) = tokio::sync::mpsc::channel(1);
    let source = tokio::spawn(kube_source::run(
        kube_source::watch_all(&client),
        SourceOptions::default(),
        updates_tx,
        shutdown_rx.clone(),
    ));

    let identity = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "sluice".into());
    let lease_config = LeaseConfig {
        namespace: config
            .lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| client.default_namespace().to_string()),
        name: config.lease_name.clone(),
        identity: format!("{identity}-{}", std::process::id()),
        duration: config.lease_duration,
    };
    tracing::info!(lease = %lease_config.name, namespace = %lease_config.namespace,
        identity = %lease_config.identity, "running for leader (the leader writes status)");
    let (leader_tx, leader) = watch::channel(false);
    let elector = tokio::spawn(lease::run(
        LeaderElector::new(client.clone(), lease_config),
        leader_tx,
        shutdown_rx.clone(),
    ));

    let (served_tx, served) = watch::channel(None);
    let status = tokio::spawn(status_loop(
        StatusWriter::new(client),
        leader,
        served,
        config.gateway_service.clone(),
        config.lease_duration,
        shutdown_rx.clone(),
    ));

    let reloader = Reloader {
        options: TranslateOptions {
            default_bind: config.bind,
        },
        proxy: proxy.clone(),
        state: state.clone(),
        metrics: metrics.clone(),
        generation: 0,
    };
    let serve = tokio::spawn(kubernetes_serve_loop(
        updates,
        reloader,
        served_tx,
        shutdown_rx,
    ));
    let reloads = tokio::spawn(async move {
        for (task, handle) in [
            ("serve", serve),
            ("source", source),
            ("status", status),
            ("leader election", elector),
        ] {
            if let Err(error) = handle.await {
                tracing::error!(task, %error, "task failed");
            }
        }
    });
    Ok(RunningGateway {
        admin,
        state,
        metrics,
        proxy,
        shutdown,
        reloads,
    })
}

async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    // The API server connection uses rustls with ring (the only provider
    // built in); installing it explicitly keeps that true even when another
    // dependency enables a second provider. Already installed is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("cannot use kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration (not in a cluster, no kubeconfig)")?,
    };
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
}

/// Translate and serve each snapshot from the API server; the first one
/// makes `/readyz` ready.
async fn kubernetes_serve_loop(
    mut updates: tokio::sync::mpsc::Receiver<SourceUpdate>,
    mut reloader: Reloader,
    served: watch::Sender<Option<Arc<Served>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let update = tokio::select! {
            update = updates.recv() => update,
            _ = crate::admin::stopped(&mut shutdown) => return,
        };
        let Some(update) = update else {
            tracing::warn!("the Kubernetes source stopped; configuration is no longer updated");
            return;
        };
        let snapshot = update.snapshot.clone();
        reloader.apply(update).await;
        reloader.state.set_ready();
        served.send_replace(Some(Arc::new(Served {
            snapshot,
            published: reloader.state.published(),
        })));
    }
}

/// Write the status of what is served, while leader. Failed writes are
/// retried after a third of the lease duration.
async fn status_loop(
    mut writer: crate::status::StatusWriter,
    mut leader: watch::Receiver<bool>,
    mut served: watch::Receiver<Option<Arc<Served>>>,
    gateway_service: Option<(String, String)>,
    lease_duration: std::time::Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let retry_after = (lease_duration / 3).max(std::time::Duration::from_millis(100));
    let mut retry: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            changed = leader.changed() => {
                if changed.is_err() {
                    return;
                }
                // A new term: what another leader wrote meanwhile is unknown.
                writer.forget();
            }
            changed = served.changed() => if changed.is_err() { return },
            _ = async {
                match retry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
            _ = crate::admin::stopped(&mut shutdown) => return,
        }
        retry = None;
        if !*leader.borrow_and_update() {
            continue;
        }
        let Some(current) = served.borrow_and_update().clone() else {
            continue;
        };
        let addresses = gateway_service
            .as_ref()
            .and_then(|(ns, name)| crate::status::gateway_addresses(&current.snapshot, ns, name));
        let outcome = writer
            .sync(
                &current.snapshot,
                &current.published.status,
                addresses.as_deref(),
            )
            .await;
        if outcome.written > 0 {
            tracing::info!(written = outcome.written, "status written");
        }
        // A conflict is computed again when the watch delivers the object
        // that caused it; the retry covers a watch that is slow to.
        if outcome.failed > 0 || outcome.conflicts > 0 {
            retry = Some(tokio::time::Instant::now() + retry_after);
        }
    }
}
