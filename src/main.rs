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
    /// Serve HTTP traffic by the Gateway API manifests in PATH (watched and reloaded on change).
    Serve {
        /// Manifest file or directory (read recursively: *.yaml, *.yml, *.json). Repeatable.
        #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
        paths: Vec<PathBuf>,
        /// Address listeners bind on when their Gateway has no spec.addresses.
        #[arg(long, default_value = "0.0.0.0")]
        bind: IpAddr,
        /// Admin listener: /status, /errors, /metrics, /healthz, /readyz.
        #[arg(long, default_value = "127.0.0.1:9901")]
        admin: SocketAddr,
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
        Command::Serve { paths, bind, admin } => {
            init_tracing();
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("sluice: cannot start the runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            runtime.block_on(serve(sluice::serve::ServeConfig { paths, bind, admin }))
        }
    }
}

async fn serve(config: sluice::serve::ServeConfig) -> ExitCode {
    let gateway = match sluice::serve::start(config).await {
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
