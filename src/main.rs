//! The `sluice` command line: `serve`, `check`, `explain`, `convert` and `demo`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A Kubernetes Gateway API gateway for exact traffic splitting"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve HTTP traffic by the Gateway API manifests in PATH (watched and reloaded on change), or with --kubernetes by the objects in the cluster.
    Serve {
        /// Manifest file or directory (read recursively: *.yaml, *.yml, *.json). Repeatable.
        #[arg(short = 'f', long = "filename", required_unless_present = "kubernetes", num_args = 1..)]
        paths: Vec<PathBuf>,
        /// Address listeners bind on when their Gateway has no spec.addresses.
        #[arg(long, default_value = "0.0.0.0")]
        bind: IpAddr,
        /// Admin listener: /status, /errors, /metrics, /healthz, /readyz.
        #[arg(long, default_value = "127.0.0.1:9901")]
        admin: SocketAddr,
        /// CustomResourceDefinitions (files or directories, e.g. the upstream standard-install.yaml): objects of the kinds they define are validated by their schema and CEL rules. CRD documents among the -f manifests count too. Repeatable.
        #[arg(long = "crds", value_name = "PATH")]
        crds: Vec<PathBuf>,
        /// Where rollouts are recorded so that a restart resumes them (rollouts.json; never read as manifests, records of other manifests are set aside) [default: one directory per set of -f paths under $XDG_STATE_HOME/sluice, else ~/.local/state/sluice].
        #[arg(long, conflicts_with = "kubernetes")]
        state_dir: Option<PathBuf>,
        /// Watch the Kubernetes API server instead of files, and write status back (as leader). The leader also judges the RolloutPolicies' rollouts and records them in their status; the other replicas serve the recorded steps.
        #[arg(long, conflicts_with = "paths")]
        kubernetes: bool,
        /// Kubeconfig file (default: in-cluster service account, else $KUBECONFIG or ~/.kube/config).
        #[arg(long, requires = "kubernetes")]
        kubeconfig: Option<PathBuf>,
        /// NAMESPACE/NAME of the Service in front of the gateway: its addresses become Gateway status.addresses.
        #[arg(long, requires = "kubernetes", value_parser = parse_namespaced_name)]
        gateway_service: Option<(String, String)>,
        /// Namespace of the leader lease (default: $POD_NAMESPACE, else the kubeconfig's namespace).
        #[arg(long, requires = "kubernetes")]
        lease_namespace: Option<String>,
        /// Name of the leader lease (only the leader writes status).
        #[arg(
            long,
            default_value = "sluice-gateway-controller",
            requires = "kubernetes"
        )]
        lease_name: String,
        /// Seconds a leader lease lasts without renewal before another replica takes over.
        #[arg(long, default_value_t = 15, requires = "kubernetes", value_parser = clap::value_parser!(u64).range(1..))]
        lease_duration: u64,
        /// Also serve the Ingresses of this class among the manifests, converted in process as `sluice convert ingress-nginx` converts them [default: nginx]. With --kubernetes, Ingresses and IngressClasses are watched (class-less Ingresses are served when the IngressClass of this name is the default one) and the leader writes their status.loadBalancer from the Gateway's addresses.
        #[arg(long, requires = "ingress_gateway")]
        ingress_class: Option<String>,
        /// The Gateway (NAMESPACE/NAME) the served Ingresses' routes attach to.
        #[arg(long, value_parser = parse_namespaced_name)]
        ingress_gateway: Option<(String, String)>,
        #[command(flatten)]
        limits: Box<LimitArgs>,
    },
    /// Print every object's conditions and every rule's backend shares; exit 1 if anything is not accepted or resolved.
    Check {
        #[command(flatten)]
        manifests: sluice::cli::Manifests,
        /// Rollout state to show served shares from, as `serve --state-dir` records it [default: the directory `serve` uses for the same -f paths].
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Report format: the text report (one `file:line: Kind ns/name: field: message` line per problem at its end), or one JSON document.
        #[arg(long, value_enum, default_value_t)]
        output: sluice::cli::check::Output,
        /// Also check the Ingresses of this class among the manifests, converted as `serve --ingress-class` converts them, and print the conversion report [default: nginx].
        #[arg(long, requires = "ingress_gateway")]
        ingress_class: Option<String>,
        /// The Gateway (NAMESPACE/NAME) the checked Ingresses' routes attach to.
        #[arg(long, value_parser = parse_namespaced_name)]
        ingress_gateway: Option<(String, String)>,
    },
    /// Explain which listener and rule take a request, why that rule wins over every other candidate, and its backends' shares; exit 1 when the request would get 404.
    Explain {
        /// Manifest file or directory (read recursively). Repeatable: -f a.yaml -f dir/.
        #[arg(short = 'f', long = "filename", required = true)]
        paths: Vec<PathBuf>,
        /// Only listeners of this Gateway (NAMESPACE/NAME).
        #[arg(long)]
        gateway: Option<String>,
        /// Request header `Name: value`. Repeatable.
        #[arg(short = 'H', long = "header")]
        headers: Vec<String>,
        /// Rollout state to show served shares from (as for check).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// CustomResourceDefinitions to validate the manifests by (as for check). Repeatable.
        #[arg(long = "crds", value_name = "PATH")]
        crds: Vec<PathBuf>,
        /// The request method (GET, POST, ...).
        method: String,
        /// The request URL: http://HOST[:PORT]/PATH?QUERY (https defaults to port 443).
        url: String,
    },
    /// Convert another controller's configuration to Gateway API objects (YAML on stdout, a report line per annotation per object on stderr); exit 0 when everything converted exactly, 1 when anything was approximated, unsupported or not merged, 2 when the input cannot be read.
    Convert {
        #[command(subcommand)]
        from: ConvertFrom,
    },
    /// Run the examples with built-in echo backends and show each backend's share of real traffic.
    Demo {
        /// Requests sent to the 995/5 autocomplete canary.
        #[arg(long, default_value_t = 4000)]
        requests: usize,
        /// Also print every pod's count.
        #[arg(long)]
        verbose: bool,
        /// After the acts, keep the gateway and its pods running with traffic, and a rollout promoted then one rolled back, again and again; prints the dashboard's address. Ctrl-C stops it.
        #[arg(long)]
        keep_running: bool,
    },
}

