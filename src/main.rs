//! The `sluice` command line: `serve`, `check` and `demo`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

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
        /// Watch the Kubernetes API server instead of files, and write status back (as leader).
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
    },
    /// Print every object's conditions and every rule's backend shares; exit 1 if anything is not accepted or resolved.
    Check {
        /// Manifest file or directory (read recursively). Repeatable.
        #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
        paths: Vec<PathBuf>,
    },
    /// Run the examples with built-in echo backends and show each backend's share of real traffic.
    Demo {
        /// Requests sent to the 995/5 autocomplete canary.
        #[arg(long, default_value_t = 4000)]
        requests: usize,
        /// Also print every pod's count.
        #[arg(long)]
        verbose: bool,
    },
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
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
            kubernetes,
            kubeconfig,
            gateway_service,
            lease_namespace,
            lease_name,
            lease_duration,
        } => {
            init_tracing();
            let Some(runtime) = runtime() else {
                return ExitCode::from(1);
            };
            if kubernetes {
                let config = sluice::serve::KubernetesConfig {
                    kubeconfig,
                    bind,
                    admin,
                    gateway_service,
                    lease_namespace,
                    lease_name,
                    lease_duration: std::time::Duration::from_secs(lease_duration),
                };
                return runtime.block_on(serve(sluice::serve::start_kubernetes(config)));
            }
            let config = sluice::serve::ServeConfig { paths, bind, admin };
            runtime.block_on(serve(sluice::serve::start(config)))
        }
        Command::Check { paths } => {
            let code = sluice::cli::check::run(&paths, &mut std::io::stdout().lock());
            ExitCode::from(u8::try_from(code).unwrap_or(2))
        }
        Command::Demo { requests, verbose } => {
            let Some(runtime) = runtime() else {
                return ExitCode::from(1);
            };
            let options = sluice::cli::demo::DemoOptions { requests, verbose };
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

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
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
    shutdown_signal().await;
    tracing::info!("shutting down");
    gateway.shutdown().await;
    ExitCode::SUCCESS
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
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
