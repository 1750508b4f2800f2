//! `sluice serve`: wires the sources, the rollouts, translate, the proxy
//! and the admin listener together.
//!
//! Both modes run one serve loop: a source task (files, or the Kubernetes
//! API) sends each complete configuration on a channel; the loop runs the
//! rollout state machine on it, translates it with the shares the rollouts
//! serve, applies the route table to the proxy and publishes status and
//! errors on the admin listener. While a rollout is at a step, the loop
//! also judges it when the machine's next deadline comes (a step's
//! interval ends), when a governed backend answers a 5xx or a slow
//! response (the metrics wake it: a failing canary is rolled back within
//! milliseconds of the response that proves it), and every
//! [`ROLLOUT_REFRESH`] for the counts on `/status`; it translates again
//! when the served shares change: a step is a table swap like any reload.
//!
//! Who judges the rollouts ([`RolloutDriver`] holds them and says what to
//! serve): standalone, this process (its records go to
//! `--state-dir`). In Kubernetes mode, the Lease leader only: it records
//! every rollout in its policy's `status.rollouts` (the status writer sends
//! them with the rest of the policy's status, so the loop hands them over
//! with each served configuration rather than through a [`RolloutStore`]:
//! one apply per object, under one field manager); the other replicas
//! serve the step recorded there ([`Rollouts::served`]), and a replica that
//! wins the lease continues from it. The leader judges the whole fleet's
//! counts: its own plus what the others publish ([`fleet_counts`]).
//!
//! A reload is an atomic table swap in the proxy: requests in flight
//! finish on the table they started with, a broken file keeps its last good
//! objects, and nothing a manifest says can make the process exit.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::admin::{AdminServer, AdminState, Published};
use crate::metrics::Metrics;
use crate::proxy::{Proxy, ProxyLimits};
use crate::resources::Snapshot;
use crate::rollout::driver::{Role, RolloutDriver};
use crate::rollout::{FileStore, MemoryStore, RolloutReport, RolloutStore};
use crate::route::RouteTable;
use crate::source::{ConfigError, FileSource, SourceUpdate};
use crate::translate::{
    CompiledRoutes, ObjectStatus, RuleSummary, StatusReport, TranslateOptions, rollout_inputs,
    translate_reusing,
};

pub use crate::rollout::driver::{ROLLOUT_EVENT_GAP, ROLLOUT_REFRESH};

/// Settings of `sluice serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Manifest files or directories (read recursively).
    pub paths: Vec<PathBuf>,
    /// Address listeners bind on when their Gateway has no addresses.
    pub bind: IpAddr,
    /// Admin listener (`/status`, `/errors`, `/metrics`, `/healthz`, `/readyz`).
    pub admin: SocketAddr,
    /// CustomResourceDefinition files or directories (`--crds`): objects of
    /// the kinds they define are validated by them. Watched like `paths`.
    pub crds: Vec<PathBuf>,
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

    /// The rollouts' status currently shown (each RolloutPolicy's
    /// `status.rollouts` on `/status`).
    pub fn rollouts(&self) -> Arc<RolloutReport> {
        self.state.rollouts()
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
    start_with_state(config, limits, None).await
}

/// [`start_with_limits`], recording rollouts in `state_dir`
/// (`rollouts.json`) so that a restart resumes them; `None` keeps them in
/// memory only.
pub async fn start_with_state(
    config: ServeConfig,
    limits: ProxyLimits,
    state_dir: Option<PathBuf>,
) -> anyhow::Result<RunningGateway> {
    start_with_ingresses(config, limits, state_dir, None).await
}