#[derive(Subcommand)]
enum ConvertFrom {
    /// Ingresses (with ingress-nginx's annotations and canaries) to HTTPRoutes that serve every request as ingress-nginx does (docs/migrating-from-ingress-nginx.md).
    IngressNginx {
        /// Manifest file or directory with the Ingresses and the Services they name (read recursively). Repeatable.
        #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
        paths: Vec<PathBuf>,
        /// Attach the routes to this Gateway (NAMESPACE/NAME); without it, the output also holds a GatewayClass for sluice and a Gateway default/CLASS with the listeners the Ingresses need.
        #[arg(long, value_parser = parse_namespaced_name)]
        gateway: Option<(String, String)>,
        /// Convert only Ingresses of this class (spec.ingressClassName or the kubernetes.io/ingress.class annotation); Ingresses without a class are converted too.
        #[arg(long, default_value = "nginx")]
        ingress_class: String,
        /// Add a RolloutPolicy for each route with a canary, so the next weight change is stepped and judged by sluice.
        #[arg(long)]
        rollout_policy: bool,
        /// With --gateway: its HTTP listener, which gets the redirect routes of ingress-nginx's https redirect (with --https-listener).
        #[arg(long, requires_all = ["gateway", "https_listener"])]
        http_listener: Option<String>,
        /// With --gateway: its HTTPS listener, to which the routes of hosts with TLS attach (with --http-listener).
        #[arg(long, requires_all = ["gateway", "http_listener"])]
        https_listener: Option<String>,
    },
}

