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
        Command::Serve { paths, bind, admin } => {
            init_tracing();
            let Some(runtime) = runtime() else {
                return ExitCode::from(1);
            };
            runtime.block_on(serve(sluice::serve::ServeConfig { paths, bind, admin }))
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