/// [`start_with_state`], also serving the Ingresses of a class through the
/// ingress-nginx conversion (`serve --ingress-class`).
pub async fn start_with_ingresses(
    config: ServeConfig,
    limits: ProxyLimits,
    state_dir: Option<PathBuf>,
    ingresses: Option<crate::source::files::IngressServing>,
) -> anyhow::Result<RunningGateway> {
    let metrics = Metrics::shared();
    let store: Box<dyn RolloutStore> = match &state_dir {
        Some(dir) => {
            let store = FileStore::new(dir, crate::rollout::configuration_of(&config.paths));
            // An existing state directory is marked before the first read,
            // so that one inside the manifests is never read as them (a new
            // one is marked when first written).
            if dir.is_dir()
                && let Err(error) = store.claim()
            {
                tracing::warn!(%error, "cannot mark the rollout state directory");
            }
            Box::new(store)
        }
        None => Box::new(MemoryStore::default()),
    };
    let source = FileSource::new(config.paths.clone(), metrics.clone())
        .with_crds(config.crds.clone())
        .with_ingresses(ingresses);
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
    state.show_proxy(proxy.clone());
    let server = Server::new(
        config.bind,
        proxy.clone(),
        state.clone(),
        metrics.clone(),
        store,
        Role::Lead,
    )
    .await;

    let (updates_tx, updates) = mpsc::channel(1);
    let source = tokio::spawn(crate::source::files::run(
        source,
        watch,
        updates_tx,
        shutdown_rx.clone(),
    ));
    let (first_tx, first) = oneshot::channel();
    let serve = tokio::spawn(serve_loop(
        updates,
        server,
        None,
        None,
        Some(first_tx),
        shutdown_rx,
    ));
    // Serve the first configuration before returning, as a gateway that
    // answers is expected to.
    let _ = first.await;
    let reloads = tokio::spawn(join_tasks([("serve", serve), ("source", source)]));
    Ok(RunningGateway {
        admin,
        state,
        metrics,
        proxy,
        shutdown,
        reloads,
    })
}