/// Limits and timeouts of the proxy (docs/hardening.md). Durations are
/// seconds, or take a unit: `500ms`, `10s`, `5m`, `1h`.
#[derive(clap::Args)]
struct LimitArgs {
    /// Time a client may take to send a request head: from the accept for a connection's first, from its first byte for the next ones [default: 10s].
    #[arg(long, value_parser = parse_duration, help_heading = "Limits")]
    request_header_timeout: Option<Duration>,
    /// HTTP/1.1: time a keep-alive connection may wait for the next request to start [default: 60s].
    #[arg(long, value_parser = parse_duration, help_heading = "Limits")]
    keepalive_timeout: Option<Duration>,
    /// Time a client may send nothing of a request body the gateway waits for; then 408 and the connection closed [default: 60s].
    #[arg(long, value_parser = parse_duration, help_heading = "Limits")]
    request_body_timeout: Option<Duration>,
    /// Open connections per client address; more are closed on accept; 0 is no limit [default: 0].
    #[arg(long, value_parser = clap::value_parser!(u64), help_heading = "Limits")]
    max_connections_per_client: Option<u64>,
    /// Time a connection may have no request in flight before it is closed [default: 1h].
    #[arg(long, value_parser = parse_duration, help_heading = "Limits")]
    idle_timeout: Option<Duration>,
    /// Largest request head in bytes (request line and headers); larger gets 431 [default: 61440].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Limits")]
    max_request_header_bytes: Option<u64>,
    /// Longest request target (path and query) in bytes; longer gets 414 [default: 8192].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Limits")]
    max_uri_bytes: Option<u64>,
    /// Open client connections in total; more are closed on accept [default: 50000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Limits")]
    max_connections: Option<u64>,
    /// Open client connections per listening socket; more are closed on accept [default: 10000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Limits")]
    max_connections_per_listener: Option<u64>,
    /// HTTP/2 streams a client may have open at once [default: 100].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), help_heading = "Limits")]
    http2_max_concurrent_streams: Option<u32>,
    /// Time a backend may take to answer a request without a body when its route sets no timeouts; 0 waits forever [default: 15s].
    #[arg(long, value_parser = parse_duration, help_heading = "Limits")]
    backend_timeout: Option<Duration>,
    /// On SIGTERM, time in-flight requests get to finish after the gateway stops accepting [default: 10s].
    #[arg(long, value_parser = parse_duration, help_heading = "Limits")]
    drain_timeout: Option<Duration>,
    /// Forward requests whose header names contain '_' (refused with 400 by default).
    #[arg(long, help_heading = "Limits")]
    allow_underscore_headers: bool,
    /// Proxies in front of the gateway that append to X-Forwarded-For: the client address (X-Real-IP) is this many entries left of the peer [default: 0].
    #[arg(long, conflicts_with = "trusted_proxy", help_heading = "Limits")]
    xff_trusted_hops: Option<u32>,
    /// A proxy in front of the gateway (address or CIDR) whose X-Forwarded-For entries are believed. Repeatable.
    #[arg(long, help_heading = "Limits")]
    trusted_proxy: Vec<sluice::proxy::Cidr>,
    /// Requests in flight to one backend (Service port) until its response head; more get 503 at once; 0 is no cap [default: 1024].
    #[arg(long, value_parser = clap::value_parser!(u64), help_heading = "Backends")]
    max_requests_per_backend: Option<u64>,
    /// Request body bytes kept so a retry policy can send a request again; larger bodies are sent once; 0 never retries requests with a body [default: 65536].
    #[arg(long, value_parser = clap::value_parser!(u64), help_heading = "Backends")]
    retry_buffer_bytes: Option<u64>,
    /// Failed tries in a row (5xx, refused or reset connection, timeout) that eject an endpoint from its backend's rotation; 0 turns ejection off [default: 5].
    #[arg(long, value_parser = clap::value_parser!(u32), help_heading = "Backends")]
    outlier_consecutive_failures: Option<u32>,
    /// How long a first ejection lasts; the n-th lasts n times as long [default: 30s].
    #[arg(long, value_parser = parse_duration, help_heading = "Backends")]
    outlier_ejection_time: Option<Duration>,
    /// The longest an ejection lasts [default: 300s].
    #[arg(long, value_parser = parse_duration, help_heading = "Backends")]
    outlier_max_ejection_time: Option<Duration>,
    /// TLS listeners: time a client may take to send its ClientHello [default: 15s].
    #[arg(long, value_parser = parse_duration, help_heading = "Limits")]
    client_hello_timeout: Option<Duration>,
    /// TLS listeners: largest ClientHello in bytes; larger is closed [default: 65536].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Limits")]
    max_client_hello_bytes: Option<u64>,
    /// Threads serving client connections, each keeping its connections (thread per core); 0 serves them on the runtime of the control plane [default: one per core the process may run on, 0 on one core].
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=1024), help_heading = "Limits")]
    workers: Option<u64>,
}

impl LimitArgs {
    fn limits(self) -> sluice::proxy::ProxyLimits {
        let mut l = sluice::proxy::ProxyLimits::default();
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        if let Some(v) = self.request_header_timeout {
            l.request_header_timeout = v;
        }
        if let Some(v) = self.idle_timeout {
            l.idle_timeout = v;
        }
        if let Some(v) = self.keepalive_timeout {
            l.keepalive_timeout = v;
        }
        if let Some(v) = self.request_body_timeout {
            l.request_body_timeout = v;
        }
        if let Some(v) = self.max_connections_per_client {
            l.max_connections_per_client = size(v);
        }
        if let Some(v) = self.max_requests_per_backend {
            l.max_requests_per_backend = size(v);
        }
        if let Some(v) = self.retry_buffer_bytes {
            l.retry_buffer_bytes = size(v);
        }
        if let Some(v) = self.outlier_consecutive_failures {
            l.outliers.consecutive_failures = v;
        }
        if let Some(v) = self.outlier_ejection_time {
            l.outliers.base_ejection = v;
        }
        if let Some(v) = self.outlier_max_ejection_time {
            l.outliers.max_ejection = v;
        }
        if let Some(v) = self.max_request_header_bytes {
            l.max_request_header_bytes = size(v);
        }
        if let Some(v) = self.max_uri_bytes {
            l.max_uri_bytes = size(v);
        }
        if let Some(v) = self.max_connections {
            l.max_connections = size(v);
        }
        if let Some(v) = self.max_connections_per_listener {
            l.max_connections_per_listener = size(v);
        }
        if let Some(v) = self.http2_max_concurrent_streams {
            l.http2_max_concurrent_streams = v;
        }
        if let Some(v) = self.backend_timeout {
            l.backend_timeout = (!v.is_zero()).then_some(v);
        }
        if let Some(v) = self.drain_timeout {
            l.drain_timeout = v;
        }
        l.reject_underscore_headers = !self.allow_underscore_headers;
        if let Some(v) = self.xff_trusted_hops {
            l.forwarded.trusted_hops = v;
        }
        l.forwarded.trusted_cidrs = self.trusted_proxy;
        if let Some(v) = self.client_hello_timeout {
            l.client_hello_timeout = v;
        }
        if let Some(v) = self.max_client_hello_bytes {
            l.max_client_hello_bytes = size(v);
        }
        l.workers = match self.workers {
            Some(v) => size(v),
            None => match cores() {
                1 => 0,
                n => n,
            },
        };
        l
    }
}