/// Wait for every task, logging the ones that failed.
async fn join_tasks<const N: usize>(tasks: [(&'static str, JoinHandle<()>); N]) {
    for (task, handle) in tasks {
        if let Err(error) = handle.await {
            tracing::error!(task, %error, "task failed");
        }
    }
}

/// The configuration in service.
struct Current {
    snapshot: Arc<Snapshot>,
    errors: Vec<ConfigError>,
    objects: usize,
    /// The rule summaries of the table in service: what each rule serves,
    /// for the rollouts of newly governed rules.
    rules: Arc<Vec<Arc<RuleSummary>>>,
}

/// Turns each configuration, and each rollout step, into a served table
/// and published status.
struct Server {
    options: TranslateOptions,
    proxy: Proxy,
    state: Arc<AdminState>,
    metrics: Arc<Metrics>,
    /// Number of the last table applied.
    generation: u64,
    current: Option<Current>,
    rollouts: RolloutDriver,
    /// The routes compiled for the table in service, reused by the next
    /// translation for the routes it leaves unchanged.
    compiled: CompiledRoutes,
}

impl Server {
    /// A server whose rollouts resume what `store` recorded, leading them
    /// or following the records in the policies' status (`role`).
    async fn new(
        bind: IpAddr,
        proxy: Proxy,
        state: Arc<AdminState>,
        metrics: Arc<Metrics>,
        store: Box<dyn RolloutStore>,
        role: Role,
    ) -> Server {
        let server = Server {
            options: TranslateOptions { default_bind: bind },
            proxy,
            state,
            metrics,
            generation: 0,
            current: None,
            compiled: CompiledRoutes::new(),
            rollouts: RolloutDriver::open(store, role).await,
        };
        server.publish_rollouts();
        server
    }

    /// Serve a new configuration.
    async fn apply(&mut self, update: SourceUpdate) {
        let SourceUpdate {
            snapshot,
            errors,
            objects,
        } = update;
        // The API server's echo of status we wrote (Kubernetes mode): the
        // status writer takes the new snapshot for its resourceVersions;
        // what is served stays as it is, untranslated.
        if let Some(current) = &mut self.current
            && current.objects == objects
            && current.errors == errors
            && current.snapshot.only_route_status_differs(&snapshot)
        {
            current.snapshot = Arc::new(snapshot);
            return;
        }
        let snapshot = Arc::new(snapshot);
        let previous = self
            .current
            .as_ref()
            .map_or_else(|| Arc::new(Vec::new()), |c| c.rules.clone());
        // Resolving the governed rules' backends is as large as the
        // policies; keep it off the async workers too.
        let for_inputs = snapshot.clone();
        match tokio::task::spawn_blocking(move || rollout_inputs(&for_inputs, &previous)).await {
            Ok(inputs) => self.rollouts.set_inputs(inputs, &self.metrics),
            Err(error) => {
                tracing::error!(%error, "reading the rollout policies failed; keeping the previous ones")
            }
        }
        let rules = self.current.take().map(|c| c.rules);
        self.current = Some(Current {
            snapshot,
            errors,
            objects,
            rules: rules.unwrap_or_default(),
        });
        self.run_rollouts().await;
        self.translate_and_apply("configuration applied").await;
        self.publish_rollouts();
    }

    /// Judge the rollouts at a step; serve their new shares if they moved.
    async fn tick(&mut self) {
        if self.current.is_none() {
            return;
        }
        let before = self.rollouts.served().clone();
        self.run_rollouts().await;
        if *self.rollouts.served() != before {
            self.translate_and_apply("rollout step applied").await;
        }
        self.publish_rollouts();
    }

    /// Lead the rollouts (`lead`: the lease was won) or follow the
    /// records in the policies' status (lost), and serve what that gives.
    async fn set_role(&mut self, lead: bool) {
        if self.rollouts.set_role(lead) {
            self.tick().await;
        }
    }

    /// Lead the rollouts (judge them) or follow the recorded ones.
    async fn run_rollouts(&mut self) {
        let Some(current) = &self.current else {
            return;
        };
        let snapshot = current.snapshot.clone();
        self.rollouts
            .run(&snapshot.rollout_policies, &self.metrics)
            .await;
    }

    /// Show the rollouts on `/status` and `/metrics`: the leader's with
    /// the counts of the moment, a follower's as recorded.
    fn publish_rollouts(&self) {
        let report = self.rollouts.report();
        self.rollouts.publish_metrics(&self.metrics);
        let gates = self
            .rollouts
            .inputs()
            .rules
            .iter()
            .map(|governed| {
                let s = &governed.settings;
                (
                    governed.policy.to_string(),
                    crate::admin::overview::Gates {
                        interval: crate::rollout::duration_text(s.interval),
                        min_requests: s.min_requests,
                        confidence: s.confidence.0.to_string(),
                        judged: s.gates.iter().map(|g| g.describe()).collect(),
                    },
                )
            })
            .collect();
        self.state.publish_gates(gates);
        self.state
            .publish_histories(crate::admin::overview::histories(self.rollouts.machine()));
        self.state.publish_rollouts(report);
    }

    /// Translate the configuration in service with the served shares and
    /// swap the table in.
    async fn translate_and_apply(&mut self, what: &'static str) {
        let Some(current) = &self.current else {
            return;
        };
        // Translate off the async workers: with 10,000 routes it takes a few
        // hundred milliseconds that requests must not wait behind.
        let snapshot = current.snapshot.clone();
        let options = self.options.clone();
        let served = self.rollouts.served().clone();
        let previous = self.state.published();
        // The table is swapped in as soon as it is built; the status (and
        // keeping its transition times) is computed meanwhile, on the same
        // blocking thread, and published after: a flip does not wait for
        // the status of every object.
        let (routing_tx, routing_rx) = oneshot::channel();
        // Taken for the translation and put back after it (a translation
        // that panics leaves an empty one: the next compiles everything).
        let mut compiled = std::mem::take(&mut self.compiled);
        let status = tokio::task::spawn_blocking(move || {
            // Build the new table once the one it replaced last time is
            // freed, so that the two never overlap in memory.
            RouteTable::wait_for_freed_tables();
            let now = Timestamp::now();
            let mut status =
                translate_reusing(&snapshot, &options, &served, now, &mut compiled, |r| {
                    // The receiver is gone only when the serve loop stopped.
                    let _ = routing_tx.send(r);
                });
            // Conditions whose status did not change keep the time it last
            // changed, as in Kubernetes mode. The previous status is as
            // large as the configuration: walk it here, off the async
            // workers.
            keep_transition_times(&mut status, &previous.status);
            (status, previous, compiled)
        });
        let Ok(routing) = routing_rx.await else {
            // Translate panicked before the table was built.
            if let Err(error) = status.await {
                tracing::error!(%error, "translate failed; keeping the current configuration");
            }
            return;
        };
        for warning in &routing.warnings {
            tracing::warn!("{warning}");
        }
        let failures = self.proxy.apply(routing.table).await;
        let (mut status, previous, compiled) = match status.await {
            Ok(t) => t,
            Err(error) => {
                // The table serves; the status published stays the previous
                // one until the next translation.
                tracing::error!(%error, "computing the status failed; the new table serves, the status shown is the previous one");
                return;
            }
        };
        if !failures.is_empty() {
            for failure in &failures {
                tracing::warn!(bind = %failure.bind, error = %failure.error, "cannot listen");
            }
            let failures: Vec<(SocketAddr, String)> =
                failures.into_iter().map(|f| (f.bind, f.error)).collect();
            status.apply_bind_failures(&failures);
            // A listener that failed to bind at the previous reload too
            // keeps that failure's time (rare: walked on the async worker).
            keep_transition_times(&mut status, &previous.status);
        }
        tracing::debug!(
            compiled = compiled.last_counts().0,
            reused = compiled.last_counts().1,
            "routes compiled and reused"
        );
        self.compiled = compiled;
        // The previous status is freed with `replaced` below.
        drop(previous);
        self.generation += 1;
        self.metrics.record_reload(self.generation);
        let Some(current) = &mut self.current else {
            return;
        };
        tracing::info!(
            generation = self.generation,
            objects = current.objects,
            errors = current.errors.len(),
            "{what}"
        );
        self.metrics
            .set_shares(routing.rules.iter().flat_map(|r| r.share_rows()).collect());
        let rules = Arc::new(routing.rules);
        let replaced = self.state.publish(Published {
            status,
            errors: current.errors.clone(),
            rules: rules.clone(),
            generation: self.generation,
        });
        let replaced_rules = std::mem::replace(&mut current.rules, rules);
        // The replaced status and rule summaries are as large as the
        // configuration: free them off the async workers.
        tokio::task::spawn_blocking(move || drop((replaced, replaced_rules)));
    }
}

/// Copy each condition's `lastTransitionTime` from the status published
/// before (same kind, namespace and name) when its type and status did not
/// change: a condition's time is when its status last changed, not when
/// sluice last translated it. Conditions that are new or flipped keep the
/// translation's time.
fn keep_transition_times(new: &mut StatusReport, old: &StatusReport) {
    // Borrowed keys: with 10,000 routes, cloning three strings per object
    // on both sides was most of this walk.
    let old: crate::FastMap<(&str, Option<&str>, &str), &ObjectStatus> = old
        .objects
        .iter()
        .map(|o| {
            let key = (
                o.kind.as_str(),
                o.metadata.namespace.as_deref(),
                o.metadata.name.as_str(),
            );
            (key, o)
        })
        .collect();
    for object in &mut new.objects {
        let key = (
            object.kind.as_str(),
            object.metadata.namespace.as_deref(),
            object.metadata.name.as_str(),
        );
        if let Some(previous) = old.get(&key) {
            crate::status::keep_transition_times(&mut object.status, &previous.status);
        }
    }
}

/// The serve loop of both modes: serve each configuration the source
/// sends, and judge rollouts at the machine's deadlines, on a governed
/// backend's 5xx or slow response, and every [`ROLLOUT_REFRESH`] while
/// one is at a step. The first configuration served makes `/readyz` ready (and fires
/// `first`); each served one, and each rollout that moved, goes to
/// `served` (the status writer's input, in Kubernetes mode).
///
/// `leader` (Kubernetes mode) says whether this replica holds the lease:
/// only then does it judge the rollouts; otherwise it serves the steps
/// recorded in the policies' status.
async fn serve_loop(
    mut updates: mpsc::Receiver<SourceUpdate>,
    mut server: Server,
    served: Option<watch::Sender<Option<Arc<Served>>>>,
    mut leader: Option<watch::Receiver<bool>>,
    mut first: Option<oneshot::Sender<()>>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let generation = server.generation;
        let snapshot = server.current.as_ref().map(|c| c.snapshot.clone());
        let recorded = server.rollouts.recorded().clone();
        let judging = server.rollouts.judging();
        let tick = server.rollouts.next_look();
        let metrics = server.metrics.clone();
        let events = async {
            if judging {
                metrics.rollout_events().next().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            update = updates.recv() => {
                let Some(update) = update else {
                    tracing::warn!("the configuration source stopped; configuration is no longer updated");
                    return;
                };
                server.apply(update).await;
                server.state.set_ready();
                if let Some(first) = first.take() {
                    let _ = first.send(());
                }
            }
            _ = sleep_until(tick) => server.tick().await,
            _ = events => {
                server.tick().await;
                // Many events between two looks are one look.
                tokio::time::sleep(ROLLOUT_EVENT_GAP).await;
            }
            // The other replicas' counts grew: judge them now.
            _ = fleet_counted(server.rollouts.fleet()), if tick.is_some() => server.tick().await,
            lead = leadership(&mut leader) => match lead {
                Some(lead) => server.set_role(lead).await,
                None => leader = None,
            },
            _ = crate::shutdown::stopped(&mut shutdown) => return,
        }
        if let (Some(served), Some(current)) = (&served, &server.current)
            && (server.generation != generation
                || !snapshot.is_some_and(|s| Arc::ptr_eq(&s, &current.snapshot))
                || !Arc::ptr_eq(server.rollouts.recorded(), &recorded))
        {
            served.send_replace(Some(Arc::new(Served {
                snapshot: current.snapshot.clone(),
                published: server.state.published(),
                rollouts: server.rollouts.recorded().clone(),
            })));
        }
    }
}

/// The next change of `leader`: `None` when it can no longer change.
async fn leadership(leader: &mut Option<watch::Receiver<bool>>) -> Option<bool> {
    match leader {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(*rx.borrow_and_update()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

async fn fleet_counted(fleet: Option<crate::rollout::fleet::Fleet>) {
    match fleet {
        Some(fleet) => fleet.counted().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
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
    /// CustomResourceDefinition files or directories (`--crds`), read once
    /// at start: objects of the kinds they define are validated by them
    /// (the API server already did; this makes refusals the same in both
    /// modes).
    pub crds: Vec<PathBuf>,
    /// `--ingress-class`: also watch Ingresses and serve those of the class
    /// through the conversion; the leader writes their `status.loadBalancer`.
    pub ingresses: Option<crate::source::files::IngressServing>,
}

/// What the serve loop last served: the snapshot and the status translate
/// computed for it (after the proxy swapped in its table), and the
/// rollouts as recorded (each RolloutPolicy's `status.rollouts`).
struct Served {
    snapshot: Arc<Snapshot>,
    published: Arc<Published>,
    rollouts: Arc<RolloutReport>,
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
    state.show_proxy(proxy.clone());

    let (updates_tx, updates) = mpsc::channel(1);
    let crds = crate::source::files::read_crds(&config.crds);
    for error in &crds.1 {
        tracing::warn!("--crds: {error}");
    }
    let kinds = kube_source::kinds(config.ingresses.is_some());
    let (ingresses_tx, ingresses_rx) = watch::channel(Arc::default());
    let source = tokio::spawn(kube_source::run(
        kube_source::watch_kinds(&client, &kinds),
        SourceOptions {
            crds: crds.0,
            ingresses: config.ingresses.clone(),
            ..SourceOptions::default()
        },
        updates_tx,
        Some(ingresses_tx),
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
    let leader_for_rollouts = leader.clone();
    let elector = tokio::spawn(lease::run(
        LeaderElector::new(client.clone(), lease_config.clone()),
        leader_tx,
        shutdown_rx.clone(),
    ));

    let (served_tx, served) = watch::channel(None);
    let status = tokio::spawn(status_loop(
        StatusWriter::new(client.clone()),
        leader.clone(),
        served.clone(),
        config.gateway_service.clone(),
        config
            .ingresses
            .as_ref()
            .map(|i| (ingresses_rx, i.gateway.clone())),
        config.lease_duration,
        shutdown_rx.clone(),
    ));

    let (fleet, [publish_counts, watch_counts]) = fleet_counts(
        &client,
        &lease_config,
        metrics.clone(),
        served.clone(),
        leader.clone(),
        &shutdown_rx,
    );
    // The rollouts are recorded in each policy's status, by the leader
    // (the status writer writes them with the rest of the policy's status:
    // one apply per object), and every replica serves what is recorded
    // there; so no store here. A replica follows until it wins the lease.
    let mut server = Server::new(
        config.bind,
        proxy.clone(),
        state.clone(),
        metrics.clone(),
        Box::new(MemoryStore::default()),
        Role::Follow,
    )
    .await;
    server.rollouts.with_fleet(fleet);
    let serve = tokio::spawn(serve_loop(
        updates,
        server,
        Some(served_tx),
        Some(leader_for_rollouts),
        None,
        shutdown_rx,
    ));
    let reloads = tokio::spawn(join_tasks([
        ("serve", serve),
        ("source", source),
        ("status", status),
        ("leader election", elector),
        ("rollout counts", publish_counts),
        ("rollout counts watch", watch_counts),
    ]));
    Ok(RunningGateway {
        admin,
        state,
        metrics,
        proxy,
        shutdown,
        reloads,
    })
}

/// The whole fleet's counts (Kubernetes mode): publish this replica's
/// counts per step (`status::counts`, while it follows) and watch the
/// others' into the [`Fleet`](crate::rollout::fleet::Fleet) its rollout
/// driver adds to its own counters when it leads.
fn fleet_counts(
    client: &kube::Client,
    lease: &crate::status::lease::LeaseConfig,
    metrics: Arc<Metrics>,
    served: watch::Receiver<Option<Arc<Served>>>,
    leader: watch::Receiver<bool>,
    shutdown: &watch::Receiver<bool>,
) -> (crate::rollout::fleet::Fleet, [JoinHandle<()>; 2]) {
    let config = crate::status::counts::CountsConfig::new(&lease.namespace, &lease.identity);
    let fleet = crate::rollout::fleet::Fleet::new(&config.name);
    let watch = tokio::spawn(crate::source::kubernetes::counts::run(
        client.clone(),
        lease.namespace.clone(),
        config.name.clone(),
        fleet.clone(),
        leader.clone(),
        shutdown.clone(),
    ));
    let publish = tokio::spawn(crate::status::counts::run(
        client.clone(),
        config,
        metrics,
        served,
        |s: &Option<Arc<Served>>| s.as_ref().map(|s| s.rollouts.clone()),
        leader,
        shutdown.clone(),
    ));
    (fleet, [publish, watch])
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

/// The Ingresses served (`--ingress-class`) and their Gateway.
type IngressStatus = (
    watch::Receiver<Arc<crate::source::kubernetes::ServedIngresses>>,
    (String, String),
);

/// Write the status of what is served, while leader. Failed writes are
/// retried after a third of the lease duration.
async fn status_loop(
    mut writer: crate::status::StatusWriter,
    mut leader: watch::Receiver<bool>,
    mut served: watch::Receiver<Option<Arc<Served>>>,
    gateway_service: Option<(String, String)>,
    mut ingresses: Option<IngressStatus>,
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
            changed = async {
                match &mut ingresses {
                    Some((rx, _)) => rx.changed().await,
                    None => std::future::pending().await,
                }
            } => if changed.is_err() { return },
            _ = async {
                match retry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
            _ = crate::shutdown::stopped(&mut shutdown) => return,
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
        let served_ingresses = ingresses.as_mut().map(|(rx, gateway)| {
            let served = rx.borrow_and_update().clone();
            writer.set_not_in_cluster(served.converted.iter().cloned());
            (served, gateway.clone())
        });
        // Planning reads every object's status, 10,000 routes' after a
        // start: off this thread, which also takes the watch events (a
        // flip's among them) and hands over the next table.
        let planned = {
            let (current, addresses) = (current.clone(), addresses.clone());
            tokio::task::spawn_blocking(move || {
                crate::status::plan(
                    &current.snapshot,
                    &current.published.status,
                    addresses.as_deref(),
                    &current.rollouts,
                )
            })
            .await
        };
        let planned = match planned {
            Ok(planned) => planned,
            Err(error) => {
                tracing::error!(%error, "planning the status failed; the status is not written");
                continue;
            }
        };
        let mut outcome = writer.send_planned(planned).await;
        if let Some((served, (ns, name))) = served_ingresses {
            // The Gateway's addresses: the ones written to it now, else
            // the ones it holds.
            let gateway = addresses
                .clone()
                .or_else(|| crate::status::gateway_status_addresses(&current.snapshot, &ns, &name));
            let patches =
                crate::status::ingress_plan(&served.ingresses, &gateway.unwrap_or_default());
            let more = writer.send(patches).await;
            outcome.written += more.written;
            outcome.failed += more.failed;
            outcome.conflicts += more.conflicts;
        }
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