/// `90`, `90s`, `500ms`, `5m`, `1h`.
fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("expected a duration such as 10s or 500ms, got {value:?}"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        "h" => Ok(Duration::from_secs(n.saturating_mul(3600))),
        _ => Err(format!(
            "unknown unit {unit:?} in {value:?} (use ms, s, m or h)"
        )),
    }
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Logs are diagnostics: stderr, so that stdout stays a command's output.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            paths,
            bind,
            admin,
            crds,
            state_dir,
            kubernetes,
            kubeconfig,
            gateway_service,
            lease_namespace,
            lease_name,
            lease_duration,
            ingress_class,
            ingress_gateway,
            limits,
        } => {
            let limits = limits.limits();
            init_tracing();
            // With worker threads serving the connections, the control
            // plane needs no more than one thread of its own.
            let Some(runtime) = runtime(if limits.workers > 0 { 1 } else { cores() }) else {
                return ExitCode::from(1);
            };
            let ingresses = ingress_gateway.map(|gateway| sluice::source::files::IngressServing {
                class: ingress_class.unwrap_or_else(|| "nginx".into()),
                gateway,
            });
            if kubernetes {
                let config = sluice::serve::KubernetesConfig {
                    kubeconfig,
                    bind,
                    admin,
                    gateway_service,
                    lease_namespace,
                    lease_name,
                    lease_duration: std::time::Duration::from_secs(lease_duration),
                    crds,
                    ingresses,
                };
                return runtime.block_on(serve(sluice::serve::start_kubernetes_with_limits(
                    config, limits,
                )));
            }
            let state_dir = state_dir.or_else(|| sluice::rollout::state_dir_for(&paths));
            if state_dir.is_none() {
                tracing::warn!(
                    "no --state-dir and neither $XDG_STATE_HOME nor $HOME is set: rollouts are kept in memory only"
                );
            }
            let config = sluice::serve::ServeConfig {
                paths,
                bind,
                admin,
                crds,
            };
            runtime.block_on(serve(sluice::serve::start_with_ingresses(
                config, limits, state_dir, ingresses,
            )))
        }
        Command::Check {
            manifests,
            state_dir,
            output,
            ingress_class,
            ingress_gateway,
        } => {
            let state_dir = state_dir.or_else(|| sluice::rollout::state_dir_for(&manifests.paths));
            let ingresses = ingress_gateway.map(|gateway| sluice::source::files::IngressServing {
                class: ingress_class.unwrap_or_else(|| "nginx".into()),
                gateway,
            });
            let code = sluice::cli::check::run_with_ingresses(
                &manifests.paths,
                &manifests.crds,
                state_dir.as_deref(),
                ingresses.as_ref(),
                output,
                &mut std::io::stdout().lock(),
            );
            ExitCode::from(u8::try_from(code).unwrap_or(2))
        }
        Command::Explain {
            paths,
            gateway,
            headers,
            state_dir,
            crds,
            method,
            url,
        } => {
            let state_dir = state_dir.or_else(|| sluice::rollout::state_dir_for(&paths));
            let request = sluice::explain::ExplainRequest::parse(&method, &url, &headers, gateway);
            let code = sluice::cli::explain::run(
                &paths,
                &crds,
                state_dir.as_deref(),
                request,
                &mut std::io::stdout().lock(),
                &mut std::io::stderr().lock(),
            );
            ExitCode::from(u8::try_from(code).unwrap_or(2))
        }
        Command::Convert {
            from:
                ConvertFrom::IngressNginx {
                    paths,
                    gateway,
                    ingress_class,
                    rollout_policy,
                    http_listener,
                    https_listener,
                },
        } => {
            let options = sluice::ingress_nginx::Options {
                gateway,
                ingress_class,
                rollout_policy,
                listeners: http_listener.zip(https_listener),
            };
            match sluice::cli::convert::run(
                &paths,
                &options,
                &mut std::io::stdout().lock(),
                &mut std::io::stderr().lock(),
            ) {
                Ok(outcome) => ExitCode::from(outcome.exit_code()),
                Err(e) => {
                    eprintln!("sluice convert: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Demo {
            requests,
            verbose,
            keep_running,
        } => {
            let Some(runtime) = runtime(cores()) else {
                return ExitCode::from(1);
            };
            let options = sluice::cli::demo::DemoOptions {
                requests,
                verbose,
                keep_running,
            };
            match runtime.block_on(sluice::cli::demo::run(options)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("sluice demo: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// The cores the process may run on (`available_parallelism` honours CPU
/// affinity, e.g. `taskset`).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The async runtime, with `threads` worker threads. On one, a
/// current-thread runtime: the same work without the work-stealing
/// scheduler's cross-thread bookkeeping on every wake-up.
fn runtime(threads: usize) -> Option<tokio::runtime::Runtime> {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    match builder.enable_all().build() {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            None
        }
    }
}

/// `NAMESPACE/NAME`.
fn parse_namespaced_name(value: &str) -> Result<(String, String), String> {
    match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("expected NAMESPACE/NAME, got {value:?}")),
    }
}

async fn serve(
    start: impl std::future::Future<Output = anyhow::Result<sluice::serve::RunningGateway>>,
) -> ExitCode {
    let gateway = match start.await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("sluice: {e:#}");
            return ExitCode::from(1);
        }
    };
    tracing::info!(admin = %gateway.admin_addr(), "sluice is serving");
    sluice::shutdown::signalled().await;
    tracing::info!("shutting down");
    gateway.shutdown().await;
    ExitCode::SUCCESS
}
